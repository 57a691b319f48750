#!/usr/bin/env bash
# Issue #37's causal ping-pong finding carried to gluon/hopper (bf16): its D=128 default with the consumers'
# ping-pong on (the candidate, both masks) against off, in one device call (about 3 minutes on an H200; Triton only,
# nothing carried):
#   1. gluon/hopper's GPU tests on the candidate default (tests/test_gluon.py, every test but FP8's: the SDPA
#      yardstick on every length class, both alignments, GQA, cache lengths, the LSE, strided views);
#   2. bench.gluon_hopper_pingpong at P1, causal then non-causal, 4 interleaved rounds (O checked bit-equal first).
# Predicted: causal 1.02-1.05x as fast (gluon/fp8's 1.06x, diluted: bf16's GEMMs are twice as long against the same
# softmax), non-causal level (614.5 against 611.5 TFLOP/s in the fourth stop). Take-rule: the tests pass and a mask's
# kernel median is faster by more than the smaller setting's spread; otherwise the default stays off.
# Run 2026-12-04 (results/h200/gluon-hopper-pingpong/; H200, Triton 3.6): 49 tests passed; refuted: causal 918.6 ->
# 955.9 us (0.961x as fast), non-causal 1729.7 -> 1759.6 (0.983x); the default keeps D=128 without ping-pong.
# Run from the project root: `bash bench/gluon_hopper_pingpong_ab.sh`. Outputs in $OUT: gpu.log, pytest.log,
# ab.log, ab/gluon_hopper_pingpong.{csv,md}.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" gluon_hopper_pingpong_ab.sh runs/gluon_hopper_pingpong_ab
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$OUT/gpu.log" 2>&1
python3 -c "from triton_impl.gluon import hopper; print('D=128:', hopper.DEFAULT_CONFIGS[128])" >> "$OUT/gpu.log"
status=0
timeout 200 python3 -m pytest -q -m gpu -n 6 -p no:cacheprovider tests/test_gluon.py -k "not fp8" \
  > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
timeout 150 python3 -m bench.gluon_hopper_pingpong --rounds 4 --out "$OUT/ab" > "$OUT/ab.log" 2>&1 || status=1
cat "$OUT/ab/gluon_hopper_pingpong.md" 2>/dev/null || tail -20 "$OUT/ab.log"
exit $status
