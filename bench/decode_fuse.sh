#!/usr/bin/env bash
# Issue #38's one launch per decode step, in one device call (about 3 minutes on an H200):
#   1. the decode GPU tests of what the fused merge touches: triton/decode and gluon/decode against fp64
#      (forced splits, empty sequences, strided inputs, CUDA-graph replays with new lengths), the fused
#      merge deterministic over 20 launches and equal to two launches bit for bit, paged triton/decode;
#   2. bench.decode_fuse: fused against two launches at B=1 Hkv=8, 4k and 32k keys (device time eager
#      and from a CUDA graph, and the host rate of eager steps);
#   3. bench.decode_floor on issue #38's floor shapes, settings after (fused) and two-launch, one round,
#      cut at 50 s (decode_floor.csv holds the rows finished by then).
# Run from the project root: command `bash bench/decode_fuse.sh`; Triton and Gluon only, nothing to carry.
# Outputs in $OUT: gpu.log, pytest_fused.log, pytest.log, fuse.log, fuse/, floor.log, floor/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" decode_fuse.sh runs/decode_fuse
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.log" 2>&1
status=0
# The fused merge's own checks and the CUDA-graph replays first, then the rest against fp64.
timeout 50 python3 -m pytest -q -m gpu tests/test_decode.py -k "fused or (graph and (triton or gluon))" \
  > "$OUT/pytest_fused.log" 2>&1 || status=1
tail -3 "$OUT/pytest_fused.log"
timeout 80 python3 -m pytest -q -m gpu tests/test_decode.py tests/test_paged_kv.py \
  -k "(triton or gluon or paged_decode_bf16) and not planted and not fused and not graph" \
  > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
python3 -m bench.decode_fuse --out "$OUT/fuse" > "$OUT/fuse.log" 2>&1 || status=1
tail -8 "$OUT/fuse.log"
timeout 50 python3 -m bench.decode_floor --only "[tg]*/decode" --settings after,two-launch --rounds 1 --rep 60 \
  --out "$OUT/floor" > "$OUT/floor.log" 2>&1 || status=1
tail -12 "$OUT/floor.log"
exit $status
