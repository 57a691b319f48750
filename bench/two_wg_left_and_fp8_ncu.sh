#!/usr/bin/env bash
# One device call, two questions (twenty-third stop, 2026-12-06):
# 1. Issue #38: with the packed prefill on (the default since 2026-12-05), WGMMA_TWO_WARPGROUPS (cute_impl/decode.py,
#    off) at TWO_WARPGROUP_MIN_ROWS=65 moves ten rows of seeds 1-239: the eight 80-row rows on the padded split (six
#    timed by bench/cute_decode_two_wg_rows_ab.sh, 0.58-0.88x on an H100), and two the packed prefill leaves: 7/3 (256
#    rows, paged 16, ragged) and 69/4 (128 rows, ragged). This times those two, the last two 80-row rows (117/7,
#    138/1) and a control (86/4: 80 rows, balanced split, plan unchanged), before the switch is made the default.
# 2. Issue #37: cute/fp8's causal D=64 kernel takes 0.61 of its non-causal time where cute/hopper's takes 0.506
#    (results/h100/fp8-q-in-kernel-2026-12-06/). Nsight Compute of both at B=4 H=32 S=8192 D=64 (bench/ncu.sh).
# Run from the project root, carrying [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command
# `bash bench/two_wg_left_and_fp8_ncu.sh` (about 400 s). Outputs in $OUT: times.txt, two_wg.log, two_wg/,
# ncu-fp8d64-*.tgz.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" two_wg_left_and_fp8_ncu.sh runs/two_wg_left_and_fp8_ncu
decode_setup
status=0
export KNOB_AB_SET="cute_impl.decode:TWO_WARPGROUP_MIN_ROWS=65"
knob_ab two_wg 150 cute_impl.decode:WGMMA_TWO_WARPGROUPS 'False,True' cute/decode 7/3 69/4 117/7 138/1 86/4
NCU_TIMEOUT_S=150 bash "$(dirname "$0")/ncu.sh" fp8d64 "cute/fp8 4 32 8192 64 1" "cute/fp8 4 32 8192 64 0" || status=1
cat "$OUT/times.txt"
exit $status
