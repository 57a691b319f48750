"""Issue #38's packed rows at D=128 in cute/decode: ``decode.WGMMA_TWO_WARPGROUPS`` puts two of the WGMMA tile's 64-row
M tiles in one CTA of two warpgroups sharing one K/V ring (``cute_impl/_decode_wgmma.py``, "Two warpgroups"), in the
padded split. This file tests the mechanism as it was built and timed: every test starts from the switch off, from two
tiles' rows (128) and no upper bound, with the packed prefill off (the fixture below); the defaults (on for 65-127
rows) are ``tests/test_cute_decode_two_wg_default.py``'s.

CPU: off, every sweep row of seeds 1-239 keeping the one-warpgroup plan; on, seed 233 row 5's compile key is
128 rows, 8 warps and the 6-stage overlapped ring, the split rule is fed the halved M tiles (rounded up: odd tiles) and
one CTA an SM (the Q and ring bytes fit one and not two), the split count staying; the balanced split, 64-row tiles,
D=64 and the mma.sync tiles keep their plans; bench/cute_decode_two_wg_ab.sh's rows parse and the switch moves exactly
its first ten. Static (sm_90a): seed 233 row 5 and a paged ragged 256-row shape (forced onto the padded split) compile
without spills, 256 threads of one CTA an SM, a key loop of two overlapped blocks' HGMMA and no mma.sync; off
(planted: the one-warpgroup tile) the rule fails. GPU (``gpu`` marker; bench/cute_decode_two_wg_ab.sh): on, against
fp64 on a poisoned output; the planted rows bug (a CTA's rows taken in 64-row tiles) must fail the check.

``decode.TWO_WARPGROUP_MIN_ROWS`` (helper twg65; 65 by default since 2026-12-06): CPU, on at 65, seed 1206 row 1 (80
packed rows, 8 padded splits) is one two-warpgroup CTA a (pair, split), the split rule fed one CTA along M and one CTA
an SM, its split count staying; at 128 it keeps two one-warpgroup CTAs; 64 rows never take it, whatever the constant;
of the sweep's rows of 65-127 packed rows at D=128 (all 80 rows), 65 moves the eight on the padded split, their split
counts staying; planted, a rule that ignores the constant or drops the one-tile guard fails; the A/B script's rows
parse and 65 moves exactly its first seven. Static: seed 1206 row 1 compiles as above. GPU: 80 rows, full and ragged.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("cutlass")

from common.contract import splits
from common.measure.decode_sweep import random_cases
from common.reporting.static import cubin_sass, loop_census
from cute_impl import _decode_wgmma, decode
from tests._helpers import knob_ab_problems
from tests.test_cute_decode_rows import RAGGED, _problem
from tests.test_cute_decode_wgmma import assert_planted_bug_fails, check_gpu_case, compile_with_shared_bytes
from tests.test_cute_decode_wide_tile import (
    CTA_RESERVED_SHARED_BYTES,
    SM_SHARED_BYTES,
    _ring_and_q_bytes,
    assert_kernels_fit,
)

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _split_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """This switch acts on the split kernels; the packed prefill (on by default since 2026-12-05) takes the contiguous
    rows of 128+ packed rows, so it is off here and every row keeps the plan the switch was measured on. The switch
    starts off, from two tiles' rows, with no upper bound: the mechanism as built, whatever the defaults. Short ragged
    caches keep the balanced split they were measured on (``SHORT_CACHE_ONE_SPLIT`` off, as until 2026-12-06)."""
    monkeypatch.setattr(decode, "PACKED_PREFILL_MIN_ROWS", None)
    monkeypatch.setattr(decode, "SHORT_CACHE_ONE_SPLIT", False)
    monkeypatch.setattr(decode, "WGMMA_TWO_WARPGROUPS", False)
    monkeypatch.setattr(decode, "TWO_WARPGROUP_MIN_ROWS", 2 * decode.WARPGROUP_ROWS)
    monkeypatch.setattr(decode, "TWO_WARPGROUP_MAX_ROWS", None)


SEED233_ROW5 = random_cases(8, 233)[5].problem  # B=4 H=512 Hkv=32 Sq=16 Sk=22016 D=128: 256 packed rows, full cache
# 256 packed rows (group 16, Sq 16), paged(64) and ragged: the balanced split by default.
PAGED_RAGGED = _problem(16, 8, 16, 16, 2048, 128, has_cache_seqlens=True, page_size=64)
ODD_TILES = _problem(4, 8, 12, 16, 8192, 128)  # 192 packed rows: three 64-row tiles, two CTAs


def _plan(problem, on: bool, balanced: str | None = None) -> tuple:
    """The launch plan and the padded split's CTAs along M with ``WGMMA_TWO_WARPGROUPS`` at ``on``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decode, "WGMMA_TWO_WARPGROUPS", on)
        if balanced is not None:
            patch.setattr(decode, "BALANCED_SPLIT", balanced)
        return (*decode.launch_plan(problem, CPU), decode.padded_m_blocks(problem, CPU))


