# usage: bash .gpu/n20/ncu.sh TAG "impl b h s d causal" ...   (from the repo root; $OUT set)
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
tag=$1; shift
res=/tmp/ncu-$tag; mkdir -p $res
for spec in "$@"; do
  set -- $spec
  name=${1//\//_}_D$5_c$6
  timeout 240 ncu --clock-control none --profile-from-start off --set full --import-source no \
      -o $res/$name python .gpu/n20/target.py $spec > $res/$name.log 2>&1
  echo "ncu rc $?" >> $res/$name.log
  ncu --import $res/$name.ncu-rep --page details > $res/$name.details.txt 2>&1
  ncu --import $res/$name.ncu-rep --page raw --csv > $res/$name.raw.csv 2>&1
  ncu --import $res/$name.ncu-rep --page source --csv --print-source sass > $res/$name.sass.csv 2>&1 || true
  tail -2 $res/$name.log
  grep -E "Duration|Compute \(SM\) Throughput|Registers Per|Issue Slots Busy|Warp Cycles Per Issued" $res/$name.details.txt | head -8
done
rm -f $res/*.ncu-rep
tar czf $OUT/ncu-$tag.tgz -C /tmp ncu-$tag
