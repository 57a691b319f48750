#!/usr/bin/env bash
# The decode rows at this tree in one device call (about 310 s, 100 s more a seed; the limits sum to 490), for issue #38:
#   1. `compare.py --decode` as a user runs it (every default row: the decode and hopper rungs, SDPA, FA4 and
#      FlashInfer, now on the paged row too), the README's decode table ($OUT/decode/);
#   2. the GPU tests of every file that runs triton/decode, gluon/decode or FlashInfer, paged caches included
#      (verbose, $OUT/pytest.log, so a cut run still names what passed);
#   3. with SEEDS (space-separated), `compare.py --decode --decode-random 8 --decode-seed S` per seed, the three decode
#      rungs only: shapes no issue names ($OUT/seedS/, 100 s each; with every rung and baseline, seed 97's run of
#      2026-12-01 finished 3 of its 8 shapes in that time, and FlashInfer JIT-builds each new shape for minutes on a
#      fresh machine).
# Run from the project root after `bash .gpu/flashinfer/stash.sh` in a call just before (the CuTe DSL, FA4 and
# FlashInfer together pass one call's 64 MiB): carry [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4",
# ".gpu/flashinfer/activate.sh"], command `bash bench/decode_refresh.sh`.
# Everything is written under /tmp and packed into $OUT/decode_refresh.tgz (a call brings back at most 8 files).
set -uo pipefail
FINAL=${OUT:-runs/decode_refresh}
OUT=/tmp/decode_refresh
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" decode_refresh.sh "$OUT"
source_carried_activations "$OUT/times.txt"
# shellcheck disable=SC1091
source .gpu/flashinfer/activate.sh >> "$OUT/times.txt" 2>&1 || echo "flashinfer: not activated" >> "$OUT/times.txt"
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$OUT/times.txt" 2>&1
status=0
step() {  # step NAME LIMIT_S COMMAND...: one timed step, its output in $OUT/NAME.log
  local name=$1 limit=$2 begun=$SECONDS
  shift 2
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1 || status=1
  echo "$name: $((SECONDS - begun)) s (limit $limit s)" >> "$OUT/times.txt"
}
step decode 250 python3 compare.py --decode --out "$OUT/decode"
step pytest 240 python3 -m pytest -v -m gpu -n 8 -p no:cacheprovider tests/test_flashinfer_baseline.py \
  tests/test_decode*.py tests/test_gluon_decode*.py tests/test_paged_kv.py tests/test_plan_cache.py \
  tests/test_transformers_adapter.py
for seed in ${SEEDS:-}; do
  step "seed$seed" 100 python3 compare.py --decode --decode-random 8 --decode-seed "$seed" --only triton/decode \
    --only gluon/decode --only cute/decode \
    --out "$OUT/seed$seed"
done
tail -3 "$OUT/pytest.log"
tail -5 "$OUT/decode.log"
cat "$OUT/times.txt"
mkdir -p "$FINAL" && tar czf "$FINAL/decode_refresh.tgz" -C "$OUT" .
exit $status
