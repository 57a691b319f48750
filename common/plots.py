"""Plots of a run: rungs in ladder order on the x axis, stack as colour, SDPA backends as references."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from common.registry import RUNGS

STACK_COLOURS = {"triton": "#4C72B0", "cute": "#DD8452"}
SDPA_STYLES = ("--", ":", "-.", (0, (5, 1)))
# Small PNGs: the repository carries committed plots and travels to the GPU machine.
DPI = 90


def _facet_label(causal: bool) -> str:
    return "causal" if causal else "non-causal"


def _draw_metric(frame: pd.DataFrame, metric: str, ylabel: str, path: Path, log: bool) -> None:
    """One panel per causal mode; bars for the rungs, horizontal lines for SDPA backends."""
    modes = sorted(frame["causal"].unique())
    fig, axes = plt.subplots(1, len(modes), figsize=(6.2 * len(modes), 4.2), squeeze=False, sharey=log)
    for axis, causal in zip(axes[0], modes, strict=True):
        panel = frame[frame["causal"] == causal]
        rungs = panel[panel["stack"] != "sdpa"]
        present = [rung for rung in RUNGS if rung in set(rungs["rung"])]
        if present:
            sns.barplot(
                data=rungs,
                x="rung",
                y=metric,
                hue="stack",
                order=present,
                hue_order=list(STACK_COLOURS),
                palette=STACK_COLOURS,
                ax=axis,
            )
        baselines = panel[panel["stack"] == "sdpa"].dropna(subset=[metric])
        for style, (_, base) in zip(SDPA_STYLES * 4, baselines.iterrows(), strict=False):
            axis.axhline(base[metric], color="0.35", linestyle=style, linewidth=1.2, label=base["impl"])
        if log:
            axis.set_yscale("log")
        axis.set_title(_facet_label(bool(causal)))
        axis.set_xlabel("rung (ladder order)")
        axis.set_ylabel(ylabel)
        axis.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _spans_decades(values: pd.Series) -> bool:
    positive = values[values > 0].dropna()
    return len(positive) > 1 and positive.max() / positive.min() > 30


def write_run_plots(frame: pd.DataFrame, out_dir: Path) -> list[Path]:
    """latency.png, tflops.png and error.png for the measured rows of a single-shape run."""
    measured = frame[frame["status"].isin(["ok", "wrong"])].copy()
    if measured.empty:
        return []
    paths = []
    specs = (
        ("ms", "latency (ms, median)", "latency.png"),
        ("tflops", "TFLOP/s", "tflops.png"),
        ("rel_l2_err", "relative L2 error vs fp64", "error.png"),
    )
    for metric, label, name in specs:
        log = metric != "tflops" and _spans_decades(measured[metric])
        _draw_metric(measured, metric, label, out_dir / name, log=log or metric == "rel_l2_err")
        paths.append(out_dir / name)
    return paths


def _line_facets(frame: pd.DataFrame, metric: str, ylabel: str, path: Path, log: bool) -> Path:
    """One line per implementation against sequence length, faceted by head dim (rows) and causal."""
    grid = sns.relplot(
        data=frame,
        x="seqlen_q",
        y=metric,
        hue="impl",
        style="stack",
        kind="line",
        marker="o",
        row="head_dim",
        col="causal",
        height=3.4,
        aspect=1.4,
        facet_kws={"sharey": False},
    )
    grid.set(xscale="log")
    if log:
        grid.set(yscale="log")
    grid.set_axis_labels("sequence length", ylabel)
    grid.savefig(path, dpi=DPI)
    plt.close(grid.figure)
    return path


def write_sweep_plots(frame: pd.DataFrame, out_dir: Path) -> list[Path]:
    """tflops_vs_seqlen.png and memory_vs_seqlen.png when a run covers several sequence lengths."""
    measured = frame[frame["status"].isin(["ok", "wrong"])]
    if measured["seqlen_q"].nunique() < 2:
        return []
    paths = [_line_facets(measured, "tflops", "TFLOP/s", out_dir / "tflops_vs_seqlen.png", log=False)]
    memory = measured.dropna(subset=["extra_mem_bytes"])
    memory = memory[memory["extra_mem_bytes"] > 0]
    if not memory.empty:
        paths.append(
            _line_facets(memory, "extra_mem_bytes", "extra memory (bytes)", out_dir / "memory_vs_seqlen.png", True)
        )
    return paths


def write_tradeoff_plot(table: pd.DataFrame, out_dir: Path) -> Path | None:
    """Per rung, TFLOP/s against lines of code for both stacks (LOC alone on a CPU run)."""
    known = table.dropna(subset=["loc"])
    if known.empty:
        return None
    fig, axis = plt.subplots(figsize=(6.5, 4.5))
    timed = known.dropna(subset=["tflops"])
    if timed.empty:
        sns.barplot(data=known, x="rung", y="loc", hue="stack", palette=STACK_COLOURS, ax=axis)
        axis.set_ylabel("lines of code (no blanks, comments, docstrings)")
    else:
        sns.scatterplot(data=timed, x="loc", y="tflops", hue="stack", palette=STACK_COLOURS, s=60, ax=axis)
        for _, row in timed.iterrows():
            axis.annotate(
                row["rung"], (row["loc"], row["tflops"]), fontsize=7, xytext=(4, 2), textcoords="offset points"
            )
        axis.set_xlabel("lines of code (no blanks, comments, docstrings)")
        axis.set_ylabel("TFLOP/s")
    fig.tight_layout()
    path = out_dir / "tradeoffs.png"
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
