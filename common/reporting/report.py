"""report.md: the title block (GPU, toolchain, peaks, how the run went), the results tables and plots.

Rows keep every status: a skipped or failed row shows "—" for what it did not measure and its reason
in full. FP8 rungs show their speed twice: the kernel alone (quantisation done untimed in prepare)
and end to end (quantisation, rotation and kernel timed together). The decode run
(``compare.py --decode``) gets its own report.md: the same title block, its table
(``common.reporting.decode_table``) and its plot.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from common.contract.registry import RUNGS, STACKS
from common.measure.peaks import Peaks
from common.measure.row_extras import NO_END_TO_END
from common.reporting.decode_table import run_table

TABLE_COLUMNS = (
    ("impl", "impl"),
    ("status", "status"),
    ("ms", "ms"),
    ("tflops", "TFLOP/s"),
    ("tflops_end_to_end", "TFLOP/s end to end"),
    ("pct_peak", "% peak"),
    ("gbps", "GB/s"),
    ("rel_l2_err", "rel L2 err"),
    ("rel_l2_bound", "pass bound"),
    ("err_ratio_vs_sdpa", "err / SDPA"),
    ("prepare_s", "prepare s"),
    ("reason", "reason"),
)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "—"
        if value != 0 and (abs(value) < 1e-2 or abs(value) >= 1e5):
            return f"{value:.2e}"
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(frame: pd.DataFrame, columns: tuple[tuple[str, str], ...] = TABLE_COLUMNS) -> str:
    header = "| " + " | ".join(label for _, label in columns) + " |"
    rule = "|" + "---|" * len(columns)
    lines = [header, rule]
    for _, row in frame.iterrows():
        lines.append("| " + " | ".join(_cell(row.get(column, math.nan)) for column, _ in columns) + " |")
    return "\n".join(lines)


def ladder_order(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows sorted by stack (Triton, CuTe, then SDPA) and rung order, keeping the shape order."""
    stack_rank = {stack: index for index, stack in enumerate(STACKS)}
    rung_rank = {rung: index for index, rung in enumerate(RUNGS)}
    ranks = frame["stack"].map(stack_rank).fillna(len(STACKS)) * 100 + frame["rung"].map(rung_rank).fillna(99)
    return frame.assign(_rank=ranks).sort_values("_rank", kind="stable").drop(columns="_rank")


def with_variants(frame: pd.DataFrame) -> pd.DataFrame:
    """The impl column names the FP8 quantisation variant that ran: ``triton/fp8 (block+rotation)``."""
    if "variant" not in frame:
        return frame
    variant = frame["variant"].astype("string").fillna("")
    return frame.assign(impl=frame["impl"].where(variant == "", frame["impl"] + " (" + variant + ")"))


def _shape_title(group: pd.DataFrame) -> str:
    first = group.iloc[0]
    mask = "causal" if bool(first["causal"]) else "non-causal"
    seq = (
        f"S={first['seqlen_q']}"
        if first["seqlen_q"] == first["seqlen_k"]
        else (f"Sq={first['seqlen_q']} Sk={first['seqlen_k']}")
    )
    return f"B={first['batch']} H={first['heads']} {seq} D={first['head_dim']} {first['dtype']}, {mask}"


def _show(value: float | None, unit: str) -> str:
    return f"{value:.0f} {unit}" if value else "not measured"


def peaks_text(peaks: Peaks) -> str:
    """Burst and sustained GEMM ceilings, device copy and HBM read bandwidth; "% peak" divides by the
    burst figure, a decode row's "% read BW" by the read bandwidth."""
    if not any((peaks.bf16_tflops, peaks.fp8_tflops, peaks.copy_gbps, peaks.read_gbps)):
        return "not measured (no GPU)"
    return (
        f"bf16 GEMM {_show(peaks.bf16_tflops, 'TFLOP/s')} burst, {_show(peaks.bf16_sustained_tflops, 'TFLOP/s')} "
        f"sustained; fp8 GEMM {_show(peaks.fp8_tflops, 'TFLOP/s')} burst, "
        f"{_show(peaks.fp8_sustained_tflops, 'TFLOP/s')} sustained; device copy {_show(peaks.copy_gbps, 'GB/s')}; "
        f"HBM read {_show(peaks.read_gbps, 'GB/s')}. % peak divides by the burst figure (a short run after "
        "spin-up, as long as one attention measurement)"
    )


def _fa4_text(info: dict[str, Any] | None) -> str:
    if not info:
        return "not part of this checkout"
    if not info.get("available"):
        return str(info.get("reason"))
    return info.get("distribution") or info.get("source") or "available"


def _flashinfer_text(info: dict[str, Any] | None) -> str:
    if not info:
        return "not recorded"
    if not info.get("available"):
        return str(info.get("reason"))
    return f"flashinfer-python {info.get('distribution') or '?'}"


def _configs_text(configs: dict[str, Any] | str | None) -> str:
    if not configs:
        return "not recorded"
    if isinstance(configs, str):
        return configs
    return f"the table chosen for Triton {configs.get('config_release', '?')} (each rung's tiles: env.json)"


