"""Regenerate the README's results table from the committed canonical run, between markers.

python -m common.readme_table          # rewrite README.md
python -m common.readme_table --check  # exit 1 if README.md disagrees with the CSV
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd

from common.registry import RUNGS

ROOT = Path(__file__).resolve().parent.parent
CANONICAL_DIR = ROOT / "results" / "h200" / "canonical"
README = ROOT / "README.md"
LADDER_GUIDE = ROOT / "docs" / "ladder.md"
# Every document that carries the results table between the markers.
DOCUMENTS = (README, LADDER_GUIDE)
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
STACK_TITLES = {"triton": "Triton", "cute": "CuTe DSL"}


def _speed(frame: pd.DataFrame, impl: str, causal: bool) -> str:
    row = frame[(frame["impl"] == impl) & (frame["causal"] == causal)]
    if row.empty:
        return "–"
    status, tflops = row["status"].iloc[0], row["tflops"].iloc[0]
    if math.isnan(tflops):
        return status
    # A measured but wrong result keeps its speed, marked, so the table never hides a failed check.
    return f"{tflops:.0f}" if status == "ok" else f"{tflops:.0f} ({status})"


def results_table(csv_path: Path, env_path: Path) -> str:
    """Markdown: rungs in ladder order, TFLOP/s per stack and mask, then SDPA backends and peaks."""
    if not csv_path.exists():
        return "_No canonical run committed yet._"
    frame = pd.read_csv(csv_path)
    first = frame.iloc[0]
    lines = [
        f"TFLOP/s on the H200, B={first['batch']} H={first['heads']} S={first['seqlen_q']} "
        f"D={first['head_dim']} {first['dtype']} (from `{csv_path.relative_to(ROOT)}`; causal counts unmasked work).",
        "",
        "| rung | Triton | Triton causal | CuTe DSL | CuTe DSL causal |",
        "|---|---|---|---|---|",
    ]
    for rung in RUNGS:
        cells = [_speed(frame, f"{stack}/{rung}", causal) for stack in STACK_TITLES for causal in (False, True)]
        lines.append(f"| {rung} | " + " | ".join(cells) + " |")
    wrong = frame[frame["status"] == "wrong"]
    for _, row in wrong.drop_duplicates("impl").iterrows():
        lines.append(f"\n{row['impl']} is marked wrong by its rule ({row['error_rule']}): {row['reason']}.")
    lines += ["", "| SDPA backend | non-causal | causal |", "|---|---|---|"]
    for impl in sorted(frame.loc[frame["stack"] == "sdpa", "impl"].unique()):
        lines.append(f"| {impl} | {_speed(frame, impl, False)} | {_speed(frame, impl, True)} |")
    if env_path.exists():
        peaks = json.loads(env_path.read_text()).get("peaks", {})
        shown = ", ".join(
            f"{label} {value:.0f}"
            for label, value in (("bf16 GEMM", peaks.get("bf16_tflops")), ("fp8 GEMM", peaks.get("fp8_tflops")))
            if value
        )
        lines += ["", f"Measured peaks in the same run (TFLOP/s): {shown}."]
    return "\n".join(lines)


def regenerate(readme_text: str, table: str) -> str:
    if BEGIN not in readme_text or END not in readme_text:
        raise ValueError(f"README.md lacks the markers {BEGIN} ... {END}")
    head, rest = readme_text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    table = results_table(CANONICAL_DIR / "results.csv", CANONICAL_DIR / "env.json")
    stale = []
    for document in DOCUMENTS:
        current = document.read_text()
        wanted = regenerate(current, table)
        if wanted == current:
            continue
        if args.check:
            stale.append(document.name)
        else:
            document.write_text(wanted)
    if stale:
        print(f"stale results table in {', '.join(stale)}: run python -m common.readme_table", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
