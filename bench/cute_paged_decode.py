"""cute/decode on a paged KV cache against the same cache contiguous: is paging within 5 %?

For a few decode shapes (bf16, D=128, 32 query heads over 8 KV heads, one token; every sequence at
the full length) this times cute/decode on the contiguous cache and on the same keys in a shuffled
page pool at pages of 16, 64 and 256 keys, each first checked against the fp64 reference by the
harness (``common.measure.runner.measure``: medians of CUDA-event timings with the L2 flushed). Writes
``cute_paged_decode.csv`` (one row per shape and page size: µs, GB/s, error, and the paged time over
the contiguous one) under ``--out`` and prints it.

    python -m bench.cute_paged_decode --out "$OUT"        # from the project root, on a GPU (~1 min)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench import require_gpu
from common.measure.results import write_rows

# (batch, cache length): a long single sequence, a typical serving batch, a large batch.
SHAPES = ((1, 131072), (8, 32768), (64, 8192))
PAGE_SIZES = (16, 64, 256)
COLUMNS = ("batch", "seqlen_k", "page_size", "status", "us", "gbps", "rel_l2_err", "paged_over_contiguous", "reason")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=Path("runs/cute-paged-decode"), help="folder for cute_paged_decode.csv"
    )
    args = parser.parse_args()
    require_gpu("bench.cute_paged_decode")

    import torch

    from common.contract.problem import Problem
    from common.measure.peaks import Peaks
    from common.measure.runner import TimingOptions, make_workload, measure
    from cute_impl import decode

    device = torch.device("cuda")
    options, peaks = TimingOptions(warmup_ms=50.0, rep_ms=300.0), Peaks(None, None, None)
    rows = []
    for batch, seqlen_k in SHAPES:
        contiguous = Problem(batch, 32, 1, seqlen_k, 128, torch.bfloat16, kv_heads=8, has_cache_seqlens=True)
        lengths = torch.full((batch,), seqlen_k, dtype=torch.int32, device=device)
        base = None
        for page_size in (0, *PAGE_SIZES):
            problem = contiguous.with_(page_size=page_size)
            row = measure(decode.IMPLEMENTATION, make_workload(problem, "cuda", lengths), device, options, peaks)
            us = row.ms * 1e3 if row.status == "ok" else float("nan")
            base = us if page_size == 0 else base
            rows.append({
                "batch": batch, "seqlen_k": seqlen_k, "page_size": page_size, "status": row.status,
                "us": round(us, 2), "gbps": round(row.gbps, 1) if row.status == "ok" else "",
                "rel_l2_err": row.rel_l2_err, "paged_over_contiguous": round(us / base, 4) if base else "",
                "reason": row.reason,
            })  # fmt: skip
            print(", ".join(f"{key}={rows[-1][key]}" for key in COLUMNS[:-1]), flush=True)
            torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    write_rows(args.out / "cute_paged_decode.csv", rows, COLUMNS)


if __name__ == "__main__":
    main()
