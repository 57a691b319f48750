#!/usr/bin/env bash
# Issue #37: triton/fp8 with Q quantised in its kernel (triton_impl.fp8.QUANTISE_Q_IN_KERNEL) against the fused
# quantiser's Q, in one device call (about 4 minutes on an H200; Triton only, nothing carried):
#   1. the knob's GPU tests (tests/test_triton_fp8_q_in_kernel.py: FP8_RULE on a P1-like and ragged GQA shapes in every
#      mask, end to end equal to kernel only, Q's bytes and scales and O equal to the quantiser's path; a planted wrong
#      rotation failing the rule), then triton/fp8's GPU tests of tests/test_fp8_rungs.py with the knob on (every
#      variant, head dim, mask and the edge lengths: where the knob does not apply, the quantiser's Q as before);
#   2. bench.triton_fp8_q_in_kernel at P1, causal then non-causal, one process, 4 interleaved rounds: off, on, and on
#      with the sign matrix copied by TMA (ROTATION_BY_TMA).
# Predicted: the quantiser's Q share (a third of its bytes, ~35 us of ~110 at P1) leaves the end to end, and the kernel
# pays its Q tile's rotation and division (~1-3 % of the causal kernel): causal end to end 906 -> ~880 us, e2e / kernel
# 0.876 -> ~0.90; non-causal the same microseconds. Measured (first call, 2026-12-04): the quantiser 111.9 -> 74.0 us,
# but the kernel 796.8 -> 830.0 (+33 us causal, +38 non-causal): end to end level. The second call adds the TMA copy
# of the sign matrix (each of 4096 CTAs loaded its 32 KB into registers and stored it to shared memory: ~480 SASS
# fewer a CTA); predicted: the kernel's extra halved at best (+15-25 us), end to end -10 to -20 us.
# Run from the project root: `bash bench/triton_fp8_q_in_kernel_ab.sh`. Outputs in $OUT: gpu.log, pytest.log,
# pytest-rungs.log, ab.log, ab/triton_fp8_q_in_kernel.{csv,md}.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" triton_fp8_q_in_kernel_ab.sh runs/triton_fp8_q_in_kernel_ab
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$OUT/gpu.log" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.log"
status=0
timeout 120 python3 -m pytest -q -m gpu -n 4 -p no:cacheprovider tests/test_triton_fp8_q_in_kernel.py \
  > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
timeout 260 python3 -c "
import sys, pytest
from triton_impl import fp8
fp8.QUANTISE_Q_IN_KERNEL = True
sys.exit(pytest.main(['-q', '-m', 'gpu', '-p', 'no:cacheprovider', 'tests/test_fp8_rungs.py', '-k', 'triton_impl.fp8 and not gluon']))
" > "$OUT/pytest-rungs.log" 2>&1 || status=1
tail -3 "$OUT/pytest-rungs.log"
timeout 200 python3 -m bench.triton_fp8_q_in_kernel --rounds 4 --out "$OUT/ab" > "$OUT/ab.log" 2>&1 || status=1
tail -16 "$OUT/ab.log"
exit $status
