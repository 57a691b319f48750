#!/usr/bin/env bash
# Issue #38's compute-bound class in gluon/decode: seed 233 row 5 (B=4 H=512 Hkv=32 Sq=16 Sk=22016 D=128, 256 packed
# rows, full cache, 256 FLOPs a K/V byte) takes gluon/decode's two consumers 656.0 us on an H200 (50 % of the read
# bandwidth), where cute/decode's packed prefill (cute/hopper's kernel on the packed rows) took it from 860.3 to 561.7
# us on an H100 (54 -> 83 %). PACKED_PREFILL_MIN_ROWS (triton_impl/gluon/decode.py, None: off, untimed) is that route
# on gluon/hopper's warp-specialised kernel: q packed as (B, Hkv, group · Sq, D) by a copy before the launch, O and
# the LSE written in place, each row's causal diagonal its token's (attention_kernel's PACKED_GROUP), by cute's rule
# (splits.packed_prefill_splits: 128 rows, uneven work from 256 rows and three waves of tiles, 90 % of the waves) but
# without key splits. Predicted: 233/5 656 -> 560-620 us (gluon/hopper's P1 loop is level with cute/hopper's; the copy
# of q, 8 MB, about 5 us), the other moved rows of 256 packed rows 0.8-0.95x, of 128 rows 0.9-1.05x; the rows the rule
# leaves (62/1, 214/0, 69/4: uneven work the guard keeps; 139/1, 107/0: short of a wave without key splits) 1.00x.
# This call: the route's GPU tests (fp64 on a poisoned output: 128-256 packed rows, D=64 and 128, Sq 1/5/8/16, full,
# ragged and lengths below Sq, both causal alignments and none, two and three consumers, the LSE; planted, the kernel
# without the packing), the route each row takes at 128 ($OUT/routes.txt), then one A/B through bench.decode_knob_ab
# (None against 128, 2 rounds, each value checked against fp64 first) on cute's A/B rows
# (bench/cute_decode_packed_prefill_ab.sh), seed 233 row 5 first. About 300 s.
# Run from the project root carrying [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"], command
# `bash bench/gluon_packed_prefill_ab.sh`. Outputs in $OUT: times.txt, pytest.log, routes.txt, packed_prefill.log,
# packed_prefill/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" gluon_packed_prefill_ab.sh runs/gluon_packed_prefill_ab
decode_setup
status=0
gpu_tests 150 -n 8 tests/test_gluon_decode_packed_prefill.py
ROWS=(233/5 176/6 157/4 204/4 140/1 62/1 100/4 214/0 231/6 69/4 18/2 139/1 107/0)
python3 -c "
import sys, torch
from bench.decode_knob_ab import parse_row
from triton_impl.gluon import decode
decode.PACKED_PREFILL_MIN_ROWS = 128
for text in sys.argv[1:]:
    problem = parse_row(text)[1].problem
    taken = decode.packed_prefill(problem, torch.device('cuda'))
    print(text, problem.describe(), 'packed prefill' if taken else 'split kernels', decode.packed_prefill_tiles(problem))
" "${ROWS[@]}" > "$OUT/routes.txt" 2>&1 || status=1
cat "$OUT/routes.txt"
knob_ab packed_prefill 240 triton_impl.gluon.decode:PACKED_PREFILL_MIN_ROWS 'None,128' gluon/decode \
  233/5 176/6 157/4 204/4 140/1 62/1 100/4 214/0 231/6 69/4 18/2 139/1 107/0
cat "$OUT/times.txt"
exit $status
