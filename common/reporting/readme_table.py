"""Regenerate the README's results tables from the committed runs, between markers: the canonical
prefill run (results markers), the decode runs (decode markers, ``common.reporting.decode_table``) and,
in the README only, the generate run (generate markers, ``common.reporting.generate_table``).

python -m common.reporting.readme_table          # rewrite README.md and docs/ladder.md
python -m common.reporting.readme_table --check  # exit 1 if either disagrees with the CSVs
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd

from common.contract.registry import RUNGS
from common.measure.results import baseline_stacks, ladder_stacks
from common.reporting.decode_table import DECODE_BEGIN, DECODE_END, decode_tables
from common.reporting.generate_table import GENERATE_BEGIN, GENERATE_CSV, GENERATE_END, generate_table

ROOT = Path(__file__).resolve().parents[2]
CANONICAL_DIR = ROOT / "results" / "h200" / "canonical"
README = ROOT / "README.md"
LADDER_GUIDE = ROOT / "docs" / "ladder.md"
# Every document that carries the results table between the markers.
DOCUMENTS = (README, LADDER_GUIDE)
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
STACK_TITLES = {"triton": "Triton", "gluon": "Gluon", "cute": "CuTe DSL"}
# Runs of the same suite on another toolchain (e.g. a newer Triton) sit next to the canonical run as
# results/h200/canonical-<label>/ and get their own, labelled table.
COMPANION_GLOB = "canonical-*"
MISSING = "—"
# compare.py's column for rungs that transform their inputs per call (``common.measure.row_extras``).
END_TO_END = "tflops_end_to_end"


def _end_to_end(row: pd.DataFrame) -> float:
    """The row's end-to-end TFLOP/s (FP8: quantisation and kernel per call), NaN where not measured."""
    return float(row[END_TO_END].iloc[0]) if END_TO_END in row else math.nan


def _speed(frame: pd.DataFrame, impl: str, causal: bool) -> str:
    row = frame[(frame["impl"] == impl) & (frame["causal"] == causal)]
    if row.empty:
        return MISSING
    status, tflops = row["status"].iloc[0], row["tflops"].iloc[0]
    if math.isnan(tflops):
        return status
    # A measured but wrong result keeps its speed, marked, so the table never hides a failed check.
    speed = f"{tflops:.0f}" if status == "ok" else f"{tflops:.0f} ({status})"
    end_to_end = _end_to_end(row)
    return speed if math.isnan(end_to_end) else f"{speed} (e2e {end_to_end:.0f})"


def _ladder(frame: pd.DataFrame) -> list[str]:
    """Rungs in ladder order, one column pair per stack that has rows; '—' where a stack lacks a rung."""
    stacks = [stack for stack in ladder_stacks() if stack in set(frame["stack"])]
    titles = [STACK_TITLES.get(stack, stack) for stack in stacks]
    header = " | ".join(f"{title} | {title} causal" for title in titles)
    lines = [f"| rung | {header} |", "|---|" + "---|" * (2 * len(stacks))]
    for rung in RUNGS:
        cells = [_speed(frame, f"{stack}/{rung}", causal) for stack in stacks for causal in (False, True)]
        lines.append(f"| {rung} | " + " | ".join(cells) + " |")
    return lines


def _variants(frame: pd.DataFrame) -> str:
    """'triton/fp8 block+rotation, cute/fp8 block+rotation' from the variant column, where recorded."""
    if "variant" not in frame:
        return ""
    recorded = frame[frame["variant"].astype("string").fillna("") != ""].drop_duplicates("impl")
    return ", ".join(f"{row['impl']} {row['variant']}" for _, row in recorded.iterrows())


def _baselines(frame: pd.DataFrame) -> list[str]:
    """SDPA backends and FlashAttention-4, in the registry's stack order."""
    rank = {stack: index for index, stack in enumerate(baseline_stacks())}
    rows = frame[frame["stack"].isin(rank)].drop_duplicates("impl")
    ordered = sorted(rows["impl"], key=lambda impl: (rank[impl.split("/")[0]], impl))
    lines = ["| baseline | non-causal | causal |", "|---|---|---|"]
    return lines + [f"| {impl} | {_speed(frame, impl, False)} | {_speed(frame, impl, True)} |" for impl in ordered]


