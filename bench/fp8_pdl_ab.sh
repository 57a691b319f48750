#!/usr/bin/env bash
# Issue #37: cute/fp8 end to end with programmatic dependent launch (cute_impl.fp8.PROGRAMMATIC_LAUNCH, off by
# default) against without, in one device call (about 2.5 minutes on an H200):
#   1. the knob's 6 GPU tests (tests/test_fp8_pdl.py -m gpu): end to end with PDL equal to kernel only bit for bit,
#      K's and V's e4m3 buffers and scales poisoned before every call, on a P1-like shape and a ragged GQA one, full /
#      causal top-left / causal bottom-right (the GPU planted bug, the kernel without its waits, raced only
#      sometimes and was dropped: the waits' placement is checked in the PTX on the CPU);
#   2. bench.fp8_pdl at P1 (B=2 H=16 S=8192 D=128 bf16), causal then non-causal, one process, 3 interleaved rounds:
#      cute/hopper (bf16), cute/fp8 kernel only, its K/V quantiser alone, end to end with PDL off and on, with
#      gap = e2e - kernel - quantiser and the two end-to-end outputs compared.
# Run from the project root: `bash bench/fp8_pdl_ab.sh` (cute/* needs the CuTe DSL and TVM-FFI, as for the other
# CuTe runs). Outputs in $OUT: gpu.log, pytest.log, ab.log, ab/fp8_pdl.{csv,md}.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" fp8_pdl_ab.sh runs/fp8_pdl_ab
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$OUT/gpu.log" 2>&1
status=0
timeout 75 python3 -m pytest -q -m gpu -n 7 -p no:cacheprovider tests/test_fp8_pdl.py > "$OUT/pytest.log" 2>&1 \
  || status=1
tail -3 "$OUT/pytest.log"
timeout 110 python3 -m bench.fp8_pdl --rounds 3 --out "$OUT/ab" > "$OUT/ab.log" 2>&1 || status=1
tail -16 "$OUT/ab.log"
exit $status
