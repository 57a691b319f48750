"""gluon/decode's ``ITEMS_IN_FLIGHT`` ("many-rows": D=64 items of two or more M tiles; issue #38's short items, seed 151
row 1): ``_items_kernel``, a grid of min(tiles, CTA slots) CTAs each walking the tiles its load warp claims, the ring
and its phases running on across tiles, the next tile's Q in a second buffer.

CPU: the default takes only the timed class (D=64, two or more M tiles; a planted gate without the M tiles fails); which
shapes the switch on takes (one split by the rule, D 64 / 128, more tiles than slots) and the plan it gives seed 151 row
1 (264 CTAs of 4096 tiles, 128 registers at launch). Static (sm_90a, child process, the running Triton release): the
items builds without spills or local memory, their CTAs an SM by shared memory as ``items_ctas_per_sm`` says; the switch
leaving every build it does not take instruction for instruction, and the builds it takes being ``_split_kernel`` with
it off. GPU (``gpu``; run before bench/README.md's A/B): against fp64 on a poisoned output with the items kernel checked
to be the one launched: 151/1 itself, items of one key block and of many, ragged, paged (pages of 16 and 128) and
contiguous, GQA groups 1 / 5 / 8, D 64 / 128, fp16, the LSE, an empty sequence; three launches in a row (the claim
counter back to 0); a planted launch whose counter starts past the last tile (every CTA's first tile only) fails the
check, and so does (or hangs, in a child process cut by a timeout) a planted ring whose places and phases restart at
every tile.

``ITEMS_TWO_CONSUMERS`` (a tile is two M tiles of an item on two consumer warpgroups, one ring): CPU, which shapes it
takes (two or more M tiles at its head dims) and 6007/4's plan (132 CTAs of 1024 tiles, 168 registers at launch);
static, its builds without spills, one CTA an SM; GPU, the cases of two or more M tiles (an odd count too: the last
tile's second M tile past the item's rows) against fp64, and a planted consumer that computes its tile's first M tile
instead of its own must fail.

``ITEMS_LONGEST_FIRST`` (the load warps claim the longest sequences' tiles first): CPU, the batches it orders (with
``cache_seqlens``, up to ``ITEMS_LONGEST_FIRST_MAX_BATCH``); static, its builds without spills; GPU, every ragged case
against fp64 under one and two consumers, a batch of tied lengths among them, where a planted rank without the tie-break
(two batches of one rank: one computed twice, one never) must fail.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from common.contract.problem import Problem
from common.measure.decode_sweep import random_cases
from tests._helpers import json_from_child
from tests.test_decode_wide import check_on_gpu
from triton_impl.gluon import decode as gluon_decode

CPU = torch.device("cpu")
SM_SHARED_BYTES, CTA_RESERVED_BYTES = 233472, 1024


def _problem(batch: int, kv_heads: int, seqlen_k: int, head_dim: int = 64, **changes) -> Problem:
    """A decode step of group 5 (bottom-right causal, ``cache_seqlens`` unless told otherwise)."""
    return Problem(
        batch, kv_heads * changes.pop("group", 5), changes.pop("seqlen_q", 16), seqlen_k, head_dim,
        dtype=changes.pop("dtype", torch.bfloat16), causal=changes.pop("causal", True), kv_heads=kv_heads,
        causal_alignment="bottom_right", has_cache_seqlens=changes.pop("has_cache_seqlens", True),
        return_lse=changes.pop("return_lse", False), **changes,
    )  # fmt: skip


def _row(seed: int, index: int):
    return random_cases(8, seed)[index]


def test_the_default_takes_the_timed_class_only(monkeypatch: pytest.MonkeyPatch):
    """ "many-rows" takes the D=64 rows of two or more M tiles that gained (151/1, 93/4, 41/1), not the one-tile or
    D=128 rows that lost (41/2, 61/7, 151/5, 167/1); True takes those too, False none. A planted gate that takes
    every row the kernel can must fail."""
    assert gluon_decode.ITEMS_IN_FLIGHT == "many-rows", "D=64 items of two or more M tiles, as timed"
    gained, lost = ("151/1", "93/4", "41/1"), ("41/2", "61/7", "151/5", "167/1")

    def taken() -> set[str]:
        rows = (*gained, *lost)
        return {row for row in rows if gluon_decode.items_in_flight(_row(*map(int, row.split("/"))).problem, CPU)}

    assert taken() == set(gained)
    with monkeypatch.context() as planted:  # a gate that does not count the M tiles
        planted.setattr(gluon_decode, "m_blocks_for", lambda problem: 2)
        assert taken() - set(gained) == {"41/2", "61/7"}, "a planted gate without the M tiles must take rows that lost"
    with monkeypatch.context() as packed:  # PACKED_OCCUPANCY's ring (four CTAs on 64 registers) keeps its kernel
        packed.setattr(gluon_decode, "PACKED_OCCUPANCY", True)
        assert not taken() & {"151/1", "93/4", "41/1"}
    monkeypatch.setattr(gluon_decode, "ITEMS_IN_FLIGHT", True)
    assert taken() == {*gained, *lost}
    monkeypatch.setattr(gluon_decode, "ITEMS_IN_FLIGHT", False)
    assert taken() == set()


def test_switch_on_takes_seed_151_row_1(monkeypatch: pytest.MonkeyPatch):
    """One consumer a CTA (``ITEMS_TWO_CONSUMERS`` empty): 264 CTAs of 4096 tiles on 128 registers."""
    problem = _row(151, 1).problem
    monkeypatch.setattr(gluon_decode, "ITEMS_IN_FLIGHT", True)
    monkeypatch.setattr(gluon_decode, "ITEMS_TWO_CONSUMERS", {})
    assert gluon_decode.items_in_flight(problem, CPU)
    plan = gluon_decode.GluonDecodePlan(problem, CPU)
    assert plan.items_in_flight and plan.items_grid == (264,) and plan.num_tiles == 4096
    assert plan.items_options["maxnreg"] == 128 and plan.items_options["NUM_STAGES"] == 6
    assert gluon_decode.items_ctas_per_sm(problem) == 2


def test_items_ring_keeps_the_split_kernels_ctas_an_sm(monkeypatch: pytest.MonkeyPatch):
    """One consumer a CTA: the second Q buffer costs a stage where it would cost a CTA an SM: D=64's six stages keep
    two CTAs, D=128's short-cache ring (64-key blocks) goes from 3 stages to 2 to keep two, D=128's long ring keeps its
    one."""
    monkeypatch.setattr(gluon_decode, "ITEMS_TWO_CONSUMERS", {})
    long_d128 = _problem(64, 16, 12288, head_dim=128, group=1, seqlen_q=1, has_cache_seqlens=False)
    expected = [(_row(151, 1).problem, (64, 6), 2), (_row(151, 5).problem, (64, 2), 2), (long_d128, (128, 3), 1)]
    for problem, ring, ctas in expected:
        config = gluon_decode.items_config(problem)
        assert ((config.block_n, config.num_stages), gluon_decode.items_ctas_per_sm(problem)) == (ring, ctas)
        assert gluon_decode.split_policy(problem).ctas_per_sm == ctas, problem.describe()


# (name, problem, taken): what the switch takes at 132 SMs.
SHAPES = [
    ("151/1", _row(151, 1).problem, True),
    ("151/5: D=128 one CTA an SM", _row(151, 5).problem, True),
    ("41/2", _row(41, 2).problem, True),
    ("D=256", _row(151, 1).problem.with_(head_dim=256), False),
    (
        "D=128 long ring: one CTA an SM",
        _problem(64, 16, 12288, head_dim=128, group=1, seqlen_q=1, has_cache_seqlens=False),
        True,
    ),
    ("few tiles: one wave", _problem(4, 8, 4096), False),
    ("split by the rule: long cache, few items", _problem(2, 4, 65536), False),
    ("sweep ragged row: balanced", _row(73, 3).problem.with_(seqlen_k=32768, head_dim=128, batch=8), False),
]


def test_shapes_it_takes(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(gluon_decode, "ITEMS_IN_FLIGHT", True)
    assert {name: gluon_decode.items_in_flight(problem, CPU) for name, problem, _ in SHAPES} == {
        name: taken for name, _, taken in SHAPES
    }


def _readme_ab() -> list[str]:
    """The words of bench/README.md's ``ITEMS_IN_FLIGHT`` A/B command (``bench.decode_knob_ab``)."""
    import re
    import shlex
    from pathlib import Path

    readme = (Path(__file__).parents[1] / "bench" / "README.md").read_text()
    commands = re.findall(
        r"`python -m (bench\.decode_knob_ab --knob triton_impl\.gluon\.decode:ITEMS_IN_FLIGHT [^`]+)`", readme
    )
    assert len(commands) == 1, commands
    return shlex.split(commands[0])


