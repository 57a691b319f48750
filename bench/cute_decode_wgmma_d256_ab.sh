#!/usr/bin/env bash
# Issue #38's D=256 rows of 64+ packed rows in cute/decode: seed 229 row 2 (B=2 H=64 Hkv=4 Sq=16 Sk=290304 D=256, 256
# packed rows, full cache, compute-bound) took cute 2092.0 us against triton 1663.7 / gluon 1206.9 (H200), its 64-row
# tiles on 4 warps' mma.sync. WGMMA_D256 (cute_impl/decode.py, None: off; untimed) puts them on one warpgroup's WGMMA
# (cute_impl/_decode_wgmma.py), on one of two 224 KB rings (one CTA an SM): (64, 3), TILE_CONFIGS', the one chain a
# block (sm_90a: 210 registers, a 64-key block 501 instructions a warp and 20 HGMMA against the mma.sync tile's 837 and
# 256 HMMA.16816 + 144 LDSM), or (32, 6), overlapped (211 registers) (docs/perf-log.md, "Helper `cwg256`").
# Predicted (docs/perf-log.md's model: D=128's one-CTA WGMMA chain, 107/0's 0.857 us a 64-key block, plus the second
# 512 tensor cycles of D=256): 229/2 2092 -> 1300-1450 us at (64, 3), less at (32, 6) if its overlap pays as D=64's
# did; the other rows of 128-256 packed rows 0.6-0.9x; the controls (229/3: 32 rows, 43/1: 16 rows, paged; the plan
# unchanged) 1.00x.
# This call: the switch's GPU tests (fp64 on a poisoned output, 64-256 packed rows at D=256, Sq 1/4/5/16, ragged, paged
# 16/64/128, forced and balanced splits, both causal alignments, both rings; a planted mask bug), then one A/B through
# bench.decode_knob_ab (None against both rings, 2 rounds, each value checked against fp64 first) on the eleven rows
# and the two controls, seed 229 row 2 first (the table is rewritten after every row: a cut run keeps the rows it
# finished). About 300 s.
# Run from the project root, carrying [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command
# `bash bench/cute_decode_wgmma_d256_ab.sh`. Outputs in $OUT: times.txt, pytest.log, wgmma_d256.log, wgmma_d256/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_decode_wgmma_d256_ab.sh runs/cute_decode_wgmma_d256_ab
decode_setup
status=0
gpu_tests 120 tests/test_cute_decode_wgmma_d256.py
knob_ab wgmma_d256 180 cute_impl.decode:WGMMA_D256 'None,(64,3),(32,6)' cute/decode \
  229/2 62/4 67/7 169/4 161/5 160/7 170/2 27/3 96/1 42/7 222/1 229/3 43/1
cat "$OUT/times.txt"
exit $status
