#!/usr/bin/env bash
# Issue #38's few-pair decode rows on a GPU in one device call (about 3 minutes on an H200): for each decode
# rung in its own process, bench.decode_fewpairs on seed 31's three low rows (B=3 Hkv=8 Sq=8 13k; B=8 Hkv=8
# group 4 Sq=4 8.7k; B=16 MQA Sq=8 D=256 paged(32) ragged) and two rows that read at about 90 % (B=1 Hkv=8
# 128k; B=64 Hkv=8 32k): the rung as committed against FEWER_WAVES (splits.SplitPolicy.fewer_waves) and, for
# cute/decode, SPLIT_CTAS_PER_SM = 2, each timed only where it changes the split count, and on the two full low
# rows half and double the committed count (forced); beside them a
# torch.sum over exactly the step's bytes (the read-bandwidth reduction at the step's size). Every row in
# four timings: do_bench eager and CUDA-graph (L2 zeroed before each run, as compare.py times) and the same
# with L2 left clean by a read-only flush. Each process is cut at its cap (its CSV keeps the rows done).
# Run from the project root: command `bash bench/decode_fewpairs_ab.sh`. cute/decode needs the CuTe DSL.
# Outputs in $OUT: gpu.log, triton.log, gluon.log, cute.log, and triton/ gluon/ cute/ (fewpairs.csv, .md).
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" decode_fewpairs_ab.sh runs/decode_fewpairs_ab
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$OUT/gpu.log" 2>&1
status=0
for pair in triton:50 gluon:55 cute:70; do
  stack=${pair%%:*}
  timeout "${pair##*:}" python3 -m bench.decode_fewpairs --impl "$stack/decode" --out "$OUT/$stack" \
    > "$OUT/$stack.log" 2>&1 || status=1
  grep -E "^(read|$stack/decode) " "$OUT/$stack.log" | cut -c1-220
done
exit $status
