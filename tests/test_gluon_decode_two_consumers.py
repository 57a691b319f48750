"""gluon/decode's ``TWO_CONSUMERS`` (issue #38's compute-bound class, seeds 229 and 233: 256 packed rows a KV head):
items of two or more M tiles take them two a CTA, on two consumer partitions and a load warp that share one ring (on
since the H200 A/Bs: D=128 on 6 stages of 64 keys at two M tiles and 3 of 128 past them, D=64 on 8 of 64 and 4 of
128; the balanced split's calls too at D=128, ``BALANCED_TWO_CONSUMERS``).

CPU: what the default takes (D=128 and D=64 items of two or more M tiles; not D=256, not one tile, not the rows
``ITEMS_IN_FLIGHT``'s kernel takes, not a two-consumer split the balanced switch would take; the balanced split at
D=128 only) and with which ring; the plans of seed 233's row 5 (the grid's M extent halved, the arrival counters of
every M tile, the ring and registers), seed 139's row 1 (the split rule fed the CTA's M tiles) and seed 92's row 0
(the balanced kernel on two consumers); the release whose page-chunk builds spill keeping one consumer there.

Static (sm_90a, child process, the running Triton release): the two-consumer builds (D=128, the balanced one, and
D=256 as a candidate) without spills or local memory (two builds: two 4-byte arguments), in the shared memory one
CTA an SM has, with the setmaxnreg budgets; the switch leaving every build it does not take instruction for
instruction.

GPU (``gpu``; the A/B scripts run them first): against fp64 on a poisoned output with the two-consumer plan checked to
be the one launched, for the default rings and the candidates timed beside them: full and ragged caches (an empty
sequence too), paged (pages of 16, 64 and 256), an odd count of M tiles, both causal alignments and none, GQA groups 5
to 128, D 64 / 128 / 256, fp16, the LSE, splits, the balanced split and its two-level merge; a planted grid one M
extent short (its last M tiles never computed) fails the check.

``BALANCED_TWO_CONSUMERS``' D=64 candidate, (64, 128), timed by ``bench/gluon_decode_balanced_two_d64_ab.sh`` and not
taken (``BALANCED_TWO_CONSUMERS_SAME_TARGET`` took its winning rows: tests/test_gluon_decode_two_consumers_target.py):
its plan at seed 5309's row 2, its sm_90a build (no spills, one CTA an SM), the script's rows (each moved, the control
not), and three GPU cases against fp64.
"""

from __future__ import annotations

import json

import pytest
import torch

from bench.decode_knob_ab import parse_row
from common import clear_plan_cache
from common.contract.problem import Problem
from common.measure.decode_sweep import random_cases
from tests._helpers import json_from_child, knob_ab_words
from tests.test_decode_wide import check_on_gpu
from triton_impl.gluon import decode as gluon_decode

CPU = torch.device("cpu")
SM_SHARED_BYTES, CTA_RESERVED_BYTES = 233472, 1024


