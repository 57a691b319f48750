"""``common.attention``'s growing path: a decode step against a cache one key longer than its family's last plan
(transformers' DynamicCache) takes its binder from that plan's binder (``grown``: the registry's growing binder),
re-deciding only what Sk enters. Every growing call must answer as the slow path does (issue #39).

Two checks: a grown binder holds what ``make_binder`` makes for the same problem from scratch (every rung, no
kernel runs, over lengths that cross the split rule's thresholds, padded and balanced), and triton/decode's growing
calls under the Triton interpreter equal, bit for bit, the rung's ``prepare`` on the same tensors. Planted bugs (a
binder that keeps the old split count, one that keeps the old Sk) must fail both. The GPU test runs every decode
rung and ``impl="auto"`` on real kernels.
"""

from __future__ import annotations

import pytest
import torch

import common.contract.api as api
import triton_impl.decode as triton_decode
from common import attention, clear_plan_cache, plan_cache_info
from common.contract import splits
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from common.contract.registry import get

CPU = torch.device("cpu")
# GQA, fp32 (the interpreter's exact dtype), bottom-right causal as a KV cache is.
DECODE = Problem(batch=2, heads=4, seqlen_q=1, seqlen_k=1020, head_dim=64, dtype=torch.float32, kv_heads=2,
                 causal=True, causal_alignment="bottom_right")  # fmt: skip
OPTIONS = dict(causal=True, causal_alignment="bottom_right")
# Lengths across the rule's thresholds: one split below 2 · MIN_KEYS_PER_SPLIT keys, two from it, ... and the
# short-cache bound (SHORT_CACHE_KEYS) at which the short-cache tile and one-split exception stop.
THRESHOLD = 2 * splits.MIN_KEYS_PER_SPLIT
CROSSING = (*range(THRESHOLD - 3, THRESHOLD + 3), 3 * splits.MIN_KEYS_PER_SPLIT, splits.SHORT_CACHE_KEYS)
STRUCTURE_LENGTHS = (*CROSSING, splits.SHORT_CACHE_KEYS + 1, 40_000, 40_001, 70_000)


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api, "_PLANS", api.PlanCache())
    monkeypatch.setattr(api, "_GROWING", api.PlanCache())


def state(binder: object) -> dict:
    """What a binder holds, nested binders and plans opened, the compiled kernel's cache left out."""
    opened = {}
    for name, value in vars(binder).items():
        if name == "compiled":
            continue
        opened[name] = state(value) if hasattr(value, "decisions") else value
    return opened


def binder_rungs() -> list[str]:
    names = ["triton/decode", "gluon/decode"]
    try:
        import cute_impl.decode  # noqa: F401
    except ImportError:
        return names
    return [*names, "cute/decode"]


def grown_against_fresh(name: str, problem: Problem, lengths: tuple[int, ...]) -> list[tuple[int, bool]]:
    """Grow a binder of ``name`` through ``lengths`` as ``common.attention`` does; each step's state beside a
    fresh ``make_binder``'s: ``(length, equal)``."""
    implementation = get(name)

    def planned(p: Problem) -> object:
        return None if implementation.plan_bind is None else implementation.plan_bind(p, CPU)

    binder = implementation.make_binder(problem, CPU, planned(problem), True)
    answers = []
    for length in lengths:
        longer = problem.with_seqlen_k(length)
        binder = binder.grown(longer, CPU)
        answers.append((length, state(binder) == state(implementation.make_binder(longer, CPU, planned(longer), True))))
    return answers


RAGGED = DECODE.with_(has_cache_seqlens=True)


@pytest.mark.parametrize("problem", [DECODE, RAGGED], ids=["padded", "cache-seqlens"])
@pytest.mark.parametrize("name", binder_rungs())
def test_a_grown_binder_is_what_make_binder_makes(name: str, problem: Problem) -> None:
    answers = grown_against_fresh(name, problem, STRUCTURE_LENGTHS)
    assert all(equal for _, equal in answers), f"{name}: grown binders differ from fresh ones at {answers}"


