"""Plots of a run that a person reads without the CSV.

Every figure is titled with the shape, dtype, GPU and toolchain. The per-run plots put rungs in ladder
order on the x axis with one slot per stack (Triton, Gluon, CuTe DSL: whatever stacks the rows carry,
in the registry's order); a rung that was skipped or failed keeps its slot, empty and labelled with
its status, and a stack that has no such rung shows "—". Baselines (SDPA backends, FlashAttention-4)
and the measured GEMM peaks are horizontal reference lines. The error plot is linear from zero with
each rung's pass threshold drawn over its bar. A CPU run plots interpreter latency only. The decode
run (``compare.py --decode``) gets GB/s against cache length, one panel per batch and KV-head count,
with the HBM read bandwidth measured in the same run as a line.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.transforms import blended_transform_factory

from common.contract.registry import RUNGS
from common.measure.results import MEASURED_STATUSES, baseline_stacks, ladder_stacks

STACK_COLOURS = {"triton": "#4C72B0", "gluon": "#55A868", "cute": "#DD8452"}
# Stacks the registry gains later still get a colour.
SPARE_COLOURS = ("#8172B3", "#937860", "#DA8BC3")
REFERENCE_STYLES = ("--", ":", "-.", (0, (5, 1)), (0, (3, 1, 1, 1)))
PEAK_COLOUR = "#C44E52"
# Small PNGs: the repository carries committed plots and travels to the GPU machine.
DPI = 90
SLOT_WIDTH = 0.8
# Latencies spanning more than this ratio get a log axis; errors and TFLOP/s never do.
LOG_SPAN = 30


@dataclass(frozen=True)
class PlotContext:
    """What every title states, taken from env.json: GPU, toolchain, and how the run went."""

    gpu: str = "unknown GPU"
    toolchain: str = ""
    cpu_only: bool = False
    interrupted: str = ""
    peaks: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: dict[str, Any], cpu_only: bool) -> PlotContext:
        gpu = "CPU (Triton interpreter)" if cpu_only else (env.get("gpu") or "unknown GPU")
        toolchain = (
            f"Triton {env.get('triton') or 'not installed'}, CuTe DSL {env.get('nvidia_cutlass_dsl') or 'absent'}"
        )
        return cls(gpu, toolchain, cpu_only, env.get("interrupted", ""), env.get("peaks") or {})

    def title(self, what: str, shape: str) -> str:
        lines = [f"{what} · {shape}", f"{self.gpu} · {self.toolchain}"]
        if self.cpu_only:
            lines.append("interpreter wall-clock timings: teaching only, not GPU performance")
        if self.interrupted:
            lines.append(f"interrupted run ({self.interrupted})")
        return "\n".join(lines)


def stack_colour(stack: str, stacks: list[str]) -> str:
    if stack in STACK_COLOURS:
        return STACK_COLOURS[stack]
    return SPARE_COLOURS[stacks.index(stack) % len(SPARE_COLOURS)]


def shape_text(frame: pd.DataFrame) -> str:
    """'B=2 H=16 S=8192 D=128 bf16' for the shapes in ``frame`` (all of them when several)."""
    texts = []
    for _, row in frame.drop_duplicates(["batch", "heads", "seqlen_q", "seqlen_k", "head_dim", "dtype"]).iterrows():
        seq = (
            f"S={row['seqlen_q']}"
            if row["seqlen_q"] == row["seqlen_k"]
            else f"Sq={row['seqlen_q']} Sk={row['seqlen_k']}"
        )
        texts.append(f"B={row['batch']} H={row['heads']} {seq} D={row['head_dim']} {row['dtype']}")
    return ", ".join(texts)


def _facet_label(causal: bool) -> str:
    return "causal" if causal else "non-causal"


def _rung_stacks(frame: pd.DataFrame) -> list[str]:
    """Stacks of ladder rows in the registry's order; stacks unknown to the registry go last."""
    baselines = set(baseline_stacks())
    present = [stack for stack in dict.fromkeys(frame["stack"]) if stack not in baselines]
    order = {stack: index for index, stack in enumerate(ladder_stacks())}
    return sorted(present, key=lambda stack: order.get(stack, len(order)))


def _measured(value: float) -> bool:
    return isinstance(value, float | int) and math.isfinite(value)


