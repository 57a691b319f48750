#!/usr/bin/env bash
# Issue #37's block-scale addressing in one device call: cute/fp8's SCALE_INDEX_32BIT (off, untimed) reads K's and V's
# block scales through 32-bit strides, where with 64-bit ones ptxas recomputes both addresses from the batch and head
# strides every key block of the causal loop (Nsight Compute, results/h100/cute-decode-two-wg-left-2026-12-06/ncu/).
# sm_90a: the causal key step 504 -> 486 instructions at D=64, 575 -> 557 at D=128; non-causal 475 and 549 -> 546.
# Predicted (not measured): causal kernels 0.97-0.99x the time at both head dims (the step is issue-bound at D=128:
# about 1150 issue slots an SM sub-partition a block pair against 1024 tensor cycles), non-causal 0.99-1.00x. Causal
# P1 end to end 1.072x cute/hopper's kernel (H100, 2026-12-06) would then read 1.09-1.10x.
# This call: the knob's GPU tests (O and the LSE bit for bit the 64-bit kernel's on ragged GQA shapes with cache
# lengths, both masks, D=64 and 128; a planted V scale one block off fails), then `bench.fp8_scale_index` at P1 and
# at D=64 (B=4 H=32), 3 rounds each. About 330 s.
# Run from the project root, carrying [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command
# `bash bench/fp8_scale_index_ab.sh`. Outputs in $OUT: gpu.log, times.txt, pytest.log, ab.log, ab/, ab64.log, ab64/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" fp8_scale_index_ab.sh runs/fp8_scale_index_ab
source_carried_activations
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >> "$OUT/gpu.log" 2>&1
status=0
gpu_tests 120 -n 4 tests/test_cute_fp8_scale_index.py
timeout 100 python3 -m bench.fp8_scale_index --rounds 3 --out "$OUT/ab" > "$OUT/ab.log" 2>&1 || status=1
tail -14 "$OUT/ab.log"
timeout 100 python3 -m bench.fp8_scale_index --head-dim 64 --batch 4 --rounds 3 --out "$OUT/ab64" \
  > "$OUT/ab64.log" 2>&1 || status=1
tail -14 "$OUT/ab64.log"
exit $status
