#!/usr/bin/env bash
# Issue #38: the balanced split's target rule (BALANCED_TARGET "per-slot", off in the three decode rungs; splits.py's
# "The target rule") against the committed "per-sm", on one H200 in one device call (about 3 minutes at most):
#   1. its GPU tests (tests/test_decode_target.py -m gpu, cut at 55 s): triton, gluon and cute/decode with
#      "per-slot" against fp64 (poisoned output) on the two kinds of row it changes (few items on a paged ragged
#      D=64 cache: one wave of shares; 1024 items: two shares a CTA slot) and a D=256 row of few items;
#   2. bench.decode_target_ab in one process (read bandwidth measured first, cut at 135 s: the CSV and the table
#      keep the rows done): seed 43's cases 0 and 2 (the rows the rule is for), the rows four shares an SM lost on
#      (seed 43's cases 1, 4 and its full caches 3, 5 given as lengths), seed 37's case 6 (the model's worst loss,
#      triton), then controls (seed 43's case 7, seed 47's cases 3 and 7); each rung under each setting whose plan
#      differs, checked against fp64, then timed.
# Run from the project root carrying the CuTe DSL and TVM-FFI (with FA4's wheels; ../shared/gpu/README.md):
#   carry   [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"]
#   command bash bench/decode_target_ab.sh
# Outputs in $OUT (5 files): gpu.log, pytest.log, ab.log, ab/ (target.csv, target.md); the table last.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" decode_target_ab.sh runs/decode_target_ab
source_carried_activations
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv >> "$OUT/gpu.log" 2>&1
status=0
timeout 55 python3 -m pytest -q -m gpu tests/test_decode_target.py > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
timeout 135 python3 -m bench.decode_target_ab --out "$OUT/ab" > "$OUT/ab.log" 2>&1 || status=1
grep -E "^(read|[0-9]+/[0-9]+)" "$OUT/ab.log" | cut -c1-150
# The table last (rewritten after every row, so a cut run keeps the rows done).
cat "$OUT/ab/target.md" 2>/dev/null || echo "target.md not written: no row finished (ab.log holds what ran)"
exit $status
