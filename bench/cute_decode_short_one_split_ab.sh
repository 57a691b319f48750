#!/usr/bin/env bash
# Issue #38's short ragged caches in cute/decode: seed 5309 row 1 (B=32 H=256 Hkv=32 Sq=4 Sk=1792 D=128
# paged(64), cache lengths 20..1351, 32 packed rows) read 53 % of the read bandwidth in cute/decode (93.3 us) against
# 66 % in triton/decode and gluon/decode (75.5, 75.4) on an H100 (2026-12-06,
# results/h100/decode-fresh-seeds-2026-12-06c/). cute's split rule splits the 1024 (sequence, KV head) items in two,
# so "ragged-split-long" gives them the balanced split (528 target shares, 1552 CTAs and the merges); gluon's rule
# keeps a short cache whose items fill a wave in one split (its SHORT_CACHE_ONE_SPLIT), 1024 CTAs and no merge.
# cute_impl/decode.py's SHORT_CACHE_ONE_SPLIT (off since the fifth stop: that stop's call ran out before cute's rows,
# never timed) does the same for cute, with the shared rule's exception for a ragged batch whose items fit one wave
# (splits.SHORT_ONE_SPLIT_SKIPS_RAGGED_WAVE). A CPU scan of seeds 1-239 and the fresh seeds: it moves 104 rows, every
# one from the balanced split to one padded split (ragged caches of 1k-8k keys, 135 MB-1.2 GB, every head dim).
# Predicted (not measured): 5309/1 93.3 -> 72-80 us (gluon's 75.4 with the same plan); where one item is several
# times the mean the step waits on it and the one split loses (gluon's own 126/2 ran 2.26x on the balanced side of
# this choice, 211/7 the other way: its 49 % row), so 0.8-1.2x across the rows, the sign by the longest item's share.
# This call: bench.decode_knob_ab (False against True, 2 rounds, each value checked against fp64 first) on 5309/1
# first, then thirteen moved rows across the classes (D=128 short ragged 1/4, 126/2, 163/6, 19/4; paged 67/1 (16),
# 224/6 (128), 86/3 (128); D=256 53/5, 211/7, 179/3 paged(32); D=64 30/3, 147/7 paged(16)) and a full-cache control
# (4711/5, the same plan). About 280 s. No GPU tests of its own: the one split is the padded kernel every full cache
# runs, and each value's output is checked against fp64 before it is timed.
# Run from the project root, carrying [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command
# `bash bench/cute_decode_short_one_split_ab.sh`. Outputs in $OUT: times.txt, short_one_split.log, short_one_split/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_decode_short_one_split_ab.sh runs/cute_decode_short_one_split_ab
decode_setup
status=0
knob_ab short_one_split 260 cute_impl.decode:SHORT_CACHE_ONE_SPLIT 'False,True' cute/decode \
  5309/1 126/2 211/7 1/4 67/1 224/6 86/3 19/4 163/6 53/5 179/3 30/3 147/7 4711/5
cat "$OUT/times.txt"
exit $status
