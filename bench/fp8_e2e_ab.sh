#!/usr/bin/env bash
# FP8 end to end at P1 (issue #37: best FP8 e2e >= 1.1x cute/hopper causal) with the fused quantiser's
# interleave knob (QuantiserConfig.interleave, off by default: Q's, K's and V's programs alternate in the
# launch, so that rotated tiles, bound by instructions, share each SM with V's, bound by memory), in one
# device call (about 3 minutes on an H200, Triton 3.6):
#   1. the knob's GPU test: its bytes against the default configuration's, poisoned buffers, block+rotation,
#      at P1 and a ragged GQA shape (test_gpu_every_knob_writes_the_default_configurations_bytes);
#   2. bench.fp8_quantiser --ab at P1 (B=2 H=16 S=8192 D=128 bf16, block+rotation, tensor-core rotation):
#      the default (8 tiles a program, register prefetch, 128 registers) against it interleaved and against
#      interleaved at 16 warps x 64 registers (two programs an SM, 32 warps), each judged against the reference
#      and the default's bytes, then timed against the read bandwidth measured in the run;
#   3. in the same process, causal and non-causal: cute/hopper (bf16), then for cute/fp8 and gluon/fp8 the
#      kernel only, and per passing candidate the quantiser alone in the rung's V layout and end to end, two
#      interleaved rounds (medians), with e2e - kernel - quantiser ("other µs": what a call pays beyond its two
#      launches; the code path launches nothing else, so this reads the run-to-run spread).
# Run from the project root: `bash bench/fp8_e2e_ab.sh`; cute/* needs the CuTe DSL (carry it as for the other
# CuTe runs). Outputs in $OUT: gpu.log, pytest.log, ab.log, ab/fp8_quantiser_ab.{csv,md}.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" fp8_e2e_ab.sh runs/fp8_e2e_ab
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$OUT/gpu.log" 2>&1
status=0
knob_test=tests/test_fp8_quantiser.py::test_gpu_every_knob_writes_the_default_configurations_bytes
tests=()
for shape in "(2, 16, 16, 8192, 8192, 128)" "(2, 8, 2, 1000, 777, 128)"; do
  for config in "tiles/prog=8 prefetch warps=auto maxnreg=128" "tiles/prog=8 stages=1 warps=16 maxnreg=64"; do
    tests+=("$knob_test[$shape-block+rotation-tensor_core-1 launch interleaved $config reciprocal]")
  done
done
timeout 60 python3 -m pytest -q -m gpu "${tests[@]}" > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
prefetch="tiles_per_program=8,prefetch=true,maxnreg=128"
candidates="$prefetch;$prefetch,interleave=true;tiles_per_program=8,num_warps=16,maxnreg=64,interleave=true"
timeout 115 python3 -m bench.fp8_quantiser --ab --only cute/fp8,gluon/fp8 --candidates "$candidates" \
  --e2e-each --e2e-rounds 2 --warmup-ms 25 --rep-ms 150 --out "$OUT/ab" > "$OUT/ab.log" 2>&1 || status=1
tail -40 "$OUT/ab.log"
exit $status