def test_ab_rows_parse_and_the_switch_takes_them(monkeypatch: pytest.MonkeyPatch):
    """bench/README.md's A/B (``bench.decode_knob_ab`` on ``ITEMS_IN_FLIGHT``, off against on, gluon/decode): its
    arguments parse, and of its rows, 151/1 first, the switch takes every one at 132 SMs (a row it left would time the
    same kernel twice)."""
    from bench.decode_knob_ab import arguments, parse_row

    words = _readme_ab()
    args = arguments(words[1:])
    assert words[0] == "bench.decode_knob_ab" and args.knob == "triton_impl.gluon.decode:ITEMS_IN_FLIGHT"
    assert args.values == [False, True] and args.rungs == ["gluon/decode"] and args.rounds >= 2, args
    rows = args.rows
    assert rows[0] == "151/1" and len([row for row in rows if not row.startswith("151/")]) >= 6, rows
    monkeypatch.setattr(gluon_decode, "ITEMS_IN_FLIGHT", True)
    for text in rows:
        assert gluon_decode.items_in_flight(parse_row(text)[1].problem, CPU), text


TWO_CONSUMERS_ON = {64: (64, 8), 128: (64, 4)}


def test_two_consumers_take_items_of_two_or_more_m_tiles(monkeypatch: pytest.MonkeyPatch):
    """Under ``ITEMS_TWO_CONSUMERS`` (D=64's 8 stages of 64 keys, as timed) a tile is two M tiles at its head dims
    (one-tile items and other head dims keep one consumer), 6007/4's plan is 132 CTAs (one an SM) of 1024 tiles on 168
    registers at launch, and empty means one."""
    row = _row(6007, 4).problem
    assert gluon_decode.ITEMS_TWO_CONSUMERS == {64: (64, 8)}
    one_tile = _problem(64, 8, 4096, group=1, seqlen_q=1)
    assert [gluon_decode.items_consumers(p) for p in (row, one_tile, row.with_(head_dim=128))] == [2, 1, 1]
    plan = gluon_decode.GluonDecodePlan(row, CPU)
    assert plan.items_in_flight and plan.items_grid == (132,) and plan.num_tiles == 1024, plan.items_grid
    options = plan.items_options
    assert (options["CONSUMERS"], options["NUM_STAGES"], options["maxnreg"]) == (2, 8, 168), options
    assert options["CONSUMER_REGS"] == gluon_decode.TWO_CONSUMER_REGISTERS
    three_tiles = _problem(64, 8, 2048, group=12)
    assert gluon_decode.m_blocks_for(three_tiles) == 3 and gluon_decode.items_tiles(three_tiles) == 64 * 8 * 2
    monkeypatch.setattr(gluon_decode, "ITEMS_TWO_CONSUMERS", {})
    assert gluon_decode.items_consumers(row) == 1 and gluon_decode.items_tiles(row) == 2048


