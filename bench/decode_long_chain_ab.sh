#!/usr/bin/env bash
# Issue #38: BALANCED_SPLIT "ragged-split" (the switch before) against "ragged-split-long" (the committed one: also every
# call whose split rule cuts an item more than splits.LONG_CHAIN_SPLITS times, with cache_seqlens or not), on one H200
# in one device call, carrying the CuTe DSL for cute/decode's switch (not changed: timed to see whether it should be).
# First the GPU tests of the switch's rows (tests/test_decode_long_chain.py: fp64 on a poisoned output, the plan the
# CPU predicted) and of the balanced kernels at their defaults; then bench.decode_knob_ab, the values alternating over
# 2 rounds, each checked against fp64 first, on the seed rows whose plan the switch changes: those helper `longkv`
# timed (193/6, 93/0, 92/3, 53/2, 82/3: results/h200/decode-long-few-heads/) and full caches over 2-4 sequences and
# 1-4 KV heads it had not (118/1, 124/2, 134/4, 149/3, 160/4, 164/0, 166/4, 177/1, 186/6, 190/7, 199/7).
# Take-rule: kept where no row of triton or gluon is more than 2 % slower; otherwise the bound moves or the switch
# narrows. Run from the project root: command `bash bench/decode_long_chain_ab.sh`, carry
# [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"]. Outputs in $OUT: times.txt, pytest.log, long_chain.log,
# cute_long_chain.log and their folders (knob.csv, knob.md).
set -o pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" decode_long_chain_ab.sh runs/decode_long_chain_ab
decode_setup
status=0
gpu_tests 120 -n 6 tests/test_decode_long_chain.py tests/test_gluon_decode_balanced.py \
  "tests/test_decode.py::test_gpu_balanced_split_one_long_sequence_among_short_ones"
ROWS=(193/6 93/0 92/3 53/2 82/3 118/1 124/2 134/4 149/3 160/4 164/0 166/4 177/1 186/6 190/7 199/7)
knob_ab long_chain 200 triton_impl.decode:BALANCED_SPLIT "'ragged-split-long','ragged-split'" \
  triton/decode "${ROWS[@]}"
knob_ab gluon_long_chain 140 triton_impl.gluon.decode:BALANCED_SPLIT "'ragged-split-long','ragged-split'" \
  gluon/decode "${ROWS[@]}"
knob_ab cute_long_chain 100 cute_impl.decode:BALANCED_SPLIT "'ragged-split','ragged-split-long'" \
  cute/decode 193/6 93/0 92/3 118/1 134/4 149/3 164/0 199/7
cat "$OUT/times.txt"
exit $status
