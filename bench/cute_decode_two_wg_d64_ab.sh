#!/usr/bin/env bash
# Issue #38's 65-127 packed rows at D=64 in cute/decode: seed 137 row 1 (B=16 H=10 Hkv=2 Sq=16 Sk=41472 D=64, 80 packed
# rows, full cache, 4 padded splits) ran at 125.9 us, 61 % of the read bandwidth, on two 64-row WGMMA CTAs a (pair,
# split), each reading the whole key slice (H200, 2026-12-02). At D=128 one CTA of two warpgroups on one ring took
# every 80-row row to 0.58-0.90x (H100, 2026-12-06, results/h100/cute-decode-two-wg-rows-2026-12-06/).
# TWO_WARPGROUP_RINGS (cute_impl/decode.py) without 64 (the default) against {64: 8} and {64: 10}: Q 16 KB and 8 or 10
# K/V blocks of 16 KB, 6 or 8 in flight against the two CTAs' 4 + 4 (sm_90a: 143 registers, no spills).
# Predicted (not measured): the long splits (137/1, 123/1, 186/5: 162-880 key blocks a split) 0.65-0.85x as D=128's
# long splits (0.58-0.73x); the short unsplit ones (93/4, 108/1, 151/1, 221/7: 16-104 blocks, 1-2 splits, 2048 or
# 1024 pairs) 0.85-1.30x: D=128's 69/4 (at most 12 blocks a pair, one CTA an SM) lost 2.20x, 186/2 (29 blocks) gained
# 0.88x. The controls (189/3: D=64 80 rows, balanced split; 1206/1: D=128) 1.00x, the same plan.
# Measured (H100, 2026-12-06, rows and limits cut to share a call;
# results/h100/cute-decode-two-wg-candidates-2026-12-06/): 1.02-1.13x slower on every row it took (137/1 128.1 ->
# 143.9 us); left out of the default.
# This call: the candidate's GPU tests (fp64 on a poisoned output: 80 rows full, ragged, paged 128), then one A/B
# through bench.decode_knob_ab (2 rounds, each value checked against fp64 first), seed 137 row 1 first (the table is
# rewritten after every row: a cut run keeps the rows it finished). About 300 s.
# Run from the project root, carrying [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command
# `bash bench/cute_decode_two_wg_d64_ab.sh`. Outputs in $OUT: times.txt, pytest.log, two_wg_d64.log, two_wg_d64/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_decode_two_wg_d64_ab.sh runs/cute_decode_two_wg_d64_ab
decode_setup
status=0
gpu_tests 120 tests/test_cute_decode_two_wg_d64.py
knob_ab two_wg_d64 240 cute_impl.decode:TWO_WARPGROUP_RINGS '{128: 6},{128: 6, 64: 8},{128: 6, 64: 10}' cute/decode \
  137/1 123/1 186/5 93/4 108/1 151/1 221/7 189/3 1206/1
cat "$OUT/times.txt"
exit $status
