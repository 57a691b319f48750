#!/usr/bin/env bash
# Issue #38's many packed rows in cute/decode, on one H200 in one device call (about 3 minutes at most):
# WARPS_SPLIT_ROWS (off: warps split a tile's rows before its keys, cute_impl/_decode_warps.py) and its four-stage
# D=64 ring (ROW_SPLIT_STAGES {64: 4}: three CTAs an SM), against the default:
#   1. the knob's GPU tests (tests/test_cute_decode_rows.py -m gpu): against fp64 (poisoned output) on GQA packed
#      shapes of 32 to 256 rows (Sq 16 and 5, D=64 and 128), ragged, paged and not, forced splits and the balanced
#      split, and two planted bugs that must fail; cut at 65 s;
#   2. bench.cute_decode_rows, two alternating rounds in one process (read bandwidth measured first): seed 41's
#      B=16 H=256 Hkv=32 Sq=16 1k D=64 row, its neighbours (128 / 64 packed rows, 1k-4k, D=64 and 128), seed 31's
#      paged ragged 128-row row, two long caches that must not regress, two 32-row rows of seed 41; cut at 110 s
#      (the CSV and the table keep the shapes done).
# Run from the project root carrying the CuTe DSL (../shared/gpu/README.md):
#   carry   [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh"]
#   command bash bench/cute_decode_rows_ab.sh
# Outputs in $OUT: gpu.log, pytest.log, rows.log, rows/ (cute_decode_rows.csv, .md).
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_decode_rows_ab.sh runs/cute_decode_rows_ab
source_carried_activations
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv >> "$OUT/gpu.log" 2>&1
status=0
timeout 65 python3 -m pytest -q -m gpu tests/test_cute_decode_rows.py > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
timeout 110 python3 -m bench.cute_decode_rows --rounds 2 --rep 30 --out "$OUT/rows" > "$OUT/rows.log" 2>&1 || status=1
grep -E "^(read|seed|128|64|long)" "$OUT/rows.log" | cut -c1-160
# The table last (rewritten after every shape, so a cut run keeps the shapes done).
cat "$OUT/rows/cute_decode_rows.md" 2>/dev/null || echo "cute_decode_rows.md not written: no shape finished"
exit $status
