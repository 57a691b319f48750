#!/usr/bin/env bash
# A refactor's before/after timing in one device call (issue #36): the tree at a earlier commit, carried as
# .gpu/before.tar.gz (`git archive --format=tar.gz -o .gpu/before.tar.gz <commit>`), unpacked to /tmp/before,
# and this tree each time the same P1 rows (B=2 H=16 S=8192 D=128 bf16, causal and not) with their own
# compare.py, in ROUNDS alternating rounds (before, after, before, after, ...), so drift between runs shows
# as spread within each tree, not as a difference between them.
# Run from the project root carrying the CuTe DSL and the tarball:
#   carry   [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/before.tar.gz"]
#   command bash bench/house_ab.sh
# Knobs (environment): ROUNDS (default 1), AB_ONLY (globs, default the pipelined, hopper and fp8 rungs and
# sdpa/cudnn), AB_TIMING (compare.py's --warmup and --rep in ms, default "50 300").
# Outputs in $OUT: ab.log (one line per row: round, tree, impl, causal, TFLOP/s) and ab.tgz (every run's folder).
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" house_ab.sh runs/house_ab
if [ ! -f .gpu/before.tar.gz ]; then
  echo "house_ab.sh: .gpu/before.tar.gz is missing (git archive of the commit before the refactor)" >&2
  exit 2
fi
# shellcheck disable=SC1091
source .gpu/activate.sh > "$OUT/ab.log" 2>&1
rm -rf /tmp/before && mkdir -p /tmp/before && tar xzf .gpu/before.tar.gz -C /tmp/before
ONLY=()
for glob in ${AB_ONLY:-*/pipelined */hopper */fp8 sdpa/cudnn}; do ONLY+=(--only "$glob"); done
read -r WARMUP REP <<< "${AB_TIMING:-50 300}"
AFTER=$PWD
RUNS=/tmp/house_ab
rm -rf "$RUNS"
status=0
for round in $(seq 1 "${ROUNDS:-1}"); do
  for tree in before after; do
    dir=$AFTER
    [ "$tree" = before ] && dir=/tmp/before
    (cd "$dir" && PYTHONPATH="$dir:${PYTHONPATH#"$AFTER":}" python3 compare.py --seqlen 8192 "${ONLY[@]}" \
      --warmup "$WARMUP" --rep "$REP" --out "$RUNS/$tree-$round" > "$RUNS-$tree-$round.log" 2>&1) || status=1
    python3 - "$RUNS/$tree-$round/results.csv" "$round" "$tree" >> "$OUT/ab.log" <<'PY'
import csv, sys
path, round_, tree = sys.argv[1:]
for row in csv.DictReader(open(path)):
    print(f"round {round_} {tree:6s} {row['impl']:18s} causal={row['causal']:5s} {row['status']:7s} {row['tflops']}")
PY
  done
done
cp "$RUNS"-*.log "$RUNS"/ 2>/dev/null
tar czf "$OUT/ab.tgz" -C "$RUNS" .
grep "^round" "$OUT/ab.log"
exit $status
