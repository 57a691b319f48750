#!/usr/bin/env bash
# Issue #38's D=256 packed rows on a GPU in one device call (at most about 200 s on an H200): triton/decode's
# WGMMA_D256 (on by default since this A/B, results/h200/decode-triton-wgmma-d256/: 17-64 packed rows at D=256 on one
# 64-row wgmma tile of 4 warps, 32-key blocks, 4 stages, one CTA an SM) against off, the 32-row mma.sync tiles (its
# first run, with the switch a candidate's name, also timed "two-warpgroups", 8 warps, since removed):
#   1. the switch's GPU tests (tests/test_decode_d256_rows.py -m gpu): the switch on against fp64 (poisoned output)
#      on 64 rows of a full cache, 64 rows paged ragged and 32 rows padded to 64, cut at 55 s;
#   2. bench.decode_knob_ab, triton/decode only, the values alternating over 2 rounds, each checked against fp64
#      first: seed 53's row 0 (B=3 H=64 Hkv=8 Sq=8 96k, 64 rows), seed 47's row 6 (B=1 H=64 Hkv=4 Sq=4 71k, 64
#      rows), seed 59's row 5 (B=4 H=8 Hkv=1 Sq=4 71k, 32 rows padded to 64), seed 53's row 0 with its full lengths
#      as cache_seqlens, contiguous and in pages of 64 (the balanced split's kernel), then two controls whose plan
#      must not change: seed 47's row 4 (128 rows paged ragged, WIDE_D256's tile) and seed 47's row 1 (B=64 H=4 Hkv=1
#      Sq=1, a 16-row tile); cut at 135 s (the CSV and table keep the rows done).
# Triton only (the machine's 3.6), nothing to carry. Run from the project root: command
# `bash bench/triton_decode_d256_rows_ab.sh`. Outputs in $OUT: pytest.log (nvidia-smi's line first), ab.log, ab/
# (knob.csv, knob.md).
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" triton_decode_d256_rows_ab.sh runs/triton_decode_d256_rows_ab
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/pytest.log" 2>&1
status=0
timeout 55 python3 -m pytest -q -m gpu tests/test_decode_d256_rows.py >> "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
timeout 135 python3 -m bench.decode_knob_ab --knob triton_impl.decode:WGMMA_D256 \
  --values False,True --rungs triton/decode --rounds 2 --out "$OUT/ab" \
  --rows 53/0 47/6 59/5 53/0:full "53/0:has_cache_seqlens=True,page_size=64,full" 47/4 47/1 \
  > "$OUT/ab.log" 2>&1 || status=1
grep -E "^[0-9]+/[0-9]" "$OUT/ab.log" | cut -c1-160
# The table last (rewritten after every row, so a cut run keeps the rows done).
cat "$OUT/ab/knob.md" 2>/dev/null || echo "knob.md not written: no row finished"
exit $status
