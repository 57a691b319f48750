"""The balanced split's target rule (``common/contract/splits.py``'s "The target rule"; ``BALANCED_TARGET`` of
triton/decode, gluon/decode's ``_decode_balanced.py`` and cute/decode: "per-slot" in gluon and cute, "per-slot-many" in
triton since the H200 A/B, results/h200/decode-target/).

CPU: the "per-slot" values of the docstring examples and of each rung on seed 43's rows; each rung's default rule,
and "per-sm" giving every rung's target as the per-SM formula gives it; an unknown rule is refused by name; the
rule's properties (one wave of shares where the items are few, two shares a slot where they fill a wave, the per-SM
target in between), which two planted wrong rules fail; triton/decode with "per-slot" against fp64 under the
interpreter on a few-items and a many-items ragged batch (on 2 SMs, so that the grids stay small); the GPU cases
planned on 132 SMs, each rule a plan of its own (the GPU test's premise).
GPU (``gpu`` marker): the three rungs with "per-slot" against fp64 on a poisoned output. ``bench/decode_target_ab.py``'s
rows and settings without a GPU.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from bench.decode_ragged_ab import RUNG_MODULES, plan_of
from common.contract import splits
from common.contract.problem import Problem
from common.measure.decode_sweep import random_cases
from common.toolchain.releases import triton_release
from tests.test_decode_packed import _interpreter_check
from tests.test_decode_wide import _problem, check_on_gpu, interpreter_only
from triton_impl import decode
from triton_impl.gluon import decode as gluon_decode

CPU = torch.device("cpu")
RUNGS = ("triton/decode", "gluon/decode", "cute/decode")
TARGET_MODULES = {
    "triton/decode": "triton_impl.decode",
    "gluon/decode": "triton_impl.gluon._decode_balanced",
    "cute/decode": "cute_impl.decode",
}
# Seed 43's rows (random_cases(8, 43)[index]) -> each rung's "per-slot" target on 132 SMs (module docstring of
# splits.py): case 0, 64 items on 4 / 2 / 2 slots an SM; case 2, 1024 items; case 1, 8 items at D=256 (2 / 1 / 1
# slots); case 7, 256 items on 3 / 1 / 2 slots an SM: the per-SM 264 in every rung.
SEED43_PER_SLOT = {0: (464, 200, 200), 2: (1056, 528, 528), 1: (256, 124, 124), 7: (264, 264, 264)}
# Each rung's rule as committed (the A/B's verdict: splits.py's "The target rule").
DEFAULT_RULES = {"triton/decode": "per-slot-many", "gluon/decode": "per-slot", "cute/decode": "per-slot"}


def _module(rung: str):
    if rung == "cute/decode":
        pytest.importorskip("cutlass")
    return importlib.import_module(TARGET_MODULES[rung])


def _target(rung: str, problem: Problem, lengths: tuple[int, ...], rule: str, monkeypatch: pytest.MonkeyPatch) -> int:
    """``rung``'s balanced target of ``problem`` under ``rule`` (the plan bench/decode_target_ab.py compares)."""
    monkeypatch.setattr(_module(rung), "BALANCED_TARGET", rule)
    plan = plan_of(rung, problem, lengths, CPU)
    assert plan[0] == "balanced", f"{rung} does not balance {problem.describe()}"
    return plan[1]


def test_per_slot_target_of_the_docstring_examples():
    assert splits.per_slot_target(264, 64, 264) == 200  # one wave: 200 + 64 CTAs on 264 slots
    assert splits.per_slot_target(528, 1024, 264) == 1056  # the items fill a wave: two shares a slot
    assert splits.per_slot_target(264, 256, 264) == 264  # in between: the per-SM target
    assert splits.per_slot_target(264, 88, 264) == 176  # a third of the slots: still one wave
    assert splits.per_slot_target(264, 89, 300) == 300
    assert splits.per_slot_target(264, 264, 300) == 528


def _balanced_spills(rung: str, problem: Problem) -> bool:
    """gluon/decode's balanced kernel spills at ``problem``'s head dim under this Triton release (``BALANCED_SPILLS``:
    3.9 at D=256), so the rung takes the padded split there under either target rule."""
    return rung == "gluon/decode" and gluon_decode.balanced_spills(problem.head_dim)


