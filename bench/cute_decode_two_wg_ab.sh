#!/usr/bin/env bash
# Issue #38's 128-256 packed rows at D=128 in cute/decode: seed 233 row 5 (B=4 H=512 Hkv=32 Sq=16 Sk=22016 D=128,
# 256 packed rows, full cache, compute-bound) took cute 789.4 us against gluon's 656.0 with its two consumers (H200,
# 2026-12-04), each 64-row M tile its own one-warpgroup CTA (two an SM). WGMMA_TWO_WARPGROUPS (cute_impl/decode.py, off;
# untimed) puts two M tiles in one CTA of two warpgroups sharing one K/V ring of 6 stages (cute_impl/_decode_wgmma.py,
# "Two warpgroups"; sm_90a: 186 registers, no spills, 224 KB + 1 KB, one CTA an SM; docs/perf-log.md, "Helper `cwg2`").
# Predicted (docs/perf-log.md's model): 233/5 789 -> 680-750 us, the other rows of 128-256 packed rows 0.85-1.05x; the
# controls (59/2: 64 rows paged, balanced; 137/1: 80 rows at D=64; plans unchanged) 1.00x.
# This call: the switch's GPU tests (fp64 on a poisoned output, 128-320 packed rows, Sq 8/16, full and ragged, paged
# 16/64, forced splits and the rule's, both causal alignments, odd M tiles, the LSE; a planted rows bug), then one A/B
# through bench.decode_knob_ab (off against on, 2 rounds, each value checked against fp64 first) on the ten rows and
# the two controls, seed 233 row 5 first (the table is rewritten after every row: a cut run keeps the rows it
# finished). About 280 s.
# Run from the project root, carrying [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command
# `bash bench/cute_decode_two_wg_ab.sh`. Outputs in $OUT: times.txt, pytest.log, two_wg.log, two_wg/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_decode_two_wg_ab.sh runs/cute_decode_two_wg_ab
decode_setup
status=0
gpu_tests 120 tests/test_cute_decode_two_wg.py
knob_ab two_wg 150 cute_impl.decode:WGMMA_TWO_WARPGROUPS 'False,True' cute/decode \
  233/5 139/1 200/4 18/2 107/0 79/1 157/4 204/4 54/7 171/0 59/2 137/1
cat "$OUT/times.txt"
exit $status
