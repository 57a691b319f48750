#!/usr/bin/env bash
# Issue #37 under Triton 3.9 (what a plain `pip install` brings): the fused quantiser's D=128 default there is
# PIPELINED_CONFIG (PREFETCH_CONFIG, the 3.6 default, spills 88 bytes a thread at its 128-register cap), and the
# 2026-12-01 canonical runs put cute/fp8's causal end to end 54 us longer under 3.9 than under 3.6 at the same kernel
# time. Static (sm_90a, Triton 3.9.0, P1): PIPELINED_CONFIG's 2-stage ring takes 131,072 bytes of shared memory, one
# program an SM (115 KB, two, under 3.6); spill-free alternatives: the register prefetch without the cap (166
# registers, one 8-warp program an SM by registers, 64 KB), K by TMA or through a register ring with V apart (two
# programs an SM), V apart under the uncapped prefetch. Two A/Bs, each candidate judged (against the torch reference
# and the first candidate's bytes), timed in 3 interleaved rounds (L2 flushed, medians), then the FP8 rungs end to
# end with the default and the fastest passing candidate against cute/hopper in the same process:
#   1. --kv-only (cute/fp8's K/V quantiser, its V layout): the 3.9 default first, then the candidates.
#   2. Q, K and V (gluon/fp8's and triton/fp8's quantiser, gluon/fp8's V layout): the same.
# CANDIDATES (';'-separated, bench.fp8_quantiser's --candidates syntax) replaces the list; the first is the baseline.
# Run from the project root under Triton 3.9 (`source .gpu/triton.sh` after the two stash calls of
# ../shared/gpu/README.md) with the CuTe DSL and FA4 carried: `bash bench/fp8_quantiser_39_ab.sh`. About 300 s.
# Outputs in $OUT: times.txt, kv.log, qkv.log, kv/ and qkv/ (fp8_quantiser_ab.{csv,md}).
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" fp8_quantiser_39_ab.sh runs/fp8_quantiser_39_ab
source_carried_activations "$OUT/times.txt"
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$OUT/times.txt" 2>&1
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)" >> "$OUT/times.txt"
status=0
PIPELINED="tiles_per_program=8,num_stages=2"
UNCAPPED="tiles_per_program=8,prefetch=true,maxnreg=none"
LIST="$PIPELINED;tiles_per_program=8,prefetch=true,maxnreg=128;$UNCAPPED;$PIPELINED,tma=true|$PIPELINED"
LIST="$LIST;tiles_per_program=8,num_stages=3,register_operand=true,maxnreg=128|$PIPELINED;$PIPELINED|$UNCAPPED"
CANDIDATES=${CANDIDATES:-$LIST}
for mode in kv qkv; do
  begun=$SECONDS
  flags=(--ab --candidates "$CANDIDATES" --quantiser-rounds 3 --e2e-rounds 3 --warmup-ms 25 --rep-ms 150)
  [ "$mode" = kv ] && flags+=(--kv-only)
  timeout 200 python3 -m bench.fp8_quantiser "${flags[@]}" --out "$OUT/$mode" > "$OUT/$mode.log" 2>&1 || status=1
  echo "$mode: $((SECONDS - begun)) s (limit 200 s)" >> "$OUT/times.txt"
  tail -30 "$OUT/$mode.log"
done
cat "$OUT/times.txt"
exit $status
