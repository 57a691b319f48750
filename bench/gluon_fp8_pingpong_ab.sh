#!/usr/bin/env bash
# Issue #37: gluon/fp8's causal D=128 default with its consumers' ping-pong on, in one device call (about 3 minutes on
# an H200; Triton only, nothing carried). Found by the persistent diagnostic (results/h200/gluon-persistent/diag/,
# 2026-12-04): one CTA a tile, P1 causal 729.4 -> 690.6 us (754 -> 796 TFLOP/s), O bit-equal. Before running, set the
# causal D=128 entry of triton_impl/gluon/fp8.DEFAULT_CONFIGS to pingpong=True (and, under Triton 3.9, where that
# build with every feature keeps 8 bytes of stack, a common/toolchain/releases.py override keeping it off), so that
#   1. gluon/fp8's causal GPU tests (59, tests/test_fp8_rungs.py and tests/test_gluon.py -k "fp8 and causal and
#      gluon": FP8_RULE on every length class, both alignments, GQA, cache lengths, the LSE, the D=64 candidates) run
#      the new default;
#   2. bench.gluon_fp8_pingpong at P1, causal then non-causal, 4 interleaved rounds, kernel only and end to end, times
#      ping-pong off against on (O checked bit-equal first).
# Predicted: causal kernel 0.94-0.96x the time, end to end the same microseconds; non-causal (on already) level.
# Run from the project root: `bash bench/gluon_fp8_pingpong_ab.sh`. Outputs in $OUT: gpu.log, pytest.log, ab.log,
# ab/gluon_fp8_pingpong.{csv,md}.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" gluon_fp8_pingpong_ab.sh runs/gluon_fp8_pingpong_ab
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$OUT/gpu.log" 2>&1
python3 -c "from triton_impl.gluon import fp8; print('causal D=128:', fp8.DEFAULT_CONFIGS[128, True])" >> "$OUT/gpu.log"
status=0
timeout 150 python3 -m pytest -q -m gpu -n 6 -p no:cacheprovider tests/test_fp8_rungs.py tests/test_gluon.py \
  -k "fp8 and causal and gluon" > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
timeout 150 python3 -m bench.gluon_fp8_pingpong --rounds 4 --out "$OUT/ab" > "$OUT/ab.log" 2>&1 || status=1
cat "$OUT/ab/gluon_fp8_pingpong.md" 2>/dev/null || tail -20 "$OUT/ab.log"
exit $status
