"""gluon/decode over a paged KV cache against the same cache contiguous (issue #38, item 2).

For one decode step at B=8, 8 KV heads of 32 query heads (group 4), Sk=32k, D=128, bf16, every
sequence full, this runs gluon/decode on the contiguous cache and on the same keys in page pools of
16, 64 and 256 keys (shuffled pages, ``common.contract.inputs.make_paged_kv``), checks that each paged
output equals the contiguous one bit for bit (the rung copies the same rows into the same ring), and
times each (median of CUDA-event timings with L2 flushed, ``common.measure.timing.time_cuda``), with
triton/decode on the same pools beside it. Writes ``gluon_paged_decode.csv`` and a markdown table
``gluon_paged_decode.md`` (µs, GB/s of K and V read, paged time over contiguous) under ``--out``.

    python -m bench.gluon_paged_decode --out "$OUT"      # from the project root, on a GPU (~1 minute)

``--out`` defaults to ``$OUT``, else ``runs/gluon-paged-decode``.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from pathlib import Path

from bench import require_gpu
from common.measure.results import write_rows

PAGE_SIZES = (0, 16, 64, 256)
RUNGS = ("gluon/decode", "triton/decode")


@dataclass
class PagedRow:
    """One rung at one page size (0: the contiguous cache)."""

    impl: str
    page_size: int
    status: str
    us: float = math.nan
    gbps: float = math.nan
    vs_contiguous: float = math.nan
    reason: str = ""


def decode_problem(page_size: int):
    """The timed step, its cache as pages of ``page_size`` keys (0: contiguous)."""
    import torch

    from common.contract.problem import Problem

    return Problem(8, 32, 1, 32768, 128, dtype=torch.bfloat16, kv_heads=8, has_cache_seqlens=True, page_size=page_size)


def measure(impl, page_size: int, contiguous: dict, options: argparse.Namespace) -> tuple[PagedRow, object]:
    """Prepare ``impl`` on the cache as pages of ``page_size`` keys (0: contiguous), check gluon/decode's
    paged output against its contiguous one, time it; never raises. Returns the row and the output."""
    import torch

    from common.contract.inputs import make_paged_kv
    from common.contract.registry import per_call_inputs
    from common.measure.timing import time_cuda

    problem = decode_problem(page_size)
    row = PagedRow(impl.name, page_size, "ok")
    ok, reason = impl.check(problem, torch.device("cuda"))
    if not ok:
        row.status, row.reason = "skipped", reason
        return row, None
    q, k, v, lengths = contiguous["q"], contiguous["k"], contiguous["v"], contiguous["lengths"]
    table = None
    if page_size:
        k, v, table = make_paged_kv(problem, k, v, seed=page_size)
    try:
        run = impl.prepare(q, k, v, problem, **per_call_inputs(problem, lengths, table))
        out = run().clone()
        reference = contiguous["out"].get(impl.name)
        if page_size and reference is not None and not torch.equal(out, reference):
            error = (out.float() - reference.float()).abs().max().item()
            row.status, row.reason = "wrong", f"differs from the contiguous output (max |diff| {error:.3g})"
        timing = time_cuda(run, warmup_ms=options.warmup_ms, rep_ms=options.rep_ms)
    except Exception as error:  # noqa: BLE001 - a variant that fails is a row, the run goes on
        row.status, row.reason = "failed", f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        return row, None
    row.us = timing.ms * 1e3
    kv_bytes = 2 * problem.batch * problem.kv_heads * problem.seqlen_k * problem.head_dim * q.element_size()
    row.gbps = kv_bytes / (timing.ms * 1e-3) / 1e9
    return row, out


def run(options: argparse.Namespace) -> list[PagedRow]:
    import torch

    from common.contract.inputs import make_inputs
    from common.contract.registry import get

    problem = decode_problem(0)
    q, k, v = make_inputs(problem, seed=0, device="cuda")
    lengths = torch.full((problem.batch,), problem.seqlen_k, dtype=torch.int32, device="cuda")
    contiguous = {"q": q, "k": k, "v": v, "lengths": lengths, "out": {}}
    rows = []
    for name in RUNGS:
        impl = get(name)
        for page_size in PAGE_SIZES:
            row, out = measure(impl, page_size, contiguous, options)
            if page_size == 0 and out is not None:
                contiguous["out"][name] = out
            rows.append(row)
            print(f"{row.impl:14s} page={row.page_size:3d} {row.status:7s} {row.us:9.1f} us {row.reason}", flush=True)
            torch.cuda.empty_cache()
    for row in rows:
        base = next(r for r in rows if r.impl == row.impl and r.page_size == 0)
        row.vs_contiguous = row.us / base.us
    return rows


def write(rows: list[PagedRow], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_rows(out / "gluon_paged_decode.csv", rows, list(PagedRow.__dataclass_fields__))
    lines = [
        "B=8, Hkv=8, H=32, Sk=32768 (full), D=128, bf16, one token; page 0 = contiguous cache",
        "",
        "| rung | page | status | µs | GB/s | paged / contiguous |",
        "|---|---:|---|---:|---:|---:|",
    ]
    lines += [
        f"| {r.impl} | {r.page_size} | {r.status} {r.reason} | {r.us:.1f} | {r.gbps:.0f} | {r.vs_contiguous:.3f} |"
        for r in rows
    ]
    (out / "gluon_paged_decode.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_out = Path(os.environ.get("OUT", "runs/gluon-paged-decode"))
    parser.add_argument("--out", type=Path, default=default_out, help="folder for the CSV and the markdown table")
    parser.add_argument("--warmup-ms", type=float, default=100)
    parser.add_argument("--rep-ms", type=float, default=500)
    options = parser.parse_args()
    require_gpu("bench.gluon_paged_decode")
    write(run(options), options.out)
    print(f"wrote {options.out / 'gluon_paged_decode.md'}")


if __name__ == "__main__":
    main()
