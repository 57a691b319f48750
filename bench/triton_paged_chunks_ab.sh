#!/usr/bin/env bash
# Issue #38: triton/decode's paged rows of the default `compare.py --decode` shape (B=8 H=32 Hkv=8 Sq=1 Sk=32768 D=128
# bf16, full lengths): pages of 16 263.5 us against FlashInfer's 248.2 and the contiguous row's 242.0 (H200,
# results/h200/decode/). Static (helper `tpaged16`, sm_90a, Triton 3.6): the paged(16) key loop is 350 instructions a
# 64-key block against 292 contiguous, with the same 9 barriers, the same 16 K/V cp.async issued at the same place
# and the same 3 CTAs an SM (shared memory), about 20 % of the issue slots a block's 1 us of DRAM time gives an SM:
# not where 9 % goes. Pages of 32 differ: 189 registers a thread, two CTAs an SM where the balanced plan counts three
# (320 CTAs of 103 blocks on 264 slots, 56 in a second wave). PAGED_SPAN_CHUNKS reads such a page's entry once per 16
# keys: 157 registers, three CTAs an SM, 359 instructions a block against 308.
# Predicted: the pages-of-32 full row 0.85-0.95x (off 280-310 us: one wave at the read bandwidth, then 56 CTAs
# latency-bound; on 263-272, the pages-of-16 row's); seed rows 43/7 and 59/6 (D=128 in pages of 32, ragged)
# 0.85-1.00x; the controls (pages of 16 and 64, the contiguous cache given full lengths) 1.00 +- 0.02: the switch
# leaves their SASS unchanged. Off under 270 us: the second wave costs nothing and the switch is not worth taking.
# Then a diagnostic, no switch to take: the balanced split against the padded one (BALANCED_SPLIT 'ragged-split'
# against 'never') on the pages-of-16 row and its contiguous twin given full lengths, to weigh the plan's share of the
# pages-of-16 gap (the key loop's is at most ~3 %): predicted 'never' 0.93-1.00x on the paged row, 0.95-1.00x on the
# twin.
# This call: the switch's GPU tests (fp64 on a poisoned output, bit equality with the switch off), then the two A/Bs
# through bench.decode_knob_ab (2 rounds, each value checked against fp64 on a poisoned output first). About 170 s
# (limits 255 s).
# Run from the project root carrying [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"] (the harness opens
# every decode rung), command `bash bench/triton_paged_chunks_ab.sh`.
# Outputs in $OUT: times.txt, pytest.log, chunks.log, chunks/, plan.log, plan/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" triton_paged_chunks_ab.sh runs/triton_paged_chunks_ab
decode_setup
status=0
gpu_tests 120 tests/test_decode_paged_chunks.py
SHAPE=73/3:batch=8,seqlen_k=32768,head_dim=128
knob_ab chunks 90 triton_impl.decode:PAGED_SPAN_CHUNKS False,True triton/decode \
  "$SHAPE,has_cache_seqlens=True,page_size=32,full" 43/7 59/6 "$SHAPE,has_cache_seqlens=True,page_size=16,full" \
  "$SHAPE,has_cache_seqlens=True,page_size=64,full" "$SHAPE,full"
knob_ab plan 45 triton_impl.decode:BALANCED_SPLIT "'ragged-split','never'" triton/decode \
  "$SHAPE,has_cache_seqlens=True,page_size=16,full" "$SHAPE,full"
cat "$OUT/times.txt"
exit $status
