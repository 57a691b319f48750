"""The context-parallel sweep's outputs: results.csv (rows appended as they finish), the plot of
scaling efficiency against tokens per GPU, and report.md (efficiency and communication tables, the
targets of issue 31 read from the rows, every row with its check, the GPUs and their links)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from common.measure.context_parallel import BAD_STATUSES
from common.reporting.report import markdown_table

# Issue 31's targets: efficiency of the best ring at the longest shard, and the ring's time over
# the sum of its local attention steps.
TARGET_EFFICIENCY = 0.9
TARGET_HIDDEN_RATIO = 1.05

ROW_COLUMNS = (
    ("label", "implementation"),
    ("tokens_per_gpu", "tokens/GPU"),
    ("mask", "mask"),
    ("status", "status"),
    ("ring_ms", "ring ms"),
    ("tflops_per_gpu", "TFLOP/s per GPU"),
    ("single_gpu_tflops", "1 GPU TFLOP/s"),
    ("efficiency", "efficiency"),
    ("kernels_ms", "Σ steps ms"),
    ("hidden_ratio", "ring / Σ steps"),
    ("compute_only_ms", "no-transfer ms"),
    ("rel_l2_err", "rel L2 err"),
    ("sdpa_rel_l2_err", "SDPA rel L2"),
    ("lse_bound_ratio", "LSE / bound"),
    ("rows_checked", "rows checked"),
    ("reason", "reason"),
)


def read_rows(path: Path) -> pd.DataFrame:
    frame = pd.read_csv(path, dtype={"reason": str, "rotate": str})
    frame["reason"] = frame["reason"].fillna("")
    frame["rotate"] = frame["rotate"].fillna("")
    return _labelled(frame)


def _labelled(frame: pd.DataFrame) -> pd.DataFrame:
    """``label``: 'ring cute/hopper' or 'torch CP sdpa/cudnn (alltoall)'; ``mask``: causal or full."""
    labels = [
        f"ring {impl}" if method == "ring" else f"torch CP {impl} ({rotate})"
        for method, impl, rotate in zip(frame["method"], frame["impl"], frame["rotate"], strict=True)
    ]
    return frame.assign(label=labels, mask=frame["causal"].map({True: "causal", False: "full"}))


def _tokens(value: int) -> str:
    return f"{value // 1024}k" if value % 1024 == 0 else str(value)


# ----------------------------------------------------------------------------------------------
# The plot
# ----------------------------------------------------------------------------------------------
def write_efficiency_plot(frame: pd.DataFrame, out_dir: Path, title: str) -> Path | None:
    """efficiency.png: efficiency against tokens per GPU, a panel per mask, a line per implementation
    (ring solid, PyTorch's dashed), with the 1.0 ideal and the 0.9 target drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = frame[frame["efficiency"].notna()]
    if measured.empty:
        return None
    masks = [mask for mask in ("full", "causal") if mask in set(measured["mask"])]
    fig, axes = plt.subplots(1, len(masks), figsize=(6.5 * len(masks), 4.5), squeeze=False, sharey=True)
    for axis, mask in zip(axes[0], masks, strict=True):
        panel = measured[measured["mask"] == mask]
        for label, line in panel.groupby("label", sort=False):
            line = line.sort_values("tokens_per_gpu")
            style = "-o" if label.startswith("ring") else "--s"
            axis.plot(line["tokens_per_gpu"], line["efficiency"], style, label=label)
        axis.axhline(1.0, color="grey", linewidth=0.8)
        axis.axhline(TARGET_EFFICIENCY, color="grey", linewidth=0.8, linestyle=":")
        ticks = sorted(set(panel["tokens_per_gpu"]))
        axis.set_xscale("log", base=2)
        axis.set_xticks(ticks, [_tokens(t) for t in ticks])
        axis.set_title(f"{mask} mask")
        axis.set_xlabel("tokens per GPU")
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel("scaling efficiency (per-GPU TFLOP/s ÷ 1 GPU)")
    axes[0][-1].legend(fontsize=8, loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = out_dir / "efficiency.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------------------------
# report.md
# ----------------------------------------------------------------------------------------------
def pivot(frame: pd.DataFrame, metric: str, mask: str) -> pd.DataFrame:
    """``metric`` per implementation (rows) and tokens per GPU (columns) for one mask."""
    panel = frame[(frame["mask"] == mask) & frame[metric].notna()]
    if panel.empty:
        return pd.DataFrame()
    table = panel.pivot_table(index="label", columns="tokens_per_gpu", values=metric, aggfunc="first", sort=False)
    table.columns = [f"{_tokens(int(column))}/GPU" for column in table.columns]
    return table.reset_index().rename(columns={"label": "implementation"})


def _pivot_text(frame: pd.DataFrame, metric: str) -> list[str]:
    lines = []
    for mask in ("full", "causal"):
        table = pivot(frame, metric, mask)
        if table.empty:
            continue
        columns = tuple((column, column) for column in table.columns)
        lines += [f"**{mask} mask**", "", markdown_table(table, columns), ""]
    return lines or ["No row was measured.", ""]


def target_lines(frame: pd.DataFrame) -> list[str]:
    """Issue 31's targets read from the rows: the best ring's efficiency at the longest shard, the
    best ring against the best PyTorch CP row at every length, and the best ring's hidden ratio."""
    ok = frame[frame["status"] == "ok"]
    ring, torch_cp = ok[ok["method"] == "ring"], ok[ok["method"] == "torch-cp"]
    lines = []
    for mask in ("full", "causal"):
        mine = ring[ring["mask"] == mask]
        if mine.empty:
            continue
        longest = mine[mine["tokens_per_gpu"] == mine["tokens_per_gpu"].max()]
        best = longest.loc[longest["efficiency"].idxmax()]
        verdict = "meets" if best["efficiency"] >= TARGET_EFFICIENCY else "misses"
        lines.append(
            f"- {mask}: best ring at {_tokens(int(best['tokens_per_gpu']))}/GPU is {best['impl']}, efficiency "
            f"{best['efficiency']:.3f} ({verdict} {TARGET_EFFICIENCY}); its ring / Σ steps "
            f"{best['hidden_ratio']:.3f} (target ≤ {TARGET_HIDDEN_RATIO})"
        )
        theirs = torch_cp[torch_cp["mask"] == mask]
        for tokens, group in mine.groupby("tokens_per_gpu"):
            rivals = theirs[theirs["tokens_per_gpu"] == tokens]
            if rivals.empty:
                continue
            ours, best_theirs = group["tflops_per_gpu"].max(), rivals["tflops_per_gpu"].max()
            relation = "≥" if ours >= best_theirs else "<"
            lines.append(
                f"  - {_tokens(int(tokens))}/GPU: best ring {ours:.0f} TFLOP/s per GPU {relation} best PyTorch CP "
                f"{best_theirs:.0f}"
            )
    return lines or ["- no row passed its check, so no target can be read"]


def _environment_lines(env: dict[str, Any]) -> list[str]:
    gpus = env.get("gpus_by_rank") or []
    names = sorted(set(gpus))
    return [
        f"- {env.get('world_size')} processes ({env.get('backend')}), GPUs: {', '.join(names) or 'none (CPU)'}; "
        f"driver {env.get('driver') or '—'}; CUDA {env.get('cuda') or '—'}; NCCL {env.get('nccl') or '—'}",
        f"- torch {env.get('torch')}, Triton {env.get('triton') or '—'}, "
        f"CuTe DSL {env.get('nvidia_cutlass_dsl') or '—'}; "
        f"commit {env.get('git_commit')}; command `{env.get('command')}`",
        f"- NVLink multicast settings: {env.get('multicast_settings')}",
        f"- {env.get('method_note', '')}",
        "",
    ]


def write_report(frame: pd.DataFrame, env: dict[str, Any], out_dir: Path, plot: Path | None) -> Path:
    world = env.get("world_size")
    lines = [f"# Context parallelism on {world} ranks: ring attention against PyTorch's context_parallel", ""]
    if env.get("interrupted"):
        lines += [f"> **Stopped early:** {env['interrupted']}", ""]
    if env.get("backend") == "gloo":
        lines += [
            "> **CPU test mode** (gloo, Triton rungs under the interpreter): the timings are interpreter "
            "wall-clock times and say nothing about GPUs; the checks are real.",
            "",
        ]
    lines += _environment_lines(env)
    counts = frame["status"].value_counts()
    lines += [f"Rows: {', '.join(f'{counts[s]} {s}' for s in counts.index)}.", ""]
    lines += ["## Targets (issue 31)", "", *target_lines(frame), ""]
    lines += ["## Scaling efficiency (per-GPU TFLOP/s on the ring ÷ one GPU at the same tokens per GPU)", ""]
    lines += _pivot_text(frame, "efficiency")
    lines += ["## TFLOP/s per GPU", "", *_pivot_text(frame, "tflops_per_gpu")]
    lines += ["## Communication hidden (ring time ÷ sum of its local attention steps, each timed alone)", ""]
    lines += _pivot_text(frame, "hidden_ratio")
    lines += ["## Every row", "", markdown_table(frame, ROW_COLUMNS), ""]
    if plot is not None:
        lines += [f"![{plot.stem}]({plot.name})", ""]
    topology = env.get("topology")
    if topology:
        lines += ["## Links (`nvidia-smi topo -m`)", "", "```", topology.rstrip(), "```", ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines))
    return path


def exit_status(frame: pd.DataFrame) -> int:
    """0 when every row ran and passed or was skipped for a stated reason, else 1."""
    return 1 if frame["status"].isin(BAD_STATUSES).any() else 0