def test_off_no_sweep_row_takes_it():
    assert decode.TWO_WARPGROUP_RINGS == {128: 6}
    rows = [case.problem for seed in range(1, 240) for case in random_cases(8, seed)]
    assert not any(decode.launch_plan(problem, CPU)[3].two_warpgroups for problem in rows)
    assert all(decode.padded_m_blocks(problem, CPU) == decode.m_blocks_for(problem) for problem in rows)


def test_on_is_two_tiles_a_cta_and_feeds_the_rule_half(monkeypatch: pytest.MonkeyPatch):
    """Seed 233 row 5: 128 rows on 8 warps (each its 16 rows, all keys), the overlapped 6-stage ring; the padded rule
    sees 2 CTAs along M (4 tiles) and one CTA an SM, and its split count is the one-warpgroup plan's (slots and CTAs
    both halved)."""
    off, on = _plan(SEED233_ROW5, False), _plan(SEED233_ROW5, True)
    config = on[3]
    assert config.two_warpgroups and config.wgmma and config.wgmma_overlap, config
    assert (config.tile_m, config.shape.num_warps, config.row_warps, config.shape.stages) == (128, 8, 8, 6), config
    assert (off[4], on[4]) == (4, 2) and on[:3] == off[:3]
    unchanged = dataclasses.replace(config, tile_m=64, shape=off[3].shape, row_warps=4, two_warpgroups=False)
    assert unchanged == dataclasses.replace(off[3], wgmma_overlap=True)
    calls = []
    real = splits.planned_num_splits
    monkeypatch.setattr(splits, "planned_num_splits", lambda *args: calls.append(args) or real(*args))
    monkeypatch.setattr(decode, "WGMMA_TWO_WARPGROUPS", True)
    decode.launch_plan(SEED233_ROW5, CPU)
    _, m_blocks, _, policy = calls[-1]  # the padded split's count (before it, the balanced question's, unchanged)
    assert (m_blocks, policy.ctas_per_sm) == (2, 1), calls
    assert isinstance(decode.decode_kernel(config), _decode_wgmma.WgmmaDecodeKernel)


def test_the_balanced_question_stays_and_one_sweep_row_splits_more():
    """Whether to balance is asked of the one-warpgroup plan, so no row changes split kind; of the sweep's 32 rows the
    switch takes, only 69/4 (B=32 Hkv=32 Sq=8 ragged, 128 rows) gets another split count from the halved input: 2,
    not 1."""
    rows = {(seed, i): case.problem for seed in range(1, 240) for i, case in enumerate(random_cases(8, seed))}
    moved = {key: (_plan(p, False), _plan(p, True)) for key, p in rows.items() if _plan(p, True)[3].two_warpgroups}
    assert len(moved) == 32
    assert all(_plan(p, True)[:4] == _plan(p, False)[:4] for key, p in rows.items() if key not in moved)
    assert all((on[1], on[2]) == (off[1], off[2]) == (None, on[2]) for off, on in moved.values())
    assert {key for key, (off, on) in moved.items() if on[0] != off[0]} == {(69, 4)}
    assert (moved[69, 4][0][0], moved[69, 4][1][0]) == (1, 2)


def test_odd_tiles_round_up_to_a_half_empty_cta():
    off, on = _plan(ODD_TILES, False), _plan(ODD_TILES, True)
    assert on[3].two_warpgroups and (off[4], on[4]) == (3, 2)


