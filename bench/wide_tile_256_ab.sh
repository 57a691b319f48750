#!/usr/bin/env bash
# Issue #38's compute-bound class found by seeds 229 and 233 (256 packed rows a KV head: 256 FLOPs a K/V byte, past the
# read bandwidth's roofline): gluon/decode's WIDE_M_TILE (two warpgroups on one ring, 128 rows a CTA, off) on the
# sweep's 256-row rows at D=64/128 and three 128-row controls, 2 rounds. One H200, carry [".gpu/cutlass-dsl.tar.xz",
# ".gpu/activate.sh", ".gpu/fa4"]. Command: `bash bench/wide_tile_256_ab.sh`. Outputs in $OUT: times.txt, wide.log, wide/.
set -o pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" wide_tile_256_ab.sh runs/wide_tile_256
decode_setup
status=0
knob_ab wide 300 triton_impl.gluon.decode:WIDE_M_TILE False,True gluon/decode \
  233/5 139/1 200/4 100/6 18/2 176/6 107/0 231/6 234/1 100/4 54/7 171/0 52/5
cat "$OUT/times.txt"
exit $status
