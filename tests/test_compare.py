"""compare.py: argument validation before any GPU work, and a CPU run end to end."""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from rich.console import Console

import compare
from common.contract.problem import Problem
from common.contract.registry import Implementation, Unavailable
from common.measure.results import CSV_COLUMNS, ResultRow, write_rows
from common.measure.runner import blank_row

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
    from common.contract.registry import discover

    available, _ = discover()
    with pytest.raises(
        compare.RefusedError, match=r"no implementation matches 'triton/nope'; valid names: .*sdpa/math"
    ):
        compare.select(available, ["triton/nope"], [])
    assert compare.main(["--only", "triton/nope", "--no-static"]) == compare.EXIT_USAGE
    chosen = compare.select(available, ["sdpa/*"], ["sdpa/math"])
    assert [impl.name for impl in chosen] == ["sdpa/flash", "sdpa/cudnn", "sdpa/efficient"]


def test_csv_schema_starts_with_the_issue_columns():
    assert list(CSV_COLUMNS[: len(ISSUE_COLUMNS)]) == ISSUE_COLUMNS


def test_write_rows_takes_mappings_or_dataclasses_under_the_first_rows_keys_or_given_columns(tmp_path: Path):
    row = blank_row("triton/naive", "triton", "naive", Problem(1, 2, 16, 16, 8), "ok", "")
    write_rows(tmp_path / "rows.csv", [row])
    with (tmp_path / "rows.csv").open() as handle:
        assert tuple(next(csv.reader(handle))) == CSV_COLUMNS
    write_rows(tmp_path / "dicts.csv", [{"a": 1, "b": "x"}, {"b": "y", "a": 2}], columns=["b", "a"])
    assert (tmp_path / "dicts.csv").read_text().splitlines() == ["b,a", "x,1", "y,2"]


@pytest.mark.slow
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
    # On the CPU the plots are interpreter latency and error; TFLOP/s of an interpreter says nothing.
    produced = ("results.csv", "env.json", "latency.png", "error.png", "report.md", "tradeoffs.csv")
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
    assert "The stacks, rung by rung" in report and "Instructions in the PTX" in report
    assert not (out / "tflops.png").exists()
    with (out / "tradeoffs.csv").open() as handle:
        static = {(row["rung"], row["metric"]): row for row in csv.DictReader(handle)}
    assert float(static[("tiled", "loc")]["triton"]) > 0 and float(static[("tiled", "loc")]["cute"]) > 0
    assert float(static[("hopper", "registers")]["cute"]) > 0


# ---------------------------------------------------------------- driver UX (help, --list, lines, table)
def test_every_option_has_help_and_states_its_default_once():
    parser = compare.build_parser()
    assert parser.formatter_class is not argparse.ArgumentDefaultsHelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"{action.option_strings} has no help text"
        assert action.help.count("default") <= 1, f"{action.option_strings}: doubled default in {action.help!r}"
    for option in ("--causal", "--device"):
        assert option in parser.format_help()


