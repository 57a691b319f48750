#!/usr/bin/env bash
# Issue #40: cute/hopper's causal D=128 backward default (64 query rows a dK/dV step, heaviest CTAs first, staged
# epilogue, late_dv) with its wgmma operands rebased (BackwardTiles.rebased_operands, cute_impl/backward/hopper_desc.py),
# the one pair of the two taken knobs never timed together. sm_90a (CuTe DSL 4.8.1): the unmasked step 438 -> 410
# instructions, uniform ones per HGMMA 5.0 -> 4.3, no spill, wgmmas not serialised. The rebase alone at 64 rows
# measured -1.0 % non-causal and +0.3 % causal (results/h200/backward-late-dv-rebase/); with late_dv at 80 rows +2.3 %.
# Predicted: P1 causal and B8 S2048 causal -0.5 to +1.5 % (FA4 0.98-1.00x today). One device call on one H200 (about
# 3 minutes), carrying the CuTe DSL and FA4 ([".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"]):
#   1. GPU tests (6 workers): every rebased candidate against fp64 on ragged, causal (both alignments), GQA/MQA,
#      one-query and many-block shapes, with a planted lost dV box (tests/test_cute_backward_desc.py);
#   2. bench.backward --candidates --rung cute at P1 causal and B8 S2048 causal: the default and the candidate beside
#      FA4, cuDNN and SDPA flash, each checked against cuDNN's gradients; twice, the variants in the other order the
#      second time (rounds 1 and 2).
# Run from the project root: `bash bench/cute_bwd_causal_ab.sh`. Outputs in $OUT: gpu.log, pytest.log, round1.log,
# round1/candidates.csv, round2.log, round2/candidates.csv, summary.txt.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_bwd_causal_ab.sh runs/cute_bwd_causal_ab
source_carried_activations
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv >> "$OUT/gpu.log" 2>&1
status=0
timeout 90 python3 -m pytest -q -n 6 -m gpu tests/test_cute_backward_desc.py -k "test_gpu_rebased and m64" \
  > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
default=m64_s2_dqreduce_tmarows_heaviestfirst_stagedepi_latedv
rebased=m64_s2_dqreduce_tmarows_heaviestfirst_stagedepi_latedv_rebase
round=0
for order in "$default $rebased" "$rebased $default"; do
  round=$((round + 1))
  read -r first second <<< "$order"
  timeout 60 python3 -m bench.backward --candidates --rung cute --shape "P1 causal" --shape "B8 S2048 causal" \
    --variant "$first" --variant "$second" --budget-s 52 --out "$OUT/round$round" > "$OUT/round$round.log" 2>&1 \
    || status=1
done
python3 - "$OUT" <<'PY' 2>&1 | tee "$OUT/summary.txt" || status=1
import csv
import sys
from pathlib import Path

out = Path(sys.argv[1])
print(f"{'round':6s} {'shape':16s} {'row':60s} {'TFLOP/s':>8s} {'vs FA4':>7s}")
for part in ("round1", "round2"):
    table = out / part / "candidates.csv"
    for row in csv.DictReader(table.open()) if table.exists() else ():
        if row["status"] == "ok" and row["impl"] != "sdpa/flash":
            name = row["variant"] or row["impl"]
            print(f"{part:6s} {row['shape']:16s} {name:60s} {float(row['bwd_tflops']):8.1f} {row['vs_fa4'][:6]:>7s}")
PY
exit $status
