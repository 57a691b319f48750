#!/usr/bin/env bash
# Issue #37: cute/fp8 with its Q quantised lean (cute_impl.fp8.LEAN_Q_QUANTISATION, the default since this A/B's
# run of 2026-12-02, results/h200/fp8-lean-q/: the amax before the rotation's x c, the e4m3 Q box written by stmatrix
# from a rotation with reordered columns; ~160 fewer instructions a consumer thread and tile) against the full one,
# in one device call (about 4 minutes on an H200; carry [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"]:
# fa4 carries the TVM-FFI the CuTe rungs need):
#   1. the knob's 7 GPU tests (tests/test_fp8_rungs.py -k lean_q): kernel only by FP8_RULE against the emulation on a
#      P1-like shape (512 tiles: every persistent CTA requantises several Q boxes) and a ragged GQA one, every mask,
#      Q's scales and O equal to the full quantisation's bit for bit, kernel only and end to end; a planted rotation
#      in the default column order fails the rule;
#   2. bench.fp8_tile_work at P1 (B=2 H=16 S=8192 D=128 bf16), causal then non-causal, one process, 3 interleaved
#      rounds, each setting's O checked equal to the full Q's before it is timed: cute/hopper (bf16), cute/fp8
#      kernel only and end to end per setting, the K/V quantiser alone.
# Predicts (docs/perf-log.md, helper `f8t`): causal kernel -2 to -6 us (695 -> 689-693, best guess -3 us, -0.4 %),
# end to end the same us (760 -> 754-758, 1.07-1.08x cute/hopper: not the issue's 1.1x); non-causal -1.5 to -6 us.
# That is below what 3 rounds resolve (kernel spreads of 5-10 us): read the run as "O bit-equal, no loss" unless it
# moves more than its own spread.
# Run from the project root: `bash bench/fp8_tile_work_ab.sh`. Outputs in $OUT: gpu.log, pytest.log, ab.log,
# ab/fp8_tile_work.{csv,md}.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" fp8_tile_work_ab.sh runs/fp8_tile_work_ab
source_carried_activations
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >> "$OUT/gpu.log" 2>&1
status=0
timeout 180 python3 -m pytest -q -m gpu -n 4 -p no:cacheprovider tests/test_fp8_rungs.py -k lean_q \
  > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
timeout 150 python3 -m bench.fp8_tile_work --rounds 3 --out "$OUT/ab" > "$OUT/ab.log" 2>&1 || status=1
tail -24 "$OUT/ab.log"
exit $status
