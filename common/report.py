"""report.md: the environment, measured peaks, the results table and the plots of a run."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from common.peaks import Peaks
from common.registry import RUNGS, STACKS

TABLE_COLUMNS = (
    ("impl", "impl"),
    ("status", "status"),
    ("ms", "ms"),
    ("tflops", "TFLOP/s"),
    ("pct_peak", "% peak"),
    ("gbps", "GB/s"),
    ("rel_l2_err", "rel L2 err"),
    ("err_ratio_vs_sdpa", "err / SDPA"),
    ("prepare_s", "prepare s"),
    ("reason", "reason"),
)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if value != 0 and (abs(value) < 1e-2 or abs(value) >= 1e5):
            return f"{value:.2e}"
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    return str(value).replace("|", "\\|").replace("\n", " ")[:160]


def markdown_table(frame: pd.DataFrame, columns: tuple[tuple[str, str], ...] = TABLE_COLUMNS) -> str:
    header = "| " + " | ".join(label for _, label in columns) + " |"
    rule = "|" + "---|" * len(columns)
    lines = [header, rule]
    for _, row in frame.iterrows():
        lines.append("| " + " | ".join(_cell(row[column]) for column, _ in columns) + " |")
    return "\n".join(lines)


def ladder_order(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows sorted by stack (Triton, CuTe, then SDPA) and rung order, keeping the shape order."""
    stack_rank = {stack: index for index, stack in enumerate(STACKS)}
    rung_rank = {rung: index for index, rung in enumerate(RUNGS)}
    ranks = frame["stack"].map(stack_rank).fillna(len(STACKS)) * 100 + frame["rung"].map(rung_rank).fillna(99)
    return frame.assign(_rank=ranks).sort_values("_rank", kind="stable").drop(columns="_rank")


def _shape_title(group: pd.DataFrame) -> str:
    first = group.iloc[0]
    mask = "causal" if bool(first["causal"]) else "non-causal"
    seq = (
        f"S={first['seqlen_q']}"
        if first["seqlen_q"] == first["seqlen_k"]
        else (f"Sq={first['seqlen_q']} Sk={first['seqlen_k']}")
    )
    return f"B={first['batch']} H={first['heads']} {seq} D={first['head_dim']} {first['dtype']}, {mask}"


def _peaks_text(peaks: Peaks) -> str:
    def show(value: float | None, unit: str) -> str:
        return f"{value:.0f} {unit}" if value else "not measured"

    return (
        f"bf16 GEMM {show(peaks.bf16_tflops, 'TFLOP/s')}, fp8 GEMM {show(peaks.fp8_tflops, 'TFLOP/s')}, "
        f"device copy {show(peaks.copy_gbps, 'GB/s')}"
    )


def write_report(
    frame: pd.DataFrame,
    env: dict[str, Any],
    peaks: Peaks,
    plots: list[Path],
    out_dir: Path,
    cpu_only: bool,
    sections: list[tuple[str, str]] = (),
) -> Path:
    lines = ["# FlashAttention forward: Triton vs CuTe DSL ladder", ""]
    if cpu_only:
        lines += [
            "> **CPU run.** Triton rungs ran under the Triton interpreter and SDPA math on the CPU: the",
            "> timings below are interpreter wall-clock times, useful only to check the ladder runs, not",
            "> GPU performance. Correctness numbers are real.",
            "",
        ]
    lines += [
        f"- GPU: {env.get('gpu') or 'none (CPU)'}; SMs: {env.get('sm_count', '-')}; driver {env.get('driver', '-')}; "
        f"CUDA {env.get('cuda', '-')}",
        f"- torch {env.get('torch')}, triton {env.get('triton')}, nvidia-cutlass-dsl {env.get('nvidia_cutlass_dsl')}",
        f"- commit {env.get('git_commit')}; command `{env.get('command')}`",
        f"- measured peaks: {_peaks_text(peaks)}",
        "- TFLOP/s = 4·B·H·Sq·Sk·D / t, counting only unmasked scores for causal; times are medians with L2 flushed.",
        "",
    ]
    keys = ["batch", "heads", "seqlen_q", "seqlen_k", "head_dim", "dtype", "causal"]
    for _, group in ladder_order(frame).groupby(keys, sort=False):
        lines += [f"## {_shape_title(group)}", "", markdown_table(group), ""]
    for title, body in sections:
        lines += [f"## {title}", "", body, ""]
    for plot in plots:
        lines += [f"![{plot.stem}]({plot.name})", ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines))
    return path
