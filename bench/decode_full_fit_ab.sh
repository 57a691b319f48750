#!/usr/bin/env bash
# Issue #38: triton/decode's MANY_ITEMS_FULL_FIT (splits.SplitPolicy.past_wave_ctas_per_sm at the tile's full fit)
# off against on, in one device call (about 60 s; limit 120), through bench.decode_knob_ab (2 alternating rounds, each
# value checked against fp64 on a poisoned output first). The first A/B (bench/decode_flashinfer_gap_ab.sh) counted the
# full fit everywhere: B=64 Hkv=8 D=128 0.88-0.93x the time, rows whose items fit a wave 1.01-1.05x slower; the switch
# counts it only past a wave. Rows whose plan it changes: B=64 Hkv=8 D=128 at 4k and 32k, seed 31's row 1 and seed
# 59's row 0 (512 packed-row tiles, 1 -> 3 splits), B=48 Hkv=8 D=64 16k (384 items); controls whose plan it keeps:
# B=1 Hkv=8 128k, seed 43's row 5.
# Run from the project root carrying the CuTe DSL and FA4's wheels: carry [".gpu/cutlass-dsl.tar.xz",
# ".gpu/activate.sh", ".gpu/fa4"], command `bash bench/decode_full_fit_ab.sh`. Outputs in $OUT: times.txt, triton.log,
# triton/ (knob.csv, knob.md).
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" decode_full_fit_ab.sh runs/decode_full_fit_ab
source_carried_activations "$OUT/times.txt"
export PYTHONPATH="${PYTHONPATH:-$PWD}"
status=0
knob_ab triton 120 triton_impl.decode:MANY_ITEMS_FULL_FIT False,True triton/decode \
  73/3:batch=64,seqlen_k=4096,head_dim=128 73/3:batch=64,seqlen_k=32768,head_dim=128 31/1 59/0 \
  73/3:batch=48,seqlen_k=16384 73/3:batch=1,seqlen_k=131072,head_dim=128 43/5
exit $status
