"""Result rows: the CSV schema, appended row by row so an interrupted run keeps what it measured."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

STATUSES = ("ok", "wrong", "failed", "skipped", "oom", "timeout")
# Statuses that make compare.py exit non-zero: the row ran (or should have) and did not pass.
BAD_STATUSES = ("wrong", "failed", "oom", "timeout")
# Statuses whose timings and errors were measured.
MEASURED_STATUSES = ("ok", "wrong")
NAN = math.nan


@dataclass
class ResultRow:
    """One CSV row; its fields in order are the columns (``CSV_COLUMNS``): the first ones, up to ``prepare_s``,
    fixed by the harness issue, the rest following."""

    impl: str
    stack: str
    rung: str
    batch: int
    heads: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    dtype: str
    causal: bool
    status: str
    reason: str = ""
    ms: float = NAN
    ms_p20: float = NAN
    ms_p80: float = NAN
    tflops: float = NAN
    pct_peak: float = NAN
    gbps: float = NAN
    extra_mem_bytes: float = NAN
    max_abs_err: float = NAN
    rel_l2_err: float = NAN
    err_ratio_vs_sdpa: float = NAN
    prepare_s: float = NAN
    rmse: float = NAN
    nonfinite: float = NAN
    sdpa_max_abs_err: float = NAN
    sdpa_rel_l2_err: float = NAN
    error_rule: str = ""
    timing: str = ""
    device: str = ""
    first_call_ms: float = NAN
    host_launch_us: float = NAN
    # FP8 rungs: quantisation + rotation + kernel timed together (NaN where a rung has no such path).
    ms_end_to_end: float = NAN
    tflops_end_to_end: float = NAN
    # The largest rel-L2 error the row's rule passes, and (FP8 rules) the emulation's own error.
    rel_l2_bound: float = NAN
    emulation_rel_l2_err: float = NAN
    # FP8: the quantisation that ran (per-tensor, block, rotation, block+rotation); empty otherwise.
    variant: str = ""
    # GQA: K and V heads (= heads without GQA); the causal mask's alignment (top_left, bottom_right).
    kv_heads: float = NAN
    causal_alignment: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")


CSV_COLUMNS = tuple(field.name for field in fields(ResultRow))


def write_rows(path: Path, rows: Sequence[Any], columns: Sequence[str] | None = None) -> None:
    """``rows`` (mappings or dataclass instances) as the CSV file ``path``: the header ``columns`` (by default the
    first row's keys), then a line a row."""
    records = [row if isinstance(row, Mapping) else asdict(row) for row in rows]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(records[0] if columns is None else columns))
        writer.writeheader()
        writer.writerows(records)


class CsvLog:
    """Writes the header (``columns``) once, then one flushed row per finished measurement: a
    ``ResultRow``, or the record of another sweep's row (the context-parallel sweep's ``CpRow.record()``)."""

    def __init__(self, path: Path, columns: tuple[str, ...] = CSV_COLUMNS) -> None:
        self.path = path
        self.columns = columns
        with path.open("w", newline="") as handle:
            csv.writer(handle).writerow(columns)

    def append(self, row: ResultRow | Mapping[str, Any]) -> None:
        record = row if isinstance(row, Mapping) else asdict(row)
        with self.path.open("a", newline="") as handle:
            csv.DictWriter(handle, fieldnames=self.columns).writerow(record)


def _registry_stacks() -> tuple[tuple[str, ...], tuple[str, ...]]:
    from common.contract import registry

    # Registries before the FA4 baseline named only "sdpa" as a baseline stack.
    baselines = tuple(getattr(registry, "BASELINE_STACKS", ("sdpa",)))
    return tuple(stack for stack in registry.STACKS if stack not in baselines), baselines


def ladder_stacks() -> tuple[str, ...]:
    """Stacks that implement the ladder's rungs, in the registry's order (Triton, Gluon, CuTe...)."""
    return _registry_stacks()[0]


def baseline_stacks() -> tuple[str, ...]:
    """Stacks of external reference kernels (SDPA backends, FlashAttention-4)."""
    return _registry_stacks()[1]
