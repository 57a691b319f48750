"""``time_cuda``'s two flushes A/B (issue #38): ``"write"`` (do_bench's zeroing, the L2 left dirty) against
``"clean"`` (the same zeroing, then a read that leaves the L2 clean; ``common.measure.timing``), alternating round
by round, on reads of fixed size and on decode rows.

* ``sum N MB``: ``torch.sum`` over a flat bf16 buffer of N MB (the reduction the read bandwidth is measured with);
* decode rows ``SEED/INDEX`` (``bench.decode_knob_ab.parse_row``'s syntax) in each decode rung, as committed, each
  checked against fp64 on a poisoned output before it is timed.

µs are the mean over rounds of each round's median; % is of the read bandwidth measured in the same process
(``measure_read_gbps``: a 4 GiB sum, today's "write" flush). Writes ``flush.csv`` and ``flush.md`` under ``--out``.

    python -m bench.flush_ab --out runs/flush          # from the project root, on a GPU
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from bench import require_gpu
from bench.decode_knob_ab import parse_row
from bench.decode_ragged_ab import RUNG_MODULES
from common.measure.results import CsvLog

FLUSHES = ("write", "clean")
SUM_MB = (64, 136, 512, 2000)
ROWS = ("73/0", "73/3")
COLUMNS = ("row", "impl", "mb", "flush", "status", "us", "pct_read_bw", "reason")


def alternating(fn: Callable[[], object], rounds: int, rep_ms: float) -> dict[str, float]:
    """Flush -> mean µs over ``rounds`` of ``time_cuda``'s median, the flushes alternating round by round."""
    from common.measure.timing import time_cuda

    us: dict[str, list[float]] = {flush: [] for flush in FLUSHES}
    for _ in range(rounds):
        for flush in FLUSHES:
            us[flush].append(time_cuda(fn, warmup_ms=25, rep_ms=rep_ms, flush=flush).ms * 1e3)
    return {flush: statistics.mean(values) for flush, values in us.items()}


def records(
    row: str, impl: str, nbytes: int, us: dict[str, float], read_gbps: float, status: str, reason: str
) -> list[dict]:
    return [{"row": row, "impl": impl, "mb": round(nbytes / 1e6), "flush": flush, "status": status, "us": us[flush],
             "pct_read_bw": 100 * nbytes / (us[flush] * 1e3) / read_gbps, "reason": reason}
            for flush in FLUSHES]  # fmt: skip


def decode_records(label: str, case, impls: dict, args: argparse.Namespace, read_gbps: float) -> list[dict]:
    """Each decode rung on one row: prepared, judged against fp64, then timed under both flushes."""
    import torch

    from bench.decode_floor import prepared
    from common.measure.runner import judge_on_workload

    workload, extra = case.gpu_workload(device=torch.device("cuda"))
    result = []
    for rung in args.rungs:
        nan = dict.fromkeys(FLUSHES, float("nan"))
        if rung not in impls:
            result += records(label, rung, case.kv_bytes_read, nan, read_gbps, "missing", "not available here")
            continue
        if failed := prepared(impls[rung], workload, case.problem, extra):
            result += records(label, rung, case.kv_bytes_read, nan, read_gbps, failed[0], failed[4])
            continue
        run = impls[rung].bind(workload.q, workload.k, workload.v, case.problem, **extra)
        ok, reason, _ = judge_on_workload(impls[rung], run, workload)
        us = alternating(run, args.rounds, args.rep) if ok else nan
        result += records(label, rung, case.kv_bytes_read, us, read_gbps, "ok" if ok else "wrong", reason)
    del workload, extra
    torch.cuda.empty_cache()
    return result


def markdown(rows: list[dict], read_gbps: float) -> str:
    """One line per (row, impl): µs (% of the read bandwidth) under each flush, and clean ÷ write."""
    title = f"time_cuda flush A/B (bench/flush_ab.py): µs (% of {read_gbps:.0f} GB/s)"
    lines = [title, "", "| row | impl | MB | write | clean | clean / write |", "|---|---|---|---|---|---|"]
    cell = {(r["row"], r["impl"], r["flush"]): r for r in rows}
    for row, impl in dict.fromkeys((r["row"], r["impl"]) for r in rows):
        write, clean = (cell[row, impl, flush] for flush in FLUSHES)
        cells = [
            f"{r['us']:.1f} ({r['pct_read_bw']:.0f} %)" if r["status"] == "ok" else r["status"] for r in (write, clean)
        ]
        lines.append(f"| {row} | {impl} | {write['mb']} | {' | '.join(cells)} | {clean['us'] / write['us']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/flush"), help="output folder")
    parser.add_argument("--rows", nargs="*", default=list(ROWS), help="decode rows SEED/INDEX[:changes]")
    parser.add_argument("--rungs", default=",".join(RUNG_MODULES), help="comma-separated decode rungs (default all)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of the flushes (default 2)")
    parser.add_argument("--rep", type=float, default=30.0, help="timed ms per measurement (default 30)")
    args = parser.parse_args(argv)
    args.rungs = args.rungs.split(",")
    cases = [parse_row(text) for text in args.rows]
    require_gpu("bench.flush_ab")
    import torch

    from bench.decode_ragged_ab import open_rungs

    _, impls, read_gbps = open_rungs(args.out)
    log, rows = CsvLog(args.out / "flush.csv", COLUMNS), []

    def add(new: list[dict]) -> None:
        for record in new:
            log.append(record)
            print(f"{record['row']:12s} {record['impl']:14s} {record['flush']:6s} {record['status']:7s} "
                  f"{record['us']:8.1f} us {record['pct_read_bw']:5.1f} % {record['reason']}", flush=True)  # fmt: skip
        rows.extend(new)
        (args.out / "flush.md").write_text(markdown(rows, read_gbps))

    for mb in SUM_MB:
        flat = torch.ones(mb * 10**6 // 2, dtype=torch.bfloat16, device="cuda")
        add(records(f"sum {mb} MB", "torch.sum", flat.numel() * 2, alternating(flat.sum, args.rounds, args.rep),
                    read_gbps, "ok", ""))  # fmt: skip
        del flat
    for label, case in cases:
        add(decode_records(label, case, impls, args, read_gbps))
    print((args.out / "flush.md").read_text())
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
