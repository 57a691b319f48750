#!/usr/bin/env bash
# Issue #40: cute/hopper's backward with its dQaccum zeroed by the preprocess (BackwardTiles(zero_in_preprocess=
# True): torch.empty, and each preprocess CTA's 64 rows' share zeroed by 16-byte stores before its loads of O and
# dO, the last CTA of a head the layout's padding) against each head dim's default (a torch.zeros fill launched
# before the dK/dV kernel: 29 µs at B=8 S=2048 causal), in one device call on one H200 (at most about 200 s):
#   1. its GPU tests (6 workers, 80 s): the preprocess alone leaves a poisoned dQaccum all zero (planted: without the
#      padding it does not), the zeroing candidates against fp64 on ragged, causal (both alignments), GQA/MQA,
#      one-query, two-batch and many-block shapes with dQaccum poisoned first, an idle last CTA failing the rule
#      (tests/test_cute_backward_zero.py), and the suite's every-candidate test on them;
#   2. bench.backward_kernels at P1, P1 causal, D64 B4 H32 and B8 S2048 causal (45 s): each kernel's µs per backward
#      (warm L2, back to back) for each head dim's default and its zeroing candidate: the fill's column should go
#      to 0 and the preprocess's grow by less than it (FA4's preprocess, which zeroes its dQaccum too: 68.7 µs at
#      B8 S2048 causal, results/h200/backward-kernels-2026-11-30/);
#   3. bench.backward --candidates --rung cute at D64 B4 H32 and B8 S2048 causal (the two largest dQaccums for
#      their backward's time; 70 s): the backward's L2-flushed median TFLOP/s, default then knob, each checked
#      against cuDNN's gradients, beside cuDNN, SDPA flash and FA4 (rows past the 60 s budget are written
#      "skipped", the last named first).
# Run from the project root carrying the CuTe DSL and FA4 (../shared/gpu/README.md):
#   carry   [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"]
#   command bash bench/cute_bwd_zero_ab.sh
# Outputs in $OUT: gpu.log, pytest.log, kernels.log, kernels/{kernels,summary}.csv, candidates.log,
# candidates/candidates.csv.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_bwd_zero_ab.sh runs/cute_bwd_zero_ab
source_carried_activations
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv >> "$OUT/gpu.log" 2>&1
status=0
timeout 80 python3 -m pytest -q -n 6 -m gpu tests/test_cute_backward_zero.py tests/test_cute_backward.py \
  -k "test_gpu_preprocess or test_gpu_zeroing or test_gpu_an_idle or (every_hopper_candidate and zeropre)" \
  > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
shapes=(--shape P1 --shape "P1 causal" --shape "D64 B4 H32" --shape "B8 S2048 causal")
# Each head dim's default, then its zeroing candidate (a label a head dim lacks is left out there).
labels=(m64_s2_dqreduce_tmarows_heaviestfirst_stagedepi m128_s2_dqreduce_tmarows_stagedepi
  m64_s2_dqreduce_tmarows_heaviestfirst_stagedepi_zeropre m128_s2_dqreduce_tmarows_stagedepi_zeropre)
kernel_rows=()
variants=()
for label in "${labels[@]}"; do
  kernel_rows+=(--cute-variant "$label")
  variants+=(--variant "$label")
done
timeout 45 python3 -m bench.backward_kernels "${shapes[@]}" "${kernel_rows[@]}" --calls 10 --out "$OUT/kernels" \
  > "$OUT/kernels.log" 2>&1 || status=1
timeout 70 python3 -m bench.backward --candidates --rung cute --shape "D64 B4 H32" --shape "B8 S2048 causal" \
  "${variants[@]}" --budget-s 60 --out "$OUT/candidates" > "$OUT/candidates.log" 2>&1 || status=1
# Per row: µs per backward of the preprocess, the fill, the postprocess, the rest (dK/dV) and the wall (warm L2).
python3 - "$OUT/kernels" <<'PY' || status=1
import csv
import sys
from collections import defaultdict

kinds = ("postprocess", "preprocess", "fill")
summed = defaultdict(lambda: dict.fromkeys((*kinds, "rest"), 0.0))
for row in csv.DictReader(open(f"{sys.argv[1]}/kernels.csv")):
    name = row["kernel"].lower()
    kind = next((kind for kind in kinds if kind in name), "rest")
    summed[row["shape"], row["impl"]][kind] += float(row["us"])
print(f"{'shape':16s} {'row':60s} {'pre':>6s} {'fill':>6s} {'post':>6s} {'dK/dV':>7s} {'wall':>7s}")
for head in csv.DictReader(open(f"{sys.argv[1]}/summary.csv")):
    us = summed[head["shape"], head["impl"]]
    cells = f"{us['preprocess']:6.1f} {us['fill']:6.1f} {us['postprocess']:6.1f} {us['rest']:7.1f}"
    print(f"{head['shape']:16s} {head['impl'][:60]:60s} {cells} {float(head['wall_us']):7.1f}")
PY
grep -v "Warning\|exe_args" "$OUT/candidates.log" | tail -24
exit $status
