#!/usr/bin/env bash
# Issue #37: the K/V quantiser's bandwidth A/B (bench/fp8_kv_quantiser_bw.py), in one device call of about 2-3 minutes
# on an H200:
#   1. the candidates' GPU tests (tests/test_fp8_quantiser_value_launch.py -m gpu: each candidate's K and V bytes and
#      scales against the K/V default's at P1, the launch-changing ones at a ragged GQA shape too, K alone and V alone,
#      and the full quantiser with V apart), cut at 60 s;
#   2. bench.fp8_kv_quantiser_bw at P1's K/V (B=2 Hkv=16 S=8192 D=128) and at D=64 (B=4 H=32 S=8192), one process:
#      the HBM read bandwidth, then per shape the K/V default and the candidates (the L2 prefetch, V in a launch of
#      its own at twice the warps or on a cp.async ring; bytes against the default's), each timed K+V, K alone and V
#      alone, and torch copies of K and V into e4m3 (the same bytes: the roofline), 3 interleaved rounds, medians;
#      the table last.
# Run from the project root: `bash bench/fp8_kv_quantiser_bw.sh`. Outputs in $OUT (5 files): gpu.log, pytest.log,
# bw.log, bw/fp8_kv_quantiser_bw.{csv,md}.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" fp8_kv_quantiser_bw.sh runs/fp8_kv_quantiser_bw
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$OUT/gpu.log" 2>&1
status=0
timeout 60 python3 -m pytest -q -m gpu -n 4 -p no:cacheprovider tests/test_fp8_quantiser_value_launch.py \
  > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
timeout 130 python3 -m bench.fp8_kv_quantiser_bw --rounds 3 --out "$OUT/bw" > "$OUT/bw.log" 2>&1 || status=1
tail -18 "$OUT/bw.log"
exit $status
