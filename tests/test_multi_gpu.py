"""compare.py --gpus N on CPU with fakes: the job assignment, the workers' environment, launching and
merging (fake worker commands), ratios only between rows of one GPU, and a 2-worker run end to end
(the parent believes it has 2 GPUs; its workers fall back to the CPU mode, which is what is tested:
the plumbing, not the GPUs)."""

from __future__ import annotations

import csv
import json
import math
import os
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

import compare
from common.contract.problem import Problem
from common.measure import multi_gpu
from common.measure.multi_gpu import Job, Worker
from common.measure.results import CSV_COLUMNS
from common.reporting.multi_gpu import with_same_gpu_ratios

IMPLS = ["triton/tiled", "cute/hopper", "sdpa/cudnn"]


def _problems(*seqlens: int) -> list[Problem]:
    return [Problem.canonical(s, causal=c) for s in seqlens for c in (False, True)]


def _every_job(plans: list[list[Job]]) -> list[tuple[Problem, str]]:
    return sorted(((job.problem, job.impl) for plan in plans for job in plan), key=repr)


@pytest.mark.parametrize(("seqlens", "gpus"), [((1024, 2048, 4096, 8192), 4), ((1024, 8192), 3), ((8192,), 4)])
def test_assign_gives_every_job_exactly_once(seqlens: tuple[int, ...], gpus: int) -> None:
    problems = _problems(*seqlens)
    plans = multi_gpu.assign(problems, IMPLS, gpus)
    assert len(plans) == gpus
    expected = sorted(((p, name) for p in problems for name in IMPLS), key=repr)
    assert _every_job(plans) == expected


def test_assign_keeps_problems_whole_and_balances_flops() -> None:
    problems = _problems(1024, 2048, 4096, 8192)  # 8 problems for 4 GPUs
    plans = multi_gpu.assign(problems, IMPLS, 4)
    for plan in plans:
        for problem in {job.problem for job in plan}:
            assert sorted(job.impl for job in plan if job.problem == problem) == sorted(IMPLS)
    loads = [sum(job.problem.flops for job in plan) for plan in plans]
    # The two S=8192 problems (the largest by far) land on different GPUs.
    assert sum(1 for plan in plans if any(job.problem.seqlen_q == 8192 for job in plan)) == 2
    assert max(loads) <= 2 * min(loads)


def test_assign_splits_implementations_when_problems_are_few() -> None:
    plans = multi_gpu.assign(_problems(8192)[:1], IMPLS, 3)
    assert sorted(len(plan) for plan in plans) == [1, 1, 1]
    assert sorted(plan[0].impl for plan in plans) == sorted(IMPLS)


def test_assign_keeps_sweep_order_within_a_gpu() -> None:
    problems = _problems(1024, 2048)
    plans = multi_gpu.assign(problems, IMPLS, 1)
    assert [(job.problem, job.impl) for job in plans[0]] == [(p, name) for p in problems for name in IMPLS]
    with pytest.raises(ValueError, match="gpus must be"):
        multi_gpu.assign(problems, IMPLS, 0)


def test_visible_devices_follow_the_parent() -> None:
    assert multi_gpu.visible_devices(2, {}, 4) == ["0", "1"]
    assert multi_gpu.visible_devices(2, {"CUDA_VISIBLE_DEVICES": "5, 7,2"}, 3) == ["5", "7"]
    with pytest.raises(ValueError, match="needs 3 CUDA GPUs, this process sees 2"):
        multi_gpu.visible_devices(3, {"CUDA_VISIBLE_DEVICES": "5,7"}, 2)
    with pytest.raises(ValueError, match="sees 0"):
        multi_gpu.visible_devices(1, {}, 0)


def test_worker_env_changes_only_the_visible_device() -> None:
    parent = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1", "X": "y"}
    env = multi_gpu.worker_env({**parent, "CUDA_VISIBLE_DEVICES": "0,1,2,3"}, "2")
    assert env == {**parent, "CUDA_VISIBLE_DEVICES": "2"}


def test_strip_options() -> None:
    argv = ["--gpus", "4", "--seqlen", "1024", "--out=runs/x", "--only", "triton/*", "--out", "y", "--gpus=2"]
    assert multi_gpu.strip_options(argv, ("--gpus", "--out")) == ["--seqlen", "1024", "--only", "triton/*"]


def test_jobs_round_trip(tmp_path: Path) -> None:
    problems = [*_problems(1024), Problem(1, 8, 100, 300, 64, dtype=torch.float16, causal=True, kv_heads=2)]
    jobs = [Job(problem, name) for problem in problems for name in IMPLS[:2]]
    multi_gpu.write_jobs(tmp_path / "jobs.json", jobs)
    assert multi_gpu.read_jobs(tmp_path / "jobs.json") == {problem: IMPLS[:2] for problem in problems}


# A fake worker: writes a results.csv row naming the GPU it was given and the multicast setting it
# inherited, and an env.json; exits with the status given on its command line.
FAKE_WORKER = """
import csv, json, os, sys
out, status = sys.argv[1], int(sys.argv[2])
columns = {columns!r}
row = dict.fromkeys(columns, "")
row.update(impl="triton/tiled", stack="triton", rung="tiled", batch=1, heads=2, seqlen_q=64, seqlen_k=64,
           head_dim=32, dtype="fp16", causal=False, status="ok", tflops=1.0, kv_heads=2,
           reason=os.environ["CUDA_VISIBLE_DEVICES"] + " " + os.environ.get("NCCL_NVLS_ENABLE", "unset"))
with open(os.path.join(out, "results.csv"), "w", newline="") as handle:
    writer = csv.DictWriter(handle, columns)
    writer.writeheader()
    writer.writerow(row)
json.dump({{"gpu": "fake GPU " + os.environ["CUDA_VISIBLE_DEVICES"]}}, open(os.path.join(out, "env.json"), "w"))
sys.exit(status)
"""


