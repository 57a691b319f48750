#!/bin/bash
# The installed Triton's PTX assembled by its own ptxas against another ptxas (e.g. CUDA 13.4's, the one
# Triton 3.9 uses for sm_90), processes alternating A B A B: gluon/fp8 and gluon/hopper at P1 through
# bench.gluon_sweep (3 rounds each). One device call:
#   bash bench/ptxas_ab.sh /path/to/other/ptxas      (project root; $OUT set; writes $OUT/ptxas-ab.log)
# Produced results/h200/gluon-fourth-stop/ptxas-ab-triton-3.6.log.
export PYTHONUNBUFFERED=1
other=$1
"$other" --version | tail -1
for round in 1 2; do
  for which in own other; do
    if [[ $which == other ]]; then export TRITON_PTXAS_PATH=$other; else unset TRITON_PTXAS_PATH; fi
    python -m bench.gluon_sweep bench 3 "fp8 P1 128,2,pp|fp8 P1 128,3,pp|hopper P1 128,2 (|hopper P1 128,2,pp" 2>&1 \
      | grep '^{' | sed "s/^{/{\"ptxas\": \"$which\", \"pass\": $round, /" | tee -a "$OUT/ptxas-ab.log"
  done
done
