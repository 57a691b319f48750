#!/usr/bin/env bash
# Issue #38's balanced grid past one wave (helper dec64; common/contract/splits.py's "The balanced grid past one wave")
# on one H200 in one device call (about 150 s; the limits sum to 175): BALANCED_SHALLOW_RING of gluon/decode
# (triton_impl.gluon._decode_balanced) and cute/decode, {} (the default: D=64's six-stage ring, two CTAs an SM, 264
# slots) against {64: 4} (a four-stage ring, three CTAs an SM, where the balanced grid takes more than one wave of 264
# slots and at most two).
#   1. bench.decode_knob_ab per rung, the values alternating over 2 rounds, each checked against fp64 on a poisoned
#      output first. Rows the knob changes: seed 73's row 2 (B=4 H=128 Hkv=32 Sq=16 D=64 ragged, 392 CTAs; triton 58.4,
#      gluon 80.7, cute 89.6 us), the same in pages of 32, seed 71's row 0 (B=8 Hkv=32 Sq=1 paged(128), 520 CTAs),
#      seed 41's row 3 (B=16 Hkv=16 Sq=16 paged(256), 520 CTAs). Controls the knob leaves (same plan, same kernel):
#      seed 73's row 0 (264 CTAs: one wave) and seed 43's row 2 (1552 CTAs: many waves);
#   2. the knob's GPU tests (tests/test_decode_shallow_ring.py -m gpu): both rungs with {64: 4} against fp64 on seed
#      73's row's kind (contiguous) and 71's (paged), the shallow ring checked to be the one launched.
# Run from the project root carrying the CuTe DSL and FA4's wheels (TVM-FFI, through which cute/decode launches):
# carry [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command `bash bench/decode_shallow_ring_ab.sh`.
# Outputs in $OUT: times.txt, gluon.log, cute.log and their folders (knob.csv, knob.md), pytest.log.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" decode_shallow_ring_ab.sh runs/decode_shallow_ring_ab
source_carried_activations "$OUT/times.txt"
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$OUT/times.txt" 2>&1
status=0
ROWS=(73/2 71/0 73/2:page_size=32 41/3 73/0 43/2)
knob_ab gluon 50 triton_impl.gluon._decode_balanced:BALANCED_SHALLOW_RING "{},{64: 4}" gluon/decode "${ROWS[@]}"
knob_ab cute 80 cute_impl.decode:BALANCED_SHALLOW_RING "{},{64: 4}" cute/decode "${ROWS[@]}"
gpu_tests 45 tests/test_decode_shallow_ring.py
cat "$OUT/times.txt"
exit $status