def _peaks(env: dict) -> str:
    peaks = env.get("peaks", {})
    shown = []
    for label, burst_key, sustained_key in (
        ("bf16 GEMM", "bf16_tflops", "bf16_sustained_tflops"),
        ("fp8 GEMM", "fp8_tflops", "fp8_sustained_tflops"),
    ):
        if not peaks.get(burst_key):
            continue
        if sustained_key in peaks:
            sustained = peaks.get(sustained_key)
            tail = f" / {sustained:.0f} sustained" if sustained else ""
            shown.append(f"{label} {peaks[burst_key]:.0f} burst{tail}")
        else:
            # Runs before the burst figure measured one GEMM figure, after a 1.5 s warm-up over 1 s.
            shown.append(f"{label} {peaks[burst_key]:.0f} (1 s sustained)")
    return f"Measured peaks in the same run (TFLOP/s): {', '.join(shown)}." if shown else ""


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _toolchain(env: dict) -> str:
    return f"Triton {env.get('triton') or '?'}, CuTe DSL {env.get('nvidia_cutlass_dsl') or '?'}"


def run_table(csv_path: Path, env_path: Path) -> list[str]:
    """One run's tables: the ladder per stack, wrong rows explained, the baselines and the peaks."""
    frame = pd.read_csv(csv_path)
    env = json.loads(env_path.read_text()) if env_path.exists() else {}
    first = frame.iloc[0]
    lines = [
        f"TFLOP/s on the H200, B={first['batch']} H={first['heads']} S={first['seqlen_q']} "
        f"D={first['head_dim']} {first['dtype']}, {_toolchain(env)} (from `{_shown(csv_path)}`; "
        "causal counts unmasked work; — where a stack has no such rung).",
        "",
        *_ladder(frame),
    ]
    variants = _variants(frame)
    if variants:
        lines += ["", f"FP8 quantisation that ran: {variants}."]
    if END_TO_END in frame and frame[END_TO_END].notna().any():
        lines += [
            "",
            "(e2e N): end to end, what a caller holding bf16 tensors gets per call (the rung quantises "
            "Q, K and V and launches the kernel in every call); the figure before it is the kernel alone.",
        ]
    wrong = frame[frame["status"] == "wrong"]
    for _, row in wrong.drop_duplicates("impl").iterrows():
        lines.append(f"\n{row['impl']} is marked wrong by its rule ({row['error_rule']}): {row['reason']}.")
    lines += ["", *_baselines(frame)]
    peaks = _peaks(env)
    return lines + (["", peaks] if peaks else [])


def results_table(csv_path: Path, env_path: Path) -> str:
    """Markdown for the canonical run, then one labelled table per companion run beside it."""
    if not csv_path.exists():
        return "_No canonical run committed yet._"
    lines = run_table(csv_path, env_path)
    for companion in sorted(csv_path.parent.parent.glob(COMPANION_GLOB)):
        if (companion / "results.csv").exists():
            env = companion / "env.json"
            toolchain = _toolchain(json.loads(env.read_text())) if env.exists() else companion.name
            lines += ["", f"**The same suite on {toolchain}** (`{_shown(companion)}`):", ""]
            lines += run_table(companion / "results.csv", env)
    return "\n".join(lines)


def regenerate(readme_text: str, table: str, begin: str = BEGIN, end: str = END) -> str:
    """``readme_text`` with ``table`` between the markers ``begin`` and ``end``."""
    if begin not in readme_text or end not in readme_text:
        raise ValueError(f"the document lacks the markers {begin} ... {end}")
    head, rest = readme_text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{table}\n{end}{tail}"


def regenerate_all(text: str) -> str:
    """Every generated block of a document: the canonical results, the decode runs and, where the document
    carries its markers (the README), the generate run."""
    text = regenerate(text, results_table(CANONICAL_DIR / "results.csv", CANONICAL_DIR / "env.json"))
    text = regenerate(text, decode_tables(ROOT), DECODE_BEGIN, DECODE_END)
    if GENERATE_BEGIN not in text:
        return text
    return regenerate(text, generate_table(ROOT / GENERATE_CSV, ROOT), GENERATE_BEGIN, GENERATE_END)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    stale = []
    for document in DOCUMENTS:
        current = document.read_text()
        wanted = regenerate_all(current)
        if wanted == current:
            continue
        if args.check:
            stale.append(document.name)
        else:
            document.write_text(wanted)
    if stale:
        print(
            f"stale results tables in {', '.join(stale)}: run python -m common.reporting.readme_table", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
