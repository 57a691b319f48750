#!/usr/bin/env bash
# Issue #38's balanced split with one long item (helper cap; triton_impl/gluon/_decode_balanced.py's two-level merge)
# on one H200 in one device call (about 140 s; the limits sum to 145): BALANCED_MERGE_GROUP of gluon/decode, 0 (the
# default: the item's last share merges all its shares, at most BALANCED_MAX_ITEM_SHARES = 32 of them) against 8 (runs
# of 8 shares merged by each run's last share, then the runs by the item's last run; an item takes up to 32 runs).
# Rows run in order of interest, each written as it ends (a cut run keeps the first).
#   1. bench.decode_knob_ab, the values alternating over 2 rounds, each checked against fp64 on a poisoned output
#      first. Rows the knob changes: seed 73's row 0 (B=4 Hkv=2 Sq=1 D=64 paged(64) ragged, its 164677-key sequence
#      32 capped shares of 81 key blocks -> 78 of 33; 72.5 us), seed 43's rows 1 (B=8 MQA D=256 paged(128), 94.1) and
#      4 (B=3 Hkv=4 Sq=4 D=256, 98.1), seed 59's row 1 (B=32 Hkv=2 Sq=2 D=128 paged(16), 135.6: the model's loss).
#      Controls (no item past 8 shares; the kernel is compiled with runs, the plan the same): seed 73's row 2 (392
#      CTAs, at most 4 shares an item) and seed 43's row 2 (1552 CTAs, at most 5);
#   2. the knob's GPU tests (tests/test_decode_merge_group.py -m gpu): runs of 8 against fp64 and 20 launches bit for
#      bit on one long sequence among short ones (D=64 contiguous and paged(32), D=256 MQA Sq=8, two M tiles at
#      D=128), and seed 73's row 0 itself.
# Run from the project root carrying the CuTe DSL and FA4's wheels (the harness opens every decode rung): carry
# [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command `bash bench/decode_merge_group_ab.sh`.
# Outputs in $OUT: times.txt, gluon.log and its folder (knob.csv, knob.md), pytest.log.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" decode_merge_group_ab.sh runs/decode_merge_group_ab
source_carried_activations "$OUT/times.txt"
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$OUT/times.txt" 2>&1
status=0
knob_ab gluon 95 triton_impl.gluon._decode_balanced:BALANCED_MERGE_GROUP 0,8 gluon/decode 73/0 43/1 43/4 73/2 59/1 43/2
gpu_tests 50 tests/test_decode_merge_group.py
cat "$OUT/times.txt"
exit $status
