#!/usr/bin/env bash
# The GPU tests of the named test files in one device call: the tests a change touched, where the whole suite
# (bench/gpu_suite.sh, two calls on one GPU) does not fit the device time left. Carries the activations (the CuTe DSL,
# FA4) when present, logs the GPU's name first (not the commit: the device's copy of the tree may hold a stale .git),
# and cuts pytest at LIMIT_S (default 430) so that the log of a cut run still comes back with each outcome it reached.
# Run from the project root carrying [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command
# `LIMIT_S=430 bash bench/gpu_files.sh tests/test_a.py tests/test_b.py ...`. Output in $OUT: gpu-tests.log.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" gpu_files.sh runs/gpu_files
if [ "$#" -eq 0 ]; then
  echo "gpu_files.sh needs the test files to run, got none" >&2
  exit 2
fi
log="$OUT/gpu-tests.log"
source_carried_activations "$log"
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$log" 2>&1
timeout "${LIMIT_S:-430}" python3 -m pytest -q -m gpu -n "${WORKERS:-10}" -p no:cacheprovider -rfE "$@" >> "$log" 2>&1
status=$?
echo "pytest rc=$status" >> "$log"
tail -25 "$log"
exit $status
