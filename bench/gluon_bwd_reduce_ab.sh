#!/usr/bin/env bash
# gluon/hopper's backward with dQ made in the dK/dV kernel and added by TMA bulk reduce-adds into a transposed
# fp32 accumulator (BackwardTiles(dq="reduce"), off by default, D=128 only; triton_impl/gluon/backward_dq.py;
# issue #40), now also with the overlapped steps (the previous step's dK and dQᵀ products under this step's
# exp2: "dq reduce overlap tma_rows"), in one device call (at most about 200 s on an H200):
#   1. its GPU tests (8 workers, at most 80 s, mostly compiling): the three reduce variants against fp64 on the
#      shapes that probe the accumulator (Sq not a multiple of four, query tails inside a block, rows that see
#      no key, one query or key, MQA, GQA, causal bottom-right and not) with a planted unzeroed accumulator
#      that must fail (tests/test_gluon_backward_dq.py), and on tests/test_backward.py's ragged GQA causal
#      shapes (test_gpu_every_candidate_passes_the_rule -k "dq reduce");
#   2. bench.backward --candidates --rung gluon at P1, P1 causal and D64 B4 H32, one process, each variant's
#      gradients first checked against cuDNN's: the default (D=128: dkdv 128x32 s3 overlapped with tma_rows
#      and the dQ pass), the plain steps with the dQ pass (the plain reduce variant's own baseline), dq reduce
#      with tma_rows on the plain steps (measured: 450.2 / 428.8 against the default's 466.5 / 443.3) and on
#      the overlapped ones, beside cuDNN, SDPA flash and FA4 (fa4/sm90) timed alike. At D=64 the reduce
#      variants do not exist: the default and the baselines only. Rows past the 100 s budget are written
#      "skipped", the last named first; without flash_attn.cute the FA4 rows read "failed".
# Run from the project root: command `bash bench/gluon_bwd_reduce_ab.sh` (FA4 carried by the call if wanted).
# Outputs in $OUT: gpu.log, pytest.log, candidates.log, candidates/candidates.csv.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" gluon_bwd_reduce_ab.sh runs/gluon_bwd_reduce_ab
export PYTHONPATH="${PYTHONPATH:-$PWD}"
{
  nvidia-smi --query-gpu=name,memory.total --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} > "$OUT/gpu.log" 2>&1
status=0
timeout 80 python3 -m pytest -q -n 8 -m gpu tests/test_gluon_backward_dq.py tests/test_backward.py \
  -k "reduce or unzeroed" > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
variants=(
  --variant default
  --variant "dkdv 128x32 s3, dq 128x64 s3 tma_rows"
  --variant "dkdv 128x32 s3, dq reduce tma_rows"
  --variant "dkdv 128x32 s3, dq reduce overlap tma_rows"
)
timeout 110 python3 -m bench.backward --candidates --rung gluon --shape P1 --shape "P1 causal" --shape "D64 B4 H32" \
  "${variants[@]}" --budget-s 100 --out "$OUT/candidates" > "$OUT/candidates.log" 2>&1 || status=1
tail -30 "$OUT/candidates.log"
exit $status
