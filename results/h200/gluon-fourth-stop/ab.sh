export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
TAG=$(python -c 'import triton; print(triton.__version__)')
for i in 0 1 2 3 4 5; do python .gpu/g4/ab.py smoke $i 6 > /tmp/abs$i.log 2>&1 & done; wait
grep -h "smoke" /tmp/abs?.log | tee $OUT/ab-smoke-$TAG.log
python .gpu/g4/ab.py bench $1 2>&1 | grep '^{' | tee $OUT/ab-$TAG.log
