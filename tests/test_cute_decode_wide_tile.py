"""Issue #38's D=128 and D=256 packed rows: ``decode.WIDE_M_TILE`` in cute/decode (on since
bench/cute_decode_p32_ab.sh's H200 A/B, results/h200/decode-cute-wide-tile/; D=256 since
bench/decode_d256_many_rows_ab.sh's, results/h200/decode-d256-many-rows/), 64-row tiles of 4 warps × 16 rows
(``_decode_warps.WIDE_M_TILES``), so that 33 or more packed rows take half the M tiles of 32 rows, each of which reads
the share's K/V and runs the whole key loop.

CPU: on by default, and off keeps the 32-row tiles; on, the compile key (64 rows, four row warps) and the plan (one M
tile, the balanced target of one tile) change with more than 32 packed rows at D=128 and D=256 only: seed 59 row 2's
kind, 128 rows (two 64-row tiles, not four), 48 rows, D=256's 64 and 256 rows; 32 and 16 rows at D=128 and D=64 keep
theirs; the CTAs an SM the split rule and the balanced target count fit an SM's shared memory on and off (planted: a
128-row wide tile, whose ring and Q tile leave room for one CTA an SM, fails it). Static (sm_90a): on, the balanced
split (paged, ragged: the rows' kind) and the padded split (contiguous) compile without spills in registers and shared
memory for two CTAs an SM at D=128 and one at D=256. GPU (``gpu`` marker; bench/cute_decode_p32_ab.sh runs them): on,
against fp64 on a poisoned output on seed 59 row 2's kind shrunk (64 rows, paged(32), ragged, balanced), a full
contiguous cache with forced splits, 40 rows of Sq 5 (the warps' rows hold different tokens) in pages of 16 keys with
forced splits, and at D=256 256 rows of a full cache with forced splits and 64 rows paged(64) ragged balanced; the
causal mask taking every warp's rows as the first warp's fails the check.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("cutlass")

from common.contract import splits
from common.contract.problem import Problem
from common.reporting.static import cubin_resources
from cute_impl import _decode_warps, decode
from tests.test_cute_decode_rows import PLANTED, _problem, assert_planted_warp_bug_fails, check_forced_splits

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _split_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """This switch acts on the split kernels; the packed prefill (on by default since 2026-12-05) takes the contiguous
    rows of 128+ packed rows, so it is off here and every row keeps the plan the switch was measured on."""
    monkeypatch.setattr(decode, "PACKED_PREFILL_MIN_ROWS", None)


@pytest.fixture(autouse=True)
def _mma_sync_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """This file's subject is the 64-row tile of 4 warps' mma.sync, which 64+ packed rows at D=64 and 128 take only
    with ``WGMMA_MIN_ROWS`` off (or off sm_90); the WGMMA tile is tests/test_cute_decode_wgmma.py's."""
    monkeypatch.setattr(decode, "WGMMA_MIN_ROWS", 0)


# An SM's shared memory (228 KiB: ncu's "Shared Memory Configuration Size") and what the runtime keeps per CTA.
SM_SHARED_BYTES, CTA_RESERVED_SHARED_BYTES = 233472, 1024
# An SM's register file (32-bit registers), and ptxas' allocation unit per thread.
REGISTER_FILE, REGISTER_UNIT = 65536, 8


def _ring_and_q_bytes(config: decode.DecodeConfig) -> int:
    """The Q tile and the K + V ring of ``config`` (16-bit elements), the shared memory its split kernel allocates."""
    ring = 2 * config.shape.tile_n * config.head_dim * config.shape.stages * 2
    return ring + config.tile_m * config.head_dim * 2


def assert_counts_only_what_fits(problem: Problem) -> None:
    """The CTAs an SM the split rule and the balanced target count for ``problem`` fit an SM's shared memory."""
    config = decode.launch_plan(problem, CPU)[3]
    fit = decode.CTAS_PER_SM_FIT[problem.head_dim]
    need = fit * (_ring_and_q_bytes(config) + CTA_RESERVED_SHARED_BYTES)
    assert need <= SM_SHARED_BYTES, f"{problem.describe()}: {fit} CTAs an SM need {need} B of shared memory"


def _plan(problem: Problem) -> tuple:
    """cute/decode's (split count, slabs, compile key, M tiles) on a CPU device."""
    num_splits, slabs, _, config = decode.launch_plan(problem, CPU)
    return num_splits, slabs, config, decode.m_blocks_for(problem)


