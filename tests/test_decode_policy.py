"""Issue #38's fifth stop: the decode rungs' split policy (``splits.SplitPolicy``), triton/decode's
``DEEP_RING`` and gluon/decode's ``SHORT_CACHE_TILE``: what each rung commits (triton/decode two CTA slots an
SM; gluon/decode all three of its switches; cute/decode none), and each switch's rules from the switches off
(an autouse fixture turns them off in every rung for this file's tests).

The seventh stop's ``FEWER_WAVES`` (``SplitPolicy.fewer_waves``; on in gluon/decode after the H200 A/B,
results/h200/decode-fewpairs/) is checked with them.

CPU: the default policy is the rule as it was; the policy's three rules (CTA slots per SM for even work, one
split on a short cache whose items fill a wave, the fewest waves at least 85 % busy) hold on a grid of
shapes, and planted rules (the policy ignored, the short-cache bound off by one, fewer waves however idle
or on uneven work) fail that check; triton/decode with every switch on against the
fp64 reference under the interpreter, the switches shown to take effect (a 4-SM device, so that small
grids reach them); triton/decode's deep ring and gluon/decode's short-cache ring compiled for sm_90a
without spills, within the shared memory they claim.

GPU (``gpu`` marker; ``bench/decode_floor5.sh``): each switch on, on a shape where it changes the plan,
in every decode rung that has it, against fp64 on a poisoned output."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable

import pytest
import torch

from common.contract import splits
from common.contract.check import check_on_inputs
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from common.contract.registry import discover
from tests._helpers import json_from_child
from triton_impl import decode
from triton_impl.gluon import decode as gluon_decode

CPU = torch.device("cpu")
interpreter_only = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter tests run on CPU-only machines")
RUNG_MODULES = {
    "triton/decode": "triton_impl.decode",
    "gluon/decode": "triton_impl.gluon.decode",
    "cute/decode": "cute_impl.decode",
}
DECODE_IMPLS = {impl.name: impl for impl in discover(include_baselines=False)[0] if impl.name in RUNG_MODULES}
SWITCHES = (
    "SPLIT_CTAS_PER_SM", "SHORT_CACHE_ONE_SPLIT", "DEEP_RING", "SHORT_CACHE_TILE", "FEWER_WAVES", "MANY_ITEMS_FULL_FIT",
)  # fmt: skip
SWITCHES_OFF = {
    "SPLIT_CTAS_PER_SM": 1, "SHORT_CACHE_ONE_SPLIT": False, "DEEP_RING": False, "SHORT_CACHE_TILE": False,
    "FEWER_WAVES": False, "MANY_ITEMS_FULL_FIT": False,
}  # fmt: skip
# Each rung's switches as committed, read before any test turns them off.
COMMITTED = {
    name: {switch: getattr(module, switch) for switch in SWITCHES if hasattr(module, switch)}
    for name, module in ((name, importlib.import_module(path)) for name, path in RUNG_MODULES.items())
}


@pytest.fixture(autouse=True)
def switches_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rung's fifth-stop switches off: each test turns on the ones it is about."""
    for module_name in RUNG_MODULES.values():
        module = importlib.import_module(module_name)
        for switch, value in SWITCHES_OFF.items():
            if hasattr(module, switch):
                monkeypatch.setattr(module, switch, value)


def _problem(batch: int, kv_heads: int, seqlen_k: int, head_dim: int = 128, **changes) -> Problem:
    fields = dict(
        batch=batch, heads=kv_heads * changes.pop("group", 1), seqlen_q=changes.pop("seqlen_q", 1),
        seqlen_k=seqlen_k, head_dim=head_dim, dtype=changes.pop("dtype", torch.bfloat16), causal=True,
        kv_heads=kv_heads, causal_alignment="bottom_right", has_cache_seqlens=changes.pop("ragged", False),
        return_lse=True,
    )  # fmt: skip
    return Problem(**fields, **changes)


