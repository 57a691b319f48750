"""Property-based fuzzing of every CPU-runnable rung against the fp64 reference (Triton interpreter).

CI uses a bounded example count; ``HYPOTHESIS_PROFILE=thorough pytest tests/test_fuzz_cpu.py`` runs
many more for a manual session.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from common.contract.check import check_implementation
from common.contract.gradients import backward_inputs, reference_gradients, sdpa_gradients
from common.contract.problem import Problem
from common.contract.registry import discover
from common.measure.backward import checked_row
from common.tools.fuzz import backward_fitted, fitted, paged

pytestmark = pytest.mark.slow

settings.register_profile(
    "ci", max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("thorough", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

AVAILABLE, _ = discover(include_baselines=False)
CPU_RUNGS = {impl.name: impl for impl in AVAILABLE if impl.runs_on_cpu}


@st.composite
def problems(draw: st.DrawFn) -> Problem:
    """A random plain problem; a random softmax scale is 1/4 to 4 times the default 1/sqrt(D). Far past that the
    softmax of standard-normal inputs is one-hot (8 times at D=256: P = (1, 2e-10) at Sq=1 Sk=2), dQ and dK vanish
    (1e-8 against dV's 16) and the gradient rule, relative to the reference's norm, compares rounding noise: the
    backward's D = rowsum(dO ∘ O) from the rounded O leaves 3e-5 in each Triton backward, SDPA's fp16 math 0."""
    head_dim = draw(st.sampled_from([32, 64, 256]))
    return Problem(
        batch=draw(st.integers(1, 3)),
        heads=draw(st.integers(1, 2)),
        seqlen_q=draw(st.integers(1, 150)),
        seqlen_k=draw(st.integers(1, 150)),
        head_dim=head_dim,
        dtype=draw(st.sampled_from([torch.float16, torch.float32])),
        causal=draw(st.booleans()),
        softmax_scale=draw(st.one_of(st.none(), st.floats(0.25, 4.0).map(lambda times: times / head_dim**0.5))),
    )


@st.composite
def featured_problems(draw: st.DrawFn) -> Problem:
    """A random problem with GQA, a causal alignment, per-sequence lengths and the LSE drawn too."""
    problem = draw(problems())
    featured = problem.with_(
        kv_heads=draw(st.sampled_from([d for d in (1, 2) if problem.heads % d == 0])),
        causal_alignment=draw(st.sampled_from(["top_left", "bottom_right"])),
        has_cache_seqlens=draw(st.booleans()),
        return_lse=draw(st.booleans()),
    )
    page_size = draw(st.sampled_from([0, 0, 16, 32]))  # half on a paged cache (the rungs that read one)
    return paged(featured, page_size) if page_size else featured


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter fuzzing runs on CPU-only machines")
@pytest.mark.parametrize("impl_name", sorted(CPU_RUNGS))
@given(problem=featured_problems(), seed=st.integers(0, 2**16), offset=st.floats(-2.0, 2.0))
def test_random_problems_match_the_reference(impl_name: str, problem: Problem, seed: int, offset: float):
    impl = CPU_RUNGS[impl_name]
    # The drawn problem as the rung takes it: triton/decode's Sq folded into its 1 to 16, a rung without paging on a
    # contiguous cache, one without the other features on the plain problem.
    problem = fitted(impl, problem, torch.device("cpu"))
    assume(problem is not None)
    result = check_implementation(impl, problem, device="cpu", seed=seed, offset=offset)
    assert result.ok, f"{impl_name} {problem.describe()} seed={seed} offset={offset}: {result.summary()}"


CPU_BACKWARDS = {name: impl for name, impl in CPU_RUNGS.items() if impl.backward is not None}


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter fuzzing runs on CPU-only machines")
@pytest.mark.parametrize("impl_name", sorted(CPU_BACKWARDS))
@settings(max_examples=settings.default.max_examples // 2)  # a backward check costs about three forward ones
@given(problem=featured_problems(), seed=st.integers(0, 2**16), offset=st.floats(-2.0, 2.0))
def test_random_gradients_match_the_reference(impl_name: str, problem: Problem, seed: int, offset: float):
    """dQ, dK and dV through ``attention()``'s autograd, each against float64 by the rung's rule with SDPA's gradient
    error as the yardstick, as ``python -m common.tools.fuzz --backward`` judges them on the GPU."""
    impl = CPU_BACKWARDS[impl_name]
    problem = backward_fitted(impl, problem, torch.device("cpu"))
    assume(problem is not None)
    inputs = backward_inputs(problem, seed=seed, device="cpu", offset=offset)
    judged_against = (reference_gradients(*inputs, problem), sdpa_gradients(*inputs, problem))
    row, _ = checked_row(impl, problem, inputs, judged_against)
    assert row["status"] == "ok", f"{impl_name} {problem.describe()} seed={seed} offset={offset}: {row['reason']}"
