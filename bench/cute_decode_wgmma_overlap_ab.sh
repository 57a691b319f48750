#!/usr/bin/env bash
# Issue #38, the WGMMA tile's next step: the overlap (cute_impl/_decode_wgmma.py, attend_overlapped_block; cute/hopper's
# next_block): each key block's S = Q K^T issued with the previous block's O += P V, its softmax run while that P V is
# on the tensor cores, P in two register buffers by step parity, the ring one block shallower (3 stages at D=128: one
# block in flight). sm_90a (docs/perf-log.md, "Helper `cutewg3`"): D=128 186 registers, no spill, two CTAs an SM, 52
# of a two-block loop's 68 exp2 issued with a wgmma in flight (0 of 34 off); D=64 148 registers, 34 of 68.
# Predicted: 107/0 209.7 -> 195-212 us (its 4 M tiles already pull ~6.9 TB/s from L2, triton's 7.0), 103/0 ~400 ->
# 370-420, 107/0 paged(64) 256.7 -> 215-250, 41/1 72.0 -> 0.95-1.02x, 31/6 160.3 -> 0.92-1.00x, the controls (59/2,
# 107/0 at Sq=1: the mma.sync tile, SASS hashed equal) 1.00x.
# This call: the switch's GPU tests (fp64 on a poisoned output, 128-256 packed rows at D=64 and 128, Sq 5, ragged,
# paged, forced and balanced splits, splits with and without a step left over after the loop; a planted dropped last
# block), then one A/B through bench.decode_knob_ab (False against True, 2 rounds, each value checked against fp64
# first). Limits 190 s; about 100 s expected (the WGMMA A/B's 5 GPU tests took 29 s, its 7-row A/B 65 s).
# Run at b6bf78a as WGMMA_OVERLAP False,True (results/h200/cute-decode-wgmma-overlap/); the switch became the rule
# WGMMA_OVERLAP_MIN_STAGES (4), and 0,3 are the same two settings (never; every WGMMA ring).
# Run from the project root, carrying [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command
# `bash bench/cute_decode_wgmma_overlap_ab.sh`. Outputs in $OUT: times.txt, pytest.log, overlap.log, overlap/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_decode_wgmma_overlap_ab.sh runs/cute_decode_wgmma_overlap_ab
decode_setup
status=0
gpu_tests 80 -n 4 tests/test_cute_decode_wgmma_overlap.py
knob_ab overlap 110 cute_impl.decode:WGMMA_OVERLAP_MIN_STAGES 0,3 cute/decode \
  107/0 103/0 41/1 31/6 107/0:page_size=64 59/2 107/0:seqlen_q=1
cat "$OUT/times.txt"
exit $status