@pytest.fixture(autouse=True)
def split_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The two consumers are the split kernels': the packed prefill (``PACKED_PREFILL_MIN_ROWS``), which takes many
    of these rows by default (tests/test_gluon_decode_packed_prefill.py), is off here."""
    monkeypatch.setattr(gluon_decode, "PACKED_PREFILL_MIN_ROWS", None)


def _problem(batch: int, kv_heads: int, seqlen_k: int, head_dim: int = 128, **changes) -> Problem:
    """A decode step of group 16 and Sq 16 (256 packed rows; bottom-right causal, full cache unless told otherwise)."""
    return Problem(
        batch, kv_heads * changes.pop("group", 16), changes.pop("seqlen_q", 16), seqlen_k, head_dim,
        dtype=changes.pop("dtype", torch.bfloat16), causal=changes.pop("causal", True), kv_heads=kv_heads,
        causal_alignment=changes.pop("causal_alignment", "bottom_right"),
        has_cache_seqlens=changes.pop("has_cache_seqlens", False), return_lse=changes.pop("return_lse", False),
        **changes,
    )  # fmt: skip


# The rings timed (head dim -> (ring at two M tiles, ring past two), each (key block, stages)): the default's, then
# the candidates it was chosen from (gluon/hopper's two stages; D=256 is not taken by the default).
CANDIDATES = {
    "default": {128: ((64, 6), (128, 3)), 64: ((64, 8), (128, 4))},
    "hopper-rings": {128: ((128, 2), (128, 2)), 256: ((64, 2), (64, 2))},
    "d256-deep": {256: ((32, 5), (32, 5))},
    "d256-small-blocks": {256: ((32, 4), (32, 4))},
}
RINGS = CANDIDATES["default"]


def _row(seed: int, index: int):
    return random_cases(8, seed)[index]


# (name, problem, taken): what the default takes.
SHAPES = [
    ("233/5: D=128, 256 rows", _row(233, 5).problem, True),
    ("229/2: D=256, 256 rows", _row(229, 2).problem, False),
    ("139/1: D=128, 256 rows, two splits", _row(139, 1).problem, True),
    ("80 rows: two M tiles", _problem(8, 8, 8192, group=5), True),
    ("64 rows: one M tile", _problem(8, 8, 8192, group=4), False),
    ("D=64, 256 rows", _row(234, 1).problem, True),
    ("D=64, 256 rows: the items kernel's", _row(231, 6).problem, False),
]


def test_default_takes_d128_items_of_two_or_more_tiles(monkeypatch: pytest.MonkeyPatch):
    """As timed: D=128 items of two M tiles on 6 stages of 64 keys, of more on 3 of 128; D=64 on 8 of 64 and 4 of 128,
    where ``ITEMS_IN_FLIGHT``'s kernel does not take the row; D=256 keeps one consumer; off ({}), nothing."""
    assert gluon_decode.TWO_CONSUMERS == RINGS
    assert {name: gluon_decode.consumers_for(problem, CPU) == 2 for name, problem, _ in SHAPES} == {
        name: taken for name, _, taken in SHAPES
    }
    assert gluon_decode.items_in_flight(_row(231, 6).problem, CPU)
    rings = {name: gluon_decode.two_consumer_config(problem) for name, problem, taken in SHAPES if taken}
    assert {name: (config.block_n, config.num_stages) for name, config in rings.items()} == {
        "233/5: D=128, 256 rows": (128, 3),
        "139/1: D=128, 256 rows, two splits": (128, 3),
        "80 rows: two M tiles": (64, 6),
        "D=64, 256 rows": (128, 4),
    }
    monkeypatch.setattr(gluon_decode, "TWO_CONSUMERS", {})
    assert not any(gluon_decode.consumers_for(problem, CPU) == 2 for _, problem, _ in SHAPES)
    monkeypatch.setattr(gluon_decode, "TWO_CONSUMERS", RINGS)
    monkeypatch.setattr(gluon_decode, "WIDE_M_TILE", True)  # its 128-row tile is one M tile of two warpgroups
    assert not gluon_decode.two_consumers(_row(233, 5).problem)


def test_chunked_pages_keep_one_consumer_under_the_releases_that_spill(monkeypatch: pytest.MonkeyPatch):
    """Under Triton 3.9 the two-consumer build spills where a key block is copied in page chunks: pages smaller than
    the ring's key block keep one consumer there, pages of a whole block do not; other releases take both (planted:
    3.9 out of ``TWO_CONSUMER_CHUNK_SPILLS``)."""
    paged = {size: _problem(16, 8, 2048, page_size=size, has_cache_seqlens=True) for size in (16, 64, 128)}
    assert all(gluon_decode.two_consumers(problem) for problem in paged.values())
    monkeypatch.setattr(gluon_decode, "triton_release", lambda: "3.9")
    assert {size: gluon_decode.two_consumers(problem) for size, problem in paged.items()} == {
        16: False,
        64: False,
        128: True,
    }
    monkeypatch.setattr(gluon_decode, "TWO_CONSUMER_CHUNK_SPILLS", ())
    assert all(gluon_decode.two_consumers(problem) for problem in paged.values())


