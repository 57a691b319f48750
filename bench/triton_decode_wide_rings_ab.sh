#!/usr/bin/env bash
# Issue #38's compute-bound rows in triton/decode: 128-256 packed rows a KV head read 40 % of the read bandwidth at
# seed 233's row 5 (B=4 Hkv=32 group 16 Sq=16 22k D=128: 62 % of the roofline that counts its FLOPs; H200,
# 2026-12-04), where gluon/decode's two consumers reach 78 %. WIDE_CONTIGUOUS_RINGS (triton_impl/decode.py, off;
# untimed) gives the wide tile (128 rows, 8 warps, one CTA an SM) 128-key blocks on a contiguous cache: sm_90a, the
# unmasked key loop's instructions a warp fall 1064 -> 934 for 128 keys at D=128 under Triton 3.6 (tensor cycles 1024:
# issue-bound -> tensor-bound), 918 -> 812 at D=64 (docs/perf-log.md, sixteenth stop).
# Predicted: 0.88-0.95x the time on the D=128 rows of 128-256 packed rows, 0.90-0.97x on the D=64 ones; paged rows
# (59/2) and rows of 64 packed rows or fewer (61/3, 73/3) unchanged (the same plan: the controls).
# This call: the knob's GPU tests (fp64 on a poisoned output at 256 rows of D=128 full and top-left, 128 rows of D=64
# ragged), then one A/B through bench.decode_knob_ab (off, D=128 at two stages and D=64 at three, then D=128 at three
# stages; 2 rounds, each value checked against fp64 first), seed 233's row 5 first (the table rewritten after every row: a cut run keeps the rows it finished). About 300 s.
# Run from the project root (carry [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"] for decode_setup's
# activations), command `bash bench/triton_decode_wide_rings_ab.sh`. Outputs in $OUT: times.txt, pytest.log,
# wide_rings.log, wide_rings/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" triton_decode_wide_rings_ab.sh runs/triton_decode_wide_rings_ab
decode_setup
status=0
gpu_tests 60 tests/test_triton_decode_wide_rings.py
# The ring is the wide tile's; since 2026-12-06 D=64 takes 64-row tiles by default, so the A/B holds the wide tile
# at D=64 as it was when this ran (results/h200/decode-wide-rings-2026-12-05/).
export KNOB_AB_SET="triton_impl.decode:WIDE_M_TILE_HEAD_DIMS=(64,128)"
knob_ab wide_rings 240 triton_impl.decode:WIDE_CONTIGUOUS_RINGS \
  '{},{64: (128, 3), 128: (128, 2)},{64: (128, 3), 128: (128, 3)}' triton/decode \
  233/5 139/1 200/4 18/2 79/1 157/4 204/4 54/7 171/0 103/0 41/1 137/1 93/4 149/4 59/2 61/3 73/3
cat "$OUT/times.txt"
exit $status
