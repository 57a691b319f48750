"""``common.attention``'s hit path: a plan's binder (the rung's ``bind`` less what the plan key decides,
``Implementation.make_binder``) must answer as the slow path does for every call its key admits, and every
call its key does not admit must plan again (issue #39).

triton/decode runs under the Triton interpreter on CPU tensors: each hit is compared bit for bit with the
rung's ``prepare`` (the slow path: validation, bind, launch) on the same tensors. cute/decode cannot run on
a CPU: its binder is checked with the launch stubbed, on what it passes to the kernel. Planted bugs (a key
that ignores strides, a binder that keeps the first call's lengths, one that hands out the same output
twice) must fail the same checks.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

import common.contract.api as api
from common import attention, plan_cache_info
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from common.contract.registry import get

# GQA (two query heads a KV head), a ragged key length, fp32 (the interpreter's exact dtype).
DECODE = Problem(batch=2, heads=4, seqlen_q=1, seqlen_k=77, head_dim=64, dtype=torch.float32, kv_heads=2,
                 causal=True, causal_alignment="bottom_right")  # fmt: skip
OPTIONS = dict(causal=True, causal_alignment="bottom_right", impl="triton/decode")


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api, "_PLANS", api.PlanCache())
    monkeypatch.setattr(api, "_GROWING", api.PlanCache())


def inputs(problem: Problem = DECODE, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return make_inputs(problem, seed=seed, device="cpu", offset=0.5)


def slow_path(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, **inputs: object) -> object:
    """The rung's full path on the same tensors: validation, bind, launch."""
    return get("triton/decode").prepare(q, k, v, problem, **inputs)()


