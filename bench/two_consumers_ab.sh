#!/usr/bin/env bash
# gluon/decode's TWO_CONSUMERS (issue #38's compute-bound class: 256 packed rows a KV head, seeds 229 and 233) on one
# H200: (1) the switch's GPU tests (tests/test_gluon_decode_two_consumers.py: every case against fp64 with the
# two-consumer plan checked, the planted short grid); (2) `bench.decode_knob_ab` off against on, 2 rounds, on the
# sweep's rows of 128-256 packed rows at D=128 and D=256 and two rows it leaves (one M tile, D=64: the same plan
# twice). Carry [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"] (decode_setup activates them).
# Command: `bash bench/two_consumers_ab.sh`. Outputs in $OUT: times.txt, pytest.log, two.log, two/.
set -o pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" two_consumers_ab.sh runs/two_consumers
decode_setup
status=0
begun=$SECONDS
timeout 200 python3 -m pytest -q -m gpu -n 4 -p no:cacheprovider tests/test_gluon_decode_two_consumers.py \
  > "$OUT/pytest.log" 2>&1 || status=1
echo "gpu tests: $((SECONDS - begun)) s (limit 200 s)" >> "$OUT/times.txt"
tail -3 "$OUT/pytest.log"
knob_ab two 330 triton_impl.gluon.decode:TWO_CONSUMERS False,True gluon/decode \
  233/5 139/1 200/4 100/6 18/2 107/0 229/2 62/4 67/7 169/4 161/5 170/2 54/7 171/0 52/5 27/3 96/1 42/7 103/0 21/3 \
  234/1 61/7
cat "$OUT/times.txt"
exit $status