def test_list_says_what_runs_here_and_why_not(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert compare.main(["--list"]) == 0
    lines = {line.split("│")[1].strip(): line for line in capsys.readouterr().out.splitlines() if "│" in line}
    assert "yes" in lines["sdpa/math"]
    assert " no " in lines["sdpa/flash"] and "needs a CUDA GPU" in lines["sdpa/flash"]
    assert "yes" in lines["triton/tiled"]


def _row(status: str, reason: str = "", **values: float) -> ResultRow:
    problem = Problem.canonical(128, head_dim=64, batch=1, heads=2, dtype=torch.float16)
    row = blank_row("cute/hopper", "cute", "hopper", problem, status, reason)
    for name, value in values.items():
        setattr(row, name, value)
    return row


LONG_REASON = "cute/hopper needs sm_90 or newer, got sm_80; " + "padding words " * 12 + "TAIL_OF_THE_REASON"


def test_streamed_line_shows_a_skip_reason_not_nan():
    line = compare.stream_line(_row("skipped", LONG_REASON), "S=128")
    assert "nan" not in line.lower() and line.endswith("TAIL_OF_THE_REASON")
    measured = compare.stream_line(_row("ok", ms=2.0, tflops=123.4), "S=128")
    assert "123.4 TFLOP/s" in measured and "2.000 ms" in measured


def test_final_table_wraps_reasons_instead_of_cutting_them():
    console = Console(width=120, record=True, file=io.StringIO())
    compare.print_table([_row("skipped", LONG_REASON), _row("ok", ms=2.0, tflops=100.0, rel_l2_err=1e-3)], console)
    text = console.export_text()
    reason_cells = "".join(line.split("│")[-2].strip() for line in text.splitlines() if line.count("│") > 2)
    assert LONG_REASON.replace(" ", "") in reason_cells.replace(" ", "")
    assert "nan" not in text.lower()


# ---------------------------------------------------------------- no GPU: capped, refused or estimated
def test_without_a_gpu_a_large_request_runs_capped_and_says_so(tmp_path: Path):
    out = tmp_path / "run"
    argv = ["--seqlen", "8192", "--only", "triton/tiled", "--only", "sdpa/math", "--causal", "false"]
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "compare.py", *argv, "--no-static", "--rep", "1", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    elapsed = time.perf_counter() - start
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "requested B=2 H=16 S=8192 D=128 bf16; running B=1 H=2 S=128 D=64 fp16 on the Triton interpreter" in (
        done.stderr
    )
    assert elapsed < 180, f"the capped run took {elapsed:.0f} s"
    with (out / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {row["seqlen_q"] for row in rows} == {"128"}
    assert "requested B=2 H=16 S=8192" in (out / "report.md").read_text()


def test_device_cuda_without_a_gpu_is_refused_with_status_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert compare.main(["--device", "cuda", "--seqlen", "8192"]) == compare.EXIT_USAGE
    assert "--device cuda was asked for, but no CUDA GPU is visible" in capsys.readouterr().err


def test_explicit_cpu_run_of_a_large_size_states_an_estimate():
    args = compare.parse_args(["--device", "cpu", "--seqlen", "8192"])
    problems, note = compare.plan_problems(args, "cpu", teaching=False)
    assert {problem.seqlen_q for problem in problems} == {8192}
    assert "estimate" in note and "days" in note
    small = compare.parse_args(["--device", "cpu", "--seqlen", "64"])
    assert compare.plan_problems(small, "cpu", teaching=False)[1] == ""


# ---------------------------------------------------------------- exit statuses
def _cpu_problem_args(out: Path) -> list[str]:
    return ["--device", "cpu", "--seqlen", "32", "--causal", "false", "--no-static", "--rep", "1", "--out", str(out)]


def _fake(name: str, prepare, runs_on_cpu: bool = True) -> Implementation:
    stack, rung = name.split("/")
    return Implementation(name, stack, rung, prepare=prepare, supports=lambda p, d: (True, ""), runs_on_cpu=runs_on_cpu)


def _right(q, k, v, problem):
    from common.contract.reference import reference_attention

    return lambda: reference_attention(q, k, v, problem).to(q.dtype)


def _wrong_scale(q, k, v, problem):
    from common.contract.reference import reference_attention

    return lambda: reference_attention(q, k, v, problem.with_(softmax_scale=1.1 * problem.scale)).to(q.dtype)


def _raises(q, k, v, problem):
    raise RuntimeError("planted failure in prepare")


def _skipped(problem, device):
    return False, "planted capability reason"


SKIPPED = Implementation("cute/hopper", "cute", "hopper", prepare=_right, supports=_skipped)
EXIT_CASES = {
    "all ok": ([_fake("triton/tiled", _right)], [], 0),
    "capability skip": ([_fake("triton/tiled", _right), SKIPPED], [], 0),
    "not implemented yet": ([_fake("triton/tiled", _right)], [Unavailable("cute_impl.fp8", "not implemented yet")], 0),
    "wrong": ([_fake("triton/tiled", _wrong_scale)], [], 1),
    "failed": ([_fake("triton/tiled", _raises)], [], 1),
    "broken import": (
        [_fake("triton/tiled", _right)],
        [Unavailable("cute_impl.fp8", "import failed: SyntaxError: invalid syntax (fp8.py, line 3)")],
        1,
    ),
}


@pytest.mark.parametrize("case", EXIT_CASES)
def test_exit_status_says_whether_every_row_passed(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    available, missing, expected = EXIT_CASES[case]
    monkeypatch.setattr("common.contract.registry.discover", lambda: (available, missing))
    assert compare.main(_cpu_problem_args(tmp_path)) == expected
    with (tmp_path / "results.csv").open() as handle:
        statuses = [row["status"] for row in csv.DictReader(handle)]
    assert len(statuses) == len(available) + len(missing)


@pytest.mark.parametrize(("status", "expected"), [("ok", 0), ("skipped", 0), ("wrong", 1), ("failed", 1),
                                                  ("timeout", 1), ("oom", 1)])  # fmt: skip
def test_exit_status_of_each_row_status(status: str, expected: int, tmp_path: Path):
    run = compare.Run(tmp_path, {}, None, rows=[_row("ok"), _row(status, "planted")])
    assert compare.exit_status(run) == expected


def test_broken_import_is_told_apart_from_an_absent_optional_package(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(compare.OPTIONAL_PACKAGES, "surely_absent_package", "a package this machine lacks")
    assert not compare.broken_import(Unavailable("cute_impl.naive", "not implemented yet"))
    absent = "import failed: No module named 'surely_absent_package'"
    assert not compare.broken_import(Unavailable("cute_impl.naive", absent))
    # A typo in a rung's import names no optional package: that is a broken rung.
    assert compare.broken_import(Unavailable("cute_impl.naive", "import failed: No module named 'cutlas'"))
    assert compare.broken_import(Unavailable("cute_impl.naive", "import failed: NameError: name 'x' is not defined"))


def test_an_unavailable_rung_has_a_row_with_its_reason(monkeypatch: pytest.MonkeyPatch):
    """The prefill and decode sweeps write one row per case for a rung whose module is not here (a user who asked for
    cute/decode without the CuTe DSL reads why it has no numbers): skipped when a package is absent, failed when the
    rung is broken. A planted broken import must not read as skipped."""
    monkeypatch.setitem(compare.OPTIONAL_PACKAGES, "surely_absent_package", "a package this machine lacks")
    problem = Problem(1, 8, 1, 4096, 128, kv_heads=2)
    absent = compare.unavailable_row(
        Unavailable("cute_impl.decode", "import failed: No module named 'surely_absent_package'"), problem
    )
    assert (absent.impl, absent.stack, absent.rung, absent.status) == ("cute/decode", "cute", "decode", "skipped")
    assert absent.reason == "unavailable: import failed: No module named 'surely_absent_package'"
    broken = compare.unavailable_row(
        Unavailable("cute_impl.decode", "import failed: No module named 'cutlas'"), problem
    )
    assert broken.status == "failed"


# Loads a CuTe rung in a fresh process, TVM-FFI hidden when argv[1] is "hidden": prints the rung's status.
WITHOUT_TVM_FFI = """
import importlib.util, sys
found = importlib.util.find_spec
if sys.argv[1] == "hidden":
    importlib.util.find_spec = lambda name, *args: None if name == "tvm_ffi" else found(name, *args)
import compare
from common.contract.registry import Unavailable, _load
loaded = _load("cute_impl.naive")
if isinstance(loaded, Unavailable):
    print("unavailable", "broken" if compare.broken_import(loaded) else "absent", loaded.reason)
else:
    print("loaded", [implementation.name for implementation in loaded])
"""


def test_a_cute_rung_without_tvm_ffi_is_refused_as_an_absent_package():
    """The CuTe rungs compile through TVM-FFI: without it they are unavailable at import, as an absent optional
    package with the reason (not a launch failure later). Control: with it, the same rung loads."""
    pytest.importorskip("cutlass")
    outcomes = {}
    for mode in ("hidden", "present"):
        done = subprocess.run(
            [sys.executable, "-c", WITHOUT_TVM_FFI, mode], capture_output=True, text=True, cwd=ROOT, timeout=300,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        outcomes[mode] = done.stdout.strip().splitlines()[-1]
    assert outcomes["hidden"].startswith("unavailable absent") and "apache-tvm-ffi" in outcomes["hidden"], outcomes
    assert outcomes["present"].startswith("loaded"), outcomes


# ---------------------------------------------------------------- Ctrl-C
def test_ctrl_c_keeps_the_rows_measured_and_exits_130(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import common.measure.runner

    calls = []
    real_measure = common.measure.runner.measure

    def measure_then_interrupt(impl, *args, **kwargs):
        calls.append(impl.name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_measure(impl, *args, **kwargs)

    monkeypatch.setattr(common.measure.runner, "measure", measure_then_interrupt)
    argv = [*_cpu_problem_args(tmp_path), "--only", "triton/tiled", "--only", "sdpa/math"]
    assert compare.main(argv) == compare.EXIT_INTERRUPTED
    with (tmp_path / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(row["impl"], row["status"]) for row in rows] == [("triton/tiled", "ok")]
    assert "Interrupted run" in (tmp_path / "report.md").read_text()
    assert json.loads((tmp_path / "env.json").read_text())["interrupted"] == "Ctrl-C after 1 of 2 measurements"
    assert (tmp_path / "latency.png").stat().st_size > 0


# ----------------------------------------------------------------------------------------------------
# --decode
# ----------------------------------------------------------------------------------------------------
def test_decode_sweep_is_the_issue_default_plus_a_ragged_and_a_paged_batch():
    from common.measure.decode_sweep import BATCHES, CACHE_LENGTHS, KV_HEADS

    cases = compare.decode_cases_for(compare.parse_args(["--decode"]))
    assert len(cases) == len(BATCHES) * len(CACHE_LENGTHS) * len(KV_HEADS) + 2
    assert all(c.problem.seqlen_q == 1 and c.problem.heads == 32 and c.problem.head_dim == 128 for c in cases)
    ragged = [c for c in cases if c.lengths is not None and not c.problem.paged]
    assert len(ragged) == 1 and ragged[0].problem.has_cache_seqlens and 0 in ragged[0].lengths
    # The bytes judged are those of the valid keys only.
    assert ragged[0].kv_bytes_read == 2 * sum(ragged[0].lengths) * 8 * 128 * 2
    # The paged batch is the contiguous B=8, 8 KV heads, 32k case in vLLM's 16-key pages.
    (paged,) = [c for c in cases if c.problem.paged]
    assert paged.problem.page_size == 16 and paged.problem.with_(page_size=0, has_cache_seqlens=False) in {
        c.problem for c in cases
    }
    assert paged.kv_bytes_read == 2 * 8 * 32768 * 8 * 128 * 2
    reduced = compare.decode_cases_for(
        compare.parse_args(
            ["--decode", "--decode-batch", "1", "--decode-seqlen", "4096", "--decode-no-ragged", "--decode-no-paged"]
        )
    )
    assert [c.problem.batch for c in reduced] == [1, 1] and {c.problem.kv_heads for c in reduced} == {8, 32}


def test_decode_random_draws_the_issue_space_the_same_way_for_a_seed():
    from common.measure.decode_sweep import RANDOM_MAX_CACHE_BYTES, RANDOM_MIN_CACHE_BYTES

    cases = compare.decode_cases_for(compare.parse_args(["--decode", "--decode-random", "40", "--decode-seed", "7"]))
    again = compare.decode_cases_for(compare.parse_args(["--decode", "--decode-random", "40", "--decode-seed", "7"]))
    other = compare.decode_cases_for(compare.parse_args(["--decode", "--decode-random", "40", "--decode-seed", "8"]))
    assert cases == again and cases != other and len(cases) == 40
    assert all(RANDOM_MIN_CACHE_BYTES <= case.kv_bytes_read <= RANDOM_MAX_CACHE_BYTES for case in cases)
    problems = [case.problem for case in cases]
    assert {p.head_dim for p in problems} == {64, 128, 256} and any(p.paged for p in problems)
    assert any(p.seqlen_q > 1 for p in problems) and any(p.kv_group > 1 for p in problems)
    assert any(case.lengths is not None and not case.problem.paged for case in cases)
    for case in cases:
        if case.lengths is not None:
            assert len(case.lengths) == case.problem.batch
            assert all(case.problem.seqlen_q <= n <= case.problem.seqlen_k for n in case.lengths)


def test_lowest_bandwidth_line_names_each_rungs_worst_measured_case():
    rows = [
        {"impl": "a", "status": "ok", "pct_read_bw": 90.0, "case": "big"},
        {"impl": "a", "status": "ok", "pct_read_bw": 61.0, "case": "small"},
        {"impl": "a", "status": "skipped", "pct_read_bw": float("nan"), "case": "huge"},
        {"impl": "b", "status": "wrong", "pct_read_bw": 10.0, "case": "bad"},
    ]
    assert compare.lowest_bandwidth_line(rows) == "lowest % of read bandwidth: a 61 % (small)"


def test_decode_record_reports_kv_bytes_per_second_and_share_of_read_bandwidth():
    case = compare.decode_cases_for(compare.parse_args(["--decode", "--decode-batch", "1", "--decode-seqlen", "4096"]))[
        0
    ]
    row = blank_row("triton/decode", "triton", "decode", case.problem, "ok", "")
    row.ms = 0.01
    record = compare.decode_record(row, case, read_gbps=case.kv_bytes_read / 0.02e-3 / 1e9)
    assert record["us"] == pytest.approx(10.0) and record["pct_read_bw"] == pytest.approx(200.0)
    assert record["gbps"] == pytest.approx(case.kv_bytes_read / 1e-5 / 1e9)


def test_decode_record_gives_the_share_of_a_same_size_read_and_nan_without_one():
    """``pct_read_floor`` is the same-size read's time over the row's: a row as fast as the read is 100 %, one twice
    as slow 50 %; without a measured read (None, 0) NaN, never a number, and the lowest line leaves it out."""
    case = compare.decode_cases_for(compare.parse_args(["--decode", "--decode-batch", "1", "--decode-seqlen", "4096"]))[
        0
    ]
    row = blank_row("triton/decode", "triton", "decode", case.problem, "ok", "")
    row.ms = 0.02
    record = compare.decode_record(row, case, READ_GBPS, GEMM_TFLOPS, read_floor_us=10.0)
    assert record["read_floor_us"] == 10.0 and record["pct_read_floor"] == pytest.approx(50.0)
    # Planted: the row's time over the read's (200 %) is not the share.
    assert record["pct_read_floor"] != pytest.approx(100 * 20.0 / 10.0)
    for missing in (None, 0.0):
        unmeasured = compare.decode_record(row, case, READ_GBPS, GEMM_TFLOPS, read_floor_us=missing)
        assert math.isnan(unmeasured["read_floor_us"]) and math.isnan(unmeasured["pct_read_floor"])
    assert set(record) == set(compare.DECODE_COLUMNS)
    rows = [record | {"impl": "a", "case": "small"}, unmeasured | {"impl": "b", "case": "small"}]
    share = f"{record['pct_read_bw']:.0f} %"
    assert compare.lowest_bandwidth_line(rows) == (
        f"lowest % of read bandwidth: a {share}; 50 % of a same-size read (small); b {share} (small)"
    )


@pytest.mark.gpu
def test_gpu_same_size_read_reads_that_many_bytes():
    """``same_size_read_us`` of 1 GiB takes about what the measured read bandwidth gives 1 GiB (a read that large
    pays no fixed cost to speak of); planted, a read of four times the bytes (elements counted as bytes) falls
    outside the same window."""
    from common.measure.peaks import measure_read_gbps, same_size_read_us

    device = torch.device("cuda")
    nbytes = 2**30
    expected_us = nbytes / measure_read_gbps(device) / 1e3
    window = (0.9 * expected_us, 1.3 * expected_us)
    measured = same_size_read_us(nbytes, device)
    assert window[0] <= measured <= window[1], (measured, expected_us)
    planted = same_size_read_us(4 * nbytes, device)
    assert not window[0] <= planted <= window[1], (planted, expected_us)


def test_same_size_read_is_none_off_a_gpu():
    from common.measure.peaks import same_size_read_us

    assert same_size_read_us(2**20, torch.device("cpu")) is None


def _kept_scores(case) -> int:
    """Scores the bottom-right causal mask keeps, counted on an explicit (Sq, Sk) mask per sequence."""
    p = case.problem
    lengths = case.lengths or (p.seqlen_k,) * p.batch
    token, key = torch.arange(p.seqlen_q)[:, None], torch.arange(p.seqlen_k)[None, :]
    kept = sum(int(((key < n) & (key <= token + n - p.seqlen_q)).sum()) for n in lengths)
    return p.heads * kept


# Issue #38's worst row (seed 31's seventh shape: B=32 Hkv=32 group 16 Sq=8 D=64, paged, ragged) and a
# memory-bound one (B=32 Hkv=16 group 2 Sq=1 D=64), with that run's ceilings (4410 GB/s, 677 TFLOP/s).
READ_GBPS, GEMM_TFLOPS = 4410.0, 677.0


def test_decode_flops_count_each_kept_score_of_each_sequence_at_four_times_d():
    """The roofline's FLOPs are Q Kᵀ and P V on the scores the mask keeps at each sequence's own length;
    the padded cache's count, or one without the causal triangle, is caught (planted)."""
    from common.measure.decode_sweep import DecodeCase, random_cases

    cases = random_cases(8, 31)
    for case in cases:
        assert case.flops == 4 * case.problem.head_dim * _kept_scores(case), case.describe()
    packed = cases[6]
    assert packed.problem.kv_group * packed.problem.seqlen_q == 128 and packed.problem.head_dim == 64
    # Each K/V byte feeds about group · Sq FLOPs (4 · D · rows a key against 4 · D bytes): 128 less the triangle.
    assert 127 < packed.flops / packed.kv_bytes_read < 128
    padded = DecodeCase(packed.problem)
    assert padded.flops != 4 * 64 * _kept_scores(packed)
    no_triangle = 4 * 64 * packed.problem.heads * packed.problem.seqlen_q * sum(packed.lengths)
    assert no_triangle != 4 * 64 * _kept_scores(packed)


def test_roofline_is_the_longer_of_the_bytes_at_the_read_bandwidth_and_the_flops_at_the_gemm_rate():
    from common.measure.decode_sweep import random_cases, roofline_us

    cases = random_cases(8, 31)
    packed, narrow = cases[6], cases[5]
    bytes_us = {case: case.kv_bytes_read / READ_GBPS / 1e3 for case in (packed, narrow)}
    flops_us = {case: case.flops / GEMM_TFLOPS / 1e6 for case in (packed, narrow)}
    # 128 rows at D=64: the FLOPs take 83 % of the bytes' time (54.1 µs vs 44.9), still memory-bound ...
    assert roofline_us(packed, READ_GBPS, GEMM_TFLOPS) == pytest.approx(bytes_us[packed]) == pytest.approx(54.1, 0.01)
    assert flops_us[packed] == pytest.approx(44.9, 0.01)
    # ... and at the GEMM rate of a GPU with half the tensor cores, compute-bound.
    assert roofline_us(packed, READ_GBPS, GEMM_TFLOPS / 2) == pytest.approx(2 * flops_us[packed])
    assert roofline_us(narrow, READ_GBPS, GEMM_TFLOPS) == pytest.approx(bytes_us[narrow])
    # Planted: the sum of the two (no overlap) or the shorter one is not the roofline.
    for wrong in (bytes_us[packed] + flops_us[packed], flops_us[packed]):
        assert roofline_us(packed, READ_GBPS, GEMM_TFLOPS) != pytest.approx(wrong)
    # A ceiling not measured gives NaN, never a number.
    assert math.isnan(roofline_us(packed, None, GEMM_TFLOPS)) and math.isnan(roofline_us(packed, READ_GBPS, None))


def test_decode_record_divides_the_roofline_by_the_time_and_shows_it_where_it_is_not_the_bandwidth():
    from common.measure.decode_sweep import random_cases
    from common.reporting.decode_table import bandwidth_share

    packed = random_cases(8, 31)[6]
    row = blank_row("gluon/decode", "gluon", "decode", packed.problem, "ok", "")
    row.ms = 0.1233
    record = compare.decode_record(row, packed, READ_GBPS, GEMM_TFLOPS)
    assert record["pct_read_bw"] == pytest.approx(43.9, abs=0.1)
    assert record["pct_roofline"] == pytest.approx(record["pct_read_bw"])
    # On a GPU with half the tensor cores the FLOPs set the least time (89.8 µs, not the bytes' 54.1).
    slow = compare.decode_record(row, packed, READ_GBPS, GEMM_TFLOPS / 2)
    assert slow["pct_roofline"] == pytest.approx(2 * 44.9 / 123.3 * 100, 0.01)
    assert bandwidth_share(slow["pct_read_bw"], slow["pct_roofline"]) == "44 %; 73 % roofline"
    assert bandwidth_share(record["pct_read_bw"], record["pct_roofline"]) == "44 %"
    # No GEMM ceiling: NaN, and the cell shows the bandwidth alone.
    missing = compare.decode_record(row, packed, READ_GBPS)
    assert math.isnan(missing["pct_roofline"]) and bandwidth_share(44.0, missing["pct_roofline"]) == "44 %"
    rows = [record | {"impl": "a", "case": "packed"}, slow | {"impl": "b", "case": "packed"}]
    assert compare.lowest_bandwidth_line(rows) == (
        "lowest % of read bandwidth: a 44 % (packed); b 44 %; 73 % roofline (packed)"
    )


def test_decode_outputs_are_the_plot_and_a_report_with_the_read_bandwidth_beside_the_gemm_peaks(tmp_path: Path):
    """From the committed H100 decode rows: decode_gbps.png and report.md, whose title block shows the
    measured HBM read bandwidth with the GEMM peaks and whose table is the README generator's."""
    from common.measure.peaks import Peaks

    committed = Path(compare.__file__).parent / "results" / "h100" / "decode"
    (tmp_path / "decode.csv").write_text((committed / "decode.csv").read_text())
    with (tmp_path / "decode.csv").open() as handle:
        records = [
            {key: float(value) if key in ("us", "gbps", "pct_read_bw") else value for key, value in row.items()}
            for row in csv.DictReader(handle)
        ]
    for record in records:
        record.update(batch=int(record["batch"]), kv_heads=int(record["kv_heads"]), seqlen_k=int(record["seqlen_k"]))
    peaks = Peaks(790.0, 1400.0, 2700.0, 670.0, 1200.0, read_gbps=3087.0)
    env = {**json.loads((committed / "env.json").read_text()), "peaks": peaks.as_dict()}
    (tmp_path / "env.json").write_text(json.dumps(env))
    written = compare.write_decode_outputs(records, env, peaks, tmp_path)
    assert [path.name for path in written] == ["decode_gbps.png", "report.md"]
    report = (tmp_path / "report.md").read_text()
    assert "bf16 GEMM 790 TFLOP/s burst" in report and "HBM read 3087 GB/s" in report
    # The committed triton/decode cell at B=1, 8 KV heads, 128k, as the generator writes it.
    wanted = ("triton/decode", 1, 8, 131072, "")
    cell = next(r for r in records if (r["impl"], r["batch"], r["kv_heads"], r["seqlen_k"], r["lengths"]) == wanted)
    assert f"| 1 | 8 | 128k | {cell['us']:.1f} µs ({cell['pct_read_bw']:.0f} %) |" in report
    assert "![decode_gbps](decode_gbps.png)" in report


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_decode_without_a_gpu_is_refused_with_status_2(capsys: pytest.CaptureFixture[str]):
    assert compare.main(["--decode"]) == compare.EXIT_USAGE
    assert "--decode needs a CUDA GPU" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------------
# Which rows a sweep times: the teaching rungs only with --all-rungs (issue #38)
# ----------------------------------------------------------------------------------------------------
SWEEP_NAMES = ["triton/naive", "triton/pipelined", "triton/hopper", "triton/fp8", "triton/decode", "cute/online"]
SWEEP_CHOICE = [_fake(name, _right) for name in SWEEP_NAMES] + [
    Unavailable("triton_impl.gluon.tiled", "not implemented yet"),
    Implementation("sdpa/flash", "sdpa", "flash", prepare=_right, supports=lambda p, d: (True, "")),
    Implementation("sdpa/math", "sdpa", "math", prepare=_right, supports=lambda p, d: (True, "")),
]


def test_decode_times_the_decode_hopper_and_baseline_rows_by_default():
    kept, note = compare.without_teaching_rungs(SWEEP_CHOICE, compare.parse_args(["--decode"]), "--decode")
    assert [item.name for item in kept] == ["triton/hopper", "triton/decode", "sdpa/flash"]
    # The rows left out are named, with why and how to time them.
    assert note == (
        "teaching, FP8 and SDPA math rows not timed in --decode (--all-rungs times them): "
        "triton/naive, triton/pipelined, triton/fp8, cute/online, gluon/tiled, sdpa/math"
    )


def test_all_rungs_times_the_teaching_rungs_too():
    args = compare.parse_args(["--decode", "--all-rungs"])
    assert compare.without_teaching_rungs(SWEEP_CHOICE, args, "--decode") == (SWEEP_CHOICE, "")


def test_only_naming_a_teaching_rung_exactly_selects_it():
    args = compare.parse_args(["--decode", "--only", "triton/naive", "--only", "triton/*"])
    kept, note = compare.without_teaching_rungs(SWEEP_CHOICE, args, "--decode")
    assert "triton/naive" in [item.name for item in kept]
    assert "triton/pipelined" in note and "triton/naive" not in note


@pytest.mark.parametrize(
    ("argv", "device", "sweep"),
    [
        (["--seqlen", "1024,8192"], "cuda", True),
        (["--head-dim", "64,128"], "cuda", True),
        (["--seqlen", "8192"], "cuda", False),
        ([], "cuda", False),
        (["--seqlen", "64,128"], "cpu", False),
    ],
)
def test_a_prefill_sweep_on_a_gpu_leaves_the_teaching_rungs_out(argv: list[str], device: str, sweep: bool):
    """Several sizes on a GPU time a sweep (the --gpus sweep too); one problem, the ladder's run, times
    every rung, and so does the CPU teaching mode, whose point the teaching rungs are."""
    args = compare.parse_args(argv)
    assert compare.times_a_sweep(compare.build_problems(args, device), device) is sweep


def test_help_documents_the_default_rows_and_all_rungs(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        compare.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--all-rungs" in text and "naive, online, tiled, pipelined" in text
    assert "hopper, fp8 and decode rungs and the baselines" in text
    assert compare.parse_args(["--decode"]).all_rungs is False


def test_a_report_says_which_rows_were_left_out():
    from common.reporting.report import _notices

    notice = "teaching rungs not timed in --decode (--all-rungs times them): triton/naive"
    assert f"> **Left out:** {notice}." in _notices({"left_out": notice}, cpu_only=False)
