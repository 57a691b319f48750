#!/bin/bash
# Nsight Compute (--set full) of one launch per spec, each run by bench.ncu_target: one device call.
#   bash bench/ncu.sh TAG "IMPL B H S D CAUSAL" ...     (project root; $OUT set)
#   e.g. bash bench/ncu.sh t36 "gluon/fp8 2 16 8192 128 0" "gluon/hopper 4 32 8192 64 0"
# Writes $OUT/ncu-TAG.tgz: per spec the details page, the raw metrics (csv) and the SASS source page (csv).
# Produced results/h200/gluon-fourth-stop/ncu/ (the *.details.txt).
export PYTHONUNBUFFERED=1
tag=$1
shift
res=/tmp/ncu-$tag
mkdir -p "$res"
for spec in "$@"; do
  read -r impl b h s d causal <<< "$spec"
  name=${impl//\//_}_D${d}_c${causal}
  timeout 240 ncu --clock-control none --profile-from-start off --set full --import-source no \
    -o "$res/$name" python -m bench.ncu_target "$impl" "$b" "$h" "$s" "$d" "$causal" > "$res/$name.log" 2>&1
  echo "ncu rc $?" >> "$res/$name.log"
  ncu --import "$res/$name.ncu-rep" --page details > "$res/$name.details.txt" 2>&1
  ncu --import "$res/$name.ncu-rep" --page raw --csv > "$res/$name.raw.csv" 2>&1
  ncu --import "$res/$name.ncu-rep" --page source --csv --print-source sass > "$res/$name.sass.csv" 2>&1 || true
  tail -2 "$res/$name.log"
  grep -E "Duration|Compute \(SM\) Throughput|Registers Per|Issue Slots Busy|Warp Cycles Per Issued" \
    "$res/$name.details.txt" | head -8
done
rm -f "$res"/*.ncu-rep
tar czf "$OUT/ncu-$tag.tgz" -C /tmp "ncu-$tag"
