#!/usr/bin/env bash
# One device call (≤ 560 s) for a session whose device time is short: the two first steps of the next device
# session's plan, cut to what settles a decision.
# (1) the fifteenth stop's decode defaults through their default path (gluon/decode's TWO_CONSUMERS and
#     consumers_for, cute/decode's WGMMA_D256: the files' GPU tests with nothing monkeypatched, and the gluon and cute
#     rows of tests/test_decode.py), cut at 130 s (bench/defaults_check_2026_12_04b.sh's step 1);
# (2) cute/decode's PACKED_PREFILL_MIN_ROWS and PACKED_PREFILL_SPLITS (both off, untimed): their GPU tests in one
#     run, cut at 150 s, then the packed prefill's A/B, off / 128 / 256 rows, on the eleven rows it takes and two
#     controls, seed 233 row 5 first (bench/cute_decode_packed_prefill_ab.sh; the splits' A/B is
#     bench/cute_decode_packed_splits_ab.sh).
# Carry [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"]; command `bash bench/defaults_and_packed_prefill.sh`.
# Outputs in $OUT: times.txt, defaults.log (1), packed_tests.log, packed_prefill.log, packed_prefill/ (2).
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" defaults_and_packed_prefill.sh runs/defaults_and_packed_prefill
decode_setup
status=0
decode_defaults_tests 130
gpu_tests 150 -n 8 tests/test_cute_decode_packed_prefill.py tests/test_cute_decode_packed_splits.py
mv "$OUT/pytest.log" "$OUT/packed_tests.log"
knob_ab packed_prefill 240 cute_impl.decode:PACKED_PREFILL_MIN_ROWS 'None,128,256' cute/decode \
  233/5 176/6 157/4 204/4 140/1 62/1 100/4 214/0 231/6 69/4 18/2 139/1 107/0
cat "$OUT/times.txt"
exit $status