def test_longest_first_orders_ragged_batches_up_to_its_cap(monkeypatch: pytest.MonkeyPatch):
    """``items_order_block``: 0 (claim order) while ``ITEMS_LONGEST_FIRST`` is off, for full lengths and past the cap;
    else the batch as a power of two of at least 32 rows. On by default."""
    row = _row(6007, 4).problem
    assert gluon_decode.ITEMS_LONGEST_FIRST
    assert gluon_decode.GluonDecodePlan(row, CPU).items_options["ORDER_BLOCK_B"] == 32
    monkeypatch.setattr(gluon_decode, "ITEMS_LONGEST_FIRST", False)
    assert gluon_decode.items_order_block(row) == 0
    assert gluon_decode.GluonDecodePlan(row, CPU).items_options["ORDER_BLOCK_B"] == 0
    monkeypatch.setattr(gluon_decode, "ITEMS_LONGEST_FIRST", True)
    assert gluon_decode.items_order_block(row) == 32
    cap = gluon_decode.ITEMS_LONGEST_FIRST_MAX_BATCH
    batches = {batch: gluon_decode.items_order_block(row.with_(batch=batch)) for batch in (8, 32, 65, cap, cap + 1)}
    assert batches == {8: 32, 32: 32, 65: 128, cap: cap, cap + 1: 0}, batches
    assert gluon_decode.items_order_block(row.with_(has_cache_seqlens=False)) == 0
    assert gluon_decode.GluonDecodePlan(row, CPU).items_options["ORDER_BLOCK_B"] == 32


