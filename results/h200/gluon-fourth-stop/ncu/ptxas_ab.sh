# Triton 3.6 with its own ptxas (CUDA 12.8) against the same PTX assembled by CUDA 13.4's (the one Triton 3.9 uses
# for sm_90): gluon/fp8 and gluon/hopper at P1, alternating processes A B A B. Usage: bash .gpu/n20/ptxas_ab.sh
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
xz -dc .gpu/ptxas-blackwell.xz > /tmp/ptxas134 && chmod +x /tmp/ptxas134 && /tmp/ptxas134 --version | tail -1
for round in 1 2; do
  for which in own 134; do
    if [[ $which == 134 ]]; then export TRITON_PTXAS_PATH=/tmp/ptxas134; else unset TRITON_PTXAS_PATH; fi
    python .gpu/g4/sweep.py bench 3 "fp8 P1 128,2,pp|fp8 P1 128,3,pp|hopper P1 128,2 (|hopper P1 128,2,pp" 2>&1 | grep '^{' | sed "s/^{/{\"ptxas\": \"$which\", \"pass\": $round, /" | tee -a $OUT/ptxas-ab.log
  done
done
