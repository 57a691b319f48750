#!/usr/bin/env bash
# Issue #38: triton/decode's ONE_SLOT_ONE_WAVE (on since this A/B, results/h200/triton-decode-one-wave/:
# BALANCED_BUILD_FIT's one-wave cap at the one CTA an SM a tile's config declares, where the items are few). Seed 137 row 5 (B=32 H=5 Hkv=1 Sq=4 D=256 ragged, 184 MB) reads 48 % of
# the read bandwidth (86.7 us; gluon 61 %, cute 63 %): its D=256 wgmma tile holds one CTA an SM, and "per-slot-many"
# gives it 264 shares + 32 items, 296 CTAs on 132 slots (2.2 waves); on, 100 + 32, one wave, as gluon and cute plan it.
# This call: the switch's GPU tests (fp64 on 137/5's kind shrunk, the launch's target, a planted share bug), then
# bench/decode_knob_ab.py False against True on the three sweep rows it moves (137/5, 43/4, 83/5) and two controls
# (139/4: the same tile with 64 items; 137/0: D=256 paged on the default tile), each value checked against fp64 first.
# Predicted: 137/5 86.7 -> 66-76 us (gluon's 100-share plan reads 61 %: ~70 us); 43/4 and 83/5 0.85-1.00x; controls
# 1.00x. Take-rule: 137/5 at or under 0.95x, no moved row over 1.02x, the controls level.
# Run from the project root, carrying [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command
# `bash bench/triton_decode_mqa256_ab.sh`. About 200 s. Outputs in $OUT: times.txt, pytest.log, mqa256.log, mqa256/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" triton_decode_mqa256_ab.sh runs/triton_decode_mqa256_ab
decode_setup
status=0
gpu_tests 150 tests/test_triton_decode_one_wave.py
knob_ab mqa256 200 triton_impl.decode:ONE_SLOT_ONE_WAVE False,True triton/decode 137/5 43/4 83/5 139/4 137/0
cat "$OUT/times.txt"
exit $status
