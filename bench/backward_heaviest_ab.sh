#!/usr/bin/env bash
# Issue #40: the causal backward's CTAs heaviest first (BackwardTiles(heaviest_first=True): block-major in
# groups of (batch, head) items that fill a wave, cute_impl/backward/_device.py and triton_impl/gluon/_device.py
# heaviest_first) against each rung's default, in one process on one GPU (at most about 150 s on an H200):
# bench.backward --candidates --rung RUNG at P1 causal, B8 S2048 causal (the two shapes whose grid order leaves
# the heaviest key blocks of the last items in the last wave: a greedy schedule 5.9 / 6.9 % past the even share,
# 0.2 / 1.6 % heaviest first) and P1 (non-causal, the control: the same kernel), each variant's gradients first
# checked against cuDNN's, beside cuDNN, SDPA flash and FA4 timed alike. The variants' GPU tests are the
# suite's (every candidate against fp64: tests/test_cute_backward.py, tests/test_backward.py).
# Run from the project root: command `bash bench/backward_heaviest_ab.sh cute` (or `gluon`); CuTe and FA4 carried.
# Outputs in $OUT: gpu.log, candidates.log, candidates/candidates.csv.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" backward_heaviest_ab.sh "runs/backward_heaviest_ab_${1:-cute}"
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.log" 2>&1
case "${1:-}" in
  cute) variants=(--variant m64_s2_dqreduce_tmarows --variant m64_s2_dqreduce_tmarows_heaviestfirst) ;;
  gluon) variants=(--variant default --variant "dkdv 128x32 s3, dq 128x64 s3 overlap tma_rows heaviest_first") ;;
  *) echo "usage: bash bench/backward_heaviest_ab.sh cute|gluon (got '${1:-}')" >&2; exit 2 ;;
esac
status=0
timeout 150 python3 -m bench.backward --candidates --rung "$1" --shape "P1 causal" --shape "B8 S2048 causal" \
  --shape P1 "${variants[@]}" --budget-s 140 --out "$OUT/candidates" > "$OUT/candidates.log" 2>&1 || status=1
grep -v "Warning\|exe_args" "$OUT/candidates.log" | tail -22
exit $status