def test_knob_plan_names_the_items_kernel_where_it_is_taken(monkeypatch: pytest.MonkeyPatch):
    """``bench.decode_knob_ab``'s plan of a row tells the two values apart where the switch takes the row (151/1: the
    items kernel on 264 CTAs) and reads the same where it does not (151/0)."""
    from bench.decode_knob_ab import knob_plan, parse_row

    plans = {}
    monkeypatch.setattr(gluon_decode, "TWO_CONSUMERS", {})  # 151/1 off the items kernel: one consumer a CTA
    for switch in (False, True):
        monkeypatch.setattr(gluon_decode, "ITEMS_IN_FLIGHT", switch)
        plans[switch] = {row: knob_plan("gluon/decode", parse_row(row)[1], CPU) for row in ("151/1", "151/0")}
    assert plans[True]["151/1"] == f"{plans[False]['151/1']}, items kernel on 132 CTAs", plans
    assert "items" not in plans[False]["151/1"] and plans[True]["151/0"] == plans[False]["151/0"], plans


# ----------------------------------------------------------------------------------------------------
# sm_90a: the items builds (no spills, their CTAs an SM); the switch leaves the others
# ----------------------------------------------------------------------------------------------------
_SCRIPT = r"""
import hashlib, json, re, sys
import torch
from common.contract.problem import Problem
from common.measure.decode_sweep import random_cases
from common.reporting.static import cubin_resources, cubin_sass
from triton_impl.gluon import decode

rows = {
    "151/1": random_cases(8, 151)[1].problem,
    "151/5": random_cases(8, 151)[5].problem,
    "67/1 paged16": random_cases(8, 67)[1].problem,
    "129/5 contiguous": random_cases(8, 129)[5].problem,
    "fp16 non-causal lse": random_cases(8, 41)[2].problem.with_(dtype=torch.float16, causal=False, return_lse=True),
    "151/0 d128 few tiles": random_cases(8, 151)[0].problem,
    "151/1 d256": random_cases(8, 151)[1].problem.with_(head_dim=256),
    "long d128": Problem(64, 16, 1, 12288, 128, dtype=torch.bfloat16, causal=True, kv_heads=16,
                         causal_alignment="bottom_right"),
    "6007/4 fp16 lse": random_cases(8, 6007)[4].problem.with_(dtype=torch.float16, return_lse=True),
    "196/0 paged32": random_cases(8, 196)[0].problem,
}
results = {}
for name, switch in json.loads(sys.argv[1]):
    decode.ITEMS_IN_FLIGHT = switch if switch not in ("two", "longest") else True
    decode.ITEMS_TWO_CONSUMERS = {64: (64, 8), 128: (64, 4)} if switch in ("two", "longest") else {}
    decode.ITEMS_LONGEST_FIRST = switch == "longest"
    (binary,) = decode.compile_sm90(rows[name])
    (kernel, usage), = cubin_resources(binary.cubin).items()
    sass = cubin_sass(binary.cubin)
    results[f"{name}|{switch}"] = {
        "kernel": kernel, "registers": usage["registers"], "spill_bytes": usage["local_bytes"] + usage["stack_bytes"],
        "local_ops": len(re.findall(r"\b(?:LDL|STL)\b", sass)), "shared_bytes": binary.shared_bytes,
        "setmaxnreg": sorted(set(re.findall(r"USETMAXREG\.\w+\.CTAPOOL (?:UP0, )?(0x[0-9a-f]+)", sass))),
        "items": decode.items_in_flight(rows[name]), "ctas_per_sm": decode.items_ctas_per_sm(rows[name]),
        "consumers": decode.items_consumers(rows[name]), "order_block": decode.items_order_block(rows[name]),
        "sass": hashlib.sha256(sass.encode()).hexdigest(),
    }
print(json.dumps(results))
"""
TAKEN = ("151/1", "151/5", "67/1 paged16", "129/5 contiguous", "fp16 non-causal lse", "long d128")
LEFT = ("151/0 d128 few tiles", "151/1 d256")
TWO = ("151/1", "6007/4 fp16 lse", "196/0 paged32")  # items of two or more M tiles (196/0: four)


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict]:
    keys = [[name, switch] for name in TAKEN + LEFT for switch in (False, True)]
    keys += [[name, switch] for name in TWO for switch in (True, "two", "longest") if [name, switch] not in keys]
    return json_from_child(["-c", _SCRIPT, json.dumps(keys)], timeout=1500)


