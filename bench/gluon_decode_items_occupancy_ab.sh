#!/usr/bin/env bash
# Issue #38's lowest gluon/decode row on an H100, seed 6007 row 4 (B=32 H=512 Hkv=32 Sq=8 Sk=4608 D=64, ragged
# 16..4292: 44 % of the read bandwidth, 123.7 us, where triton/decode and cute/decode read 54 %, 100.7 us;
# results/h100/decode-seeds-6007-6841-2026-12-06/), in one device call (about 240 s, Triton only: no carry needed).
# Its 2048 tiles of ~650 keys on average run on the items kernel, 264 CTAs (two an SM) of one consumer each, whose
# fixed costs a tile (Q, the first blocks' wait, O's normalisation and store) pass under only one other consumer's
# copies. ITEMS_CTAS_PER_SM (triton_impl/gluon/decode.py, off: untimed) {64: 3} makes D=64's ring 3 stages of 64 keys
# so that three CTAs fit an SM (396 CTAs, 80 registers at launch, spill-free). It moves the sweep's eight items-kernel
# rows; seven run here (not 93/4: 108/1's kind at 2.3 GB, whose fp64 checks would take the limit's time).
# Predicted (not measured): 6007/4 0.80-0.95x (about 100-117 us), the short-item rows (151/1, 23/2, 31/6) 0.85-1.0x,
# the rows of longer items (221/7, 196/0, 108/1) 0.95-1.05x (half the ring's stages a CTA, the same bytes in flight an
# SM); the control 39/1 (6007/4's 128 rows on one long sequence, the split kernel's two consumers) 1.00x.
# This call: the knob's GPU tests (fp64 on a poisoned output, the three-CTA plan checked), then bench.decode_knob_ab
# ({} against {64: 3}, 2 rounds, each value checked against fp64 first). Run from the project root:
# `bash bench/gluon_decode_items_occupancy_ab.sh`. Outputs in $OUT: times.txt, pytest.log, items_occupancy.log,
# items_occupancy/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" gluon_decode_items_occupancy_ab.sh runs/gluon_decode_items_occupancy_ab
decode_setup
status=0
gpu_tests 70 -n 3 tests/test_gluon_decode_items_occupancy.py
knob_ab items_occupancy 170 triton_impl.gluon.decode:ITEMS_CTAS_PER_SM '{},{64: 3}' gluon/decode \
  6007/4 151/1 31/6 23/2 221/7 196/0 108/1 39/1
cat "$OUT/times.txt"
exit $status
