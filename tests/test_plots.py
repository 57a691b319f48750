"""Plots from synthetic rows: per-run plots, sweep facets (head dim × causal) and the tradeoff plot."""

from __future__ import annotations

import itertools
from pathlib import Path

import pandas as pd

from common.plots import write_run_plots, write_sweep_plots, write_tradeoff_plot


def _rows() -> pd.DataFrame:
    records = []
    impls = [("triton/tiled", "triton", "tiled"), ("cute/tiled", "cute", "tiled"), ("sdpa/flash", "sdpa", "flash")]
    for (impl, stack, rung), seqlen, head_dim, causal in itertools.product(impls, (1024, 4096), (64, 128), (0, 1)):
        records.append(
            {
                "impl": impl, "stack": stack, "rung": rung, "seqlen_q": seqlen, "head_dim": head_dim,
                "causal": bool(causal), "status": "ok", "ms": 1.0 + seqlen / 1024, "tflops": 100.0 + head_dim,
                "rel_l2_err": 2e-3, "extra_mem_bytes": float(seqlen * 4096 if stack == "triton" else seqlen),
            }
        )  # fmt: skip
    return pd.DataFrame.from_records(records)


def test_run_and_sweep_plots_are_written(tmp_path: Path):
    frame = _rows()
    run_plots = write_run_plots(frame[(frame["seqlen_q"] == 4096) & (frame["head_dim"] == 128)], tmp_path)
    sweep_plots = write_sweep_plots(frame, tmp_path)
    names = {path.name for path in run_plots + sweep_plots}
    assert names == {"latency.png", "tflops.png", "error.png", "tflops_vs_seqlen.png", "memory_vs_seqlen.png"}
    assert all(path.stat().st_size > 0 for path in run_plots + sweep_plots)


def test_single_length_run_has_no_sweep_plots(tmp_path: Path):
    frame = _rows()
    assert write_sweep_plots(frame[frame["seqlen_q"] == 1024], tmp_path) == []


def test_tradeoff_plot_falls_back_to_lines_of_code_without_timings(tmp_path: Path):
    table = pd.DataFrame(
        [{"impl": "triton/tiled", "stack": "triton", "rung": "tiled", "loc": 132, "tflops": float("nan")}]
    )
    path = write_tradeoff_plot(table, tmp_path)
    assert path is not None and path.stat().st_size > 0
