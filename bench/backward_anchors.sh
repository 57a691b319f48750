#!/usr/bin/env bash
# Issue #40's table: `compare.py --backward` at the four anchor shapes (P1 both masks, B4 H32 S8192 D64, B8 H16 S2048
# D128 causal) over the hopper backward rungs, SDPA cuDNN and flash and FA4, in interleaved rounds (`--rounds`, the
# order reversed every other round: bench.backward's fixed order charged a heated GPU's lower clock to the rows timed
# last, 2026-12-04, results/h200/backward-interleaved-2026-12-04/). One device call, about 5 minutes on an H200; carry
# [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"].
# Run from the project root: `bash bench/backward_anchors.sh [ROUNDS [SHAPE...]]` (default 4 rounds, the anchors;
# SHAPE: "label batch heads kv_heads seqlen head_dim causal", causal true, false or both). Outputs in $OUT: gpu.log,
# times.txt, backward.csv (every run's rows under one header), report.md and compare.log (each run's), as
# results/h200/backward-anchors-*/ hold them.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" backward_anchors.sh runs/backward_anchors
source_carried_activations
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >> "$OUT/gpu.log" 2>&1
rounds=${1:-4}
shift $(($# > 0 ? 1 : 0))
shapes=("$@")
[ ${#shapes[@]} -gt 0 ] || shapes=("p1 2 16 16 8192 128 both" "d64 4 32 32 8192 64 false" "b8-s2048 8 16 16 2048 128 true")
status=0
for shape in "${shapes[@]}"; do
  read -r label batch heads kv_heads seqlen head_dim causal <<< "$shape"
  begun=$SECONDS
  run=/tmp/backward_anchors/$label
  rm -rf "$run"
  mkdir -p "$run"
  timeout 400 python3 compare.py --backward --rounds "$rounds" --no-static --only triton/hopper --only gluon/hopper \
    --only cute/hopper --only sdpa/cudnn --only sdpa/flash --only 'fa4/*' --batch "$batch" --heads "$heads" \
    --kv-heads "$kv_heads" --seqlen "$seqlen" --head-dim "$head_dim" --causal "$causal" --out "$run" > "$run.log" 2>&1
  rc=$?
  [ "$rc" -eq 0 ] || status=1
  echo "$label rc=$rc $((SECONDS - begun)) s" >> "$OUT/times.txt"
  csv=$(find "$run" -name 'backward*.csv' | head -1)
  if [ -n "$csv" ]; then
    [ -f "$OUT/backward.csv" ] || head -1 "$csv" > "$OUT/backward.csv"
    tail -n +2 "$csv" >> "$OUT/backward.csv"
  fi
  find "$run" -name 'report.md' -exec sh -c 'echo "## $1"; cat "$2"' _ "$label" {} \; >> "$OUT/report.md"
  { echo "## $label"; grep -v "Warning\|exe_args\|_warn_once" "$run.log" | tail -30; } >> "$OUT/compare.log"
done
cat "$OUT/times.txt"
cut -d, -f1,7,8,11,13,16 "$OUT/backward.csv" 2>/dev/null
exit $status
