"""compare.py: argument validation before any GPU work, and a CPU run end to end."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

import compare
from common.results import CSV_COLUMNS

ROOT = Path(__file__).resolve().parent.parent
ISSUE_COLUMNS = [
    "impl",
    "stack",
    "rung",
    "batch",
    "heads",
    "seqlen_q",
    "seqlen_k",
    "head_dim",
    "dtype",
    "causal",
    "status",
    "reason",
    "ms",
    "ms_p20",
    "ms_p80",
    "tflops",
    "pct_peak",
    "gbps",
    "extra_mem_bytes",
    "max_abs_err",
    "rel_l2_err",
    "err_ratio_vs_sdpa",
    "prepare_s",
]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--seqlen", "0"], "positive integers"),
        (["--seqlen", "8192,-1"], "positive integers"),
        (["--seqlen", "abc"], "positive integers"),
        (["--batch", "0"], "positive integers"),
        (["--dtype", "fp64"], "invalid choice"),
        (["--causal", "maybe"], "invalid choice"),
        (["--warmup", "-5"], "positive number"),
        (["--device", "tpu"], "invalid choice"),
        (["--device", "cpu", "--cuda-graph"], "--cuda-graph needs --device cuda"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(argv: list[str], words: str, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exit_info:
        compare.parse_args(argv)
    assert exit_info.value.code == 2
    assert words in capsys.readouterr().err


def test_unknown_implementation_lists_valid_names():
    from common.registry import discover

    available, _ = discover()
    with pytest.raises(SystemExit, match=r"no implementation matches 'triton/nope'; valid names: .*sdpa/math"):
        compare.select(available, ["triton/nope"], [])
    chosen = compare.select(available, ["sdpa/*"], ["sdpa/math"])
    assert [impl.name for impl in chosen] == ["sdpa/flash", "sdpa/cudnn", "sdpa/efficient"]


def test_csv_schema_starts_with_the_issue_columns():
    assert list(CSV_COLUMNS[: len(ISSUE_COLUMNS)]) == ISSUE_COLUMNS


def test_cpu_run_end_to_end(tmp_path: Path):
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "compare.py", "--device", "cpu", "--seqlen", "48", "--out", str(out), "--rep", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    produced = ("results.csv", "env.json", "latency.png", "tflops.png", "error.png", "report.md", "tradeoffs.csv")
    for name in (*produced, "tradeoffs.png"):
        assert (out / name).stat().st_size > 0, name
    with (out / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0])[: len(ISSUE_COLUMNS)] == ISSUE_COLUMNS
    by_impl = {(row["impl"], row["causal"]): row for row in rows}
    assert by_impl[("sdpa/math", "True")]["status"] == "ok"
    assert by_impl[("sdpa/flash", "False")]["status"] == "skipped"
    assert all(row["status"] in ("ok", "skipped") for row in rows), [r for r in rows if r["status"] != "ok"]
    report = (out / "report.md").read_text()
    assert "CPU run" in report
    assert "Triton vs CuTe, rung by rung" in report and "Instructions in the PTX" in report
    with (out / "tradeoffs.csv").open() as handle:
        static = {(row["rung"], row["metric"]): row for row in csv.DictReader(handle)}
    assert float(static[("tiled", "loc")]["triton"]) > 0 and float(static[("tiled", "loc")]["cute"]) > 0
    assert float(static[("hopper", "registers")]["cute"]) > 0
