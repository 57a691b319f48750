"""Issue #38's many packed rows: ``WARPS_SPLIT_ROWS`` in cute/decode (on), warps that split a tile's rows
before its keys (``cute_impl/_decode_warps.py``), and ``ROW_SPLIT_STAGES``, the row split's own ring depth.

CPU: on by default (``results/h200/decode-row-split/``); against off, the warps along M of each tile (16 rows:
none; 32: two; 64: four) and nothing else of the plan (tile, M tiles, split count); ``ROW_SPLIT_STAGES`` (empty)
sets only the row split's ring depth; a split of the warps that does not divide the tile is refused;
bench/cute_decode_rows.py times each setting where it changes the plan and restores the switches. Static (sm_90a):
the knob's kernels compile without spills, split and direct, contiguous and paged, at D=64 and 128, D=64's split
kernel in the 168 registers that let three CTAs share an SM. GPU (``gpu`` marker;
``bench/cute_decode_rows_ab.sh``): the knob against fp64 on a poisoned output over GQA packed shapes of group · Sq
= 32 to 256 rows (Sq 16 and 5; D=64 and 128), ragged lengths, paged and not, one split, forced splits and the
balanced split, two of them also in the four-stage D=64 ring; planted bugs (every warp's partial stored into the
first warp's rows; the causal mask taking every warp's rows as the first warp's) must fail the check.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

pytest.importorskip("cutlass")

from common.contract import splits
from common.contract.problem import Problem
from common.reporting.static import cubin_resources
from cute_impl import _decode_warps, decode
from tests.test_decode_wide import check_on_gpu

CPU = torch.device("cpu")


def _problem(batch: int, kv_heads: int, group: int, seqlen_q: int, seqlen_k: int, head_dim: int, **changes) -> Problem:
    return Problem(
        batch, kv_heads * group, seqlen_q, seqlen_k, head_dim, dtype=torch.bfloat16, causal=True, kv_heads=kv_heads,
        causal_alignment="bottom_right", return_lse=True, **changes,
    )  # fmt: skip


def _plan(problem: Problem) -> tuple:
    """(tile_m, M tiles, split count, warps along M) of cute/decode's plan for ``problem`` on a CPU device."""
    num_splits, _, _, config = decode.launch_plan(problem, CPU)
    return config.tile_m, decode.m_blocks_for(problem), num_splits, config.row_warps


# (group, Sq, D) -> warps along M with the knob on: seed 41's 128 rows at D=64 (two 64-row tiles of 4 × 16
# rows), 32 rows at D=64 (2 × 2 warps), 40 rows in a 64-row tile, D=128's 32-row tiles, 16-row tiles (none).
ROW_WARPS = {(8, 16, 64): 4, (2, 16, 64): 2, (8, 5, 64): 4, (8, 16, 128): 2, (16, 16, 256): 1, (4, 1, 64): 1}


def test_warps_split_rows_is_on_and_changes_only_the_warps(monkeypatch: pytest.MonkeyPatch):
    """On by default (results/h200/decode-row-split/); off, every tile keeps the key split and the same plan.
    D=256's 32-row tile (``ROW_SPLIT_MAX_TILE_M``, tests/test_cute_decode_d256.py) rides on the row split: pinned
    off here, where the row split alone is under test, and so is D=128's 64-row tile (``WIDE_M_TILE``) and the packed
    prefill, which takes the rows of 128+ packed rows off the split kernels."""
    assert decode.WARPS_SPLIT_ROWS is True, "WARPS_SPLIT_ROWS won its GPU A/B: the default"
    monkeypatch.setattr(_decode_warps, "ROW_SPLIT_MAX_TILE_M", {})
    monkeypatch.setattr(decode, "PACKED_PREFILL_MIN_ROWS", None)
    monkeypatch.setattr(decode, "WIDE_M_TILE", False)
    for (group, seqlen_q, head_dim), row_warps in ROW_WARPS.items():
        for seqlen_k in (1024, 32768):
            problem = _problem(4, 8, group, seqlen_q, seqlen_k, head_dim)
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(decode, "WARPS_SPLIT_ROWS", False)
                key_split = _plan(problem)
            assert key_split[3] == 1, problem.describe()
            assert _plan(problem) == (*key_split[:3], row_warps), problem.describe()
            config = decode.decode_config(problem, split=True)
            assert config.keys_per_warp == config.shape.tile_n * row_warps // config.shape.num_warps


