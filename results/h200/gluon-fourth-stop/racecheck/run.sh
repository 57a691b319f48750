#!/bin/bash
# Issue #20, racecheck of the warp-specialisation state bytes: one device call, Triton 3.6 (the
# machine's own; no triton.sh), from the repo root. Carry: .gpu/r20 only.
#   bash .gpu/r20/run.sh
# 1. correctness without a sanitizer (current and candidate kernels, both rungs, 4 ragged shapes,
#    3 seeds, the suite's rules) and the bare kernels' outputs; this also fills the Triton cache;
# 2. compute-sanitizer, 4 processes at a time, one log each: racecheck of the 10 bare kernels
#    (.gpu/r20/ws_bare.py) and of the current and candidate gluon kernels, memcheck and synccheck
#    of the candidate;
# 3. one summary line per log ($OUT/r20/summary.txt), and the SASS of every kernel that ran (from
#    the Triton cache, so the racecheck PCs can be placed).
set -u
export PYTHONPATH=$PWD
export TRITON_CACHE_DIR=/tmp/r20-triton-cache
L=$OUT/r20
mkdir -p "$L"
{
  nvidia-smi --query-gpu=name,driver_version --format=csv
  python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)"
  compute-sanitizer --version | tail -2
} > "$L/gpu.txt" 2>&1
cat "$L/gpu.txt"

G=.gpu/r20/gluon_one.py
# 1. correctness and cache warm-up (4 processes side by side)
for rung in hopper fp8; do
  for kernel in current candidate; do
    ( timeout 200 python3 $G $rung $kernel A,B,C,D --check > "$L/check_${rung}_${kernel}.log" 2>&1
      echo "exit $?" >> "$L/check_${rung}_${kernel}.log" ) &
  done
done
( for v in base pre1 pre2 mbar1 mbar2 mbar2s defbar wrkbar smem all; do timeout 60 python3 .gpu/r20/ws_bare.py $v; done ) \
  > "$L/bare_outputs.log" 2>&1 &
wait
grep -h -E "^check|^exit|Error|error" "$L"/check_*.log | grep -v "^check.*: ok" | head -20
echo "checks ok: $(cat "$L"/check_*.log | grep -c '^check.*: ok') of 48"; cat "$L/bare_outputs.log"

# 2. sanitizer runs, 4 at a time
RACE="compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 1000 --show-backtrace no"
MEM="compute-sanitizer --tool memcheck --print-limit 100 --show-backtrace no"
SYNC="compute-sanitizer --tool synccheck --print-limit 100 --show-backtrace no"
job() {
  local name=$1
  shift
  ( timeout 200 "$@" > "$L/$name.log" 2>&1; echo "exit $?" >> "$L/$name.log" ) &
  while [ "$(jobs -rp | wc -l)" -ge 4 ]; do wait -n; done
}
job race_gluon_hopper_current_A $RACE python3 $G hopper current A
job race_gluon_hopper_candidate_A $RACE python3 $G hopper candidate A
job race_gluon_fp8_current_A $RACE python3 $G fp8 current A
job race_gluon_fp8_candidate_A $RACE python3 $G fp8 candidate A
job race_gluon_hopper_current_B $RACE python3 $G hopper current B
job race_gluon_hopper_candidate_B $RACE python3 $G hopper candidate B
job memcheck_gluon_hopper_candidate $MEM python3 $G hopper candidate A,B,C,D
job memcheck_gluon_fp8_candidate $MEM python3 $G fp8 candidate A,B,C,D
job synccheck_gluon_hopper_current $SYNC python3 $G hopper current A
job synccheck_gluon_hopper_candidate $SYNC python3 $G hopper candidate A,B
job synccheck_gluon_fp8_candidate $SYNC python3 $G fp8 candidate A,B
for v in base pre1 pre2 mbar1 mbar2 mbar2s defbar wrkbar smem all; do
  job race_bare_$v $RACE python3 .gpu/r20/ws_bare.py $v
done
wait

# 3. summaries and SASS of every compiled kernel
python3 .gpu/r20/summarise.py "$L"/race_*.log "$L"/memcheck_*.log "$L"/synccheck_*.log | tee "$L/summary.txt"
DIS=$(python3 -c "import triton, os; print(os.path.dirname(triton.__file__) + '/backends/nvidia/bin/nvdisasm')")
mkdir -p /tmp/r20-sass
for cubin in "$TRITON_CACHE_DIR"/*/*.cubin; do
  hash=$(basename "$(dirname "$cubin")")
  name=$(basename "$cubin" .cubin)
  "$DIS" -c -g "$cubin" > "/tmp/r20-sass/${name}_${hash:0:12}.sass" 2>&1
  cp "$(dirname "$cubin")/$name.json" "/tmp/r20-sass/${name}_${hash:0:12}.json" 2>/dev/null
done
tar cJf "$L/sass.tar.xz" -C /tmp r20-sass
echo "r20 done: $(ls "$L" | wc -l) files in \$OUT/r20"
