#!/usr/bin/env bash
# Issue #38: gluon/decode's paged row of the default `compare.py --decode` (B=8 Hkv=8 32k D=128 in pages of 16: 326.1 us
# against FlashInfer's 254.2 and its own contiguous 246.0, H200, 2026-12-01). In SASS (sm_90a) each 128-key block is
# eight 16-key TMA copies of K and of V whose coordinates wait on table loads issued at the refill, after the step's
# last wgmma wait. PAGE_ENTRIES_AHEAD (True) issues those loads at the top of the step instead, their latency under
# the step's wgmmas and softmax. One A/B through bench.decode_knob_ab (False against True, 2 rounds, each value checked
# against fp64 on a poisoned output first) on the default paged row in pages of 16, 32 and 64, its contiguous twin
# (a control: the switch is off there), and the random sweep's paged rows of pages of 16 and 32 (seeds 89, 59, 67, 61,
# 73, 37: D=64, 128 and 256). About 300 s.
# Run from the project root carrying [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"] (the harness opens
# every decode rung), command `bash bench/gluon_paged_ahead_ab.sh`. Outputs in $OUT: times.txt, ahead.log, ahead/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" gluon_paged_ahead_ab.sh runs/gluon_paged_ahead_ab
source_carried_activations "$OUT/times.txt"
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$OUT/times.txt" 2>&1
status=0
SHAPE=73/3:batch=8,seqlen_k=32768,head_dim=128
knob_ab ahead 420 triton_impl.gluon.decode:PAGE_ENTRIES_AHEAD False,True gluon/decode \
  "$SHAPE,has_cache_seqlens=True,page_size=16,full" "$SHAPE,has_cache_seqlens=True,page_size=32,full" \
  "$SHAPE,has_cache_seqlens=True,page_size=64,full" "$SHAPE,full" 89/1 59/1 67/1 61/1 73/4 37/3
cat "$OUT/times.txt"
exit $status
