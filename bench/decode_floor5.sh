#!/usr/bin/env bash
# Issue #38's fifth stop on a GPU in one device call (about 3 minutes on an H200): the decode rungs' new
# switches, each off by default (bench/decode_floor.py's fifth-stop settings say what each changes):
#   1. their GPU tests (tests/test_decode_policy.py -m gpu): each switch on, on a shape where it changes
#      the plan, against fp64 (poisoned output) in every decode rung that has it, and the plan it took;
#   2. bench.decode_floor on seed 29's rows (B=4 Hkv=2 D=64 276k; B=32 MHA Sq=8 1k ragged; B=16 Hkv=16
#      1280; B=64 Hkv=4 2304): after (committed; triton/decode's padded-Sk split) against slots-2,
#      one-split, deep-ring, short-tile and fifth (all), and for triton/decode on ragged shapes committed
#      (its balanced split, the default there) and balanced+short-tile, each timed only where it changes a
#      rung's plan (a rung none changes is left out), one round, cut at 75 s;
#   3. the same on seed 1's floor shapes that a switch changes (B=32 Hkv=32 4.8k ragged; B=3 H=2 55k; B=2
#      H=16 59k; B=2 Hkv=4 131k), cut at 50 s (each CSV keeps the rows done by then).
# Run from the project root: command `bash bench/decode_floor5.sh`. cute/decode's rows need the CuTe DSL
# (nvidia-cutlass-dsl) installed; without it that rung is not discovered and only its rows are missing.
# Outputs in $OUT (7 files): pytest.log (nvidia-smi's line first), floor5-seed29.log, floor5-seed29/
# (decode_floor.csv, .md), floor5-seed1.log, floor5-seed1/. Model predictions: python -m bench.decode_model --fifth
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" decode_floor5.sh runs/decode_floor5
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/pytest.log" 2>&1
status=0
timeout 50 python3 -m pytest -q -m gpu tests/test_decode_policy.py >> "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
floor=(python3 -m bench.decode_floor --rounds 1 --rep 40
  --settings after,slots-2,one-split,deep-ring,short-tile,fifth,committed,balanced+short-tile)
timeout 75 "${floor[@]}" --seed 29 --shapes 6,7,2,5 --out "$OUT/floor5-seed29" > "$OUT/floor5-seed29.log" 2>&1 || status=1
tail -14 "$OUT/floor5-seed29.log"
timeout 50 "${floor[@]}" --shapes 4,9,0,2 --out "$OUT/floor5-seed1" > "$OUT/floor5-seed1.log" 2>&1 || status=1
tail -12 "$OUT/floor5-seed1.log"
exit $status
