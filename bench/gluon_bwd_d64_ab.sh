#!/usr/bin/env bash
# Issue #40, gluon/hopper's backward at D=64 (its largest gap: 387.7 TFLOP/s = 0.73× FA4 at B=4 H=32 S=8192): the
# 128-query-row dK/dV step (BackwardTiles.late_dv: dPᵀ − D by the wgmma, LSE₂ read late, dV += Pᵀ dO after dSᵀ;
# triton_impl/gluon/backward_late_dv.py), the 128-key dQ pass, and both, against D=64's default (64-row steps, 64-key
# dQ tiles), in one call (at most about 190 s on an H200):
#   1. the GPU tests (8 workers, 75 s): every late_dv candidate against fp64 on ragged, causal (both alignments),
#      GQA/MQA, one-query and many-block shapes, with a planted lost D seed that must fail on dK
#      (tests/test_gluon_backward_late_dv.py), and the 128-key dQ candidate on tests/test_backward.py's shapes;
#   2. bench.gluon_bwd_causal --set d64 at B=4 H=32 S=8192 D=64 bf16, non-causal and causal: each variant's
#      gradients compared with the default's first (relative L2, expected far below cuDNN's 3e-3), then three
#      rounds of FA4's backward and the four variants in turn, one process (medians; L2 flushed; rounds after the
#      first stop at 85 s); the table last.
# late_dv is listed by no release the H200 runs (3.6 spills 24 bytes a thread in the causal build, outside the step
# loops; non-causal none): it is timed here from ALL_CANDIDATES.
# Run from the project root carrying FA4 for its column (without it FA4 reads nan and the rest runs):
#   carry   [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"]
#   command bash bench/gluon_bwd_d64_ab.sh
# Outputs in $OUT: gpu.log, pytest.log, ab.log, ab/ab.csv.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" gluon_bwd_d64_ab.sh runs/gluon_bwd_d64_ab
source_carried_activations
export PYTHONPATH="${PYTHONPATH:-$PWD}"
{
  nvidia-smi --query-gpu=name,memory.total --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} >> "$OUT/gpu.log" 2>&1
status=0
timeout 75 python3 -m pytest -q -n 8 -m gpu tests/test_gluon_backward_late_dv.py tests/test_backward.py \
  -k "late_dv or (every_candidate and gluon and d64 and 128x128)" > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
timeout 110 python3 -m bench.gluon_bwd_causal --set d64 --rounds 3 --budget-s 85 --out "$OUT/ab" > "$OUT/ab.log" 2>&1 \
  || status=1
if grep -q "^shape " "$OUT/ab.log"; then sed -n "/^shape /,\$p" "$OUT/ab.log"; else tail -20 "$OUT/ab.log"; fi
exit $status
