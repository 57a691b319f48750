#!/bin/bash
# One device call of a smoke-then-time bench module (bench.gluon_sweep): the smoke in
# 8 processes side by side (this also fills the Triton cache), then the timing in one process.
#   bash bench/smoke_then_bench.sh MODULE ROUNDS [ARGS...]      (project root; $OUT set)
#   e.g. bash bench/smoke_then_bench.sh bench.gluon_sweep 3 --cands sweep-4
# Writes $OUT/<module>-smoke-<triton>.jsonl and $OUT/<module>-bench-<triton>.log.
set -u
module=$1 rounds=$2
shift 2
export PYTHONUNBUFFERED=1
tag=$(python -c 'import triton; print(triton.__version__)')
shards=8
for i in $(seq 0 $((shards - 1))); do
  python -m "$module" smoke "$i" "$shards" "$@" > "/tmp/smoke-$i.log" 2>&1 &
done
wait
grep -h '^{' /tmp/smoke-*.log > "$OUT/$module-smoke-$tag.jsonl"
echo "smoke: $(grep -c '"ok": true' "$OUT/$module-smoke-$tag.jsonl") ok, $(grep -c '"ok": false' "$OUT/$module-smoke-$tag.jsonl") failed"
python -m "$module" bench "$rounds" "$@" 2>&1 | grep '^{' | tee "$OUT/$module-bench-$tag.log"
