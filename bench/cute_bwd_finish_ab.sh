#!/usr/bin/env bash
# Issue #40: cute/hopper's backward with dQ finished in its dK/dV kernel (hopper.FINISHED_CAUSAL, FINISHED_D64:
# BackwardTiles.dq_finish_in_kernel, no postprocess launch) against the defaults it changes and FA4, in one device call
# on one H200 (at most about 5 minutes):
#   1. the new GPU tests (tests/test_cute_backward_finish.py, 6 workers, ≤ 130 s): each finished candidate against
#      fp64 by the yardstick rule on one query or key, rows that see no key, MQA, ragged tails, both causal alignments,
#      GQA over two batches, many blocks and B8 H16 S2048 causal, every buffer the backward allocates poisoned (NaN)
#      first, dK and dV bit for bit the unfinished build's; planted: finishing each block one key block early fails;
#   2. bench.cute_bwd_finish_ab (≤ 130 s): the default, the finished candidate and FA4 at B8 S2048 causal, B16 H16
#      S1024 causal, P1 causal (D=128) and D64 B4 H32 (non-causal, 128 rows a step), 3 interleaved rounds (order
#      reversed every other round, L2-flushed medians), the finished row's dK and dV checked bit-equal to the default's
#      and its dQ within reduce-add reordering first;
#   3. bench.backward_kernels --flush at B8 S2048 causal (≤ 40 s): the default, the finished candidate and FA4 kernel
#      by kernel: how much longer the dK/dV kernel runs for its finishes against the postprocess it saves.
# Predicted (docs/perf-log.md, helper fpost): B8 S2048 causal 3-6 % faster than the default (the ~50 µs postprocess
# removed against the finishes at the dK/dV kernel's tail; 1.00-1.03x FA4), B16 H16 S1024 causal similar, P1 causal
# +0.5 to +2 %, D64 B4 H32 +0.3 to +0.9 %.
# Take-rule: the tests pass and the finished candidate is faster than the default at every causal D=128 shape by more
# than its spread.
# Run from the project root carrying the CuTe DSL and FA4 (../shared/gpu/README.md):
#   carry   [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"]
#   command bash bench/cute_bwd_finish_ab.sh
# Outputs in $OUT: gpu.log, pytest.log, ab.log, ab/cute_bwd_finish.{csv,md}, kernels.log, kernels/{kernels,summary}.csv.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_bwd_finish_ab.sh runs/cute_bwd_finish_ab
source_carried_activations
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >> "$OUT/gpu.log" 2>&1
status=0
begun=$SECONDS
timeout 130 python3 -m pytest -q -m gpu -n 6 -p no:cacheprovider tests/test_cute_backward_finish.py \
  > "$OUT/pytest.log" 2>&1 || status=1
echo "tests: $((SECONDS - begun)) s" >> "$OUT/gpu.log"
tail -3 "$OUT/pytest.log"
begun=$SECONDS
timeout 130 python3 -m bench.cute_bwd_finish_ab --out "$OUT/ab" --rounds 3 > "$OUT/ab.log" 2>&1 || status=1
echo "ab: $((SECONDS - begun)) s" >> "$OUT/gpu.log"
cat "$OUT/ab/cute_bwd_finish.md" 2>/dev/null || grep -v "Warning\|exe_args" "$OUT/ab.log" | tail -20
begun=$SECONDS
timeout 40 python3 -m bench.backward_kernels --flush --shape "B8 S2048 causal" --impl cute/hopper --impl fa4/sm90 \
  --cute-variant m64_s2_dqreduce_tmarows_heaviestfirst_stagedepi_zeropre_latedv_pdl_dqfinish --calls 6 \
  --out "$OUT/kernels" > "$OUT/kernels.log" 2>&1 || status=1
echo "kernels: $((SECONDS - begun)) s" >> "$OUT/gpu.log"
grep -E "wall|µs  x" "$OUT/kernels.log" | head -24
exit $status
