"""Run one measurement in its own process, with a timeout (``compare.py --isolate``).

A kernel that hangs, or one that corrupts its CUDA context (an illegal address poisons the whole
process), cannot take the other implementations down: the parent records ``timeout`` or ``failed``
and moves on. The child rebuilds the seeded inputs and reference itself, so only a small JSON spec
crosses the process boundary, and it prints its :class:`ResultRow` as JSON on its last line.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

from common.contract.problem import DTYPE_NAMES, Problem
from common.contract.registry import Implementation, get
from common.measure.peaks import Peaks
from common.measure.results import ResultRow
from common.measure.runner import TimingOptions, blank_row

ROOT = Path(__file__).resolve().parents[2]


def resolve(name: str) -> Implementation:
    """A registry name (``triton/tiled``) or ``module:attribute`` naming an Implementation object."""
    if ":" in name:
        module, attribute = name.split(":", 1)
        return getattr(importlib.import_module(module), attribute)
    return get(name)


def _problem_spec(problem: Problem) -> dict:
    spec = dataclasses.asdict(problem)
    spec["dtype"] = problem.dtype_name
    return spec


def _failure(impl: Implementation, problem: Problem, status: str, reason: str) -> ResultRow:
    return blank_row(impl.name, impl.stack, impl.rung, problem, status, reason)


def measure_isolated(
    impl_ref: str,
    impl: Implementation,
    problem: Problem,
    device: str,
    options: TimingOptions,
    peaks: Peaks,
    timeout_s: float,
) -> ResultRow:
    """The row a child process measured, or a timeout/failed row when the child did not finish."""
    spec = {
        "impl": impl_ref,
        "problem": _problem_spec(problem),
        "device": device,
        "options": dataclasses.asdict(options),
        "peaks": dataclasses.asdict(peaks),
    }
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "common.measure.isolation", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired:
        return _failure(impl, problem, "timeout", f"no result within {timeout_s:g} s (killed)")
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last_error = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return _failure(impl, problem, "failed", f"child exited with {done.returncode}: {last_error}")
    return ResultRow(**json.loads(lines[-1]))


def _child(spec_json: str) -> None:
    import torch

    from common.measure.row_extras import complete_row
    from common.measure.runner import make_workload, measure

    spec = json.loads(spec_json)
    problem_fields = dict(spec["problem"], dtype=DTYPE_NAMES[spec["problem"]["dtype"]])
    problem = Problem(**problem_fields)
    impl = resolve(spec["impl"])
    workload = make_workload(problem, spec["device"])
    device, options = torch.device(spec["device"]), TimingOptions(**spec["options"])
    row = complete_row(
        measure(impl, workload, device, options, Peaks(**spec["peaks"])), impl, workload, device, options
    )
    print(json.dumps(dataclasses.asdict(row)))


if __name__ == "__main__":
    _child(sys.argv[1])
