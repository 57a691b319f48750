#!/usr/bin/env bash
# Several one-GPU bench scripts in one device call, side by side, each pinned to a GPU of its own
# (`CUDA_VISIBLE_DEVICES`; ../shared/gpu/README.md, "Four GPUs for the price of one"): each script's ratios stay
# within its own run on its own GPU. Each job writes to $SIDE/NAME (its $OUT) and $SIDE/NAME.log ($SIDE: /tmp/side
# unless set); at the end every job's exit status, times.txt and last lines are printed, and all of $SIDE is packed
# into $OUT/side.tgz
# (the device tool returns at most 8 files). Exits 1 if a job failed, 2 with fewer GPUs than scripts.
# Command (project root; carry what the scripts need, e.g. [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"]):
#   bash bench/side_by_side.sh bench/defaults_check_2026_12_04b.sh bench/triton_decode_wide_rings_ab.sh ...
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" side_by_side.sh runs/side_by_side
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
if [ "$#" -eq 0 ] || [ "$#" -gt "$gpus" ]; then
  echo "side_by_side.sh takes 1 to $gpus scripts (one a GPU), got $#" >&2
  exit 2
fi
# The carried activations once, before the jobs: each job sources them again, and an archive unpacked by four at once
# would be read half-written.
source_carried_activations
side=${SIDE:-/tmp/side}
mkdir -p "$side"
pids=() names=()
gpu=0
for script in "$@"; do
  name=$(basename "$script" .sh)
  OUT="$side/$name" CUDA_VISIBLE_DEVICES=$gpu bash "$script" > "$side/$name.log" 2>&1 &
  pids+=("$!") names+=("$name")
  gpu=$((gpu + 1))
done
status=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  rc=$?
  [ "$rc" -eq 0 ] || status=1
  echo "=== ${names[$i]} (GPU $i): exit $rc"
  cat "$side/${names[$i]}/times.txt" 2>/dev/null
  tail -25 "$side/${names[$i]}.log"
done
tar czf "$OUT/side.tgz" -C "$(dirname "$side")" "$(basename "$side")"
exit $status