@dataclass
class _Slots:
    """Where each (rung, stack) bar goes on the x axis."""

    rungs: list[str]
    stacks: list[str]

    def x(self, rung: str, stack: str) -> float:
        width = SLOT_WIDTH / len(self.stacks)
        return self.rungs.index(rung) - SLOT_WIDTH / 2 + width * (self.stacks.index(stack) + 0.5)

    @property
    def width(self) -> float:
        return SLOT_WIDTH / len(self.stacks)


def _draw_slots(axis, panel: pd.DataFrame, slots: _Slots, metric: str, with_bounds: bool) -> None:
    """Bars for measured rows, labelled empty slots for the others, '—' where a stack lacks the rung."""
    at_bottom = blended_transform_factory(axis.transData, axis.transAxes)
    bound_drawn = False
    for rung in slots.rungs:
        for stack in slots.stacks:
            x = slots.x(rung, stack)
            match = panel[(panel["rung"] == rung) & (panel["stack"] == stack)]
            if match.empty:
                axis.text(x, 0.02, "—", transform=at_bottom, ha="center", va="bottom", fontsize=8, color="0.5")
                continue
            row = match.iloc[0]
            value = row.get(metric, math.nan)
            if row["status"] in MEASURED_STATUSES and _measured(value):
                colour = stack_colour(stack, slots.stacks)
                hatch = "//" if row["status"] == "wrong" else None
                axis.bar(x, value, width=slots.width, color=colour, hatch=hatch, edgecolor="0.2", linewidth=0.5)
                if with_bounds:
                    # Small errors next to the FP8 rung's stay readable as numbers on a linear axis.
                    axis.annotate(
                        f"{value:.1e}", (x, value), xytext=(0, 2), textcoords="offset points", rotation=90,
                        ha="center", va="bottom", fontsize=6,
                    )  # fmt: skip
            else:
                label = row["status"] if row["status"] not in MEASURED_STATUSES else "not measured"
                axis.bar(x, 0, width=slots.width, fill=False, edgecolor="0.6", linestyle=":")
                axis.text(
                    x, 0.02, label, transform=at_bottom, rotation=90, ha="center", va="bottom", fontsize=7, color="0.3"
                )
            bound = row.get("rel_l2_bound", math.nan)
            if with_bounds and _measured(bound):
                half = slots.width / 2
                axis.hlines(bound, x - half, x + half, colors="black", linestyles="--", linewidth=1.2)
                bound_drawn = True
            elif with_bounds and row["status"] in MEASURED_STATUSES:
                # Say so rather than leave a bar that looks unjudged.
                axis.text(x, 0.5, "bound not recorded", transform=at_bottom, rotation=90, ha="center", fontsize=6)
    if bound_drawn:
        axis.plot([], [], color="black", linestyle="--", label="pass threshold (per rung)")


def _reference_lines(axis, panel: pd.DataFrame, metric: str) -> list[str]:
    """Baseline rows as horizontal lines; returns the baselines that have no value to draw."""
    absent = []
    baselines = panel[panel["stack"].isin(baseline_stacks())]
    styles = iter(REFERENCE_STYLES * 4)
    for _, base in baselines.iterrows():
        value = base.get(metric, math.nan)
        if base["status"] in MEASURED_STATUSES and _measured(value):
            label = f"{base['impl']} {value:.3g}"
            axis.axhline(value, color="0.35", linestyle=next(styles), linewidth=1.2, label=label)
        else:
            absent.append(f"{base['impl']} ({base['status']})")
    return absent


def _peak_lines(axis, panel: pd.DataFrame, peaks: dict[str, Any]) -> None:
    has_fp8 = (panel["rung"] == "fp8").any()
    for key, label, wanted in (("bf16_tflops", "bf16", True), ("fp8_tflops", "fp8", has_fp8)):
        value = peaks.get(key)
        if wanted and value:
            axis.axhline(value, color=PEAK_COLOUR, linewidth=1.5, label=f"{label} GEMM peak (burst) {value:.0f}")


def _spans_decades(values: pd.Series) -> bool:
    positive = values[values > 0].dropna()
    return len(positive) > 1 and positive.max() / positive.min() > LOG_SPAN


