#!/usr/bin/env bash
# One decode rung at this tree in one short device call (issue #38): the GPU tests of every decode and paged file's
# cases of that rung (pytest -k RUNG_STACK, e.g. cute), then `compare.py --decode --decode-random 8` of that rung alone
# on each seed in SEEDS (shapes no issue names). For a kernel change whose A/B ran on an earlier tree.
# Run from the project root, carrying [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command
# `STACK=cute SEEDS="107" bash bench/decode_rung_check.sh`. Outputs in $OUT: times.txt, pytest.log, seed*/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" decode_rung_check.sh runs/decode_rung_check
decode_setup
status=0
stack=${STACK:?STACK names the stack of the decode rung: triton, gluon or cute}
gpu_tests 170 -n 8 tests/test_"$stack"_decode*.py tests/test_decode*.py tests/test_paged_kv.py -k "$stack"
for seed in ${SEEDS:-}; do
  begun=$SECONDS
  timeout 60 python3 compare.py --decode --decode-random 8 --decode-seed "$seed" --only "$stack/decode" \
    --out "$OUT/seed$seed" > "$OUT/seed$seed.log" 2>&1 || status=1
  echo "seed$seed: $((SECONDS - begun)) s (limit 60 s)" >> "$OUT/times.txt"
  grep 'lowest %' "$OUT/seed$seed.log"
done
cat "$OUT/times.txt"
exit $status
