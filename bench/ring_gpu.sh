#!/usr/bin/env bash
# Context parallelism on every GPU of this host, in one device call (about 8 minutes on 4 H200s):
#   1. the ring over NCCL on every GPU of the host against float64, every implementation the sweep uses,
#      with random pauses at the ring's ordering points and planted bugs that must fail (a shard read
#      before it arrives, receive slots allocated mid-ring) (pytest -m gpu tests/test_ring_attention.py);
#   2. the sweep: our ring with cute/hopper, gluon/hopper and triton/hopper, and PyTorch's
#      context_parallel with SDPA (cuDNN and flash), at 256k, 128k, 64k and 32k tokens per GPU (B=1, H=16,
#      D=128, bf16, causal and not), every row checked on sampled rows of every rank against float64,
#      and the one-GPU baseline of each in the same launch (common.tools.context_parallel).
# Exit status 0 only when both steps passed and every row of the sweep ran (a row left by the deadline
# fails it).
#
# Run from the project root on a 2- or 4-GPU host (device kinds nvidia-h200-x4 / nvidia-h200-x2),
# carrying the CuTe DSL (without it the cute/hopper rows are skipped with the reason):
#   carry   [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh"]
#   command bash bench/ring_gpu.sh
# Everything lands in $OUT (7 files): gpus.log, pytest_ring.log, cp.log and cp<N>/{results.csv,
# env.json, report.md, efficiency.png}. Commit cp<N>/ under results/<h200x4|h100x4>/context-parallel/.
#
# Knobs (environment): RING_GPUS (default: every GPU), RING_TOKENS (default 262144,131072,65536,32768),
# RING_IMPLS (default cute/hopper,gluon/hopper,triton/hopper), RING_TORCH_CP (default cudnn,flash: cuDNN
# is SDPA's fastest backend here, flash the one PyTorch's context_parallel has supported longest),
# RING_DEADLINE_S (default 360: sized for 4 ranks, where a 256k-token row takes 20-40 s; rows not started
# by then are recorded as skipped and fail the run), RING_ARGS (more arguments for the sweep, e.g.
# --transfer-first).
set -uo pipefail
OUT=${OUT:-runs/ring_gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

# NVLink multicast must stay off on these hosts: refuse to run if the host's settings are not there.
for pair in NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1; do
  name=${pair%%=*}
  if [ "${!name-unset}" != "${pair#*=}" ]; then
    echo "ring_gpu.sh: refusing: $name is '${!name-unset}', this host needs ${pair#*=}" | tee "$OUT/gpus.log"
    exit 2
  fi
done

if [ -f .gpu/activate.sh ]; then
  # shellcheck disable=SC1091
  source .gpu/activate.sh
fi
N=${RING_GPUS:-$(nvidia-smi -L | grep -c '^GPU')}
{
  nvidia-smi
  nvidia-smi topo -m
  python3 -c 'import torch; print("torch", torch.__version__, "NCCL", torch.cuda.nccl.version(), "GPUs", torch.cuda.device_count())'
  env | grep -E '^(NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS)='
} >"$OUT/gpus.log" 2>&1
if [ "$N" -lt 2 ]; then
  echo "ring_gpu.sh: this host has $N GPU; context parallelism needs 2 or more" | tee -a "$OUT/gpus.log"
  exit 2
fi

status=0
echo "== 1. the ring over NCCL on $N GPUs, against float64 (pytest -m gpu)"
timeout --kill-after=20 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_ring_attention.py \
  2>&1 | tee "$OUT/pytest_ring.log" || status=1

echo "== 2. the sweep on $N GPUs: ring per implementation, PyTorch's context_parallel, one-GPU baselines"
impls=()
IFS=, read -ra names <<<"${RING_IMPLS:-cute/hopper,gluon/hopper,triton/hopper}"
for name in "${names[@]}"; do impls+=(--impl "$name"); done
timeout --kill-after=30 $(( ${RING_DEADLINE_S:-360} + 60 )) torchrun --standalone --nproc-per-node "$N" -m common.tools.context_parallel \
  --out "$OUT/cp$N" --tokens-per-gpu "${RING_TOKENS:-262144,131072,65536,32768}" --heads 16 --head-dim 128 \
  --dtype bf16 --causal both "${impls[@]}" --torch-cp "${RING_TORCH_CP:-cudnn,flash}" --torch-cp-rotate alltoall \
  --check-rows 32 --min-reps 2 --target-ms 1000 --deadline-s "${RING_DEADLINE_S:-360}" ${RING_ARGS:-} \
  2>&1 | tee "$OUT/cp.log" || status=1

if [ -f "$OUT/cp$N/report.md" ]; then
  sed -n '/^## Targets/,/^## Every row/p' "$OUT/cp$N/report.md"
fi
exit $status
