#!/usr/bin/env bash
# Issue #37: the fused quantiser of K and V only (cute/fp8 quantises Q in its kernel at D=128, so its quantiser runs
# FusedQuantiser(query=False)), tuned for that launch, in one device call (about 2-3 minutes on an H200):
#   1. the interleave knob's GPU byte tests (its order now gives turns only to tensors with programs; Q, K and V
#      interleaved as before): bytes against the default configuration's, poisoned buffers, block+rotation, 8 and 3
#      tiles a program, at P1 and a ragged GQA shape (the K/V-only launches are judged the same way in step 2);
#   2. bench.fp8_quantiser --ab --kv-only at P1 (B=2 H=16 S=8192 D=128 bf16), one process: the HBM read bandwidth,
#      then each of KV_AB_CANDIDATES (the K/V-only default first) judged (K's and V's bytes and scales against the
#      torch reference and against the default's bytes; Q's buffers left poisoned) and timed (L2 flushed, median;
#      3 rounds, every candidate in turn, medians): µs, GB/s, % of the read bandwidth; then cute/fp8 kernel only,
#      its K/V quantiser alone and end to end, causal first, then not, with the default and with the fastest
#      passing candidate, 3 interleaved rounds, against cute/hopper (bf16). Each candidate's and each end-to-end
#      row's line is in ab.log as it is measured (the tables are written at the end).
# Run from the project root: `bash bench/fp8_kv_quantiser_ab.sh` (cute/* needs the CuTe DSL and TVM-FFI, as for the
# other CuTe runs). Outputs in $OUT: gpu.log, pytest.log, ab.log, ab/fp8_quantiser_ab.{csv,md}.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" fp8_kv_quantiser_ab.sh runs/fp8_kv_quantiser_ab
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$OUT/gpu.log" 2>&1
status=0
timeout 45 python3 -m pytest -q -m gpu -n 4 -p no:cacheprovider tests/test_fp8_quantiser.py \
  -k "test_gpu_every_knob and block+rotation and interleaved and prefetch" > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
timeout 130 python3 -m bench.fp8_quantiser --ab --kv-only --quantiser-rounds 3 --e2e-rounds 3 \
  --warmup-ms 25 --rep-ms 150 --out "$OUT/ab" > "$OUT/ab.log" 2>&1 || status=1
tail -40 "$OUT/ab.log"
exit $status
