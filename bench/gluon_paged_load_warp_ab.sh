#!/usr/bin/env bash
# Issue #38: gluon/decode's paged row of the default `compare.py --decode` (B=8 Hkv=8 32k D=128 in pages of 16: 306.2 us,
# FlashInfer 254.4; H200, 2026-12-01 seventh stop). Its warpgroup issues each 16-key page's TMA copy itself, and
# Triton's shared-memory barrier pass puts a CTA barrier between two copies into one ring slot (sm_90a, Triton 3.6:
# key loop 1306 SASS, 10 barriers, 16 UTMALDG, against the contiguous build's 927 and 6). A cp.async gather in the
# warpgroup lost twice (2026-12-02, results/h200/gluon-paged-gather/). PAGED_LOAD_WARP gives the copies to a warp of
# its own, each block's as the warpgroup frees its slot (an empty barrier a slot): the warpgroup's key loop is 859
# SASS with 2 barriers and no copy. This call: the load warp's GPU tests and every gluon/decode paged GPU test (fp64
# checks, planted paging bugs, bit equality with the contiguous build), then one A/B through bench.decode_knob_ab
# (False against True, 2 rounds, each value checked against fp64 on a poisoned output first): the default paged row in
# pages of 16, 32 and 64, its contiguous twin (a control), the random sweep's paged rows where the warp engages (seeds
# 89, 59, 61, 101) and one where it does not (67/1: a 1.8k cache, two CTAs an SM); then `compare.py --decode` of
# gluon/decode and FlashInfer with the switch on (FlashInfer where stashed). About 250 s.
# Run from the project root after `bash .gpu/flashinfer/stash.sh` in a call just before, carrying
# [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4", ".gpu/flashinfer/activate.sh"], command
# `bash bench/gluon_paged_load_warp_ab.sh`. Outputs in $OUT: times.txt, pytest.log, load_warp.log, load_warp/,
# decode.tgz.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" gluon_paged_load_warp_ab.sh runs/gluon_paged_load_warp_ab
decode_setup
status=0
gpu_tests 150 -n 4 tests/test_paged_kv.py tests/test_gluon_decode*.py -k "gluon or load_warp"
SHAPE=73/3:batch=8,seqlen_k=32768,head_dim=128
knob_ab load_warp 300 triton_impl.gluon.decode:PAGED_LOAD_WARP False,True gluon/decode \
  "$SHAPE,has_cache_seqlens=True,page_size=16,full" "$SHAPE,has_cache_seqlens=True,page_size=32,full" \
  "$SHAPE,has_cache_seqlens=True,page_size=64,full" "$SHAPE,full" 89/1 59/1 61/1 101/0 67/1
decode_with_knob 120 triton_impl.gluon.decode:PAGED_LOAD_WARP "paged"
cat "$OUT/times.txt"
exit $status
