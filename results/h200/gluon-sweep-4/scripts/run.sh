# usage: bash .gpu/g4/run.sh ROUNDS  (from repo root; Triton as the environment provides)
set -u
TAG=$(python -c 'import triton; print(triton.__version__)')
N=8
for i in $(seq 0 $((N-1))); do python .gpu/g4/sweep.py smoke $i $N > $OUT/g4-smoke-$TAG-$i.log 2>&1 & done
wait
cat $OUT/g4-smoke-$TAG-*.log | grep '^{' > $OUT/g4-smoke-$TAG.jsonl; rm -f $OUT/g4-smoke-$TAG-*.log
echo "smoke results: $(grep -c '"ok": true' $OUT/g4-smoke-$TAG.jsonl) ok, $(grep -c '"ok": false' $OUT/g4-smoke-$TAG.jsonl) failed"
python .gpu/g4/sweep.py bench $1 2>&1 | grep -v nanobind | tee $OUT/g4-bench-$TAG.log
