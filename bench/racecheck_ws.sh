#!/bin/bash
# racecheck of the warp-specialisation state bytes, one device call (issue #20, fourth stop):
#   bash bench/racecheck_ws.sh      (project root; $OUT set; logs and summary.txt in $OUT/racecheck)
# 1. every bench.ws_bare variant launched without a sanitizer (outputs checked; fills the Triton cache);
# 2. compute-sanitizer racecheck of each bare variant and of both gluon rungs (bench.gluon_race_target),
#    memcheck and synccheck of the gluon rungs, 4 processes at a time, one log each;
# 3. one summary line per log: the sanitizer's own SUMMARY line and the exit code.
# results/h200/gluon-fourth-stop/racecheck/ came from a fuller scratch version that also ran two
# candidate restructurings of the gluon kernel (not kept; docs/perf-log.md, "Fourth stop").
set -u
export PYTHONUNBUFFERED=1
L=$OUT/racecheck
mkdir -p "$L"
{
  nvidia-smi --query-gpu=name,driver_version --format=csv
  python -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)"
  compute-sanitizer --version | tail -2
} > "$L/gpu.txt" 2>&1
cat "$L/gpu.txt"
VARIANTS="min base pre1 pre2 mbar1 mbar2 mbar2s defbar wrkbar smem all"
for v in $VARIANTS; do timeout 60 python -m bench.ws_bare "$v"; done 2>&1 | tee "$L/bare_outputs.log"

RACE="compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 1000 --show-backtrace no"
MEM="compute-sanitizer --tool memcheck --print-limit 100 --show-backtrace no"
SYNC="compute-sanitizer --tool synccheck --print-limit 100 --show-backtrace no"
job() {
  local name=$1
  shift
  ( timeout 200 "$@" > "$L/$name.log" 2>&1; echo "exit $?" >> "$L/$name.log" ) &
  while [ "$(jobs -rp | wc -l)" -ge 4 ]; do wait -n; done
}
for rung in hopper fp8; do
  job "race_gluon_$rung" $RACE python -m bench.gluon_race_target $rung
  job "memcheck_gluon_$rung" $MEM python -m bench.gluon_race_target $rung
  job "synccheck_gluon_$rung" $SYNC python -m bench.gluon_race_target $rung
done
for v in $VARIANTS; do job "race_bare_$v" $RACE python -m bench.ws_bare "$v"; done
wait
for log in "$L"/race_*.log "$L"/memcheck_*.log "$L"/synccheck_*.log; do
  echo "$(basename "$log" .log): $(grep -h "SUMMARY" "$log" | sed 's/^=* *//' | tr '\n' ' ')$(tail -1 "$log")"
done | tee "$L/summary.txt"
