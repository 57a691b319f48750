#!/usr/bin/env bash
# Issue #37: cute/fp8 with Q quantised in its kernel (cute_impl.fp8.QUANTISE_Q_IN_KERNEL, on by default at
# D=128 since this A/B) against the quantiser's Q, in one device call (about 6 minutes on an H200):
#   1. the knob's GPU tests (24 with D=64's; FP8 rule against the emulation of the full quantiser's operands on a
#      P1-like shape and ragged GQA shapes, full / causal top-left / causal bottom-right, end to end equal to kernel
#      only; apart, the kernel's Q scales and O equal to the default path's bit for bit (the reciprocal division's
#      quotient is the quantiser's); the rotation issued ahead gives the same O; a wrong rotation fails the rule).
#      The GQA shapes draw K and V at their KV heads (before commit 841dd34 fa3_inputs gave them Q's heads, and the
#      reference judged another problem than the kernel ran);
#   2. bench.fp8_q_in_kernel at P1, non-causal and causal, one process, 3 interleaved rounds: cute/hopper (bf16),
#      cute/fp8 kernel only, end to end and its quantiser alone, knob off, on, on with the next tile's rotation
#      issued ahead (rotate_ahead), and on with ping-pong;
#   3. (2026-12-05, not yet run) the same at D=64 (B=4 H=32 S=8192, the issue's D=64 shape), where the default leaves
#      Q to the quantiser (QUANTISE_Q_HEAD_DIMS); step 1 now holds the D=64 rule tests too. Its builds compile
#      without spills on sm_90a (plain, ahead, ping-pong; 8 bytes of stack causal ahead and ping-pong). Prediction:
#      at D=64 the kernel is half P1's FLOPs a byte, so Q's quantiser pass is a larger share of end to end: 2-5 %
#      faster end to end, kernel level or up to 3 % slower (its tile's quantisation leaves the tensor cores idle).
# Run from the project root: `bash bench/fp8_q_in_kernel_ab.sh` (cute/* needs the CuTe DSL and TVM-FFI, as for the
# other CuTe runs). Outputs in $OUT: gpu.log, pytest.log, ab.log, ab/fp8_q_in_kernel.{csv,md}, ab64.log and
# ab64/fp8_q_in_kernel.{csv,md}.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" fp8_q_in_kernel_ab.sh runs/fp8_q_in_kernel_ab
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$OUT/gpu.log" 2>&1
source_carried_activations
export PYTHONPATH="${PYTHONPATH:-$PWD}"
status=0
timeout 150 python3 -m pytest -q -m gpu -n 6 -p no:cacheprovider tests/test_fp8_rungs.py -k q_in_kernel \
  > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
timeout 95 python3 -m bench.fp8_q_in_kernel --rounds 3 --out "$OUT/ab" > "$OUT/ab.log" 2>&1 || status=1
tail -30 "$OUT/ab.log"
timeout 120 python3 -m bench.fp8_q_in_kernel --head-dim 64 --batch 4 --rounds 3 --out "$OUT/ab64" \
  > "$OUT/ab64.log" 2>&1 || status=1
tail -30 "$OUT/ab64.log"
exit $status
