#!/usr/bin/env bash
# Issue #38's short prefill on a GPU in one device call (about 3 minutes on an H200): PACKED_OCCUPANCY (triton/decode,
# gluon/decode; off by default: more CTAs an SM where group · Sq >= 64 packed rows make the softmax the long part)
# and gluon's WIDE_M_TILE, against each rung's default:
#   1. the knob's GPU tests (tests/test_decode_packed.py -m gpu): both rungs with it on against fp64 (poisoned
#      output) on seed 41's low row's kind (contiguous, and paged ragged) and on 64 rows at D=128, cut at 55 s;
#   2. bench.decode_packed, one round, in one process (read bandwidth and bf16 GEMM rate measured first): seed 41's
#      B=16 H=256 Hkv=32 Sq=16 1k D=64 row, 4 neighbours (128 / 64 packed rows, 1k-4k, D=64 and 128), seed 31's
#      paged ragged 128-row row, two long caches that must not regress; cut at 120 s (the CSV keeps the rows done).
# Triton only (the machine's 3.6), nothing to carry. Run from the project root: command `bash bench/decode_packed_ab.sh`.
# Outputs in $OUT: pytest.log (nvidia-smi's line first), packed.log, packed/ (decode_packed.csv, .md).
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" decode_packed_ab.sh runs/decode_packed_ab
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/pytest.log" 2>&1
status=0
timeout 55 python3 -m pytest -q -m gpu tests/test_decode_packed.py >> "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
timeout 120 python3 -m bench.decode_packed --rounds 1 --rep 30 --out "$OUT/packed" > "$OUT/packed.log" 2>&1 || status=1
grep -E "^(read|seed|128|64|long)" "$OUT/packed.log" | cut -c1-160
# The table last (rewritten after every shape, so a cut run keeps the shapes done).
cat "$OUT/packed/decode_packed.md" 2>/dev/null || echo "decode_packed.md not written: no shape finished"
exit $status
