#!/usr/bin/env bash
# cute/decode's WIDE_M_TILE (off by default; on: D=128's 64-row tiles of 4 warps x 16 rows, so that 33 to 64 packed
# rows take one M tile, not two 32-row tiles that each read the share's K/V; cute_impl/_decode_warps.py's
# WIDE_M_TILES) in one device call on one H200 (at most 200 s):
#   1. its GPU tests (tests/test_cute_decode_wide_tile.py -m gpu, cut at 60 s): on against fp64 on a poisoned output
#      on seed 59 row 2's kind shrunk (64 rows, paged(32), ragged, balanced), a full contiguous cache with forced
#      splits and 40 rows of Sq 5 in pages of 16 keys; the causal mask taking every warp's rows as the first warp's
#      fails the check;
#   2. bench.cute_decode_p32_ab in one process (cut at 125 s; the CSV keeps the rows done): off against on on seed 59
#      row 2 (B=64 H=32 Hkv=8 Sq=16 D=128 paged(32) ragged: cute 447.9 us, gluon 274.5), its lengths contiguous, in
#      pages of 128 and of 64, then Sq=1 and D=64 (the controls, whose plan the knob leaves), each checked against
#      fp64, then timed four ways.
# Five files come back: gpu.log, pytest.log, ab.log, ab/balanced.csv, ab/balanced.md; the table last.
# Run from the project root carrying the CuTe DSL and TVM-FFI (../shared/gpu/README.md):
#   carry   [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"]
#   command bash bench/cute_decode_p32_ab.sh
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_decode_p32_ab.sh runs/cute_decode_p32_ab
source_carried_activations
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >> "$OUT/gpu.log" 2>&1
status=0
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cute_decode_wide_tile.py > "$OUT/pytest.log" 2>&1 \
  || status=1
tail -8 "$OUT/pytest.log"
timeout 125 python3 -m bench.cute_decode_p32_ab --out "$OUT/ab" > "$OUT/ab.log" 2>&1 || status=1
grep -E "^(cute|read|-- )" "$OUT/ab.log" | cut -c1-200
# The table last (written when every row is done; a cut run leaves the CSV and the log lines above).
cat "$OUT/ab/balanced.md" 2>/dev/null || echo "balanced.md not written: the A/B did not finish (see ab.log)"
exit $status
