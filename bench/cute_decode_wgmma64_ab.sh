#!/usr/bin/env bash
# Issue #38: cute/decode's WGMMA tile from 64 packed rows (WGMMA_MIN_ROWS 128 against 64). Seed 137 row 1 (80 packed
# rows, D=64) reads 36 % of the bandwidth on 4 warps' mma.sync and 62 % on the WGMMA tile (exploratory, 0.58x,
# results/h200/cute-decode-wgmma-64rows/). Here the sweeps' rows of 64-127 packed rows at D 64 and 128 (137/1, 137/3,
# 97/7, 127/6, 73/2, 61/0, 59/2, 89/3, 67/5), a Sq=1 control (137/7) and a 128-row one (107/0, on the WGMMA tile under
# both values), each value checked against fp64 on a poisoned output first, 2 rounds alternating; before it, the GPU
# tests of the WGMMA tile, those at 64-127 rows with the switch at 64 among them.
# Take-rule: every moved row at or under 1.00x (within 2 % where its padded split doubles), the controls level.
# Run from the project root, carrying [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command
# `bash bench/cute_decode_wgmma64_ab.sh`. About 400 s. Outputs in $OUT: times.txt, pytest.log, wgmma64.log, wgmma64/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_decode_wgmma64_ab.sh runs/cute_decode_wgmma64_ab
decode_setup
status=0
gpu_tests 170 -n 8 tests/test_cute_decode_wgmma.py
knob_ab wgmma64 380 cute_impl.decode:WGMMA_MIN_ROWS 128,64 cute/decode 137/1 97/7 73/2 137/3 127/6 61/0 59/2 89/3 \
  67/5 137/7 107/0
cat "$OUT/times.txt"
exit $status
