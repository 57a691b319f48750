#!/usr/bin/env bash
# Decode on one GPU in one device call (about 8 minutes on an H200), issue #38's checks beyond the
# fixed sweep:
#   1. the decode GPU tests of a CUDA-graph replay with new lengths (tests/test_decode.py -k graph);
#   2. `compare.py --decode --decode-random N`: seeded random shapes no issue names (B 1-64, KV heads
#      1-32, group 1-16, Sq 1-16, D 64/128/256, ragged, paged), the decode rungs against cuDNN, FA4 and
#      FlashInfer where they are carried; the log ends with each rung's lowest share of the bandwidth;
#   3. `compare.py --decode --cuda-graph` on the small caches (B=1 and 8, 4k keys), where a step is
#      launch latency, not bandwidth.
# Run from the project root carrying the CuTe DSL (and FA4 / FlashInfer, see ../shared/gpu/README.md):
#   carry   [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh"]
#   command bash bench/decode_gpu.sh
# Knobs (environment): DECODE_RANDOM (shapes, default 12), DECODE_SEED (default 1), DECODE_ONLY (the
# rows, default the decode rungs and the baselines), DECODE_DEADLINE_S (seconds for step 2, default 330),
# EXTRA_PYTHONPATH (folders where FA4 or FlashInfer were unpacked by an earlier call).
# Outputs in $OUT: gpu.log, pytest_graph.log, random.log, random/, graph.log, graph/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" decode_gpu.sh runs/decode_gpu
if [ -f .gpu/activate.sh ]; then
  # shellcheck disable=SC1091
  source .gpu/activate.sh > "$OUT/gpu.log" 2>&1
fi
export PYTHONPATH="${PYTHONPATH:-$PWD}${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total --format=csv >> "$OUT/gpu.log" 2>&1
ONLY=()
for glob in ${DECODE_ONLY:-*/decode sdpa/cudnn fa4/* flashinfer/*}; do ONLY+=(--only "$glob"); done
status=0
python3 -m pytest -q -m gpu tests/test_decode.py -k graph > "$OUT/pytest_graph.log" 2>&1 || status=1
tail -3 "$OUT/pytest_graph.log"
timeout "${DECODE_DEADLINE_S:-330}" python3 compare.py --decode --decode-random "${DECODE_RANDOM:-12}" \
  --decode-seed "${DECODE_SEED:-1}" "${ONLY[@]}" --out "$OUT/random" > "$OUT/random.log" 2>&1 || status=1
grep "lowest %" "$OUT/random.log" || tail -5 "$OUT/random.log"
python3 compare.py --decode --cuda-graph --decode-batch 1,8 --decode-seqlen 4096 --decode-no-ragged \
  --decode-no-paged "${ONLY[@]}" --out "$OUT/graph" > "$OUT/graph.log" 2>&1 || status=1
tail -3 "$OUT/graph.log"
exit $status
