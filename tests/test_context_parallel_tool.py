"""``python -m common.tools.context_parallel`` (launched by torchrun): refusals, the sweep's plan, the
row helpers, the report's tables and targets, and a 2-process gloo run end to end on the CPU."""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from common.contract.metrics import ErrorStats, LseStats
from common.distributed.check import RowCheck
from common.measure import context_parallel as cp
from common.reporting import context_parallel as report
from common.tools import context_parallel as tool

ROOT = Path(__file__).resolve().parent.parent
LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def test_refuses_without_torchrun(monkeypatch, capsys) -> None:
    for name in LAUNCH:
        monkeypatch.delenv(name, raising=False)
    assert tool.main(["--tokens-per-gpu", "1024"]) == tool.EXIT_REFUSED
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not started by torchrun" in err and "--nproc-per-node N" in err


def test_refuses_more_processes_than_gpus(monkeypatch, capsys) -> None:
    # 64 processes on one host: more than any host here has GPUs, so this never starts NCCL.
    for name, value in zip(LAUNCH, ("0", "64", "0", "64"), strict=True):
        monkeypatch.setenv(name, value)
    assert tool.main([]) == tool.EXIT_REFUSED
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "64 processes on this host need 64 CUDA GPUs" in err and "--device cpu" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["--tokens-per-gpu", "0"],
        ["--torch-cp", "math"],
        ["--torch-cp-rotate", "ring"],
        ["--heads", "2,3"],
        ["--heads", "16", "--kv-heads", "5"],
        ["--min-reps", "5", "--max-reps", "4"],
    ],
)
def test_bad_arguments_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        tool.parse_args(argv)
    assert raised.value.code == 2


def test_sweep_runs_longest_shards_first() -> None:
    args = tool.build_parser().parse_args(["--tokens-per-gpu", "1024,4096,2048", "--kv-heads", "4"])
    points = tool.sweep_points(args)
    assert [(p.tokens_per_gpu, p.causal) for p in points] == [
        (4096, False), (4096, True), (2048, False), (2048, True), (1024, False), (1024, True),
    ]  # fmt: skip
    assert {(p.heads, p.kv_heads, p.head_dim, p.dtype) for p in points} == {(16, 4, 128, torch.bfloat16)}
    assert tool.build_parser().parse_args(["--torch-cp", "none"]).torch_cp == []


# ----------------------------------------------------------------------------------------------
# Row helpers
# ----------------------------------------------------------------------------------------------
POINT = cp.SweepPoint(64, 1, 2, 2, 32, torch.float32, causal=True)


def test_ring_capability_states_why_not() -> None:
    cpu = torch.device("cpu")
    assert "unknown implementation" in cp.ring_capability("triton/nope", POINT, cpu)
    assert "returns no LSE" in cp.ring_capability("sdpa/math", POINT, cpu)
    assert "needs a CUDA GPU" in cp.ring_capability("cute/hopper", POINT, cpu)
    odd = cp.SweepPoint(63, 1, 2, 2, 32, torch.float32, causal=True)
    assert "even number of tokens" in cp.ring_capability("triton/tiled", odd, cpu)


def test_chunks_of_reads_the_layout_and_refuses_others() -> None:
    assert cp.chunks_of(torch.cat([torch.arange(0, 4), torch.arange(28, 32)]), 4) == (0, 7)
    assert cp.chunks_of(torch.arange(8, 16), 4) == (2, 3)
    with pytest.raises(ValueError, match="not two whole chunks"):
        cp.chunks_of(torch.tensor([0, 2, 1, 3, 4, 5, 6, 7]), 4)


def test_torch_cp_shards_restores_sdpa_when_the_body_raises(monkeypatch) -> None:
    """A context_parallel that leaves SDPA patched on an exception (releases before 2.14) must not
    send the later rows' SDPA calls to its ring."""
    import torch.distributed.tensor.experimental as experimental

    plain = F.scaled_dot_product_attention

    @contextlib.contextmanager
    def leaky_context_parallel(mesh, *, buffers, buffer_seq_dims):
        F.scaled_dot_product_attention = lambda *args, **kwargs: "ring"
        yield  # no finally: an exception in the body leaves SDPA patched
        F.scaled_dot_product_attention = plain

    monkeypatch.setattr(experimental, "context_parallel", leaky_context_parallel)
    with pytest.raises(RuntimeError, match="body"), cp.torch_cp_shards(None, True, "alltoall", 8, 4, "cpu") as ids:
        assert ids == (0, 1) and F.scaled_dot_product_attention(None, None, None) == "ring"
        raise RuntimeError("body")
    assert F.scaled_dot_product_attention is plain


def _verdict(ok: bool, rel: float) -> RowCheck:
    error, sdpa_error = ErrorStats(rel, rel, rel, 0), ErrorStats(1e-3, 1e-3, 1e-3, 0)
    return RowCheck(ok, "" if ok else "rel_l2 too large", 8, error, sdpa_error, LseStats(0, 0.5, 0))


def test_one_wrong_rank_makes_the_row_wrong() -> None:
    row = cp.CpRow("ring", "triton/tiled", 2, 64, 128, 1, 2, 2, 32, "fp32", True)
    cp._fill_check(row, [_verdict(True, 1e-4), _verdict(False, 0.3)])
    assert row.status == "wrong" and row.reason == "rank 1: rel_l2 too large"
    assert row.rel_l2_err == 0.3 and row.rows_checked == 16 and row.lse_bound_ratio == 0.5
    with pytest.raises(ValueError, match="status must be one of"):
        cp.CpRow("ring", "x", 2, 64, 128, 1, 2, 2, 32, "fp32", True, status="fine")


