"""The stack-comparison table: per rung, Triton | CuTe | ratio, from source, compiler and timed run.

Static columns (lines of code, cold compile time, registers, shared memory, spills, threads, PTX
instruction families) need no GPU; the dynamic ones (TFLOP/s, % of peak, GB/s, extra memory, error,
first-call and host launch overhead) come from the timed rows of the same run.
"""

from __future__ import annotations

import ast
import io
import math
import numbers
import tokenize
from pathlib import Path

import pandas as pd

from common.registry import RUNGS
from common.static import PTX_FEATURES, StaticRow

STACK_PAIR = ("triton", "cute")
NON_CODE_TOKENS = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
DYNAMIC_COLUMNS = ("tflops", "pct_peak", "gbps", "extra_mem_bytes", "rel_l2_err", "first_call_ms", "host_launch_us")
# "loc" first: it comes from the source, the rest from the compiled kernels.
STATIC_COLUMNS = ("loc", "compile_s", "registers", "shared_bytes", "spill_bytes", "threads_per_cta")


def _docstring_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def code_lines(source: str) -> int:
    """Lines holding code: blank lines, comments and docstrings do not count."""
    docstrings = _docstring_lines(ast.parse(source))
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in NON_CODE_TOKENS or token.type == tokenize.ENDMARKER:
            continue
        for line in range(token.start[0], token.end[0] + 1):
            if line not in docstrings:
                lines.add(line)
    return len(lines)


def _rung_files(root: Path) -> dict[str, Path]:
    return {f"{stack}/{rung}": root / f"{stack}_impl" / f"{rung}.py" for stack in STACK_PAIR for rung in RUNGS}


def implementation_table(static_rows: list[StaticRow], timed: pd.DataFrame, root: Path) -> pd.DataFrame:
    """One row per rung implementation with every static and dynamic column."""
    by_impl = {row.impl: row for row in static_rows}
    records = []
    for name, path in _rung_files(root).items():
        stack, rung = name.split("/")
        record: dict[str, object] = {"impl": name, "stack": stack, "rung": rung}
        record["loc"] = code_lines(path.read_text()) if path.exists() else math.nan
        static = by_impl.get(name)
        if static is not None and not static.error:
            for column in STATIC_COLUMNS[1:]:
                value = getattr(static, column)
                record[column] = math.nan if value is None else value
            record["instructions"] = ", ".join(f for f, used in static.features.items() if used) or "none"
        measured = timed[(timed["impl"] == name) & (timed["status"].isin(["ok", "wrong"]))]
        for column in DYNAMIC_COLUMNS:
            record[column] = measured[column].iloc[0] if len(measured) else math.nan
        records.append(record)
    return pd.DataFrame.from_records(records)


def _missing(value: object) -> bool:
    return isinstance(value, numbers.Real) and math.isnan(value)


def side_by_side(table: pd.DataFrame) -> pd.DataFrame:
    """Per rung and metric: the Triton value, the CuTe value and CuTe / Triton."""
    rows = []
    metrics = [*STATIC_COLUMNS, *DYNAMIC_COLUMNS, "instructions"]
    for rung in RUNGS:
        pair = {stack: table[(table["rung"] == rung) & (table["stack"] == stack)] for stack in STACK_PAIR}
        for metric in metrics:
            values = [pair[s][metric].iloc[0] if len(pair[s]) and metric in pair[s] else math.nan for s in STACK_PAIR]
            if all(_missing(v) for v in values):
                continue
            numeric = all(isinstance(v, numbers.Real) and not _missing(v) for v in values)
            ratio = values[1] / values[0] if numeric and values[0] else math.nan
            rows.append({"rung": rung, "metric": metric, "triton": values[0], "cute": values[1], "cute/triton": ratio})
    return pd.DataFrame.from_records(rows)


def feature_matrix(static_rows: list[StaticRow]) -> str:
    """Markdown table: which instruction families each compiled rung's PTX contains."""
    header = "| impl | " + " | ".join(PTX_FEATURES) + " |"
    lines = [header, "|" + "---|" * (len(PTX_FEATURES) + 1)]
    for row in static_rows:
        marks = " | ".join("✓" if row.features.get(name) else "" for name in PTX_FEATURES)
        lines.append(
            f"| {row.impl} | {marks} |" if not row.error else f"| {row.impl} | compile failed: {row.error[:80]} |"
        )
    return "\n".join(lines)
