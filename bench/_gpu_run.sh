# Sourced by the bench scripts that need one GPU, as `source "$(dirname "$0")/_gpu_run.sh" NAME DEFAULT_OUT`:
# refuses (exit 2, naming the script) where no CUDA GPU is visible, then makes $OUT (DEFAULT_OUT unless
# the caller set it) and unbuffers Python's output so the logs follow the run. A script that needs the carried CuTe
# DSL and FA4 calls `source_carried_activations [LOG]` (each .gpu/ activation present is sourced, its output to LOG,
# by default $OUT/gpu.log).
if ! python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "$1 needs a CUDA GPU (Hopper); none is visible" >&2
  exit 2
fi
OUT=${OUT:-$2}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

source_carried_activations() {
  local activate
  for activate in .gpu/activate.sh .gpu/fa4/activate.sh; do
    if [ -f "$activate" ]; then
      # shellcheck disable=SC1090
      source "$activate" >> "${1:-$OUT/gpu.log}" 2>&1
    fi
  done
}
