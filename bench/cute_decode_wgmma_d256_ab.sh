#!/usr/bin/env bash
# Issue #38's D=256 rows of 64+ packed rows in cute/decode: seed 229 row 2 (B=2 H=64 Hkv=4 Sq=16 Sk=290304 D=256, 256
# packed rows, full cache, compute-bound) took cute 2092.0 us against triton 1663.7 / gluon 1206.9 (H200), its 64-row
# tiles on 4 warps' mma.sync. WGMMA_D256 (cute_impl/decode.py, off, untimed) puts them on one warpgroup's WGMMA
# (cute_impl/_decode_wgmma.py): sm_90a, a 64-key block 501 instructions a warp and 20 HGMMA against 837 and 256
# HMMA.16816 + 144 LDSM, 210 registers, 224 KB of shared memory (one CTA an SM) (docs/perf-log.md, "Helper `cwg256`").
# Predicted (docs/perf-log.md's model: D=128's one-CTA WGMMA chain, 107/0's 0.857 us a 64-key block, plus the second
# 512 tensor cycles of D=256): 229/2 2092 -> 1300-1450 us; the other rows of 128-256 packed rows 0.6-0.9x; the controls
# (229/3: 32 rows, 43/1: 16 rows, paged; the plan unchanged) 1.00x.
# This call: the switch's GPU tests (fp64 on a poisoned output, 64-256 packed rows at D=256, Sq 1/4/5/16, ragged, paged
# 16/64/128, forced and balanced splits, both causal alignments; a planted mask bug), then one A/B through
# bench.decode_knob_ab (False against True, 2 rounds, each value checked against fp64 first) on the eleven rows and the
# two controls, seed 229 row 2 first (the table is rewritten after every row: a cut run keeps the rows it finished).
# About 300 s.
# Run from the project root, carrying [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command
# `bash bench/cute_decode_wgmma_d256_ab.sh`. Outputs in $OUT: times.txt, pytest.log, wgmma_d256.log, wgmma_d256/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_decode_wgmma_d256_ab.sh runs/cute_decode_wgmma_d256_ab
decode_setup
status=0
gpu_tests 100 tests/test_cute_decode_wgmma_d256.py
knob_ab wgmma_d256 190 cute_impl.decode:WGMMA_D256 False,True cute/decode \
  229/2 62/4 67/7 169/4 161/5 160/7 170/2 27/3 96/1 42/7 222/1 229/3 43/1
cat "$OUT/times.txt"
exit $status