@pytest.mark.xdist_group("gluon-decode-items-compile")
@pytest.mark.static
def test_items_builds_fit_without_spills(compiled: dict[str, dict]):
    for name in TAKEN:
        facts = compiled[f"{name}|True"]
        print(name, {key: value for key, value in facts.items() if key != "sass"})
        assert facts["items"] and facts["kernel"] == "_items_kernel", (name, facts)
        assert facts["spill_bytes"] == 0 and facts["local_ops"] == 0, (name, facts)
        ctas = SM_SHARED_BYTES // (facts["shared_bytes"] + CTA_RESERVED_BYTES)
        assert ctas == facts["ctas_per_sm"], (name, ctas, facts)
        # Two warpgroups' registers at launch fit that many CTAs an SM.
        assert facts["registers"] * 256 * ctas <= 65536, (name, facts)


@pytest.mark.xdist_group("gluon-decode-items-compile")
@pytest.mark.static
def test_two_consumer_builds_fit_without_spills(compiled: dict[str, dict]):
    """Under ``ITEMS_TWO_CONSUMERS`` the items builds of two-tile items take two consumers, spill nothing, and hold one
    CTA an SM whose three warpgroups' launch registers fit the register file."""
    for name in TWO:
        facts = compiled[f"{name}|two"]
        assert facts["kernel"] == "_items_kernel" and facts["consumers"] == 2, (name, facts)
        assert facts["spill_bytes"] == 0 and facts["local_ops"] == 0, (name, facts)
        ctas = SM_SHARED_BYTES // (facts["shared_bytes"] + CTA_RESERVED_BYTES)
        assert ctas == facts["ctas_per_sm"] == 1, (name, ctas, facts)
        assert facts["registers"] * 384 <= 65536, (name, facts)
        assert facts["sass"] != compiled[f"{name}|True"]["sass"], name


@pytest.mark.xdist_group("gluon-decode-items-compile")
@pytest.mark.static
def test_longest_first_builds_fit_without_spills(compiled: dict[str, dict]):
    """Under ``ITEMS_LONGEST_FIRST`` (and two consumers) the load warp's ranks fit its registers: no spill."""
    for name in TWO:
        facts = compiled[f"{name}|longest"]
        assert facts["order_block"] >= 32 and facts["consumers"] == 2, (name, facts)
        assert facts["spill_bytes"] == 0 and facts["local_ops"] == 0, (name, facts)
        assert facts["sass"] != compiled[f"{name}|two"]["sass"], name


@pytest.mark.xdist_group("gluon-decode-items-compile")
@pytest.mark.static
def test_switch_off_is_the_split_kernel_and_leaves_other_builds(compiled: dict[str, dict]):
    for name in TAKEN:
        assert compiled[f"{name}|False"]["kernel"] == "_split_kernel", name
    for name in LEFT:
        off, on = compiled[f"{name}|False"], compiled[f"{name}|True"]
        assert not on["items"] and on["sass"] == off["sass"], name


# ----------------------------------------------------------------------------------------------------
# GPU: the items kernel against fp64
# ----------------------------------------------------------------------------------------------------
def _lengths(batch: int, low: int, high: int, seed: int) -> tuple[int, ...]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(low, high + 1, (batch,), generator=generator).tolist())


# name -> (problem, lengths or None for full): every case has more tiles than 2 x 132 CTA slots.
GPU_CASES = {
    "151/1": (_row(151, 1).problem, _row(151, 1).lengths),
    "one-block-items": (_problem(64, 8, 4096, group=1, seqlen_q=1), _lengths(64, 1, 64, 1)),
    "many-block-items-g8": (_problem(32, 16, 8192, group=8, seqlen_q=2), _lengths(32, 2000, 8192, 2)),
    "ragged-empty-fp16": (_problem(64, 8, 2048, dtype=torch.float16), (0, *_lengths(63, 1, 2048, 3))),
    "paged16-d128": (_problem(64, 8, 2048, head_dim=128, group=8, seqlen_q=1, page_size=16), _lengths(64, 1, 2048, 4)),
    "contiguous-d128-lse": (_problem(64, 8, 1024, head_dim=128, seqlen_q=4, return_lse=True), _lengths(64, 1, 1024, 5)),
    "full-non-causal": (_problem(64, 8, 768, causal=False, has_cache_seqlens=False), None),
}


def _require_items(problem: Problem, monkeypatch: pytest.MonkeyPatch) -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    device = torch.device("cuda")
    monkeypatch.setattr(gluon_decode, "ITEMS_IN_FLIGHT", True)
    assert gluon_decode.items_in_flight(problem, device), problem.describe()
    return device


