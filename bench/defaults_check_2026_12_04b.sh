#!/usr/bin/env bash
# The sixteenth stop's first device call (carry [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"]):
# (1) the fifteenth stop's decode defaults through their default path (gluon/decode's TWO_CONSUMERS and
#     consumers_for, cute/decode's WGMMA_D256: the files' GPU tests with nothing monkeypatched, and the gluon and cute
#     rows of tests/test_decode.py), cut at 150 s;
# (2) cute/decode's WGMMA_TWO_WARPGROUPS (off, untimed): its GPU tests, then its A/B on the 128-256-packed-row rows
#     and two controls (bench/cute_decode_two_wg_ab.sh's two steps);
# (3) issue #37's K/V quantiser against three ceilings at P1's K/V (bench.fp8_kv_quantiser_bw --only default: the
#     torch e4m3 copy, the plain Triton stream at two block sizes, the bf16 copy), 3 rounds;
# (4) a seed of random decode shapes no issue names (241) for the three decode rungs.
# Command: `bash bench/defaults_check_2026_12_04b.sh`. Outputs in $OUT: times.txt, pytest.log (1), two_wg*.log,
# two_wg/ (2), bw.log, bw/ (3), seed241.log, seed241/ (4).
set -o pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" defaults_check_2026_12_04b.sh runs/defaults_check_b
decode_setup
status=0
decode_defaults_tests 150
gpu_tests 90 -n 8 tests/test_cute_decode_two_wg.py
mv "$OUT/pytest.log" "$OUT/two_wg_tests.log"
knob_ab two_wg 150 cute_impl.decode:WGMMA_TWO_WARPGROUPS 'False,True' cute/decode \
  233/5 139/1 200/4 18/2 107/0 79/1 157/4 204/4 54/7 171/0 59/2 137/1
begun=$SECONDS
timeout 70 python3 -m bench.fp8_kv_quantiser_bw --rounds 3 --shapes "P1 D=128" --only default --out "$OUT/bw" \
  > "$OUT/bw.log" 2>&1 || status=1
echo "bw: $((SECONDS - begun)) s (limit 70 s)" >> "$OUT/times.txt"
tail -9 "$OUT/bw.log"
decode_seeds 70 241
cat "$OUT/times.txt"
exit $status
