#!/usr/bin/env bash
# Issue #40, the causal Gluon backward: BackwardTiles(consumer_ranges=True) (each consumer warpgroup runs its own
# block range, skipping the steps its half of the causal diagonal sees nothing in) and limit_mask=True (masked
# steps compare each value once against a limit per row; the dQ pass masks P after the exp, keeping the FFMA),
# alone and together, against the D=128 default (triton_impl/gluon/backward_ranges.py), in one call (at most
# about 290 s on an H200):
#   1. bench.gluon_bwd_causal at P1 causal, B8 S2048 causal and P1 (the non-causal control): each variant's
#      gradients compared with the default's first (relative L2 distance, expected far below cuDNN's 3e-3: no
#      product changes, only the rounding of S · scale − LSE₂ in dQ steps no longer masked before the exp),
#      then three rounds of FA4 and the four variants in turn (medians; L2 flushed; rounds after the first
#      stop at 95 s);
#   2. the knobs' tests on the machine's Triton (8 workers): the static one (sm_90a compiles without spills or
#      serialised wgmmas; the limit mask's shorter masked steps) and the GPU ones (every candidate with a knob
#      against fp64 on shapes that probe the ranges: GQA skips between heads, bottom-right offsets that are not a
#      multiple of 64, rows that see no key, upper consumers past Sk), bf16;
#   3. the A/B's table again, last.
# Run from the project root, carrying [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"] for FA4's ratios:
# `source .gpu/activate.sh && source .gpu/fa4/activate.sh && bash bench/gluon_bwd_causal_ab.sh` (without them the
# FA4 column reads nan and the rest runs).
# Outputs in $OUT: gpu.log, ab.log, ab/ab.csv, pytest.log.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" gluon_bwd_causal_ab.sh runs/gluon_bwd_causal_ab
export PYTHONPATH="${PYTHONPATH:-$PWD}"
{
  nvidia-smi --query-gpu=name,memory.total --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} > "$OUT/gpu.log" 2>&1
status=0
timeout 125 python3 -m bench.gluon_bwd_causal --rounds 3 --budget-s 95 --out "$OUT/ab" > "$OUT/ab.log" 2>&1 || status=1
timeout 150 python3 -m pytest -q -n 8 -m "gpu or static" tests/test_gluon_backward_ranges.py -k "static or bf16" \
  > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
if grep -q "^shape " "$OUT/ab.log"; then sed -n "/^shape /,\$p" "$OUT/ab.log"; else tail -20 "$OUT/ab.log"; fi
exit $status