# ----------------------------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------------------------
def _record(method: str, impl: str, tokens: int, causal: bool, efficiency: float, tflops: float, **extra) -> dict:
    row = cp.CpRow(method, impl, 4, tokens, 4 * tokens, 1, 16, 16, 128, "bf16", causal)
    row.efficiency, row.tflops_per_gpu, row.hidden_ratio = efficiency, tflops, 1.02
    row.rotate = "alltoall" if method == "torch-cp" else ""
    for name, value in extra.items():
        setattr(row, name, value)
    return row.record()


def _frame() -> pd.DataFrame:
    records = [
        _record("ring", "cute/hopper", 262144, False, 0.95, 640.0),
        _record("ring", "triton/hopper", 262144, False, 0.97, 500.0),
        _record("ring", "cute/hopper", 32768, False, 0.80, 540.0),
        _record("torch-cp", "sdpa/cudnn", 262144, False, 0.90, 560.0),
        _record("torch-cp", "sdpa/cudnn", 32768, False, 0.85, 560.0),
        _record("ring", "cute/hopper", 262144, True, 0.85, 600.0),
        _record("ring", "gluon/hopper", 262144, True, 0.70, 520.0, status="wrong", reason="rank 0: bad"),
    ]
    return report._labelled(pd.DataFrame(records))


def test_targets_are_read_from_the_rows() -> None:
    lines = "\n".join(report.target_lines(_frame()))
    # Non-causal: the best efficiency at the longest shard is triton/hopper's 0.97 (meets 0.9).
    assert "full: best ring at 256k/GPU is triton/hopper, efficiency 0.970 (meets 0.9)" in lines
    assert "256k/GPU: best ring 640 TFLOP/s per GPU ≥ best PyTorch CP 560" in lines
    assert "32k/GPU: best ring 540 TFLOP/s per GPU < best PyTorch CP 560" in lines
    # Causal: the wrong gluon row never counts; cute's 0.85 misses the target.
    assert "causal: best ring at 256k/GPU is cute/hopper, efficiency 0.850 (misses 0.9)" in lines


def test_report_tables_plot_and_status(tmp_path: Path) -> None:
    frame = _frame()
    table = report.pivot(frame, "efficiency", "full")
    assert list(table.columns) == ["implementation", "256k/GPU", "32k/GPU"]
    assert table.set_index("implementation").loc["torch CP sdpa/cudnn (alltoall)", "32k/GPU"] == 0.85
    plot = report.write_efficiency_plot(frame, tmp_path, "test")
    env = {"world_size": 4, "backend": "gloo", "gpus_by_rank": ["cpu"] * 4, "topology": "GPU0 X NV18"}
    text = report.write_report(frame, env, tmp_path, plot).read_text()
    assert plot is not None and plot.exists()
    assert "CPU test mode" in text and "GPU0 X NV18" in text and "![efficiency](efficiency.png)" in text
    assert report.exit_status(frame) == 1
    assert report.exit_status(frame[frame["status"] == "ok"]) == 0


# ----------------------------------------------------------------------------------------------
# End to end: torchrun, 2 gloo processes, a Triton rung under the interpreter
# ----------------------------------------------------------------------------------------------
def _gloo_sweep(out: Path, *options: str) -> subprocess.CompletedProcess:
    """The sweep under torchrun in 2 gloo processes on CPU tensors (heads 2, head dim 32, triton/tiled)
    with ``options``, writing to ``out``."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "common.tools.context_parallel", "--device", "cpu", "--heads", "2", "--head-dim", "32",
        "--impl", "triton/tiled", "--timeout-s", "120", "--out", str(out), *options,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_two_process_gloo_run(tmp_path: Path) -> None:
    out = tmp_path / "cp"
    done = _gloo_sweep(
        out, "--tokens-per-gpu", "48,32", "--kv-heads", "1", "--impl", "sdpa/math", "--torch-cp", "cudnn",
        "--target-ms", "1", "--min-reps", "1", "--check-rows", "6",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    frame = pd.read_csv(out / "results.csv", dtype={"reason": str})
    assert len(frame) == 2 * 2 * 3, frame[["impl", "tokens_per_gpu", "causal", "status", "reason"]]
    ring = frame[frame["impl"] == "triton/tiled"]
    assert set(ring["status"]) == {"ok"}, ring[["tokens_per_gpu", "causal", "status", "reason"]].to_string()
    assert (ring["rows_checked"] == 12).all()
    assert (ring["rel_l2_err"] <= 2 * ring["sdpa_rel_l2_err"] + 1e-4).all()
    assert all(math.isfinite(value) for value in ring["efficiency"])
    assert set(frame[frame["impl"] == "sdpa/math"]["status"]) == {"skipped"}
    assert frame[frame["method"] == "torch-cp"]["reason"].str.contains("no CPU path").all()
    env_record = json.loads((out / "env.json").read_text())
    assert env_record["world_size"] == 2 and env_record["backend"] == "gloo"
    assert (out / "report.md").exists() and (out / "efficiency.png").exists()


def test_rows_left_by_the_deadline_fail_the_run(tmp_path: Path) -> None:
    """A sweep the deadline cut short exits 1, its unrun rows recorded as skipped with the reason."""
    out = tmp_path / "cp"
    done = _gloo_sweep(out, "--tokens-per-gpu", "32", "--torch-cp", "none", "--deadline-s", "0", "--transfer-first")
    assert done.returncode != 0, done.stdout[-3000:] + done.stderr[-3000:]
    frame = pd.read_csv(out / "results.csv", dtype={"reason": str})
    assert set(frame["status"]) == {"skipped"} and frame["reason"].str.contains("--deadline-s 0 reached").all()
