"""gluon/decode's ``BALANCED_TWO_CONSUMERS_SAME_TARGET`` (issue #38; on at D=64): at its head dims the
balanced split's calls of two or more M tiles take two consumers a CTA only where the two-consumer plan's target
shares are no more than the one-consumer plan's (``balanced_two_consumers``).

Why the rule: ``BALANCED_TWO_CONSUMERS`` at (64, 128) on an H100
(results/h100/gluon-decode-balanced-two-d64-2026-12-06/) ran the rows of an unchanged target 0.86-0.99x the time and
lost 1.15-1.24x on 2026/4, 221/1 and 104/3, whose target doubles (132 -> 264) because the target rules count shares
over the grid's M tiles. The rule reads the two plans' targets (``balanced_target``), so it leaves every doubled row,
214/0 and 189/3 (0.93x, 0.87x there) among them.

CPU: with the switch at (64,) (the default), the sweep rows of an unchanged target plan two consumers on the plan the
timed candidate launched, the doubled rows one, and no other sweep row moves; off, ``consumers_for`` is the pre-rule
``BALANCED_TWO_CONSUMERS`` test; D=128 keeps its unconditional two; seed 6007's row 4 (gluon's lowest row, 44 % of the
read bandwidth) is the items kernel's either way. Planted: a rule that ignores the targets takes the losing rows.

GPU (``gpu``): the D=64 candidate's fp64 cases of tests/test_gluon_decode_two_consumers.py through this switch, the
two-consumer balanced plan checked to be the one launched.
"""

from __future__ import annotations

import pytest
import torch

from bench.decode_knob_ab import parse_row
from common import clear_plan_cache
from common.contract.problem import Problem
from common.measure.decode_sweep import random_cases
from tests.test_decode_wide import check_on_gpu
from tests.test_gluon_decode_two_consumers import BALANCED_D64_GPU_CASES
from triton_impl.gluon import decode as gluon_decode

CPU = torch.device("cpu")
SWITCH = "BALANCED_TWO_CONSUMERS_SAME_TARGET"
# The committed sweep's named seeds (issue #38's fresh seeds in results/), beside seeds 1-239.
NAMED_SEEDS = (1206, 2026, 3001, 3010, 3048, 4711, 5309, 6007, 6841)
RULE_ON = (64,)

# The D=64 balanced rows of the H100 A/B of (64, 128) (all two M tiles but 214/0's four): those whose two-consumer
# target equals the one-consumer one (0.86-0.99x there), and those whose target doubles (seed/row -> (one, two)).
SAME_TARGET = ("5309/2", "56/6", "98/2", "237/7", "239/7", "62/5", "8/1", "157/2")
DOUBLED_TARGET = {
    "2026/4": (132, 264),
    "221/1": (132, 264),
    "104/3": (132, 264),
    "214/0": (66, 132),
    "189/3": (132, 264),
}
LOSING = ("2026/4", "221/1", "104/3")  # 1.15-1.24x under (64, 128)
CONTROLS = ("5309/4", "6007/4")  # one M tile (5309/4); the items kernel's one split, not the balanced one (6007/4)


def _problem(row: str) -> Problem:
    return parse_row(row)[1].problem


def _consumers(rows, monkeypatch: pytest.MonkeyPatch, switch: tuple[int, ...]) -> dict[str, int]:
    monkeypatch.setattr(gluon_decode, SWITCH, switch)
    return {row: gluon_decode.consumers_for(_problem(row), CPU) for row in rows}


def test_default_is_on_at_d64_and_off_gives_the_pre_rule_consumers(monkeypatch: pytest.MonkeyPatch):
    """The default is (64,); off, a balanced call takes two consumers exactly where its head dim is in
    ``BALANCED_TWO_CONSUMERS``: D=128's rows two, every D=64 row of the A/B one."""
    assert getattr(gluon_decode, SWITCH) == RULE_ON
    monkeypatch.setattr(gluon_decode, SWITCH, ())
    rows = (*SAME_TARGET, *DOUBLED_TARGET, *CONTROLS, "92/0", "176/6")
    for row in rows:
        problem = _problem(row)
        balanced_two = gluon_decode.two_consumers(problem) and gluon_decode.balanced_split(problem, CPU)
        if balanced_two:
            expected = 2 if problem.head_dim in gluon_decode.BALANCED_TWO_CONSUMERS else 1
            assert gluon_decode.consumers_for(problem, CPU) == expected, row
    assert _consumers(("92/0", "176/6"), monkeypatch, ()) == {"92/0": 2, "176/6": 2}
    assert set(_consumers((*SAME_TARGET, *DOUBLED_TARGET), monkeypatch, ()).values()) == {1}


@pytest.mark.parametrize("row", SAME_TARGET)
def test_rule_takes_the_rows_whose_target_holds(row: str, monkeypatch: pytest.MonkeyPatch):
    """On at D=64: each row of an unchanged target plans two consumers, the same target shares and the plan the timed
    candidate (``BALANCED_TWO_CONSUMERS`` at (64, 128)) launched: grid, shares, ring and constexprs."""
    problem = _problem(row)
    assert problem.head_dim == 64 and gluon_decode.balanced_split(problem, CPU) and gluon_decode.two_consumers(problem)
    targets = [gluon_decode.balanced_target(problem, CPU, consumers) for consumers in (1, 2)]
    assert targets[0] == targets[1], targets
    monkeypatch.setattr(gluon_decode, SWITCH, RULE_ON)
    plan = gluon_decode.GluonDecodePlan(problem, CPU)
    assert plan.balanced and plan.consumers == 2 and plan.num_splits == targets[0], (plan.consumers, plan.num_splits)
    monkeypatch.setattr(gluon_decode, SWITCH, ())
    monkeypatch.setattr(gluon_decode, "BALANCED_TWO_CONSUMERS", (64, 128))
    timed = gluon_decode.GluonDecodePlan(problem, CPU)
    assert (plan.split_grid, plan.num_splits, plan.split_options) == (
        timed.split_grid,
        timed.num_splits,
        timed.split_options,
    )