def test_row_split_stages_set_only_the_row_split_ring(monkeypatch: pytest.MonkeyPatch):
    assert _decode_warps.ROW_SPLIT_STAGES == {}, "the four-stage ring lost at 64 rows, D=64, 2k (1.09x): not a default"
    monkeypatch.setattr(_decode_warps, "ROW_SPLIT_STAGES", {64: 4})
    seed41_kind, sixteen_rows = _problem(4, 8, 8, 16, 1024, 64), _problem(4, 8, 4, 4, 1024, 64)
    default_stages = decode.TILE_CONFIGS[64].stages
    monkeypatch.setattr(decode, "WARPS_SPLIT_ROWS", False)
    assert decode.decode_config(seed41_kind, split=False).shape.stages == default_stages
    monkeypatch.setattr(decode, "WARPS_SPLIT_ROWS", True)
    assert decode.decode_config(seed41_kind, split=False).shape.stages == 4
    assert decode.decode_config(sixteen_rows, split=False).shape.stages == default_stages
    decode.DecodeKernel(decode.decode_config(seed41_kind, split=True))  # the one-part scratch fits the ring


def test_split_rule_counts_the_m_tiles_the_grid_launches(monkeypatch: pytest.MonkeyPatch):
    """The rule's CTAs per split are B · Hkv · m_blocks, the split kernel's grid (splits, m_blocks, B · Hkv); its 128
    packed rows would take the packed prefill, off here."""
    monkeypatch.setattr(decode, "PACKED_PREFILL_MIN_ROWS", None)
    problem = _problem(2, 8, 8, 16, 32768, 64)
    assert decode.m_blocks_for(problem) == 2
    expected = splits.planned_num_splits(problem, 2, CPU, decode.split_policy(problem))
    assert _plan(problem)[2] == expected


def test_a_warp_split_that_does_not_divide_the_tile_is_refused():
    with pytest.raises(ValueError, match="cannot split"):
        _decode_warps.WarpTiles(32, 64, 64, 4, 4, 0)
    with pytest.raises(ValueError, match="cannot split"):
        _decode_warps.WarpTiles(64, 64, 64, 4, 3, 0)
    assert _decode_warps.row_warps_for(True, 64, 4) == 4 and _decode_warps.row_warps_for(False, 64, 4) == 1


def test_bench_times_each_setting_where_it_changes_the_plan_and_restores_the_switches():
    """bench/cute_decode_rows.py: seed 41's row first, now the packed prefill's (no setting changes it, so only the
    default is timed), the other D=64 rows with all three settings; D=128's rows without the D=64 ring's; the
    switches as committed after; the table names every setting's ratio to the default."""
    from bench import cute_decode_rows

    cases = dict(cute_decode_rows.rows_cases())
    assert next(iter(cases)) == "seed41-1" and len(cases) == len(cute_decode_rows.ORDER)
    assert cases["seed41-1"].describe().startswith("B=16 H=256 Hkv=32 Sq=16 Sk=1024 D=64")
    timed = {label: cute_decode_rows.settings_to_time(case.problem, CPU) for label, case in cases.items()}
    assert timed["seed41-1"] == ["default"] and timed["64rows-d64-2k"] == list(cute_decode_rows.SETTINGS)
    assert timed["64rows-d128-1k"] == ["default", "rows"]
    assert decode.WARPS_SPLIT_ROWS is True and _decode_warps.ROW_SPLIT_STAGES == {}
    assert cute_decode_rows.plan_of(cases["seed41-1"].problem, CPU) == "packed prefill: 512 tiles, 1 key splits"
    with cute_decode_rows.applied("rows-s4"):
        assert cute_decode_rows.plan_of(cases["64rows-d64-2k"].problem, CPU) == "64x1 w4x1 s4 splits 1"
    row = {"label": "seed41-1", "shape": "s", "plan": "p", "status": "ok", "pct_read_bw": 30.0}
    rows = [
        {**row, "setting": setting, "us": us}
        for setting, us in zip(cute_decode_rows.SETTINGS, (100.0, 80.0, 70.0), strict=True)
    ]
    assert "| 0.80 | 0.70 |" in cute_decode_rows.markdown(rows, 4300.0)


