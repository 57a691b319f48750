#!/usr/bin/env bash
# Issue #38's 65-127 packed rows with cache lengths at D=128 in cute/decode: seed 86 row 4 (B=8 H=40 Hkv=8 Sq=16
# Sk=26368 ragged, 80 packed rows, the balanced split's 132 shares) read 54 % of the bandwidth on an H100 (2026-12-06,
# results/h100/cute-decode-two-wg-rows-2026-12-06/), each share's two 64-row M tiles in two CTAs that each read its
# keys. On the padded split one CTA of two warpgroups took every 80-row row to 0.58-0.90x. BALANCED_TWO_WARPGROUPS
# (cute_impl/decode.py, off, untimed) gives the balanced shares that CTA: the same shares and slabs, one CTA along M
# and one an SM, its 6-stage overlapped ring in place of the shallow 2-3 stages (sm_90a at 86/4: 193 registers, no
# spills). Predicted (not measured): the long shares (86/4, 38/1, 93/6, 66/0, 76/5, 226/2: 2 shares a slot or fewer
# over 26k-501k keys) 0.70-0.90x, as the padded rows' long splits; the many short ones (55/1, 169/0, 23/6: 264 shares
# of 5.6k-20k keys, two waves) 0.85-1.10x, the one CTA an SM having no neighbour to hide a short share's fill and
# drain (the padded 69/4 lost 2.20x that way). The controls (1206/1: 80 rows, padded; 59/2: 64 rows, balanced) 1.00x.
# This call: the switch's GPU tests (fp64 on a poisoned output: 80 rows ragged, paged 16 and 64, the rule's shares and
# forced ones; a planted rows bug at 256 rows), then one A/B through bench.decode_knob_ab (2 rounds, each value
# checked against fp64 first), 86/4 first (the table is rewritten after every row). About 300 s.
# Run from the project root, carrying [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command
# `bash bench/cute_decode_two_wg_balanced_ab.sh`. Outputs in $OUT: times.txt, pytest.log, two_wg_balanced.log,
# two_wg_balanced/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_decode_two_wg_balanced_ab.sh runs/cute_decode_two_wg_balanced_ab
decode_setup
status=0
gpu_tests 120 tests/test_cute_decode_two_wg_balanced.py
knob_ab two_wg_balanced 240 cute_impl.decode:BALANCED_TWO_WARPGROUPS 'False,True' cute/decode \
  86/4 38/1 93/6 66/0 76/5 226/2 55/1 169/0 23/6 1206/1 59/2
cat "$OUT/times.txt"
exit $status
