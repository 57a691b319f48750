"""The decode table of the README and the ladder guide, from the committed ``compare.py --decode`` runs.

One table per committed run (``results/<gpu>/decode/decode.csv`` with its ``env.json``): a row per
case of the sweep, a column per implementation (decode rungs first, then prefill rungs, then the
baselines), each cell the median µs of one decode step and, in brackets, its share of the HBM read
bandwidth measured in the same run. Rows that did not run are named with their reason under the
table. ``python -m common.reporting.readme_table`` writes it between the decode markers.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd

from common.contract.registry import DECODE_RUNGS, KNOWN_RUNGS, STACKS
from common.measure.results import baseline_stacks

DECODE_GLOB = "results/*/decode/decode.csv"
DECODE_BEGIN, DECODE_END = "<!-- decode:begin -->", "<!-- decode:end -->"
MISSING = "—"
# Said under the heading of a run with the roofline column (issue #38's roofline; earlier runs lack it).
ROOFLINE_NOTE = (
    "; where the step's FLOPs at the sustained bf16 GEMM rate take longer than its bytes at the read bandwidth, "
    "also the share of that roofline"
)
# Runs since 2026-12-06 time a plain read of each case's bytes beside its rows (compare.py's ``pct_read_floor``).
READ_FLOOR_NOTE = "; and the share of a plain read of the same bytes timed in the same run"


def column_order(impls: list[str]) -> list[str]:
    """Decode rungs in stack order, then the other ladder rungs, then the baselines in registry order."""
    baselines = set(baseline_stacks())

    def key(impl: str) -> tuple[int, int, int]:
        stack, rung = impl.split("/")
        kind = 2 if stack in baselines else 0 if rung in DECODE_RUNGS else 1
        rung_rank = KNOWN_RUNGS.index(rung) if rung in KNOWN_RUNGS else 0
        return kind, STACKS.index(stack) if stack in STACKS else len(STACKS), rung_rank

    return sorted(dict.fromkeys(impls), key=key)


def _keys(length: int) -> str:
    """4096 -> '4k'; lengths that are not whole multiples of 1024 stay as they are."""
    return f"{length // 1024}k" if length and length % 1024 == 0 else str(length)


def _ragged(row: pd.Series) -> bool:
    return isinstance(row["lengths"], str) and row["lengths"] != ""


def _page_size(row: pd.Series) -> str | None:
    """The page size of a paged case, read from the case's description ('paged(16)'), else None."""
    found = re.search(r"paged\((\d+)\)", str(row.get("case", "")))
    return found.group(1) if found else None


def case_label(row: pd.Series) -> str:
    """'32k', for a paged cache '32k paged (pages of 16)', for a ragged batch '32k ragged (0..32k)'."""
    label = f"{_keys(int(row['seqlen_k']))}"
    page_size = _page_size(row)
    if page_size is not None:
        label += f" paged (pages of {page_size})"
    elif _ragged(row):
        lengths = [int(length) for length in row["lengths"].split()]
        label += f" ragged ({_keys(min(lengths))}..{_keys(max(lengths))})"
    return label


def bandwidth_share(pct_read_bw: float, pct_roofline: float) -> str:
    """'90 %' (the share of the read bandwidth), or '44 %; 54 % roofline' where the roofline differs from the
    read bandwidth alone: the step's FLOPs at the sustained bf16 GEMM rate take longer than its bytes."""
    compute_bound = math.isfinite(pct_roofline) and round(pct_roofline) != round(pct_read_bw)
    return f"{pct_read_bw:.0f} %" + (f"; {pct_roofline:.0f} % roofline" if compute_bound else "")


def same_size_read_share(pct_read_floor: float) -> str:
    """'; 97 % of a same-size read' (the share of a plain read of the row's bytes, ``pct_read_floor``), or nothing
    where the run did not time one (NaN)."""
    return f"; {pct_read_floor:.0f} % of a same-size read" if math.isfinite(pct_read_floor) else ""


