#!/usr/bin/env bash
# gluon/hopper's backward with LSE₂ and D loaded by TMA into each ring slot with Q and dO (BackwardTiles.tma_rows,
# off by default; triton_impl/gluon/backward_rows.py; issue #40), on a GPU for the first time, in one device call
# (at most about 150 s on an H200):
#   1. its GPU tests (8 workers, at most 55 s, mostly compiling): every tma_rows candidate against fp64 on the
#      shapes that probe the rows (Sq not a multiple of four, query tails inside a block, rows that see no key,
#      one query or key, MQA and GQA, D 64 and 128; tests/test_gluon_backward_rows.py) and on
#      tests/test_backward.py's ragged GQA causal shapes (test_gpu_every_candidate_passes_the_rule -k tma_rows);
#   2. bench.backward --candidates --rung gluon at P1, P1 causal and D64 B4 H32, one process: the default (D=128:
#      dkdv 128x32 s3 overlapped; D=64: dkdv 128x64 s2) against the same tiles with tma_rows, and at D=64 also
#      the overlapped s3 with tma_rows, beside cuDNN, SDPA flash and FA4 (fa4/sm90) timed alike. Rows past the
#      80 s budget are written "skipped"; without flash_attn.cute the FA4 rows read "failed" and the rest runs.
# Run from the project root: command `bash bench/gluon_backward_rows_ab.sh` (FA4 carried by the call if wanted).
# Outputs in $OUT: gpu.log, pytest.log, candidates.log, candidates/candidates.csv.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" gluon_backward_rows_ab.sh runs/gluon_backward_rows_ab
export PYTHONPATH="${PYTHONPATH:-$PWD}"
{
  nvidia-smi --query-gpu=name,memory.total --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} > "$OUT/gpu.log" 2>&1
status=0
timeout 55 python3 -m pytest -q -n 8 -m gpu tests/test_gluon_backward_rows.py tests/test_backward.py -k tma_rows \
  > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
variants=(
  --variant default
  --variant "dkdv 128x32 s3, dq 128x64 s3 overlap tma_rows"
  --variant "dkdv 128x64 s2, dq 128x64 s2 tma_rows"
  --variant "dkdv 128x64 s3, dq 128x64 s3 overlap tma_rows"
)
timeout 90 python3 -m bench.backward --candidates --rung gluon --shape P1 --shape "P1 causal" --shape "D64 B4 H32" \
  "${variants[@]}" --budget-s 80 --out "$OUT/candidates" > "$OUT/candidates.log" 2>&1 || status=1
tail -30 "$OUT/candidates.log"
exit $status