def test_run_workers_and_merge(tmp_path: Path) -> None:
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER.format(columns=list(CSV_COLUMNS)))
    folders = [tmp_path / "gpu0", tmp_path / "gpu1"]
    workers = [
        Worker(index, device, folder, [sys.executable, str(script), str(folder), code])
        for index, (folder, device, code) in enumerate([(folders[0], "3", "0"), (folders[1], "6", "1")])
    ]
    statuses = multi_gpu.run_workers(workers, {**os.environ, "NCCL_NVLS_ENABLE": "0"})
    assert statuses == [0, 1]
    merged = multi_gpu.merge_results(workers, tmp_path / "results.csv")
    assert list(merged["gpu"].astype(str)) == ["3", "6"]
    assert list(merged["reason"]) == ["3 0", "6 0"]
    with (tmp_path / "results.csv").open() as handle:
        header = next(csv.reader(handle))
    assert header == [*CSV_COLUMNS, "gpu"]
    assert multi_gpu.worker_envs(workers) == {"3": {"gpu": "fake GPU 3"}, "6": {"gpu": "fake GPU 6"}}


def _row(gpu: str, impl: str, stack: str, tflops: float, causal: bool = False, status: str = "ok") -> dict:
    return dict(
        gpu=gpu, impl=impl, stack=stack, rung=impl.split("/")[1], batch=1, heads=16, kv_heads=16, seqlen_q=8192,
        seqlen_k=8192, head_dim=128, dtype="bf16", causal=causal, causal_alignment="top_left", status=status,
        tflops=tflops,
    )  # fmt: skip


def test_ratios_only_between_rows_of_one_gpu() -> None:
    frame = pd.DataFrame(
        [
            _row("0", "triton/hopper", "triton", 500.0),
            _row("0", "sdpa/cudnn", "sdpa", 600.0),
            _row("0", "sdpa/flash", "sdpa", 300.0),
            _row("1", "cute/hopper", "cute", 660.0),
            _row("1", "sdpa/math", "sdpa", 20.0, status="wrong"),
            _row("1", "gluon/hopper", "gluon", 610.0, causal=True),
            _row("1", "sdpa/cudnn", "sdpa", 550.0, causal=True),
        ]
    )
    ratios = with_same_gpu_ratios(frame)["vs_best_baseline"].tolist()
    assert ratios[:3] == pytest.approx([500 / 600, 1.0, 0.5])
    # GPU 1 ran no passing baseline of the non-causal problem: no ratio, although GPU 0 has one.
    assert math.isnan(ratios[3]) and math.isnan(ratios[4])
    assert ratios[5:] == pytest.approx([610 / 550, 1.0])


def test_gpus_refuses_what_it_cannot_do(capsys) -> None:
    for argv in (["--gpus", "2", "--decode"], ["--gpus", "2", "--device", "cpu"], ["--gpus", "0"]):
        with pytest.raises(SystemExit) as raised:
            compare.parse_args(argv)
        assert raised.value.code == 2


def test_gpus_without_enough_gpus_is_refused(monkeypatch, capsys) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert compare.main(["--gpus", "2"]) == compare.EXIT_USAGE
    assert "--gpus 2 needs 2 CUDA GPUs, this process sees 1" in capsys.readouterr().err


@pytest.mark.slow
def test_gpus_end_to_end_with_two_cpu_workers(monkeypatch, tmp_path: Path) -> None:
    """The parent spreads 2 problems over 2 'GPUs'; each worker (no GPU here: CPU mode) measures its
    whole problem; the merged CSV has both, each with its GPU, and the report its same-GPU ratios."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # The workers see no GPU, so the test means the same on a GPU machine as on a CPU-only one.
    given = multi_gpu.worker_env

    def without_gpus(environ: dict[str, str], device: str) -> dict[str, str]:
        return {**given(environ, device), "CUDA_VISIBLE_DEVICES": ""}

    monkeypatch.setattr(multi_gpu, "worker_env", without_gpus)
    argv = ["--gpus", "2", "--seqlen", "32", "--batch", "1", "--heads", "2", "--head-dim", "32", "--dtype", "fp16"]
    argv += ["--only", "triton/tiled", "--only", "sdpa/math", "--warmup", "1", "--rep", "1", "--out", str(tmp_path)]
    assert compare.main(argv) == 0
    merged = pd.read_csv(tmp_path / "results.csv", dtype={"gpu": str})
    assert sorted(merged["gpu"]) == ["0", "0", "1", "1"]
    assert set(merged["status"]) == {"ok"}
    for gpu, group in merged.groupby("gpu"):
        assert group["causal"].nunique() == 1, f"GPU {gpu} got a split problem"
        assert (tmp_path / f"gpu{gpu}" / "jobs.json").exists() and (tmp_path / f"gpu{gpu}" / "report.md").exists()
    report = (tmp_path / "report.md").read_text()
    assert "÷ best baseline, same GPU" in report and report.count("## B=1 H=2") == 2
    jobs = json.loads((tmp_path / "gpu0" / "jobs.json").read_text())
    assert sorted(job["impl"] for job in jobs) == ["sdpa/math", "triton/tiled"]
