"""gluon/decode's ``BALANCED_PAIR_TILE`` (on): the balanced kernel on a ring of 64-key blocks that two CTAs share an
SM with (``BALANCED_PAIR_CONFIGS``), where that makes "per-slot" plan one wave of shares and the default ring's one
CTA an SM does not (``balanced_pair_tile``; issue #38's ragged row, B=8 Hkv=8 32k D=128: 328 CTAs on 132 slots).

CPU: the switch on and its value; which shapes take the pair ring (the items between a third of the default ring's
slots and a third of the pair's: 45-88 at D=128, one M tile, 132 SMs; contiguous or pages of whole 64-key blocks; not
the padded split, short caches, D 64 or 256) with boundary cases on both sides and sweep rows; the plan it gives the
sweep's ragged row (cute/decode's: 200 shares, one wave of 264 slots) and the rows it leaves; ``bench.decode_knob_ab``'s
spelling of that row; a planted off-by-one in the one-wave rule fails the boundary cases. Static (sm_90a): the pair
build without spills in two CTAs' shared memory and registers, and the switch leaving every build it does not take
instruction for instruction. GPU (``gpu``; ``bench/gluon_balanced_pair_ab.sh``): against fp64 on a poisoned output
with the pair ring checked to be the one launched: the sweep's ragged row itself, a smaller ragged batch with an empty
sequence in fp16, two query tokens, pages of 64, 16 and 32 (``BALANCED_PAIR_SMALL_PAGES``).
"""

from __future__ import annotations

import json

import pytest
import torch

from common.contract import splits
from common.contract.problem import Problem
from common.measure.decode_sweep import decode_cases, random_cases
from tests._helpers import json_from_child
from tests.test_decode_wide import check_on_gpu
from triton_impl.gluon import decode as gluon_decode

CPU = torch.device("cpu")
# An SM's shared memory (sm_90), the 1 KB the driver reserves a CTA, and the registers a thread that let two
# 128-thread CTAs share an SM (65536 / 256).
SM_SHARED_BYTES, CTA_RESERVED_BYTES, REGISTERS_FOR_TWO_CTAS = 233472, 1024, 256


def _problem(batch: int, kv_heads: int, seqlen_k: int, head_dim: int = 128, **changes) -> Problem:
    """A decode step of group 4 (bottom-right causal, ``cache_seqlens`` unless told otherwise)."""
    return Problem(
        batch, kv_heads * changes.pop("group", 4), changes.pop("seqlen_q", 1), seqlen_k, head_dim,
        dtype=changes.pop("dtype", torch.bfloat16), causal=True, kv_heads=kv_heads, causal_alignment="bottom_right",
        has_cache_seqlens=changes.pop("has_cache_seqlens", True), return_lse=True, **changes,
    )  # fmt: skip


def _sweep_ragged():
    """``compare.py --decode``'s ragged row: B=8 H=32 Hkv=8 Sq=1 Sk=32768 D=128, lengths 0..32768."""
    return next(case for case in decode_cases() if case.lengths is not None and not case.problem.paged)


def test_switch_is_on_and_its_ring_holds_two_ctas_an_sm(monkeypatch: pytest.MonkeyPatch):
    assert gluon_decode.BALANCED_PAIR_TILE is True, "on since results/h200/gluon-balanced-pair/ (137.6 -> 120.6 us)"
    pair = gluon_decode.BALANCED_PAIR_CONFIGS[128]
    assert (pair.block_n, pair.num_stages) == (64, 3)
    problem = _sweep_ragged().problem
    assert gluon_decode.split_policy(problem, pair).ctas_per_sm == 2
    assert gluon_decode.split_policy(problem).ctas_per_sm == 1
    assert gluon_decode.balanced_pair_tile(problem, CPU)
    monkeypatch.setattr(gluon_decode, "BALANCED_PAIR_TILE", False)
    assert not gluon_decode.balanced_pair_tile(problem, CPU)
    assert gluon_decode.balanced_config(problem, CPU) == gluon_decode.DEFAULT_CONFIGS[128]