def inner_strided(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a layout whose last dim is not contiguous (a kernel cannot address it: bind copies)."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def test_triton_decode_has_a_binder_and_hits_use_it() -> None:
    attention(*inputs(), **OPTIONS)
    (plan,) = api._PLANS._plans.values()
    assert plan.binder is not None, "triton/decode's plan has no binder: every hit pays the whole bind"


def test_hits_with_new_tensors_answer_as_the_slow_path() -> None:
    """Ten calls, new tensors each (new data pointers): one plan, nine hits, each answer the slow path's."""
    for seed in range(10):
        q, k, v = inputs(seed=seed)
        assert torch.equal(attention(q, k, v, **OPTIONS), slow_path(q, k, v, DECODE)), f"call {seed}"
    assert (plan_cache_info().hits, plan_cache_info().misses) == (9, 1)


def test_hits_never_share_an_output() -> None:
    """Each hit allocates its own O and LSE: an earlier result is not overwritten by a later call."""
    q, k, v = inputs(seed=0)
    first, first_lse = attention(q, k, v, return_lse=True, **OPTIONS)
    kept = first.clone(), first_lse.clone()
    second, second_lse = attention(*inputs(seed=1), return_lse=True, **OPTIONS)
    assert first.data_ptr() != second.data_ptr() and first_lse.data_ptr() != second_lse.data_ptr()
    assert torch.equal(first, kept[0]) and torch.equal(first_lse, kept[1])
    out, lse = slow_path(q, k, v, DECODE.with_(return_lse=True))
    assert torch.equal(first, out) and torch.equal(first_lse, lse)


def test_a_planted_shared_output_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bug the previous test guards against: a binder that hands out the first call's O again."""
    make_binder = get("triton/decode").make_binder

    def caching(*planned: object):
        binder, outputs = make_binder(*planned), []

        def shared(*tensors: object):
            run = binder(*tensors)

            def first_output():
                result = run()
                outputs.append(outputs[0].copy_(result) if outputs else result)
                return outputs[-1]

            return first_output

        return shared

    planted = dataclasses.replace(get("triton/decode"), make_binder=caching)
    monkeypatch.setattr(api, "get", lambda name: planted if name == "triton/decode" else get(name))
    attention(*inputs(seed=0), **OPTIONS)
    first = attention(*inputs(seed=1), **OPTIONS)
    first_values = first.clone()
    attention(*inputs(seed=2), **OPTIONS)
    assert not torch.equal(first, first_values), "the planted bug went unseen"


@pytest.mark.parametrize("planted", [False, True], ids=["as-built", "key-without-strides"])
def test_a_stride_change_plans_again(planted: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """K and V whose last dim is not contiguous are a new signature: a new plan whose binder copies them.
    Planted: a key without strides lets them hit the contiguous plan, whose binder passes them as they
    are; the answer must then differ from the slow path's."""
    if planted:
        real = api._tensor_signature
        monkeypatch.setattr(api, "_tensor_signature", lambda t: tuple(x for i, x in enumerate(real(t)) if i != 1))
    attention(*inputs(seed=0), **OPTIONS)
    q, k, v = inputs(seed=1)
    strided_k, strided_v = inner_strided(k), inner_strided(v)
    out = attention(q, strided_k, strided_v, **OPTIONS)
    assert plan_cache_info().misses == (1 if planted else 2)
    assert torch.equal(out, slow_path(q, k, v, DECODE)) != planted


def test_a_misaligned_base_plans_again() -> None:
    """The same strides, a base 4 bytes off 16-byte alignment: a new plan, the slow path's answer."""
    attention(*inputs(seed=0), **OPTIONS)
    q, k, v = inputs(seed=1)
    misaligned = torch.empty(k.numel() + 1)[1:].view_as(k).copy_(k)
    assert misaligned.data_ptr() % 16
    out = attention(q, misaligned, v, **OPTIONS)
    assert plan_cache_info().misses == 2
    assert torch.equal(out, slow_path(q, k, v, DECODE))


def test_a_dtype_change_plans_again() -> None:
    attention(*inputs(seed=0), **OPTIONS)
    q, k, v = (t.half() for t in inputs(seed=1))
    out = attention(q, k, v, **OPTIONS)
    assert out.dtype == torch.float16 and plan_cache_info().misses == 2
    assert torch.equal(out, slow_path(q, k, v, DECODE.with_(dtype=torch.float16)))


def test_a_device_change_plans_again_and_is_refused_by_name() -> None:
    """A device the API does not run (meta) never reaches a CPU plan's binder: validation names it.
    (The only other device a CPU machine has; a CUDA tensor's device is in the key alike.)"""
    attention(*inputs(seed=0), **OPTIONS)
    q, k, v = (t.to("meta") for t in inputs(seed=1))
    with pytest.raises((TypeError, ValueError), match="meta"):
        attention(q, k, v, **OPTIONS)
    assert plan_cache_info().hits == 0


def test_autocast_hits_the_plan_of_its_dtype() -> None:
    """fp32 tensors under autocast attend in autocast's dtype: the fp16 plan, the fp16 answer."""
    q, k, v = inputs(seed=0)
    half = [t.half() for t in (q, k, v)]
    attention(*half, **OPTIONS)
    with torch.autocast("cpu", dtype=torch.float16):
        out = attention(q, k, v, **OPTIONS)
    assert out.dtype == torch.float16 and (plan_cache_info().hits, plan_cache_info().misses) == (1, 1)
    assert torch.equal(out, slow_path(*half, DECODE.with_(dtype=torch.float16)))


def test_a_differentiable_call_is_still_refused_by_a_forward_only_rung() -> None:
    """The binder never bypasses the differentiable check: grad and no-grad calls are two keys."""
    attention(*inputs(seed=0), **OPTIONS)
    q, k, v = inputs(seed=1)
    with pytest.raises(NotImplementedError, match="forward-only"):
        attention(q.requires_grad_(), k, v, **OPTIONS)


@pytest.mark.parametrize("planted", [False, True], ids=["as-built", "first-lengths-kept"])
def test_new_cache_seqlens_on_a_hit(planted: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """``cache_seqlens`` is an input, not part of the plan: a hit with new lengths answers for them.
    Planted: a binder that keeps the lengths of its first call."""
    if planted:
        make_binder = get("triton/decode").make_binder

        def keeping(*planned: object):
            binder, first = make_binder(*planned), []

            def stale(q, k, v, cache_seqlens, block_table):
                first.append(cache_seqlens)
                return binder(q, k, v, first[0], block_table)

            return stale

        entry = dataclasses.replace(get("triton/decode"), make_binder=keeping)
        monkeypatch.setattr(api, "get", lambda name: entry if name == "triton/decode" else get(name))
    problem = DECODE.with_(has_cache_seqlens=True)
    # The plan's call (prepare), a first hit, then the hit checked: lengths new at each.
    for seed, first_lengths in enumerate(([77, 40], [60, 1])):
        attention(*inputs(seed=seed), cache_seqlens=torch.tensor(first_lengths, dtype=torch.int32), **OPTIONS)
    q, k, v = inputs(seed=2)
    lengths = torch.tensor([5, 77], dtype=torch.int32)
    out = attention(q, k, v, cache_seqlens=lengths, **OPTIONS)
    assert plan_cache_info().hits == 2
    assert torch.equal(out, slow_path(q, k, v, problem, cache_seqlens=lengths)) != planted


def test_cache_seqlens_given_or_not_are_two_plans() -> None:
    attention(*inputs(seed=0), **OPTIONS)
    q, k, v = inputs(seed=1)
    lengths = torch.tensor([30, 77], dtype=torch.int32)
    out = attention(q, k, v, cache_seqlens=lengths, **OPTIONS)
    assert plan_cache_info().misses == 2
    assert torch.equal(out, slow_path(q, k, v, DECODE.with_(has_cache_seqlens=True), cache_seqlens=lengths))


def test_a_growing_cache_and_its_hits_answer_as_the_slow_path() -> None:
    """A DynamicCache's step: the first layer grows the cache by a key (a new plan through the growing
    key), the other layers hit that plan with their own tensors."""
    prompt = inputs(DECODE.with_(seqlen_k=70), seed=0)
    attention(*prompt, **OPTIONS)
    for seqlen_k in range(71, 75):
        problem = DECODE.with_(seqlen_k=seqlen_k)
        for layer in range(3):
            q, k, v = inputs(problem, seed=seqlen_k * 10 + layer)
            assert torch.equal(attention(q, k, v, **OPTIONS), slow_path(q, k, v, problem)), (seqlen_k, layer)
    assert (plan_cache_info().hits, plan_cache_info().misses) == (8, 5)


def test_eviction_drops_the_binder_with_its_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan evicted from the bounded cache is made again (with a new binder) on its next call."""
    monkeypatch.setattr(api, "_PLANS", api.PlanCache(max_size=1))
    first = inputs(seed=0)
    attention(*first, **OPTIONS)
    attention(*inputs(DECODE.with_(batch=1), seed=1), **OPTIONS)
    q, k, v = inputs(seed=2)
    assert torch.equal(attention(q, k, v, **OPTIONS), slow_path(q, k, v, DECODE))
    assert (plan_cache_info().hits, plan_cache_info().misses) == (0, 3)


# ----------------------------------------------------------------------------------------------
# cute/decode: the binder checked on what it launches (no CuTe kernel runs on a CPU)
# ----------------------------------------------------------------------------------------------
@pytest.fixture
def cute_stubbed(monkeypatch: pytest.MonkeyPatch) -> list:
    """cute/decode on CPU tensors with its compiled kernel a recorder: returns the argument tuples launched."""
    pytest.importorskip("cutlass")
    from cute_impl import _host, decode

    for name in ("check_common", "validate_for_problem"):
        monkeypatch.setattr(_host, name, functools.partial(getattr(_host, name), device_types=("cpu",)))
    launched: list = []
    monkeypatch.setattr(decode.HOST.kernels, "kernel", lambda config: lambda *args: launched.append(args))
    entry = dataclasses.replace(get("cute/decode"), runs_on_cpu=True)
    monkeypatch.setattr(api, "get", lambda name: entry if name == "cute/decode" else get(name))
    return launched


def test_cute_decode_binds_each_hits_tensors_and_a_new_output(cute_stubbed: list) -> None:
    problem = DECODE.with_(dtype=torch.float16, head_dim=128, seqlen_k=4096)
    for seed in range(3):
        q, k, v = (t.half() for t in inputs(problem, seed=seed))
        out = attention(q, k, v, causal=True, causal_alignment="bottom_right", impl="cute/decode")
        arguments = cute_stubbed[-1]
        assert arguments[0] is q and arguments[1] is k and arguments[2] is v
        # The packed O the kernel writes is a view of the O returned, new at every call.
        assert arguments[3].data_ptr() == out.data_ptr()
        assert all(out.data_ptr() != earlier[3].data_ptr() for earlier in cute_stubbed[:-1])
    assert (plan_cache_info().hits, plan_cache_info().misses) == (2, 1)


def test_cute_decode_copies_what_a_kernel_cannot_address(cute_stubbed: list) -> None:
    """An inner-strided K is its own plan, whose binder passes the kernel a contiguous copy."""
    problem = DECODE.with_(dtype=torch.float16, head_dim=128, seqlen_k=4096)
    decode = dict(causal=True, causal_alignment="bottom_right", impl="cute/decode")
    attention(*(t.half() for t in inputs(problem, seed=0)), **decode)
    q, k, v = (t.half() for t in inputs(problem, seed=1))
    for _ in range(2):  # the plan's first call and a hit
        attention(q, inner_strided(k), v, **decode)
        passed = cute_stubbed[-1][1]
        assert passed.stride(-1) == 1 and torch.equal(passed, k)


# ----------------------------------------------------------------------------------------------
# gluon/decode: the binder's launch against bind's (no Gluon kernel runs on a CPU)
# ----------------------------------------------------------------------------------------------
def _launch_fields(launch: object) -> list:
    """A GluonDecode's grid, constexprs and arguments, each tensor as its layout (new allocations differ in
    address only) and each TMA descriptor as its base, shape, strides and box."""

    def field(argument: object) -> object:
        if isinstance(argument, torch.Tensor):
            return ("tensor", tuple(argument.shape), argument.stride(), argument.dtype)
        if hasattr(argument, "block_shape"):
            base = argument.base
            return ("descriptor", base.data_ptr(), tuple(argument.shape), tuple(argument.strides), argument.block_shape)
        return argument

    return [launch.split_grid, launch.split_options, [field(argument) for argument in launch.split_args]]


@pytest.mark.parametrize("lengths", [None, [77, 30]], ids=["padded-split", "cache-seqlens"])
def test_gluon_decode_binder_launches_what_bind_does(lengths: list[int] | None) -> None:
    from triton_impl.gluon import decode as gluon_decode

    problem = DECODE.with_(dtype=torch.float16, head_dim=128, seqlen_k=4096, has_cache_seqlens=lengths is not None)
    cache_seqlens = None if lengths is None else torch.tensor(lengths, dtype=torch.int32)
    q, k, v = (t.half() for t in inputs(problem, seed=3))
    bound = gluon_decode.bind(q, k, v, problem, cache_seqlens=cache_seqlens)
    binder = gluon_decode.make_binder(problem, torch.device("cpu"), None, True)
    launches = [binder(q, k, v, cache_seqlens, None) for _ in range(2)]
    assert _launch_fields(launches[0]) == _launch_fields(bound)
    # Each bind allocates its own O: two launches of one binder never share it.
    assert launches[0].out.data_ptr() != launches[1].out.data_ptr()
