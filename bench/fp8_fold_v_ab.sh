#!/usr/bin/env bash
# Issue #37's folded P V in one device call: cute/fp8's FOLD_V_SCALE (off, untimed) adds each key block's separate
# P V to O in one FMA a value, O held in its last V block's frame and owing the last softmax's row factors, as
# gluon/fp8 does, instead of an FMA with the V scale and a conditional multiply of O by the row factors. sm_90a key
# step: D=128 549 -> 489 instructions non-causal, 575 -> 515 causal (497 with SCALE_INDEX_32BIT); D=64 475 -> 448 and
# 504 -> 475 (457); gluon/fp8's D=128 step is 466. The census counts the conditional multiply as taken; Nsight
# Compute found it taken at 47-59 % of the blocks at D=64, so about half the cut is executed.
# At D=128 only (FOLD_V_SCALE_HEAD_DIMS): D=64's every-feature build spills 88 bytes with it.
# Predicted (not measured): D=128 kernels 0.94-0.98x the time (the step issue-bound: about 1150 issue slots a
# sub-partition a block pair against 1024 tensor cycles), so P1 non-causal 838 -> 860-890 TFLOP/s on an H100 and the
# causal end to end 1.072 -> 1.09-1.13x cute/hopper's kernel.
# This call: the knob's GPU tests (FP8_RULE on ragged GQA shapes with cache lengths, every mask, D=128 and the knob
# forced at D=64, and FA3's outlier inputs; planted, the fold without the V-scale ratio fails), then
# `bench.fp8_fold_v` at P1, 3 rounds (O within 2e-3 relative L2 of the unfolded kernel's before timing). About 250 s.
# Run from the project root, carrying [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command
# `bash bench/fp8_fold_v_ab.sh`. Outputs in $OUT: gpu.log, times.txt, pytest.log, ab.log, ab/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" fp8_fold_v_ab.sh runs/fp8_fold_v_ab
source_carried_activations
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >> "$OUT/gpu.log" 2>&1
status=0
gpu_tests 120 -n 4 tests/test_cute_fp8_fold_v_scale.py
timeout 100 python3 -m bench.fp8_fold_v --rounds 3 --out "$OUT/ab" > "$OUT/ab.log" 2>&1 || status=1
tail -14 "$OUT/ab.log"
exit $status
