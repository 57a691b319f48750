"""CuTe hopper/fp8 ``prepare`` refuses what ``supports`` refuses, on the validated Problem, before GPU work.

The refusal happens after the input checks and before ``bind`` (compile, allocation, launch), so it
runs on a CPU: the tests let the input checks accept CPU tensors and make ``bind`` fail loudly if
it is ever reached.
"""

from __future__ import annotations

import functools

import pytest
import torch

from common.contract.problem import Problem

pytest.importorskip("cutlass")
import cute_impl.fp8 as cute_fp8  # after the skip: the CuTe rungs import cutlass
import cute_impl.hopper as cute_hopper
from tests.cute_stubs import BindReachedError, never_bind

RUNGS = {"cute/hopper": cute_hopper, "cute/fp8": cute_fp8}


@pytest.fixture
def cpu_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The input checks accept CPU tensors; ``bind`` fails loudly if reached."""
    validate = functools.partial(cute_hopper.validate_for_problem, device_types=("cpu",))
    monkeypatch.setattr(cute_hopper, "validate_for_problem", validate)
    for module in RUNGS.values():
        _patch_bind(monkeypatch, module, never_bind)


def _patch_bind(monkeypatch: pytest.MonkeyPatch, module: object, replacement: object) -> None:
    """Make ``module``'s prepare reach ``replacement`` instead of its bind: the FP8 rung's prepare is its
    ``Fp8Entry``'s (triton_impl/fp8_launch.py), which binds through the entry, not the module's name."""
    entry = getattr(module, "ENTRY", None)
    if entry is None:
        monkeypatch.setattr(module, "bind", replacement)
    else:
        monkeypatch.setattr(type(entry), "bind", lambda self, *args, **kwargs: replacement(*args, **kwargs))


@pytest.fixture
def cpu_validation(cpu_inputs: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """As ``cpu_inputs``, and the device check takes the CPU for an sm_90 GPU."""
    monkeypatch.setattr(cute_hopper, "hopper_device_supported", lambda device: (True, ""))


def _tensors(problem: Problem) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    shape = (problem.batch, problem.heads, problem.seqlen_q, problem.head_dim)
    return tuple(torch.randn(shape, dtype=problem.dtype) for _ in range(3))


@pytest.mark.parametrize("scale", [-0.125, 0.0])
@pytest.mark.parametrize("rung", sorted(RUNGS))
def test_non_positive_scale_is_refused_before_bind(rung: str, scale: float, cpu_validation: None):
    problem = Problem(1, 2, 16, 16, 64, dtype=torch.bfloat16, softmax_scale=scale)
    ok, reason = cute_hopper.common_problem_supported(problem)
    assert not ok and reason.startswith("softmax_scale must be > 0")
    with pytest.raises(ValueError, match=rf"softmax_scale must be > 0 .*got {scale}") as error:
        RUNGS[rung].prepare(*_tensors(problem), problem)
    assert reason in str(error.value)


@pytest.mark.parametrize("rung", sorted(RUNGS))
def test_positive_scale_reaches_bind_with_the_validated_problem(
    rung: str, cpu_validation: None, monkeypatch: pytest.MonkeyPatch
):
    # The caller's Problem says D=128; the tensors say D=64: bind must get the tensors' Problem.
    seen: list[Problem] = []

    def record(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, *rest: object) -> None:
        seen.append(problem)
        raise BindReachedError

    _patch_bind(monkeypatch, RUNGS[rung], record)
    tensors = _tensors(Problem(1, 2, 16, 16, 64, dtype=torch.bfloat16))
    caller = Problem(1, 2, 16, 16, 128, dtype=torch.bfloat16, softmax_scale=0.125)
    with pytest.raises(BindReachedError):
        RUNGS[rung].prepare(*tensors, caller)
    assert seen and seen[0].head_dim == 64 and seen[0].scale == 0.125


@pytest.mark.parametrize("rung", sorted(RUNGS))
def test_a_device_that_supports_refuses_is_refused_before_bind(rung: str, cpu_inputs: None):
    """Inputs that pass every input check, on a device that is not an sm_90 GPU (here the CPU)."""
    problem = Problem(1, 2, 16, 16, 64, dtype=torch.bfloat16)
    ok, reason = RUNGS[rung].supports(problem, torch.device("cpu"))
    assert not ok
    with pytest.raises(ValueError, match="needs a CUDA sm_90 GPU") as error:
        RUNGS[rung].prepare(*_tensors(problem), problem)
    assert reason in str(error.value)
