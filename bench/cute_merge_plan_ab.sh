#!/usr/bin/env bash
# cute/decode's MERGE_SLABS_FROM_SPLIT (on by default since this A/B; off: under the balanced split every merge thread plans the
# batch again to find its item's slabs; on: the item's first share stores them) in one device call on one H200
# (at most 200 s):
#   1. its GPU tests (tests/test_cute_merge_plan.py -m gpu, cut at 90 s): on against fp64 on a poisoned output and
#      bit for bit equal to off, on seed 47 row 4's kind at B=8 (MQA D=256, 4 M tiles, paged(256), ragged) and a D=64
#      GQA batch with an empty sequence and one long enough for the item-share cap; a split kernel storing one slab
#      too few fails the check; a CUDA graph replays with new lengths (paged);
#   2. bench.cute_merge_plan_ab in one process (cut at 100 s; the CSV keeps the rows done): off against on on seed
#      47 row 4 (B=64 MQA D=256 paged ragged: the merge's 49 µs under ncu), seed 43 row 2 (B=64 Hkv=16 D=64
#      ragged) and row 0 (B=2: the control), each checked against fp64, then timed four ways.
# Five files come back: gpu.log, pytest.log, ab.log, ab/balanced.csv, ab/balanced.md; the table last.
# Run from the project root carrying the CuTe DSL and TVM-FFI (../shared/gpu/README.md):
#   carry   [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"]
#   command bash bench/cute_merge_plan_ab.sh
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_merge_plan_ab.sh runs/cute_merge_plan_ab
source_carried_activations
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >> "$OUT/gpu.log" 2>&1
status=0
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cute_merge_plan.py > "$OUT/pytest.log" 2>&1 \
  || status=1
tail -8 "$OUT/pytest.log"
timeout 100 python3 -m bench.cute_merge_plan_ab --out "$OUT/ab" > "$OUT/ab.log" 2>&1 || status=1
grep -E "^(cute|read|-- )" "$OUT/ab.log" | cut -c1-200
# The table last (written when every row is done; a cut run leaves the CSV and the log lines above).
cat "$OUT/ab/balanced.md" 2>/dev/null || echo "balanced.md not written: the A/B did not finish (see ab.log)"
exit $status
