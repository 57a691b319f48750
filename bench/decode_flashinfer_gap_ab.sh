#!/usr/bin/env bash
# Issue #38's rows where a decode rung trails FlashInfer in the default `compare.py --decode` (H200, 2026-12-01 sixth
# stop, results/h200/decode/): gluon/decode on B=8 Hkv=8 32k in pages of 16 (324.6 us against FlashInfer's 254.3) and
# ragged (139.1 against 123.6), triton/decode on B=64 Hkv=8 at 4k and 32k (272.3 / 2126.9 against 250.8 / 1900.6). One
# device call (about 250 s; the limits sum to 290), each A/B through bench.decode_knob_ab (values alternating over 2
# rounds, each checked against fp64 on a poisoned output first):
#   1. gluon/decode's BALANCED_SPLIT "ragged-split" (the default) against "never": the two rows are the only default
#      rows with cache_seqlens over several sequences, where the balanced split applies; are its shares the cost?
#      Rows: B=8 Hkv=8 32k D=128 full lengths in pages of 16 and contiguous, seed 71's row 2, seed 43's row 7, and
#      seed 73's row 0 (one long sequence among short ones, where the balanced split must win).
#   2. triton/decode's SPLIT_CTAS_PER_SM 2 (the default) against 3 (the CTAs an SM its D=128 tile fits): at B=64 Hkv=8
#      one split is 512 CTAs, 1.9 waves of two an SM but 1.3 of three; three splits fill 3.9. Rows: B=64 Hkv=8 D=128
#      at 4k and 32k, controls B=8 Hkv=8 32k, B=1 Hkv=8 128k, seed 71's row 6, seed 43's row 5, seed 89's row 2.
# Run from the project root carrying the CuTe DSL and FA4's wheels (the harness opens every decode rung): carry
# [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4", ".gpu/<this script>"], command
# `bash bench/decode_flashinfer_gap_ab.sh`. Outputs in $OUT: times.txt, gluon.log, triton.log and their folders.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" decode_flashinfer_gap_ab.sh runs/decode_flashinfer_gap_ab
source_carried_activations "$OUT/times.txt"
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$OUT/times.txt" 2>&1
status=0
SHAPE=73/3:batch=8,seqlen_k=32768,head_dim=128
knob_ab gluon 130 triton_impl.gluon.decode:BALANCED_SPLIT "'ragged-split','never'" gluon/decode \
  "$SHAPE,has_cache_seqlens=True,page_size=16,full" "$SHAPE,full" 71/2 43/7 73/0
knob_ab triton 150 triton_impl.decode:SPLIT_CTAS_PER_SM 2,3 triton/decode \
  73/3:batch=64,seqlen_k=4096,head_dim=128 73/3:batch=64,seqlen_k=32768,head_dim=128 "$SHAPE" \
  73/3:batch=1,seqlen_k=131072,head_dim=128 71/6 43/5 89/2
cat "$OUT/times.txt"
exit $status
