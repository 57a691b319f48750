"""cute/decode's ``plan_bind`` through ``common.attention``: the split count and compile key decided once
per plan and reused by its binds, never across plans (issue #39's host path).

On a CPU with the CuTe kernel stubbed (the compile cache's lookup kept, the launch a no-op) and the
device checks letting a CPU device through, as ``bench/host_path.py`` does: what is tested is what a bind
decides, which no kernel output would show here. A planted bug, a plan's decisions reused by the next
length of a growing cache, must fail the test.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

pytest.importorskip("cutlass")

import common.contract.api as api
from common.contract.problem import Problem
from common.contract.registry import get
from cute_impl import _host, decode

CPU = torch.device("cpu")
# One KV group of 4 rows a (batch, KV head): 8 CTAs a split, so the rule's split count rises with Sk.
DECODE = Problem(batch=1, heads=32, seqlen_q=1, seqlen_k=1023, head_dim=128, dtype=torch.float16, kv_heads=8,
                 causal=True, causal_alignment="bottom_right")  # fmt: skip


@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch) -> dict:
    """cute/decode on CPU tensors, launches stubbed; returns the counts of ``plan_bind`` calls and the
    compile keys binds looked up, in order."""
    monkeypatch.setattr(api, "_PLANS", api.PlanCache())
    monkeypatch.setattr(api, "_GROWING", api.PlanCache())
    for name in ("check_common", "validate_for_problem"):
        monkeypatch.setattr(_host, name, functools.partial(getattr(_host, name), device_types=("cpu",)))
    seen: dict = {"plan_bind": 0, "configs": []}

    def kernel(config: object):
        seen["configs"].append(config)
        return lambda *args: None

    monkeypatch.setattr(decode.HOST.kernels, "kernel", kernel)
    impl = get("cute/decode")

    def plan_bind(problem: Problem, device: torch.device) -> tuple:
        seen["plan_bind"] += 1
        return impl.plan_bind(problem, device)

    entry = dataclasses.replace(impl, runs_on_cpu=True, plan_bind=plan_bind)
    monkeypatch.setattr(api, "get", lambda name: entry if name == "cute/decode" else get(name))
    return seen


def call(seqlen_k: int) -> tuple[api.Plan, object]:
    """``attention()`` on a cache of ``seqlen_k`` keys, then its plan and one more bind of it (the runner,
    which carries the split count it launched with)."""
    shape = (DECODE.batch, DECODE.kv_heads, seqlen_k, DECODE.head_dim)
    q = torch.zeros((DECODE.batch, DECODE.heads, 1, DECODE.head_dim), dtype=DECODE.dtype)
    k, v = (torch.zeros(shape, dtype=DECODE.dtype) for _ in range(2))
    options = api.Options(True, None, "bottom_right")
    api.attention(q, k, v, causal=True, causal_alignment="bottom_right", impl="cute/decode")
    plan = api._PLANS.get(api.plan_key("cute/decode", q, k, v, options))
    return plan, api._bind(plan, q, k, v, options)


def decided(seqlen_k: int) -> tuple[int, object]:
    """The split count and compile key a bind without a plan decides for a cache of ``seqlen_k`` keys."""
    num_splits, _, _, config = decode.launch_plan(DECODE.with_(seqlen_k=seqlen_k), CPU)
    return num_splits, config


def test_a_plan_hit_reuses_its_decisions(stubbed: dict) -> None:
    for _ in range(3):
        _, run = call(4096)
    assert stubbed["plan_bind"] == 1
    assert (run.num_splits, stubbed["configs"][-1]) == decided(4096)


def stale_after_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted bug: every plan takes the first plan's decisions (a growing family's, say)."""
    real, first = api._plan, []

    def stale(*args: object) -> api.Plan:
        plan = real(*args)
        first.append(plan.planned)
        # The binder holds the decisions it was made with: a stale plan's is made from the stale ones.
        binder = plan.implementation.make_binder(plan.problem, CPU, first[0], True)
        return dataclasses.replace(plan, planned=first[0], binder=binder)

    monkeypatch.setattr(api, "_plan", stale)


@pytest.mark.parametrize("planted", [False, True], ids=["as-built", "stale-decisions"])
def test_a_growing_cache_decides_each_length(planted: bool, stubbed: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """1023 keys take one split, 1024 two (the rule's MIN_KEYS_PER_SPLIT): each length's binds decide
    what a bind without a plan decides, split count and compile key (split or not)."""
    assert decided(1023)[0] == 1 and decided(1024)[0] == 2
    if planted:
        stale_after_first(monkeypatch)
    seen = []
    for seqlen_k in (1023, 1024, 1025):
        _, run = call(seqlen_k)
        seen.append(((run.num_splits, stubbed["configs"][-1]), decided(seqlen_k)))
    wrong = [pair for pair in seen if pair[0] != pair[1]]
    assert bool(wrong) == planted, wrong
