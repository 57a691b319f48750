"""The generate table of the README, from the committed ``bench/generate.py`` run.

It opens with the sentence that says which implementation to use: the one that decodes the most tokens
per second in the most cases, and where another leads. Then one compact table for the 8k prompt of
``results/h200/generate-8k/results.csv``: a row per attention implementation in the sweep's order, a column
per (batch, KV cache) case with the decode tokens/s and, in brackets, its ratio to ``sdpa``'s in the same
case, and a last column with the prefill ms of the 8k prompt at batch 1 with a DynamicCache. A cell that
did not run shows "—" and is named with its reason under the table; an implementation that ran in none of
the cases gets no row, only that line. A reason is cut to its first clause (the flash row lists one per
FlashAttention path it tried; ``report.md`` beside the CSV has them in full). ``python -m
common.reporting.readme_table`` writes it between the generate markers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, TypeGuard

import pandas as pd

GENERATE_CSV = Path("results") / "h200" / "generate-8k-2026-11-30" / "results.csv"
GENERATE_BEGIN, GENERATE_END = "<!-- generate:begin -->", "<!-- generate:end -->"
PROMPT = 8192
REFERENCE = "sdpa"
PREFILL_CASE = (1, "dynamic")
MISSING = "—"
REASON_SEPARATOR = "; "
VERSIONS = (("transformers", "transformers"), ("torch", "torch"), ("Triton", "triton"))

Row = dict[str, Any]
Case = tuple[int, str]


def _ran(row: Row | None, column: str) -> TypeGuard[Row]:
    """Whether the row ran and measured ``column``."""
    return row is not None and row["status"] == "ok" and math.isfinite(row[column])


def _decode_cell(row: Row | None, reference: Row | None) -> str:
    """'1280 (0.90×)': tokens/s and the ratio to the reference's in the same case."""
    if not _ran(row, "tokens_per_s"):
        return MISSING
    tokens_per_s = row["tokens_per_s"]
    if not _ran(reference, "tokens_per_s"):
        return f"{tokens_per_s:.0f}"
    return f"{tokens_per_s:.0f} ({tokens_per_s / reference['tokens_per_s']:.2f}×)"


def _prefill_cell(row: Row | None) -> str:
    return f"{row['prefill_ms']:.1f}" if _ran(row, "prefill_ms") else MISSING


def _case_label(case: Case) -> str:
    batch, cache = case
    return f"B={batch} {cache}"


def _short_reason(row: Row) -> str:
    first, *rest = str(row["reason"]).split(REASON_SEPARATOR)
    return f"{row['status']} ({first}{'; …' if rest else ''})"


def _not_run(rows: dict[tuple[str, Case], Row], impls: list[str], cases: list[Case]) -> list[str]:
    """A line per reason: which implementation did not run in which cases."""
    by_reason: dict[str, dict[str, list[Case]]] = {}
    for impl in impls:
        for case in cases:
            row = rows.get((impl, case))
            if row is not None and not _ran(row, "tokens_per_s"):
                by_reason.setdefault(_short_reason(row), {}).setdefault(impl, []).append(case)
    lines = []
    for reason, where in by_reason.items():
        named = "; ".join(
            f"{impl} in every case" if len(missed) == len(cases) else f"{impl} at {', '.join(map(_case_label, missed))}"
            for impl, missed in where.items()
        )
        lines.append(f"- {named}: {reason}")
    return lines


def generate_pick(rows: dict[tuple[str, Case], Row], impls: list[str], cases: list[Case], model: str) -> str:
    """'Generate: ... `sdpa`: ... the most decode tokens per second in 3 of the 4 cases; ...'."""
    winners = {}
    for case in cases:
        ran = [impl for impl in impls if _ran(rows.get((impl, case)), "tokens_per_s")]
        if ran:
            winners[case] = max(ran, key=lambda impl: rows[(impl, case)]["tokens_per_s"])
    if not winners:
        return "Generate: no implementation ran in the committed run."
    ranked = list(winners.values())
    top = max(dict.fromkeys(ranked), key=ranked.count)
    text = (
        f"Generate: for `generate()` on {model}, use `{top}`: with a prompt of {PROMPT // 1024}k tokens it decodes "
        f"the most tokens per second in {ranked.count(top)} of the {len(cases)} cases"
    )
    for case, impl in winners.items():
        reference = rows.get((REFERENCE, case))
        if impl not in (top, REFERENCE) and _ran(reference, "tokens_per_s"):
            ratio = rows[(impl, case)]["tokens_per_s"] / reference["tokens_per_s"]
            text += f"; `{impl}` leads at {_case_label(case)} ({ratio:.2f}× `{REFERENCE}`)"
        elif impl != top:
            text += f"; `{impl}` leads at {_case_label(case)}"
    return text + "."


def _model(env: dict) -> str:
    """'a 4-layer Llama (32 query / 8 KV heads, D=128, random bf16 weights)' from env.json's model record."""
    model = env.get("model") or {}
    if not model:
        return "the committed run's model"
    return (
        f"a {model['layers']}-layer Llama ({model['heads']} query / {model['kv_heads']} KV heads, "
        f"D={model['head_dim']}, random {str(env.get('dtype', '')).replace('bfloat16', 'bf16')} weights)"
    )


def generate_table(csv_path: Path, root: Path) -> str:
    """Markdown for the generate run at ``csv_path`` (its ``env.json`` beside it): caption, table, what did not run."""
    shown_path = csv_path.relative_to(root) if csv_path.is_relative_to(root) else csv_path
    frame = pd.read_csv(csv_path, dtype={"reason": str, "rungs": str})
    frame[["reason", "rungs"]] = frame[["reason", "rungs"]].fillna("")
    at_prompt = frame[frame["prompt"] == PROMPT]
    if at_prompt.empty:
        return f"_No {PROMPT // 1024}k prompt in `{shown_path}`._"
    rows = {(row["impl"], (row["batch"], row["cache"])): row for row in at_prompt.to_dict("records")}
    cases = list(dict.fromkeys(case for _, case in rows))
    impls = list(dict.fromkeys(impl for impl, _ in rows))
    shown = [impl for impl in impls if any(_ran(rows.get((impl, case)), "tokens_per_s") for case in cases)]
    new_tokens = int(at_prompt["new_tokens"].iloc[0])
    env_path = csv_path.parent / "env.json"
    env = json.loads(env_path.read_text()) if env_path.exists() else {}
    gpu = env.get("gpu")
    versions = ", ".join(f"{name} {env[key]}" for name, key in VERSIONS if env.get(key))
    lines = [
        generate_pick(rows, impls, cases, _model(env)),
        "",
        f"`generate()` on the {gpu or 'unknown GPU'} ({versions}), prompt of "
        f"{PROMPT // 1024}k tokens, {new_tokens} new tokens: "
        f"decode tokens/s and, in brackets, the ratio to `{REFERENCE}`'s in the same case; the prompt's prefill "
        f"in ms (from `{shown_path}`).",
        "",
        "| attn_implementation | "
        + " | ".join(_case_label(case) for case in cases)
        + f" | prefill ms, {_case_label(PREFILL_CASE)} |",
        "|---|" + "---|" * (len(cases) + 1),
    ]
    for impl in shown:
        cells = [_decode_cell(rows.get((impl, case)), rows.get((REFERENCE, case))) for case in cases]
        lines.append(f"| {impl} | " + " | ".join([*cells, _prefill_cell(rows.get((impl, PREFILL_CASE)))]) + " |")
    not_run = _not_run(rows, impls, cases)
    if not_run:
        lines += ["", "Not run (—):", "", *not_run]
    return "\n".join(lines)
