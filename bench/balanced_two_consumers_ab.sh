#!/usr/bin/env bash
# gluon/decode's BALANCED_TWO_CONSUMERS (the balanced split's calls of TWO_CONSUMERS' class: ragged or paged batches of
# 128-256 packed rows a KV head at D=128) on one H200: (1) the two-consumer GPU tests (tests/test_gluon_decode_two_
# consumers.py: every padded and balanced case against fp64 with its plan checked); (2) `bench.decode_knob_ab` off
# against on, 2 rounds, on the sweep's ragged rows of the class and two controls (D=256, one M tile: the same plan).
# Carry [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"]. Command: `bash bench/balanced_two_consumers_ab.sh`.
# Outputs in $OUT: times.txt, pytest.log, balanced_two.log, balanced_two/.
set -o pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" balanced_two_consumers_ab.sh runs/balanced_two_consumers
decode_setup
status=0
gpu_tests 200 -n 8 tests/test_gluon_decode_two_consumers.py
knob_ab balanced_two 200 triton_impl.gluon.decode:BALANCED_TWO_CONSUMERS "(),(128,)" gluon/decode \
  92/0 84/1 176/6 62/1 185/5 120/2 132/6 189/2 208/2 215/4 61/7 211/7
cat "$OUT/times.txt"
exit $status