def test_the_lengths_cross_the_rules_thresholds() -> None:
    """The structural test means something only where Sk changes the decisions on its lengths."""
    seen = {triton_decode.seqlen_k_decisions(p, CPU) for p in map(DECODE.with_seqlen_k, STRUCTURE_LENGTHS)}
    assert len({decisions[2] for decisions in seen}) >= 3, seen
    ragged = {triton_decode.seqlen_k_decisions(RAGGED.with_seqlen_k(n), CPU)[0] for n in STRUCTURE_LENGTHS}
    assert ragged == {False, True}, "the balanced split should apply to some ragged lengths and not to others"


def rung_decisions(name: str) -> object:
    """The rung's ``seqlen_k_decisions(problem, device)``: what its binder decides from Sk."""
    if name == "triton/decode":
        return triton_decode.seqlen_k_decisions
    if name == "gluon/decode":
        from triton_impl.gluon import decode as gluon_decode

        return gluon_decode.seqlen_k_decisions
    from cute_impl import decode as cute_decode

    return cute_decode.seqlen_k_decisions


@pytest.mark.parametrize("name", binder_rungs())
def test_one_seqlen_k_class_is_one_padded_decision(name: str) -> None:
    """What the growing binders' shortcut rests on (``splits.same_padded_split``): two lengths of one
    ``splits.seqlen_k_class`` get the same padded-split decisions, checked over lengths from 1 to 80k keys,
    several batch shapes, with and without per-sequence lengths."""
    decisions = rung_decisions(name)
    lengths = sorted({*range(1, 80_000, 97), *(n + d for n in (8192, 65_536) for d in (-1, 0, 1))})
    for problem in (DECODE, RAGGED, DECODE.with_(batch=16, kv_heads=8, heads=32)):
        by_class: dict = {}
        for length in lengths:
            longer = problem.with_seqlen_k(length)
            decided = decisions(longer, CPU)
            if not decided[0]:
                assert by_class.setdefault(splits.seqlen_k_class(length), decided) == decided, (problem, length)