def _panel(axis, panel: pd.DataFrame, metric: str, context: PlotContext, slots: _Slots) -> None:
    is_error = metric == "rel_l2_err"
    _draw_slots(axis, panel, slots, metric, with_bounds=is_error)
    absent = [] if is_error else _reference_lines(axis, panel, metric)
    if metric == "tflops":
        _peak_lines(axis, panel, context.peaks)
    axis.set_xticks(range(len(slots.rungs)), slots.rungs)
    axis.set_xlim(-0.6, len(slots.rungs) - 0.4)
    if metric == "ms" and _spans_decades(panel.loc[panel["status"].isin(MEASURED_STATUSES), metric]):
        # Latencies of a ladder span decades (naive to hopper); a log axis, said in the label, shows them all.
        axis.set_yscale("log")
        axis.set_ylabel(f"{axis.get_ylabel()} (log scale)")
    else:
        axis.set_ylim(bottom=0)
    if is_error:
        # Linear from zero with headroom, so bar heights compare honestly.
        top = pd.concat([panel[metric], panel.get("rel_l2_bound", pd.Series(dtype=float))]).dropna()
        top = top[top.map(math.isfinite)]
        if len(top):
            axis.set_ylim(0, top.max() * 1.15)
    axis.set_title(_facet_label(bool(panel["causal"].iloc[0])), fontsize=9)
    axis.set_xlabel("rung (ladder order)")
    handles = [Patch(color=stack_colour(s, slots.stacks), label=s) for s in slots.stacks]
    extra, labels = axis.get_legend_handles_labels()
    axis.legend(handles=handles + extra, labels=[h.get_label() for h in handles] + labels, fontsize=7, loc="best")
    if absent:
        axis.text(
            0.99, 0.99, "not drawn: " + ", ".join(absent), transform=axis.transAxes, ha="right", va="top", fontsize=6
        )


def metric_figure(frame: pd.DataFrame, metric: str, ylabel: str, what: str, context: PlotContext) -> Figure:
    """One panel per causal mode: ladder slots per stack, baselines and peaks as reference lines."""
    modes = sorted(frame["causal"].unique())
    fig, axes = plt.subplots(1, len(modes), figsize=(6.8 * len(modes), 4.8), squeeze=False)
    present = set(frame["rung"])
    slots = _Slots([rung for rung in RUNGS if rung in present], _rung_stacks(frame))
    for axis, causal in zip(axes[0], modes, strict=True):
        axis.set_ylabel(ylabel)
        if slots.rungs and slots.stacks:
            _panel(axis, frame[frame["causal"] == causal], metric, context, slots)
    fig.suptitle(context.title(what, shape_text(frame)), fontsize=9)
    fig.tight_layout()
    return fig


def run_figures(frame: pd.DataFrame, context: PlotContext | None = None) -> dict[str, Figure]:
    """The per-run figures by file name. A CPU run gets interpreter latency and error only."""
    context = context or PlotContext()
    if frame.empty:
        return {}
    if context.cpu_only:
        specs = (("ms", "interpreter wall-clock (ms, median)", "Latency under the Triton interpreter", "latency.png"),)
    else:
        specs = (
            ("ms", "latency (ms, median)", "Latency", "latency.png"),
            ("tflops", "TFLOP/s", "Throughput", "tflops.png"),
        )
    specs += (("rel_l2_err", "relative L2 error vs fp64 (linear)", "Error and pass threshold", "error.png"),)
    return {name: metric_figure(frame, metric, label, what, context) for metric, label, what, name in specs}


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def write_run_plots(frame: pd.DataFrame, out_dir: Path, context: PlotContext | None = None) -> list[Path]:
    """latency.png, tflops.png (GPU runs) and error.png for every row of a single-shape run."""
    return [_save(fig, out_dir / name) for name, fig in run_figures(frame, context).items()]


def _line_facets(frame: pd.DataFrame, metric: str, ylabel: str, log: bool, title: str) -> Figure:
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
    grid.figure.suptitle(title, fontsize=9)
    grid.figure.tight_layout()
    return grid.figure


