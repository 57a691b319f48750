#!/usr/bin/env bash
# The GPU tests of the named test files in one device call: the tests a change touched, where the whole suite
# (bench/gpu_suite.sh, two calls on one GPU) does not fit the device time left. Carries the activations (the CuTe DSL,
# FA4) when present and logs the GPU's name (not the commit: the device's copy of the tree may hold a stale .git), then
# runs `gpu_tests` (bench/_gpu_run.sh) on the files with WORKERS (default 10) xdist workers, cut at LIMIT_S (default
# 430), so that the log of a cut run still comes back with each outcome it reached.
# Run from the project root carrying [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command
# `LIMIT_S=430 bash bench/gpu_files.sh tests/test_a.py tests/test_b.py ...`. Outputs in $OUT: times.txt, pytest.log.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" gpu_files.sh runs/gpu_files
if [ "$#" -eq 0 ]; then
  echo "gpu_files.sh needs the test files to run, got none" >&2
  exit 2
fi
source_carried_activations "$OUT/times.txt"
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$OUT/times.txt" 2>&1
status=0
gpu_tests "${LIMIT_S:-430}" -n "${WORKERS:-10}" -rfE "$@"
cat "$OUT/times.txt"
exit $status
