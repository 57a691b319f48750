#!/usr/bin/env bash
# Issue #38's 128 packed rows at D=64 on the balanced split in gluon/decode: seed 5309 row 2 (B=16 H=32 Hkv=2 Sq=8
# Sk=316160 D=64, cache lengths 21..256168, two of 16 sequences holding 83 % of the keys) read 54 % of the read
# bandwidth in gluon/decode (151.3 us; triton 53 %, cute 67 % on its WGMMA tile with the overlapped ring) on an H100
# (2026-12-06, results/h100/decode-fresh-seeds-2026-12-06c/). gluon runs its two 64-row M tiles as two CTAs of one
# consumer (100 target shares, 264 CTAs, two an SM by shared memory), each copying every key block of its share.
# BALANCED_TWO_CONSUMERS at (64, 128) (triton_impl/gluon/decode.py, off: D=64 untimed there) gives them one CTA of two
# consumers on one 8-stage ring of 64 keys (TWO_CONSUMERS[64]): 132 CTAs, one an SM, each block copied once for both
# tiles, one consumer's softmax under the other's wgmmas. sm_90a (Triton 3.6 and 3.8): 168 registers, 147912 bytes of
# shared memory, no spill (tests/test_gluon_decode_two_consumers.py). Predicted (not measured): 0.85-1.00x the time
# on the rows it moves, as the same switch at D=128 gave (0.84-0.98x on six of seven ragged rows, 1.04x on one,
# results/h200/decode-many-rows-2026-12-04/); the rows of 132 -> 264 target shares (221/1, 2026/4, 214/0, 104/3,
# 189/3) may lose what the second wave of shares bought. The control (5309/4: D=64 Sq=2 group 4, one M tile) 1.00x.
# This call: the candidate's GPU tests (fp64 on a poisoned output with the two-consumer balanced plan checked: 5309/2,
# 56/6, paged 256 top-left with the LSE, an empty sequence and three M tiles), then bench.decode_knob_ab (the default
# (128,) against (64, 128), 2 rounds, each value checked against fp64 first) on 5309/2 first and the other rows of
# seeds 1-239 and the fresh seeds whose plan it moves (a CPU scan, the thirteen), then the control. About 300 s.
# Run from the project root, carrying [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"] (triton/gluon only:
# the carry may be left out), command `bash bench/gluon_decode_balanced_two_d64_ab.sh`. Outputs in $OUT: times.txt,
# pytest.log, balanced_two_d64.log, balanced_two_d64/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" gluon_decode_balanced_two_d64_ab.sh runs/gluon_decode_balanced_two_d64_ab
decode_setup
status=0
gpu_tests 90 -n 3 tests/test_gluon_decode_two_consumers.py -k d64_candidate
knob_ab balanced_two_d64 230 triton_impl.gluon.decode:BALANCED_TWO_CONSUMERS '(128,),(64, 128)' gluon/decode \
  5309/2 56/6 2026/4 214/0 221/1 98/2 237/7 239/7 104/3 189/3 62/5 8/1 157/2 5309/4
cat "$OUT/times.txt"
exit $status
