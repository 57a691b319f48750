#!/usr/bin/env bash
# Issue #39: attention()'s host path of two trees on the GPU machine's host, alternating in separate processes
# (the host drifts between processes, so the pairs interleave): `bench.host_path` (launches stubbed, CPU tensors) for
# the plan hit and the growing cache, through attention() and through the transformers adapter. BASE is a copy of the
# tree to compare against (e.g. `git archive <commit> common triton_impl cute_impl bench compare.py`, unpacked under
# the ignored .gpu/ and carried); the working tree is the other side. Run as `BASE=.gpu/base bash
# bench/host_path_ab.sh` (PAIRS=3 by default, OUT=... to choose the folder); about 25 s a pair.
# Outputs in $OUT: base-N.md, base-tf-N.md, new-N.md, new-tf-N.md (one bench.host_path table each).
set -euo pipefail
source "$(dirname "$0")/_gpu_run.sh" host_path_ab.sh runs/host_path_ab
BASE=${BASE:?BASE must name the other tree}
ROOT=$PWD
source_carried_activations
PATHS=${PYTHONPATH:+:$PYTHONPATH}
for pair in $(seq "${PAIRS:-3}"); do
  for side in base new; do
    tree=$ROOT
    [ "$side" = base ] && tree=$BASE
    (cd "$tree" && PYTHONPATH=$PWD$PATHS python3 -m bench.host_path --calls 200 --rounds 5 > "$OUT/$side-$pair.md")
    (cd "$tree" && PYTHONPATH=$PWD$PATHS python3 -m bench.host_path --calls 200 --rounds 5 --transformers \
      > "$OUT/$side-tf-$pair.md")
  done
done
tail -n +1 "$OUT"/*.md
