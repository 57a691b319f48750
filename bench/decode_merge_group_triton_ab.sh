#!/usr/bin/env bash
# Issue #38's two-level merge in triton/decode (triton_impl/decode.py's BALANCED_MERGE_GROUP; the merge in
# _decode_merge.store_balanced_partials) on one H200 in one device call (about 200 s; the limits sum to 220): 0 (one
# level: the item's last share merges all its shares, one dependent chain) against 8 (runs of 8 shares merged by each
# run's last share, then the runs by the item's last run). triton/decode caps no item's shares, so the plan is the same
# either way: only the merge changes. Rows run in order of interest, each written as it ends (a cut run keeps the first).
#   1. bench.decode_knob_ab, the values alternating over 2 rounds, each checked against fp64 on a poisoned output
#      first. Rows whose long item takes more than 8 shares (its shares in brackets): seed 73's row 0 (B=4 Hkv=2 Sq=1
#      D=64 paged(64) ragged [81]; 60.5 us, 50 % of the read bandwidth), seed 43's rows 1 (B=8 MQA D=256 paged [155])
#      and 4 (B=3 Hkv=4 Sq=4 D=256 [63]), seed 59's row 1 (B=32 Hkv=2 Sq=2 D=128 paged(16) [45]), seed 71's rows 7
#      (B=16 MQA Sq=8 D=256 [62]) and 3 (B=2 MQA D=64 502k [15]); seed 43's row 2 (B=64, [9]: one run of 8 and one of
#      1, the least the runs can gain); control seed 73's row 2 (at most 4 shares an item: the kernel compiled with
#      runs, no run taken).
#   2. the knob's GPU tests (tests/test_decode_merge_group.py -m gpu, triton's and gluon's): runs of 8 against fp64 and
#      20 launches bit for bit on one long sequence among short ones (D=64 contiguous and paged(32), D=256 MQA Sq=8, two
#      M tiles at D=128), and seed 73's row 0 itself.
# Run from the project root carrying the CuTe DSL and FA4's wheels (the harness opens every decode rung): carry
# [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command `bash bench/decode_merge_group_triton_ab.sh`.
# Outputs in $OUT: times.txt, triton.log and its folder (knob.csv, knob.md), pytest.log.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" decode_merge_group_triton_ab.sh runs/decode_merge_group_triton_ab
source_carried_activations "$OUT/times.txt"
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$OUT/times.txt" 2>&1
status=0
knob_ab triton 130 triton_impl.decode:BALANCED_MERGE_GROUP 0,8 triton/decode 73/0 43/1 43/4 59/1 71/7 71/3 43/2 73/2
gpu_tests 90 tests/test_decode_merge_group.py
cat "$OUT/times.txt"
exit $status
