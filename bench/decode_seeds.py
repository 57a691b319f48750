"""The decode rungs' lowest share of the read bandwidth over random-sweep runs (issue #38's "Done when").

    python -m bench.decode_seeds RUN [RUN ...] [--min-mb 128] [--out FILE]

Each RUN is a folder ``compare.py --decode --decode-random N --decode-seed S`` wrote (``decode.csv``; ``env.json`` where
the run kept it). Per run and per decode rung (``*/decode``): the rows at caches of ``--min-mb`` or more (the K and V
bytes a step must read: GB/s × µs), how many reach 85 % of the read bandwidth measured in that run, the lowest of them
and its shape; then, per rung, the lowest over every run. The lowest row's share of its roofline (``pct_roofline``:
where its FLOPs at the sustained GEMM rate take longer than its bytes, as with many packed rows at D=256) stands beside
it. A row that did not pass its fp64 check (any status but ``ok`` or ``skipped``) is counted and named, never dropped; a
rung whose rows were all skipped (not installed, not carried) is left out. Shares are each run's own (its measured read
bandwidth), so runs of different trees or days sit side by side without being mixed into one figure; the table names
each run's tree as its ``env.json`` records it ("—" without one: a device call returns at most eight files, and some
runs kept only the CSV).
"""

from __future__ import annotations

import argparse
import csv
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

TARGET_PCT = 85.0  # issue #38's share of the read bandwidth at every cache of 128 MB or more
RUNG_SUFFIX = "/decode"


@dataclass(frozen=True)
class RungRun:
    """One decode rung's rows of one run, at caches of at least the threshold."""

    run: str
    tree: str
    impl: str
    rows: int
    at_target: int
    lowest_pct: float
    lowest_roofline_pct: float
    lowest_case: str
    not_ok: tuple[str, ...]


def read_run(folder: Path, min_mb: float) -> list[RungRun]:
    """Every decode rung's summary of the run in ``folder`` (decode.csv; env.json for its tree)."""
    env = folder / "env.json"
    tree = json.loads(env.read_text()).get("git_commit", "?")[:7] if env.is_file() else "—"
    with (folder / "decode.csv").open() as handle:
        records = [r for r in csv.DictReader(handle) if r["impl"].endswith(RUNG_SUFFIX)]
    summaries = []
    for impl in dict.fromkeys(r["impl"] for r in records):
        mine = [r for r in records if r["impl"] == impl]
        if all(r["status"] == "skipped" for r in mine):
            continue
        not_ok = tuple(f"{r['case']}: {r['status']}" for r in mine if r["status"] not in ("ok", "skipped"))
        large = [r for r in mine if r["status"] == "ok" and float(r["gbps"]) * float(r["us"]) / 1e3 >= min_mb]
        lowest = min(large, key=lambda r: float(r["pct_read_bw"]), default=None)
        summaries.append(
            RungRun(
                run=folder.name, tree=tree, impl=impl, rows=len(large),
                at_target=sum(float(r["pct_read_bw"]) >= TARGET_PCT for r in large),
                lowest_pct=float(lowest["pct_read_bw"]) if lowest else float("nan"),
                lowest_roofline_pct=float(lowest.get("pct_roofline") or "nan") if lowest else float("nan"),
                lowest_case=lowest["case"] if lowest else "", not_ok=not_ok,
            )
        )  # fmt: skip
    return summaries


def _lowest(summary: RungRun) -> str:
    if not summary.rows:
        return "—"
    roofline = summary.lowest_roofline_pct
    return f"{summary.lowest_pct:.0f} %" + ("" if roofline != roofline else f" ({roofline:.0f} %)")


def markdown(summaries: Sequence[RungRun], min_mb: float) -> str:
    """A row per (run, rung), then the lowest per rung over every run."""
    lines = [
        f"Decode rungs over random-sweep runs: rows at caches of {min_mb:.0f} MB or more, those at {TARGET_PCT:.0f} % "
        "of the run's read bandwidth, and the lowest (bench/decode_seeds.py)",
        "",
        "| run | tree | rung | rows | at 85 % | lowest (% of roofline) | its shape | not ok |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        lines.append(
            f"| {s.run} | {s.tree} | {s.impl} | {s.rows} | {s.at_target} | {_lowest(s)} | {s.lowest_case} | "
            f"{'; '.join(s.not_ok) or '—'} |"
        )
    lines += ["", "| rung | lowest over every run (% of roofline) | run | its shape |", "|---|---|---|---|"]
    for impl in dict.fromkeys(s.impl for s in summaries):
        timed = [s for s in summaries if s.impl == impl and s.rows]
        if timed:
            worst = min(timed, key=lambda s: s.lowest_pct)
            lines.append(f"| {impl} | {_lowest(worst)} | {worst.run} | {worst.lowest_case} |")
    return "\n".join(lines) + "\n"


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="folders of compare.py --decode --decode-random runs")
    parser.add_argument("--min-mb", type=float, default=128.0, help="least K/V MB a step reads (default 128)")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args(None if argv is None else list(argv))
    missing = [str(run) for run in args.runs if not (run / "decode.csv").is_file()]
    if missing:
        parser.error(f"expected folders with a decode.csv, got {', '.join(missing)}")
    summaries = [summary for run in args.runs for summary in read_run(run, args.min_mb)]
    table = markdown(summaries, args.min_mb)
    print(table, end="")
    if args.out:
        args.out.write_text(table)
    return 1 if any(s.not_ok for s in summaries) else 0


if __name__ == "__main__":
    raise SystemExit(main())
