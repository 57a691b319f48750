#!/usr/bin/env bash
# Issue #40: the Triton backward at D=256 (triton_impl/backward/naive.py's 16 × 16 tiles, tiled.py's 64-key
# candidates, compiled without spills but never run on a GPU), in one device call on one H200 (about 190 s):
#   1. GPU tests (6 workers, 110 s): every forward whose backward is a Triton rung (triton/naive, tiled, pipelined,
#      hopper), bf16 and fp16, at D=256 against fp64 on ragged, causal (both alignments, Sq > Sk) and GQA/MQA
#      shapes (tests/test_backward_d256.py), and every D=256 candidate of the tiled rung
#      (tests/test_backward.py's test_gpu_every_candidate_passes_the_rule);
#   2. bench.backward --candidates (75 s): the D=256 candidates at B=2 H=16 S=4096, non-causal and causal, each
#      checked against cuDNN's gradients, beside cuDNN, SDPA flash and FA4 (where carried) timed alike. D=256's
#      default (its first candidate) is static reasoning; the fastest correct variant is the one to make it.
# Four files come back: gpu.log, pytest.log, d256.log, d256/candidates.csv; the table last.
# Run from the project root (FA4's rows need it carried, ../shared/gpu/README.md; without it they are skipped):
#   carry   [".gpu/fa4"]
#   command bash bench/triton_bwd_d256_ab.sh
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" triton_bwd_d256_ab.sh runs/triton_bwd_d256_ab
source_carried_activations
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv >> "$OUT/gpu.log" 2>&1
python3 -c "import triton; print('triton', triton.__version__)" >> "$OUT/gpu.log" 2>&1
status=0
timeout 110 python3 -m pytest -q -n 6 -m gpu tests/test_backward_d256.py tests/test_backward.py \
  -k "test_gpu_d256 or (test_gpu_every_candidate and d256)" > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
timeout 80 python3 -m bench.backward --candidates --shape "D256 B2 H16 S4096" --shape "D256 B2 H16 S4096 causal" \
  --budget-s 70 --out "$OUT/d256" > "$OUT/d256.log" 2>&1 || status=1
grep -A9 "backward TFLOP/s" "$OUT/d256.log"
exit $status
