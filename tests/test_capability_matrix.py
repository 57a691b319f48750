"""No crash on any input (issue #38): every registered implementation x dtype x head dim x (Sq, Sk) class
on an sm_90 device is refused by its capability check with a reason, or, for a Triton or Gluon rung, its
sm_90a builds (kernel and input transform) fit the shared memory and registers of a CTA.

The matrix runs in a child process without TRITON_INTERPRET (``tests/capability_matrix.py``), where the
checks answer as in a GPU process and Triton compiles; the in-process test asks every check here too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.capability_matrix import (
    DTYPES,
    HEAD_DIMS,
    PROBING_STACKS,
    SEQLEN_CLASSES,
    implementations,
    pretend_sm90,
    problem_for,
)

ROOT = Path(__file__).resolve().parent.parent
# The full matrix compiles about 130 kernels; on CI's two cores it takes about two minutes.
MATRIX_TIMEOUT_S = 900


def _matrix(*options: str) -> list[dict]:
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "tests.capability_matrix", *options],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=MATRIX_TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.splitlines()[-1])


def _violations(rows: list[dict]) -> list[str]:
    """Rows that break the rule: a check or compile that raised, a refusal without a reason, an
    accepted build beyond sm_90's limits."""
    found = []
    for row in rows:
        where = f"{row['impl']} {row['case']}"
        if row["error"]:
            found.append(f"{where}: raised {row['error']}")
        elif not row["accepted"] and not row["reason"].strip():
            found.append(f"{where}: refused without a reason")
        found += [f"{where}: accepted, but {overflow}" for overflow in row["overflows"]]
    return found


# The matrix in parts a test worker each, so that the workers share its compiles. With Triton's cache cold (each CI
# leg's release; 2026-12-03, one process each, quiet): triton/decode about 90 s, gluon/decode 71, the two FP8 rungs
# 92 together, the five other Triton rungs 75, everything else (gluon/hopper's compiles, the CuTe and baseline
# checks) about 30. As two parts (Triton, the rest) the Triton one was the longest test of the static legs.
_OWN_PARTS = {
    "triton-decode": ("triton/decode",),
    "gluon-decode": ("gluon/decode",),
    "fp8": ("triton/fp8", "gluon/fp8"),
}
_OWNED = {name for names in _OWN_PARTS.values() for name in names}
MATRIX_PARTS = {
    **_OWN_PARTS,
    "triton-rest": tuple(sorted(i.name for i in implementations() if i.stack == "triton" and i.name not in _OWNED)),
    "others": tuple(sorted(i.name for i in implementations() if i.stack != "triton" and i.name not in _OWNED)),
}


def test_the_parts_cover_every_implementation_once():
    named = [name for names in MATRIX_PARTS.values() for name in names]
    assert sorted(named) == sorted(impl.name for impl in implementations())


@pytest.mark.static
@pytest.mark.release
@pytest.mark.parametrize("part", list(MATRIX_PARTS))
def test_every_case_is_refused_with_a_reason_or_builds_within_sm90(part: str):
    rows = _matrix("--impls", ",".join(MATRIX_PARTS[part]))
    names = sorted(MATRIX_PARTS[part])
    assert sorted({row["impl"] for row in rows}) == names
    assert len(rows) == len(names) * len(DTYPES) * len(HEAD_DIMS) * len(SEQLEN_CLASSES)
    violations = _violations(rows)
    assert not violations, "\n".join(violations)
    accepted = sum(row["accepted"] for row in rows)
    print(f"{len(rows)} cases: {accepted} accepted and within sm_90's limits, {len(rows) - accepted} refused")


@pytest.mark.static
@pytest.mark.release
@pytest.mark.xdist_group("capability-matrix")
def test_a_check_that_accepts_fp8_at_head_dim_256_fails_the_matrix():
    """The planted bug of issue #38: triton/fp8 accepting D=256, where its quantiser overflows."""
    rows = _matrix("--plant-fp8-d256")
    violations = _violations(rows)
    assert any("shared memory" in violation for violation in violations), rows


@pytest.mark.parametrize("device_type", ["cuda", "cpu"])
def test_every_check_answers_with_a_reason_in_this_process(device_type: str):
    """In this process (the interpreter on a CPU-only machine): every check answers on both device
    types, a refusal with a reason, never an exception."""
    device = torch.device(device_type)
    chosen = [impl for impl in implementations() if device_type == "cpu" or impl.stack not in PROBING_STACKS]
    failures = []
    with pretend_sm90():
        for impl in chosen:
            for dtype in DTYPES:
                for head_dim in HEAD_DIMS:
                    for case, seqlens in SEQLEN_CLASSES.items():
                        problem = problem_for(dtype, head_dim, seqlens)
                        try:
                            ok, reason = impl.check(problem, device)
                        except Exception as error:  # noqa: BLE001 - the finding this test looks for
                            failures.append(f"{impl.name} {case} {problem.describe()}: {type(error).__name__}: {error}")
                            continue
                        if not ok and not reason.strip():
                            failures.append(f"{impl.name} {case} {problem.describe()}: refused without a reason")
    assert not failures, "\n".join(failures)
