#!/usr/bin/env bash
# Issue #38: triton/decode's ONE_KEY_LOOP (on since this A/B, results/h200/triton-decode-one-loop/): a split's keys
# in one pipelined loop (loads masked, S masked from the first block a row may not see), not an unmasked loop then a
# masked one, each a pipeline to fill and drain. Seed 151 row 1 (2048 items of ~10 64-key blocks, paged(128), ragged)
# reads 40 %: its items pay two ramps each.
# This call: bench/decode_knob_ab.py False against True on ten sweep rows (seeds 31-151: short and ragged items, paged
# and contiguous, 16- to 128-row tiles, padded and balanced; 93/4's 68-block items the control), then on fourteen rows
# of seeds no earlier run drew (163-181, every head dim), each value checked against fp64 first. sm_90a (Triton
# 3.6): one loop of 459-501 static instructions against 314-353 + 458-498.
# Predicted: 0.85-0.95x on the short-item rows (151/1, 41/1, 31/6, 129/5), 0.95-1.02x elsewhere.
# Take-rule: no row over 1.02x and the median at or under 0.97x.
# Run from the project root, command `bash bench/triton_decode_one_loop_ab.sh`. About 110 s. Outputs in $OUT:
# times.txt, one_loop.log, one_loop/, one_loop_new.log, one_loop_new/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" triton_decode_one_loop_ab.sh runs/triton_decode_one_loop_ab
decode_setup
status=0
knob_ab one_loop 400 triton_impl.decode:ONE_KEY_LOOP False,True triton/decode \
  151/1 41/2 109/0 119/5 117/3 31/6 55/1 129/5 41/1 93/4
# The confirmation: fourteen rows of seeds no earlier run drew (163-181), every head dim.
knob_ab one_loop_new 400 triton_impl.decode:ONE_KEY_LOOP False,True triton/decode \
  163/2 163/4 167/0 173/2 173/3 173/4 173/7 179/2 163/0 167/1 179/1 181/3 163/7 181/0
cat "$OUT/times.txt"
exit $status
