#!/usr/bin/env bash
# Issue #40: cute/hopper's backward with FlashAttention-4's order in its dK/dV step (BackwardTiles(late_dv=True):
# dV += Pᵀ dO issued once dSᵀ is computed, Pᵀ converted to 16 bits only then), at 64 rows (D=128's default with
# it), at FA4's non-causal D=128 tile of 80 rows (dSᵀ from fp32 Pᵀ: 522 SASS instructions a step against 602 without
# the knob and 438 for 64 rows; its transposed dQ postprocess now by 16-byte accesses through shared memory) and at
# D=64's 128 rows, against each head dim's default, in one device call on one H200 (at most about 200 s):
#   1. GPU tests (6 workers, 60 s): the knob's candidates against fp64 on ragged, causal (both alignments), GQA/MQA,
#      one-query, two-batch and many-block shapes with a planted lost dV box (tests/test_cute_backward_gap.py), the
#      suite's every-candidate test on them, and the 80-row tests (its new postprocess: many blocks, query tails);
#   2. bench.backward_kernels at P1 (35 s): each kernel's µs per backward (warm L2) for the default, both D=128 knob
#      candidates and FA4 (whose non-causal main kernel, at its 80-row tile, was never timed alone);
#   3. bench.backward --candidates --rung cute (45 + 55 s): P1 with the default and both D=128 candidates, then
#      P1 causal, B8 S2048 causal and D64 B4 H32 with each head dim's default and its 64- or 128-row candidate (FA4
#      keeps 64 rows when causal), each checked against cuDNN's gradients, beside cuDNN, SDPA flash and FA4 timed
#      alike (rows past each budget are written "skipped", the last named first: D64 is the least telling, its
#      128-row step already waits for dSᵀ and the knob there only moves Pᵀ's conversion).
# Run from the project root carrying the CuTe DSL and FA4 (../shared/gpu/README.md):
#   carry   [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"]
#   command bash bench/cute_bwd_gap_ab.sh
# Outputs in $OUT: gpu.log, pytest.log, kernels.log, kernels/{kernels,summary}.csv, p1.log, p1/candidates.csv,
# rest.log, rest/candidates.csv.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_bwd_gap_ab.sh runs/cute_bwd_gap_ab
source_carried_activations
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv >> "$OUT/gpu.log" 2>&1
status=0
timeout 60 python3 -m pytest -q -n 6 -m gpu tests/test_cute_backward_gap.py tests/test_cute_backward.py \
  -k "test_gpu_late_dv or (every_hopper_candidate and latedv) or 80_rows or (tma_rows_pass and m80)" \
  > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
default=m64_s2_dqreduce_tmarows_heaviestfirst_stagedepi
rows64=m64_s2_dqreduce_tmarows_heaviestfirst_stagedepi_latedv
rows80=m80_s2_dqreduce_tmarows_stagedepi_latedv
timeout 35 python3 -m bench.backward_kernels --shape P1 --impl fa4/sm90 --cute-variant "$default" \
  --cute-variant "$rows64" --cute-variant "$rows80" --calls 5 --out "$OUT/kernels" > "$OUT/kernels.log" 2>&1 || status=1
timeout 45 python3 -m bench.backward --candidates --rung cute --shape P1 --variant "$default" --variant "$rows64" \
  --variant "$rows80" --budget-s 38 --out "$OUT/p1" > "$OUT/p1.log" 2>&1 || status=1
timeout 55 python3 -m bench.backward --candidates --rung cute --shape "P1 causal" --shape "B8 S2048 causal" \
  --shape "D64 B4 H32" --variant "$default" --variant "$rows64" --variant m128_s2_dqreduce_tmarows_stagedepi \
  --variant m128_s2_dqreduce_tmarows_stagedepi_latedv --budget-s 47 --out "$OUT/rest" > "$OUT/rest.log" 2>&1 || status=1
# µs per backward by kernel at P1 (warm L2), then TFLOP/s and the ratio to FA4 per shape and row.
python3 - "$OUT" <<'PY' || status=1
import csv
import sys
from pathlib import Path

out = Path(sys.argv[1])
kernels = out / "kernels" / "kernels.csv"
if kernels.exists():
    print(f"{'P1 kernel µs (warm L2)':60s} {'us':>8s}")
    for row in csv.DictReader(kernels.open()):
        print(f"{(row['impl'][:28] + ' ' + row['kernel'][:31]):60s} {float(row['us']):8.1f}")
print(f"{'shape':16s} {'row':56s} {'TFLOP/s':>8s} {'vs FA4':>7s}")
for part in ("p1", "rest"):
    table = out / part / "candidates.csv"
    for row in csv.DictReader(table.open()) if table.exists() else ():
        if row["status"] == "ok" and row["impl"] != "sdpa/flash":
            name = row["variant"] or row["impl"]
            print(f"{row['shape']:16s} {name:56s} {float(row['bwd_tflops']):8.1f} {row['vs_fa4'][:6]:>7s}")
PY
exit $status
