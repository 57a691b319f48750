"""Every CPU-runnable rung (Triton under the interpreter) against the fp64 reference: plain attention,
hard inputs, and GQA/MQA, both causal alignments, per-sequence key lengths and the LSE."""

from __future__ import annotations

import pytest
import torch

from common.contract.check import check_implementation, check_on_inputs, run_poisoned
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from common.contract.registry import discover
from tests.numerics import HARD_INPUTS

AVAILABLE, _ = discover(include_baselines=False)
CPU_RUNGS = [impl.name for impl in AVAILABLE if impl.runs_on_cpu]
BY_NAME = {impl.name: impl for impl in AVAILABLE}
# (Sq, Sk): a single row, odd lengths, exactly one tile, a tile and a half, and Sq != Sk both ways.
SEQLENS = [(1, 1), (77, 77), (128, 128), (200, 200), (77, 200), (200, 77), (1, 130)]
# The newest CI leg (torch and Triton as the plain package index has them) runs this file beside the static tests.
pytestmark = pytest.mark.teaching


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


# ----------------------------------------------------------------------------------------------------
# GQA / MQA, both causal alignments, per-sequence key lengths and the LSE
# ----------------------------------------------------------------------------------------------------
HEADS = 4
# (Sq, Sk, kv_heads, alignment): MQA, GQA and MHA; decode-like Sq < Sk and prefill past the cache
# Sq > Sk (whose first rows see no key bottom-right) under both alignments; odd lengths, a single row.
FEATURE_CASES = [
    (1, 77, 1, "bottom_right"),
    (21, 77, 2, "bottom_right"),
    (21, 77, 4, "top_left"),
    (45, 33, 2, "bottom_right"),
    (45, 33, 1, "top_left"),
    (45, 1, 4, "bottom_right"),
]
CACHE_CASES = [(1, 77, "bottom_right"), (21, 77, None), (21, 77, "top_left"), (21, 77, "bottom_right")]


# Small heads keep the interpreter fast; a rung whose smallest head dim is larger (triton/hopper: 64)
# runs the same cases at the first one it takes.
FEATURE_HEAD_DIMS = (32, 64)


def _head_dim(impl_name: str) -> int:
    for head_dim in FEATURE_HEAD_DIMS:
        plain = Problem(1, 1, 1, 1, head_dim, dtype=torch.float32)
        if BY_NAME[impl_name].check(plain, torch.device("cpu"))[0]:
            return head_dim
    return FEATURE_HEAD_DIMS[0]


def _supported_or_skip(impl_name: str, problem: Problem) -> None:
    ok, reason = BY_NAME[impl_name].check(problem, torch.device("cpu"))
    if not ok:
        # A rung that does not implement a feature says so, naming it (capability.check_features);
        # triton/decode refuses a prefill-sized Sq the same way ("use a prefill rung").
        assert "not implemented yet" in reason or "use a prefill rung" in reason, reason
        pytest.skip(reason)


def _feature_case(impl_name: str, problem: Problem, *, offset: float, seed: int, cache_seqlens=None):
    _supported_or_skip(impl_name, problem)
    q, k, v = make_inputs(problem, seed=seed, device="cpu", offset=offset)
    result = check_on_inputs(BY_NAME[impl_name], q, k, v, problem, cache_seqlens=cache_seqlens)
    assert result.ok, f"{impl_name} {problem.describe()} offset={offset}: {result.summary()}"
    return result


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter tests run on CPU-only machines")
@pytest.mark.parametrize("case", FEATURE_CASES, ids=[f"sq{q}-sk{k}-hkv{h}-{a}" for q, k, h, a in FEATURE_CASES])
@pytest.mark.parametrize("impl_name", CPU_RUNGS)
def test_gqa_and_alignment_with_lse(impl_name: str, case: tuple[int, int, int, str]):
    seqlen_q, seqlen_k, kv_heads, alignment = case
    problem = Problem(
        1, HEADS, seqlen_q, seqlen_k, _head_dim(impl_name), dtype=torch.float16, causal=True, kv_heads=kv_heads,
        causal_alignment=alignment, return_lse=True,
    )  # fmt: skip
    # Zero-mean V for MQA/MHA, an offset V for GQA: both kinds of inputs are covered.
    _feature_case(impl_name, problem, offset=0.0 if kv_heads != 2 else 0.5, seed=seqlen_q + 7 * seqlen_k)


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter tests run on CPU-only machines")
@pytest.mark.parametrize("case", CACHE_CASES, ids=[f"sq{q}-sk{k}-{a or 'full'}" for q, k, a in CACHE_CASES])
@pytest.mark.parametrize("impl_name", CPU_RUNGS)
def test_cache_seqlens(impl_name: str, case: tuple[int, int, str | None]):
    seqlen_q, seqlen_k, causal_alignment = case
    problem = Problem(
        3, 2, seqlen_q, seqlen_k, _head_dim(impl_name), dtype=torch.float32, causal=causal_alignment is not None,
        kv_heads=1, causal_alignment=causal_alignment or "top_left", has_cache_seqlens=True, return_lse=True,
    )  # fmt: skip
    # Ragged lengths of a padded cache: a full sequence (Sk), an empty one (0) and one in between.
    lengths = torch.tensor([seqlen_k, 0, seqlen_k // 2 + 1], dtype=torch.int32)
    _feature_case(impl_name, problem, offset=0.5, seed=seqlen_q, cache_seqlens=lengths)


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter tests run on CPU-only machines")
@pytest.mark.parametrize("impl_name", CPU_RUNGS)
def test_rows_that_see_no_key_are_zero_with_lse_minus_inf(impl_name: str):
    """Bottom-right with Sq > Sk: the first Sq - Sk rows see no key; an empty cache sees none at all."""
    problem = Problem(
        2, 2, 20, 5, _head_dim(impl_name), dtype=torch.float32, causal=True, causal_alignment="bottom_right",
        has_cache_seqlens=True, return_lse=True,
    )  # fmt: skip
    _supported_or_skip(impl_name, problem)
    q, k, v = make_inputs(problem, seed=5, device="cpu", offset=1.0)
    lengths = torch.tensor([5, 0], dtype=torch.int32)
    out, lse = run_poisoned(BY_NAME[impl_name].prepare(q, k, v, problem, cache_seqlens=lengths))
    assert torch.equal(out[0, :, :15], torch.zeros_like(out[0, :, :15]))
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.isneginf(lse[0, :, :15]).all() and torch.isneginf(lse[1]).all()
    assert torch.isfinite(lse[0, :, 15:]).all() and torch.isfinite(out).all()
