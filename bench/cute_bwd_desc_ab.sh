#!/usr/bin/env bash
# Issue #40: cute/hopper's backward with its runtime-indexed wgmma operands rebased (BackwardTiles(rebased_operands=True),
# cute_impl/backward/hopper_desc.py: each warpgroup's K and V boxes, its share of Kᵀ and the step's dS buffer described
# from their own addresses, so the k-steps no longer redo a 64-bit add with carry on each descriptor; sm_90a, P1's
# unmasked step: 438 → 410 SASS instructions, 160 → 138 uniform ones for 32 HGMMA; FA4's: 409 and 113), at D=128's
# default tiles (64 rows), its 80-row late_dv tiles (522 → 496) and D=64's default (128 rows, 578 → 563), against each
# head dim's default, in one device call on one H200 (at most about 200 s):
#   1. GPU tests (6 workers, 60 s): the knob's candidates against fp64 on ragged, causal (both alignments), GQA/MQA,
#      one-query, two-batch and many-block shapes with a planted lost dV box (tests/test_cute_backward_desc.py) and
#      the suite's every-candidate test on them;
#   2. bench.backward_kernels at P1 (35 s): each kernel's µs per backward (warm L2), the default, both D=128 knob
#      candidates, the 80-row late_dv tiles without the knob, and FA4;
#   3. bench.backward --candidates --rung cute (45 + 55 s): P1 with the same four, then P1 causal, B8 S2048 causal and
#      D64 B4 H32 with each head dim's default and its knob candidate, each checked against cuDNN's gradients,
#      beside cuDNN, SDPA flash and FA4 timed alike (rows past each budget are written "skipped", the last first).
# Every log is written under $OUT as the run goes (a step cut short leaves what it had); the table is also summary.txt.
# Run from the project root carrying the CuTe DSL and FA4 (../shared/gpu/README.md):
#   carry   [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"]
#   command bash bench/cute_bwd_desc_ab.sh
# Outputs in $OUT: gpu.log, pytest.log, kernels.log, kernels/{kernels,summary}.csv, p1.log, p1/candidates.csv,
# rest.log, rest/candidates.csv, summary.txt.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_bwd_desc_ab.sh runs/cute_bwd_desc_ab
source_carried_activations
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv >> "$OUT/gpu.log" 2>&1
status=0
timeout 60 python3 -m pytest -q -n 6 -m gpu tests/test_cute_backward_desc.py tests/test_cute_backward.py \
  -k "test_gpu_rebased or (every_hopper_candidate and rebase)" > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
default=m64_s2_dqreduce_tmarows_heaviestfirst_stagedepi
rebased=m64_s2_dqreduce_tmarows_heaviestfirst_stagedepi_rebase
rows80=m80_s2_dqreduce_tmarows_stagedepi_latedv
rows80_rebased=m80_s2_dqreduce_tmarows_stagedepi_latedv_rebase
timeout 35 python3 -m bench.backward_kernels --shape P1 --impl fa4/sm90 --cute-variant "$default" \
  --cute-variant "$rebased" --cute-variant "$rows80" --cute-variant "$rows80_rebased" --calls 5 --out "$OUT/kernels" \
  > "$OUT/kernels.log" 2>&1 || status=1
timeout 45 python3 -m bench.backward --candidates --rung cute --shape P1 --variant "$default" --variant "$rebased" \
  --variant "$rows80" --variant "$rows80_rebased" --budget-s 38 --out "$OUT/p1" > "$OUT/p1.log" 2>&1 || status=1
timeout 55 python3 -m bench.backward --candidates --rung cute --shape "P1 causal" --shape "B8 S2048 causal" \
  --shape "D64 B4 H32" --variant "$default" --variant "$rebased" --variant m128_s2_dqreduce_tmarows_stagedepi \
  --variant m128_s2_dqreduce_tmarows_stagedepi_rebase --budget-s 47 --out "$OUT/rest" > "$OUT/rest.log" 2>&1 || status=1
# µs per backward by kernel at P1 (warm L2), then TFLOP/s and the ratio to FA4 per shape and row.
python3 - "$OUT" <<'PY' 2>&1 | tee "$OUT/summary.txt" || status=1
import csv
import sys
from pathlib import Path

out = Path(sys.argv[1])
kernels = out / "kernels" / "kernels.csv"
if kernels.exists():
    print(f"{'P1 kernel µs (warm L2)':64s} {'us':>8s}")
    for row in csv.DictReader(kernels.open()):
        print(f"{(row['impl'][:30] + ' ' + row['kernel'][:33]):64s} {float(row['us']):8.1f}")
print(f"{'shape':16s} {'row':60s} {'TFLOP/s':>8s} {'vs FA4':>7s}")
for part in ("p1", "rest"):
    table = out / part / "candidates.csv"
    for row in csv.DictReader(table.open()) if table.exists() else ():
        if row["status"] == "ok" and row["impl"] != "sdpa/flash":
            name = row["variant"] or row["impl"]
            print(f"{row['shape']:16s} {name:60s} {float(row['bwd_tflops']):8.1f} {row['vs_fa4'][:6]:>7s}")
PY
exit $status
