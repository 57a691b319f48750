#!/usr/bin/env bash
# Issue #38's seed 127 row 5 in triton/decode (H200, Triton 3.6, 2026-12-02): B=16 H=20 Hkv=4 Sq=8 Sk=43520 D=128
# paged(256) ragged, 40 packed rows a KV head on the 64-row tile: triton 76.4 us, gluon 70.4, cute 75.1. The tile's build
# holds two CTAs an SM (253 registers, 115712 bytes), the balanced target counts three and keeps the per-SM 264 shares:
# 296 working CTAs on 264 slots. BALANCED_BUILD_FIT (triton_impl/decode.py) caps the target at one wave of the build's
# slots less the items, 200 (gluon/decode's plan), on D=128's 17-64-row tiles with at most 88 items; no build changes
# (docs/perf-log.md, "Helper `tfit`").
# Predicted (False -> True): 127/5 76.4 -> 65-71 us; 67/5 (contiguous, 64 rows; 69.8 at 2026-12-01) 0.93-0.98x; 68/2,
# 48/3 and 84/7 (long caches, the fluid model's 0.76-0.82x at two CTAs an SM, 0.99-1.00x at three) 0.80-1.00x; 81/7
# 0.89-0.98x; controls 127/2 (D=64, 32 rows: three CTAs an SM of four counted, the per-SM grid fits them)
# and 61/0 (D=128, 64 rows, 96 items: past the one-wave branch), neither moved, 1.00x.
# This call: the switch's GPU tests (fp64 on a poisoned output, pages of 256 and 16, contiguous fp16, ragged with an
# empty sequence, the bound launch's target, a planted share-boundary bug in a fresh process), then one A/B through
# bench.decode_knob_ab (False against True, 2 rounds, each value checked against fp64 first) on the six rows it moves
# and the two controls. About 110 s (limits 60 + 85 s).
# Run from the project root, carrying [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command
# `bash bench/triton_decode_build_fit_ab.sh`. Outputs in $OUT: times.txt, pytest.log, fit.log, fit/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" triton_decode_build_fit_ab.sh runs/triton_decode_build_fit_ab
decode_setup
status=0
gpu_tests 60 tests/test_triton_decode_build_fit.py
knob_ab fit 85 triton_impl.decode:BALANCED_BUILD_FIT False,True triton/decode \
  127/5 67/5 68/2 48/3 84/7 81/7 127/2 61/0
cat "$OUT/times.txt"
exit $status
