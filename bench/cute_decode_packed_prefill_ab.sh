#!/usr/bin/env bash
# Issue #38's compute-bound class in cute/decode: seed 233 row 5 (B=4 H=512 Hkv=32 Sq=16 Sk=22016 D=128, 256 packed
# rows, full cache, 256 FLOPs a K/V byte) took cute 789.4 us, 41 % of the read bandwidth (63 % of the roofline), on the
# WGMMA tile's one-chain loop (about 470 TFLOP/s), where cute/hopper's prefill loop runs at 670-690 (P1).
# PACKED_PREFILL_MIN_ROWS (cute_impl/decode.py, off; untimed) runs a contiguous cache of that many packed rows or more on
# cute/hopper's persistent kernel, q packed as (B, Hkv, group · Sq, D) by a copy before the launch, O and the LSE
# written in place, each row's causal diagonal its token's (HopperAttentionConfig.packed_group), where its 128-row tiles
# fill 90 % of the grid's waves (docs/perf-log.md, 2026-12-05). Predicted: 233/5 789 -> 560-640 us (0.71-0.81x; the
# kernel at 600-650 TFLOP/s and the copy of q, 8 MB, about 5 us), the other rows of 256 packed rows 0.7-0.9x, those of
# 128 rows 0.8-1.05x (128 FLOPs a byte: the split kernels are nearer the bandwidth there); the two controls (139/1: 32
# tiles; 107/0: 64 tiles, both short of a wave) 1.00x.
# This call: the switch's GPU tests (fp64 on a poisoned output: 128-256 packed rows, D=64 and 128, Sq 1/5/8/16, full,
# ragged and lengths below Sq, both causal alignments and none, two and three warpgroups, the LSE; planted, the kernel
# without the packing), then one A/B through bench.decode_knob_ab (off, 128 and 256 rows, 2 rounds, each value checked
# against fp64 first) on eleven rows it takes at 128 and the two controls, seed 233 row 5 first (the table is rewritten
# after every row: a cut run keeps the rows it finished). About 400 s.
# Run from the project root, carrying [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command
# `bash bench/cute_decode_packed_prefill_ab.sh`. Outputs in $OUT: times.txt, pytest.log, packed_prefill.log,
# packed_prefill/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_decode_packed_prefill_ab.sh runs/cute_decode_packed_prefill_ab
decode_setup
status=0
gpu_tests 120 -n 8 tests/test_cute_decode_packed_prefill.py
knob_ab packed_prefill 240 cute_impl.decode:PACKED_PREFILL_MIN_ROWS 'None,128,256' cute/decode \
  233/5 176/6 157/4 204/4 140/1 62/1 100/4 214/0 231/6 69/4 18/2 139/1 107/0
cat "$OUT/times.txt"
exit $status