def test_plan_of_seed_233_row_5(monkeypatch: pytest.MonkeyPatch):
    """Two M tiles a CTA: the grid's M extent 2 of 4, the ring and registers of the two-consumer build, one arrival
    counter per 64-row M tile."""
    problem = _row(233, 5).problem
    monkeypatch.setattr(gluon_decode, "TWO_CONSUMERS", RINGS)
    plan = gluon_decode.GluonDecodePlan(problem, CPU)
    assert not plan.balanced and plan.consumers == 2
    assert plan.split_grid == (plan.num_splits, 2, 128), plan.split_grid
    options = plan.split_options
    assert (options["CONSUMERS"], options["LOAD_WARP"], options["PAGES_AHEAD"]) == (2, True, False), options
    assert (options["CONSUMER_REGS"], options["maxnreg"], options["num_warps"]) == (232, 168, 4), options
    assert (options["BLOCK_M"], options["BLOCK_N"], options["NUM_STAGES"]) == (64, 128, 3), options
    assert plan.work_items == 4 * 128


def test_split_rule_counts_the_ctas_m_tiles(monkeypatch: pytest.MonkeyPatch):
    """Seed 139's row 1 (16 items of four M tiles): the rule is fed two CTA M tiles an item on one CTA an SM, not the
    four 64-row tiles (planted: those plan fewer splits for this row)."""
    problem = _row(139, 1).problem
    monkeypatch.setattr(gluon_decode, "TWO_CONSUMERS", RINGS)
    plan = gluon_decode.GluonDecodePlan(problem, CPU)
    policy = gluon_decode.split_policy(problem, gluon_decode.two_consumer_config(problem))
    assert policy.ctas_per_sm == 1 and plan.consumers == 2
    expected = gluon_decode.splits.planned_num_splits(problem, 2, CPU, policy)
    assert plan.num_splits == expected
    planted = gluon_decode.splits.planned_num_splits(problem, 4, CPU, policy)
    assert planted != expected, (planted, expected)


def test_odd_m_tiles_and_splits_count_every_tile(monkeypatch: pytest.MonkeyPatch):
    """Three M tiles (160 rows) take a grid of two CTAs an item, the second's second tile all padding, and the
    arrival counters cover four tiles an item (the kernel indexes them by the grid's M extent times two)."""
    problem = _problem(1, 2, 65536, group=10)  # three M tiles: the ring past two
    monkeypatch.setattr(gluon_decode, "TWO_CONSUMERS", RINGS)
    assert gluon_decode.m_blocks_for(problem) == 3
    plan = gluon_decode.GluonDecodePlan(problem, CPU)
    assert plan.consumers == 2 and plan.split_grid[1:] == (2, 2) and plan.num_splits > 1, plan.split_grid
    assert plan.work_items == 4 * 2


def test_a_split_the_balanced_switch_would_take_keeps_one_consumer(monkeypatch: pytest.MonkeyPatch):
    """Seeds 222 row 2 and 228 row 0 (B=1-2, one or two KV heads, 128 rows): two consumers a CTA would have the rule
    split each item 63 times, a merge chain ``BALANCED_SPLIT`` ("ragged-split-long") never leaves padded; they keep one
    consumer and its 32 splits (planted: a ``consumers_for`` that does not ask the switch takes them)."""
    rows = (_row(222, 2).problem, _row(228, 0).problem)
    for problem in rows:
        assert gluon_decode.two_consumers(problem) and gluon_decode.consumers_for(problem, CPU) == 1
        plan = gluon_decode.GluonDecodePlan(problem, CPU)
        assert plan.consumers == 1 and plan.split_grid == (32, 2, plan.items), plan.split_grid
    monkeypatch.setattr(gluon_decode.splits, "balanced_split_applies", lambda switch, problem, rule=None: False)
    assert all(gluon_decode.consumers_for(problem, CPU) == 2 for problem in rows)
    assert all(gluon_decode.planned_num_splits(problem, CPU) == 63 for problem in rows)


