#!/usr/bin/env bash
# Issue #37: cute/fp8's non-causal D=64 kernel ran 1.11-1.12x slower with its block scales through 32-bit strides
# (twice, H100, 2026-12-06, results/h100/fp8-scale-index-2026-12-06/), though both builds take 128 registers and the
# same 475-instruction key loop, scheduled differently; so SCALE_INDEX_32BIT is on for the causal mask only. Nsight
# Compute of both builds at the issue's D=64 shape (B=4 H=32 S=8192, non-causal), the 32-bit one by lifting
# SCALE_INDEX_32BIT_CAUSAL_ONLY (bench.ncu_target --set), to find what the census does not see (stall reasons, issue
# slots, the key loop's latency per block). Run from the project root carrying [".gpu/cutlass-dsl.tar.xz",
# ".gpu/activate.sh", ".gpu/fa4"], command `bash bench/fp8_d64_scale_index_ncu.sh` (about 300 s). Outputs in $OUT:
# ncu-fp8d64si-*.tgz (bench/ncu.sh).
set -uo pipefail
NCU_TIMEOUT_S=140 bash "$(dirname "$0")/ncu.sh" fp8d64si "cute/fp8 4 32 8192 64 0" \
  "cute/fp8 4 32 8192 64 0 --set cute_impl.fp8:SCALE_INDEX_32BIT_CAUSAL_ONLY=False"