def test_the_ask_is_the_one_cta_that_fits():
    config = _plan(SEED233_ROW5, True)[3]
    cta_bytes = _ring_and_q_bytes(config) + CTA_RESERVED_SHARED_BYTES
    assert cta_bytes <= SM_SHARED_BYTES < 2 * cta_bytes, cta_bytes
    assert decode.split_policy(SEED233_ROW5, two_warpgroups=True).ctas_per_sm == decode.TWO_WARPGROUP_CTAS_PER_SM == 1
    assert decode.split_policy(SEED233_ROW5).ctas_per_sm == decode.WGMMA_SPLIT_CTAS_PER_SM == 2


# Problems the switch leaves: the balanced split (one warpgroup), 64-row and 80-row tiles (one tile a CTA at most),
# D=64's 128 rows (not in TWO_WARPGROUP_RINGS), D=256's 256 rows and a 16-row mma.sync row.
LEFT = {
    "d128-256rows-paged64-balanced": PAGED_RAGGED,
    "d128-64rows-paged32-balanced": random_cases(8, 59)[2].problem,
    "d128-80rows": _problem(2, 2, 16, 5, 8192, 128),
    "d64-128rows": _problem(2, 4, 8, 16, 32768, 64),
    "d256-256rows": random_cases(8, 229)[2].problem,
    "d128-16rows": _problem(4, 8, 4, 4, 8192, 128),
}


@pytest.mark.parametrize("case", sorted(LEFT))
def test_on_leaves_other_plans(case: str):
    """Their launch plans (the balanced one's padded M extent, which only decides whether to balance, may halve)."""
    assert _plan(LEFT[case], True)[:4] == _plan(LEFT[case], False)[:4]


def test_ab_script_rows_parse_and_the_switch_moves_the_first_ten():

    script = (Path(__file__).parents[1] / "bench" / "cute_decode_two_wg_ab.sh").read_text()
    assert "gpu_tests 120 tests/test_cute_decode_two_wg.py" in script
    head, rows = knob_ab_problems("cute_decode_two_wg_ab.sh", "two_wg")
    assert head == ["150", "cute_impl.decode:WGMMA_TWO_WARPGROUPS", "False,True", "cute/decode"], head
    assert rows[0] == SEED233_ROW5
    assert [_plan(problem, True) != _plan(problem, False) for problem in rows] == [True] * 10 + [False] * 2


# ----------------------------------------------------------------------------------------------------
# TWO_WARPGROUP_MIN_ROWS: from 65 packed rows (one CTA, its second warpgroup part padding); one tile's rows never
# ----------------------------------------------------------------------------------------------------
SEED1206_ROW1 = random_cases(8, 1206)[1].problem  # B=8 H=10 Hkv=2 Sq=16 Sk=66304 D=128: 80 packed rows, full cache
SIXTY_FOUR_ROWS = random_cases(8, 75)[0].problem  # B=8 H=8 Hkv=2 Sq=16 Sk=108800 D=128: 64 packed rows, full cache
# The sweep's (seed, row)s of 65-127 packed rows at D=128 on the padded split (full caches, all 80 rows).
MOVED_80_ROWS = [(85, 1), (97, 7), (95, 4), (56, 0), (186, 2), (138, 1), (117, 7), (132, 7)]


def _plan_from(problem, min_rows: int, on: bool = True) -> tuple:
    """:func:`_plan` with ``TWO_WARPGROUP_MIN_ROWS`` at ``min_rows``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decode, "TWO_WARPGROUP_MIN_ROWS", min_rows)
        return _plan(problem, on)


def assert_one_two_warpgroup_cta(problem) -> None:
    """On at 65: ``problem`` (65-127 packed rows) is one CTA along M of 128 rows on 8 warps and the overlapped
    6-stage ring, where off it is two one-warpgroup CTAs; the split count and kind stay."""
    off, on = _plan_from(problem, 65, on=False), _plan_from(problem, 65)
    config = on[3]
    assert config.two_warpgroups and config.wgmma_overlap, config
    assert (config.tile_m, config.shape.num_warps, config.row_warps, config.shape.stages) == (128, 8, 8, 6), config
    assert (off[4], on[4]) == (2, 1) and on[:3] == off[:3], (off, on)


def assert_one_tile_keeps_one_warpgroup(problem) -> None:
    """On, with the constant at 1 (every row count): ``problem``'s one 64-row tile keeps its one-warpgroup CTA."""
    assert _plan_from(problem, 1) == _plan_from(problem, 1, on=False)