def _tested(env: dict[str, Any]) -> str:
    """' (a tested release)' when env.json checked the Triton release and it passed; else nothing."""
    return " (a tested release)" if "triton_status" in env and env["triton_status"] is None else ""


def _notices(env: dict[str, Any], cpu_only: bool) -> list[str]:
    """Quoted warnings that change how the numbers below may be read."""
    notices = []
    if env.get("interrupted"):
        notices.append(f"**Interrupted run** ({env['interrupted']}): the tables and plots show the rows measured.")
    if cpu_only:
        notices.append(
            "**CPU run.** Triton rungs ran under the Triton interpreter and SDPA math on the CPU: the timings "
            "below are interpreter wall-clock times, useful only to check the ladder runs, not GPU "
            "performance. Correctness numbers are real."
        )
    if env.get("size_note"):
        notices.append(f"**Size:** {env['size_note']}.")
    if env.get("left_out"):
        notices.append(f"**Left out:** {env['left_out']}.")
    if env.get("triton_status"):
        notices.append(f"**Triton version warning:** {env['triton_status']}")
    return [line for notice in notices for line in (f"> {notice}", "")]


def environment_lines(env: dict[str, Any], peaks: Peaks) -> list[str]:
    """GPU, toolchain (with the FA4 and FlashInfer baselines), configuration, commit and peaks."""
    return [
        f"- GPU: {env.get('gpu') or 'none (CPU)'}; SMs: {env.get('sm_count', '—')}; driver "
        f"{env.get('driver') or '—'}; CUDA {env.get('cuda') or '—'}",
        f"- toolchain: Triton {env.get('triton') or 'not installed'}{_tested(env)}, CuTe DSL (nvidia-cutlass-dsl) "
        f"{env.get('nvidia_cutlass_dsl') or 'not installed'}, torch {env.get('torch')}, Python "
        f"{env.get('python')}; FlashAttention-4: {_fa4_text(env.get('fa4'))}; FlashInfer: "
        f"{_flashinfer_text(env.get('flashinfer'))}",
        f"- Triton tile configurations: {_configs_text(env.get('triton_configs'))}",
        f"- commit {env.get('git_commit')}; command `{env.get('command')}`",
        f"- measured peaks: {peaks_text(peaks)}",
    ]


def title_block(env: dict[str, Any], peaks: Peaks, cpu_only: bool) -> list[str]:
    """The report's opening lines: notices, then GPU, toolchain, configuration and peaks."""
    lines = ["# FlashAttention forward: the Triton, Gluon and CuTe DSL ladders against SDPA and FA4", ""]
    lines += _notices(env, cpu_only)
    lines += [
        *environment_lines(env, peaks),
        "- TFLOP/s = 4·B·H·Sq·Sk·D / t, counting only unmasked scores for causal; times are medians with L2 "
        "flushed. TFLOP/s end to end (FP8): quantisation, rotation and kernel timed together; "
        f"{NO_END_TO_END}.",
        "",
    ]
    return lines


def _status_summary(frame: pd.DataFrame) -> str:
    counts = frame["status"].value_counts()
    return ", ".join(f"{counts[status]} {status}" for status in counts.index)


def write_report(
    frame: pd.DataFrame,
    env: dict[str, Any],
    peaks: Peaks,
    plots: list[Path],
    out_dir: Path,
    cpu_only: bool,
    sections: list[tuple[str, str]] = (),
) -> Path:
    lines = title_block(env, peaks, cpu_only)
    if frame.empty:
        lines += ["No rows were measured.", ""]
    else:
        lines += [f"Rows: {_status_summary(frame)}.", ""]
    keys = ["batch", "heads", "seqlen_q", "seqlen_k", "head_dim", "dtype", "causal"]
    for _, group in ladder_order(with_variants(frame)).groupby(keys, sort=False):
        lines += [f"## {_shape_title(group)}", "", markdown_table(group), ""]
    for title, body in sections:
        lines += [f"## {title}", "", body, ""]
    for plot in plots:
        lines += [f"![{plot.stem}]({plot.name})", ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines))
    return path


def write_decode_report(env: dict[str, Any], peaks: Peaks, plots: list[Path], out_dir: Path) -> Path:
    """report.md of a decode run: the title block, the decode table from decode.csv, the plot."""
    lines = ["# Decode: one new token against a KV cache (compare.py --decode)", ""]
    lines += _notices(env, cpu_only=False)
    lines += [
        *environment_lines(env, peaks),
        "- GB/s = the K and V bytes a step must read (every key of each sequence's own length, once per KV "
        "head) / t; % read BW divides by the measured HBM read bandwidth; % roofline divides the least time, "
        "max(bytes / read bandwidth, FLOPs / sustained bf16 GEMM rate), by t (FLOPs: 4 · D a score the causal "
        "mask keeps, each sequence at its own length; group · Sq packed rows make each K/V byte feed that many "
        "FLOPs); times are medians with L2 flushed.",
        "",
        *run_table(out_dir / "decode.csv", out_dir / "env.json", out_dir),
        "",
    ]
    for plot in plots:
        lines += [f"![{plot.stem}]({plot.name})", ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines))
    return path
