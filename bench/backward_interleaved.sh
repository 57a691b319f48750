#!/usr/bin/env bash
# Issue #40's ratios against FA4 without bench.backward's fixed order (its rows one after another, the ladder last,
# after SDPA flash's heaviest backwards: a heated GPU's lower clock charged to the last rows; 2026-12-04,
# results/h200/backward-kernels-flushed-2026-12-04/), in one device call (about 4 minutes on an H200; carry
# [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"]): bench.backward_interleaved at the four anchors, FA4
# first in the list (the reference), then cute/hopper, gluon/hopper and SDPA cuDNN, 4 rounds, the order reversed every
# other round. Predicted from the flushed profile: cute/hopper 0.98-1.00x FA4 at B8 S2048 causal and 1.00-1.06x at
# D64 B4 H32 (bench.backward read 0.966x and 0.96x), P1 causal near 1.0x; gluon/hopper as bench.backward read it
# (0.74-0.84x) give or take the same bias.
# Run from the project root: `bash bench/backward_interleaved.sh`. Outputs in $OUT: gpu.log, interleaved.log,
# interleaved/backward_interleaved.csv.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" backward_interleaved.sh runs/backward_interleaved
source_carried_activations
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >> "$OUT/gpu.log" 2>&1
status=0
timeout 420 python3 -m bench.backward_interleaved --impl fa4/sm90 --impl cute/hopper --impl gluon/hopper \
  --impl sdpa/cudnn --shape 'B8 S2048 causal' --shape 'D64 B4 H32' --shape 'P1 causal' --shape P1 --rounds 4 \
  --out "$OUT/interleaved" > "$OUT/interleaved.log" 2>&1 || status=1
grep -v "Warning\|exe_args" "$OUT/interleaved.log" | tail -20
exit $status
