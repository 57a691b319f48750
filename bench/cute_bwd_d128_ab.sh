#!/usr/bin/env bash
# cute/hopper's backward at D=128 with FlashAttention-4's non-causal step of 80 query rows (candidate
# m80_s2_dqreduce_tmarows, not the default; issue #40): dQ computed transposed per warpgroup (dQᵀ = Kᵀ dSᵀ,
# cute_impl/backward/hopper_dq.py), LSE₂ seeded into Sᵀ's accumulator and dSᵀ from the 16-bit Pᵀ
# (cute_impl/backward/hopper_rows.py: what keeps ptxas from serialising the wgmmas at 80 rows), 227 KB of
# shared memory. On a GPU for the first time, in one device call (about 3 minutes on an H200):
#   1. its GPU tests (4 workers, mostly compiling): against fp64 on the ragged GQA/MQA causal shapes of the
#      candidate and tma_rows tests, and at 1999-2100 keys and queries (full, causal top-left, causal
#      bottom-right ragged; GQA) with a planted dQ-half mix-up that must fail the rule;
#   2. bench.backward --candidates --rung cute at P1 and P1 causal (B=2 H=16 S=8192 D=128), one process:
#      the default (m64_s2_dqreduce_tmarows), then m80_s2_dqreduce_tmarows, beside cuDNN, SDPA flash and FA4
#      (fa4/sm90) timed alike (rows past the 100 s budget are written "skipped", the last named first).
# Run from the project root carrying the CuTe DSL and FA4 (../shared/gpu/README.md):
#   carry   [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"]
#   command bash bench/cute_bwd_d128_ab.sh
# Outputs in $OUT: gpu.log, pytest.log, candidates.log, candidates/candidates.csv.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_bwd_d128_ab.sh runs/cute_bwd_d128_ab
source_carried_activations
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv >> "$OUT/gpu.log" 2>&1
status=0
timeout 85 python3 -m pytest -q -n 4 -m gpu tests/test_cute_backward.py -k "m80 or 80_rows" > "$OUT/pytest.log" 2>&1 \
  || status=1
tail -3 "$OUT/pytest.log"
variants=(--variant m64_s2_dqreduce_tmarows --variant m80_s2_dqreduce_tmarows)
timeout 110 python3 -m bench.backward --candidates --rung cute --shape P1 --shape "P1 causal" "${variants[@]}" \
  --budget-s 100 --out "$OUT/candidates" > "$OUT/candidates.log" 2>&1 || status=1
tail -16 "$OUT/candidates.log"
exit $status