def _seed59_row2() -> tuple[Problem, tuple[int, ...]]:
    """Seed 59 row 2 (B=64 H=32 Hkv=8 Sq=16 D=128 paged(32) ragged: 64 packed rows) and its lengths."""
    from common.measure.decode_sweep import random_cases

    case = random_cases(8, 59)[2]
    return case.problem, case.lengths


def test_on_by_default_and_off_keeps_two_32_row_tiles(monkeypatch: pytest.MonkeyPatch):
    assert decode.WIDE_M_TILE is True, "taken after bench/cute_decode_p32_ab.sh (results/h200/decode-cute-wide-tile/)"
    monkeypatch.setattr(decode, "WIDE_M_TILE", False)
    problem, _ = _seed59_row2()
    assert problem.describe().startswith("B=64 H=32 Hkv=8 Sq=16 Sk=26368 D=128") and problem.page_size == 32
    num_splits, slabs, config, m_blocks = _plan(problem)
    assert (config.tile_m, config.row_warps, m_blocks) == (32, 2, 2)
    assert (num_splits, slabs) == (264, 264 + 512)  # the plan the H200 run timed: 264 shares a 32-row tile


# name -> (problem, BALANCED_SPLIT): seed 59 row 2's kind (64 rows, ragged, balanced), 128 rows at D=128 (two tiles of
# 64), 48 rows (a 64-row tile a quarter padding) padded, D=256's 64 and 256 rows (seed 67's row 7's kind); the plans the
# knob leaves: 32 and 16 rows at D=128, 64 rows at D=64 (its table tile already).
PLANS = {
    "d128-64rows-balanced": (_problem(8, 8, 4, 16, 26368, 128, has_cache_seqlens=True, page_size=32), "always"),
    "d128-128rows": (_problem(2, 8, 8, 16, 32768, 128), "never"),
    "d128-48rows": (_problem(2, 8, 3, 16, 32768, 128), "never"),
    "d128-32rows": (_problem(2, 8, 2, 16, 32768, 128), "never"),
    "d128-16rows": (_problem(2, 8, 4, 4, 32768, 128), "never"),
    "d64-64rows-balanced": (_problem(8, 8, 4, 16, 26368, 64, has_cache_seqlens=True, page_size=32), "always"),
    "d256-64rows": (_problem(2, 8, 4, 16, 32768, 256), "never"),
    "d256-256rows": (_problem(2, 4, 16, 16, 32768, 256), "never"),
}
# name -> (tile_m, M tiles) with the knob on.
CHANGED = {
    "d128-64rows-balanced": (64, 1), "d128-128rows": (64, 2), "d128-48rows": (64, 1), "d256-64rows": (64, 1),
    "d256-256rows": (64, 4),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(PLANS))
def test_on_changes_the_key_and_the_plan_at_many_rows_only(case: str, monkeypatch: pytest.MonkeyPatch):
    problem, balanced = PLANS[case]
    monkeypatch.setattr(decode, "BALANCED_SPLIT", balanced)
    # The ring's depth held: off, d128-64rows-balanced's two 32-row tiles spill past one wave, where the shallow
    # D=128 ring (test_decode_shallow_ring.py) would take it, not the wide tile.
    monkeypatch.setattr(decode, "BALANCED_SHALLOW_RING", {})
    monkeypatch.setattr(decode, "WIDE_M_TILE", False)
    off = _plan(problem)
    monkeypatch.setattr(decode, "WIDE_M_TILE", True)
    on = _plan(problem)
    if case not in CHANGED:
        assert on == off, problem.describe()
        return
    (_, slabs, off_config, off_m_blocks), (num_splits, _, config, m_blocks) = off, on
    assert (config.tile_m, m_blocks) == CHANGED[case] and m_blocks * 2 == off_m_blocks
    assert config.row_warps == 4 and config.keys_per_warp == config.shape.tile_n == 64, config
    expected = dataclasses.replace(off_config, tile_m=64, row_warps=4, shape=off_config.shape._replace(max_tile_m=64))
    assert config == expected
    if slabs is None:  # the padded split: the rule on the launched M tiles
        assert num_splits == splits.planned_num_splits(problem, m_blocks, CPU, decode.split_policy(problem))
    else:  # the per-slot target: off, 132 slots a tile for 64 items, the per-sm 132; on, 264 slots: one wave, 264 - 64
        rule = {"target": decode.BALANCED_TARGET, "ctas_per_sm": 2}
        target = splits.balanced_target_shares(problem, CPU, 1, 64, decode.BALANCED_SHARES_PER_SM, **rule)
        assert (off[0], num_splits) == (132, 264 - 64) and num_splits == target


