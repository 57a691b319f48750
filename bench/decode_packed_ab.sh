#!/usr/bin/env bash
# Issue #38's packed rows on a GPU in one device call (about 2.5 minutes on an H200): WIDE_M_TILE (triton/decode,
# gluon/decode; off by default: more than 64 packed rows at D <= 128 in one 128-row CTA on 8 warps):
#   1. its GPU tests (tests/test_decode_wide.py -m gpu): both rungs with it on against fp64 (poisoned output)
#      on the worst row's kind (group 16 x Sq 8, D=64, pages of 64, ragged) and on 256 rows at D=128;
#   2. bench.decode_packed, default vs wide in one process, one round: seed 31's worst row (B=32 Hkv=32
#      group 16 Sq=8 D=64 paged ragged) and its contiguous twin, two shapes the switch was not tuned on
#      (256 rows at D=128; 128 rows at D=64 in pages of 16), then seed 31's other low rows (which the switch
#      leaves as they are: timed at the default only), cut at 100 s (the CSV keeps the rows done by then).
# Run from the project root: command `bash bench/decode_packed_ab.sh`.
# Outputs in $OUT (4 files): pytest.log (nvidia-smi's line first), packed.log, packed/ (decode_packed.csv, .md).
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" decode_packed_ab.sh runs/decode_packed_ab
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/pytest.log" 2>&1
status=0
timeout 45 python3 -m pytest -q -m gpu tests/test_decode_wide.py >> "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
timeout 100 python3 -m bench.decode_packed --rounds 1 --rep 40 --out "$OUT/packed" > "$OUT/packed.log" 2>&1 || status=1
tail -16 "$OUT/packed.log"
exit $status