def test_balanced_two_consumers_plan(monkeypatch: pytest.MonkeyPatch):
    """``BALANCED_TWO_CONSUMERS`` (D=128, as timed): seed 92's row 0 (ragged, pages of 16, 256 rows) takes the balanced
    kernel on two consumers: the grid's M extent halved (1 of 2: the M tile on x), the target shares fed the CTA's M
    tile on the one-CTA ring (6 stages of 64 keys here: two M tiles), the ring kept at its depth, one arrival counter
    per 64-row M tile and slab (the two-level merge's); () keeps one consumer."""
    problem = _row(92, 0).problem
    assert gluon_decode.BALANCED_TWO_CONSUMERS == (128,)
    plan = gluon_decode.GluonDecodePlan(problem, CPU)
    assert plan.balanced and plan.consumers == 2 and plan.split_options["CONSUMERS"] == 2
    assert plan.split_grid == (1, plan.num_splits + plan.items), plan.split_grid
    assert (plan.split_options["BLOCK_N"], plan.split_options["NUM_STAGES"], plan.split_options["BALANCED"]) == (
        64,
        6,
        True,
    )
    slots = (1, gluon_decode.BALANCED_SHARES_BY_SLOTS)
    expected = gluon_decode.balanced_sizes(problem, CPU, None, 1, 64, *slots)[1]
    assert plan.num_splits == expected, (plan.num_splits, expected)
    assert plan.work_items == 2 * (plan.num_splits + plan.items) * 2
    monkeypatch.setattr(gluon_decode, "BALANCED_TWO_CONSUMERS", ())
    assert gluon_decode.GluonDecodePlan(problem, CPU).consumers == 1


def test_balanced_split_at_d64_takes_two_consumers_only_under_the_target_rule(monkeypatch: pytest.MonkeyPatch):
    """D=64's balanced calls take two consumers through ``BALANCED_TWO_CONSUMERS_SAME_TARGET`` alone (here the target
    holds), one without it; D=128's take two either way."""
    d64 = _problem(3, 4, 8192, head_dim=64, has_cache_seqlens=True)  # ragged, 256 rows: the balanced split
    d128 = _row(176, 6).problem
    assert gluon_decode.two_consumers(d64) and gluon_decode.two_consumers(d128)
    for rule, d64_consumers in (((64,), 2), ((), 1)):
        monkeypatch.setattr(gluon_decode, "BALANCED_TWO_CONSUMERS_SAME_TARGET", rule)
        plans = [gluon_decode.GluonDecodePlan(problem, CPU) for problem in (d64, d128)]
        assert [(plan.balanced, plan.consumers, plan.split_options["CONSUMERS"]) for plan in plans] == [
            (True, d64_consumers, d64_consumers),
            (True, 2, 2),
        ]


# BALANCED_TWO_CONSUMERS' D=64 candidate (bench/gluon_decode_balanced_two_d64_ab.sh; not taken: the target rule took
# its winning rows).
BALANCED_D64 = (64, 128)


def test_balanced_two_consumers_d64_candidate_plan(monkeypatch: pytest.MonkeyPatch):
    """With ``BALANCED_TWO_CONSUMERS`` at (64, 128) (not taken; issue #38's seed 5309 row 2: 128 packed rows at D=64
    over two long sequences, gluon/decode 54 % of the read bandwidth on an H100), that row's balanced launch takes two
    consumers: the grid's M extent 2 -> 1 with the same 100 target shares, the ring TWO_CONSUMERS' two-M-tile one at
    D=64 (8 stages of 64 keys, against the one-consumer balanced ring's 6). The target rule, which takes this row too,
    is held off: this is the candidate's plan against the one-consumer plan it was timed against."""
    monkeypatch.setattr(gluon_decode, "BALANCED_TWO_CONSUMERS_SAME_TARGET", ())
    problem = _row(5309, 2).problem
    default = gluon_decode.GluonDecodePlan(problem, CPU)
    assert default.balanced and default.consumers == 1 and default.split_grid == (2, 132), default.split_grid
    monkeypatch.setattr(gluon_decode, "BALANCED_TWO_CONSUMERS", BALANCED_D64)
    plan = gluon_decode.GluonDecodePlan(problem, CPU)
    assert plan.balanced and plan.consumers == 2 and plan.split_grid == (1, 132), plan.split_grid
    assert plan.num_splits == default.num_splits == 100
    assert (plan.split_options["BLOCK_N"], plan.split_options["NUM_STAGES"]) == gluon_decode.TWO_CONSUMERS[64][0]