# ----------------------------------------------------------------------------------------------------
# The policy's rules
# ----------------------------------------------------------------------------------------------------
# (batch, kv_heads, seqlen_k, ragged): few items on long caches, many on short ones, ragged and not; 200
# items at the short-cache bound and one key past it (the rule gives 5 splits there).
POLICY_SHAPES = [
    (4, 2, 282624, False), (1, 8, 131072, False), (3, 2, 55040, False), (2, 4, 131584, False),
    (32, 32, 1024, True), (32, 32, 4864, True), (16, 16, 1280, False), (1, 8, 1024, False),
    (64, 1, 181504, True), (8, 8, 146944, True), (8, 25, 8192, False), (8, 25, 8193, False),
    (3, 8, 13312, False), (1, 48, 65536, False), (64, 4, 6912, True), (64, 4, 6912, False),
]  # fmt: skip


def _policy_violations(plan: Callable[[Problem, splits.SplitPolicy], int]) -> list[str]:
    """Where ``plan`` (problem, policy) -> splits breaks the policy's rules on :data:`POLICY_SHAPES` (132
    SMs, one M tile): the default policy is the rule as it was; with ``short_one_split`` a cache of at
    most SHORT_CACHE_KEYS keys whose items fill a wave takes 1, any other the rule's count, and on two slots
    an SM not a ragged batch whose items fit the 264 slots; with ``ctas_per_sm = 2`` even work fills 264 slots
    within WAVE_TOLERANCE of the best count, uneven work keeps the rule's."""
    sms, wrong = splits.DEFAULT_SM_COUNT, []
    for batch, kv_heads, seqlen_k, ragged in POLICY_SHAPES:
        problem = _problem(batch, kv_heads, seqlen_k, ragged=ragged)
        ctas, uneven = batch * kv_heads, ragged and batch > 1
        rule = splits.choose_num_splits(ctas, seqlen_k, sms, uneven, batch)
        where = f"B={batch} Hkv={kv_heads} Sk={seqlen_k} ragged={ragged}"
        if plan(problem, splits.DEFAULT_POLICY) != rule:
            wrong.append(f"{where}: default policy {plan(problem, splits.DEFAULT_POLICY)} != rule {rule}")
        short = seqlen_k <= splits.SHORT_CACHE_KEYS and ctas >= sms
        if (got := plan(problem, splits.SplitPolicy(short_one_split=True))) != (1 if short else rule):
            wrong.append(f"{where}: short_one_split gave {got}")
        got, two_slots = plan(problem, splits.SplitPolicy(2, True)), plan(problem, splits.SplitPolicy(ctas_per_sm=2))
        if got != (1 if short and not (uneven and ctas <= 2 * sms) else two_slots):
            wrong.append(f"{where}: short_one_split on two slots an SM gave {got}")
        got = two_slots
        if uneven and got != rule:
            wrong.append(f"{where}: ctas_per_sm=2 changed uneven work's {rule} to {got}")
        most = max(1, min(splits.MAX_SPLITS, seqlen_k // splits.MIN_KEYS_PER_SPLIT))
        best = max(splits.wave_efficiency(ctas * n, 2 * sms) for n in range(1, most + 1))
        if not uneven and splits.wave_efficiency(ctas * got, 2 * sms) < best * (1 - splits.WAVE_TOLERANCE):
            wrong.append(f"{where}: ctas_per_sm=2 gave {got} splits, under the best fill of 264 slots")
        wrong += _fewer_waves_violations(where, ctas, rule, uneven, plan(problem, splits.SplitPolicy(fewer_waves=True)))
    return wrong


def _fewer_waves_violations(where: str, ctas: int, rule: int, uneven: bool, got: int) -> list[str]:
    """``fewer_waves``: uneven work keeps the rule's count; even work takes the most splits of the fewest
    waves (of 132 slots) at least FEWER_WAVES_MIN_BUSY busy, never more waves than the rule's count."""
    sms = splits.DEFAULT_SM_COUNT

    def waves(n: int) -> int:
        return -(-ctas * n // sms)

    def busy(n: int) -> bool:
        return splits.wave_efficiency(ctas * n, sms) >= splits.FEWER_WAVES_MIN_BUSY

    if uneven:
        return [] if got == rule else [f"{where}: fewer_waves changed uneven work's {rule} to {got}"]
    candidates = [n for n in range(1, rule) if waves(n) < waves(rule) and busy(n)]
    least = min(map(waves, candidates), default=waves(rule))
    want = max((n for n in candidates if waves(n) == least), default=rule)
    return [] if got == want else [f"{where}: fewer_waves gave {got} splits, want {want} ({least} waves)"]


def _planned(problem: Problem, policy: splits.SplitPolicy) -> int:
    return splits.planned_num_splits(problem, 1, CPU, policy)


def test_split_policy_rules_hold():
    assert _policy_violations(_planned) == []
    # The two shapes each switch is for: B=4 Hkv=2 276k takes 32 splits (256 CTAs, two an SM); B=32 MHA 1k
    # ragged one split (1024 CTAs, no merge).
    assert _planned(_problem(4, 2, 282624), splits.SplitPolicy(ctas_per_sm=2)) == 32
    assert _planned(_problem(32, 32, 1024, ragged=True), splits.SplitPolicy(short_one_split=True)) == 1
    # ... but not seed 59's B=64 Hkv=4 6.9k ragged batch, whose 256 items fit one wave of 264 slots.
    one_wave = [_problem(64, 4, 6912, ragged=ragged) for ragged in (True, False)]
    assert [_planned(problem, splits.SplitPolicy(2, True)) for problem in one_wave] == [8, 1]
    # fewer_waves: B=3 Hkv=8 13k takes 5 splits (120 CTAs, one wave), not 11 (two); B=1 Hkv=8 128k keeps 16.
    assert [_planned(_problem(3, 8, 13312), splits.SplitPolicy(fewer_waves=fewer)) for fewer in (False, True)] == [
        11,
        5,
    ]
    assert _planned(_problem(1, 8, 131072), splits.SplitPolicy(fewer_waves=True)) == 16
    with pytest.raises(ValueError, match="ctas_per_sm"):
        splits.SplitPolicy(ctas_per_sm=0)


def _full_fit_everywhere(problem: Problem, policy: splits.SplitPolicy) -> int:
    """Planted: the full fit counted whatever the items (the 4-5 % loss of results/h200/decode-flashinfer-gap/)."""
    slots = policy.past_wave_ctas_per_sm or policy.ctas_per_sm
    return splits.planned_num_splits(problem, 1, CPU, splits.SplitPolicy(slots))


def _past_wave_violations(plan: Callable[[Problem, splits.SplitPolicy], int]) -> list[str]:
    """``past_wave_ctas_per_sm``: B=64 Hkv=8 (512 items past a wave of 264 two-slot CTAs) takes three splits
    at three an SM, one at two; B=1 Hkv=8 128k, B=16 Hkv=4 and B=64 Hkv=4 (items within a wave) keep the two-slot
    count."""
    two, past_wave = splits.SplitPolicy(ctas_per_sm=2), splits.SplitPolicy(ctas_per_sm=2, past_wave_ctas_per_sm=3)
    wrong = []
    for seqlen_k in (4096, 32768):
        if (got := (plan(_problem(64, 8, seqlen_k), two), plan(_problem(64, 8, seqlen_k), past_wave))) != (1, 3):
            wrong.append(f"B=64 Hkv=8 Sk={seqlen_k}: {got} splits at two slots / past a wave, want (1, 3)")
    for problem in (_problem(1, 8, 131072), _problem(16, 4, 11776), _problem(64, 4, 6912)):
        if plan(problem, past_wave) != plan(problem, two):
            wrong.append(f"{problem.describe()}: items within a wave, yet {plan(problem, past_wave)} splits")
    return wrong


def test_past_wave_slots_only_where_the_items_pass_a_wave():
    assert _past_wave_violations(_planned) == []
    assert _past_wave_violations(_full_fit_everywhere) != [], "the full fit counted everywhere passed"
    with pytest.raises(ValueError, match="past_wave_ctas_per_sm"):
        splits.SplitPolicy(past_wave_ctas_per_sm=-1)


def test_triton_decode_counts_its_full_fit_past_a_wave(monkeypatch: pytest.MonkeyPatch):
    assert COMMITTED["triton/decode"]["MANY_ITEMS_FULL_FIT"] is True, "on since the H200 A/B (decode-flashinfer-gap)"
    monkeypatch.setattr(decode, "MANY_ITEMS_FULL_FIT", True)
    monkeypatch.setattr(decode, "SPLIT_CTAS_PER_SM", 2)
    problem = _problem(64, 8, 32768, group=4)
    policy = decode.split_policy(problem)
    assert (policy.ctas_per_sm, policy.past_wave_ctas_per_sm) == (2, 3)
    assert splits.planned_num_splits(problem, decode.m_blocks_for(problem), CPU, policy) == 3
    # Seed 59's row 0: 32 packed rows, a tile of 184 registers that fits two an SM, not CTAS_PER_SM_FIT's three.
    wide = _problem(32, 16, 3072, group=4, seqlen_q=8)
    assert decode.block_m_for(wide) == 32 and decode.split_policy(wide).past_wave_ctas_per_sm == 0
    assert splits.planned_num_splits(wide, decode.m_blocks_for(wide), CPU, decode.split_policy(wide)) == 1


def _policy_ignored(problem: Problem, policy: splits.SplitPolicy) -> int:
    """Planted: the rung's policy never reaches the rule."""
    return splits.planned_num_splits(problem, 1, CPU)


def _short_bound_off_by_one(problem: Problem, policy: splits.SplitPolicy) -> int:
    """Planted: one split for caches one key past SHORT_CACHE_KEYS too."""
    if policy.short_one_split and problem.seqlen_k == splits.SHORT_CACHE_KEYS + 1:
        return 1
    return splits.planned_num_splits(problem, 1, CPU, policy)


def _slots_on_uneven_work(problem: Problem, policy: splits.SplitPolicy) -> int:
    """Planted: the slots counted for uneven work too."""
    ctas, sms = problem.batch * problem.kv_heads, splits.DEFAULT_SM_COUNT * policy.ctas_per_sm
    if policy.short_one_split and problem.seqlen_k <= splits.SHORT_CACHE_KEYS and ctas >= splits.DEFAULT_SM_COUNT:
        return 1
    uneven = problem.has_cache_seqlens and problem.batch > 1
    return splits.choose_num_splits(ctas, problem.seqlen_k, sms, uneven, problem.batch)


def _short_one_split_on_one_wave_ragged(problem: Problem, policy: splits.SplitPolicy) -> int:
    """Planted: a short cache's one split for a ragged batch whose items fit one wave too (the rule before seed 59)."""
    ctas = problem.batch * problem.kv_heads
    if policy.short_one_split and problem.seqlen_k <= splits.SHORT_CACHE_KEYS and ctas >= splits.DEFAULT_SM_COUNT:
        return 1
    return splits.planned_num_splits(problem, 1, CPU, policy)


def _fewer_waves_at_any_busy(problem: Problem, policy: splits.SplitPolicy) -> int:
    """Planted: ``fewer_waves`` takes one wave's most splits however idle that wave is."""
    chosen = splits.planned_num_splits(problem, 1, CPU, splits.SplitPolicy(policy.ctas_per_sm, policy.short_one_split))
    ctas = problem.batch * problem.kv_heads
    even = not (problem.has_cache_seqlens and problem.batch > 1)
    if policy.fewer_waves and even and ctas <= splits.DEFAULT_SM_COUNT:
        return min(chosen, splits.DEFAULT_SM_COUNT // ctas)
    return chosen


def _fewer_waves_on_uneven_work(problem: Problem, policy: splits.SplitPolicy) -> int:
    """Planted: ``fewer_waves`` applied to uneven work too."""
    chosen = splits.planned_num_splits(problem, 1, CPU, policy)
    if policy.fewer_waves and problem.has_cache_seqlens and problem.batch > 1:
        return splits.fewer_waves_splits(problem.batch * problem.kv_heads, chosen, splits.DEFAULT_SM_COUNT)
    return chosen


@pytest.mark.parametrize(
    "planted",
    [
        _policy_ignored,
        _short_bound_off_by_one,
        _slots_on_uneven_work,
        _short_one_split_on_one_wave_ragged,
        _fewer_waves_at_any_busy,
        _fewer_waves_on_uneven_work,
    ],
)
def test_planted_policy_bug_fails_the_rules(planted: Callable[[Problem, splits.SplitPolicy], int]):
    assert _policy_violations(planted), f"{planted.__name__} passed the policy's rules"


# ----------------------------------------------------------------------------------------------------
# The balanced split's switch (splits.balanced_split_applies)
# ----------------------------------------------------------------------------------------------------
def _balanced_violations(applies: Callable[..., bool]) -> list[str]:
    """The switch's rules, on a ragged batch, a padded one, one sequence, and a rule that does not split."""
    ragged, padded = _problem(4, 8, 65536, ragged=True), _problem(4, 8, 65536)
    single, long = _problem(1, 8, 65536, ragged=True), splits.LONG_CHAIN_SPLITS
    cases = {  # (switch, problem, the rule's split count): applies
        ("never", ragged, 8): False, ("always", padded, 1): True, ("ragged", ragged, 1): True,
        ("ragged", padded, 8): False, ("ragged-split", ragged, 8): True, ("ragged-split", ragged, 1): False,
        ("ragged-split", single, 8): False, ("ragged-split", padded, 8): False,
        ("ragged-split", single, long + 1): False, ("ragged-split-long", ragged, 8): True,
        ("ragged-split-long", ragged, 1): False, ("ragged-split-long", single, long): False,
        ("ragged-split-long", single, long + 1): True, ("ragged-split-long", padded, long + 1): True,
        ("ragged-split-long", padded, 8): False,
    }  # fmt: skip
    return [str(case) for case, want in cases.items() if applies(case[0], case[1], lambda n=case[2]: n) != want]


def _ragged_split_ignores_the_rule(switch: str, problem: Problem, rule: Callable[[], int]) -> bool:
    return splits.balanced_split_applies("ragged" if switch == "ragged-split" else switch, problem, rule)


def _ragged_split_at_one_sequence(switch: str, problem: Problem, rule: Callable[[], int]) -> bool:
    one = switch == "ragged-split" and problem.batch == 1 and problem.has_cache_seqlens and rule() > 1
    return one or splits.balanced_split_applies(switch, problem, rule)


def _long_chain_from_the_bound(switch: str, problem: Problem, rule: Callable[[], int]) -> bool:
    """Planted: the long chain counted from LONG_CHAIN_SPLITS itself, not above it."""
    at_bound = switch == "ragged-split-long" and rule() == splits.LONG_CHAIN_SPLITS
    return at_bound or splits.balanced_split_applies(switch, problem, rule)


def _long_chain_only_with_lengths(switch: str, problem: Problem, rule: Callable[[], int]) -> bool:
    """Planted: the long chain taken only for calls with cache_seqlens (full caches keep the padded split)."""
    long_full = switch == "ragged-split-long" and not problem.has_cache_seqlens
    return not long_full and splits.balanced_split_applies(switch, problem, rule)


def test_balanced_switch_values_and_their_rules():
    assert not _balanced_violations(splits.balanced_split_applies)
    with pytest.raises(ValueError, match="must be one of"):
        splits.balanced_split_applies("sometimes", _problem(4, 8, 65536, ragged=True))
    with pytest.raises(ValueError, match="needs the rung's split rule"):
        splits.balanced_split_applies("ragged-split", _problem(4, 8, 65536, ragged=True))


@pytest.mark.parametrize(
    "planted",
    [
        _ragged_split_ignores_the_rule,
        _ragged_split_at_one_sequence,
        _long_chain_from_the_bound,
        _long_chain_only_with_lengths,
    ],
)
def test_planted_balanced_switch_bug_fails_its_rules(planted: Callable[..., bool]):
    assert _balanced_violations(planted), f"{planted.__name__} passed the switch's rules"


def test_committed_switches_and_with_them_off_each_rung_asks_the_default_policy():
    """The values the H200 A/Bs chose (results/h200/decode-floor5/, decode-fewpairs/, decode-flashinfer-gap/); with
    every switch off (the fixture) each rung asks the split rule as it was before the fifth stop."""
    assert {name: COMMITTED[name] for name in RUNG_MODULES} == {
        "triton/decode": {"SPLIT_CTAS_PER_SM": 2, "SHORT_CACHE_ONE_SPLIT": False, "DEEP_RING": False,
                          "SHORT_CACHE_TILE": False, "FEWER_WAVES": False, "MANY_ITEMS_FULL_FIT": True},
        "gluon/decode": {"SPLIT_CTAS_PER_SM": 2, "SHORT_CACHE_ONE_SPLIT": True, "SHORT_CACHE_TILE": True,
                         "FEWER_WAVES": True},
        "cute/decode": {"SPLIT_CTAS_PER_SM": 1, "SHORT_CACHE_ONE_SPLIT": True, "FEWER_WAVES": False},
    }  # fmt: skip
    problem = _problem(4, 2, 282624, head_dim=64)
    for name, module_name in RUNG_MODULES.items():
        assert importlib.import_module(module_name).split_policy(problem) == splits.DEFAULT_POLICY, name
    assert gluon_decode.decode_config(_problem(32, 32, 1024)) == gluon_decode.DEFAULT_CONFIGS[128]


def test_gluon_short_tile_and_slots_follow_what_fits(monkeypatch: pytest.MonkeyPatch):
    """Two CTAs an SM where the ring leaves room (D=64's, the short-cache ring at D=128), one otherwise."""
    monkeypatch.setattr(gluon_decode, "SPLIT_CTAS_PER_SM", 2)
    assert gluon_decode.split_policy(_problem(4, 2, 282624, head_dim=64)).ctas_per_sm == 2
    assert gluon_decode.split_policy(_problem(32, 32, 1024)).ctas_per_sm == 1
    monkeypatch.setattr(gluon_decode, "SHORT_CACHE_TILE", True)
    assert gluon_decode.decode_config(_problem(32, 32, 1024)) == gluon_decode.SHORT_CACHE_CONFIGS[128]
    assert gluon_decode.split_policy(_problem(32, 32, 1024)).ctas_per_sm == 2
    assert gluon_decode.decode_config(_problem(32, 32, splits.SHORT_CACHE_KEYS + 1)).num_stages == 3
    assert gluon_decode.decode_config(_problem(32, 32, 1024, head_dim=64)) == gluon_decode.DEFAULT_CONFIGS[64]


# ----------------------------------------------------------------------------------------------------
# triton/decode with the switches on, against fp64 under the interpreter
# ----------------------------------------------------------------------------------------------------
# (switch values, (batch, kv_heads, seqlen_k, head_dim), lengths, expected (num_splits, block_n,
# num_stages)) on a 4-SM device: few items on a long-ish cache (slots: 2 items fill 8 slots with 4 splits;
# deep ring: 2 splits of 2 items on 4 SMs); a short ragged cache of 6 items (one split; the short tile at
# D=128 with it), an empty sequence among them.
INTERPRETER_CASES = {
    "slots-2": ({"SPLIT_CTAS_PER_SM": 2}, (1, 2, 2048, 64), None, (4, 64, 3)),
    "deep-ring": ({"DEEP_RING": True}, (1, 2, 2048, 64), None, (2, 64, 6)),
    "one-split": ({"SHORT_CACHE_ONE_SPLIT": True}, (3, 2, 1100, 64), (1100, 0, 131), (1, 64, 3)),
    "one-split+short-tile": (
        {"SHORT_CACHE_ONE_SPLIT": True, "SHORT_CACHE_TILE": True},
        (3, 2, 1100, 128),
        (1100, 0, 131),
        (1, 32, 3),
    ),
    # The committed balanced split of a ragged call on the short tile: 2 shares per SM, its own depth.
    "balanced+short-tile": (
        {"BALANCED_SPLIT": "ragged", "SHORT_CACHE_TILE": True},
        (3, 2, 1100, 128),
        (1100, 0, 131),
        (8, 32, None),
    ),
}


@interpreter_only
@pytest.mark.parametrize("name", sorted(INTERPRETER_CASES))
def test_triton_switch_against_fp64(name: str, monkeypatch: pytest.MonkeyPatch):
    switches, (batch, kv_heads, seqlen_k, head_dim), lengths, expected = INTERPRETER_CASES[name]
    monkeypatch.setattr(splits, "DEFAULT_SM_COUNT", 4)
    # The switches are the padded-Sk split's (the balanced split, a ragged call's default, only where named).
    for switch, value in {"BALANCED_SPLIT": "never", **switches}.items():
        monkeypatch.setattr(decode, switch, value)
    problem = _problem(batch, kv_heads, seqlen_k, head_dim=head_dim, group=2, seqlen_q=2, dtype=torch.float32,
                       ragged=lengths is not None)  # fmt: skip
    q, k, v = make_inputs(problem, seed=len(name), device="cpu", offset=0.5)
    cache_seqlens = None if lengths is None else torch.tensor(lengths, dtype=torch.int32)
    run = decode.prepare(q, k, v, problem, cache_seqlens=cache_seqlens)
    assert (run.num_splits, decode.tile_config(problem).block_n, getattr(run, "num_stages", None)) == expected
    assert run.balanced == ("BALANCED_SPLIT" in switches)
    result = check_on_inputs(decode.IMPLEMENTATION, q, k, v, problem, cache_seqlens=cache_seqlens)
    assert result.ok, f"{name} {problem.describe()}: {result.summary()}"


# ----------------------------------------------------------------------------------------------------
# sm_90a: the deep ring and gluon's short-cache ring without spills, in the shared memory they claim
# ----------------------------------------------------------------------------------------------------
_COMPILE_SCRIPT = r"""
import json, sys
import torch
from common.contract.problem import Problem
from common.reporting.static import cubin_resources
from triton_impl import decode
from triton_impl.gluon import decode as gluon_decode
results = []
for rung, switch, head_dim, seqlen_k, page_size in json.loads(sys.argv[1]):
    problem = Problem(8, 32, 2, seqlen_k, head_dim, dtype=torch.bfloat16, causal=True, kv_heads=8,
                      causal_alignment="bottom_right", has_cache_seqlens=True, return_lse=True, page_size=page_size)
    module = decode if rung == "triton" else gluon_decode
    setattr(module, switch, True)
    binary = module.compile_sm90(problem)[0]
    setattr(module, switch, False)
    (resources,) = cubin_resources(binary.cubin).values()
    results.append({"spill_bytes": resources["local_bytes"] + resources["stack_bytes"],
                    "registers": resources["registers"], "shared_bytes": binary.shared_bytes})
print(json.dumps(results))
"""
# (rung, switch, D, Sk, page size): triton's deep ring at each head dim, contiguous and paged; the short
# tiles, which must leave room for more CTAs an SM (the deep ring is for one): gluon two, triton five.
COMPILES = [
    ("triton", "DEEP_RING", 64, 32768, 0), ("triton", "DEEP_RING", 64, 32768, 64),
    ("triton", "DEEP_RING", 128, 32768, 0), ("triton", "DEEP_RING", 128, 32768, 16),
    ("triton", "DEEP_RING", 256, 32768, 0), ("triton", "SHORT_CACHE_TILE", 128, 1024, 0),
    ("gluon", "SHORT_CACHE_TILE", 128, 1024, 0), ("gluon", "SHORT_CACHE_TILE", 128, 1024, 16),
]  # fmt: skip
CTAS_PER_SM = {"DEEP_RING": 1, "SHORT_CACHE_TILE": 2, ("triton", "SHORT_CACHE_TILE"): 5}


@pytest.mark.static
def test_deep_ring_and_short_tile_compile_for_sm90_without_spills():
    compiled = json_from_child(["-c", _COMPILE_SCRIPT, json.dumps(COMPILES)], timeout=1200)
    for (rung, switch, head_dim, _, page_size), result in zip(COMPILES, compiled, strict=True):
        where = f"{rung} {switch} D={head_dim} page={page_size}: {result}"
        assert result["spill_bytes"] == 0, where
        ctas = CTAS_PER_SM.get((rung, switch), CTAS_PER_SM[switch])
        limit = gluon_decode.SM_SHARED_BYTES // ctas - gluon_decode.CTA_RESERVED_SHARED_BYTES
        assert 0 < result["shared_bytes"] <= limit, where


# ----------------------------------------------------------------------------------------------------
# GPU: each switch on, where it changes the plan, in every decode rung that has it
# ----------------------------------------------------------------------------------------------------
# (switch values, problem, lengths on the GPU (None: the padded cache)): few items on a long cache (D=64,
# 276k as on the H200's low row, at B=2 to keep the fp64 reference small); many short ragged MHA heads;
# seed 31's B=3 Hkv=8 Sq=8 13k (11 splits on 132 SMs, two waves; 5 with FEWER_WAVES).
SHORT_LENGTHS = (1020, 18, 0, 505, 1, 64, 777, 130)
GPU_SETTINGS = {
    "slots-2": ({"SPLIT_CTAS_PER_SM": 2}, _problem(2, 2, 65536, head_dim=64, seqlen_q=2), None),
    "deep-ring": ({"DEEP_RING": True}, _problem(2, 2, 65536, head_dim=64, seqlen_q=2), None),
    "fewer-waves": ({"FEWER_WAVES": True}, _problem(3, 8, 13312, seqlen_q=8), None),
    "one-split": ({"SHORT_CACHE_ONE_SPLIT": True}, _problem(8, 32, 1024, seqlen_q=8, ragged=True), SHORT_LENGTHS),
    "short-tile": ({"SHORT_CACHE_TILE": True}, _problem(8, 32, 1024, seqlen_q=8, ragged=True), SHORT_LENGTHS),
    "one-split+short-tile": (
        {"SHORT_CACHE_ONE_SPLIT": True, "SHORT_CACHE_TILE": True},
        _problem(8, 32, 1024, seqlen_q=8, ragged=True),
        SHORT_LENGTHS,
    ),
    "balanced+short-tile": (
        {"BALANCED_SPLIT": "ragged", "SHORT_CACHE_TILE": True},
        _problem(8, 32, 1024, seqlen_q=8, ragged=True),
        SHORT_LENGTHS,
    ),
}


@pytest.mark.gpu
@pytest.mark.parametrize("setting", sorted(GPU_SETTINGS))
@pytest.mark.parametrize("impl_name", sorted(DECODE_IMPLS))
def test_gpu_switch_against_fp64(impl_name: str, setting: str, monkeypatch: pytest.MonkeyPatch):
    switches, problem, lengths = GPU_SETTINGS[setting]
    module = importlib.import_module(RUNG_MODULES[impl_name])
    present = {switch: value for switch, value in switches.items() if hasattr(module, switch)}
    if present.keys() != switches.keys():
        pytest.skip(f"{impl_name} lacks {', '.join(switches.keys() - present.keys())}")
    device = torch.device("cuda")
    committed = module.planned_num_splits(problem, device)
    if hasattr(module, "BALANCED_SPLIT"):  # the padded-Sk split's switches, the balanced split where named
        present = {"BALANCED_SPLIT": "never", **present}
    for switch, value in present.items():
        monkeypatch.setattr(module, switch, value)
    if "SHORT_CACHE_ONE_SPLIT" in present:
        assert module.planned_num_splits(problem, device) == 1 != committed
    if "SPLIT_CTAS_PER_SM" in present:
        assert module.planned_num_splits(problem, device) > committed
    if "FEWER_WAVES" in present:
        assert module.planned_num_splits(problem, device) < committed
    q, k, v = make_inputs(problem, seed=len(setting), device="cuda", offset=0.5 if len(setting) % 2 else 0.0)
    cache_seqlens = None if lengths is None else torch.tensor(lengths, dtype=torch.int32, device="cuda")
    if "DEEP_RING" in present:
        run = module.bind(q, k, v, problem, cache_seqlens=cache_seqlens)
        assert run.num_stages == module.DEEP_RING_STAGES[problem.head_dim]
    if "SHORT_CACHE_TILE" in present:
        config = module.tile_config(problem) if impl_name == "triton/decode" else module.decode_config(problem)
        assert config == module.SHORT_CACHE_CONFIGS[problem.head_dim]
    result = check_on_inputs(DECODE_IMPLS[impl_name], q, k, v, problem, cache_seqlens=cache_seqlens)
    assert result.ok, f"{impl_name} {setting} {problem.describe()}: {result.summary()}"