def cell(row: pd.Series) -> str:
    """'192.5 µs (90 %)' for a passing row, '123.3 µs (44 %; 54 % roofline)' where the tensor cores, not
    the read bandwidth, set the least time (``pct_roofline``, runs since issue #38's roofline), '...; 97 % of a
    same-size read' where the run timed one (``pct_read_floor``), marked when wrong; the status for a row that did
    not run."""
    if row["status"] not in ("ok", "wrong") or not math.isfinite(row["us"]):
        return str(row["status"])
    share = bandwidth_share(row["pct_read_bw"], row.get("pct_roofline", math.nan))
    share += same_size_read_share(row.get("pct_read_floor", math.nan))
    text = f"{row['us']:.1f} µs ({share})" if math.isfinite(row["pct_read_bw"]) else f"{row['us']:.1f} µs"
    return text if row["status"] == "ok" else f"{text} (wrong)"


def _not_run(frame: pd.DataFrame, impls: list[str]) -> list[str]:
    """A line per reason: which implementations at which cases did not run, and why."""
    lines = []
    absent = frame[~frame["status"].isin(("ok", "wrong"))]
    for (status, reason), rows in absent.groupby(["status", "reason"], sort=False):
        by_case: dict[str, list[str]] = {}
        for _, row in rows.iterrows():
            by_case.setdefault(f"B={row['batch']}, {row['kv_heads']} KV heads, {case_label(row)}", []).append(
                row["impl"]
            )
        where = "; ".join(
            f"{case}: {'every implementation' if len(names) == len(impls) else ', '.join(names)}"
            for case, names in by_case.items()
        )
        lines.append(f"- {status} ({reason}): {where}")
    return lines


def _shown(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def run_table(csv_path: Path, env_path: Path, root: Path) -> list[str]:
    """One decode run: the heading line, the table, the rows that did not run."""
    frame = pd.read_csv(csv_path, dtype={"lengths": str, "reason": str})
    frame[["lengths", "reason"]] = frame[["lengths", "reason"]].fillna("")
    env = json.loads(env_path.read_text()) if env_path.exists() else {}
    read = (env.get("peaks") or {}).get("read_gbps")
    impls = column_order(list(frame["impl"]))
    first = frame.iloc[0]
    shape = " ".join(
        word for word in first["case"].split() if word.split("=")[0] in ("H", "Sq", "D") or word in ("bf16", "fp16")
    )
    lines = [
        f"Decode on the {env.get('gpu') or 'unknown GPU'}, {shape}, Triton {env.get('triton') or '?'}: µs per step "
        f"(median, L2 flushed) and, in brackets, the share of the HBM read bandwidth measured in the same run "
        f"({f'{read:.0f} GB/s' if read else 'not measured'}), counting each K and V byte a step must read once "
        f"(from `{_shown(csv_path, root)}`){ROOFLINE_NOTE if 'pct_roofline' in frame else ''}"
        f"{READ_FLOOR_NOTE if 'pct_read_floor' in frame else ''}.",
        "",
        "| B | KV heads | cache | " + " | ".join(impls) + " |",
        "|---|---|---|" + "---|" * len(impls),
    ]
    cases = frame.drop_duplicates("case")
    for _, case in cases.iterrows():
        rows = frame[frame["case"] == case["case"]].set_index("impl")
        cells = [cell(rows.loc[impl]) if impl in rows.index else MISSING for impl in impls]
        lines.append(f"| {case['batch']} | {case['kv_heads']} | {case_label(case)} | " + " | ".join(cells) + " |")
    not_run = _not_run(frame, impls)
    if not_run:
        lines += ["", "Not run:", "", *not_run]
    return lines


def decode_tables(root: Path) -> str:
    """Markdown for every committed decode run under ``root``, in path order."""
    runs = sorted(root.glob(DECODE_GLOB))
    if not runs:
        return "_No decode run committed yet._"
    lines: list[str] = []
    for csv_path in runs:
        lines += [*([""] if lines else []), *run_table(csv_path, csv_path.parent / "env.json", root)]
    return "\n".join(lines)