# ----------------------------------------------------------------------------------------------------
# Which shapes take the pair ring
# ----------------------------------------------------------------------------------------------------
# (name, problem, pair ring taken): items B · Hkv at the rule's bounds (44: the default ring's "per-slot" is one wave
# already; 45 and 88: only the pair ring's is; 89: neither), the sweep's ragged row, and what the rule leaves.
SHAPES = [
    ("44 items", _problem(11, 4, 65536), False),
    ("45 items", _problem(15, 3, 65536), True),
    ("88 items", _problem(11, 8, 65536), True),
    ("89 items", _problem(89, 1, 65536), False),
    ("sweep ragged", _sweep_ragged().problem, True),
    ("two query tokens", _problem(8, 8, 65536, seqlen_q=2), True),
    ("pages of 64", _problem(8, 8, 65536, page_size=64), True),
    ("pages of 256", _problem(8, 8, 65536, page_size=256), True),
    ("pages of 32: page chunks", _problem(8, 8, 65536, page_size=32), True),
    ("pages of 48: no chunk divides a pair block", _problem(8, 8, 65520, page_size=48), False),
    ("no cache_seqlens: padded split", _problem(8, 8, 65536, has_cache_seqlens=False), False),
    ("short cache: 64-key tile already", _problem(8, 8, splits.SHORT_CACHE_KEYS), False),
    ("D=64", _problem(8, 8, 65536, head_dim=64), False),
    ("D=256", _problem(8, 8, 65536, head_dim=256), False),
]


