"""The sanitizer's decode problems (``common.tools.sanitize.DECODE_PLANS``) cover every launch plan of each decode rung
on a Hopper GPU's 132 SMs, planned here on the CPU: the padded and the balanced split, the packed prefill (with and
without key splits), gluon/decode's items kernel and two consumers, paged caches and each head dim. A plan left out
would never run under memcheck. Planted: the set without one problem misses that problem's plan."""

from __future__ import annotations

import pytest
import torch

from bench.decode_ragged_ab import plan_of
from common.contract import splits
from common.contract.problem import Problem
from common.tools.sanitize import DECODE_PLANS, SMALL_PROBLEMS
from triton_impl.gluon import decode as gluon_decode

CUDA = torch.device("cuda")
# What each rung must show among the sanitizer's problems: its plan kinds ("packed-prefill+splits": cute/decode's key
# splits in the packed prefill; "items" and "two-consumers": gluon/decode's kernels of the padded split).
EXPECTED = {
    "triton/decode": {"padded", "balanced"},
    "gluon/decode": {"padded", "balanced", "packed-prefill", "items", "two-consumers"},
    "cute/decode": {"padded", "balanced", "packed-prefill", "packed-prefill+splits"},
}
MOST_KV_BYTES = 80 * 2**20  # an instrumented run of each stays short


@pytest.fixture
def hopper(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plans as on an H100 SXM or H200 (132 SMs, sm_90), without a GPU."""
    monkeypatch.setattr(splits, "sm_count", lambda device: 132)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: (9, 0))


def plan_kinds(rung: str, problem: Problem) -> set[str]:
    plan = plan_of(rung, problem, None, CUDA)
    kinds = {plan[0] + ("+splits" if len(plan) > 2 and plan[0] == "packed-prefill" else "")}
    if rung == "gluon/decode" and plan[0] == "padded":
        if gluon_decode.items_in_flight(problem, CUDA):
            kinds.add("items")
        elif gluon_decode.consumers_for(problem, CUDA) == 2:
            kinds.add("two-consumers")
    return kinds


def missing(rung: str, problems: list[Problem]) -> set[str]:
    """The plans, page sizes and head dims ``rung`` should show that ``problems`` do not give it."""
    decode_steps = [problem for problem in problems if problem.seqlen_q <= 16 and problem.seqlen_k > problem.seqlen_q]
    seen = set().union(*(plan_kinds(rung, problem) for problem in decode_steps))
    seen |= {f"pages of {problem.page_size}" for problem in decode_steps if problem.paged}
    seen |= {f"D={problem.head_dim}" for problem in decode_steps}
    return (EXPECTED[rung] | {"pages of 16", "pages of 64", "pages of 256", "D=64", "D=128", "D=256"}) - seen


@pytest.mark.parametrize("rung", sorted(EXPECTED))
def test_the_sanitizer_runs_every_decode_plan(rung: str, hopper: None) -> None:
    assert not missing(rung, list(SMALL_PROBLEMS)), f"{rung}: the sanitizer never runs {missing(rung, SMALL_PROBLEMS)}"


@pytest.mark.parametrize(("left_out", "rung", "plan"), [
    ("items, pages of 64", "gluon/decode", "items"),
    ("packed prefill with key splits", "cute/decode", "packed-prefill+splits"),
    ("balanced, D=256, pages of 256", "triton/decode", "pages of 256"),
])  # fmt: skip
def test_planted_a_problem_left_out_misses_its_plan(left_out: str, rung: str, plan: str, hopper: None) -> None:
    problems = [problem for problem in SMALL_PROBLEMS if problem != DECODE_PLANS[left_out]]
    assert plan in missing(rung, problems)


def test_each_decode_problem_is_small_enough_to_instrument() -> None:
    for name, problem in DECODE_PLANS.items():
        kv_bytes = 2 * problem.batch * problem.kv_heads * problem.seqlen_k * problem.head_dim * problem.dtype.itemsize
        assert kv_bytes <= MOST_KV_BYTES, f"{name}: {kv_bytes / 2**20:.0f} MiB of K and V"
