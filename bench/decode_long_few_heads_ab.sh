#!/usr/bin/env bash
# Issue #38's long single sequences over few KV heads (helper `longkv`, docs/perf-log.md): seed 193's row 6 (B=1 H=8
# Hkv=2 Sq=1 Sk=132608 D=128, 136 MB; H200: triton/decode 65.6 us, 47 % of the read bandwidth, gluon/decode 49.8, 62 %)
# and seed 93's row 0 (B=1 H=32 Hkv=2 Sq=4 D=256 paged(128), one 145264-key sequence in a 254720-key cache, 298 MB;
# gluon/decode 192.3 us, 35 %), on one H200 in one device call (triton and gluon only, no carry; the limits sum to 280
# s, about 140 s expected). Three bench.decode_knob_ab runs, the default value first, the values alternating over 2
# rounds, each checked against fp64 on a poisoned output first; rows in order of interest (a cut run keeps the first).
# The model (CPU plans, sm_90a builds): the tile's last CTA merges the splits in a chain of dependent L2 round trips, 2
# x ceil(splits / splits a step) per 16 merged rows (~0.45-0.5 us each, helper `longkv`'s fit), after every key is read.
#   1. triton_impl.decode:MERGE_STEP_REGISTERS 64 -> 128 (both rungs read it: splits a merge step 4 -> 8 at 16 rows of
#      D=128, 2 -> 4 in gluon at D=256; triton's 64-row D=256 tile stays at 1). Round trips, default -> 128:
#   193/6 triton 62 -> 32, gluon 32 -> 16; 93/0 gluon 256 -> 128 (triton 252, unchanged: the control);
#   53/2 (B=1 H=8 Hkv=2 Sq=4 367k, 376 MB; triton 132.8 us, gluon 116.0) as 193/6; 92/3 (Hkv=2 Sq=2 paged(16) ragged-B1)
#      triton 122 -> 62, gluon 64 -> 32; 82/3 (B=1 H=8 MQA Sq=8 D=256 193k, 198 MB, untimed so far) gluon
#   488 -> 248 (triton 488, unchanged); 47/6 (B=1 H=64 Hkv=4 Sq=4 D=256) gluon 128 -> 64. Predicted: 193/6 triton
#   65.6 -> 50-53 us, gluon 49.8 -> 41-43; 53/2 -13 to -15 / -7 to -8 us alike (the rungs' 16 us gap is the same at 136
#      and 376 MB: a fixed tail); 93/0 gluon 192 -> 128-140; 82/3 gluon -100 to -120 us. sm_90a (Triton 3.6): 193/6's
#      split kernels 108 -> 106 registers (triton), 227 -> 227 (gluon), 93/0's gluon 229 -> 254, no spill.
#   2. triton_impl.gluon.decode:BALANCED_SPLIT 'ragged-split' / 'ragged' (B=1 calls with cache_seqlens take the balanced
#      split and its two-level merge, runs of 8) on 93/0 (130 shares, 65 an item of 35 key blocks: 4 x 18 round trips,
#      not 256), 193/6:full (193/6 with its full length given as cache_seqlens, so that 'ragged' reaches it; the default
#      plans it as 193/6: 65 shares an item, 10 round trips, not 32), 92/3 (B=1 Sq=2 paged(16): 64 -> 16) and 152/0 (B=1
#      Sq=4 paged(32): 32 -> 12). Predicted: 93/0 192 -> 110-125 us (54-61 %), 193/6:full 49.8 -> 39-44, 92/3 -15 to -25
#      us, 152/0 -5 to -10.
#   3. triton_impl.decode:BALANCED_SPLIT 'ragged-split' / 'ragged' on 193/6:full (264 shares, 130 an item: 14 round
#      trips, not 62; 65.6 -> 42-48 us), 93/0 (130 shares: 68 round trips, not 252; -70 to -100 us), 53/2:full (as
#   193/6) and 92/3 (262 shares, 131 an item: 8 + 18 round trips at step 2, not 122; -35 to -50 us).
# Take-rule: a value is taken (by a follow-up that narrows it, none here) where it is at least 5 % faster on the row it
# targets and no timed row of the same run is more than 2 % slower; MERGE_STEP_REGISTERS additionally needs the decode
# static suites under Triton 3.6 and 3.8 free of new spills and of fewer CTAs an SM (it changes every split kernel's
# merge), BALANCED_SPLIT a narrower switch (B=1 calls, with cache_seqlens or, for 193/6's class, without) since 'ragged'
# also takes the one-split ragged batches it lost on (results/h200/decode-balanced-gluon-cute/). The measured
# differences calibrate the round trip: triton's 193/6 gain over 30 round trips, gluon's over 16.
# Run from the project root (no carry): command `bash bench/decode_long_few_heads_ab.sh`.
# Outputs in $OUT: times.txt, merge_step.log, gluon_balanced.log, triton_balanced.log and their folders (knob.csv,
# knob.md).
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" decode_long_few_heads_ab.sh runs/decode_long_few_heads_ab
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$OUT/times.txt" 2>&1
status=0
knob_ab merge_step 140 triton_impl.decode:MERGE_STEP_REGISTERS 64,128 triton/decode,gluon/decode \
  193/6 93/0 53/2 92/3 82/3 47/6
knob_ab gluon_balanced 70 triton_impl.gluon.decode:BALANCED_SPLIT "'ragged-split','ragged'" gluon/decode \
  93/0 193/6:full 92/3 152/0
knob_ab triton_balanced 70 triton_impl.decode:BALANCED_SPLIT "'ragged-split','ragged'" triton/decode \
  193/6:full 93/0 53/2:full 92/3
cat "$OUT/times.txt"
exit $status