def test_balanced_two_consumers_d64_ab_rows_move_but_the_control(monkeypatch: pytest.MonkeyPatch):
    """``bench/gluon_decode_balanced_two_d64_ab.sh``'s rows: each takes two consumers under the candidate (one by the
    default it ran against, which had no target rule), its last, the control, one either way."""
    monkeypatch.setattr(gluon_decode, "BALANCED_TWO_CONSUMERS_SAME_TARGET", ())
    words = knob_ab_words("gluon_decode_balanced_two_d64_ab.sh", "balanced_two_d64")
    assert words[1:4] == ["triton_impl.gluon.decode:BALANCED_TWO_CONSUMERS", "(128,),(64, 128)", "gluon/decode"]
    consumers = {}
    for row in words[4:]:
        problem = parse_row(row)[1].problem
        for switch in ((128,), BALANCED_D64):
            monkeypatch.setattr(gluon_decode, "BALANCED_TWO_CONSUMERS", switch)
            consumers[row, switch] = gluon_decode.consumers_for(problem, CPU)
    moved = [row for row in words[4:] if (consumers[row, (128,)], consumers[row, BALANCED_D64]) == (1, 2)]
    assert moved == words[4:-1] and words[4] == "5309/2", moved
    control = words[-1]
    assert consumers[control, (128,)] == consumers[control, BALANCED_D64] == 1


# ----------------------------------------------------------------------------------------------------
# sm_90a: the two-consumer builds (no spills, one CTA an SM); the switch leaves the others
# ----------------------------------------------------------------------------------------------------
_SCRIPT = r"""
import hashlib, json, re, sys
import torch
from common.measure.decode_sweep import random_cases
from common.reporting.static import cubin_resources, cubin_sass
from triton_impl.gluon import decode

decode.PACKED_PREFILL_MIN_ROWS = None  # the split kernels' builds: the packed prefill would take 233/5
rows = {
    "233/5": random_cases(8, 233)[5].problem,
    "229/2 d256": random_cases(8, 229)[2].problem,
    "233/5 paged16 fp16 lse": random_cases(8, 233)[5].problem.with_(
        batch=16, kv_heads=8, heads=128, seqlen_k=2048, page_size=16, has_cache_seqlens=True, dtype=torch.float16,
        return_lse=True),
    "229/2 d256 paged64 top-left": random_cases(8, 229)[2].problem.with_(
        batch=16, kv_heads=8, heads=128, seqlen_k=2048, page_size=64, has_cache_seqlens=True,
        causal_alignment="top_left"),
    "92/0 balanced paged16": random_cases(8, 92)[0].problem,
    "64 rows": random_cases(8, 233)[5].problem.with_(heads=128),
    "d64": random_cases(8, 234)[1].problem,
    "5309/2 balanced d64": random_cases(8, 5309)[2].problem,
}
# The switch's settings: off, the default's (D=128 and the D=256 candidate), and BALANCED_TWO_CONSUMERS' D=64 candidate
# (the default rings, which hold D=64's).
RINGS = {False: {}, True: {128: ((64, 6), (128, 3)), 256: ((32, 5), (32, 5))}, "d64": dict(decode.TWO_CONSUMERS)}
BALANCED = {False: (), True: (128,), "d64": (64, 128)}
SETMAXNREG = r"USETMAXREG\.\w+\.CTAPOOL (?:UP0, )?(0x[0-9a-f]+)"
results = {}
for name, switch in json.loads(sys.argv[1]):
    decode.TWO_CONSUMERS, decode.BALANCED_TWO_CONSUMERS = RINGS[switch], BALANCED[switch]
    (binary,) = decode.compile_sm90(rows[name])
    (kernel, usage), = cubin_resources(binary.cubin).items()
    sass = cubin_sass(binary.cubin)
    results[f"{name}|{switch}"] = {
        "registers": usage["registers"], "spill_bytes": usage["local_bytes"] + usage["stack_bytes"],
        "local_ops": len(re.findall(r"\b(?:LDL|STL)\b", sass)), "shared_bytes": binary.shared_bytes,
        "setmaxnreg": sorted({int(n, 16) for n in re.findall(SETMAXNREG, sass)}),
        "hgmma": len(re.findall(r"\bHGMMA\b", sass)), "two": decode.consumers_for(rows[name]) == 2,
        "sass": hashlib.sha256(sass.encode()).hexdigest(),
    }
print(json.dumps(results))
"""
TAKEN = ("233/5", "229/2 d256", "233/5 paged16 fp16 lse", "229/2 d256 paged64 top-left", "92/0 balanced paged16")
# Spill bytes and local-memory instructions allowed per build: the paged fp16 build with the LSE (Triton 3.8) and the
# balanced paged build (3.7.1) keep two 4-byte kernel arguments in local memory, stored once at the kernel's start and
# loaded back inside each consumer's loops (L1-resident; none in any other build or release).
ALLOWED_SPILLS = {"233/5 paged16 fp16 lse": (8, 6), "92/0 balanced paged16": (8, 6)}
# The builds taken under the running release (Triton 3.9: not those copied in page chunks, pages of 16 against 64- or
# 128-key blocks; ``TWO_CONSUMER_CHUNK_SPILLS``).
CHUNKED = ("233/5 paged16 fp16 lse", "92/0 balanced paged16")
TAKEN_HERE = tuple(
    name
    for name in TAKEN
    if name not in CHUNKED or gluon_decode.triton_release() not in gluon_decode.TWO_CONSUMER_CHUNK_SPILLS
)
LEFT = ("64 rows", "d64")
D64_BALANCED_BUILD = "5309/2 balanced d64"


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict]:
    keys = [[name, switch] for name in TAKEN + LEFT for switch in (False, True)]
    keys += [[D64_BALANCED_BUILD, False], [D64_BALANCED_BUILD, "d64"]]
    return json_from_child(["-c", _SCRIPT, json.dumps(keys)], timeout=1500)


