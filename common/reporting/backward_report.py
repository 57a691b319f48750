"""The backward run's report (``compare.py --backward``): report.md with a table per shape and the plots.

Plots reuse the forward's per-run figure (``common.reporting.plots.metric_figure``: ladder slots per
stack, the SDPA backends and FA4 as reference lines): backward TFLOP/s and forward + backward TFLOP/s
(GPU runs), the backward's latency (interpreter wall-clock on the CPU), and one error plot per gradient
(dQ, dK, dV: relative L2 error against fp64 with each row's pass bound, 2 × SDPA's error on that
gradient). The table keeps every status, with the reason of rows that did not pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from common.measure.peaks import Peaks
from common.reporting.plots import PlotContext, metric_figure
from common.reporting.report import environment_lines, ladder_order, markdown_table

TABLE_COLUMNS = (
    ("impl", "impl"),
    ("backward", "backward"),
    ("status", "status"),
    ("bwd_ms", "bwd ms"),
    ("bwd_tflops", "bwd TFLOP/s"),
    ("fwd_bwd_ms", "fwd+bwd ms"),
    ("fwd_bwd_tflops", "fwd+bwd TFLOP/s"),
    ("dq_err", "dQ rel L2"),
    ("dk_err", "dK rel L2"),
    ("dv_err", "dV rel L2"),
    ("dq_bound", "dQ bound"),
    ("reason", "reason"),
)
SHAPE_KEYS = ["batch", "heads", "kv_heads", "seqlen_q", "seqlen_k", "head_dim", "dtype"]
GRADIENTS = (("dq", "dQ"), ("dk", "dK"), ("dv", "dV"))


def _shape_title(group: pd.DataFrame) -> str:
    first = group.iloc[0]
    seq = f"S={first['seqlen_q']}" if first["seqlen_q"] == first["seqlen_k"] else (
        f"Sq={first['seqlen_q']} Sk={first['seqlen_k']}"
    )  # fmt: skip
    heads = f"H={first['heads']}" + (f" Hkv={first['kv_heads']}" if first["kv_heads"] != first["heads"] else "")
    mask = "causal" if bool(first["causal"]) else "non-causal"
    return f"B={first['batch']} {heads} {seq} D={first['head_dim']} {first['dtype']}, {mask}"


def backward_figures(frame: pd.DataFrame, context: PlotContext) -> dict[str, Any]:
    """The figures by file name, one set per shape (the forward's figure takes one shape and facets causal)."""
    specs = [("bwd_ms", "backward latency (ms, median)", "Backward latency", "bwd_latency")]
    if not context.cpu_only:
        specs += [
            ("bwd_tflops", "backward TFLOP/s (2.5 × forward FLOPs)", "Backward throughput", "bwd_tflops"),
            ("fwd_bwd_tflops", "forward + backward TFLOP/s", "Forward + backward throughput", "fwd_bwd_tflops"),
        ]
    figures = {}
    shapes = frame.drop_duplicates(SHAPE_KEYS)[SHAPE_KEYS].to_dict("records")
    for index, shape in enumerate(shapes):
        panel = frame.loc[(frame[SHAPE_KEYS] == pd.Series(shape)).all(axis=1)]
        suffix = f"_{index}" if len(shapes) > 1 else ""
        for metric, label, what, name in specs:
            figures[f"{name}{suffix}.png"] = metric_figure(panel, metric, label, what, context)
        for key, title in GRADIENTS:
            errors = panel.assign(rel_l2_err=panel[f"{key}_err"], rel_l2_bound=panel[f"{key}_bound"])
            label = f"{title} relative L2 error vs fp64 (linear)"
            figures[f"{key}_error{suffix}.png"] = metric_figure(errors, "rel_l2_err", label, f"{title} error", context)
    return figures


def write_backward_report(
    frame: pd.DataFrame, env: dict[str, Any], out_dir: Path, cpu_only: bool, dpi: int = 90
) -> list[Path]:
    """The plots and report.md under ``out_dir``; returns what was written."""
    import matplotlib.pyplot as plt

    context = PlotContext.from_env(env, cpu_only)
    written = []
    for name, figure in backward_figures(frame, context).items() if not frame.empty else ():
        figure.savefig(out_dir / name, dpi=dpi)
        plt.close(figure)
        written.append(out_dir / name)
    lines = ["# FlashAttention backward: the ladders' backward rungs against SDPA and FA4", ""]
    if cpu_only:
        lines += ["> **CPU run.** Interpreter wall-clock times: they check the ladder runs, not GPU speed.", ""]
    lines += [
        # All but the last line, the GEMM peaks, which this run does not measure.
        *environment_lines(env, Peaks(None, None, None))[:-1],
        "- Backward TFLOP/s = 2.5 × the forward's FLOPs (4·D per unmasked score) / the backward's time; "
        "forward + backward counts 3.5 ×. Errors: relative L2 of each gradient against float64 autograd on "
        "the same inputs and dO; a row passes when every gradient is within its bound (2 × SDPA's error on "
        "that gradient in the same dtype).",
        "",
    ]
    counts = frame["status"].value_counts() if not frame.empty else pd.Series(dtype=int)
    lines += [f"Rows: {', '.join(f'{counts[status]} {status}' for status in counts.index) or 'none'}.", ""]
    for _, group in ladder_order(frame).groupby([*SHAPE_KEYS, "causal"], sort=False) if not frame.empty else ():
        lines += [f"## {_shape_title(group)}", "", markdown_table(group, TABLE_COLUMNS), ""]
    lines += [f"![{path.stem}]({path.name})" for path in written]
    report = out_dir / "report.md"
    report.write_text("\n".join(lines) + "\n")
    return [*written, report]