@pytest.mark.parametrize("row", sorted(DOUBLED_TARGET))
def test_rule_leaves_the_rows_whose_target_doubles(row: str, monkeypatch: pytest.MonkeyPatch):
    """On at D=64: a row whose two-consumer target doubles keeps one consumer and its one-consumer plan (the three that
    lost 1.15-1.24x, and 214/0 and 189/3, which gained 0.93x and 0.87x: the target cannot tell them apart)."""
    problem = _problem(row)
    targets = tuple(gluon_decode.balanced_target(problem, CPU, consumers) for consumers in (1, 2))
    assert targets == DOUBLED_TARGET[row]
    default = gluon_decode.GluonDecodePlan(problem, CPU)
    monkeypatch.setattr(gluon_decode, SWITCH, RULE_ON)
    plan = gluon_decode.GluonDecodePlan(problem, CPU)
    assert plan.balanced and plan.consumers == 1 and plan.num_splits == targets[0]
    assert (plan.split_grid, plan.split_options) == (default.split_grid, default.split_options)


def test_planted_rule_without_the_target_takes_the_losing_rows(monkeypatch: pytest.MonkeyPatch):
    """Planted: a rule that compares equal targets whatever the plans (the target ignored) takes every row of the A/B,
    the three losing ones among them, so the tests above would fail it."""
    expected = {**dict.fromkeys(SAME_TARGET, 2), **dict.fromkeys(DOUBLED_TARGET, 1)}
    assert _consumers(expected, monkeypatch, RULE_ON) == expected
    monkeypatch.setattr(gluon_decode, "balanced_target", lambda problem, device, consumers, num_splits=None: 1)
    planted = _consumers(expected, monkeypatch, RULE_ON)
    assert all(planted[row] == 2 for row in LOSING) and planted != expected, planted


def test_rule_leaves_d128_and_the_controls(monkeypatch: pytest.MonkeyPatch):
    """D=128 keeps ``BALANCED_TWO_CONSUMERS``' unconditional two, though 92/0's and 176/6's targets double (132 -> 264,
    66 -> 132; 0.84-0.98x on the H200 there); under the rule alone they would keep one. The controls plan as off:
    5309/4 has one M tile, and seed 6007's row 4 (B=32 H=512 Hkv=32 Sq=8 Sk=4608 D=64 ragged, 44 % of the read
    bandwidth) is not the balanced split's (one split by the rule) but ``ITEMS_IN_FLIGHT``'s kernel on one consumer."""
    d128 = {"92/0": (132, 264), "176/6": (66, 132)}
    for row, targets in d128.items():
        assert tuple(gluon_decode.balanced_target(_problem(row), CPU, consumers) for consumers in (1, 2)) == targets
    assert _consumers((*d128, *CONTROLS), monkeypatch, RULE_ON) == {"92/0": 2, "176/6": 2, "5309/4": 1, "6007/4": 1}
    monkeypatch.setattr(gluon_decode, "BALANCED_TWO_CONSUMERS", ())
    assert _consumers(d128, monkeypatch, (128,)) == {"92/0": 1, "176/6": 1}
    row = _problem("6007/4")
    for switch in ((), RULE_ON):
        monkeypatch.setattr(gluon_decode, SWITCH, switch)
        plan = gluon_decode.GluonDecodePlan(row, CPU)
        assert (plan.balanced, plan.consumers, plan.num_splits, plan.items_in_flight) == (False, 1, 1, True)


def test_rule_moves_only_the_timed_rows_of_the_sweep(monkeypatch: pytest.MonkeyPatch):
    """Over the committed sweep (seeds 1-239 and the named seeds), the rule at (64,) against off moves exactly the eight
    rows of an unchanged target, every one timed at 0.86-0.99x: the default carries no untimed row."""
    seeds = (*range(1, 240), *NAMED_SEEDS)
    problems = {f"{seed}/{index}": case.problem for seed in seeds for index, case in enumerate(random_cases(8, seed))}
    balanced = [row for row, problem in problems.items() if problem.head_dim == 64 and gluon_decode.two_consumers(
        problem) and gluon_decode.balanced_split(problem, CPU)]  # fmt: skip
    off, on = (_consumers(balanced, monkeypatch, switch) for switch in ((), RULE_ON))
    assert sorted(row for row in balanced if off[row] != on[row]) == sorted(SAME_TARGET)


# ----------------------------------------------------------------------------------------------------
# GPU: the rule's two-consumer launch against fp64
# ----------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(BALANCED_D64_GPU_CASES))
def test_gpu_rule_two_consumers_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    """The D=64 candidate's cases (5309/2, 56/6: the target held; paged 256 top-left with the LSE, an empty sequence
    and three M tiles: the target 82 -> 60) on two consumers through the rule, ``BALANCED_TWO_CONSUMERS`` as
    committed."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    problem, lengths = BALANCED_D64_GPU_CASES[case]
    monkeypatch.setattr(gluon_decode, SWITCH, RULE_ON)
    plan = gluon_decode.GluonDecodePlan(problem, torch.device("cuda"))
    assert plan.balanced and plan.consumers == 2, problem.describe()
    clear_plan_cache()  # the switch is read when a plan is made
    result = check_on_gpu("gluon/decode", problem, lengths, seed=len(case))
    clear_plan_cache()
    assert result.ok, f"gluon/decode {SWITCH}={RULE_ON} {problem.describe()}: {result.summary()}"
