#!/usr/bin/env bash
# Issue #38: gluon/decode's ITEMS_IN_FLIGHT (helper gitems, docs/perf-log.md). Seed 151 row 1 (B=64 H=160 Hkv=32
# Sq=16 D=64 paged(128), ~650 keys an item: 4096 tiles of ~10 key blocks) reads 42 % of the bandwidth: each of ~15 CTAs
# an SM in turn pays its Q, its ring's fill and its O store alone. On: min(tiles, slots) CTAs walk tiles claimed by
# their load warp, which copies the next tile's Q and first blocks under the current one's last blocks and O.
# Predicted (docs/perf-log.md, helper gitems): 151/1 ~185 -> 105-150 us (0.57-0.80x, 42 -> 52-74 %); the other
# short-item rows 0.75-1.0x; 93/4 (long items, contiguous) 0.93-1.02x; the D=128 rows (a 2-stage ring to keep two
# CTAs an SM) 0.85-1.05x.
# This call: one GPU case as a smoke test under `timeout 60` (a hang ends the call there), the switch's GPU tests
# under `timeout 150` (the A/B only when they pass) (fp64 on seven shapes, three launches in a row, a planted
# skipped-tile launch and a planted ring restart that must fail: the latter in a child cut at 60 s, a hang counting as
# caught), then bench.gluon_decode_items_ab under `timeout 200` (off against on, 4 rounds, order reversed every other
# round, L2 flushed, medians, each setting checked against fp64 first) on seed 151's rows 1 and 5 and six rows of
# other seeds it takes, 151/1 first. About 4-5 minutes, most of it compiles.
# Run from the project root, no carry: `bash bench/gluon_decode_items_ab.sh`. Outputs in $OUT: times.txt,
# smoke.log, pytest.log, items.log, items/ (items.csv, items.md).
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" gluon_decode_items_ab.sh runs/gluon_decode_items_ab
decode_setup
status=0
# A smoke case first: the kernel has never run, and a wrong barrier phase hangs rather than fails.
timeout 60 python3 -m pytest -q -m gpu -x -p no:cacheprovider tests/test_gluon_decode_items.py \
  -k "against_fp64 and one-block" > "$OUT/smoke.log" 2>&1 || { tail -30 "$OUT/smoke.log"; exit 1; }
gpu_tests 150 tests/test_gluon_decode_items.py
[ "$status" = 0 ] || { tail -40 "$OUT/pytest.log"; exit 1; }
begun=$SECONDS
timeout 200 python3 -m bench.gluon_decode_items_ab --rounds 4 --rep 20 --out "$OUT/items" \
  --rows 151/1 151/5 41/2 61/7 119/5 129/5 167/1 93/4 > "$OUT/items.log" 2>&1 || status=1
echo "items: $((SECONDS - begun)) s (limit 200 s)" >> "$OUT/times.txt"
cat "$OUT/items/items.md" 2>/dev/null || tail -20 "$OUT/items.log"
cat "$OUT/times.txt"
exit $status
