#!/usr/bin/env bash
# Issue #38: gluon/decode's ragged row of the default `compare.py --decode` (B=8 Hkv=8 32k D=128, lengths 0..32768:
# 136.5 us against cute/decode's 122.7, triton/decode's 126.0 and FlashInfer's 121.9; H200, results/h200/decode/).
# D=128's 208 KB ring holds one CTA an SM, so gluon's "per-slot" plan is 264 shares + 64 items on 132 slots (2.5
# waves, every CTA's ramp and drain alone on its SM), where cute runs 200 + 64 on 264 slots (one wave) and triton
# 264 + 64 on 396. BALANCED_PAIR_TILE gives the balanced kernel a ring of 64-key blocks in 3 stages (112 KB, 172
# registers: two CTAs an SM) where that makes "per-slot" one wave and the default ring's is not (45-88 items at D=128).
# Predicted (bench/decode_ragged_model.py, 1.75-2.5 us latency): the row 136.5 -> 121-126 us; 53/6 440 -> 400-410;
# the other rows it moves 0.85-1.00x; the controls (53/7, 59/4, the full row: same plan) 1.00x.
# This call: the pair ring's GPU tests (fp64 on the sweep's ragged row and three smaller kinds, the launch's ring),
# then one A/B through bench.decode_knob_ab (False against True, 2 rounds, each value checked against fp64 on a
# poisoned output first) on the row, five sweep rows it moves (53/6, 1.6 GB, last) and three it leaves; then
# `compare.py --decode` of gluon/decode and FlashInfer with the switch on (FlashInfer where stashed). About 420 s.
# Run from the project root after `bash .gpu/flashinfer/stash.sh` in a call just before, carrying
# [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4", ".gpu/flashinfer/activate.sh"], command
# `bash bench/gluon_balanced_pair_ab.sh`. Outputs in $OUT: times.txt, pytest.log, pair.log, pair/, decode.tgz.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" gluon_balanced_pair_ab.sh runs/gluon_balanced_pair_ab
decode_setup
status=0
gpu_tests 120 tests/test_gluon_decode_pair_tile.py
# The default sweep's B=8 H=32 Hkv=8 Sq=1 D=128 shape (seed 73's row 3 reshaped): ragged as compare.py's, then full.
SHAPE=73/3:seqlen_k=32768,head_dim=128
knob_ab pair 300 triton_impl.gluon.decode:BALANCED_PAIR_TILE False,True gluon/decode \
  "$SHAPE,ragged" 91/3 83/7 57/3 67/5 53/7 59/4 "$SHAPE" 53/6
decode_with_knob 110 triton_impl.gluon.decode:BALANCED_PAIR_TILE "lengths=0"
cat "$OUT/times.txt"
exit $status