# Items of two or more M tiles, the cases ITEMS_TWO_CONSUMERS takes (with those of GPU_CASES that have them).
TWO_CONSUMER_CASES = {
    "odd-m-tiles-paged16": (_problem(64, 8, 2048, group=12, page_size=16), _lengths(64, 1, 2048, 6)),
    "two-tiles-d128-lse": (_problem(64, 8, 1024, head_dim=128, group=8, return_lse=True), _lengths(64, 0, 1024, 7)),
    **{name: case for name, case in GPU_CASES.items() if gluon_decode.m_blocks_for(case[0]) >= 2},
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gpu_items_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    problem, lengths = GPU_CASES[case]
    _require_items(problem, monkeypatch)
    result = check_on_gpu("gluon/decode", problem, lengths, seed=len(case))
    assert result.ok, f"gluon/decode ITEMS_IN_FLIGHT {problem.describe()}: {result.summary()}"


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(TWO_CONSUMER_CASES))
def test_gpu_two_consumer_items_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    problem, lengths = TWO_CONSUMER_CASES[case]
    monkeypatch.setattr(gluon_decode, "ITEMS_TWO_CONSUMERS", TWO_CONSUMERS_ON)
    _require_items(problem, monkeypatch)
    assert gluon_decode.items_consumers(problem) == 2, problem.describe()
    result = check_on_gpu("gluon/decode", problem, lengths, seed=len(case))
    assert result.ok, f"gluon/decode ITEMS_TWO_CONSUMERS {problem.describe()}: {result.summary()}"


# Ragged cases, and a batch whose lengths tie (a rank without the tie-break gives two batches one rank).
TIED_LENGTHS = (100, 2000, 1000, 2000) * 16
LONGEST_FIRST_CASES = {
    "tied-two-tiles": (_problem(64, 8, 2048), TIED_LENGTHS),
    **{name: case for name, case in {**GPU_CASES, **TWO_CONSUMER_CASES}.items() if case[1] is not None},
}
LONGEST_FIRST_RUNS = [
    (name, consumers)
    for name, (problem, _) in sorted(LONGEST_FIRST_CASES.items())
    for consumers in ((1, 2) if gluon_decode.m_blocks_for(problem) >= 2 else (1,))
]


@pytest.mark.gpu
@pytest.mark.parametrize(("case", "consumers"), LONGEST_FIRST_RUNS)
def test_gpu_longest_first_against_fp64(case: str, consumers: int, monkeypatch: pytest.MonkeyPatch):
    problem, lengths = LONGEST_FIRST_CASES[case]
    monkeypatch.setattr(gluon_decode, "ITEMS_LONGEST_FIRST", True)
    monkeypatch.setattr(gluon_decode, "ITEMS_TWO_CONSUMERS", TWO_CONSUMERS_ON if consumers == 2 else {})
    _require_items(problem, monkeypatch)
    assert gluon_decode.items_consumers(problem) == consumers and gluon_decode.items_order_block(problem) > 0
    result = check_on_gpu("gluon/decode", problem, lengths, seed=len(case))
    assert result.ok, f"gluon/decode ITEMS_LONGEST_FIRST {problem.describe()}: {result.summary()}"


def _bound(case: str, device: torch.device):
    from common.contract.inputs import make_inputs, make_paged_kv

    problem, lengths = GPU_CASES[case]
    q, k, v = make_inputs(problem, seed=3, device="cuda", offset=0.5)
    block_table = None
    if problem.paged:
        k, v, block_table = make_paged_kv(problem, k, v, seed=3)
    cache_seqlens = None if lengths is None else torch.tensor(lengths, dtype=torch.int32, device=device)
    run = gluon_decode.bind(q, k, v, problem, cache_seqlens=cache_seqlens, block_table=block_table)
    return run, (q, k, v, cache_seqlens, block_table)


