#!/usr/bin/env bash
# cute/decode's D256_TWO_CTAS (off by default; on: D=256's 32-row tiles on three 32-key stages, 96 KiB, two CTAs an SM,
# counted so by the split rule and the balanced target; cute_impl/_decode_warps.py's TWO_CTA_TILES) in one device call
# on one H200 (at most 200 s):
#   1. its GPU tests (tests/test_cute_decode_d256_occ.py -m gpu, cut at 70 s): on against fp64 on a poisoned output on
#      seed 53 row 0's kind shrunk (64 packed rows at D=256, a full cache, the rule's padded splits), a paged(64)
#      ragged balanced D=256 row and pages of 16 keys (shorter than a block); a split that counts the table's 64-key
#      blocks while the ring takes 32 fails the check;
#   2. bench.cute_decode_d256_occ_ab in one process (cut at 110 s; the CSV keeps the rows done): off against on on
#      seed 53 row 0 (the ncu row: 742 µs, one CTA an SM), seed 47 rows 6 and 4, seed 53 row 1, and seed 53 row 2
#      (D=128: the control), each checked against fp64, then timed four ways.
# Five files come back: gpu.log, pytest.log, ab.log, ab/balanced.csv, ab/balanced.md; the table last.
# Run from the project root carrying the CuTe DSL and TVM-FFI (../shared/gpu/README.md):
#   carry   [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"]
#   command bash bench/cute_decode_d256_occ_ab.sh
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_decode_d256_occ_ab.sh runs/cute_decode_d256_occ_ab
source_carried_activations
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >> "$OUT/gpu.log" 2>&1
status=0
timeout 70 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cute_decode_d256_occ.py > "$OUT/pytest.log" 2>&1 \
  || status=1
tail -8 "$OUT/pytest.log"
timeout 110 python3 -m bench.cute_decode_d256_occ_ab --out "$OUT/ab" > "$OUT/ab.log" 2>&1 || status=1
grep -E "^(cute|read|-- )" "$OUT/ab.log" | cut -c1-200
# The table last (written when every row is done; a cut run leaves the CSV and the log lines above).
cat "$OUT/ab/balanced.md" 2>/dev/null || echo "balanced.md not written: the A/B did not finish (see ab.log)"
exit $status