def keep_old_split_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: a grown binder that never re-decides (the family's first split count, forever)."""
    monkeypatch.setattr(triton_decode, "seqlen_k_decisions", lambda problem, device: (False, None, 0))
    original = triton_decode.SplitBinder.grown

    def frozen(self, problem, device):
        self.decisions = (False, None, 0)
        return original(self, problem, device)

    monkeypatch.setattr(triton_decode.SplitBinder, "grown", frozen)


def keep_old_lengths(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: a grown binder that keeps the family's Sk in the kernel's size arguments."""
    original = triton_decode.SplitBinder.grown

    def stale(self, problem, device):
        longer = original(self, problem, device)
        longer.sizes = self.sizes
        return longer

    monkeypatch.setattr(triton_decode.SplitBinder, "grown", stale)


PLANTS = {"old-split-count": keep_old_split_count, "old-lengths": keep_old_lengths}


@pytest.mark.parametrize("planted", PLANTS)
def test_planted_grown_binders_fail_the_structural_check(planted: str, monkeypatch: pytest.MonkeyPatch) -> None:
    PLANTS[planted](monkeypatch)
    answers = grown_against_fresh("triton/decode", DECODE, STRUCTURE_LENGTHS)
    assert not all(equal for _, equal in answers), "the planted bug went unseen"


def test_a_planted_cute_binder_keeping_its_launch_plan_fails_the_structural_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """cute/decode's planted bug: decisions that never change, so every grown binder keeps the first launch plan."""
    pytest.importorskip("cutlass")
    from cute_impl import decode as cute_decode

    monkeypatch.setattr(cute_decode.HOST, "seqlen_k_decisions", lambda problem, device: "unchanged")
    answers = grown_against_fresh("cute/decode", DECODE, STRUCTURE_LENGTHS)
    assert not all(equal for _, equal in answers), "the planted bug went unseen"


def slow_path(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor | None) -> object:
    """triton/decode's full path on the same tensors: validation, bind, launch."""
    problem = DECODE.with_(seqlen_k=k.shape[2], has_cache_seqlens=lengths is not None)
    extra = {} if lengths is None else {"cache_seqlens": lengths}
    return get("triton/decode").prepare(q, k, v, problem, **extra)()


def growing_steps(lengths: tuple[int, ...], ragged: bool, impl: str = "triton/decode"):
    """One DynamicCache-like family: each step new q, and K and V one step longer (the first length plans)."""
    full = make_inputs(DECODE.with_seqlen_k(max(lengths)), seed=1, device="cpu", offset=0.5)
    for step, length in enumerate(lengths):
        q = make_inputs(DECODE, seed=step, device="cpu")[0]
        k, v = (t[:, :, :length].contiguous() for t in full[1:])
        cache_seqlens = torch.tensor([length, length // 3], dtype=torch.int32) if ragged else None
        yield q, k, v, cache_seqlens, attention(q, k, v, impl=impl, cache_seqlens=cache_seqlens, **OPTIONS)


@pytest.mark.parametrize("ragged", [False, True], ids=["padded", "cache-seqlens"])
def test_growing_calls_answer_as_the_slow_path(ragged: bool) -> None:
    """Eight steps across the two-split threshold: one plan prepared, seven grown; each answer the slow path's."""
    lengths = tuple(range(THRESHOLD - 4, THRESHOLD + 4))
    splits_seen = set()
    for q, k, v, cache_seqlens, out in growing_steps(lengths, ragged):
        splits_seen.add(next(reversed(api._PLANS._plans.values())).binder.decisions[2])
        assert torch.equal(out, slow_path(q, k, v, cache_seqlens)), f"Sk={k.shape[2]}"
    assert len(splits_seen) >= 2, f"the steps should cross a split-count change: {splits_seen}"
    assert plan_cache_info().misses == len(lengths)


@pytest.mark.parametrize("planted", PLANTS)
def test_planted_growing_calls_differ_from_the_slow_path(planted: str, monkeypatch: pytest.MonkeyPatch) -> None:
    PLANTS[planted](monkeypatch)
    lengths = tuple(range(THRESHOLD - 2, THRESHOLD + 2))
    answers = [torch.equal(out, slow_path(q, k, v, None)) for q, k, v, _, out in growing_steps(lengths, False)]
    assert not all(answers), "the planted bug went unseen"


class NoLaunch:
    """A Triton kernel whose ``kernel[grid](...)`` launches nothing (the binders' decisions are what is checked)."""

    def __getitem__(self, grid: object) -> object:
        return lambda *args, **kwargs: None


def last_binder() -> object:
    return next(reversed(api._PLANS._plans.values())).binder


def decode_step(length: int) -> None:
    q, k, v = (torch.empty(shape) for shape in ((2, 4, 1, 64), (2, 2, length, 64), (2, 2, length, 64)))
    attention(q, k, v, impl="triton/decode", **OPTIONS)


@pytest.mark.parametrize("planted", [False, True], ids=["as-built", "family-kept-by-clear"])
def test_a_knob_flipped_then_clear_plan_cache_is_seen_by_the_next_growing_call(
    planted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The module switches are read when a family is planned: after ``clear_plan_cache()`` the next step of a
    growing cache decides with the new value. FUSED_MERGE enters no Sk-dependent decision, so only a new plan
    reads it. Planted: a ``clear_plan_cache`` that keeps the growing families, whose binders keep the old value."""
    monkeypatch.setattr(triton_decode, "_split_kernel", NoLaunch())
    monkeypatch.setattr(triton_decode, "_merge_kernel", NoLaunch())
    length = 12_000  # splits, but not past LONG_CHAIN_SPLITS (the balanced split has no second merge launch)
    assert triton_decode.planned_num_splits(DECODE.with_seqlen_k(length), CPU) > 1, "FUSED_MERGE needs splits"
    for step in (length - 2, length - 1):
        decode_step(step)
    assert last_binder().fused
    monkeypatch.setattr(triton_decode, "FUSED_MERGE", False)
    if planted:
        monkeypatch.setattr(api._GROWING, "clear", lambda: None)
    clear_plan_cache()
    decode_step(length)
    assert (not last_binder().fused) != planted


def test_eviction_of_the_family_plans_again_and_answers_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """A growing family whose last plan was evicted (``_GROWING`` of one entry, two families taking turns)
    prepares again: each answer still the slow path's."""
    monkeypatch.setattr(api, "_GROWING", api.PlanCache(max_size=1))
    prepares = []
    prepare = get("triton/decode").prepare
    entry = get("triton/decode")
    counted = type(entry)(**{**vars(entry), "prepare": lambda *a, **kw: prepares.append(1) or prepare(*a, **kw)})
    monkeypatch.setattr(api, "get", lambda name: counted if name == "triton/decode" else get(name))
    lengths = (THRESHOLD - 1, THRESHOLD, THRESHOLD + 1)
    padded, ragged = growing_steps(lengths, False), growing_steps(lengths, True)
    for (q, k, v, _, out), (rq, rk, rv, lengths_arg, rout) in zip(padded, ragged, strict=True):
        assert torch.equal(out, slow_path(q, k, v, None)) and torch.equal(rout, slow_path(rq, rk, rv, lengths_arg))
    assert len(prepares) == 2 * len(lengths), "each family's plan was evicted by the other's: every step prepares"


def test_a_paged_cache_has_no_growing_family() -> None:
    """A paged cache (block_table) never grows from a family: its key is its own (``growing_cache_key``)."""
    paged = DECODE.with_(seqlen_k=64, page_size=16, has_cache_seqlens=True)
    q, k, v = make_inputs(paged, seed=0, device="cpu")[:3]
    table = torch.arange(8, dtype=torch.int32).reshape(2, 4)
    lengths = torch.tensor([60, 20], dtype=torch.int32)
    options = api.Options(True, None, "bottom_right", lengths, False, table)
    assert api.growing_cache_key("triton/decode", q, k, v, options) is None


@pytest.mark.gpu
@pytest.mark.parametrize("ragged", [False, True], ids=["padded", "cache-seqlens"])
@pytest.mark.parametrize("impl", ["triton/decode", "gluon/decode", "cute/decode", "auto"])
def test_growing_calls_answer_as_the_slow_path_on_the_gpu(impl: str, ragged: bool) -> None:
    """Every decode rung and ``auto`` on real kernels: a bf16 family grown across split-count changes (and the
    short-cache bound), each step bit for bit the resolved rung's ``prepare`` on the same tensors."""
    cuda = torch.device("cuda")
    problem = DECODE.with_(dtype=torch.bfloat16, heads=32, kv_heads=8, head_dim=128, batch=2)
    lengths = (*range(THRESHOLD - 2, THRESHOLD + 2), *range(splits.SHORT_CACHE_KEYS - 1, splits.SHORT_CACHE_KEYS + 2))
    full = make_inputs(problem.with_seqlen_k(max(lengths)), seed=1, device=cuda)
    for step, length in enumerate(lengths):
        q = make_inputs(problem, seed=step, device=cuda)[0]
        k, v = (t[:, :, :length].contiguous() for t in full[1:])
        cache_seqlens = torch.tensor([length, length // 3], dtype=torch.int32, device=cuda) if ragged else None
        out = attention(q, k, v, impl=impl, cache_seqlens=cache_seqlens, **OPTIONS)
        plan = next(reversed(api._PLANS._plans.values()))
        checked = plan.problem
        extra = {} if cache_seqlens is None else {"cache_seqlens": cache_seqlens}
        expected = plan.implementation.prepare(q, k, v, checked, **extra)()
        assert torch.equal(out, expected), f"{impl} ({plan.implementation.name}) Sk={length}"
