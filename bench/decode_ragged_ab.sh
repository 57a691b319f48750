#!/usr/bin/env bash
# Issue #38: the balanced split's item-share cap (BALANCED_MAX_ITEM_SHARES, off) and 4 shares an SM against each
# decode rung's default on seed 43's four ragged rows (exact lengths) and its two full caches given as lengths,
# on one GPU (cut at 185 s: the CSV keeps the rows done by then, the key rows first): bench.decode_ragged_ab, each
# setting checked against fp64 on a poisoned output, then timed eagerly as compare.py times it; a short table last.
# Run from the project root: command `bash bench/decode_ragged_ab.sh`.
# Outputs in $OUT: gpu.log, ab.log, ab/ (ragged.csv, ragged.md).
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" decode_ragged_ab.sh runs/decode_ragged_ab
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.log" 2>&1
source_carried_activations
status=0
timeout 185 python3 -m bench.decode_ragged_ab --out "$OUT/ab" > "$OUT/ab.log" 2>&1 || status=1
grep -E "^(read|gluon|triton|cute|-- )" "$OUT/ab.log" | grep -v " skip " | cut -c1-150
cat "$OUT/ab/ragged.md" 2>/dev/null || echo "ragged.md not written (cut short): ab/ragged.csv holds the rows done"
exit $status
