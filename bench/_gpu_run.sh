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

# knob_ab NAME LIMIT_S KNOB VALUES RUNGS ROW...: one `bench.decode_knob_ab` run (its log $OUT/NAME.log, its table
# $OUT/NAME/knob.md, printed), cut at LIMIT_S; a failure sets `status` to 1 (the caller's exit status).
knob_ab() {
  local name=$1 limit=$2 knob=$3 values=$4 rungs=$5 begun=$SECONDS held=() constant
  shift 5
  # KNOB_AB_SET: MODULE:NAME=LITERAL words held for the whole run (bench.decode_knob_ab's --set).
  for constant in ${KNOB_AB_SET:-}; do held+=(--set "$constant"); done
  timeout "$limit" python3 -m bench.decode_knob_ab --knob "$knob" --values "$values" --rungs "$rungs" --rounds 2 \
    ${held[@]+"${held[@]}"} --out "$OUT/$name" --rows "$@" > "$OUT/$name.log" 2>&1 || status=1
  echo "$name: $((SECONDS - begun)) s (limit $limit s)" >> "$OUT/times.txt"
  cat "$OUT/$name/knob.md" 2>/dev/null || echo "$name: knob.md not written, no row finished"
}

# decode_setup: the carried activations (the CuTe DSL, FA4, FlashInfer where stashed), PYTHONPATH and the GPU's name,
# logged to $OUT/times.txt, for the decode A/B scripts.
decode_setup() {
  source_carried_activations "$OUT/times.txt"
  # shellcheck disable=SC1091
  source .gpu/flashinfer/activate.sh >> "$OUT/times.txt" 2>&1 || echo "flashinfer: not activated" >> "$OUT/times.txt"
  export PYTHONPATH="${PYTHONPATH:-$PWD}"
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$OUT/times.txt" 2>&1
}

# decode_with_knob LIMIT_S MODULE:NAME PATTERN: `compare.py --decode` of gluon/decode and FlashInfer with that switch
# set to True in the process ($OUT/decode.tgz), its log's lines matching PATTERN printed; a failure sets `status` to 1.
decode_with_knob() {
  local limit=$1 module=${2%%:*} name=${2##*:} begun=$SECONDS
  timeout "$limit" python3 -c "
import importlib, runpy, sys
setattr(importlib.import_module('$module'), '$name', True)
sys.argv = ['compare.py', '--decode', '--only', 'gluon/decode', '--only', 'flashinfer/decode', '--out', '/tmp/decode']
runpy.run_path('compare.py', run_name='__main__')
" > /tmp/decode.log 2>&1 || status=1
  echo "decode ($name on): $((SECONDS - begun)) s (limit $limit s)" >> "$OUT/times.txt"
  mkdir -p /tmp/decode && cp /tmp/decode.log /tmp/decode/ && tar czf "$OUT/decode.tgz" -C /tmp decode
  grep -- "$3" /tmp/decode.log | head -8
}

# gpu_tests LIMIT_S FILE...: the files' `gpu` tests ($OUT/pytest.log), cut at LIMIT_S; a failure sets `status` to 1.
gpu_tests() {
  local limit=$1 begun=$SECONDS
  shift
  timeout "$limit" python3 -m pytest -q -m gpu -p no:cacheprovider "$@" > "$OUT/pytest.log" 2>&1 || status=1
  echo "gpu tests: $((SECONDS - begun)) s (limit $limit s)" >> "$OUT/times.txt"
  tail -3 "$OUT/pytest.log"
}

# decode_defaults_tests LIMIT_S: the fifteenth stop's decode defaults through their default path (gluon/decode's
# TWO_CONSUMERS and consumers_for, cute/decode's WGMMA_D256: the files' GPU tests with nothing monkeypatched, and the
# gluon and cute rows of tests/test_decode.py), cut at LIMIT_S ($OUT/defaults.log); a failure sets `status` to 1.
decode_defaults_tests() {
  gpu_tests "$1" -n 8 tests/test_gluon_decode_two_consumers.py tests/test_cute_decode_wgmma_d256.py \
    tests/test_decode.py -k "two_consumers or wgmma_d256 or gluon or cute"
  mv "$OUT/pytest.log" "$OUT/defaults.log"
}

# decode_seeds LIMIT_S SEED...: `compare.py --decode --decode-random 8` at each seed for the three decode rungs
# ($OUT/seedN.log, $OUT/seedN/), each cut at LIMIT_S, its lowest-bandwidth line printed; a failure sets `status` to 1.
decode_seeds() {
  local limit=$1 seed begun
  shift
  for seed in "$@"; do
    begun=$SECONDS
    timeout "$limit" python3 compare.py --decode --decode-random 8 --decode-seed "$seed" --only triton/decode \
      --only gluon/decode --only cute/decode --out "$OUT/seed$seed" > "$OUT/seed$seed.log" 2>&1 || status=1
    echo "seed$seed: $((SECONDS - begun)) s (limit $limit s)" >> "$OUT/times.txt"
    grep 'lowest %' "$OUT/seed$seed.log"
  done
}
