#!/usr/bin/env bash
# cute/hopper's backward with dQ computed in the dK/dV kernel (dq="reduce", the default since the fifth
# stop) at 128 query rows per step, FlashAttention-3's D=64 tile (candidate m128_s2_dqreduce_tmarows, not
# the default; cute_impl/backward/hopper_dq.py; issue #40), on a GPU for the first time, in one device
# call (about 3 minutes on an H200):
#   1. its GPU tests (4 workers, mostly compiling): against fp64 on the ragged GQA/MQA causal shapes of
#      the candidate and tma_rows tests, and at 2048-2100 keys (full, causal top-left, causal
#      bottom-right ragged; GQA) with a planted dQ-box mix-up that must fail the rule;
#   2. bench.backward --candidates --rung cute at D64 B4 H32 (the only anchor at D=64: the variant does
#      not exist at D=128), one process: the default (m64_s3_dqreduce_dkdvoverlap_tmarows), then
#      m128_s2_dqreduce_tmarows, then the 64-row step without the overlap (m64_s2_dqreduce_tmarows, the
#      same two ring slots as the new one), beside cuDNN, SDPA flash and FA4 (fa4/sm90) timed alike (rows
#      past the 100 s budget are written "skipped", the last named first).
# Run from the project root: command `bash bench/cute_bwd_fused_dq_ab.sh`; needs the CuTe DSL and FA4
# (flash_attn.cute) carried by the call.
# Outputs in $OUT: gpu.log, pytest.log, candidates.log, candidates/candidates.csv.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_bwd_fused_dq_ab.sh runs/cute_bwd_fused_dq_ab
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.log" 2>&1
status=0
timeout 70 python3 -m pytest -q -n 4 -m gpu tests/test_cute_backward.py -k "m128 or 128_rows" > "$OUT/pytest.log" 2>&1 \
  || status=1
tail -3 "$OUT/pytest.log"
variants=(--variant m64_s3_dqreduce_dkdvoverlap_tmarows --variant m128_s2_dqreduce_tmarows
  --variant m64_s2_dqreduce_tmarows)
timeout 110 python3 -m bench.backward --candidates --rung cute --shape "D64 B4 H32" "${variants[@]}" --budget-s 100 \
  --out "$OUT/candidates" > "$OUT/candidates.log" 2>&1 || status=1
tail -12 "$OUT/candidates.log"
exit $status