@pytest.mark.xdist_group("gluon-decode-two-consumers-compile")
@pytest.mark.static
def test_two_consumer_builds_fit_one_cta_an_sm_without_spills(compiled: dict[str, dict]):
    for name in TAKEN:
        if name not in TAKEN_HERE:
            assert not compiled[f"{name}|True"]["two"], name
            continue
        facts = compiled[f"{name}|True"]
        print(name, {key: value for key, value in facts.items() if key != "sass"})
        spill_bytes, local_ops = ALLOWED_SPILLS.get(name, (0, 0))
        assert facts["two"] and facts["spill_bytes"] <= spill_bytes and facts["local_ops"] <= local_ops, (name, facts)
        assert facts["shared_bytes"] + CTA_RESERVED_BYTES <= SM_SHARED_BYTES, (name, facts)
        # 168 a thread at launch over three warpgroups; the consumers' 232 and the load warp's 48 are set in the kernel.
        assert facts["registers"] <= gluon_decode.TWO_CONSUMER_MAXNREG, (name, facts)
        assert {48, 232} <= set(facts["setmaxnreg"]), (name, facts)
        off = compiled[f"{name}|False"]
        # Both consumers issue the same wgmmas a block as the one-consumer build's warpgroup.
        assert facts["hgmma"] >= off["hgmma"] and not off["two"], (name, facts["hgmma"], off["hgmma"])


@pytest.mark.xdist_group("gluon-decode-two-consumers-compile")
@pytest.mark.static
def test_balanced_two_consumers_d64_candidate_builds_one_cta_an_sm_without_spills(compiled: dict[str, dict]):
    """The D=64 candidate's balanced build (seed 5309's row 2): two consumers without spills or local memory, in one
    CTA's shared memory, at the two-consumer register budget (Triton 3.6 and 3.8 here: 168 registers, 147912 bytes)."""
    facts, off = compiled[f"{D64_BALANCED_BUILD}|d64"], compiled[f"{D64_BALANCED_BUILD}|False"]
    assert facts["two"] and not off["two"], (facts, off)
    assert facts["spill_bytes"] == 0 and facts["local_ops"] == 0, facts
    assert facts["shared_bytes"] + CTA_RESERVED_BYTES <= SM_SHARED_BYTES, facts
    assert facts["registers"] <= gluon_decode.TWO_CONSUMER_MAXNREG and {48, 232} <= set(facts["setmaxnreg"]), facts


