#!/usr/bin/env bash
# Issue #38's 128-256 packed rows at D=64 on the balanced split in gluon/decode, the rule the H100 A/B of
# BALANCED_TWO_CONSUMERS at (64, 128) asked for (results/h100/gluon-decode-balanced-two-d64-2026-12-06/: the eight rows
# whose target shares stay 0.86-0.99x the time, 5309/2 152.1 -> 131.1 us; 2026/4, 221/1 and 104/3, whose target
# doubles 132 -> 264 because the target rules count shares over the grid's M tiles, 1.15-1.24x).
# BALANCED_TWO_CONSUMERS_SAME_TARGET at (64,) (triton_impl/gluon/decode.py, off: untimed as a rule) gives D=64's
# balanced calls two consumers only where the two-consumer plan's target shares are no more than the one-consumer
# plan's (``balanced_two_consumers``). Predicted (not measured): the moved rows (5309/2, 56/6, 98/2) 0.86-0.92x as under
# (64, 128), where the plan is the same; the rows it leaves (2026/4, 221/1, 104/3, and 214/0, whose doubled target
# gained 0.93x under (64, 128)) 1.00x, as the controls: 6007/4 (B=32 H=512 Hkv=32 Sq=8 Sk=4608 D=64 ragged, gluon's
# lowest row at 44 % of the read bandwidth: the items kernel's one split, not the balanced split) and 5309/4 (one M
# tile). This call: the rule's GPU tests (fp64 on a poisoned output with the two-consumer balanced plan checked: 5309/2,
# 56/6, paged 256 top-left with the LSE, an empty sequence and three M tiles), then bench.decode_knob_ab (() against
# (64,), 2 rounds, each value checked against fp64 first) on the rows above, 5309/2 first, the control 5309/4 last.
# About 210 s. Run from the project root (Triton only, no carry needed), command
# `bash bench/gluon_decode_two_consumer_target_ab.sh`. Outputs in $OUT: times.txt, pytest.log,
# two_consumer_target.log, two_consumer_target/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" gluon_decode_two_consumer_target_ab.sh runs/gluon_decode_two_consumer_target_ab
decode_setup
status=0
gpu_tests 60 -n 3 tests/test_gluon_decode_two_consumers_target.py
knob_ab two_consumer_target 150 triton_impl.gluon.decode:BALANCED_TWO_CONSUMERS_SAME_TARGET '(),(64,)' gluon/decode \
  5309/2 2026/4 221/1 104/3 56/6 98/2 6007/4 214/0 5309/4
cat "$OUT/times.txt"
exit $status
