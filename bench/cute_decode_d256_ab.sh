#!/usr/bin/env bash
# Issue #38's D=256 packed rows in cute/decode, on one H200 in one device call (about 3 minutes at most):
# ROW_SPLIT_MAX_TILE_M {256: 32} (off: one 32-row tile of 2 x 2 warps where D=256's 16-row tiles cut 17-32 packed rows
# into two M tiles that each stream the same K/V; cute_impl/_decode_warps.py) against the default:
#   1. the knob's GPU tests (tests/test_cute_decode_d256.py -m gpu): against fp64 (poisoned output) on GQA packed
#      D=256 shapes of 20 to 64 rows (Sq 4 and 3), ragged, paged and not, one split, forced splits and the balanced
#      split, and two planted bugs that must fail; cut at 65 s;
#   2. bench.cute_decode_d256, two alternating rounds in one process (read bandwidth measured first): seed 43's
#      B=16 H=80 Hkv=16 Sq=4 2k D=256 row, seed 43's ragged 20-row D=256 row, 64 rows 4k, 32 rows paged 8k, 20 rows
#      on one 128k sequence, and a control whose plan the knob leaves (seed 43's 16-row MQA paged ragged row);
#      cut at 105 s (the CSV and the table keep the shapes done).
# Run from the project root carrying the CuTe DSL (../shared/gpu/README.md):
#   carry   [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh"]
#   command bash bench/cute_decode_d256_ab.sh
# Outputs in $OUT: gpu.log, pytest.log, d256.log, d256/ (cute_decode_d256.csv, .md).
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_decode_d256_ab.sh runs/cute_decode_d256_ab
source_carried_activations
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv >> "$OUT/gpu.log" 2>&1
status=0
timeout 65 python3 -m pytest -q -m gpu tests/test_cute_decode_d256.py > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
timeout 105 python3 -m bench.cute_decode_d256 --rounds 2 --rep 30 --out "$OUT/d256" > "$OUT/d256.log" 2>&1 || status=1
grep -E "^(read|seed|64|32|20|control)" "$OUT/d256.log" | cut -c1-160
# The table last (rewritten after every shape, so a cut run keeps the shapes done).
cat "$OUT/d256/cute_decode_d256.md" 2>/dev/null || echo "cute_decode_d256.md not written: no shape finished"
exit $status
