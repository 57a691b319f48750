#!/usr/bin/env bash
# Issue #40: cute/hopper's D=64 backward with both knobs, late_dv and rebased_operands (m128_..._latedv_rebase),
# against D=64's default (late_dv alone) and the rebase alone, in one device call on one H200 (about 130 s). The
# two knobs were timed apart (results/h200/backward-late-dv-rebase/: at D=64 B=4 H=32, late_dv 502.6 → 509.8 and
# the rebase 511.4 → 519.3 TFLOP/s, each against the staged base in its own process), never together:
#   1. GPU tests (6 workers, 60 s): the combined candidate against fp64 on ragged, causal (both alignments),
#      GQA/MQA, one-query, two-batch and many-block shapes with a planted lost dV box (tests/test_cute_backward_desc.py);
#   2. bench.backward --candidates --rung cute (60 s): D64 B4 H32 with the default, the combined candidate and the
#      rebase alone, each checked against cuDNN's gradients, beside cuDNN, SDPA flash and FA4 timed alike.
# Four files come back (a device call returns 8): gpu.log, pytest.log, d64.log, d64/candidates.csv; the table last.
# Run from the project root carrying the CuTe DSL and FA4 (../shared/gpu/README.md):
#   carry   [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"]
#   command bash bench/cute_bwd_d64_ab.sh
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_bwd_d64_ab.sh runs/cute_bwd_d64_ab
source_carried_activations
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv >> "$OUT/gpu.log" 2>&1
status=0
timeout 60 python3 -m pytest -q -n 6 -m gpu tests/test_cute_backward_desc.py \
  -k "test_gpu_rebased and m128 and latedv" > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
timeout 70 python3 -m bench.backward --candidates --rung cute --shape "D64 B4 H32" \
  --variant m128_s2_dqreduce_tmarows_stagedepi_latedv --variant m128_s2_dqreduce_tmarows_stagedepi_latedv_rebase \
  --variant m128_s2_dqreduce_tmarows_stagedepi_rebase --budget-s 60 --out "$OUT/d64" > "$OUT/d64.log" 2>&1 || status=1
grep -A8 "backward TFLOP/s" "$OUT/d64.log"
exit $status
