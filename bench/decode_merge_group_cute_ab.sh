#!/usr/bin/env bash
# Issue #38's balanced split with one long item in cute/decode (cute_impl/decode.py's two-level merge) on one H200 in
# one device call (about 180 s; the limits sum to 180): BALANCED_MERGE_RUNS of cute/decode, 0 (one chain: the merge
# kernel's thread merges all of an item's partials, at most BALANCED_MAX_ITEM_SHARES = 48 of them) against 8 (the
# default: the item's partials cut into up to 8 runs of consecutive slabs, each merged by its own threads, the runs
# merged in run order through shared memory; an item takes up to 48 slabs a run; fewer runs where the merge grid passes
# a wave of threads). Rows run in order of interest, each written as it ends (a cut run keeps the first).
#   1. bench.decode_knob_ab, the values alternating over 2 rounds, each checked against fp64 on a poisoned output
#      first. Rows the knob changes: seed 73's row 0 (B=4 Hkv=2 Sq=1 D=64 paged(64) ragged, its 164677-key sequence
#      48 capped shares of 54 key blocks -> 78 of 33 in 8 runs; 61.5 us; bench/decode_ragged_model.py 50.7 -> 47.0),
#      seed 43's rows 1 (B=8 MQA D=256 paged(128), 48 shares -> 71; model 65.0 -> 59.2) and 4 (B=3 Hkv=4 Sq=4 D=256,
#      29 shares in 8 runs; 70.7 -> 68.0), seed 59's row 1 (B=32 Hkv=2 Sq=2 D=128 paged(16), 34 shares in 8 runs;
#      111.8 -> 108.2: gluon's loss, here no plan change). Controls: seed 73's row 2 (128 items of 64 rows: 2 runs, at
#      most 4 shares an item; model level) and seed 43's row 2 (1024 items: one run, the kernel and plan unchanged);
#   2. the knob's GPU tests (tests/test_decode_merge_group_cute.py -m gpu): runs of 8 and one chain against fp64 and
#      20 launches bit for bit on one long sequence among short ones (D=64 contiguous and paged(32), D=256 MQA Sq=8,
#      two M tiles at D=128), seed 73's row 0 itself, and a planted run one slab short that must fail.
# Run from the project root carrying the CuTe DSL and FA4's wheels (the harness opens every decode rung): carry
# [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command `bash bench/decode_merge_group_cute_ab.sh`.
# Outputs in $OUT: times.txt, cute.log and its folder (knob.csv, knob.md), pytest.log.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" decode_merge_group_cute_ab.sh runs/decode_merge_group_cute_ab
source_carried_activations "$OUT/times.txt"
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$OUT/times.txt" 2>&1
status=0
knob_ab cute 100 cute_impl.decode:BALANCED_MERGE_RUNS 0,8 cute/decode 73/0 43/1 43/4 73/2 59/1 43/2
gpu_tests 80 tests/test_decode_merge_group_cute.py
cat "$OUT/times.txt"
exit $status
