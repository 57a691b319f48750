"""report.md and env.json: the title block, both GEMM peaks, skipped rows with their full reason."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from common.measure.peaks import Peaks, measure_peaks
from common.reporting.report import title_block, write_report

PEAKS = Peaks(788.0, 1300.0, 4300.0, bf16_sustained_tflops=678.0, fp8_sustained_tflops=1244.0)
ENV = {
    "gpu": "NVIDIA H200",
    "triton": "3.9.0",
    "nvidia_cutlass_dsl": "4.8.1",
    "torch": "2.15.0",
    "triton_status": "Triton 3.9.0 is outside the tested range 3.6.0 .. 3.6.0",
    "triton_configs": {"config_release": "3.9", "triton/hopper": {"D=128": {"block_m": 128}}},
    "interrupted": "Ctrl-C after 3 of 10 measurements",
}
LONG_REASON = "cute/hopper needs sm_90 or newer, got sm_80; " + "more words " * 20 + "END_OF_REASON"


def test_title_block_states_toolchain_warning_configs_and_both_peaks():
    text = "\n".join(title_block(ENV, PEAKS, cpu_only=False))
    for words in (
        "Triton 3.9.0",
        "CuTe DSL (nvidia-cutlass-dsl) 4.8.1",
        "Triton version warning:** Triton 3.9.0 is outside the tested range",
        "Triton tile configurations: the table chosen for Triton 3.9",
        "Interrupted run",
        "bf16 GEMM 788 TFLOP/s burst, 678 TFLOP/s sustained",
        "fp8 GEMM 1300 TFLOP/s burst, 1244 TFLOP/s sustained",
        "% peak divides by the burst figure",
    ):
        assert words in text, words


def test_peaks_record_burst_and_sustained_in_env_json():
    record = PEAKS.as_dict()
    assert record["bf16_tflops"] == 788.0 and record["bf16_sustained_tflops"] == 678.0
    assert record["fp8_sustained_tflops"] == 1244.0 and "burst" in record["percent_peak_uses"]
    assert measure_peaks(torch.device("cpu")) == Peaks(None, None, None)


def test_report_shows_skipped_rows_with_dashes_and_the_whole_reason(tmp_path: Path):
    base = {"batch": 1, "heads": 2, "seqlen_q": 128, "seqlen_k": 128, "head_dim": 64, "dtype": "fp16", "causal": False}
    frame = pd.DataFrame.from_records(
        [
            {**base, "impl": "triton/fp8", "stack": "triton", "rung": "fp8", "status": "ok", "reason": "",
             "ms": 1.0, "tflops": 700.0, "tflops_end_to_end": 600.0, "rel_l2_err": 2e-2, "variant": "block+rotation"},
            {**base, "impl": "gluon/hopper", "stack": "gluon", "rung": "hopper", "status": "ok", "reason": "",
             "ms": 1.0, "tflops": 500.0, "tflops_end_to_end": float("nan"), "rel_l2_err": 2e-3},
            {**base, "impl": "cute/hopper", "stack": "cute", "rung": "hopper", "status": "skipped",
             "reason": LONG_REASON, "ms": float("nan"), "tflops": float("nan"), "rel_l2_err": float("nan")},
        ]
    )  # fmt: skip
    text = write_report(frame, ENV, PEAKS, [], tmp_path, cpu_only=False).read_text()
    line = next(line for line in text.splitlines() if line.startswith("| cute/hopper"))
    assert line.endswith(f"{LONG_REASON} |") and "| — |" in line and "nan" not in text
    assert "TFLOP/s end to end" in text and "| 600.0 |" in text
    # Ladder order follows the registry's stacks: Triton, Gluon, CuTe DSL.
    rows = [line for line in text.splitlines() if line.startswith(("| triton", "| gluon", "| cute"))]
    order = [line.split("|")[1].strip() for line in rows]
    assert order == ["triton/fp8 (block+rotation)", "gluon/hopper", "cute/hopper"]
