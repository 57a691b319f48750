"""README.md and docs/ladder.md carry exactly the table the committed canonical CSV regenerates."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from common.reporting.readme_table import CANONICAL_DIR, DOCUMENTS, regenerate, results_table


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_results_table_regenerates_byte_identically(document):
    current = document.read_text()
    table = results_table(CANONICAL_DIR / "results.csv", CANONICAL_DIR / "env.json")
    assert regenerate(current, table) == current, "run: python -m common.reporting.readme_table"


def _write_run(folder: Path, triton: str, rows: list[tuple[str, str, bool, float]]) -> None:
    folder.mkdir(parents=True)
    records = []
    for impl, status, causal, tflops in rows:
        stack, rung = impl.split("/")
        records.append(
            {"impl": impl, "stack": stack, "rung": rung, "batch": 2, "heads": 16, "seqlen_q": 8192,
             "seqlen_k": 8192, "head_dim": 128, "dtype": "bf16", "causal": causal, "status": status,
             "reason": "", "tflops": tflops, "error_rule": "", "variant": "block+rotation" if rung == "fp8" else ""}
        )  # fmt: skip
    pd.DataFrame.from_records(records).to_csv(folder / "results.csv", index=False)
    peaks = {"bf16_tflops": 788.0, "bf16_sustained_tflops": 678.0, "fp8_tflops": 1300.0, "fp8_sustained_tflops": None}
    (folder / "env.json").write_text(json.dumps({"triton": triton, "nvidia_cutlass_dsl": "4.8.1", "peaks": peaks}))


def test_table_has_a_column_per_stack_dashes_where_a_rung_is_absent_and_fa4_beside_sdpa(tmp_path: Path):
    rows = [
        (impl, "ok", causal, 500.0)
        for impl in ("triton/hopper", "gluon/hopper", "cute/hopper", "cute/fp8", "sdpa/cudnn", "fa4/sm90")
        for causal in (False, True)
    ]
    _write_run(tmp_path / "canonical", "3.6.0", rows)
    _write_run(tmp_path / "canonical-triton-3.9", "3.9.0", rows[:2])
    table = results_table(tmp_path / "canonical" / "results.csv", tmp_path / "canonical" / "env.json")
    assert "| rung | Triton | Triton causal | Gluon | Gluon causal | CuTe DSL | CuTe DSL causal |" in table
    assert "| naive | — | — | — | — | — | — |" in table
    assert "| hopper | 500 | 500 | 500 | 500 | 500 | 500 |" in table
    baselines = table[table.index("| baseline |") :].splitlines()
    assert [line.split("|")[1].strip() for line in baselines[2:4]] == ["sdpa/cudnn", "fa4/sm90"]
    assert "bf16 GEMM 788 burst / 678 sustained, fp8 GEMM 1300 burst" in table
    assert "**The same suite on Triton 3.9.0, CuTe DSL 4.8.1**" in table
    assert "FP8 quantisation that ran: cute/fp8 block+rotation." in table


def test_fp8_cells_show_end_to_end_beside_the_kernel_where_measured(tmp_path: Path):
    """compare.py's tflops_end_to_end (FP8: quantisation and kernel per call) appears beside the kernel
    figure, with a line saying what it is; rows without it (NaN) keep the kernel figure alone."""
    rows = [(impl, "ok", causal, 800.0) for impl in ("cute/hopper", "cute/fp8") for causal in (False, True)]
    _write_run(tmp_path / "canonical", "3.6.0", rows)
    csv_path = tmp_path / "canonical" / "results.csv"
    frame = pd.read_csv(csv_path)
    frame["tflops_end_to_end"] = [float("nan"), float("nan"), 731.4, 690.0]
    frame.to_csv(csv_path, index=False)
    table = results_table(csv_path, tmp_path / "canonical" / "env.json")
    assert "| hopper | 800 | 800 |" in table
    assert "| fp8 | 800 (e2e 731) | 800 (e2e 690) |" in table
    assert "(e2e N): end to end" in table
