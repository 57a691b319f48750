#!/usr/bin/env bash
# The thirteenth-to-fourteenth stop's new defaults on one H200 in one device call (carry [".gpu/cutlass-dsl.tar.xz",
# ".gpu/activate.sh", ".gpu/fa4"]): (1) cute/hopper's causal D=128 backward as the full PDL chain, through the default
# path (tests/test_backward.py's cute rows: attention() with grad, every gradient against fp64 by the yardstick rule;
# tests/test_cute_backward.py's default-tile rows; tests/test_cute_backward_short.py's candidates); (2) the decode
# rungs' BALANCED_SPLIT "ragged-split-long" and gluon/decode's shared split step (tests/test_decode_long_chain.py, the
# items kernel's GPU tests, the gluon and balanced rows of the decode files); (3) two seeds of random decode shapes no
# issue names (211, 227) through `compare.py --decode --decode-random 8` for the three decode rungs: the lowest % of
# the read bandwidth per stack. Command: `bash bench/defaults_check_2026_12_04.sh`. Outputs in $OUT: times.txt,
# backward.log, decode.log, seedN.log and seedN/.
set -o pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" defaults_check_2026_12_04.sh runs/defaults_check
decode_setup
status=0
run_tests() {
  local name=$1 limit=$2 begun=$SECONDS
  shift 2
  timeout "$limit" python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider "$@" > "$OUT/$name.log" 2>&1 || status=1
  echo "$name: $((SECONDS - begun)) s (limit $limit s)" >> "$OUT/times.txt"
  tail -3 "$OUT/$name.log"
}
run_tests backward 200 tests/test_backward.py tests/test_cute_backward.py tests/test_cute_backward_short.py \
  -k "test_cute_backward_short or (cute and not candidate and not tma_rows and not 80_rows and not 128_rows)"
run_tests decode 150 tests/test_decode_long_chain.py tests/test_gluon_decode_items.py tests/test_decode.py \
  tests/test_paged_kv.py tests/test_gluon_decode_balanced.py -k "long_chain or items or gluon or balanced"
decode_seeds 90 211 227
cat "$OUT/times.txt"
exit $status