@pytest.mark.xdist_group("gluon-decode-two-consumers-compile")
@pytest.mark.static
def test_switch_leaves_the_builds_it_does_not_take(compiled: dict[str, dict]):
    for name in LEFT:
        off, on = compiled[f"{name}|False"], compiled[f"{name}|True"]
        assert not on["two"] and on["sass"] == off["sass"], name


# ----------------------------------------------------------------------------------------------------
# GPU: the two-consumer launch against fp64
# ----------------------------------------------------------------------------------------------------
def _lengths(batch: int, low: int, high: int, seed: int) -> tuple[int, ...]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(low, high + 1, (batch,), generator=generator).tolist())


# name -> (problem, lengths or None for full)
GPU_CASES = {
    "233/5": (_row(233, 5).problem, None),
    "229/2-d256": (_row(229, 2).problem.with_(seqlen_k=20480), None),
    "139/1-splits": (_row(139, 1).problem, None),
    "odd-m-tiles-g10": (_problem(1, 2, 16384, group=10), None),
    "g8-sq16-top-left": (_problem(4, 8, 4096, group=8, seqlen_q=16, causal_alignment="top_left"), None),
    "non-causal-fp16-lse": (_problem(2, 4, 8192, causal=False, dtype=torch.float16, return_lse=True), None),
    "ragged-lengths": (_problem(16, 8, 2048, has_cache_seqlens=True), _lengths(16, 1, 2048, 1)),
    "ragged-empty": (_problem(16, 8, 1024, has_cache_seqlens=True), (0, *_lengths(15, 1, 1024, 2))),
    "paged16-ragged": (_problem(16, 8, 2048, page_size=16, has_cache_seqlens=True), _lengths(16, 1, 2048, 3)),
    "paged64-d256": (
        _problem(32, 8, 2048, head_dim=256, group=8, page_size=64, has_cache_seqlens=True),
        _lengths(32, 1, 2048, 4),
    ),
    "paged256-full": (_problem(16, 8, 2048, page_size=256, has_cache_seqlens=True), (2048,) * 16),
    "d256-g8-sq16": (_problem(4, 4, 8192, head_dim=256, group=8, seqlen_q=16), None),
    "mqa-sq1-g128": (_problem(4, 1, 16384, group=128, seqlen_q=1), None),
    "d64-256-rows-splits": (_problem(2, 4, 32768, head_dim=64), None),
    "d64-128-rows-paged16-ragged": (
        _problem(32, 8, 2048, head_dim=64, group=8, page_size=16, has_cache_seqlens=True),
        _lengths(32, 1, 2048, 5),
    ),
    "d64-odd-tiles-lse-top-left": (
        _problem(8, 8, 4096, head_dim=64, group=10, return_lse=True, causal_alignment="top_left"),
        None,
    ),
}


def _require_two(
    problem: Problem, lengths, monkeypatch: pytest.MonkeyPatch, rings: dict = RINGS
) -> torch.device:  # fmt: skip
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    device = torch.device("cuda")
    monkeypatch.setattr(gluon_decode, "TWO_CONSUMERS", rings)
    # ITEMS_IN_FLIGHT's kernel takes some of these cases by default (d64-128-rows-paged16-ragged): off, so that the
    # two-consumer kernel runs every case.
    monkeypatch.setattr(gluon_decode, "ITEMS_IN_FLIGHT", False)
    plan = gluon_decode.GluonDecodePlan(problem, device)
    assert plan.consumers == 2 and not plan.balanced, (problem.describe(), plan.balanced)
    return device


# name -> (problem, lengths): calls the balanced split takes, on two consumers under BALANCED_TWO_CONSUMERS.
BALANCED_GPU_CASES = {
    "92/0-paged16": (_row(92, 0).problem, _row(92, 0).lengths),
    "176/6": (_row(176, 6).problem, _row(176, 6).lengths),
    "ragged-split-empty": (_problem(3, 4, 8192, has_cache_seqlens=True), (5, 8192, 0)),
    "two-level-merge-lse": (
        _problem(4, 2, 65536, group=8, has_cache_seqlens=True, return_lse=True),
        (65536, 100, 5000, 1),
    ),
    "paged64-odd-tiles-fp16": (
        _problem(2, 4, 16384, group=10, page_size=64, has_cache_seqlens=True, dtype=torch.float16),
        (16000, 3000),
    ),
}


