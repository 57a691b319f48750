#!/usr/bin/env bash
# Issue #38's D=256 packed rows on a GPU in one device call (about 3 minutes on an H200): triton/decode's WIDE_D256
# (on by default since its first A/B, results/h200/decode-d256-wide/: 128-row tiles past 64 packed rows at D=256, on
# 8 warps, where the knob off takes 32-row tiles on 4 warps) against the knob off and its deeper ring:
#   1. the knob's GPU tests (tests/test_decode_d256.py -m gpu): triton/decode with it on against fp64 (poisoned
#      output) on seed 47's two rows' kinds (128 rows paged ragged, 64 rows on a full cache) and 256 rows in two
#      tiles, cut at 55 s;
#   2. bench.decode_d256_wide, one round, in one process (read bandwidth and bf16 GEMM rate measured first): seed
#      47's B=64 H=8 Hkv=1 Sq=16 paged(256) ragged row and its B=1 H=64 Hkv=4 Sq=4 71k row, a long MQA cache (128k)
#      that must not regress, 128 rows on a full 4k cache, 64 rows paged ragged; settings default (the knob on),
#      narrow (the knob off), wide-d256-deep (its tiles at 5 stages), each where it changes the plan; cut at 140 s
#      (the CSV keeps the rows done).
# Triton only (the machine's 3.6), nothing to carry. Run from the project root: command `bash bench/decode_d256_wide_ab.sh`.
# Outputs in $OUT: pytest.log (nvidia-smi's line first), d256.log, d256/ (decode_d256_wide.csv, .md).
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" decode_d256_wide_ab.sh runs/decode_d256_wide_ab
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/pytest.log" 2>&1
status=0
timeout 55 python3 -m pytest -q -m gpu tests/test_decode_d256.py >> "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
timeout 140 python3 -m bench.decode_d256_wide --rounds 1 --rep 30 --out "$OUT/d256" > "$OUT/d256.log" 2>&1 || status=1
grep -E "^(read|seed|128|64|long)" "$OUT/d256.log" | cut -c1-160
# The table last (rewritten after every shape, so a cut run keeps the shapes done).
cat "$OUT/d256/decode_d256_wide.md" 2>/dev/null || echo "decode_d256_wide.md not written: no shape finished"
exit $status
