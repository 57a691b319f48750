#!/usr/bin/env bash
# Issue #38's few-pair decode rows on a GPU in one device call (at most 3 minutes on an H200): bench.decode_fewpairs
# in one process, shape by shape (each shape's inputs drawn once for the three decode rungs), on seed 31's low
# rows (B=3 Hkv=8 Sq=8 13k; B=8 Hkv=8 group 4 Sq=4 8.7k), the control B=1 Hkv=8 128k, seed 31's B=16 MQA Sq=8
# D=256 paged(32) ragged row, and the control B=64 Hkv=8 32k: each rung as committed against FEWER_WAVES
# (splits.SplitPolicy.fewer_waves) and, for cute/decode, SPLIT_CTAS_PER_SM = 2, each timed only where it
# changes the split count, and on seed 31's rows a quarter, half and (full caches) double the committed count; beside
# them a torch.sum over exactly the step's bytes (the read-bandwidth reduction at the step's size). Every row
# checked against fp64 first, then timed four ways: do_bench eager and CUDA-graph (L2 zeroed before each run,
# as compare.py times) and the same with L2 left clean by a read-only flush. Cut at 170 s (the CSV keeps the
# rows done by then; the shapes come in the order above).
# Run from the project root: command `bash bench/decode_fewpairs_ab.sh`. cute/decode's rows need the CuTe DSL.
# Outputs in $OUT: gpu.log, fewpairs.log, fewpairs/ (fewpairs.csv, fewpairs.md).
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" decode_fewpairs_ab.sh runs/decode_fewpairs_ab
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$OUT/gpu.log" 2>&1
status=0
timeout 170 python3 -m bench.decode_fewpairs --out "$OUT/fewpairs" > "$OUT/fewpairs.log" 2>&1 || status=1
grep -E "^(read |.*/decode |-- |read bandwidth)" "$OUT/fewpairs.log" | cut -c1-230
exit $status
