#!/usr/bin/env bash
# Issue #38: the packed prefill on by default (cute/decode PACKED_PREFILL_MIN_ROWS 128, uneven work from 256 rows and
# three waves of tiles; H100, 2026-12-05, results/h100/decode-packed-prefill-2026-12-05/call1/) and its key splits
# (PACKED_PREFILL_SPLITS, then off and untimed), in one device call of at most about 480 s (its run: call2/ there):
#   1. GPU tests (≤ 200 s, 8 workers): the packed prefill's and the key splits' (fp64 on a poisoned output, their
#      planted kernels), cute/decode's rows of tests/test_decode.py on the new default, and gluon/decode's two-consumer
#      case that ITEMS_IN_FLIGHT now takes (its test turns that kernel off);
#   2. the default against None (≤ 110 s) on rows no A/B was tuned on: seed 260 row 2 and 283/7 (the rows of seeds
#      240-299 it takes), 62/1 and 214/0 without cache lengths (their uneven runs lost; contiguous, the rule takes
#      them), and 176/6 at B=4 with full lengths (uneven, 256 tiles: the guard keeps it off, a control);
#   3. PACKED_PREFILL_SPLITS False/True (≤ 170 s) on the rows it moves: 139/1 107/0 99/7 200/4 14/7 228/0, four of
#      seeds 240-299 no A/B has seen (246/0 248/4 273/5 296/1), and the controls 233/5 and 103/2.
# Predicted: (2) 0.6-0.95x on the rows it takes; (3) 256-row rows 0.80-0.90x, 128-row rows 0.95-1.05x.
# Carry [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"]; command `bash bench/packed_prefill_defaults_check.sh`.
# Outputs in $OUT: times.txt, pytest.log, packed_default.log, packed_default/, packed_splits.log, packed_splits/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" packed_prefill_defaults_check.sh runs/packed_prefill_defaults_check
decode_setup
status=0
gpu_tests 200 -n 8 tests/test_cute_decode_packed_prefill.py tests/test_cute_decode_packed_splits.py \
  "tests/test_gluon_decode_two_consumers.py::test_gpu_two_consumers_against_fp64" tests/test_decode.py \
  -k "packed or splits or d64-128-rows-paged16-ragged or cute"
knob_ab packed_default 110 cute_impl.decode:PACKED_PREFILL_MIN_ROWS '128,None' cute/decode \
  260/2 283/7 62/1:has_cache_seqlens=False 214/0:has_cache_seqlens=False 176/6:batch=4,full
knob_ab packed_splits 170 cute_impl.decode:PACKED_PREFILL_SPLITS 'False,True' cute/decode \
  139/1 107/0 99/7 200/4 14/7 228/0 246/0 248/4 273/5 296/1 233/5 103/2
cat "$OUT/times.txt"
exit $status
