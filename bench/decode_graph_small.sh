#!/usr/bin/env bash
# Issue #38 item 5: caches under 64 MB are latency, so their steps are timed as CUDA-graph replays (a step captured
# once; `cache_seqlens` changed in place between replays needs no host sync), the decode rungs against FlashInfer,
# FA4 and cuDNN: `compare.py --decode --cuda-graph` at B 1 and 4, 8 KV heads (group 4), caches of 1k, 4k and 8k keys
# (4-134 MB; the rows under 64 MB are the item's), no ragged or paged batch. The last graphed run (2026-11-29,
# results/h200/decode-cuda-graph/) had no FlashInfer. About 60 s.
# Run from the project root after `bash .gpu/flashinfer/stash.sh` in a call just before, carrying
# [".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4", ".gpu/flashinfer/activate.sh"], command
# `bash bench/decode_graph_small.sh`. Outputs in $OUT: times.txt, graph.log, graph/.
set -uo pipefail
# shellcheck source=bench/_gpu_run.sh
source "$(dirname "$0")/_gpu_run.sh" decode_graph_small.sh runs/decode_graph_small
decode_setup
status=0
begun=$SECONDS
timeout 150 python3 compare.py --decode --cuda-graph --decode-batch 1,4 --decode-seqlen 1024,4096,8192 \
  --decode-kv-heads 8 --decode-no-ragged --decode-no-paged --only '*/decode' --only sdpa/cudnn --only fa4/sm90 \
  --out "$OUT/graph" > "$OUT/graph.log" 2>&1 || status=1
echo "graph: $((SECONDS - begun)) s (limit 150 s)" >> "$OUT/times.txt"
tail -30 "$OUT/graph.log"
cat "$OUT/times.txt"
exit $status
