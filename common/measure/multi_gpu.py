"""``compare.py --gpus N``: one sweep spread over N GPUs of this host, one worker process per GPU.

The parent plans the sweep's jobs (problem x implementation), gives each GPU a share
(:func:`assign`), starts one ordinary ``compare.py`` run per GPU over its share (``--jobs``), each
with ``CUDA_VISIBLE_DEVICES`` naming its GPU and every other variable inherited (the NCCL and
multicast settings of the host included), waits for all, and merges their ``results.csv`` into one
with a ``gpu`` column (:func:`merge_results`). Each worker measures its own peaks and writes its own
env.json and report under ``gpu<i>/``.

**Assignment.** When there are at least as many problems as GPUs, every problem goes whole to one
GPU, so every comparison within a problem (against SDPA, between stacks) is between rows of one GPU.
Problems are placed largest first on the least-loaded GPU, the load being FLOPs x implementations (a
proxy: implementations differ in speed). With fewer problems than GPUs, each problem's
implementations are dealt out over the GPUs, and the report compares only rows of the same GPU.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from common.contract.problem import DTYPE_NAMES, Problem

WORKER_DIR = "gpu{index}"
JOBS_FILE = "jobs.json"
LOG_FILE = "worker.log"


@dataclass(frozen=True)
class Job:
    problem: Problem
    impl: str


def assign(problems: Sequence[Problem], impl_names: Sequence[str], gpus: int) -> list[list[Job]]:
    """The jobs of each GPU (see the module docstring), each list in sweep order (problem, then impl)."""
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    whole = len(problems) >= gpus
    units = (
        [[Job(problem, name) for name in impl_names] for problem in problems]
        if whole
        else [[Job(problem, name)] for problem in problems for name in impl_names]
    )
    order = {(job.problem, job.impl): index for index, job in enumerate(job for unit in units for job in unit)}
    loads = [0] * gpus
    plans: list[list[Job]] = [[] for _ in range(gpus)]
    for unit in sorted(units, key=lambda jobs: sum(job.problem.flops for job in jobs), reverse=True):
        target = loads.index(min(loads))
        plans[target] += unit
        loads[target] += sum(job.problem.flops for job in unit)
    return [sorted(plan, key=lambda job: order[(job.problem, job.impl)]) for plan in plans]


def visible_devices(gpus: int, environ: dict[str, str], device_count: int) -> list[str]:
    """The device ids to hand the workers: the first ``gpus`` of the parent's ``CUDA_VISIBLE_DEVICES``
    when it has one, else 0..gpus-1. Refuses more GPUs than this process sees (``device_count``)."""
    listed = [item.strip() for item in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if item.strip()]
    ids = listed if "CUDA_VISIBLE_DEVICES" in environ else [str(index) for index in range(device_count)]
    available = ids[:device_count]
    if gpus > len(available):
        raise ValueError(f"--gpus {gpus} needs {gpus} CUDA GPUs, this process sees {len(available)}")
    return available[:gpus]


def worker_env(environ: dict[str, str], device: str) -> dict[str, str]:
    """The parent's environment with ``CUDA_VISIBLE_DEVICES`` set to the worker's one GPU; nothing else
    changes (NCCL_NVLS_ENABLE and the other multicast settings travel unchanged)."""
    return {**environ, "CUDA_VISIBLE_DEVICES": device}


def strip_options(argv: Sequence[str], names: Sequence[str]) -> list[str]:
    """``argv`` without the options ``names`` (each taking one value, as ``--x v`` or ``--x=v``)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in names:
            skip = True
            continue
        if any(arg.startswith(f"{name}=") for name in names):
            continue
        kept.append(arg)
    return kept


def problem_record(problem: Problem) -> dict:
    return {**dataclasses.asdict(problem), "dtype": problem.dtype_name}


def problem_from_record(record: dict) -> Problem:
    return Problem(**{**record, "dtype": DTYPE_NAMES[record["dtype"]]})


def write_jobs(path: Path, jobs: Sequence[Job]) -> None:
    path.write_text(json.dumps([{"problem": problem_record(job.problem), "impl": job.impl} for job in jobs], indent=1))


def read_jobs(path: Path) -> dict[Problem, list[str]]:
    """A worker's jobs as problem -> implementation names, in file order."""
    jobs: dict[Problem, list[str]] = {}
    for record in json.loads(path.read_text()):
        jobs.setdefault(problem_from_record(record["problem"]), []).append(record["impl"])
    return jobs


@dataclass(frozen=True)
class Worker:
    index: int
    device: str
    out_dir: Path
    command: list[str]


def run_workers(workers: Sequence[Worker], environ: dict[str, str]) -> list[int]:
    """Start every worker at once (its output to ``worker.log`` in its folder), wait for all; their
    exit statuses. Ctrl-C stops them all and is raised again."""
    processes = []
    for worker in workers:
        worker.out_dir.mkdir(parents=True, exist_ok=True)
        log = (worker.out_dir / LOG_FILE).open("w")
        env = worker_env(environ, worker.device)
        processes.append((subprocess.Popen(worker.command, stdout=log, stderr=subprocess.STDOUT, env=env), log))
    try:
        return [process.wait() for process, _ in processes]
    except KeyboardInterrupt:
        for process, _ in processes:
            process.terminate()
        for process, _ in processes:
            process.wait()
        raise
    finally:
        for _, log in processes:
            log.close()


def merge_results(workers: Sequence[Worker], path: Path) -> pd.DataFrame:
    """Every worker's results.csv, each row with its ``gpu`` (the device id it ran on), in one CSV."""
    frames = []
    for worker in workers:
        csv_path = worker.out_dir / "results.csv"
        if csv_path.exists():
            frame = pd.read_csv(csv_path, dtype={"reason": str, "variant": str})
            frames.append(frame.assign(gpu=worker.device))
    merged = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["gpu"])
    merged.to_csv(path, index=False)
    return merged


def worker_envs(workers: Sequence[Worker]) -> dict[str, dict]:
    """Each worker's env.json (GPU, peaks, versions) by device id; {} for a worker that wrote none."""
    envs = {}
    for worker in workers:
        env_path = worker.out_dir / "env.json"
        envs[worker.device] = json.loads(env_path.read_text()) if env_path.exists() else {}
    return envs
