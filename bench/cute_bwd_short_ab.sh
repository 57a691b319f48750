#!/usr/bin/env bash
# Issue #40: cute/hopper's causal D=128 backward on short rows (B8 S2048 causal at 0.973x FA4 on 2026-12-04, 741.1
# against 721.1 µs), its default against the three chained candidates (hopper.CHAINED_CAUSAL: the preprocess, dK/dV
# and postprocess launches chained by programmatic dependent launch; then the dQaccum fill folded into the
# preprocess; then the postprocess's items last first), in one device call on one H200 (at most about 5 minutes):
#   1. the new GPU tests (tests/test_cute_backward_short.py, 6 workers, ≤ 130 s): each candidate against fp64 by the
#      yardstick rule on one query or key, rows that see no key, MQA, ragged tails, both causal alignments, GQA over
#      two batches and many blocks, D, LSE₂ and dQaccum poisoned first, dK and dV bit for bit the unchained build's;
#      planted: the dK/dV kernel reading D and LSE₂ before the preprocess wrote them fails the rule;
#   2. bench.cute_bwd_short_ab (≤ 110 s): the default, the candidates and FA4 at B8 S2048 causal, B16 H16 S1024
#      causal and P1 causal, 4 interleaved rounds (order reversed every other round, L2-flushed medians), each cute
#      row's dK and dV checked bit-equal to the default's first;
#   3. bench.backward_kernels --flush at B8 S2048 causal (≤ 50 s): the default, the last candidate and FA4 kernel by
#      kernel, each call after a clean flush: does the wall − Σ kernels gap (5.4 µs for the default, −3.6 for FA4 on
#      2026-12-04) close, and does the postprocess read faster with its items reversed.
# Predicted (docs/perf-log.md, helper cshort): at B8 S2048 causal pdl 0.5-1.2 % faster than the default, pdl+zeropre
# 0.7-1.5 %, pdl+zeropre+postrev 1.0-2.0 % (FA4 ratio 0.973x -> 0.98-0.99x); at P1 causal each within 0.5 %.
# Take-rule: the tests pass and a candidate is faster than the default at every shape by more than its spread. Since
# 2026-12-04 the full chain is the causal D=128 default (faster in nine medians of three calls, results/h200/
# backward-chained-causal-20rounds/), and the tool's first row is the unchained step (hopper.UNCHAINED_CAUSAL).
# Run from the project root carrying the CuTe DSL and FA4 (../shared/gpu/README.md):
#   carry   [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"]
#   command bash bench/cute_bwd_short_ab.sh
# Outputs in $OUT: gpu.log, pytest.log, ab.log, ab/cute_bwd_short.{csv,md}, kernels.log, kernels/{kernels,summary}.csv.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_bwd_short_ab.sh runs/cute_bwd_short_ab
source_carried_activations
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >> "$OUT/gpu.log" 2>&1
status=0
begun=$SECONDS
timeout 130 python3 -m pytest -q -m gpu -n 6 -p no:cacheprovider tests/test_cute_backward_short.py \
  > "$OUT/pytest.log" 2>&1 || status=1
echo "tests: $((SECONDS - begun)) s" >> "$OUT/gpu.log"
tail -3 "$OUT/pytest.log"
begun=$SECONDS
timeout 110 python3 -m bench.cute_bwd_short_ab --out "$OUT/ab" --rounds 4 > "$OUT/ab.log" 2>&1 || status=1
echo "ab: $((SECONDS - begun)) s" >> "$OUT/gpu.log"
cat "$OUT/ab/cute_bwd_short.md" 2>/dev/null || grep -v "Warning\|exe_args" "$OUT/ab.log" | tail -20
begun=$SECONDS
timeout 50 python3 -m bench.backward_kernels --flush --shape "B8 S2048 causal" --impl cute/hopper --impl fa4/sm90 \
  --cute-variant m64_s2_dqreduce_tmarows_heaviestfirst_stagedepi_zeropre_latedv_pdl_postrev --calls 6 \
  --out "$OUT/kernels" > "$OUT/kernels.log" 2>&1 || status=1
echo "kernels: $((SECONDS - begun)) s" >> "$OUT/gpu.log"
grep -E "wall|µs  x" "$OUT/kernels.log" | head -24
exit $status
