#!/usr/bin/env bash
# gluon/decode's TWO_CONSUMERS as the D=128 default, on one H200: (1) gluon/decode's GPU tests through the default path
# (the two-consumer file, and the gluon rows of the decode, paged, wide, packed and long-chain files); (2) the default
# against one consumer ({}) on 18 sweep rows the rings were not chosen on (two or more M tiles at D=128, padded split),
# 2 rounds. Carry [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"] (decode_setup activates them).
# Command: `bash bench/two_consumers_check.sh`. Outputs in $OUT: times.txt, pytest.log, check.log, check/.
set -o pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" two_consumers_check.sh runs/two_consumers_check
decode_setup
status=0
gpu_tests 220 -n 8 tests/test_gluon_decode_two_consumers.py \
  tests/test_decode.py tests/test_paged_kv.py tests/test_decode_wide.py tests/test_decode_packed.py \
  tests/test_decode_long_chain.py -k "gluon or two_consumers"
knob_ab check 260 triton_impl.gluon.decode:TWO_CONSUMERS "{128: ((64, 6), (128, 3))},{}" gluon/decode \
  12/4 46/2 78/7 79/1 96/5 99/7 115/3 140/1 155/4 157/4 173/1 174/0 188/3 204/4 222/2 228/0 69/4 14/7
cat "$OUT/times.txt"
exit $status
