#!/usr/bin/env bash
# cute/hopper's backward with LSE₂ and D loaded by TMA into each ring slot (BackwardTiles.tma_rows, off by
# default; cute_impl/backward/hopper_rows.py; issue #40), and at D=64 also with each step's dK left in flight
# under the next step's first products (dkdv_overlap with dq="reduce"), on a GPU for the first time, in one
# device call (about 3 minutes on an H200):
#   1. its GPU tests (4 workers, about 45 s, mostly compiling): every tma_rows candidate against fp64 on
#      the shapes that probe the tiles (query tails inside a block, Sq not a multiple of four, rows that
#      see no key, one query or key, MQA and GQA, D 64 and 128, causal in both alignments and not);
#   2. bench.backward --candidates --rung cute at P1, P1 causal and D64 B4 H32, one process: the default
#      (m64_s2_dqreduce, what default_tiles picks; bench.backward's "default" names the first candidate,
#      the deterministic separate pass) against m64_s2_dqreduce_tmarows (D 64 and 128) and
#      m64_s3_dqreduce_dkdvoverlap_tmarows (D 64 only: ptxas serialises the overlap at D=128; three slots,
#      as an overlapped step frees its slot one step late), beside cuDNN, SDPA flash and FA4 (fa4/sm90)
#      timed alike (about 2 minutes with the compiles; rows past the 120 s budget are written "skipped",
#      the D=64 overlapped variant last).
# Run from the project root: command `bash bench/backward_sched_ab.sh`; needs the CuTe DSL and FA4
# (flash_attn.cute) carried by the call.
# Outputs in $OUT: gpu.log, pytest.log, candidates.log, candidates/candidates.csv.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" backward_sched_ab.sh runs/backward_sched_ab
export PYTHONPATH="${PYTHONPATH:-$PWD}"
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.log" 2>&1
status=0
timeout 60 python3 -m pytest -q -n 4 -m gpu tests/test_cute_backward.py -k tma_rows > "$OUT/pytest.log" 2>&1 || status=1
tail -3 "$OUT/pytest.log"
variants=(--variant m64_s2_dqreduce --variant m64_s2_dqreduce_tmarows --variant m64_s3_dqreduce_dkdvoverlap_tmarows)
timeout 130 python3 -m bench.backward --candidates --rung cute --shape P1 --shape "P1 causal" --shape "D64 B4 H32" \
  "${variants[@]}" --budget-s 120 --out "$OUT/candidates" > "$OUT/candidates.log" 2>&1 || status=1
tail -30 "$OUT/candidates.log"
exit $status
