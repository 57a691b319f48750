#!/usr/bin/env bash
# triton/decode's balanced split (BALANCED_SPLIT; off when written, since the default for calls with cache_seqlens) on a GPU for the first time, in one
# device call (about 3 minutes on an H200):
#   1. its GPU tests: the ragged GPU_CASES against fp64 with the knob on (GQA, MQA at 16 tokens, D 64 to
#      256, fp16/bf16, both alignments and none, empty sequences), 20 launches bit for bit (the merging CTA
#      varies), and a CUDA graph captured once and replayed with new lengths (contiguous and paged);
#   2. bench.decode_floor on issue #38's floor shapes (seed 1), triton/decode after (the padded-Sk split
#      rule) against balanced (2 shares per SM) and balanced-4 (4 per SM), one round, cut at 70 s;
#   3. the same on seed 29's low and full shapes (B=64 Hkv=1 paged 181k ragged; B=32 MHA 1k ragged; B=4
#      Hkv=2 276k; B=64 Hkv=4 2.3k; B=16 Hkv=2 98k), cut at 40 s (each CSV keeps the rows done by then).
# Run from the project root: command `bash bench/decode_balanced.sh`; Triton only, nothing to carry.
# Outputs in $OUT: gpu.log, pytest.log, floor-seed1.log, floor-seed1/, floor-seed29.log, floor-seed29/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" decode_balanced.sh runs/decode_balanced
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.log" 2>&1
status=0
timeout 70 python3 -m pytest -q -m gpu tests/test_decode.py -k balanced > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
floor=(python3 -m bench.decode_floor --only triton/decode --settings after,balanced,balanced-4 --rounds 1 --rep 60)
timeout 70 "${floor[@]}" --out "$OUT/floor-seed1" > "$OUT/floor-seed1.log" 2>&1 || status=1
tail -12 "$OUT/floor-seed1.log"
timeout 40 "${floor[@]}" --seed 29 --shapes 0,7,6,5,4 --out "$OUT/floor-seed29" > "$OUT/floor-seed29.log" 2>&1 || status=1
tail -8 "$OUT/floor-seed29.log"
exit $status
