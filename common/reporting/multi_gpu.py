"""The merged report of ``compare.py --gpus N``: every row with the GPU it ran on, and speed ratios
only between rows of one GPU (each worker has its own clocks, power limit and measured peaks)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from common.contract.registry import BASELINE_STACKS
from common.reporting.report import ladder_order, markdown_table, with_variants

PROBLEM_KEYS = ("batch", "heads", "kv_heads", "seqlen_q", "seqlen_k", "head_dim", "dtype", "causal", "causal_alignment")
MERGED_COLUMNS = (
    ("gpu", "GPU"),
    ("impl", "impl"),
    ("status", "status"),
    ("ms", "ms"),
    ("tflops", "TFLOP/s"),
    ("pct_peak", "% peak (own GPU)"),
    ("vs_best_baseline", "÷ best baseline, same GPU"),
    ("rel_l2_err", "rel L2 err"),
    ("err_ratio_vs_sdpa", "err / SDPA"),
    ("reason", "reason"),
)


def _problem_keys(frame: pd.DataFrame) -> list[str]:
    return [key for key in PROBLEM_KEYS if key in frame.columns]


def with_same_gpu_ratios(frame: pd.DataFrame) -> pd.DataFrame:
    """``vs_best_baseline``: a row's TFLOP/s over the fastest passing baseline row (SDPA backends, FA4)
    of the same problem on the same GPU; NaN where no such baseline ran on that GPU."""
    keys = [*_problem_keys(frame), "gpu"]
    baselines = frame[frame["stack"].isin(BASELINE_STACKS) & (frame["status"] == "ok")]
    best = baselines.groupby(keys, dropna=False)["tflops"].max().rename("_best").reset_index()
    joined = frame.merge(best, on=keys, how="left")
    ratio = joined["tflops"] / joined["_best"]
    return frame.assign(vs_best_baseline=ratio.where(joined["_best"].notna(), math.nan).to_numpy())


def _gpu_lines(envs: dict[str, dict[str, Any]], statuses: dict[str, int]) -> list[str]:
    lines = []
    for device, env in envs.items():
        peaks = (env.get("peaks") or {}).get("bf16_tflops")
        peak_text = f"bf16 GEMM {peaks:.0f} TFLOP/s burst" if peaks else "peaks not measured"
        lines.append(
            f"- GPU {device}: {(env.get('gpu') or 'CPU') if env else 'no env.json'}; {peak_text}; worker exit status "
            f"{statuses.get(device)}; its own report: [gpu report](gpu{list(envs).index(device)}/report.md)"
        )
    return lines


def write_merged_report(
    frame: pd.DataFrame,
    envs: dict[str, dict[str, Any]],
    statuses: dict[str, int],
    out_dir: Path,
    note: str = "",
    left_out: str = "",
) -> Path:
    """``note``: what the sizes run were; ``left_out``: the implementations the sweep did not time, and why."""
    first = next((env for env in envs.values() if env), {})
    lines = [f"# FlashAttention forward on {len(envs)} GPUs (`compare.py --gpus {len(envs)}`)", ""]
    if note:
        lines += [f"> **Size:** {note}.", ""]
    if left_out:
        lines += [f"> **Left out:** {left_out}.", ""]
    lines += [
        f"- toolchain: Triton {first.get('triton')}, CuTe DSL {first.get('nvidia_cutlass_dsl')}, torch "
        f"{first.get('torch')}; commit {first.get('git_commit')}",
        *_gpu_lines(envs, statuses),
        "- Each GPU's worker measured its own peaks; % peak divides by them. Ratios compare rows of one GPU "
        "only: '÷ best baseline' is a row's TFLOP/s over the fastest baseline (SDPA backends, FA4) of the "
        "same problem on the same GPU, — where that problem's baselines ran on another GPU. The static "
        "sm_90a analysis is left out of --gpus runs (run compare.py without --gpus for it).",
        "",
    ]
    if frame.empty:
        lines += ["No rows were measured.", ""]
    else:
        rows = with_same_gpu_ratios(with_variants(frame))
        for _, group in ladder_order(rows).groupby(_problem_keys(rows), sort=False, dropna=False):
            first_row = group.iloc[0]
            mask = "causal" if bool(first_row["causal"]) else "non-causal"
            title = (
                f"B={first_row['batch']} H={first_row['heads']} Sq={first_row['seqlen_q']} "
                f"Sk={first_row['seqlen_k']} D={first_row['head_dim']} {first_row['dtype']}, {mask}"
            )
            lines += [f"## {title}", "", markdown_table(group.sort_values("gpu", kind="stable"), MERGED_COLUMNS), ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines))
    return path
