#!/usr/bin/env bash
# Issue #38's lowest rows: D=256 with more than 64 packed rows (group · Sq), where triton/decode and cute/decode read
# 18 % of the bandwidth on seed 67's rows 0 and 7 (256 packed rows) and gluon/decode's 64-row wgmma tiles 35-38 %
# (results/h200/decode-random-seed67-2026-12-01/). Two knobs, one device call (about 300 s on an H200):
#   1. triton/decode's WGMMA_D256_CONTIGUOUS_ALL_ROWS (on since this A/B): off (past 64 rows, WIDE_D256's 128-row tile
#      of 8 warps and 16-key blocks) against on (past 64 rows of a contiguous cache, the 64-row wgmma tile of one
#      warpgroup, 32-key blocks, 4 stages, cut into 64-row M tiles). Its first run (results/h200/decode-d256-many-rows/)
#      timed the knob it replaced, the most rows the wgmma tile takes, 64 against 4096, paged and contiguous: the wgmma
#      tile won contiguous and lost paged, hence the switch. The paged rows here are controls (the same plan both ways);
#   2. cute/decode's _decode_warps.WIDE_M_TILES: {128: 64} (the default before this A/B: D=256's tiles of 32 rows, 2 x
#      2 warps) against {128: 64, 256: 64} (the default since: D=256's 64-row tile, 4 warps of 16 rows: 252 registers,
#      no spill, 225 KiB of shared memory, one CTA an SM; half the M tiles, each K/V block copied to shared memory half
#      as often).
# Rows (bench.decode_knob_ab, the values alternating over 2 rounds, each checked against fp64 on a poisoned output
# first): seed 67's rows 0 and 7 (256 rows, ragged and full), seed 47's row 4 and seed 53's row 1 (128 rows, paged; for
# triton also contiguous), and for cute seed 53's row 0 and seed 47's row 6 (64 rows: one M tile, not two). Then
# gluon/decode's seed 67 row 4 (B=3 Hkv=16 6656 D=128), which read 73.6 us on 2026-12-01 against 55.2 two days earlier
# with the same plan: timed again beside triton and cute under a knob that touches none of them there (its two values
# are two re-timings).
# Run from the project root, carrying the CuTe DSL and FA4's wheels (TVM-FFI, through which the CuTe rungs launch):
# carry [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command
# `bash bench/decode_d256_many_rows_ab.sh`. Outputs in $OUT: times.txt, triton.log, cute.log, gluon.log and their
# folders (knob.csv, knob.md).
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" decode_d256_many_rows_ab.sh runs/decode_d256_many_rows_ab
source_carried_activations "$OUT/times.txt"
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$OUT/times.txt" 2>&1
status=0
knob_ab triton 150 triton_impl.decode:WGMMA_D256_CONTIGUOUS_ALL_ROWS False,True triton/decode 67/0 67/7 47/4 53/1 \
  47/4:page_size=0 53/1:page_size=0
knob_ab cute 150 cute_impl._decode_warps:WIDE_M_TILES "{128: 64},{128: 64, 256: 64}" cute/decode \
  67/0 67/7 47/4 53/1 53/0 47/6
knob_ab gluon 60 triton_impl.decode:WGMMA_D256_CONTIGUOUS_ALL_ROWS False,True \
  gluon/decode,triton/decode,cute/decode 67/4
cat "$OUT/times.txt"
exit $status