def test_from_two_tiles_rows_seed1206_row1_keeps_two_ctas():
    assert decode.TWO_WARPGROUP_MIN_ROWS == 2 * decode.WARPGROUP_ROWS == 128
    assert not _plan(SEED1206_ROW1, True)[3].two_warpgroups and _plan(SEED1206_ROW1, True)[4] == 2


def test_from_65_rows_seed1206_row1_is_one_cta_and_feeds_the_rule_half(monkeypatch: pytest.MonkeyPatch):
    """Seed 1206 row 1 (80 rows): one two-warpgroup CTA a (pair, split), 8 splits as before; the padded rule sees one
    CTA along M (two tiles) and one CTA an SM."""
    assert (SEED1206_ROW1.kv_group * SEED1206_ROW1.seqlen_q, decode.m_blocks_for(SEED1206_ROW1)) == (80, 2)
    assert_one_two_warpgroup_cta(SEED1206_ROW1)
    assert _plan_from(SEED1206_ROW1, 65)[:2] == (8, None)
    calls = []
    real = splits.planned_num_splits
    monkeypatch.setattr(splits, "planned_num_splits", lambda *args: calls.append(args) or real(*args))
    monkeypatch.setattr(decode, "WGMMA_TWO_WARPGROUPS", True)
    monkeypatch.setattr(decode, "TWO_WARPGROUP_MIN_ROWS", 65)
    decode.launch_plan(SEED1206_ROW1, CPU)
    _, m_blocks, _, policy = calls[-1]
    assert (m_blocks, policy.ctas_per_sm) == (1, 1), calls


def test_one_tile_never_takes_it():
    assert decode.m_blocks_for(SIXTY_FOUR_ROWS) == 1 and decode.wgmma_tile(SIXTY_FOUR_ROWS, CPU)
    assert_one_tile_keeps_one_warpgroup(SIXTY_FOUR_ROWS)
    assert not _plan_from(SIXTY_FOUR_ROWS, 65)[3].two_warpgroups


def _ignores_the_constant(problem, device) -> bool:
    """Planted: the rule as it was, two tiles' rows (128) whatever TWO_WARPGROUP_MIN_ROWS says."""
    rows = problem.kv_group * problem.seqlen_q
    return decode.WGMMA_TWO_WARPGROUPS and rows >= 2 * decode.WARPGROUP_ROWS and decode.wgmma_tile(problem, device)


def _no_one_tile_guard(problem, device) -> bool:
    """Planted: the constant alone, so that a 64-row tile takes a CTA whose second warpgroup is all padding."""
    rows = problem.kv_group * problem.seqlen_q
    return decode.WGMMA_TWO_WARPGROUPS and rows >= decode.TWO_WARPGROUP_MIN_ROWS and decode.wgmma_tile(problem, device)


@pytest.mark.parametrize(
    ("planted", "check", "problem"),
    [(_ignores_the_constant, assert_one_two_warpgroup_cta, SEED1206_ROW1),
     (_no_one_tile_guard, assert_one_tile_keeps_one_warpgroup, SIXTY_FOUR_ROWS)],
    ids=["ignores-the-constant", "no-one-tile-guard"],
)  # fmt: skip
def test_planted_rules_fail(planted, check, problem, monkeypatch: pytest.MonkeyPatch):
    check(problem)
    monkeypatch.setattr(decode, "two_warpgroup_tile", planted)
    with pytest.raises(AssertionError):
        check(problem)


def test_from_65_rows_the_sweep_moves_the_eight_padded_80_row_rows():
    """Of the sweep's rows of 65-127 packed rows at D=128 (seeds 1-239: twenty, all 80 rows, group 5 x Sq 16), 65
    moves the eight on the padded split (full caches), each one CTA along M with its split count; the twelve with
    cache lengths keep the balanced split and their plans."""
    rows = {
        (seed, i): case.problem
        for seed in range(1, 240)
        for i, case in enumerate(random_cases(8, seed))
        if case.problem.head_dim == 128 and 64 < case.problem.kv_group * case.problem.seqlen_q < 128
    }
    assert len(rows) == 20 and {p.kv_group * p.seqlen_q for p in rows.values()} == {80}
    moved = {key for key, p in rows.items() if _plan_from(p, 65)[:4] != _plan_from(p, 65, on=False)[:4]}
    assert moved == set(MOVED_80_ROWS), sorted(moved)
    for key in moved:
        assert_one_two_warpgroup_cta(rows[key])
    assert all(_plan_from(p, 65)[1] is not None for key, p in rows.items() if key not in moved)


