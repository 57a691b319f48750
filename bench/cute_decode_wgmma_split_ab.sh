#!/usr/bin/env bash
# Issue #38, after WGMMA_MIN_ROWS was taken (results/h200/cute-decode-wgmma/): its default on the GPU, and the helper's
# next guess for the compute-bound rows, two CTAs an SM. Seed 107 row 0 (B=1 Hkv=32, 4 M tiles) launches 128 CTAs, one
# an SM, though its 112 KiB ring leaves room for two: SPLIT_CTAS_PER_SM 2 gives the padded split 2 splits, one CTA's
# softmax under the other's wgmmas (guessed 140-180 us against 294). The knob is the rung's, so the mma.sync rows
# (107/0 at Sq=1, 59/2) show what it does to the rest. Run at 518a785 as SPLIT_CTAS_PER_SM 1,2 for the whole rung
# (results/h200/cute-decode-wgmma-split/); the ask was then taken for the WGMMA tile alone, WGMMA_SPLIT_CTAS_PER_SM,
# which the A/B below sets (the mma.sync controls no longer move).
# This call: the GPU tests of every cute/decode file and the decode files' cute cases with the WGMMA tile on by default;
# the A/B (1 against 2, 2 rounds, each value checked against fp64 first); seeds 107 and 103 (`compare.py --decode
# --decode-random 8`, the three decode rungs) at this tree. About 360 s.
# Run from the project root, carrying [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command
# `bash bench/cute_decode_wgmma_split_ab.sh`. Outputs in $OUT: times.txt, pytest.log, split.log, split/, seed*/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_decode_wgmma_split_ab.sh runs/cute_decode_wgmma_split_ab
decode_setup
status=0
gpu_tests 200 -n 8 tests/test_cute_decode*.py tests/test_decode*.py tests/test_paged_kv.py -k cute
knob_ab split 150 cute_impl.decode:WGMMA_SPLIT_CTAS_PER_SM 1,2 cute/decode 107/0 103/0 41/1 107/0:page_size=64 59/2 \
  107/0:seqlen_q=1
decode_seeds 100 107 103
cat "$OUT/times.txt"
exit $status