# ----------------------------------------------------------------------------------------------------
# sm_90a: the knob's kernels without spills
# ----------------------------------------------------------------------------------------------------
# (group, Sq, D, page size, split): seed 41's row's kind (direct and split, contiguous), paged at D=64, D=128's
# 32-row tile split two ways along M and K.
KNOB_COMPILES = [(8, 16, 64, 0, False), (8, 16, 64, 0, True), (8, 16, 64, 64, True), (8, 16, 128, 0, True)]
# The row split's registers a thread at most at D=64 where ROW_SPLIT_STAGES' four-stage ring is to fit three
# 128-thread CTAs an SM (65536 registers / 384 threads, in the allocator's units of 8).
ROW_SPLIT_REGISTERS_FOR_THREE_CTAS = 168


@pytest.mark.cute_compile
@pytest.mark.parametrize(("group", "seqlen_q", "head_dim", "page_size", "split"), KNOB_COMPILES)
def test_row_split_compiles_for_sm90_without_spills(
    group: int, seqlen_q: int, head_dim: int, page_size: int, split: bool, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(decode, "WARPS_SPLIT_ROWS", True)
    problem = _problem(2, 4, group, seqlen_q, 4096, head_dim, has_cache_seqlens=True, page_size=page_size)
    assert decode.compile_plan(problem, split=split).row_warps > 1
    (binary,) = decode.compile_sm90(problem, split=split)
    for name, usage in cubin_resources(binary.cubin).items():
        spills = usage["stack_bytes"] + usage["local_bytes"]
        print(f"WARPS_SPLIT_ROWS {problem.describe()} {name[:40]}: {usage['registers']} registers")
        assert spills == 0, f"{problem.describe()} {name}: {usage['registers']} registers, {spills} B spilled"
        if head_dim == 64 and "split_kernel" in name:
            assert usage["registers"] <= ROW_SPLIT_REGISTERS_FOR_THREE_CTAS, f"{problem.describe()}: {usage}"


# ----------------------------------------------------------------------------------------------------
# GPU: the knob against fp64, and planted bugs
# ----------------------------------------------------------------------------------------------------
def check_forced_splits(problem: Problem, lengths: tuple[int, ...] | None, num_splits: int | None, seed: int):
    """cute/decode against fp64 (``test_decode_wide.check_on_gpu``: fresh CUDA inputs, ``lengths`` as cache_seqlens,
    paged where the problem is) with ``num_splits`` forced (None: the rule's, or the balanced split's shares)."""
    prepare = functools.partial(decode.decode_attention, num_splits=num_splits)
    return check_on_gpu(dataclasses.replace(decode.IMPLEMENTATION, prepare=prepare), problem, lengths, seed)


RAGGED = (1, 1000, 77, 517)
# name -> (problem, lengths, forced splits, BALANCED_SPLIT). Packed rows: 32 (2 × 2 warps), 40 (Sq 5: the
# warps' rows hold different tokens), 64 and 128 at D=64 (4 warps of 16 rows), 256 at D=64 and 128 rows at
# D=128 (32-row tiles, 2 × 2).
GPU_CASES = {
    "32rows-full": (_problem(2, 2, 2, 16, 1000, 64), None, 1, "never"),
    "40rows-sq5-ragged-split": (_problem(4, 2, 8, 5, 1024, 64, has_cache_seqlens=True), RAGGED, 3, "never"),
    "64rows-paged-ragged": (_problem(4, 2, 4, 16, 1024, 64, has_cache_seqlens=True, page_size=32), RAGGED, 1,
                            "never"),
    "128rows-seed41-kind": (_problem(4, 4, 8, 16, 1024, 64), None, None, "never"),
    "128rows-d128-paged-balanced": (_problem(4, 2, 8, 16, 1024, 128, has_cache_seqlens=True, page_size=64), RAGGED,
                                    None, "always"),
    "256rows-ragged-split": (_problem(4, 1, 16, 16, 1024, 64, has_cache_seqlens=True), RAGGED, 2, "never"),
}  # fmt: skip
# Cases also run with ROW_SPLIT_STAGES' four-stage D=64 ring (bench/cute_decode_rows_ab.sh's rows-s4).
SHALLOW_RING_CASES = ("128rows-seed41-kind", "40rows-sq5-ragged-split")


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("case", "stages"), [(case, None) for case in sorted(GPU_CASES)] + [(case, 4) for case in SHALLOW_RING_CASES]
)
def test_gpu_row_split_against_fp64(case: str, stages: int | None, monkeypatch: pytest.MonkeyPatch):
    problem, lengths, num_splits, balanced = GPU_CASES[case]
    monkeypatch.setattr(decode, "WARPS_SPLIT_ROWS", True)
    monkeypatch.setattr(_decode_warps, "ROW_SPLIT_STAGES", {64: stages} if stages else {})
    monkeypatch.setattr(decode, "BALANCED_SPLIT", balanced)
    assert decode.decode_config(problem, split=True).row_warps > 1, problem.describe()
    result = check_forced_splits(problem, lengths, num_splits, seed=len(case))
    assert result.ok, f"WARPS_SPLIT_ROWS {problem.describe()}: {result.summary()}"


