#!/usr/bin/env bash
# Issue #38's 65-127 packed rows at D=128 in cute/decode: seed 1206 row 1 (B=8 H=10 Hkv=2 Sq=16 Sk=66304 D=128, 80
# packed rows, full cache, 8 padded splits on 16 (batch, KV head) pairs) took triton/decode 200.8 us (87 % of the read
# bandwidth), gluon/decode 203.2 (86 %) and cute/decode 263.9 (66 %) on an H100 (2026-12-06,
# results/h100/decode-fresh-seeds-2026-12-06/seed1206.log), same split: cute runs two 64-row WGMMA CTAs a (pair,
# split), each reading the whole key slice, where triton takes one 128-row tile and gluon one CTA of two consumers.
# TWO_WARPGROUP_MIN_ROWS (cute_impl/decode.py, 128: the rule as it was) held at 65 lets WGMMA_TWO_WARPGROUPS (off,
# untimed) give such rows one CTA of two warpgroups on one 6-stage K/V ring, its second warpgroup part padding
# (docs/perf-log.md, "Helper `twg65`"). Predicted (not measured): 1206/1 263.9 -> 205-235 us (each K/V block read
# from L2 once per (pair, split), not twice, 4 blocks in flight as in the two CTAs; towards triton's 200.8, not past
# it: the 48 padded rows still pay their wgmmas and softmax, and one CTA an SM has no other CTA's softmax to hide
# under). Every moved row is about one wave of 126-128 such CTAs. Those of long splits (97/7, 132/7, 56/0: 276-660
# key blocks a split) 0.80-0.90x as 1206/1 (130); those of short ones (85/1, 95/4, 186/2: 55-59 blocks) 0.90-1.00x, the
# 128-row Q load and the ring's fill weighing more. The controls (86/4: 80 rows with cache lengths, the balanced split
# keeps one warpgroup; 75/0: 64 rows, one tile) 1.00x, the same plan.
# This call: the switch's GPU tests (fp64 on a poisoned output: 80 and 128-320 packed rows, full and ragged, paged
# 16/64, forced splits and the rule's, both causal alignments, odd M tiles, the LSE; a planted rows bug), then one A/B
# through bench.decode_knob_ab (False against True, TWO_WARPGROUP_MIN_ROWS=65 held by --set; 2 rounds, each value
# checked against fp64 first) on six sweep rows it moves and the two controls, seed 1206 row 1 first (the table is
# rewritten after every row: a cut run keeps the rows it finished). About 280 s.
# Run from the project root, carrying [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command
# `bash bench/cute_decode_two_wg_rows_ab.sh`. Outputs in $OUT: times.txt, pytest.log, two_wg_rows.log, two_wg_rows/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_decode_two_wg_rows_ab.sh runs/cute_decode_two_wg_rows_ab
decode_setup
status=0
gpu_tests 120 tests/test_cute_decode_two_wg.py
export KNOB_AB_SET="cute_impl.decode:TWO_WARPGROUP_MIN_ROWS=65"
knob_ab two_wg_rows 150 cute_impl.decode:WGMMA_TWO_WARPGROUPS 'False,True' cute/decode \
  1206/1 85/1 97/7 132/7 95/4 186/2 56/0 86/4 75/0
cat "$OUT/times.txt"
exit $status
