#!/usr/bin/env bash
# Issue #37: cute/fp8 at D=128 with its consumers' ping-pong (the candidate default, both masks) against without, in
# one device call (about 5 minutes on an H200; carry [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"]):
#   1. cute/fp8's D=128 GPU tests on the candidate default (tests/test_fp8_rungs.py and tests/test_cute_hopper.py:
#      FP8_RULE on every length class, both alignments, GQA, cache lengths, the LSE, persistent CTAs);
#   2. bench.cute_fp8_pingpong at P1, causal then non-causal, 4 interleaved rounds, kernel only and end to end.
# Predicted from gluon/fp8 (results/h200/gluon-fp8-pingpong-causal/: causal kernel 1.060x as fast): causal kernel
# 1.02-1.06x, end to end the same microseconds; non-causal level or up to 2.4 % slower (its last A/B, before Q was
# quantised in the kernel). Take-rule: the tests pass, O bit-equal, and a mask takes ping-pong where its kernel median
# is faster by more than the smaller setting's spread.
# Run 2026-12-04 (results/h200/cute-fp8-pingpong/; H200, Triton 3.6): 114 tests passed, refuted: with ping-pong the
# causal kernel took 726.0 against 676.6 us (0.93x as fast), non-causal 1458.9 against 1335.0 (0.92x); the default
# keeps it off (so "the candidate default" above is what the run tested, since reverted).
# Run from the project root: `bash bench/cute_fp8_pingpong_ab.sh`. Outputs in $OUT: gpu.log, pytest.log, ab.log,
# ab/cute_fp8_pingpong.{csv,md}.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_fp8_pingpong_ab.sh runs/cute_fp8_pingpong_ab
source_carried_activations
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >> "$OUT/gpu.log" 2>&1
status=0
timeout 240 python3 -m pytest -q -m gpu -n 6 -p no:cacheprovider tests/test_fp8_rungs.py tests/test_cute_hopper.py \
  -k "(cute and fp8 or fp8_operands) and not 64" > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
timeout 200 python3 -m bench.cute_fp8_pingpong --rounds 4 --out "$OUT/ab" > "$OUT/ab.log" 2>&1 || status=1
tail -24 "$OUT/ab.log"
exit $status
