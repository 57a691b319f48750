#!/usr/bin/env bash
# Issue #40: cute/hopper's backward with its dK/dV kernel's staged epilogue (BackwardTiles(staged_epilogue=True),
# cute_impl/backward/hopper_epilogue.py: dK and dV by stmatrix into the consumers' K and V boxes, then one TMA
# store per 64 columns, instead of 128 STG.E.U16 per consumer thread at D=128) against each head dim's default,
# in one device call on one H200 (at most about 200 s):
#   1. its GPU tests (4 workers, mostly compiling): the staged candidates against fp64 on ragged, causal (both
#      alignments), GQA/MQA, two-batch and many-block shapes, with a planted dropped box that must fail the rule
#      (tests/test_cute_backward_epilogue.py), and the suite's every-candidate test on them;
#   2. bench.backward --candidates --rung cute at P1 causal, B8 S2048 causal (the two shapes whose ~200 µs gap
#      to FA4's dK/dV kernel is per CTA), P1 and D64 B4 H32: each head dim's default, then its staged candidate,
#      each checked against cuDNN's gradients, beside cuDNN, SDPA flash and FA4 timed alike (rows past the
#      105 s budget are written "skipped", the last named first).
# Run from the project root carrying the CuTe DSL and FA4 (../shared/gpu/README.md):
#   carry   [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"]
#   command bash bench/cute_bwd_epilogue_ab.sh
# Outputs in $OUT: gpu.log, pytest.log, candidates.log, candidates/candidates.csv.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_bwd_epilogue_ab.sh runs/cute_bwd_epilogue_ab
source_carried_activations
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv >> "$OUT/gpu.log" 2>&1
status=0
timeout 80 python3 -m pytest -q -n 4 -m gpu tests/test_cute_backward_epilogue.py tests/test_cute_backward.py \
  -k "test_gpu_staged_epilogue or (every_hopper_candidate and stagedepi)" > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
# Each head dim's default, then its staged candidate (a label a head dim lacks is left out there).
variants=(--variant m64_s2_dqreduce_tmarows_heaviestfirst --variant m128_s2_dqreduce_tmarows
  --variant m64_s2_dqreduce_tmarows_heaviestfirst_stagedepi --variant m128_s2_dqreduce_tmarows_stagedepi)
timeout 115 python3 -m bench.backward --candidates --rung cute --shape "P1 causal" --shape "B8 S2048 causal" \
  --shape P1 --shape "D64 B4 H32" "${variants[@]}" --budget-s 105 --out "$OUT/candidates" \
  > "$OUT/candidates.log" 2>&1 || status=1
grep -v "Warning\|exe_args" "$OUT/candidates.log" | tail -28
exit $status