def test_on_seed59_row2_takes_one_64_row_tile_and_the_one_tile_target():
    problem, _ = _seed59_row2()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decode, "WIDE_M_TILE", False)
        off = _plan(problem)
    num_splits, slabs, config, m_blocks = _plan(problem)
    assert (config.tile_m, config.row_warps, m_blocks) == (64, 4, 1)
    # 512 items on 264 slots: two shares a slot (splits.per_slot_target), 528; the grid 1040 CTAs, not 2 x 776.
    assert (num_splits, slabs) == (528, 528 + 512) and off[1] * off[3] == 1552


@pytest.mark.parametrize("knob", [False, True], ids=["off", "on"])
def test_planning_counts_only_the_ctas_that_fit(knob: bool, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(decode, "WIDE_M_TILE", knob)
    for problem, _ in PLANS.values():
        assert_counts_only_what_fits(problem)
    # Planted: a 128-row wide tile at D=128 (96 KiB ring + 32 KiB Q: one CTA an SM) while the rule counts two.
    monkeypatch.setattr(decode, "WIDE_M_TILE", True)
    monkeypatch.setattr(_decode_warps, "WIDE_M_TILES", {128: 128})
    with pytest.raises(AssertionError, match="2 CTAs an SM need"):
        assert_counts_only_what_fits(PLANS["d128-128rows"][0])


def test_ab_times_the_row_and_its_neighbours_off_and_on():
    """bench/cute_decode_p32_ab.py: seed 59 row 2, then the same lengths contiguous and in pages of 128 and 64, then
    Sq=1 and D=64 (controls, whose plan the knob leaves); its settings change the compile key on the first four only
    and restore the switch; the .sh runs this file's GPU tests, then the A/B, carrying the CuTe DSL."""
    from bench import cute_balanced_ab, cute_decode_p32_ab
    from bench.decode_fewpairs import switched

    rows = cute_balanced_ab.cases(cute_decode_p32_ab.cases())
    row, lengths = _seed59_row2()
    assert [case.problem for case in rows] == [
        row, row.with_(page_size=0), row.with_(page_size=128), row.with_(page_size=64), row.with_(seqlen_q=1),
        row.with_(head_dim=64),
    ]  # fmt: skip
    assert all(case.lengths == lengths for case in rows)
    plans = {}
    for name, setting, switches in cute_decode_p32_ab.SETTINGS:
        assert name == "cute/decode"
        with switched(decode, switches):
            plans[setting] = [decode.launch_plan(case.problem, CPU)[3] for case in rows]
    assert [off != on for off, on in zip(plans["off"], plans["on"], strict=True)] == [True] * 4 + [False] * 2
    assert decode.WIDE_M_TILE is True
    script = (Path(__file__).parents[1] / "bench" / "cute_decode_p32_ab.sh").read_text()
    assert "tests/test_cute_decode_wide_tile.py" in script and "bench.cute_decode_p32_ab" in script
    assert '".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"' in script


# ----------------------------------------------------------------------------------------------------
# sm_90a: on, no spills, and CTAS_PER_SM_FIT CTAs' registers and shared memory an SM (two at D=128, one at D=256)
# ----------------------------------------------------------------------------------------------------
# (head dim, page size, BALANCED_SPLIT): the rows' kinds (balanced, paged, ragged), the padded split on a contiguous
# cache.
KNOB_COMPILES = [(128, 32, "always"), (128, 0, "never"), (256, 64, "always"), (256, 0, "never")]


@pytest.mark.cute_compile
@pytest.mark.parametrize(("head_dim", "page_size", "balanced"), KNOB_COMPILES)
def test_on_compiles_for_the_ctas_an_sm_it_counts(
    head_dim: int, page_size: int, balanced: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(decode, "WIDE_M_TILE", True)
    monkeypatch.setattr(decode, "BALANCED_SPLIT", balanced)
    problem = _problem(2, 4, 4, 16, 4096, head_dim, has_cache_seqlens=bool(page_size), page_size=page_size)
    config = decode.compile_plan(problem, split=True)
    assert (config.tile_m, config.row_warps, bool(config.balanced_min_blocks)) == (64, 4, balanced == "always")
    ctas = decode.CTAS_PER_SM_FIT[head_dim]
    storages = []  # the SharedStorage the split kernel allocates, as the launcher builds it
    real_storage = decode.qkv_ring_storage
    monkeypatch.setattr(decode, "qkv_ring_storage", lambda *args: storages.append(real_storage(*args)) or storages[-1])
    (binary,) = decode.compile_sm90(problem, split=True)
    (shared,) = {storage.size_in_bytes() for storage in storages}
    print(f"WIDE_M_TILE {problem.describe()}: the split kernel allocates {shared} B of shared memory")
    assert shared == _ring_and_q_bytes(config), (problem.describe(), shared)
    assert_kernels_fit(binary, ctas, f"WIDE_M_TILE {problem.describe()}", shared)


def assert_kernels_fit(binary: Any, ctas: int, label: str, shared: int | None = None) -> None:
    """The split and merge kernels of ``binary`` spill nothing and ``ctas`` of them fit an SM's register file, and
    with ``shared`` (the split kernel's dynamic bytes) its shared memory."""
    kernels = cubin_resources(binary.cubin)
    assert len(kernels) == 2, sorted(kernels)
    for name, usage in kernels.items():
        registers, spills = usage["registers"], usage["stack_bytes"] + usage["local_bytes"]
        print(f"{label} {name[:40]}: {registers} registers")
        assert spills == 0, f"{label} {name}: {registers} registers, {spills} B spilled"
        if shared is not None:
            cta_bytes = SM_SHARED_BYTES // ctas - CTA_RESERVED_SHARED_BYTES
            assert shared + usage["static_shared_bytes"] <= cta_bytes, (label, name, shared)
        allocated = -(-registers // REGISTER_UNIT) * REGISTER_UNIT
        assert registers <= 255 and ctas * binary.threads_per_cta * allocated <= REGISTER_FILE, (name, registers)


# ----------------------------------------------------------------------------------------------------
# GPU: on, against fp64; a planted mask bug
# ----------------------------------------------------------------------------------------------------
# name -> (problem, lengths, forced splits, BALANCED_SPLIT): seed 59 row 2's kind shrunk (64 rows, paged(32), ragged
# with a one-key and a 77-key sequence, the balanced split), 64 rows on a full contiguous cache in 3 forced splits,
# 40 rows of Sq 5 in pages of 16 keys (a quarter of a block), ragged, 2 forced splits; at D=256, 256 rows (four tiles)
# on a full cache in 3 forced splits and 64 rows paged(64), ragged, balanced.
GPU_CASES = {
    "seed59-kind-64rows-paged32-balanced": (_problem(4, 2, 4, 16, 2048, 128, has_cache_seqlens=True, page_size=32),
                                            (1, 2000, 77, 1029), None, "always"),
    "64rows-full-split": (_problem(2, 2, 4, 16, 1000, 128), None, 3, "never"),
    "40rows-sq5-paged16-ragged-split": (_problem(3, 2, 8, 5, 1024, 128, has_cache_seqlens=True, page_size=16),
                                        (1000, 33, 517), 2, "never"),
    "d256-256rows-full-split": (_problem(2, 2, 16, 16, 1000, 256), None, 3, "never"),
    "d256-64rows-paged64-balanced": (_problem(3, 2, 4, 16, 2048, 256, has_cache_seqlens=True, page_size=64),
                                     (1, 2000, 1029), None, "always"),
}  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gpu_wide_tile_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    problem, lengths, num_splits, balanced = GPU_CASES[case]
    monkeypatch.setattr(decode, "WIDE_M_TILE", True)
    monkeypatch.setattr(decode, "BALANCED_SPLIT", balanced)
    assert decode.decode_config(problem, split=True).tile_m == 64, problem.describe()
    result = check_forced_splits(problem, lengths, num_splits, seed=len(case))
    assert result.ok, f"WIDE_M_TILE {problem.describe()}: {result.summary()}"


@pytest.mark.gpu
def test_gpu_planted_first_warp_mask_fails_the_check(monkeypatch: pytest.MonkeyPatch):
    """Planted (tests/test_cute_decode_rows.py's): every warp of the 64-row tile masked with the first warp's rows;
    Sq 5 puts other tokens in rows 16.. than in rows 0..15, so the causal mask is wrong there."""
    monkeypatch.setattr(decode, "WIDE_M_TILE", True)
    bug = "mask takes the first warp's rows"
    name, replacement, _ = PLANTED[bug]
    assert_planted_warp_bug_fails(bug, (name, replacement), GPU_CASES["40rows-sq5-paged16-ragged-split"], monkeypatch)
