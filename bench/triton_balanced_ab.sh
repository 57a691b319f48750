#!/usr/bin/env bash
# Issue #38: triton/decode's balanced-split switch, "ragged" (committed) against "ragged-split" (gluon's and
# cute's), with gluon/decode as committed, on one GPU (about 2 minutes on an H200, cut at 150 s: the CSV keeps
# the rows done by then): bench.triton_balanced_ab on seed 31's two ragged rows (the B=32 Hkv=32 one, whose
# rule gives one split), seed 37's two and two full caches given as lengths, each setting checked against
# fp64 on a poisoned output, then timed four ways. Triton only, nothing to carry.
# Run from the project root: command `bash bench/triton_balanced_ab.sh`.
# Outputs in $OUT: gpu.log, ab.log, ab/ (balanced.csv, balanced.md).
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" triton_balanced_ab.sh runs/triton_balanced_ab
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.log" 2>&1
status=0
timeout 150 python3 -m bench.triton_balanced_ab --out "$OUT/ab" > "$OUT/ab.log" 2>&1 || status=1
grep -E "^(read|gluon|triton|-- )" "$OUT/ab.log" | cut -c1-230
exit $status
