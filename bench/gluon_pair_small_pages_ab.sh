#!/usr/bin/env bash
# Issue #38: gluon/decode's paged row of the default `compare.py --decode` (B=8 H=32 Hkv=8 32k D=128 in pages of 16,
# full lengths as cache_seqlens): 269.4 us against FlashInfer's 249.6 (H200, results/h200/decode/). Its balanced grid
# is the ragged row's before the pair ring: 264 shares + 64 items on 132 slots of one CTA an SM (the load warp's ring),
# 2.5 waves; the same lengths contiguous took 270.3 (results/h200/gluon-paged-load-warp/): the plan, not the pages.
# BALANCED_PAIR_SMALL_PAGES lets pages of 16 and 32 take the pair ring (64-key blocks, 3 stages, two CTAs an SM, 200
# shares + 64 items on 264 slots), the warpgroup copying each block in 4 or 2 page chunks (sm_90a: 178 / 174 registers
# under Triton 3.6, no spill, 114,744 bytes).
# Predicted: the paged(16) row 269 -> 245-262 us (the pair ring took the ragged row to cute's level; the chunk copies
# with a CTA barrier between them, Triton's barrier pass, cost the warpgroup what the second CTA of its SM does not
# hide), pages of 32 -> 240-258; seed 59 row 1 (pages of 16, 64 items, ragged) 0.85-1.05x; controls (the contiguous
# twin, which takes the pair ring either way; the ragged row; seed 89 row 1, pages of 16 with 89 items) 1.00 +- 0.02.
# This call: the switch's GPU tests (fp64 on a poisoned output), then one A/B through bench.decode_knob_ab (False
# against True, 2 rounds, each value checked against fp64 on a poisoned output first). About 120 s (limits 200 s).
# Run from the project root carrying [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command
# `bash bench/gluon_pair_small_pages_ab.sh`. Outputs in $OUT: times.txt, pytest.log, pages.log, pages/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" gluon_pair_small_pages_ab.sh runs/gluon_pair_small_pages_ab
decode_setup
status=0
gpu_tests 100 tests/test_gluon_decode_pair_tile.py -k "paged16 or paged32"
SHAPE=73/3:batch=8,seqlen_k=32768,head_dim=128,has_cache_seqlens=True
knob_ab pages 100 triton_impl.gluon.decode:BALANCED_PAIR_SMALL_PAGES False,True gluon/decode \
  "$SHAPE,page_size=16,full" "$SHAPE,page_size=32,full" 59/1 "$SHAPE,full" "73/3:seqlen_k=32768,head_dim=128,ragged" 89/1
cat "$OUT/times.txt"
exit $status
