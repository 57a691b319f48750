#!/usr/bin/env bash
# time_cuda's flushes A/B (issue #38; common/measure/timing.py) on one H200 in one device call (about 90 s; limit
# 110): bench.flush_ab, "write" (do_bench's zeroing, the L2 left dirty: the default) against "clean" (the same
# zeroing, then a 128 MiB read that leaves the L2 clean before the start event), alternating over 2 rounds, on
# torch.sum over 64 MB, 136 MB, 512 MB and 2 GB and on seed 73's rows 0 and 3 in the three decode rungs (each checked
# against fp64 first); µs and % of the read bandwidth measured in the same process.
# Run from the project root carrying the CuTe DSL and FA4's wheels (TVM-FFI, through which cute/decode launches):
# carry [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command `bash bench/flush_ab.sh`.
# Outputs in $OUT: times.txt, flush.log, flush/ (flush.csv, flush.md).
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" flush_ab.sh runs/flush_ab
source_carried_activations "$OUT/times.txt"
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$OUT/times.txt" 2>&1
status=0
begun=$SECONDS
timeout 110 python3 -m bench.flush_ab --out "$OUT/flush" --rounds 2 > "$OUT/flush.log" 2>&1 || status=1
echo "flush_ab: $((SECONDS - begun)) s (limit 110 s)" >> "$OUT/times.txt"
cat "$OUT/flush/flush.md" 2>/dev/null || { echo "flush.md not written"; tail -20 "$OUT/flush.log"; }
cat "$OUT/times.txt"
exit $status
