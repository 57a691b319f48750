"""Plots from synthetic rows: titles, labelled empty slots, reference lines, the error threshold."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.collections import LineCollection

from common.reporting.plots import (
    PlotContext,
    decode_figure,
    run_figures,
    sweep_figures,
    write_decode_plot,
    write_run_plots,
    write_sweep_plots,
    write_tradeoff_plot,
)

SHAPE = {"batch": 2, "heads": 16, "seqlen_k": 4096, "dtype": "bf16"}
GPU_CONTEXT = PlotContext(
    gpu="NVIDIA H200",
    toolchain="Triton 3.6.0, CuTe DSL 4.8.1",
    peaks={"bf16_tflops": 788.0, "fp8_tflops": 1244.0},
)


def _record(impl: str, status: str = "ok", **values: object) -> dict[str, object]:
    stack, rung = impl.split("/")
    record = {"impl": impl, "stack": stack, "rung": rung, "status": status, "reason": ""}
    record.update(ms=1.0, tflops=300.0, rel_l2_err=2e-3, rel_l2_bound=4.7e-3, extra_mem_bytes=1e6)
    if status not in ("ok", "wrong"):
        record.update(ms=math.nan, tflops=math.nan, rel_l2_err=math.nan, rel_l2_bound=math.nan)
    return {**SHAPE, **record, **values}


def _run_rows() -> pd.DataFrame:
    records = []
    for causal in (False, True):
        shape = {"seqlen_q": 4096, "head_dim": 128, "causal": causal}
        records += [
            _record("triton/tiled", **shape),
            _record("triton/hopper", **shape),
            _record("gluon/hopper", **shape),
            _record("cute/tiled", "skipped", reason="planted: needs sm_90", **shape),
            _record("cute/hopper", "failed", reason="planted failure", **shape),
            _record("sdpa/cudnn", tflops=617.0, **shape),
            _record("sdpa/flash", "skipped", **shape),
            _record("fa4/sm90", tflops=658.0, **shape),
        ]
    return pd.DataFrame.from_records(records)


@pytest.fixture
def figures():
    built = run_figures(_run_rows(), GPU_CONTEXT)
    yield built
    for figure in built.values():
        plt.close(figure)


def _texts(figure) -> list[str]:
    return [text.get_text() for axis in figure.axes for text in axis.texts]


def _legend_labels(figure) -> list[str]:
    return [text.get_text() for axis in figure.axes if axis.get_legend() for text in axis.get_legend().get_texts()]


def test_every_figure_is_titled_with_shape_dtype_gpu_and_toolchain(figures):
    assert set(figures) == {"latency.png", "tflops.png", "error.png"}
    for figure in figures.values():
        title = figure._suptitle.get_text()
        for words in ("B=2 H=16 S=4096 D=128 bf16", "NVIDIA H200", "Triton 3.6.0", "CuTe DSL 4.8.1"):
            assert words in title, (words, title)


def test_skipped_and_failed_rungs_keep_labelled_empty_slots(figures):
    texts = _texts(figures["tflops.png"])
    # Per panel: cute/tiled skipped, cute/hopper failed; gluon has no tiled rung, shown as "—".
    assert texts.count("skipped") == 2 and texts.count("failed") == 2
    assert texts.count("—") == 2


def test_tflops_plot_draws_every_baseline_and_the_peaks(figures):
    labels = _legend_labels(figures["tflops.png"])
    for words in ("sdpa/cudnn 617", "fa4/sm90 658", "bf16 GEMM peak (burst) 788"):
        assert any(words in label for label in labels), (words, labels)
    assert "triton" in labels and "gluon" in labels
    # The skipped baseline is named, not silently dropped.
    assert any("sdpa/flash (skipped)" in text for text in _texts(figures["tflops.png"]))


def test_error_plot_is_linear_from_zero_with_the_pass_threshold(figures):
    figure = figures["error.png"]
    for axis in figure.axes:
        assert axis.get_yscale() == "linear"
        assert axis.get_ylim()[0] == 0 and axis.get_ylim()[1] >= 4.7e-3
    assert any("pass threshold" in label for label in _legend_labels(figure))
    thresholds = [c for axis in figure.axes for c in axis.collections if isinstance(c, LineCollection)]
    assert len(thresholds) == 2 * 3  # per panel, the three measured ladder rows, each with its bound


def test_error_plot_says_when_a_rows_bound_was_not_recorded():
    frame = _run_rows()
    frame.loc[frame["impl"] == "gluon/hopper", "rel_l2_bound"] = math.nan
    figure = run_figures(frame, GPU_CONTEXT)["error.png"]
    assert _texts(figure).count("bound not recorded") == 2
    plt.close("all")


def test_cpu_run_plots_interpreter_latency_only():
    context = PlotContext(gpu="CPU (Triton interpreter)", toolchain="Triton 3.9.0, CuTe DSL 4.8.1", cpu_only=True)
    built = run_figures(_run_rows(), context)
    assert set(built) == {"latency.png", "error.png"}
    assert "interpreter" in built["latency.png"]._suptitle.get_text()
    assert "interpreter" in built["latency.png"].axes[0].get_ylabel()
    for figure in built.values():
        plt.close(figure)


def test_interrupted_run_says_so_in_every_title():
    context = PlotContext(interrupted="Ctrl-C after 3 of 10 measurements")
    built = run_figures(_run_rows(), context)
    assert all("interrupted run" in figure._suptitle.get_text() for figure in built.values())
    for figure in built.values():
        plt.close(figure)


def _sweep_rows() -> pd.DataFrame:
    records = []
    impls = ("triton/tiled", "cute/tiled", "sdpa/flash")
    for impl, seqlen, head_dim, causal in itertools.product(impls, (1024, 4096), (64, 128), (False, True)):
        records.append(
            _record(impl, seqlen_q=seqlen, seqlen_k=seqlen, head_dim=head_dim, causal=causal, ms=1 + seqlen / 1024)
        )
    return pd.DataFrame.from_records(records)


def test_run_and_sweep_plots_are_written(tmp_path: Path):
    frame = _sweep_rows()
    run_plots = write_run_plots(frame[(frame["seqlen_q"] == 4096) & (frame["head_dim"] == 128)], tmp_path)
    sweep_plots = write_sweep_plots(frame, tmp_path)
    names = {path.name for path in run_plots + sweep_plots}
    assert names == {"latency.png", "tflops.png", "error.png", "tflops_vs_seqlen.png", "memory_vs_seqlen.png"}
    assert all(path.stat().st_size > 0 for path in run_plots + sweep_plots)


def test_sweep_figures_are_titled_and_cpu_sweeps_plot_latency():
    built = sweep_figures(_sweep_rows(), GPU_CONTEXT)
    assert all("NVIDIA H200" in figure._suptitle.get_text() for figure in built.values())
    cpu = sweep_figures(_sweep_rows(), PlotContext(cpu_only=True))
    assert "latency_vs_seqlen.png" in cpu and "tflops_vs_seqlen.png" not in cpu
    built.update({f"cpu-{name}": figure for name, figure in cpu.items()})
    for figure in built.values():
        plt.close(figure)


def test_single_length_run_has_no_sweep_plots(tmp_path: Path):
    frame = _sweep_rows()
    assert write_sweep_plots(frame[frame["seqlen_q"] == 1024], tmp_path) == []


def test_tradeoff_plot_falls_back_to_lines_of_code_without_timings(tmp_path: Path):
    table = pd.DataFrame(
        [{"impl": "triton/tiled", "stack": "triton", "rung": "tiled", "loc": 132, "tflops": float("nan")}]
    )
    path = write_tradeoff_plot(table, tmp_path)
    assert path is not None and path.stat().st_size > 0


# ----------------------------------------------------------------------------------------------------
# The decode run's plot: GB/s against cache length
# ----------------------------------------------------------------------------------------------------
def _decode_record(impl: str, batch: int, seqlen_k: int, gbps: float, status: str = "ok", **values: object) -> dict:
    case = f"B={batch} H=32 Hkv=8 Sq=1 Sk={seqlen_k} D=128 bf16 causal(bottom_right)"
    measured = status in ("ok", "wrong")
    record = {"impl": impl, "case": case, "batch": batch, "heads": 32, "kv_heads": 8, "seqlen_k": seqlen_k}
    record.update(lengths="", status=status, gbps=gbps if measured else math.nan, reason="")
    return {**record, **values}


def _decode_rows() -> pd.DataFrame:
    records = [
        _decode_record(impl, batch, seqlen_k, gbps)
        for impl, gbps in (("triton/decode", 2900.0), ("sdpa/cudnn", 1900.0), ("flashinfer/decode", 2800.0))
        for batch in (1, 8)
        for seqlen_k in (4096, 32768)
    ]
    records.append(_decode_record("sdpa/cudnn", 8, 131072, math.nan, "skipped", reason="planted: too large"))
    records.append(_decode_record("triton/decode", 8, 32768, 1800.0, lengths="32768 983 16384"))
    return pd.DataFrame.from_records(records)


DECODE_CONTEXT = PlotContext(
    gpu="NVIDIA H100 80GB HBM3", toolchain="Triton 3.6.0, CuTe DSL 4.8.1", peaks={"read_gbps": 3087.0}
)


def test_decode_plot_has_a_panel_per_batch_a_line_per_impl_and_the_read_bandwidth(tmp_path: Path):
    path = write_decode_plot(_decode_rows(), tmp_path, DECODE_CONTEXT)
    assert path == tmp_path / "decode_gbps.png" and path.stat().st_size > 0
    figure = decode_figure(_decode_rows(), DECODE_CONTEXT)
    title = figure._suptitle.get_text()
    for words in ("GB/s of K and V read", "H=32 Sq=1 D=128 bf16", "NVIDIA H100 80GB HBM3"):
        assert words in title, (words, title)
    panels = [axis for axis in figure.axes if axis.get_title()]
    assert [axis.get_title() for axis in panels] == ["B=1, 8 KV heads", "B=8, 8 KV heads"]
    for axis in panels:
        lines = {line.get_label(): line for line in axis.get_lines()}
        assert {"triton/decode", "sdpa/cudnn", "flashinfer/decode"} <= set(lines)
        assert lines["triton/decode"].get_linestyle() == "-" and lines["sdpa/cudnn"].get_linestyle() == "--"
        assert list(lines["triton/decode"].get_xdata()) == [4096, 32768]
        assert lines["HBM read (measured) 3087"].get_ydata()[0] == 3087.0
    legend = [text.get_text() for legend in figure.legends for text in legend.get_texts()]
    assert "HBM read (measured) 3087" in legend and "ragged batch (cache_seqlens)" in legend
    # The skipped row is named with its cache length, not silently dropped; the ragged row is a star.
    assert any("128k: sdpa/cudnn (skipped)" in text for text in _texts(figure))
    assert len(panels[1].collections) >= 1 and len(panels[0].collections) == 0
    plt.close(figure)


def test_decode_plot_without_rows_writes_nothing(tmp_path: Path):
    assert write_decode_plot(_decode_rows().iloc[0:0], tmp_path) is None
