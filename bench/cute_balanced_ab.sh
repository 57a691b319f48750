#!/usr/bin/env bash
# Issue #38: cute/decode's balanced split (BALANCED_SPLIT, "never" as committed) on one GPU in one device call
# (about 2 minutes on an H200, cut at 75 s + 90 s: the CSV keeps the rows done by then, in the order below):
#   1. its GPU tests against fp64 (pytest -m gpu -k "balanced and cute"): the ragged GPU_CASES (GQA, MQA at 16
#      tokens, D 64 to 256, fp16/bf16, both alignments and none, an empty sequence), one long sequence among
#      short and empty ones (Sq 1 GQA D=64, Sq 8 MQA D=256, contiguous and paged(32)), 20 launches bit for bit,
#      a CUDA graph replayed with new lengths (contiguous and paged), and two planted plan bugs that must fail;
#   2. bench.cute_balanced_ab in one process: cute/decode "never" against "always", and triton/decode as
#      committed, on seed 31's B=16 MQA D=256 paged(32) ragged row, seed 37's two ragged rows and two full
#      caches given as lengths (B=8 Hkv=8 8k, B=1 Hkv=8 128k), each checked against fp64, then timed four ways.
# Run from the project root: command `bash bench/cute_balanced_ab.sh`; needs the CuTe DSL.
# Outputs in $OUT: gpu.log, pytest.log, ab.log, ab/ (balanced.csv, balanced.md).
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" cute_balanced_ab.sh runs/cute_balanced_ab
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.log" 2>&1
status=0
timeout 75 python3 -m pytest -q -m gpu tests/test_decode.py tests/test_cute_decode.py -k "balanced and cute" \
  > "$OUT/pytest.log" 2>&1 || status=1
tail -4 "$OUT/pytest.log"
timeout 90 python3 -m bench.cute_balanced_ab --out "$OUT/ab" > "$OUT/ab.log" 2>&1 || status=1
grep -E "^(read|cute|triton|-- )" "$OUT/ab.log" | cut -c1-230
exit $status