@pytest.mark.parametrize("rung", RUNGS)
def test_each_rung_per_slot_target_on_seed_43s_rows(rung: str, monkeypatch: pytest.MonkeyPatch):
    cases = random_cases(8, 43)
    for index, targets in SEED43_PER_SLOT.items():
        case = cases[index]
        if _balanced_spills(rung, case.problem):
            continue  # gluon's balanced kernel spills at this head dim in this release: the padded split, no target
        per_slot = _target(rung, case.problem, case.lengths, "per-slot", monkeypatch)
        assert per_slot == targets[RUNGS.index(rung)], f"{rung} seed 43 case {index}: {per_slot}"
        assert _target(rung, case.problem, case.lengths, "per-sm", monkeypatch) == 264


def _per_sm_reference(rung: str, problem: Problem) -> int:
    """The per-SM target as it was before the rule existed, written out: 2 shares an SM of 132 over the rung's M
    tiles, at most the items' 512-key shares of the padded cache."""
    module = importlib.import_module(RUNG_MODULES[rung])
    if rung == "triton/decode":
        block_n = module.tile_config(problem).block_n
    elif rung == "gluon/decode":
        block_n = module.decode_config(problem).block_n
    else:
        block_n = module.TILE_CONFIGS[problem.head_dim].tile_n
    per_sm = -(-132 * 2 // module.m_blocks_for(problem))
    sequence_blocks = -(-problem.seqlen_k // block_n)
    shares_per_sequence = -(-sequence_blocks // -(-512 // block_n))
    return max(1, min(per_sm, problem.batch * problem.kv_heads * shares_per_sequence))


@pytest.mark.parametrize("rung", RUNGS)
def test_each_rung_default_rule_and_per_sm_as_it_was(rung: str, monkeypatch: pytest.MonkeyPatch):
    """Every rung's switch is its A/B's rule, and under "per-sm" on every balanced ragged row of seven random sweeps
    its target is the per-SM formula's (the kernels take the target as an argument: the same target, the same
    launch)."""
    assert DEFAULT_RULES[rung] == _module(rung).BALANCED_TARGET
    monkeypatch.setattr(_module(rung), "BALANCED_TARGET", "per-sm")
    if rung == "triton/decode":  # the rule's target alone, without the build's one-wave cap above it
        monkeypatch.setattr(_module(rung), "BALANCED_BUILD_FIT", False)
    rows = [case for seed in (1, 29, 31, 37, 41, 43, 47) for case in random_cases(8, seed)]
    balanced = 0
    for case in rows:
        plan = plan_of(rung, case.problem, case.lengths, CPU)
        if plan[0] == "balanced":
            balanced += 1
            assert plan[1] == _per_sm_reference(rung, case.problem), case.describe()
    assert balanced >= 8  # 9 in gluon/decode under Triton 3.9, whose balanced kernel never takes D=256


def test_an_unknown_rule_is_refused_by_name(monkeypatch: pytest.MonkeyPatch):
    problem = random_cases(8, 43)[0].problem
    expected = r"BALANCED_TARGET must be one of \('per-sm', 'per-slot', 'per-slot-many'\), got 'per-wave'"
    with pytest.raises(ValueError, match=expected):
        splits.balanced_target_shares(problem, CPU, 1, 64, 2, target="per-wave")
    with pytest.raises(ValueError, match="CTAs an SM must be >= 1, got 0"):
        splits.balanced_target_shares(problem, CPU, 1, 64, 2, target="per-slot", ctas_per_sm=0)
    monkeypatch.setattr(decode, "BALANCED_TARGET", "per-wave")
    with pytest.raises(ValueError, match=expected):
        decode.balanced_target_shares(problem, CPU)


def _rule_violations(target_rule: str = "per-slot") -> list[str]:
    """Where "per-slot" breaks its rule (splits.py's "The target rule") over batches, KV heads, M tiles and CTA
    slots an SM, on a cache long enough that the least share does not bind: with at most a third of a tile's slots
    in items, target + items must fill one wave of them (target = slots - items; "per-slot-many": the per-SM
    target); with the items filling a wave, two shares a slot; in between, the per-SM target."""
    wrong = []
    for batch in (1, 2, 3, 8, 16, 33, 64, 128):
        for kv_heads in (1, 2, 8, 32):
            for m_blocks in (1, 2, 4):
                problem = Problem(batch, kv_heads * 4, 1, 1 << 20, 64, kv_heads=kv_heads, has_cache_seqlens=True)
                for ctas_per_sm in (1, 2, 4, 5):
                    rule = {"target": target_rule, "ctas_per_sm": ctas_per_sm}
                    target = splits.balanced_target_shares(problem, CPU, m_blocks, 64, 2, **rule)
                    slots, items = -(-132 * ctas_per_sm // m_blocks), batch * kv_heads
                    per_sm = -(-132 * 2 // m_blocks)
                    if 3 * items <= slots:
                        ok = target + items == slots if target_rule == "per-slot" else target == per_sm
                    else:
                        ok = target == (2 * slots if items >= slots else per_sm)
                    if not ok:
                        wrong.append(f"B={batch} Hkv={kv_heads} m={m_blocks} {ctas_per_sm}/SM: {target}")
    return wrong


def test_the_per_slot_rules_keep_their_waves():
    assert _rule_violations("per-slot") == []
    assert _rule_violations("per-slot-many") == []


def test_a_planted_one_wave_branch_in_per_slot_many_fails(monkeypatch: pytest.MonkeyPatch):
    rule = splits.per_slot_target
    monkeypatch.setattr(splits, "per_slot_target", lambda s, i, p, one_wave=True: rule(s, i, p))
    assert _rule_violations("per-slot-many")


def test_triton_per_slot_many_plans_are_the_ab_s_measured_ones(monkeypatch: pytest.MonkeyPatch):
    """On every row of bench/decode_target_ab.py, "per-slot-many" plans what "per-slot" or "per-sm" planned there
    (the rule's H200 times are those rows' measured ones: splits.py's "The target rule"): per-slot's on the rows
    whose items fill a wave (43/2, 37/6), per-sm's on the others."""
    from bench import decode_target_ab

    for label, case in decode_target_ab.cases():
        plans = {}
        for rule in ("per-sm", "per-slot", "per-slot-many"):
            monkeypatch.setattr(decode, "BALANCED_TARGET", rule)
            plans[rule] = plan_of("triton/decode", case.problem, case.lengths, CPU)
        expected = plans["per-slot"] if label in ("43/2", "37/6") else plans["per-sm"]
        assert plans["per-slot-many"] == expected, label


@pytest.mark.parametrize("planted", ["forgets-the-items", "one-wave-everywhere"])
def test_a_planted_wrong_rule_fails(planted: str, monkeypatch: pytest.MonkeyPatch):
    """Two wrong rules: the one-wave target without the items' rounding (slots shares, so the grid spills into a
    second wave, the finding's 328 CTAs), and one wave taken up to a full wave of items (tiny targets)."""
    if planted == "forgets-the-items":
        rule = splits.per_slot_target
        monkeypatch.setattr(splits, "per_slot_target", lambda s, i, p, **_: s if 3 * i <= s else rule(s, i, p))
    else:
        monkeypatch.setattr(splits, "ONE_WAVE_ITEMS_FRACTION", 1.0)
    assert _rule_violations()


# 2 SMs (splits.DEFAULT_SM_COUNT under the interpreter), so that the grids stay small; D=64: triton/decode's 4 CTA
# slots an SM, 16 packed rows in one M tile, 8 slots, 4 shares per SM. Few items (2 <= 8 / 3): 6 shares; many (8
# items fill the 8 slots): 16.
INTERPRETER_CASES = {
    "few-items": (_problem(2, 1, 8, 2, 4096, 64, dtype=torch.float32, has_cache_seqlens=True), (4000, 1517), 6),
    "many-items": (_problem(4, 2, 4, 4, 2048, 64, dtype=torch.float32, has_cache_seqlens=True), (2048, 1, 700, 1500),
                   16),
}  # fmt: skip


@interpreter_only
@pytest.mark.parametrize("case", sorted(INTERPRETER_CASES))
def test_triton_per_slot_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    problem, lengths, target = INTERPRETER_CASES[case]
    monkeypatch.setattr(splits, "DEFAULT_SM_COUNT", 2)
    monkeypatch.setattr(decode, "BALANCED_SPLIT", "always")
    monkeypatch.setattr(decode, "BALANCED_TARGET", "per-sm")
    assert decode.balanced_target_shares(problem, CPU) == 4
    monkeypatch.setattr(decode, "BALANCED_TARGET", "per-slot")
    assert decode.balanced_target_shares(problem, CPU) == target
    result = _interpreter_check(problem, lengths)
    assert result.ok, f"triton/decode per-slot {case}: {result.summary()}"


# The two kinds of row the rule changes, smaller (each rung's target under both rules differs): few items on a
# paged ragged D=64 cache (seed 43's case 0), 1024 items (its case 2; past gluon/decode's one-split short cache),
# and few items at D=256.
GPU_CASES = {
    "few-items-paged": (_problem(2, 32, 8, 4, 8192, 64, has_cache_seqlens=True, page_size=64), (1500, 8000)),
    "many-items": (_problem(64, 16, 2, 4, 9216, 64, has_cache_seqlens=True),
                   tuple(17 + (977 * b) % 9199 for b in range(64))),
    "few-items-d256": (_problem(3, 4, 5, 4, 32768, 256, has_cache_seqlens=True), (58, 30000, 9000)),
}  # fmt: skip


def _per_slot_and_per_sm_plans(rung: str, case: str, device: torch.device, monkeypatch: pytest.MonkeyPatch) -> tuple:
    """``rung``'s plans of GPU case ``case`` under "per-slot" and "per-sm", the rule left at "per-slot". triton/decode's
    ``ONE_SLOT_ONE_WAVE`` is turned off: its one-wave cap binds on these few-item rows under either rule (both plans
    then equal), and these tests are about the rule."""
    problem, lengths = GPU_CASES[case]
    if rung == "triton/decode":
        monkeypatch.setattr(decode, "ONE_SLOT_ONE_WAVE", False)
    plans = []
    for rule in ("per-slot", "per-sm"):
        monkeypatch.setattr(_module(rung), "BALANCED_TARGET", rule)
        plans.append(plan_of(rung, problem, lengths, device))
    monkeypatch.setattr(_module(rung), "BALANCED_TARGET", "per-slot")
    return tuple(plans)


@pytest.mark.parametrize("rung", RUNGS)
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_the_rules_plan_each_gpu_case_differently_at_132_sms(rung: str, case: str, monkeypatch: pytest.MonkeyPatch):
    """The GPU test's premise, checked where CI runs: on the H200's 132 SMs each case is balanced and the two rules
    give two plans (the 2026-12-03 GPU suite found triton/decode's D=256 case planned alike once ONE_SLOT_ONE_WAVE
    was on)."""
    monkeypatch.setattr(splits, "DEFAULT_SM_COUNT", 132)
    per_slot, per_sm = _per_slot_and_per_sm_plans(rung, case, CPU, monkeypatch)
    if _balanced_spills(rung, GPU_CASES[case][0]):  # no balanced kernel here under this release: no target to differ
        assert per_slot[0] == per_sm[0] == "padded", (per_slot, per_sm)
        return
    assert per_slot[0] == "balanced" and per_slot != per_sm, (per_slot, per_sm)


@pytest.mark.gpu
@pytest.mark.parametrize("rung", RUNGS)
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gpu_per_slot_against_fp64(rung: str, case: str, monkeypatch: pytest.MonkeyPatch):
    problem, lengths = GPU_CASES[case]
    if _balanced_spills(rung, problem):
        release = triton_release()
        pytest.skip(f"{rung} takes the padded split at D={problem.head_dim} under Triton {release} (BALANCED_SPILLS)")
    per_slot, per_sm = _per_slot_and_per_sm_plans(rung, case, torch.device("cuda"), monkeypatch)
    assert per_slot[0] == "balanced" and per_slot != per_sm
    result = check_on_gpu(rung, problem, lengths, seed=len(case))
    assert result.ok, f"{rung} per-slot {problem.describe()}: {result.summary()}"


def test_the_ab_times_the_rule_rows_first_and_each_setting_where_it_changes_the_plan():
    from bench import decode_target_ab

    labels = [label for label, _ in decode_target_ab.cases()]
    assert labels == ["43/0", "43/2", "43/1", "43/4", "43/3 full", "43/5 full", "37/6", "43/7", "47/3", "47/7"]
    cases = dict(decode_target_ab.cases())
    assert cases["43/3 full"].lengths == (179712,) * 3 and cases["43/0"].lengths == random_cases(8, 43)[0].lengths
    assert list(decode_target_ab.settings_to_time("gluon/decode", cases["43/0"], CPU)) == ["per-sm", "per-slot"]
    assert list(decode_target_ab.settings_to_time("triton/decode", cases["43/7"], CPU)) == ["per-sm"]
    assert list(decode_target_ab.settings_to_time("triton/decode", cases["47/3"], CPU)) == ["per-sm"]
    assert decode.BALANCED_TARGET == "per-slot-many"
