#!/usr/bin/env bash
# gluon/decode's TWO_CONSUMERS (issue #38's compute-bound class: 256 packed rows a KV head, seeds 229 and 233) on one
# H200: (1) the switch's GPU tests (tests/test_gluon_decode_two_consumers.py: every case against fp64 with the
# two-consumer plan checked, for each candidate ring, and the planted short grid); (2) `bench.decode_knob_ab`: off
# against three rings, each for any M tiles (gluon/hopper's two stages, deeper rings of 128 or 64 keys at D=128, 32 at
# D=256; the switch's form: head dim -> (ring at two M tiles, ring past two)), 2 rounds, on the
# sweep's rows of 128-256 packed rows at D=128 and D=256 and two rows it leaves (one M tile, D=64: the same plan
# twice). Carry [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"] (decode_setup activates them).
# Command: `bash bench/two_consumers_ab.sh`. Outputs in $OUT: times.txt, pytest.log, two.log, two/.
set -o pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" two_consumers_ab.sh runs/two_consumers
decode_setup
status=0
gpu_tests 240 -n 6 tests/test_gluon_decode_two_consumers.py
knob_ab two 400 triton_impl.gluon.decode:TWO_CONSUMERS \
  "{},{128: ((128, 2), (128, 2)), 256: ((64, 2), (64, 2))},{128: ((128, 3), (128, 3)), 256: ((32, 5), (32, 5))},{128: ((64, 6), (64, 6)), 256: ((32, 4), (32, 4))}" \
  gluon/decode \
  233/5 139/1 200/4 18/2 107/0 229/2 62/4 169/4 161/5 170/2 54/7 171/0 52/5 27/3 96/1 21/3 234/1
cat "$OUT/times.txt"
exit $status
