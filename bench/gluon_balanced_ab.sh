#!/usr/bin/env bash
# gluon/decode's balanced split (BALANCED_SPLIT, issue #38) on one GPU in one device call (at most 2.5 minutes
# on an H200): first its GPU tests (tests/test_gluon_decode_balanced.py -m gpu: "always" against fp64 on ragged,
# paged, GQA/MQA, causal shapes with empty and very long sequences, Sq 1 and 8; 20 launches bit for bit; a CUDA
# graph with new lengths; a planted plan missing a sequence fails), then bench.gluon_balanced_ab in one process:
# gluon/decode "never" (committed) against "always" (one share per CTA slot) and "always-2/SM" (triton/decode's
# two shares an SM), and triton/decode as committed, on seed 31's B=16 MQA Sq=8
# D=256 paged(32) ragged row, its B=32 H=512 Hkv=32 Sq=8 D=64 paged(64) ragged row, and two full caches with
# cache_seqlens (B=8 Hkv=8 8k, B=1 Hkv=8 128k: what "ragged" would cost there); each row checked against fp64,
# then timed four ways (bench/decode_fewpairs.py's modes). The tests are cut at 55 s, the A/B at 85 s (its CSV
# keeps the rows done by then, shapes in the order above).
# Run from the project root: command `bash bench/gluon_balanced_ab.sh`.
# Outputs in $OUT: gpu.log, tests.log, balanced.log, balanced/ (balanced.csv, balanced.md).
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" gluon_balanced_ab.sh runs/gluon_balanced_ab
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$OUT/gpu.log" 2>&1
status=0
timeout 55 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gluon_decode_balanced.py \
  > "$OUT/tests.log" 2>&1 || status=1
tail -15 "$OUT/tests.log"
timeout 85 python3 -m bench.gluon_balanced_ab --out "$OUT/balanced" > "$OUT/balanced.log" 2>&1 || status=1
grep -E "^(.*/decode |-- |read bandwidth)" "$OUT/balanced.log" | cut -c1-230
exit $status
