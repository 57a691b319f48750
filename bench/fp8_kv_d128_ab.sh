#!/usr/bin/env bash
# Issue #37 at D=128 (P1: B=2 H=16 Hkv=16 S=8192 bf16, block+rotation): the K/V quantiser cute/fp8 runs before its
# kernel, split in two launches as D=64's is (bench.fp8_quantiser's KV_D128_CANDIDATES: V apart; V apart with V's L2
# prefetch; K by a 2-stage TMA ring with V apart; K by a 3-stage cp.async ring read into registers for the rotation's
# wgmma, V apart), against the K/V default (one launch, register prefetch), in one device call of about 2.5 minutes
# on an H200 (Triton 3.6):
#   1. the candidates' GPU byte tests (tests/test_fp8_quantiser_value_launch.py): K's and V's bytes and scales equal
#      to the K/V default's into poisoned buffers, at P1 and a ragged GQA shape;
#   2. bench.fp8_quantiser --ab --kv-only --candidates kv-d128: each candidate judged (against the torch reference
#      and the default's bytes), timed in 3 interleaved rounds (L2 flushed, medians) against the read bandwidth
#      measured in the run; then cute/fp8 kernel only, its K/V quantiser alone and end to end, causal first, then
#      not, with the default and the fastest passing candidate, 3 interleaved rounds, beside cute/hopper (bf16).
# Run from the project root: `bash bench/fp8_kv_d128_ab.sh` (carry .gpu/cutlass-dsl.tar.xz, .gpu/activate.sh and
# .gpu/fa4 for the CuTe DSL and TVM-FFI). Outputs in $OUT: gpu.log, pytest.log, ab.log, ab/fp8_quantiser_ab.{csv,md}.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" fp8_kv_d128_ab.sh runs/fp8_kv_d128_ab
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$OUT/gpu.log" 2>&1
source_carried_activations
status=0
timeout 60 python3 -m pytest -q -m gpu -n 3 -p no:cacheprovider tests/test_fp8_quantiser_value_launch.py \
  -k "test_gpu_the_d128_kv_candidates" > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
timeout 130 python3 -m bench.fp8_quantiser --ab --kv-only --candidates kv-d128 --quantiser-rounds 3 --e2e-rounds 3 \
  --warmup-ms 25 --rep-ms 150 --out "$OUT/ab" > "$OUT/ab.log" 2>&1 || status=1
tail -40 "$OUT/ab.log"
exit $status