@pytest.mark.gpu
def test_gpu_q_with_heads_not_following_tokens_keeps_the_split_kernel(monkeypatch: pytest.MonkeyPatch):
    """A (B, Sq, H, D) Q seen as (B, H, Sq, D): its packed rows are no TMA box, so the launch keeps ``_split_kernel``
    (a copy would miss later writes into q), and is right."""
    from common.contract.check import check_on_inputs
    from common.contract.inputs import make_inputs
    from common.contract.registry import discover

    problem, lengths = GPU_CASES["ragged-empty-fp16"]
    device = _require_items(problem, monkeypatch)
    q, k, v = make_inputs(problem, seed=5, device="cuda", offset=0.5)
    q_strided = q.transpose(1, 2).contiguous().transpose(1, 2)
    assert gluon_decode.packed_q_rows(q_strided) is None and gluon_decode.packed_q_rows(q) is not None
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device=device)
    run = gluon_decode.bind(q_strided, k, v, problem, cache_seqlens=cache_seqlens)
    assert run.items_args is None
    impl = next(i for i in discover(include_baselines=False)[0] if i.name == "gluon/decode")
    result = check_on_inputs(impl, q_strided, k, v, problem, cache_seqlens=cache_seqlens)
    assert result.ok, result.summary()


@pytest.mark.gpu
def test_gpu_repeated_launches_and_a_planted_skip(monkeypatch: pytest.MonkeyPatch):
    """Three launches of one bound items launch give the same O (the claim counter is back to 0 after each); a launch
    whose counter starts at the tile count (planted: claims past the last tile from the start, so each CTA computes
    only its first tile) leaves rows unwritten."""
    device = _require_items(GPU_CASES["151/1"][0], monkeypatch)
    run, _ = _bound("151/1", device)
    assert run.items_args is not None and run.items_grid[0] < run.items_args[-1]
    counter = run.items_args[-2]
    first = run().clone()
    for _ in range(2):
        run.out.fill_(float("nan"))
        assert torch.equal(run(), first)
        assert counter[0].item() == 0
    run.out.fill_(float("nan"))
    counter[0] = run.items_args[-1]
    planted = run()
    torch.cuda.synchronize()
    counter.zero_()
    assert planted.isnan().any(), "a launch that skipped tiles should leave rows unwritten"
    assert not first.isnan().any()


_PLANTED = """
import hashlib, json, sys
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton_impl.gluon import decode


@gluon.jit
def _planted_ring_place(keys, i):
    # Planted: the ring's places (slots and barrier phases) restart at every tile, as if not carried across tiles.
    return i


@gluon.jit
def _planted_batch_ranks(CacheSeqlens, batch_size, BLOCK_B: gl.constexpr):
    # Planted: decode._batch_ranks without the tie-break, so that batches of one length share a rank.
    CHUNK: gl.constexpr = 8
    layout: gl.constexpr = gl.BlockedLayout([1, CHUNK], [32, 1], [1, 1], [1, 0])
    batches = gl.arange(0, BLOCK_B, layout=gl.SliceLayout(1, layout))
    lengths = gl.expand_dims(gl.load(CacheSeqlens + batches, mask=batches < batch_size, other=-1), 1)
    ranks = gl.zeros([BLOCK_B], gl.int32, gl.SliceLayout(1, layout))
    for chunk in range(BLOCK_B // CHUNK):
        columns = chunk * CHUNK + gl.arange(0, CHUNK, layout=gl.SliceLayout(0, layout))
        others = gl.expand_dims(gl.load(CacheSeqlens + columns, mask=columns < batch_size, other=-1), 0)
        ranks += gl.sum((others > lengths).to(gl.int32), axis=1)
    return batches, ranks


@gluon.jit
def _planted_consumer_m_block(m_group, CONSUMERS: gl.constexpr, CONSUMER: gl.constexpr):
    # Planted: every consumer computes its tile's first M tile, as if the consumer index were lost.
    return m_group * CONSUMERS


decode.ITEMS_IN_FLIGHT = True
if sys.argv[2] == "planted":
    decode._ring_place = _planted_ring_place
if sys.argv[2].endswith("consumer"):
    decode.ITEMS_TWO_CONSUMERS = {64: (64, 8), 128: (64, 4)}
if sys.argv[2] == "planted-consumer":
    decode._consumer_m_block = _planted_consumer_m_block
if sys.argv[2].endswith("ties"):
    decode.ITEMS_LONGEST_FIRST = True
if sys.argv[2] == "planted-ties":
    decode._batch_ranks = _planted_batch_ranks
from tests.test_decode_wide import check_on_gpu
from tests.test_gluon_decode_items import GPU_CASES, LONGEST_FIRST_CASES, TWO_CONSUMER_CASES

cases = {**GPU_CASES, **TWO_CONSUMER_CASES, **LONGEST_FIRST_CASES}
problem, lengths = cases[sys.argv[1]]
if sys.argv[3] == "static":
    from common.reporting.static import cubin_sass

    (binary,) = decode.compile_sm90(problem)
    print(json.dumps({"sass": hashlib.sha256(cubin_sass(binary.cubin).encode()).hexdigest()}))
else:
    result = check_on_gpu("gluon/decode", problem, lengths, seed=1)
    print(json.dumps({"ok": bool(result.ok), "summary": result.summary()}))
"""


