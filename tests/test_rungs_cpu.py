"""Every CPU-runnable rung (Triton under the interpreter) against the fp64 reference."""

from __future__ import annotations

import pytest
import torch

from common.contract.check import check_implementation, check_on_inputs
from common.contract.problem import Problem
from common.contract.registry import discover
from tests.numerics import HARD_INPUTS

AVAILABLE, _ = discover(include_baselines=False)
CPU_RUNGS = [impl.name for impl in AVAILABLE if impl.runs_on_cpu]
BY_NAME = {impl.name: impl for impl in AVAILABLE}
# (Sq, Sk): a single row, odd lengths, exactly one tile, a tile and a half, and Sq != Sk both ways.
SEQLENS = [(1, 1), (77, 77), (128, 128), (200, 200), (77, 200), (200, 77), (1, 130)]


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter tests run on CPU-only machines")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("seqlens", SEQLENS, ids=[f"sq{q}-sk{k}" for q, k in SEQLENS])
@pytest.mark.parametrize("impl_name", CPU_RUNGS)
def test_interpreter_matches_reference(impl_name: str, seqlens: tuple[int, int], dtype: torch.dtype, causal: bool):
    seqlen_q, seqlen_k = seqlens
    problem = Problem(1, 2, seqlen_q, seqlen_k, 64, dtype=dtype, causal=causal)
    impl = BY_NAME[impl_name]
    ok, reason = impl.check(problem, torch.device("cpu"))
    if not ok:
        pytest.skip(reason)
    result = check_implementation(impl, problem, device="cpu", seed=seqlen_q * 31 + seqlen_k)
    assert result.ok, f"{impl_name} {problem.describe()}: {result.summary()}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter tests run on CPU-only machines")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("inputs", sorted(HARD_INPUTS))
@pytest.mark.parametrize("impl_name", CPU_RUNGS)
def test_interpreter_hard_inputs(impl_name: str, inputs: str, causal: bool):
    problem = Problem(1, 2, 77, 90, 64, dtype=torch.float16, causal=causal)
    impl = BY_NAME[impl_name]
    ok, reason = impl.check(problem, torch.device("cpu"))
    if not ok:
        pytest.skip(reason)
    result = check_on_inputs(impl, *HARD_INPUTS[inputs](problem, "cpu"), problem)
    assert result.ok, f"{impl_name} {inputs} {problem.describe()}: {result.summary()}"
