#!/usr/bin/env bash
# The random and sanitised checks of the decode rungs and the backward in one device call (issues #38, #40): the GPU
# fuzzer on each decode rung (its Sq folded into 1..16, half the draws paged, a quarter at D=256), the gradient fuzzer
# on each hopper rung, and compute-sanitizer memcheck and racecheck over each decode rung's launch plans
# (`common.tools.sanitize.DECODE_PLANS`). The jobs run side by side, each in its own process under its own limit:
# they are checks, not timings, and mostly wait on compiles, so the host's cores are the resource they share.
# Run from the project root, carrying the CuTe DSL (../shared/gpu/README.md):
#   carry   [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh"]
#   command LIMIT_S=520 bash bench/random_checks.sh
# Outputs: $OUT/times.txt and $OUT/random_checks.tgz (a call returns 8 files at most), which holds fuzz-<rung>.md and
# .log per decode and hopper rung (the hopper rungs' named `-backward`), sanitizer-<rung>.md and .log. Each job's table
# is written when the job ends and the archive every 30 s, so a cut call keeps what its jobs reached; LIMIT_S
# (default 520) bounds each job and stays under the call's limit.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" random_checks.sh runs/random_checks
source_carried_activations "$OUT/times.txt"
export PYTHONPATH="${PYTHONPATH:-$PWD}"
LIMIT_S=${LIMIT_S:-520}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> "$OUT/times.txt" 2>&1
work=/tmp/random_checks
mkdir -p "$work"

jobs=()
# job NAME COMMAND...: one check in the background, its output to $work/NAME.log, its time and exit status to times.txt.
job() {
  local name=$1
  shift
  (
    begun=$SECONDS
    timeout "$LIMIT_S" "$@" > "$work/$name.log" 2>&1
    echo "$name rc=$? $((SECONDS - begun)) s (limit $LIMIT_S s)" >> "$OUT/times.txt"
  ) &
  jobs+=($!)
}

for stack in triton gluon cute; do
  job "fuzz-$stack-decode" python3 -m common.tools.fuzz --impl "$stack/decode" --count 30 \
    --out "$work/fuzz-$stack-decode.md"
  # Each rung's two tools side by side; a child near the call's end is a "timeout" row, not a lost table.
  job "sanitizer-$stack-decode" python3 -m common.tools.sanitize --impl "$stack/decode" \
    --timeout-s $((LIMIT_S - 40)) --out "$work/sanitizer-$stack-decode.md"
  job "fuzz-$stack-backward" python3 -m common.tools.fuzz --backward --impl "$stack/hopper" --count 20 \
    --out "$work/fuzz-$stack-backward.md"
done
# The logs so far, archived every 30 s: a call cut by its device-time limit still returns each seed reached.
snapshot() { tar czf "$OUT/snapshot.tgz" -C /tmp random_checks && mv -f "$OUT/snapshot.tgz" "$OUT/random_checks.tgz"; }
(while sleep 30; do snapshot; done) &
snapshots=$!
wait "${jobs[@]}"
kill "$snapshots"
snapshot
cat "$OUT/times.txt"
tail -n 8 "$work"/fuzz-*.log
cat "$work"/sanitizer-*.md
! grep -q "rc=[1-9]" "$OUT/times.txt"
