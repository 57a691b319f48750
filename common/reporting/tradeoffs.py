"""The stack-comparison table: per rung, one column per stack (Triton, Gluon, CuTe DSL: the
registry's ladder stacks) and each stack's ratio to the first, from source, compiler and timed run.
A stack without that rung shows NaN ("—" in the report).

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

from common.contract.registry import RUNG_MODULES, RUNGS
from common.measure.results import MEASURED_STATUSES, ladder_stacks
from common.reporting.static import PTX_FEATURES, StaticRow

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
    """Registry name -> source file of every rung module ('triton_impl.gluon.hopper' is gluon/hopper)."""
    files = {}
    for module in RUNG_MODULES:
        *packages, rung = module.split(".")
        files[f"{packages[-1].removesuffix('_impl')}/{rung}"] = root.joinpath(*packages, f"{rung}.py")
    return files


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
        measured = timed[(timed["impl"] == name) & (timed["status"].isin(MEASURED_STATUSES))]
        for column in DYNAMIC_COLUMNS:
            record[column] = measured[column].iloc[0] if len(measured) else math.nan
        records.append(record)
    return pd.DataFrame.from_records(records)


def _missing(value: object) -> bool:
    return isinstance(value, numbers.Real) and math.isnan(value)


def _table_stacks(table: pd.DataFrame) -> list[str]:
    present = set(table["stack"])
    return [stack for stack in ladder_stacks() if stack in present]


def side_by_side(table: pd.DataFrame) -> pd.DataFrame:
    """Per rung and metric: each stack's value and its ratio to the first stack's (Triton's)."""
    stacks = _table_stacks(table)
    reference, others = stacks[0], stacks[1:]
    rows = []
    metrics = [*STATIC_COLUMNS, *DYNAMIC_COLUMNS, "instructions"]
    for rung in RUNGS:
        per_stack = {stack: table[(table["rung"] == rung) & (table["stack"] == stack)] for stack in stacks}
        for metric in metrics:
            values = {
                s: per_stack[s][metric].iloc[0] if len(per_stack[s]) and metric in per_stack[s] else math.nan
                for s in stacks
            }
            if all(_missing(v) for v in values.values()):
                continue
            record: dict[str, object] = {"rung": rung, "metric": metric, **values}
            for stack in others:
                record[f"{stack}/{reference}"] = _ratio(values[stack], values[reference])
            rows.append(record)
    return pd.DataFrame.from_records(rows)


def _ratio(value: object, reference: object) -> float:
    numeric = all(isinstance(v, numbers.Real) and not _missing(v) for v in (value, reference))
    return value / reference if numeric and reference else math.nan


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