def _first_rows_part(self, sO_parts, sLSE_parts):
    """Planted: every warp's O and LSE into the first warp's rows of its key slice (rows 16.. never merged)."""
    row_warp, self.row_warp = self.row_warp, 0
    try:
        return _REAL_PART(self, sO_parts, sLSE_parts)
    finally:
        self.row_warp = row_warp


def _first_rows_mask(self, m_block):
    """Planted: the causal mask takes every warp's rows as the first warp's (only Sq not dividing 16 shows it)."""
    return m_block * self.row_warps


_REAL_PART = _decode_warps.WarpTiles.part
# bug -> (method of WarpTiles, replacement, GPU case it must fail on).
PLANTED = {
    "warps' rows stored over the first warp's": ("part", _first_rows_part, "128rows-seed41-kind"),
    "mask takes the first warp's rows": ("mask_m_block", _first_rows_mask, "40rows-sq5-ragged-split"),
}


def assert_planted_warp_bug_fails(bug: str, planted: tuple, case: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """``case`` (problem, lengths, forced splits, BALANCED_SPLIT) passes the fp64 check, then fails it once
    ``planted`` (a WarpTiles method's name, its planted replacement) is compiled in."""
    (name, replacement), (problem, lengths, num_splits, balanced) = planted, case
    monkeypatch.setattr(decode, "BALANCED_SPLIT", balanced)
    assert check_forced_splits(problem, lengths, num_splits, seed=1).ok, "the unplanted kernel must pass"
    monkeypatch.setattr(decode.HOST.kernels, "compiled", {})
    monkeypatch.setattr(_decode_warps.WarpTiles, name, replacement)
    result = check_forced_splits(problem, lengths, num_splits, seed=1)
    assert not result.ok, f"{bug}: the check passed a wrong kernel ({result.summary()})"


@pytest.mark.gpu
@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_row_split_bug_fails_the_check(bug: str, monkeypatch: pytest.MonkeyPatch):
    name, replacement, case = PLANTED[bug]
    monkeypatch.setattr(decode, "WARPS_SPLIT_ROWS", True)
    monkeypatch.setattr(decode, "WGMMA_MIN_ROWS", 0)  # 128 rows would take the WGMMA tile, which has no warp rows
    assert_planted_warp_bug_fails(bug, (name, replacement), GPU_CASES[case], monkeypatch)
