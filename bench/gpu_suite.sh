#!/usr/bin/env bash
# The whole GPU suite in one device call, on a host of one or more GPUs: `common.tools.gpu_tests` in two parts per
# visible GPU (six at most), run side by side (each part pinned to a GPU), then, with two GPUs or more, the ring
# tests in one process group. A device call returns 8 files at most: the parts' logs, the ring's and times.txt
# (which opens with the activations' and nvidia-smi's lines) are 8 at most on any host. Every log is written under
# $OUT as the tests run, so a call cut by its device-time limit still returns each part's log up to the test it
# reached (a script that gathers its logs at the end returns nothing then). BUDGET_S (default 540) bounds the whole script from its first line: the parts stop in time to leave the
# ring tests RING_S (default 200; their run on two H200s took 169 s with cute/hopper's cases compiling, 2026-11-30); the
# ring tests run only in what is left.
# Run from the project root, carrying the CuTe DSL and FA4 (../shared/gpu/README.md), with the call's limit above
# BUDGET_S plus the machine's start:
#   carry   [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"]
#   command BUDGET_S=540 bash bench/gpu_suite.sh
# A call cut short is finished by the next: carry its logs and name their folder in DONE_DIR; the tests they settled
# are not run again (common/tools/gpu_tests.py --done).
# Outputs in $OUT: gpu-tests-N.log (one per part), gpu-tests-ring.log, times.txt; the summary is printed.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" gpu_suite.sh runs/gpu_suite
source_carried_activations "$OUT/times.txt"
export PYTHONPATH="${PYTHONPATH:-$PWD}"
BUDGET_S=${BUDGET_S:-540}
RING_S=${RING_S:-200}
MAX_PARTS=6
nvidia-smi --query-gpu=name,memory.total --format=csv >> "$OUT/times.txt" 2>&1
gpus=$(nvidia-smi --list-gpus | wc -l)
parts=$((2 * gpus < MAX_PARTS ? 2 * gpus : MAX_PARTS))
done_logs=()
if [ -n "${DONE_DIR:-}" ]; then
  done_logs=(--done "$DONE_DIR"/gpu-tests-[0-9]*.log)
fi
reserve=$((gpus > 1 ? RING_S : 0))
parts_limit=$((BUDGET_S - reserve - SECONDS))
if [ "$parts_limit" -lt 60 ]; then
  echo "gpu_suite.sh: BUDGET_S=$BUDGET_S leaves $parts_limit s for the parts after the set-up and the ring's $reserve s" >&2
  exit 2
fi
for ((part = 1; part <= parts; part++)); do
  (
    begun=$SECONDS
    CUDA_VISIBLE_DEVICES=$(((part - 1) % gpus)) timeout "$parts_limit" python3 -m common.tools.gpu_tests \
      --part "$part/$parts" --workers 8 --log "$OUT/gpu-tests-$part.log" "${done_logs[@]}" > /dev/null 2>&1
    echo "part $part/$parts rc=$? $((SECONDS - begun)) s (limit $parts_limit s)" >> "$OUT/times.txt"
  ) &
done
wait
left=$((BUDGET_S - SECONDS))
if [ "$gpus" -gt 1 ] && [ "$left" -gt 30 ]; then
  begun=$SECONDS
  timeout "$left" python3 -m pytest -v -m gpu -p no:cacheprovider tests/test_ring_attention.py \
    tests/test_multi_gpu.py > "$OUT/gpu-tests-ring.log" 2>&1
  echo "ring rc=$? $((SECONDS - begun)) s (limit $left s)" >> "$OUT/times.txt"
elif [ "$gpus" -gt 1 ]; then
  echo "ring: not run, $left s of BUDGET_S left" >> "$OUT/times.txt"
fi
cat "$OUT/times.txt"
for log in "$OUT"/gpu-tests-*.log; do echo "$(basename "$log"): $(tail -n 1 "$log")"; done
# Each log's failures by their last outcome: a test that ran out of memory and passed alone is not one.
python3 -m common.tools.gpu_tests --failed "$OUT"/gpu-tests-*.log
! grep -q "rc=[1-9]" "$OUT/times.txt"