def test_rows_ab_script_rows_parse_and_65_moves_the_first_seven():
    script = (Path(__file__).parents[1] / "bench" / "cute_decode_two_wg_rows_ab.sh").read_text()
    assert "gpu_tests 120 tests/test_cute_decode_two_wg.py" in script
    assert 'export KNOB_AB_SET="cute_impl.decode:TWO_WARPGROUP_MIN_ROWS=65"' in script
    head, rows = knob_ab_problems("cute_decode_two_wg_rows_ab.sh", "two_wg_rows")
    assert head == ["150", "cute_impl.decode:WGMMA_TWO_WARPGROUPS", "False,True", "cute/decode"], head
    assert rows[0] == SEED1206_ROW1 and rows[-1] == SIXTY_FOUR_ROWS
    assert [_plan_from(p, 65)[:4] != _plan_from(p, 65, on=False)[:4] for p in rows] == [True] * 7 + [False] * 2
    assert not any(_plan_from(p, 128)[:4] != _plan_from(p, 128, on=False)[:4] for p in rows)


# ----------------------------------------------------------------------------------------------------
# sm_90a: on, no spills, one CTA of 256 threads an SM, a key loop of HGMMA; off (planted), the rule fails
# ----------------------------------------------------------------------------------------------------
def assert_two_warpgroup_key_loop(binary, sass: str, config: decode.DecodeConfig, label: str) -> None:
    """The split kernel is one CTA of two warpgroups whose key loop runs two overlapped blocks on WGMMA: each block's
    S is D/16 wgmma of 64 x 64 x 16 and its P V 64/16 of 64 x D x 16 (each warpgroup issues its own), with no
    mma.sync and no ldmatrix anywhere."""
    census = loop_census(sass)
    expected = 2 * (config.head_dim // 16 + config.shape.tile_n // 16)
    print(f"WGMMA_TWO_WARPGROUPS {label}: {binary.threads_per_cta} threads, {census}")
    assert binary.threads_per_cta == 256, (label, binary.threads_per_cta)
    assert census is not None and census.gmma == expected, (label, census)
    assert not re.search(r"\bHMMA\.|\bLDSM\b", sass), f"{label}: the split kernel's tile must not use mma.sync"


# name -> (problem, BALANCED_SPLIT or None: the default, TWO_WARPGROUP_MIN_ROWS)
COMPILED = {
    "seed233-row5": (SEED233_ROW5, None, 128),
    "paged64-ragged-padded": (PAGED_RAGGED, "never", 128),
    "seed1206-row1-80rows": (SEED1206_ROW1, None, 65),
}


@pytest.mark.cute_compile
@pytest.mark.parametrize("shape", sorted(COMPILED))
def test_on_compiles_spill_free_on_hgmma(shape: str, monkeypatch: pytest.MonkeyPatch):
    problem, balanced, min_rows = COMPILED[shape]
    monkeypatch.setattr(decode, "WGMMA_TWO_WARPGROUPS", True)
    monkeypatch.setattr(decode, "TWO_WARPGROUP_MIN_ROWS", min_rows)
    if balanced is not None:
        monkeypatch.setattr(decode, "BALANCED_SPLIT", balanced)
    config = decode.compile_plan(problem, split=True)
    assert config.two_warpgroups and config.wgmma_overlap and not config.balanced_min_blocks, config
    binary, shared = compile_with_shared_bytes(problem, monkeypatch)
    label = problem.describe()
    assert shared == _ring_and_q_bytes(config), (label, shared)
    assert_kernels_fit(binary, decode.TWO_WARPGROUP_CTAS_PER_SM, f"WGMMA_TWO_WARPGROUPS {label}", shared)
    assert_two_warpgroup_key_loop(binary, cubin_sass(binary.cubin), config, label)


@pytest.mark.cute_compile
def test_planted_one_warpgroup_tile_fails_the_key_loop_rule():
    """Off, seed 233 row 5 compiles the one-warpgroup tile (128 threads, the one chain a block): the rule must fail."""
    config = decode.compile_plan(SEED233_ROW5, split=True)
    assert config.wgmma and not config.two_warpgroups
    (binary,) = decode.compile_sm90(SEED233_ROW5, split=True)
    with pytest.raises(AssertionError):
        assert_two_warpgroup_key_loop(binary, cubin_sass(binary.cubin), config, "planted: one warpgroup")


# ----------------------------------------------------------------------------------------------------
# GPU: on, against fp64; a planted rows bug
# ----------------------------------------------------------------------------------------------------
# name -> (problem, lengths, forced splits, BALANCED_SPLIT); every case has 80 or 128+ packed rows at D=128 and the
# padded split (the balanced split keeps one warpgroup), the LSE returned; TWO_WARPGROUP_MIN_ROWS at 65 for all (the
# 128+ rows take the CTA at either value; 80 rows: one CTA, 48 of its second warpgroup's 64 rows padding).
GPU_CASES = {
    "80rows-g5-sq16-full-rule": (_problem(2, 2, 5, 16, 2048, 128), None, None, "never"),
    "80rows-g5-sq16-ragged-split": (_problem(4, 2, 5, 16, 1024, 128, has_cache_seqlens=True), RAGGED, 2, "never"),
    "256rows-g16-sq16-full-split": (_problem(2, 2, 16, 16, 2048, 128), None, 3, "never"),
    "256rows-g16-sq16-full-rule": (_problem(2, 2, 16, 16, 2048, 128), None, None, "never"),
    "128rows-g8-sq16-ragged-split": (_problem(4, 2, 8, 16, 1024, 128, has_cache_seqlens=True), RAGGED, 2, "never"),
    "192rows-g12-sq16-paged16-split": (_problem(4, 2, 12, 16, 1024, 128, has_cache_seqlens=True, page_size=16), RAGGED,
                                       3, "never"),
    "256rows-g16-sq16-paged64-rule": (_problem(4, 2, 16, 16, 1024, 128, has_cache_seqlens=True, page_size=64), RAGGED,
                                      None, "never"),
    "320rows-g40-sq8-paged64-split": (_problem(2, 1, 40, 8, 1024, 128, has_cache_seqlens=True, page_size=64),
                                      (1000, 333), 2, "never"),
    "128rows-g16-sq8-top-left": (_problem(2, 2, 16, 8, 1000, 128).with_(causal_alignment="top_left"), None, 2, "never"),
    "128rows-g16-sq8-unsplit": (_problem(2, 2, 16, 8, 777, 128), None, 1, "never"),
}  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gpu_two_warpgroups_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("WGMMA needs sm_90")
    monkeypatch.setattr(decode, "TWO_WARPGROUP_MIN_ROWS", 65)
    check_gpu_case(case, GPU_CASES[case], monkeypatch, ("WGMMA_TWO_WARPGROUPS", True), "two_warpgroups")


class _OneTileRows(_decode_wgmma.WgmmaDecodeKernel):
    """Planted: the CTA's rows start at m_block · 64 (one warpgroup's tile), so the second CTA stores its first
    warpgroup's rows over the first CTA's second and rows 192-255 are never written."""

    def merge_warps_and_store(
        self, sO_parts: Any, sLSE_parts: Any, gO: Any, gLSE: Any, row_start: Any, rows: Any, tidx: Any
    ) -> None:
        super().merge_warps_and_store(sO_parts, sLSE_parts, gO, gLSE, row_start // 2, rows, tidx)


def assert_planted_one_tile_rows_fail(case: tuple, monkeypatch: pytest.MonkeyPatch, switch: tuple, label: str) -> None:
    """``case`` (two CTAs along M: 256 rows, the upper bound and the packed prefill off) passes with decode's
    ``switch`` set, and fails with the CTA's rows taken in 64-row tiles (:class:`_OneTileRows`)."""
    monkeypatch.setattr(decode, "TWO_WARPGROUP_MAX_ROWS", None)
    monkeypatch.setattr(decode, "PACKED_PREFILL_MIN_ROWS", None)
    assert_planted_bug_fails(case, monkeypatch, switch, (_decode_wgmma, "WgmmaDecodeKernel", _OneTileRows), label)


@pytest.mark.gpu
def test_gpu_planted_one_tile_rows_fail_the_check(monkeypatch: pytest.MonkeyPatch):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("WGMMA needs sm_90")
    planted = (_decode_wgmma, "WgmmaDecodeKernel", _OneTileRows)
    case = GPU_CASES["256rows-g16-sq16-full-split"]
    assert_planted_bug_fails(case, monkeypatch, ("WGMMA_TWO_WARPGROUPS", True), planted, "the one-tile rows")
