#!/usr/bin/env bash
# Issue #37 at D=64 (B=4 H=32 S=8192 bf16): the K/V quantiser cute/fp8 runs before its kernel, with V in a launch of
# its own, against the default (one launch, 2-stage cp.async ring), and what each leaves of cute/fp8 end to end, in
# one device call of about 3 minutes on an H200 (Triton 3.6):
#   bench.fp8_quantiser --ab --kv-only --e2e-each: the default; V at twice the warps under 64 registers (129.1 against
#   164.2 µs in the seventh stop; its V binary spills); the same under 72 (spill-free under 3.6, three programs an
#   SM); V at the default's warps with the register prefetch under 128 (spill-free under 3.6, four). Each judged on
#   K's and V's bytes against the default's, timed in 3 rounds, then cute/fp8 end to end with each, causal and not,
#   against cute/hopper (bf16) in the same process, 2 rounds.
# Run from the project root: `bash bench/fp8_d64_kv_ab.sh` (the CuTe DSL carried). Outputs in $OUT: gpu.log, ab.log,
# ab/fp8_quantiser_ab.{csv,md}.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" fp8_d64_kv_ab.sh runs/fp8_d64_kv_ab
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$OUT/gpu.log" 2>&1
source_carried_activations
default="tiles_per_program=8,num_stages=2"
twice="tiles_per_program=8,prefetch=true,num_warps=8"
prefetch="tiles_per_program=8,prefetch=true,maxnreg=128"
candidates="$default;$default|$twice,maxnreg=64;$default|$twice,maxnreg=72;$default|$prefetch"
timeout 240 python3 -m bench.fp8_quantiser --ab --kv-only --e2e-each --head-dim 64 --batch 4 --heads 32 \
  --candidates "$candidates" --quantiser-rounds 3 --e2e-rounds 2 --warmup-ms 25 --rep-ms 150 --out "$OUT/ab" \
  > "$OUT/ab.log" 2>&1
status=$?
tail -30 "$OUT/ab.log"
exit $status