def _taken(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    monkeypatch.setattr(gluon_decode, "BALANCED_PAIR_TILE", True)
    return {name: gluon_decode.balanced_pair_tile(problem, CPU) for name, problem, _ in SHAPES}


def test_pair_ring_where_only_it_makes_the_grid_one_wave(monkeypatch: pytest.MonkeyPatch):
    assert _taken(monkeypatch) == {name: taken for name, _, taken in SHAPES}
    for name, problem, taken in SHAPES:
        expected = gluon_decode.BALANCED_PAIR_CONFIGS[128] if taken else gluon_decode.decode_config(problem)
        assert gluon_decode.balanced_config(problem, CPU) == expected, name


def _strict_one_wave(slots: int, items: int) -> bool:
    """Planted: a third of the slots no longer counted as one wave."""
    return items < slots * splits.ONE_WAVE_ITEMS_FRACTION


def test_planted_off_by_one_rule_fails_the_boundaries(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(splits, "per_slot_one_wave", _strict_one_wave)
    taken = _taken(monkeypatch)
    assert taken != {name: expected for name, _, expected in SHAPES}
    assert taken["44 items"] and not taken["88 items"], "both boundaries should move under the planted rule"


def test_pair_plan_of_the_sweep_ragged_row_is_one_wave(monkeypatch: pytest.MonkeyPatch):
    """Off: 264 shares of 26 128-key blocks + 64 items on 132 slots (2.5 waves); on: cute/decode's plan, 200 shares of
    at most 72 64-key blocks + 64 items on 264 slots."""
    from bench.decode_ragged_ab import plan_of

    case = _sweep_ragged()
    monkeypatch.setattr(gluon_decode, "BALANCED_PAIR_TILE", False)
    off = plan_of("gluon/decode", case.problem, case.lengths, CPU)
    assert off == ("balanced", 264, (10, 1, 5, 3, 9, 1, 7, 1))
    monkeypatch.setattr(gluon_decode, "BALANCED_PAIR_TILE", True)
    on = plan_of("gluon/decode", case.problem, case.lengths, CPU)
    assert on == ("balanced", 200, (8, 1, 4, 2, 7, 1, 5, 1))
    items = case.problem.batch * case.problem.kv_heads
    pair = gluon_decode.balanced_config(case.problem, CPU)
    slots = gluon_decode.split_policy(case.problem, pair).ctas_per_sm * splits.DEFAULT_SM_COUNT
    assert on[1] + items == slots == 264


# Sweep rows (seed/index) the switch moves (45-88 items at D=128, contiguous or in pages; 59/1: pages of 16, with
# BALANCED_PAIR_SMALL_PAGES) and leaves (53/7: 128 items; 59/4: 32; 89/1: 4).
SWEEP_ROWS = {(53, 6): True, (91, 3): True, (83, 7): True, (57, 3): True, (67, 5): True, (59, 1): True,
              (53, 7): False, (59, 4): False, (89, 1): False}  # fmt: skip


def test_sweep_rows_it_moves_and_leaves(monkeypatch: pytest.MonkeyPatch):
    from bench.decode_ragged_ab import plan_of

    for (seed, index), moves in SWEEP_ROWS.items():
        case = random_cases(8, seed)[index]
        monkeypatch.setattr(gluon_decode, "BALANCED_PAIR_TILE", False)
        off = plan_of("gluon/decode", case.problem, case.lengths, CPU)
        monkeypatch.setattr(gluon_decode, "BALANCED_PAIR_TILE", True)
        on = plan_of("gluon/decode", case.problem, case.lengths, CPU)
        assert gluon_decode.balanced_pair_tile(case.problem, CPU) == moves, f"{seed}/{index}"
        assert (on != off) == moves, f"{seed}/{index}: {off} -> {on}"


def test_knob_ab_spells_the_sweep_ragged_row():
    from bench.decode_knob_ab import parse_row

    _, case = parse_row("73/3:seqlen_k=32768,head_dim=128,ragged")
    expected = _sweep_ragged()
    assert (case.problem, case.lengths) == (expected.problem, expected.lengths)
    with pytest.raises(SystemExit, match="a batch of"):
        parse_row("73/3:batch=4,ragged")


def test_ab_script_rows_parse_and_the_row_comes_first(monkeypatch: pytest.MonkeyPatch):
    """bench/gluon_balanced_pair_ab.sh's knob rows: each parses, the sweep's ragged row first, and the switch moves
    exactly the rows ``SWEEP_ROWS`` says it moves (a typo there would cost a device call)."""
    import shlex
    from pathlib import Path

    from bench.decode_knob_ab import parse_row

    script = (Path(__file__).parents[1] / "bench" / "gluon_balanced_pair_ab.sh").read_text()
    shape = script.split("\nSHAPE=", 1)[1].split("\n", 1)[0]
    knob_line = script.split("\nknob_ab pair ", 1)[1].split("\ndecode_with_knob", 1)[0]
    words = shlex.split(knob_line.replace("\\\n", " ").replace("$SHAPE", shape))
    assert words[2:4] == ["False,True", "gluon/decode"], words
    rows = {text: parse_row(text)[1] for text in words[4:]}
    first, expected = rows[words[4]], _sweep_ragged()
    assert (first.problem, first.lengths) == (expected.problem, expected.lengths)
    monkeypatch.setattr(gluon_decode, "BALANCED_PAIR_TILE", True)
    moved = {text: gluon_decode.balanced_pair_tile(case.problem, CPU) for text, case in rows.items()}
    # The shape's rows: ragged (moved) and full (the padded split); the others as SWEEP_ROWS says.
    expected_moves = {
        text: text.endswith(",ragged") if ":" in text else SWEEP_ROWS[tuple(map(int, text.split("/")))]
        for text in words[4:]
    }
    assert moved == expected_moves


# ----------------------------------------------------------------------------------------------------
# sm_90a: two CTAs an SM, no spills; the builds the switch does not take unchanged
# ----------------------------------------------------------------------------------------------------
_SCRIPT = r"""
import hashlib, json, sys
from common.measure.decode_sweep import decode_cases
from common.reporting.static import cubin_resources, cubin_sass
from triton_impl.gluon import decode

cases = decode_cases()
rows = {
    "ragged": next(c for c in cases if c.lengths is not None and not c.problem.paged).problem,
    "full": next(c for c in cases if c.lengths is None and c.problem.batch == 8 and c.problem.seqlen_k == 32768
                 and c.problem.kv_heads == 8).problem,
    "paged16": next(c for c in cases if c.problem.paged).problem,
}
results = []
for name, pair, small_pages in json.loads(sys.argv[1]):
    decode.BALANCED_PAIR_TILE, decode.BALANCED_PAIR_SMALL_PAGES = pair, small_pages
    (binary,) = decode.compile_sm90(rows[name])
    (usage,) = cubin_resources(binary.cubin).values()
    config = decode.balanced_config(rows[name])
    results.append({"registers": usage["registers"], "spill_bytes": usage["local_bytes"] + usage["stack_bytes"],
                    "shared_bytes": binary.shared_bytes, "block_n": config.block_n,
                    "load_warp": decode.load_warp(rows[name], config),
                    "sass": hashlib.sha256(cubin_sass(binary.cubin).encode()).hexdigest()})
print(json.dumps(results))
"""


def _compiled(keys: list[list]) -> dict[tuple, dict]:
    """``_SCRIPT``'s facts of each (row, BALANCED_PAIR_TILE, BALANCED_PAIR_SMALL_PAGES) build, by key."""
    facts = json_from_child(["-c", _SCRIPT, json.dumps(keys)], timeout=900)
    return dict(zip(map(tuple, keys), facts, strict=True))


@pytest.mark.static
def test_pair_build_fits_two_ctas_an_sm_and_leaves_the_others():
    # The pair tile's own switch: pages of 16 stay on the default ring (BALANCED_PAIR_SMALL_PAGES has its test below).
    compiled = _compiled([[name, pair, False] for name in ("ragged", "full", "paged16") for pair in (False, True)])
    compiled = {key[:2]: facts for key, facts in compiled.items()}
    for key, facts in compiled.items():
        assert facts["spill_bytes"] == 0, (key, facts)
    pair, default = compiled["ragged", True], compiled["ragged", False]
    assert SM_SHARED_BYTES // (pair["shared_bytes"] + CTA_RESERVED_BYTES) == 2, pair
    assert pair["registers"] <= REGISTERS_FOR_TWO_CTAS, pair
    assert SM_SHARED_BYTES // (default["shared_bytes"] + CTA_RESERVED_BYTES) == 1, default
    assert pair["sass"] != default["sass"]
    for name in ("full", "paged16"):
        assert compiled[name, True]["sass"] == compiled[name, False]["sass"], f"the switch changed the {name} build"


# ----------------------------------------------------------------------------------------------------
# GPU: the pair ring against fp64
# ----------------------------------------------------------------------------------------------------
# name -> (problem, lengths): the sweep's ragged row, a smaller ragged batch (fp16, an empty sequence, one of a single
# key), two query tokens, pages of 64.
GPU_CASES = {
    "sweep-ragged": (_sweep_ragged().problem, _sweep_ragged().lengths),
    "fp16-empty": (_problem(8, 8, 16384, dtype=torch.float16), (16384, 0, 1, 9000, 127, 12289, 64, 3000)),
    "sq2": (_problem(8, 8, 16384, seqlen_q=2), (2, 16384, 777, 10001, 5000, 129, 15999, 63)),
    "paged64": (_problem(8, 8, 16384, page_size=64), (16000, 65, 4097, 12000, 0, 8191, 300, 16384)),
    # BALANCED_PAIR_SMALL_PAGES: page chunks copied by the warpgroup, sequences ending inside a page.
    "paged16": (_problem(8, 8, 16384, page_size=16), (16384, 0, 17, 9000, 127, 12289, 64, 3001)),
    "paged32-sq2": (_problem(8, 8, 16384, seqlen_q=2, page_size=32), (2, 16384, 777, 10001, 5000, 129, 15999, 63)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gpu_pair_ring_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    problem, lengths = GPU_CASES[case]
    device = torch.device("cuda")
    monkeypatch.setattr(gluon_decode, "BALANCED_PAIR_TILE", True)
    monkeypatch.setattr(gluon_decode, "BALANCED_PAIR_SMALL_PAGES", True)
    if not gluon_decode.balanced_pair_tile(problem, device):
        pytest.skip(f"the pair ring does not apply to {case} on this GPU's SM count")
    result = check_on_gpu("gluon/decode", problem, lengths, seed=len(case))
    assert result.ok, f"gluon/decode BALANCED_PAIR_TILE {problem.describe()}: {result.summary()}"


@pytest.mark.gpu
def test_gpu_launch_takes_the_pair_ring(monkeypatch: pytest.MonkeyPatch):
    """The bound launch of the sweep's ragged row: 64-key blocks, three stages, one wave of the pair's slots."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from common.contract.inputs import make_inputs

    problem, lengths = GPU_CASES["sweep-ragged"]
    device = torch.device("cuda")
    monkeypatch.setattr(gluon_decode, "BALANCED_PAIR_TILE", True)
    if not gluon_decode.balanced_pair_tile(problem, device):
        pytest.skip("the pair ring does not apply to the sweep's ragged row on this GPU's SM count")
    q, k, v = make_inputs(problem, seed=0, device="cuda")
    run = gluon_decode.bind(q, k, v, problem, cache_seqlens=torch.tensor(lengths, dtype=torch.int32, device=device))
    assert (run.split_options["BLOCK_N"], run.split_options["NUM_STAGES"]) == (64, 3)
    slots = 2 * splits.sm_count(device)
    assert run.split_grid == (1, slots), run.split_grid


# ----------------------------------------------------------------------------------------------------
# BALANCED_PAIR_SMALL_PAGES (on): pages smaller than a pair block on the pair ring, copied by the warpgroup
# ----------------------------------------------------------------------------------------------------
def _paged_full(page_size: int) -> Problem:
    """The default run's paged row (B=8 Hkv=8 32k D=128, full lengths as cache_seqlens) in pages of ``page_size``."""
    return _problem(8, 8, 32768 if page_size != 48 else 32640, page_size=page_size)


def test_small_pages_take_the_pair_ring_without_a_load_warp(monkeypatch: pytest.MonkeyPatch):
    """Off: pages of 16 and 32 keep the default ring's load warp. On (the default): pages dividing the 64-key block
    take the pair ring, copied in chunks of a page by the warpgroup (two CTAs an SM leave no room for a load warp); 48
    (not a divisor) stays on the default ring, and the items' rule still decides (seed 59's row 1 moves, 89 items do
    not)."""
    assert gluon_decode.BALANCED_PAIR_SMALL_PAGES is True, "on since results/h200/gluon-pair-small-pages/"
    pair = gluon_decode.BALANCED_PAIR_CONFIGS[128]
    monkeypatch.setattr(gluon_decode, "BALANCED_PAIR_SMALL_PAGES", False)
    for page_size in (16, 32, 48):
        problem = _paged_full(page_size)
        assert not gluon_decode.balanced_pair_tile(problem, CPU) and gluon_decode.load_warp(problem)
    monkeypatch.setattr(gluon_decode, "BALANCED_PAIR_SMALL_PAGES", True)
    for page_size, taken in ((16, True), (32, True), (48, False), (64, True), (0, True)):
        problem = _paged_full(page_size)
        assert gluon_decode.balanced_pair_tile(problem, CPU) == taken, page_size
        config = gluon_decode.balanced_config(problem, CPU)
        if taken and page_size:
            assert config == pair and not gluon_decode.load_warp(problem, config)
            assert gluon_decode.kv_chunk_rows(problem, config) == min(page_size, pair.block_n)
    assert gluon_decode.balanced_pair_tile(random_cases(8, 59)[1].problem, CPU)
    assert not gluon_decode.balanced_pair_tile(_problem(89, 1, 65536, page_size=16), CPU)


@pytest.mark.static
def test_small_pages_pair_build_fits_two_ctas_an_sm():
    (facts,) = _compiled([["paged16", True, True]]).values()
    assert facts["block_n"] == 64 and not facts["load_warp"], facts
    assert facts["spill_bytes"] == 0 and facts["registers"] <= REGISTERS_FOR_TWO_CTAS, facts
    assert SM_SHARED_BYTES // (facts["shared_bytes"] + CTA_RESERVED_BYTES) == 2, facts