def sweep_figures(frame: pd.DataFrame, context: PlotContext | None = None) -> dict[str, Figure]:
    """Speed (interpreter latency on a CPU run) and extra memory against sequence length."""
    context = context or PlotContext()
    measured = frame[frame["status"].isin(MEASURED_STATUSES)]
    if measured["seqlen_q"].nunique() < 2:
        return {}
    shape = shape_text(measured.drop_duplicates(["head_dim", "dtype"]).assign(seqlen_q="*", seqlen_k="*"))
    if context.cpu_only:
        metric, label, name = "ms", "interpreter wall-clock (ms)", "latency_vs_seqlen.png"
    else:
        metric, label, name = "tflops", "TFLOP/s", "tflops_vs_seqlen.png"
    figures = {name: _line_facets(measured, metric, label, context.cpu_only, context.title(label, shape))}
    memory = measured.dropna(subset=["extra_mem_bytes"])
    memory = memory[memory["extra_mem_bytes"] > 0]
    if not memory.empty:
        title = context.title("Extra device memory", shape)
        figures["memory_vs_seqlen.png"] = _line_facets(memory, "extra_mem_bytes", "extra memory (bytes)", True, title)
    return figures


def write_sweep_plots(frame: pd.DataFrame, out_dir: Path, context: PlotContext | None = None) -> list[Path]:
    """Sweep plots when a run covers several sequence lengths."""
    return [_save(fig, out_dir / name) for name, fig in sweep_figures(frame, context).items()]


def tradeoff_figure(table: pd.DataFrame, context: PlotContext | None = None, shape: str = "") -> Figure | None:
    """Per rung, TFLOP/s against lines of code for every stack (lines of code alone on a CPU run)."""
    context = context or PlotContext()
    known = table.dropna(subset=["loc"])
    if known.empty:
        return None
    stacks = _rung_stacks(known)
    palette = {stack: stack_colour(stack, stacks) for stack in stacks}
    fig, axis = plt.subplots(figsize=(6.8, 4.8))
    timed = known.dropna(subset=["tflops"]) if "tflops" in known else known.iloc[0:0]
    if timed.empty:
        sns.barplot(data=known, x="rung", y="loc", hue="stack", hue_order=stacks, palette=palette, ax=axis)
        axis.set_ylabel("lines of code (no blanks, comments, docstrings)")
        what = "Lines of code per rung"
    else:
        sns.scatterplot(data=timed, x="loc", y="tflops", hue="stack", hue_order=stacks, palette=palette, s=60, ax=axis)
        for _, row in timed.iterrows():
            axis.annotate(
                row["rung"], (row["loc"], row["tflops"]), fontsize=7, xytext=(4, 2), textcoords="offset points"
            )
        axis.set_xlabel("lines of code (no blanks, comments, docstrings)")
        axis.set_ylabel("TFLOP/s")
        what = "Speed against lines of code"
    fig.suptitle(context.title(what, shape or "per rung"), fontsize=9)
    fig.tight_layout()
    return fig


def write_tradeoff_plot(
    table: pd.DataFrame, out_dir: Path, context: PlotContext | None = None, shape: str = ""
) -> Path | None:
    fig = tradeoff_figure(table, context, shape)
    return None if fig is None else _save(fig, out_dir / "tradeoffs.png")


# ----------------------------------------------------------------------------------------------
# The decode run: GB/s of K and V read against cache length
# ----------------------------------------------------------------------------------------------
DECODE_PLOT = "decode_gbps.png"
# The words of Problem.describe() that every row of a decode sweep shares (query heads, Sq, D, dtype).
SHARED_WORDS = re.compile(r"\b(H=\d+|Sq=\d+|D=\d+|bf16|fp16|fp32)\b")


def decode_shape_text(frame: pd.DataFrame) -> str:
    """'H=32 Sq=1 D=128 bf16' from the rows' case descriptions (each distinct one, comma-separated)."""
    texts = [" ".join(SHARED_WORDS.findall(case)) for case in frame["case"]]
    return ", ".join(dict.fromkeys(texts))


def _decode_colours(impls: list[str]) -> dict[str, str]:
    """A colour per implementation, in the order the rows list them (the registry's ladder order)."""
    palette = sns.color_palette("tab10", n_colors=max(10, len(impls)))
    return {impl: palette[index % len(palette)] for index, impl in enumerate(impls)}


