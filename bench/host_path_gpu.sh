#!/usr/bin/env bash
# Issue #39: attention()'s host path on the GPU machine, whose host is about 3x slower than the development
# CPU. Two figures: common.measure.api_overhead's decode row (real launches, the same tensors again: a plan
# hit) against results/h200/host-path-gpu/, and bench.host_path on this host's CPU (launches stubbed, CPU
# tensors) for the plan hit and the growing cache (K and V one key longer a call, as a DynamicCache), which
# api_overhead does not time. Run as `bash bench/host_path_gpu.sh` (OUT=... to choose the folder); ~2-3 min.
set -euo pipefail
source "$(dirname "$0")/_gpu_run.sh" host_path_gpu.sh results/h200/host-path-gpu-2
python -m common.measure.api_overhead --out "$OUT/api" --shape decode --only '*/decode' --only sdpa/flash \
  > "$OUT/api.log" 2>&1
python -m bench.host_path --calls 200 --rounds 5 > "$OUT/host_path.md"
echo "== api_overhead, decode (host µs per call: prepared / attention() / attention()'s own)"
grep -E '^\| (triton|gluon|cute|sdpa)/' "$OUT/api/report.md" | awk -F'|' '{print $2 "|" $6 "|" $7 "|" $8}'
echo "== bench.host_path on this host (CPU µs per call, launches stubbed)"
cat "$OUT/host_path.md"