# The same at D=64 under the candidate BALANCED_D64: the two rows its A/B leads with, and a paged top-left case with the
# LSE, an empty sequence and an odd count of M tiles (group 10, Sq 16: 160 rows, three M tiles).
BALANCED_D64_GPU_CASES = {
    "5309/2": (_row(5309, 2).problem, _row(5309, 2).lengths),
    "56/6": (_row(56, 6).problem, _row(56, 6).lengths),
    "paged256-top-left-lse-odd-tiles": (
        _problem(
            3, 2, 32768, head_dim=64, group=10, page_size=256, has_cache_seqlens=True, return_lse=True,
            causal_alignment="top_left",
        ),
        (30000, 0, 777),
    ),
}  # fmt: skip


def _check_balanced_two(case: str, problem: Problem, lengths, switch: tuple[int, ...], monkeypatch) -> None:
    """``problem`` on the balanced kernel's two consumers under ``BALANCED_TWO_CONSUMERS = switch``, against fp64."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    monkeypatch.setattr(gluon_decode, "BALANCED_TWO_CONSUMERS", switch)
    plan = gluon_decode.GluonDecodePlan(problem, torch.device("cuda"))
    assert plan.balanced and plan.consumers == 2, problem.describe()
    clear_plan_cache()
    result = check_on_gpu("gluon/decode", problem, lengths, seed=len(case))
    clear_plan_cache()
    assert result.ok, f"gluon/decode BALANCED_TWO_CONSUMERS={switch} {problem.describe()}: {result.summary()}"


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(BALANCED_GPU_CASES))
def test_gpu_balanced_two_consumers_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    _check_balanced_two(case, *BALANCED_GPU_CASES[case], (128,), monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(BALANCED_D64_GPU_CASES))
def test_gpu_balanced_two_consumers_d64_candidate_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    _check_balanced_two(case, *BALANCED_D64_GPU_CASES[case], BALANCED_D64, monkeypatch)


# (case, candidate) pairs where the candidate's rings take the case's head dim.
GPU_PAIRS = [
    (case, candidate)
    for case, (problem, _) in sorted(GPU_CASES.items())
    for candidate, rings in CANDIDATES.items()
    if problem.head_dim in rings
]


@pytest.mark.gpu
@pytest.mark.parametrize(("case", "candidate"), GPU_PAIRS)
def test_gpu_two_consumers_against_fp64(case: str, candidate: str, monkeypatch: pytest.MonkeyPatch):
    problem, lengths = GPU_CASES[case]
    _require_two(problem, lengths, monkeypatch, CANDIDATES[candidate])
    clear_plan_cache()  # the rings are read when a plan is made
    result = check_on_gpu("gluon/decode", problem, lengths, seed=len(case))
    clear_plan_cache()
    assert result.ok, f"gluon/decode TWO_CONSUMERS={CANDIDATES[candidate]} {problem.describe()}: {result.summary()}"


@pytest.mark.gpu
def test_gpu_a_grid_one_m_extent_short_fails(monkeypatch: pytest.MonkeyPatch):
    """Planted: the grid's M extent one short, so that the last two M tiles of every item are never computed; the
    rows they leave hold the poison and the check fails."""
    problem, lengths = GPU_CASES["233/5"]
    _require_two(problem, lengths, monkeypatch)
    clear_plan_cache()  # a plan made by an earlier test would keep the real grid
    real = gluon_decode.grid_m_blocks
    monkeypatch.setattr(gluon_decode, "grid_m_blocks", lambda problem, consumers: real(problem, consumers) - 1)
    result = check_on_gpu("gluon/decode", problem, lengths, seed=7)
    clear_plan_cache()
    assert not result.ok, "a launch that skips M tiles must fail the fp64 check"
