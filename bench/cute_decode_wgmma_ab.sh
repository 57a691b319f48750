#!/usr/bin/env bash
# Issue #38's compute-bound class in cute/decode: 128+ packed rows a KV head, where its 64-row tiles of 4 warps' mma.sync
# trail the WGMMA rungs (H200: seed 107 row 0, B=1 H=512 Hkv=32 Sq=16 D=128, 256 rows on a 21949-key cache, cute 364.8
# against triton 205.5 / gluon 215.0 us; seed 103 row 0, 128 rows, B=32 Sk=2304, 532.5 against 371.3 / 384.6).
# WGMMA_MIN_ROWS (cute_impl/_decode_wgmma.py) puts those 64-row tiles on one warpgroup's WGMMA: sm_90a, a 64-key block
# 349 instructions a warp and 12 HGMMA against 534 and 128 HMMA.16816 (docs/perf-log.md, "Helper `cutewg`").
# Predicted: 107/0 364.8 -> 200-250 us; 103/0 532.5 -> 360-420; 41/1 and 31/6 (D=64, 128 rows) 0.75-1.0x; the
# controls (59/2: 64 rows; 107/0 at Sq=1: 16 rows; the plan unchanged) 1.00x.
# This call: the switch's GPU tests (fp64 on a poisoned output, 128-256 packed rows at D=64 and 128, Sq 5, ragged,
# paged, forced and balanced splits; a planted mask bug), then one A/B through bench.decode_knob_ab (0 against 128,
# 2 rounds, each value checked against fp64 first) on the two rows, two D=64 rows of 128 packed rows, 107/0 paged(64),
# and the controls. About 400 s.
# Run from the project root, carrying [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command
# `bash bench/cute_decode_wgmma_ab.sh`. Outputs in $OUT: times.txt, pytest.log, wgmma.log, wgmma/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_decode_wgmma_ab.sh runs/cute_decode_wgmma_ab
decode_setup
status=0
gpu_tests 150 tests/test_cute_decode_wgmma.py
knob_ab wgmma 330 cute_impl.decode:WGMMA_MIN_ROWS 0,128 cute/decode \
  107/0 103/0 41/1 31/6 107/0:page_size=64 59/2 107/0:seqlen_q=1
cat "$OUT/times.txt"
exit $status
