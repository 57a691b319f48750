#!/usr/bin/env bash
# Issue #38's class of 128-256 packed rows a KV head, the stop's three untimed candidates in one H200 call (carry
# [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"]): (1) their GPU tests (tests/test_gluon_decode_two_
# consumers.py: every two-consumer ring, padded and balanced, against fp64; tests/test_cute_decode_wgmma_d256.py: both
# cute rings at D=256); (2) gluon/decode's BALANCED_TWO_CONSUMERS off against on, on the class's ragged rows (balanced
# split) and a control; (3) cute/decode's WGMMA_D256 (None, (64, 3), (32, 6)) on D=256 rows of 128-256 packed rows and
# a control (bench/cute_decode_wgmma_d256_ab.sh's rows, fewer); (4) gluon/decode's TWO_CONSUMERS at D=64 (the
# D=128 default against it plus a D=64 ring: 8 stages of 64 keys at two M tiles, 4 of 128 past them). Each A/B
# 2 rounds, each value checked against fp64 first; caps keep the call under 400 s.
# Command: `bash bench/decode_many_rows_ab.sh`. Outputs in $OUT: times.txt, pytest.log, NAME.log and NAME/ per A/B.
set -o pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" decode_many_rows_ab.sh runs/decode_many_rows
decode_setup
status=0
gpu_tests 100 -n 8 tests/test_gluon_decode_two_consumers.py tests/test_cute_decode_wgmma_d256.py
knob_ab balanced_two 80 triton_impl.gluon.decode:BALANCED_TWO_CONSUMERS "(),(128,)" gluon/decode \
  92/0 84/1 176/6 62/1 185/5 120/2 132/6 61/7
knob_ab wgmma_d256 130 cute_impl.decode:WGMMA_D256 'None,(64,3),(32,6)' cute/decode \
  229/2 62/4 67/7 169/4 161/5 27/3 96/1 43/1
knob_ab d64 60 triton_impl.gluon.decode:TWO_CONSUMERS \
  "{128: ((64, 6), (128, 3))},{128: ((64, 6), (128, 3)), 64: ((64, 8), (128, 4))}" gluon/decode \
  234/1 231/6 100/4 236/1 64/4 12/1 26/6 39/1
cat "$OUT/times.txt"
exit $status