def _decode_panel(axis, panel: pd.DataFrame, impls: list[str], colours: dict[str, str], read_gbps: float) -> None:
    """Lines of the uniform batches, a star per ragged batch, the read bandwidth; unmeasured rows named."""
    baselines = set(baseline_stacks())
    measured = panel[panel["status"].isin(MEASURED_STATUSES) & panel["gbps"].map(_measured)]
    for impl in impls:
        rows = measured[measured["impl"] == impl]
        uniform = rows[rows["lengths"].fillna("") == ""].sort_values("seqlen_k")
        style = "--" if impl.split("/")[0] in baselines else "-"
        if not uniform.empty:
            axis.plot(uniform["seqlen_k"], uniform["gbps"], style, marker="o", color=colours[impl], label=impl)
        ragged = rows[rows["lengths"].fillna("") != ""]
        if not ragged.empty:
            axis.scatter(ragged["seqlen_k"], ragged["gbps"], marker="*", s=120, color=colours[impl], zorder=3)
    if read_gbps:
        axis.axhline(read_gbps, color=PEAK_COLOUR, linewidth=1.5, label=f"HBM read (measured) {read_gbps:.0f}")
    if (panel["lengths"].fillna("") != "").any():
        axis.scatter([], [], marker="*", s=120, color="0.4", label="ragged batch (cache_seqlens)")
    absent = panel[~panel.index.isin(measured.index)]
    if not absent.empty:
        box = {"facecolor": "white", "alpha": 0.8, "edgecolor": "none"}
        axis.text(0.01, 0.97, _not_drawn(absent), transform=axis.transAxes, va="top", fontsize=6, bbox=box)
    lengths = sorted(panel["seqlen_k"].unique())
    axis.set_xscale("log", base=2)
    axis.set_xticks(lengths, [_keys(length) for length in lengths])
    axis.minorticks_off()
    axis.set_ylim(bottom=0)
    axis.set_xlabel("cache length (keys)")


def _keys(length: int) -> str:
    return f"{length // 1024}k" if length % 1024 == 0 else str(length)


def _not_drawn(absent: pd.DataFrame) -> str:
    """'not drawn: 128k: every row (skipped); 32k ragged: sdpa/flash (skipped)', a line per cache."""
    lines = []
    for (length, ragged), rows in absent.groupby(["seqlen_k", absent["lengths"].fillna("") != ""], sort=True):
        statuses = "/".join(sorted(set(rows["status"])))
        impls = ", ".join(rows["impl"])
        lines.append(f"{_keys(length)}{' ragged' if ragged else ''}: {impls} ({statuses})")
    return "not drawn:\n" + "\n".join(lines)


def decode_figure(frame: pd.DataFrame, context: PlotContext | None = None) -> Figure | None:
    """GB/s of K+V read against cache length: a row of panels per KV-head count, a panel per batch,
    a line per implementation (dashed: baselines), the measured HBM read bandwidth as a line."""
    context = context or PlotContext()
    if frame.empty:
        return None
    kv_heads = sorted(frame["kv_heads"].unique())
    batches = sorted(frame["batch"].unique())
    impls = list(dict.fromkeys(frame["impl"]))
    colours = _decode_colours(impls)
    read_gbps = context.peaks.get("read_gbps")
    fig, axes = plt.subplots(
        len(kv_heads), len(batches), figsize=(4.6 * len(batches), 3.6 * len(kv_heads)), squeeze=False, sharey=True
    )
    for row_axes, heads in zip(axes, kv_heads, strict=True):
        for axis, batch in zip(row_axes, batches, strict=True):
            panel = frame[(frame["kv_heads"] == heads) & (frame["batch"] == batch)]
            axis.set_title(f"B={batch}, {heads} KV heads", fontsize=9)
            if panel.empty:
                axis.text(0.5, 0.5, "not in this sweep", transform=axis.transAxes, ha="center", color="0.5")
                continue
            _decode_panel(axis, panel, impls, colours, read_gbps)
        row_axes[0].set_ylabel("GB/s of K and V read")
    # One legend for the figure: every label once, from whichever panel drew it.
    handles = {}
    for axis in axes.flat:
        for handle, label in zip(*axis.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    labels = list(handles)
    fig.legend([handles[label] for label in labels], labels, loc="lower center", ncol=min(6, len(labels)), fontsize=7)
    fig.suptitle(context.title("Decode: GB/s of K and V read", decode_shape_text(frame)), fontsize=9)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def write_decode_plot(frame: pd.DataFrame, out_dir: Path, context: PlotContext | None = None) -> Path | None:
    """decode_gbps.png next to decode.csv (None when there are no rows)."""
    fig = decode_figure(frame, context)
    return None if fig is None else _save(fig, out_dir / DECODE_PLOT)
