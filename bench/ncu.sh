#!/bin/bash
# Nsight Compute (--set full) of one launch per spec, each run by bench.ncu_target: one device call.
#   bash bench/ncu.sh TAG "IMPL B H S D CAUSAL" ...     (project root; $OUT set)
#   bash bench/ncu.sh TAG "IMPL decode SEED INDEX" ...  (a random decode case of compare.py --decode-seed SEED)
#   bash bench/ncu.sh TAG "IMPL backward NAME" ...      (every kernel of one backward at bench.backward's shape NAME)
#   a spec may end in --set MODULE:NAME=LITERAL (bench.ncu_target holds that constant), e.g. a build off by default
#   e.g. bash bench/ncu.sh t36 "gluon/fp8 2 16 8192 128 0" "gluon/hopper 4 32 8192 64 0"
# Writes $OUT/ncu-TAG-NAME.tgz as each spec ends (a call cut short keeps the specs done; a call returns 8 files):
# the details page, the raw metrics (csv) and the SASS source page (csv). NCU_TIMEOUT_S (default 240) bounds each.
# Produced results/h200/gluon-fourth-stop/ncu/ (the *.details.txt).
# The CuTe DSL and FA4 where carried (.gpu/, ../shared/gpu/README.md), for cute/* and fa4/* targets.
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" ncu.sh runs/ncu
source_carried_activations
export PYTHONPATH="${PYTHONPATH:-$PWD}"
tag=$1
shift
for spec in "$@"; do
  read -r impl shape <<< "$spec"
  # Letters, digits, '.', '_' and '-' only: a --set's ':' and '=' would not come back from the device.
  name=$(printf '%s_%s' "${impl//\//_}" "${shape// /_}" | tr -c 'A-Za-z0-9_.-' '_')
  res=/tmp/ncu-$tag-$name
  mkdir -p "$res"
  # shellcheck disable=SC2086 # the shape's words are the target's arguments
  timeout "${NCU_TIMEOUT_S:-240}" ncu --clock-control none --profile-from-start off --set full --import-source no \
    -o "$res/$name" python -m bench.ncu_target "$impl" $shape > "$res/$name.log" 2>&1
  echo "ncu rc $?" >> "$res/$name.log"
  ncu --import "$res/$name.ncu-rep" --page details > "$res/$name.details.txt" 2>&1
  ncu --import "$res/$name.ncu-rep" --page raw --csv > "$res/$name.raw.csv" 2>&1
  ncu --import "$res/$name.ncu-rep" --page source --csv --print-source sass > "$res/$name.sass.csv" 2>&1 || true
  tail -2 "$res/$name.log"
  grep -E "^  [a-z_]|Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occ|L2 Hit Rate|Issue Slots Busy|Warp Cycles Per Issued" \
    "$res/$name.details.txt" | head -40
  rm -f "$res"/*.ncu-rep
  tar czf "$OUT/ncu-$tag-$name.tgz" -C /tmp "ncu-$tag-$name"
done
