#!/bin/bash
# compare.py at D=64 (B=4 H=32 S=8192) over the Hopper rungs, FP8 rungs, cuDNN and FA4: one device call.
#   bash bench/d64_compare.sh LABEL      (project root; $OUT set; writes $OUT/LABEL.tgz with run/ and compare.log)
# Produced results/h200/d64-b4-h32-fourth-stop/ (one LABEL per Triton release and commit).
export PYTHONUNBUFFERED=1
res=/tmp/res/$1
rm -rf "$res"
mkdir -p "$res"
timeout 280 python3 compare.py --seqlen 8192 --head-dim 64 --batch 4 --heads 32 --only triton/pipelined \
  --only triton/hopper --only 'gluon/*' --only cute/pipelined --only cute/hopper --only '*/fp8' --only sdpa/cudnn \
  --only 'fa4/*' --no-static --rep 300 --warmup 60 --out "$res/run" > "$res/compare.log" 2>&1
echo "compare rc $?" >> "$res/compare.log"
grep -E "│ (triton|gluon|cute|sdpa/cudnn|fa4)" "$res/compare.log" | cut -c1-110
tail -1 "$res/compare.log"
tar czf "$OUT/$1.tgz" -C /tmp/res "$1"