def _planted_child(tmp_path, *args: str, timeout: float) -> dict:
    """``_PLANTED`` run as a file (a Gluon function needs one for its source) with ``args``."""
    script = tmp_path / "planted_ring.py"
    script.write_text(_PLANTED)
    return json_from_child([str(script), *args], timeout=timeout)


@pytest.mark.static
def test_planted_ring_restart_reaches_the_build(tmp_path):
    """The planted ``_ring_place`` and ``_consumer_m_block`` below are the ones the items kernel compiles with (their
    SASS differs from the plain build's)."""
    planted = _planted_child(tmp_path, "151/1", "planted", "static", timeout=600)
    plain = _planted_child(tmp_path, "151/1", "plain", "static", timeout=600)
    assert planted["sass"] != plain["sass"]
    planted = _planted_child(tmp_path, "151/1", "planted-consumer", "static", timeout=600)
    plain = _planted_child(tmp_path, "151/1", "plain-consumer", "static", timeout=600)
    assert planted["sass"] != plain["sass"]
    planted = _planted_child(tmp_path, "tied-two-tiles", "planted-ties", "static", timeout=600)
    plain = _planted_child(tmp_path, "tied-two-tiles", "plain-ties", "static", timeout=600)
    assert planted["sass"] != plain["sass"]


@pytest.mark.gpu
def test_gpu_planted_ring_restart_fails(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """A planted ``_ring_place`` that ignores the CTA's earlier tiles must give a wrong O, hang or fault: the child
    (one compile of a few seconds, then a launch of milliseconds) is cut at 60 s, which counts as caught, and a
    kernel fault in the child (seen on the H200, 2026-12-04: "unspecified launch failure") is caught too."""
    _require_items(GPU_CASES["one-block-items"][0], monkeypatch)
    _assert_planted_caught(tmp_path, "one-block-items", "planted")


def _assert_planted_caught(tmp_path, case: str, plant: str) -> None:
    """The planted child of ``case`` fails the fp64 check, faults ("CUDA error") or hangs past 60 s: each is caught."""
    try:
        verdict = _planted_child(tmp_path, case, plant, "gpu", timeout=60)
    except subprocess.TimeoutExpired:
        return
    except AssertionError as failed:  # json_from_child's own assertion: the child exited with an error
        assert "CUDA error" in str(failed), f"the planted child failed before its check:\n{failed}"
        return
    assert not verdict["ok"], f"the planted {plant} child passed the check: {verdict['summary']}"


@pytest.mark.gpu
def test_gpu_planted_consumer_tile_fails(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """Under ``ITEMS_TWO_CONSUMERS`` a planted ``_consumer_m_block`` that gives both consumers their tile's first M
    tile leaves the second M tile's rows unwritten on the poisoned output: the check must fail (the plain child, the
    same case and switches, passes it)."""
    _require_items(TWO_CONSUMER_CASES["odd-m-tiles-paged16"][0], monkeypatch)
    plain = _planted_child(tmp_path, "odd-m-tiles-paged16", "plain-consumer", "gpu", timeout=300)
    assert plain["ok"], plain["summary"]
    verdict = _planted_child(tmp_path, "odd-m-tiles-paged16", "planted-consumer", "gpu", timeout=300)
    assert not verdict["ok"], f"the planted consumer tile passed the check: {verdict['summary']}"


@pytest.mark.gpu
def test_gpu_planted_rank_without_tie_break_fails(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """Under ``ITEMS_LONGEST_FIRST`` a planted ``_batch_ranks`` without the tie-break gives tied batches one rank, so
    one of them is computed twice and another never, and a claim of a missing rank takes the sum of the tied batches'
    indices (a batch past the last, its stores out of bounds): the check must fail, or the child fault or hang (cut at
    60 s), as the planted ring's. The plain ranks pass the same case (``test_gpu_longest_first_against_fp64``)."""
    _require_items(LONGEST_FIRST_CASES["tied-two-tiles"][0], monkeypatch)
    _assert_planted_caught(tmp_path, "tied-two-tiles", "planted-ties")
