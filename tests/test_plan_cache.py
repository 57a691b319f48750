"""``common.attention``'s plan cache: prepare once per signature, bind and launch on every later call.

Counting wrappers around each implementation's ``prepare`` and ``bind`` (and the ``run`` they return)
show what a call does: a second call with new tensors of the same signature must not prepare
(compile, tune, warm up) again, only bind and launch once. Run on CPU under the Triton interpreter.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch

import common.contract.api as api
from common import attention, clear_plan_cache, plan_cache_info
from common.contract import dispatch
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from common.contract.registry import BASELINE_STACKS, Implementation, discover, get, lookup, warmed_up

IMPLEMENTATIONS, _ = discover()
CPU_IMPLS = [impl.name for impl in IMPLEMENTATIONS if impl.runs_on_cpu]
# Small, ragged (S=48 is not a multiple of any tile), a head dim every CPU rung supports, fp32 (the
# interpreter's exact dtype).
PROBLEM = Problem(batch=1, heads=2, seqlen_q=48, seqlen_k=48, head_dim=64, dtype=torch.float32)


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts from an empty cache of the default size."""
    monkeypatch.setattr(api, "_PLANS", api.PlanCache())
    monkeypatch.setattr(api, "_GROWING", api.PlanCache())


def counted(impl_name: str, calls: Counter, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``attention`` see ``impl_name`` with prepare, bind and their runs counted in ``calls``."""
    impl = get(impl_name)

    def counting(kind: str, make):
        def wrapper(*args):
            calls[kind] += 1
            run = make(*args)

            def counted_run():
                calls[f"{kind} run"] += 1
                return run()

            return counted_run

        return wrapper

    # A plan's binder is the rung's bind split at the plan key: each of its calls counts as a bind.
    wrapped = dataclasses.replace(
        impl,
        prepare=counting("prepare", impl.prepare),
        bind=impl.bind and counting("bind", impl.bind),
        make_binder=impl.make_binder and (lambda *planned: counting("bind", impl.make_binder(*planned))),
    )
    monkeypatch.setattr(api, "get", lambda name: wrapped if name == impl_name else get(name))


def inputs(problem: Problem = PROBLEM, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return make_inputs(problem, seed=seed, device="cpu")


@pytest.mark.parametrize("impl_name", [impl.name for impl in IMPLEMENTATIONS])
def test_every_implementation_has_bind(impl_name: str) -> None:
    """The plan cache needs bind; without it attention() re-prepares (and warms up) at every call."""
    impl = get(impl_name)
    assert impl.bind is not None, f"{impl_name} has no bind: common.attention re-prepares it on every call"


@pytest.mark.parametrize("impl_name", CPU_IMPLS)
def test_second_call_binds_without_preparing(impl_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # triton/decode takes at most 16 query tokens: it runs the problem with one.
    problem = PROBLEM if get(impl_name).check(PROBLEM, torch.device("cpu"))[0] else PROBLEM.with_(seqlen_q=1)
    calls: Counter = Counter()
    counted(impl_name, calls, monkeypatch)
    first = attention(*inputs(problem, seed=0), impl=impl_name)
    assert calls == Counter({"prepare": 1, "prepare run": 1})
    q, k, v = inputs(problem, seed=1)
    second = attention(q, k, v, impl=impl_name)
    assert calls == Counter({"prepare": 1, "prepare run": 1, "bind": 1, "bind run": 1}), (
        f"a second call of the same signature must bind and launch once, not prepare: {dict(calls)}"
    )
    assert plan_cache_info() == api.PlanCacheInfo(hits=1, misses=1, size=1, max_size=api.PLAN_CACHE_SIZE)
    # The new tensors' answer, bit for bit the prepared launch's on the same tensors.
    expected = get(impl_name).prepare(q, k, v, problem)()
    assert torch.equal(second, expected)
    assert not torch.equal(first, second)


@pytest.mark.gpu
@pytest.mark.parametrize("impl_name", [impl.name for impl in IMPLEMENTATIONS if not impl.runs_on_cpu])
def test_second_call_binds_without_preparing_on_the_gpu(impl_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    problem = PROBLEM.with_(seqlen_q=200, seqlen_k=200, dtype=torch.bfloat16)
    ok, reason = get(impl_name).check(problem, torch.device("cuda"))
    if not ok:
        pytest.skip(f"{impl_name} cannot run {problem.describe()} here: {reason}")
    calls: Counter = Counter()
    counted(impl_name, calls, monkeypatch)
    attention(*make_inputs(problem, seed=0, device="cuda"), impl=impl_name)
    q, k, v = make_inputs(problem, seed=1, device="cuda")
    second = attention(q, k, v, impl=impl_name)
    assert calls == Counter({"prepare": 1, "prepare run": 1, "bind": 1, "bind run": 1}), dict(calls)
    assert torch.equal(second, get(impl_name).prepare(q, k, v, problem)())


DECODE = PROBLEM.with_(seqlen_q=1, causal=True, causal_alignment="bottom_right")


def test_a_growing_cache_binds_each_new_length_without_preparing(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' DynamicCache makes K and V one key longer at every decode step: a new signature per
    step, planned (validated, checked) but only bound, not prepared again, each answer bit for bit what
    the rung's prepare gives on the same tensors."""
    calls: Counter = Counter()
    counted("triton/decode", calls, monkeypatch)
    for step, seqlen_k in enumerate((48, 49, 50)):
        problem = DECODE.with_(seqlen_k=seqlen_k)
        q, k, v = inputs(problem, seed=step)
        out = attention(q, k, v, causal=True, causal_alignment="bottom_right", impl="triton/decode")
        assert torch.equal(out, get("triton/decode").prepare(q, k, v, problem)())
    assert calls == Counter({"prepare": 1, "prepare run": 1, "bind": 2, "bind run": 2}), dict(calls)
    assert plan_cache_info().misses == 3


def test_a_growing_cache_still_checks_each_new_length(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bind-only path skips prepare, never a capability check that reads Sk: a length the rung
    refuses raises."""
    impl = get("triton/decode")

    def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
        return (False, "planted: not 49 keys") if problem.seqlen_k == 49 else impl.supports(problem, device)

    picky = dataclasses.replace(impl, supports=supports, check_reads_seqlen_k=True)
    monkeypatch.setattr(api, "get", lambda name: picky if name == "triton/decode" else get(name))
    attention(*inputs(DECODE), causal=True, causal_alignment="bottom_right", impl="triton/decode")
    with pytest.raises(ValueError, match="planted: not 49 keys"):
        attention(
            *inputs(DECODE.with_(seqlen_k=49)), causal=True, causal_alignment="bottom_right", impl="triton/decode"
        )


def picky_at_49(impl: Implementation, calls: Counter, reads_seqlen_k: bool) -> Implementation:
    """``impl`` with a capability check that counts its calls and refuses a cache of 49 keys, saying
    (``reads_seqlen_k``) that it reads Sk, or (a planted lie) that it does not."""

    def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
        calls["check"] += 1
        return (False, "planted: not 49 keys") if problem.seqlen_k == 49 else impl.supports(problem, device)

    return dataclasses.replace(impl, supports=supports, check_reads_seqlen_k=reads_seqlen_k)


@pytest.mark.parametrize("reads_seqlen_k", [True, False], ids=["honest", "planted-lie"])
def test_a_growing_cache_checks_its_family_once_where_the_check_ignores_seqlen_k(
    reads_seqlen_k: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rung whose check ignores Sk (``check_reads_seqlen_k`` False, the decode rungs) is checked once
    per growing family, each step's answer bit for bit the rung's prepare's; one whose check reads Sk at
    every step. The planted lie (a check that reads Sk said not to) shows what the flag decides: the
    refused length is then not seen."""
    calls: Counter = Counter()
    picky = picky_at_49(get("triton/decode"), calls, reads_seqlen_k)
    monkeypatch.setattr(api, "get", lambda name: picky if name == "triton/decode" else get(name))
    decode = dict(causal=True, causal_alignment="bottom_right", impl="triton/decode")
    for step, seqlen_k in enumerate((48, 50, 51)):
        problem = DECODE.with_(seqlen_k=seqlen_k)
        q, k, v = inputs(problem, seed=step)
        assert torch.equal(attention(q, k, v, **decode), get("triton/decode").prepare(q, k, v, problem)())
    assert calls["check"] == (3 if reads_seqlen_k else 1)
    refused = inputs(DECODE.with_(seqlen_k=49))
    if reads_seqlen_k:
        with pytest.raises(ValueError, match="planted: not 49 keys"):
            attention(*refused, **decode)
    else:
        attention(*refused, **decode)


@pytest.mark.parametrize("reads_seqlen_k", [True, False], ids=["honest", "planted-lie"])
def test_a_stack_name_dispatches_again_where_a_candidate_reads_seqlen_k(
    reads_seqlen_k: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stack name keeps its growing family's choice only where every candidate it tried ignores Sk:
    a decode rung that refuses 49 keys (and says its check reads Sk) hands that step to a prefill rung."""
    calls: Counter = Counter()
    picky = picky_at_49(get("triton/decode"), calls, reads_seqlen_k)
    monkeypatch.setattr(dispatch, "lookup", lambda name: picky if name == "triton/decode" else lookup(name))
    decode = dict(causal=True, causal_alignment="bottom_right", impl="triton")
    attention(*inputs(DECODE), **decode)
    attention(*inputs(DECODE.with_(seqlen_k=49)), **decode)
    chosen = {key[2][0][2]: plan.implementation.name for key, plan in api._PLANS._plans.items()}
    assert chosen[48] == "triton/decode"
    assert (chosen[49] != "triton/decode") == reads_seqlen_k, chosen


def seqlen_k_dependence(impl: Implementation, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """The first decode problem whose check by ``impl`` answers differently at some Sk > Sq (on a CPU and
    on an sm_90 device, faked), or None: what ``check_reads_seqlen_k=False`` promises."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    base = Problem(batch=2, heads=8, seqlen_q=1, seqlen_k=2, head_dim=128, dtype=torch.float16, kv_heads=2,
                   causal=True, causal_alignment="bottom_right")  # fmt: skip
    variants = [{}, {"seqlen_q": 16}, {"seqlen_q": 17}, {"head_dim": 64}, {"head_dim": 96}, {"head_dim": 256},
                {"dtype": torch.bfloat16}, {"dtype": torch.float32}, {"kv_heads": 8}, {"causal": False},
                {"has_cache_seqlens": True}, {"return_lse": True}, {"softmax_scale": -0.5},
                {"has_cache_seqlens": True, "page_size": 16, "seqlen_k": 32}]  # fmt: skip
    for device in (torch.device("cpu"), torch.device("cuda", 0)):
        for change in variants:
            problem = base.with_(**change)
            page = max(problem.page_size, 1)
            lengths = {problem.seqlen_q + page, 512, 8192, 8192 + page, 65536, 1 << 20}
            answers = {impl.check(problem.with_(seqlen_k=-(-n // page) * page), device) for n in lengths}
            if len(answers) > 1:
                return f"{problem.describe()} on {device}: {sorted(answers)}"
    return None


@pytest.mark.parametrize("impl_name", [impl.name for impl in IMPLEMENTATIONS if not impl.check_reads_seqlen_k])
def test_a_check_said_to_ignore_seqlen_k_does(impl_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert seqlen_k_dependence(get(impl_name), monkeypatch) is None


def test_a_check_that_reads_seqlen_k_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted bug: a decode rung's check that refuses caches past 8192 keys."""
    impl = get("triton/decode")

    def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
        return (False, "planted") if problem.seqlen_k > 8192 else impl.supports(problem, device)

    assert seqlen_k_dependence(dataclasses.replace(impl, supports=supports), monkeypatch) is not None


def test_a_growing_cache_checks_what_reads_the_new_length() -> None:
    """A longer cache skips the checks its growing key proves (validate_longer_cache), not those that
    read Sk: lengths past the new Sk and a v of another length still raise; a valid step's problem is
    the one full validation gives."""
    decode = dict(causal=True, causal_alignment="bottom_right", impl="triton/decode")
    attention(*inputs(DECODE), cache_seqlens=torch.tensor([48], dtype=torch.int32), **decode)
    q, k, v = inputs(DECODE.with_(seqlen_k=49))
    with pytest.raises(ValueError, match=r"cache_seqlens must lie in \[0, Sk\] = \[0, 49\]"):
        attention(q, k, v, cache_seqlens=torch.tensor([50], dtype=torch.int32), **decode)
    with pytest.raises(ValueError, match="k and v must have the same shape"):
        attention(q, k, inputs(DECODE.with_(seqlen_k=50))[2], cache_seqlens=torch.tensor([49], dtype=torch.int32),
                  **decode)  # fmt: skip
    lengths = torch.tensor([49], dtype=torch.int32)
    attention(q, k, v, cache_seqlens=lengths, **decode)
    (plan,) = [plan for key, plan in api._PLANS._plans.items() if key[2][0][2] == 49]
    assert plan.problem == api.validate_attention_inputs(
        q, k, v, causal=True, causal_alignment="bottom_right", cache_seqlens=lengths, allow_gqa=True,
        dtypes=api.API_DTYPES, device_types=api.API_DEVICE_TYPES,
    )  # fmt: skip


def test_views_into_a_larger_cache_prepare_each_length(monkeypatch: pytest.MonkeyPatch) -> None:
    """K and V sliced from a preallocated cache are not whole tensors: their strides do not follow from
    the shape, so no length shares a plan's preparation with another."""
    calls: Counter = Counter()
    counted("triton/decode", calls, monkeypatch)
    q, k, v = inputs(DECODE.with_(seqlen_k=64))
    for seqlen_k in (48, 49):
        attention(q, k[:, :, :seqlen_k], v[:, :, :seqlen_k], causal=True, causal_alignment="bottom_right",
                  impl="triton/decode")  # fmt: skip
    assert calls["prepare"] == 2 and calls["bind"] == 0


@pytest.mark.parametrize(
    "change",
    [
        {"seqlen_q": 40, "seqlen_k": 40},
        {"batch": 2},
        {"dtype": torch.float16},
        {"causal": True},
        {"softmax_scale": 0.25},
    ],
    ids=lambda change: ",".join(change),
)
def test_a_different_signature_builds_a_new_plan(change: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: Counter = Counter()
    counted("triton/online", calls, monkeypatch)
    problem = PROBLEM.with_(**change)
    attention(*inputs(), impl="triton/online")
    q, k, v = inputs(problem)
    out = attention(q, k, v, causal=problem.causal, softmax_scale=problem.softmax_scale, impl="triton/online")
    assert calls["prepare"] == 2 and calls["bind"] == 0
    assert plan_cache_info().size == 2
    assert torch.equal(out, get("triton/online").prepare(q, k, v, problem)())


def test_strides_and_alignment_are_part_of_the_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: Counter = Counter()
    counted("triton/online", calls, monkeypatch)
    q, k, v = inputs()
    attention(q, k, v, impl="triton/online")
    # Same shape, another layout: (B, S, H, D) memory viewed as (B, H, S, D).
    strided = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)]
    out = attention(*strided, impl="triton/online")
    # Same shape and strides, a base 4 bytes off 16-byte alignment.
    misaligned = [torch.empty(t.numel() + 1)[1:].view_as(t).copy_(t) for t in (q, k, v)]
    misaligned_out = attention(*misaligned, impl="triton/online")
    assert calls["prepare"] == 3 and calls["bind"] == 0
    torch.testing.assert_close(out, misaligned_out, rtol=0, atol=0)


def test_the_cache_is_bounded_least_recently_used_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api, "_PLANS", api.PlanCache(max_size=2))
    calls: Counter = Counter()
    counted("triton/online", calls, monkeypatch)
    small = [PROBLEM.with_(seqlen_q=s, seqlen_k=s) for s in (16, 24, 32)]
    for problem in small:
        attention(*inputs(problem), impl="triton/online")
    assert plan_cache_info().size == 2 and calls["prepare"] == 3
    attention(*inputs(small[2]), impl="triton/online")  # still cached
    attention(*inputs(small[0]), impl="triton/online")  # evicted first, prepared again
    assert calls["prepare"] == 4 and calls["bind"] == 1
    assert plan_cache_info().size == 2


def test_clear_plan_cache_forgets_plans_and_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: Counter = Counter()
    counted("triton/online", calls, monkeypatch)
    attention(*inputs(), impl="triton/online")
    attention(*inputs(seed=1), impl="triton/online")
    clear_plan_cache()
    assert plan_cache_info() == api.PlanCacheInfo(hits=0, misses=0, size=0, max_size=api.PLAN_CACHE_SIZE)
    attention(*inputs(seed=2), impl="triton/online")
    assert calls["prepare"] == 2


def test_a_toolchain_change_misses(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: Counter = Counter()
    counted("triton/online", calls, monkeypatch)
    attention(*inputs(), impl="triton/online")
    monkeypatch.setattr(api, "toolchain_versions", lambda: ("another triton", "another cutlass"))
    attention(*inputs(seed=1), impl="triton/online")
    assert calls["prepare"] == 2


def test_validation_still_runs_for_arguments_a_plan_was_not_made_for(monkeypatch: pytest.MonkeyPatch) -> None:
    q, k, v = inputs()
    attention(q, k, v, causal=True, impl="triton/online")
    with pytest.raises(TypeError, match="causal must be a bool"):
        attention(q, k, v, causal=1, impl="triton/online")
    attention(q, k, v, softmax_scale=1.0, impl="triton/online")
    with pytest.raises(TypeError, match="softmax_scale must be a float"):
        attention(q, k, v, softmax_scale=True, impl="triton/online")
    with pytest.raises(TypeError, match=r"q must be a torch\.Tensor"):
        attention(q.numpy(), k, v, impl="triton/online")
    with pytest.raises(ValueError, match="unknown implementation"):
        attention(q, k, v, impl="triton/nonexistent")


def test_a_failed_prepare_leaves_no_plan() -> None:
    q, k, v = inputs(PROBLEM.with_(head_dim=48))
    with pytest.raises(ValueError, match="cannot run"):
        attention(q, k, v, impl="triton/online")
    assert plan_cache_info().size == 0


def test_tensors_that_require_grad_are_refused_by_a_forward_only_rung() -> None:
    q, k, v = inputs()
    q.requires_grad_(True)
    with pytest.raises(NotImplementedError, match="triton/online is forward-only"):
        attention(q, k, v, impl="triton/online")
    with torch.no_grad():
        out = attention(q, k, v, impl="triton/online")
    assert not out.requires_grad


def test_grad_and_no_grad_calls_never_share_a_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """A differentiable call plans a forward that returns the LSE (for the backward): a no-grad call of
    the same signature must neither reuse that plan (it would return (O, lse)) nor lend its own."""
    calls: Counter = Counter()
    counted("triton/tiled", calls, monkeypatch)
    q, k, v = inputs()
    plain = attention(q, k, v, impl="triton/tiled")
    differentiable = attention(q.requires_grad_(True), k, v, impl="triton/tiled")
    assert differentiable.requires_grad and calls["prepare"] == 2 and plan_cache_info().size == 2
    with torch.no_grad():
        again = attention(q, k, v, impl="triton/tiled")
    assert isinstance(again, torch.Tensor) and not again.requires_grad
    assert calls["prepare"] == 2 and calls["bind"] == 1
    assert torch.equal(plain, differentiable.detach()) and torch.equal(plain, again)


def test_without_bind_every_call_prepares(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rung that has no bind yet is still correct through attention(), at prepare's cost."""
    calls: Counter = Counter()
    counted("triton/online", calls, monkeypatch)
    wrapped = dataclasses.replace(api.get("triton/online"), bind=None)
    monkeypatch.setattr(api, "get", lambda name: wrapped)
    attention(*inputs(), impl="triton/online")
    q, k, v = inputs(seed=1)
    out = attention(q, k, v, impl="triton/online")
    assert calls["prepare"] == 2
    assert torch.equal(out, get("triton/online").prepare(q, k, v, PROBLEM)())


def test_warmed_up_launches_once_on_a_gpu_only() -> None:
    launches = Counter()

    def run() -> torch.Tensor:
        launches["run"] += 1
        return torch.zeros(1)

    assert warmed_up(run, torch.device("cpu")) is run and launches["run"] == 0
    warmed_up(run, torch.device("cuda"))
    assert launches["run"] == 1


def test_baseline_stacks_are_registered() -> None:
    stacks = {impl.stack for impl in IMPLEMENTATIONS}
    assert set(BASELINE_STACKS) <= stacks
    with pytest.raises(ValueError, match="rung must be one of"):
        Implementation("x/y", "triton", "sm90", prepare=get("triton/online").prepare, supports=lambda p, d: (True, ""))
