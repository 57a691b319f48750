#!/usr/bin/env bash
# gluon/decode's BALANCED_PAST_SHORT_CACHE with PAST_SHORT_MAX_WAVES (4) re-timed over 4 rounds on the rows helper
# `pastshort` named (seed 126's row 2, whose 2.26x loss its plan does not explain, beside the winning 56/5, the 3.9-wave
# rows of its class, the 7.8-wave D=256 rows the bound now leaves padded), then two seeds of random decode shapes no
# issue names (three decode rungs). One H200, carry [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"].
# Command: `bash bench/past_short_ab.sh`. Outputs in $OUT: times.txt, past_short.log, past_short/, seedN.log, seedN/.
set -o pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" past_short_ab.sh runs/past_short
decode_setup
status=0
begun=$SECONDS
timeout 260 python3 -m bench.decode_knob_ab --knob triton_impl.gluon.decode:BALANCED_PAST_SHORT_CACHE \
  --values False,True --rungs gluon/decode --rounds 4 --out "$OUT/past_short" \
  --rows 126/2 56/5 224/6 203/1 191/7 163/6 161/2 154/5 179/3 49/6 128/0 211/7 61/7 151/5 \
  > "$OUT/past_short.log" 2>&1 || status=1
echo "past_short: $((SECONDS - begun)) s (limit 260 s)" >> "$OUT/times.txt"
cat "$OUT/past_short/knob.md" 2>/dev/null || echo "past_short: knob.md not written"
decode_seeds 100 229 233
cat "$OUT/times.txt"
exit $status
