#!/usr/bin/env bash
# Issue #38's rows of many packed rows but few tiles in cute/decode: 36 rows of the random sweep (seeds 1-239) have 128+
# packed rows a KV head on a contiguous cache, but their 128-row tiles fill less than 90 % of the grid's waves (B·Hkv
# small, long caches: 139/1 B=2 Hkv=8 Sq=16 Sk=32256, 32 tiles; 107/0 B=1 Hkv=32 Sk=40448 with lengths, 64 tiles), so
# PACKED_PREFILL_MIN_ROWS's packed prefill leaves them on the split kernels. PACKED_PREFILL_SPLITS (cute_impl/decode.py,
# off; untimed) splits their keys inside cute/hopper's kernel (HopperAttentionConfig.key_splits, FlashAttention-3's
# num_splits: the fewest splits whose tiles fill 90 % of the waves, at least 4 key blocks a split), fp32 partials from
# the registers, then cute/decode's merge kernel (docs/perf-log.md, 2026-12-05, eighteenth stop). Held for the whole
# run: PACKED_PREFILL_MIN_ROWS=128. Predicted (a prediction, not a measurement): the 256-row rows 0.80-0.90x (139/1,
# 107/0, 99/7, 200/4: cute/hopper's loop at 600-650 TFLOP/s against the WGMMA tile's ~470, less the partials' write
# and merge, 4-8 MB, and the copy of q); the 128-row rows (56/6 at D=64, 14/7 on 15 splits, 228/0 on 60) 0.95-1.05x
# (128 FLOPs a K/V byte: the split kernels already run near the bandwidth); the controls (233/5: its 256 tiles fill the
# waves unsplit; 103/2: 32 packed rows) 1.00x, the same plan.
# This call: the splits' GPU tests (fp64 on a poisoned output: 128-256 packed rows, D=64 and 128, Sq 1/5/8/16, full,
# ragged and lengths below Sq, both causal alignments and none, splits 2-8, two and three warpgroups, the LSE;
# planted, a split boundary off by one and the merge's weights in log2 units), then one A/B through
# bench.decode_knob_ab (False, True; 2 rounds, each value checked against fp64 first) on seven rows it takes and the
# two controls, 139/1 first (the table is rewritten after every row: a cut run keeps the rows it finished). About 290 s.
# Run from the project root, carrying [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command
# `bash bench/cute_decode_packed_splits_ab.sh`. Outputs in $OUT: times.txt, pytest.log, packed_splits.log,
# packed_splits/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_decode_packed_splits_ab.sh runs/cute_decode_packed_splits_ab
decode_setup
status=0
gpu_tests 130 -n 8 tests/test_cute_decode_packed_splits.py
export KNOB_AB_SET="cute_impl.decode:PACKED_PREFILL_MIN_ROWS=128"
knob_ab packed_splits 150 cute_impl.decode:PACKED_PREFILL_SPLITS 'False,True' cute/decode \
  139/1 107/0 99/7 200/4 56/6 14/7 228/0 233/5 103/2
cat "$OUT/times.txt"
exit $status
