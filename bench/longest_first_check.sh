#!/usr/bin/env bash
# The longest-first claim orders on one GPU (issue #38): (1) the GPU tests of gluon/decode's items kernel (its chunked
# `_batch_ranks` loop, both switches, the planted tie-break) and of triton/decode's LONGEST_FIRST; (2) triton/decode's
# LONGEST_FIRST A/B on the six ragged items rows; (3) gluon/decode's ITEMS_LONGEST_FIRST A/B on the same rows, the
# chunked rank's first timing (the thirty-first stop timed the unrolled one). No carry needed (Triton and Gluon only).
# Command: `bash bench/longest_first_check.sh`. Outputs in $OUT: times.txt, pytest.log, triton.log, triton/, gluon.log,
# gluon/.
set -o pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" longest_first_check.sh runs/longest_first_check
decode_setup
status=0
rows=(6007/4 221/7 23/2 31/6 151/1 196/0)
gpu_tests 300 -n 4 tests/test_gluon_decode_items.py tests/test_decode_longest_first.py
knob_ab triton 140 triton_impl.decode:LONGEST_FIRST False,True triton/decode "${rows[@]}"
knob_ab gluon 140 triton_impl.gluon.decode:ITEMS_LONGEST_FIRST False,True gluon/decode "${rows[@]}"
cat "$OUT/times.txt"
exit $status
