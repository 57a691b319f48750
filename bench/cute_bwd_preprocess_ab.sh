#!/usr/bin/env bash
# Issue #40: cute's backward preprocess with each row's LSE loaded beside its O and dO (this tree) against the file
# as it was (f6bf187), in one device call (about 6 minutes on an H200; carry [".gpu/cutlass-dsl.tar.xz",
# ".gpu/activate.sh", ".gpu/fa4"]):
#   1. the cute backward GPU tests of tests/test_cute_backward.py and tests/test_cute_backward_zero.py (gradients
#      against fp64 by the yardstick rule on every length class, both alignments, GQA, dLSE, the zeroing variant);
#   2. bench.cute_bwd_preprocess_ab: the two preprocess kernels alone at the anchors' row counts, D and LSE₂ checked
#      bit-equal first, 5 interleaved rounds;
#   3. bench.backward for cute/hopper and fa4/sm90 at B8 S2048 causal and P1 causal (the issue's ratio, one process).
# Predicted (sm_90a SASS: eight dependent 4-byte LSE loads in series at each CTA's end before, none after; 80 -> 88
# registers, six CTAs an SM -> five): the preprocess 48.2 -> 35-40 µs at B=8 H=16 S=2048 D=128 (gluon's Triton
# preprocess moves the same bytes in 35.8), the backward at B8 S2048 causal 0.975x -> 0.99-1.00x FA4.
# Take-rule: the tests pass, the bits equal, and the preprocess faster at every shape by more than its spread.
# Run from the project root: `bash bench/cute_bwd_preprocess_ab.sh`. Outputs in $OUT: gpu.log, pytest.log, pre.log,
# pre/cute_bwd_preprocess.{csv,md}, backward.log, backward/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_bwd_preprocess_ab.sh runs/cute_bwd_preprocess_ab
source_carried_activations
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >> "$OUT/gpu.log" 2>&1
status=0
base=$(mktemp --suffix=_tiled.py)
git show f6bf187:cute_impl/backward/tiled.py > "$base" 2>/dev/null || cp ab_base_tiled.py "$base" || status=1
timeout 200 python3 -m bench.cute_bwd_preprocess_ab --base "$base" --out "$OUT/pre" > "$OUT/pre.log" 2>&1 || status=1
cat "$OUT/pre/cute_bwd_preprocess.md" 2>/dev/null || tail -20 "$OUT/pre.log"
timeout 150 python3 -m bench.backward --impl cute/hopper --impl fa4/sm90 --shape 'B8 S2048 causal' --shape 'P1 causal' \
  --out "$OUT/backward" > "$OUT/backward.log" 2>&1 || status=1
grep -v "Warning\|exe_args" "$OUT/backward.log" | tail -12
timeout 230 python3 -m pytest -q -m gpu -n 6 -p no:cacheprovider tests/test_cute_backward.py tests/test_cute_backward_zero.py \
  > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
exit $status
