#!/usr/bin/env bash
# The balanced split's grid axes on one H200 in one device call (at most 200 s): M_TILE_MAJOR of triton/decode,
# gluon/decode and cute/decode (off, as before: the share on grid x, so every share of M tile 0 runs before any of
# M tile 1 and each M tile's pass reads the whole cache from DRAM again; on: the M tile on x, a share's M tiles
# together, the first reading its K/V blocks from DRAM, the others from L2):
#   1. the knob's GPU tests (tests/test_decode_mtile_major.py -m gpu): each rung with it on against fp64 on a
#      poisoned output, on seed 47's paged ragged row's kind (128 rows at D=256) and on 64 rows at D=256 paged(64)
#      ragged, on the balanced split; cut at 60 s;
#   2. bench.decode_mtile_major, one round, one process (read bandwidth measured first): the three rungs off and on,
#      on seed 47's row 4 (B=64 H=8 Hkv=1 Sq=16 D=256 paged(256) ragged 17..33118), B=16 H=32 Hkv=2 Sq=4 D=256
#      paged(64) ragged and the one-M-tile control (seed 43's row 0), each checked against fp64 then timed; cut at
#      130 s (the CSV and the table keep the shapes done).
# Run from the project root carrying the CuTe DSL and TVM-FFI (.gpu/fa4 brings its wheel; ../shared/gpu/README.md):
#   carry   [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"]
#   command bash bench/decode_mtile_major_ab.sh
# Outputs in $OUT (5 files): gpu.log, pytest.log, mtile.log, mtile/ (decode_mtile_major.csv, .md); the table last.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" decode_mtile_major_ab.sh runs/decode_mtile_major_ab
source_carried_activations
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$OUT/gpu.log" 2>&1
status=0
timeout 60 python3 -m pytest -q -m gpu tests/test_decode_mtile_major.py > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
timeout 130 python3 -m bench.decode_mtile_major --out "$OUT/mtile" > "$OUT/mtile.log" 2>&1 || status=1
grep -E "^(read|seed|64rows|control)" "$OUT/mtile.log" | cut -c1-160
# The table last (rewritten after every shape, so a cut run keeps the shapes done).
cat "$OUT/mtile/decode_mtile_major.md" 2>/dev/null || echo "decode_mtile_major.md not written: no shape finished"
exit $status
