"""Issue #38's D=256 packed rows: ``_decode_warps.ROW_SPLIT_MAX_TILE_M`` in cute/decode (on), the row split's
largest tile per head dim, {256: 32} taking 17 to 32 packed rows at D=256 in one 32-row tile of 2 × 2 warps instead
of two 16-row tiles that each stream the same K/V.

CPU: on by default (results/h200/decode-d256-tile32/); on, seed 43's B=16 H=80 Hkv=16 Sq=4 2k D=256 row (20 packed
rows) is one 32-row M tile of 2 × 2 warps, not two 16-row tiles of 1 × 4, and the split rule counts the one tile;
other head dims, 16-row D=256 tiles and the key split (``WARPS_SPLIT_ROWS`` off, where 32 rows would hold 32 × 256
fp32 of O a warp) keep their plan; the 32-row tile's Q, ring and the warps' merge scratch fit an SM's shared memory;
bench/cute_decode_d256.py times both settings on its shapes, seed 43's row first, the control's plan unchanged, and
restores the switch. Static (sm_90a): the knob's D=256 kernels compile without spills, direct and split, contiguous,
ragged and paged. GPU (``gpu`` marker; ``bench/cute_decode_d256_ab.sh``): the knob against fp64 on a poisoned output
over D=256 GQA packed shapes of 18 to 64 rows (Sq 4 and 3), ragged and paged, one split, forced splits and the
balanced split; planted bugs (the second row warp's partial stored over the first's rows; the causal mask taking the
second row warp's rows as the first's) fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("cutlass")

from common.contract import splits
from common.contract.problem import Problem
from common.reporting.static import cubin_resources
from cute_impl import _decode_warps, decode
from tests.test_cute_decode_rows import (
    RAGGED,
    _first_rows_mask,
    _first_rows_part,
    assert_planted_warp_bug_fails,
    check_forced_splits,
)

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _split_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """This switch acts on the split kernels; the packed prefill (on by default since 2026-12-05) takes the contiguous
    rows of 128+ packed rows, so it is off here and every row keeps the plan the switch was measured on."""
    monkeypatch.setattr(decode, "PACKED_PREFILL_MIN_ROWS", None)


TILE32 = {256: 32}
# An SM's shared memory a CTA may take (227 KiB) and what the runtime keeps of it per CTA.
SM_SHARED_BYTES, CTA_RESERVED_SHARED_BYTES = 232448, 1024


@pytest.fixture(autouse=True)
def _without_d256_wide_tile(monkeypatch: pytest.MonkeyPatch) -> None:
    """D=256's 64-row tile (``WIDE_M_TILES``, tests/test_cute_decode_wide_tile.py) off: under it the wide tile's 64
    rows, not this knob, bound D=256's row split (17 to 32 rows still take one 32-row tile of 2 x 2 warps)."""
    monkeypatch.setattr(_decode_warps, "WIDE_M_TILES", {128: 64})


def _problem(batch: int, kv_heads: int, group: int, seqlen_q: int, seqlen_k: int, head_dim: int = 256,
             **changes) -> Problem:  # fmt: skip
    return Problem(
        batch, kv_heads * group, seqlen_q, seqlen_k, head_dim, dtype=torch.bfloat16, causal=True, kv_heads=kv_heads,
        causal_alignment="bottom_right", **changes,
    )  # fmt: skip


def _plan(problem: Problem) -> tuple:
    """(tile_m, M tiles, split count, warps along M) of cute/decode's plan for ``problem`` on a CPU device."""
    num_splits, _, _, config = decode.launch_plan(problem, CPU)
    return config.tile_m, decode.m_blocks_for(problem), num_splits, config.row_warps


SEED43_ROW = _problem(16, 16, 5, 4, 2048)


def test_tile32_is_on_and_takes_seed43s_rows_in_one_tile(monkeypatch: pytest.MonkeyPatch):
    assert _decode_warps.ROW_SPLIT_MAX_TILE_M == TILE32, "on since results/h200/decode-d256-tile32/"
    monkeypatch.setattr(_decode_warps, "ROW_SPLIT_MAX_TILE_M", {})
    assert _plan(SEED43_ROW) == (16, 2, 1, 1)
    monkeypatch.setattr(_decode_warps, "ROW_SPLIT_MAX_TILE_M", TILE32)
    assert _plan(SEED43_ROW) == (32, 1, 1, 2)
    config = decode.decode_config(SEED43_ROW, split=False)
    assert config.shape.max_tile_m == 32 and config.keys_per_warp == 32


# (group, Sq, D) -> (tile_m, M tiles, warps along M) with the knob on: D=256's 20 and 64 rows in 32-row tiles;
# D=256's 16 rows, D=128's 32 and D=64's 128 as before.
KNOB_PLANS = {(5, 4, 256): (32, 1, 2), (16, 4, 256): (32, 2, 2), (16, 1, 256): (16, 1, 1), (4, 8, 128): (32, 1, 2),
              (8, 16, 64): (64, 2, 4)}  # fmt: skip


@pytest.mark.parametrize(("group", "seqlen_q", "head_dim"), sorted(KNOB_PLANS))
def test_tile32_changes_only_d256_tiles_of_more_than_16_rows(
    group: int, seqlen_q: int, head_dim: int, monkeypatch: pytest.MonkeyPatch
):
    problem = _problem(4, 8, group, seqlen_q, 8192, head_dim)
    monkeypatch.setattr(_decode_warps, "ROW_SPLIT_MAX_TILE_M", {})
    default = _plan(problem)
    monkeypatch.setattr(_decode_warps, "ROW_SPLIT_MAX_TILE_M", TILE32)
    tile_m, m_blocks, _, row_warps = _plan(problem)
    assert (tile_m, m_blocks, row_warps) == KNOB_PLANS[group, seqlen_q, head_dim], problem.describe()
    if head_dim != 256 or group * seqlen_q <= 16:
        assert _plan(problem) == default, problem.describe()
    # The key split keeps every row in every warp: a 32-row D=256 tile there would hold 256 fp32 of O a thread.
    monkeypatch.setattr(decode, "WARPS_SPLIT_ROWS", False)
    assert decode.tile_m_for(problem) == min(decode.TILE_CONFIGS[head_dim].max_tile_m, tile_m)


def test_split_rule_counts_the_one_tile(monkeypatch: pytest.MonkeyPatch):
    """20 rows on one 128k sequence: the rule's CTAs per split halve, so its splits double (128 CTAs either way)."""
    problem = _problem(1, 4, 5, 4, 131072)
    monkeypatch.setattr(_decode_warps, "ROW_SPLIT_MAX_TILE_M", {})
    assert _plan(problem)[1:3] == (2, 16)
    monkeypatch.setattr(_decode_warps, "ROW_SPLIT_MAX_TILE_M", TILE32)
    expected = splits.planned_num_splits(problem, 1, CPU, decode.split_policy(problem))
    assert _plan(problem)[1:3] == (1, expected) and expected == 32


def test_the_32_row_tile_fits_shared_memory(monkeypatch: pytest.MonkeyPatch):
    """The Q tile and the three-stage ring within an SM's shared memory; the warps' fp32 partials in the ring."""
    monkeypatch.setattr(_decode_warps, "ROW_SPLIT_MAX_TILE_M", TILE32)
    for split in (False, True):
        config = decode.decode_config(SEED43_ROW, split=split)
        decode.DecodeKernel(config)  # refuses partials larger than the drained ring
        ring = 2 * config.shape.tile_n * config.head_dim * config.shape.stages * 2
        q_tile = config.tile_m * config.head_dim * 2
        assert ring + q_tile + decode.SMEM_ALIGN_BYTES <= SM_SHARED_BYTES - CTA_RESERVED_SHARED_BYTES, config


def test_bench_times_both_settings_and_restores_the_switch():
    """bench/cute_decode_d256.py: seed 43's row first; the knob changes every plan but the control's; the switch as
    committed after; the table gives tile32 over the default; the .sh runs this file's GPU tests and the bench."""
    from bench import cute_decode_d256
    from bench.cute_decode_rows import plan_of

    cases = dict(cute_decode_d256.d256_cases())
    assert next(iter(cases)) == "seed43-6"
    assert cases["seed43-6"].describe().startswith("B=16 H=80 Hkv=16 Sq=4 Sk=2048 D=256")
    for label, case in cases.items():
        with cute_decode_d256.applied("default"):
            default = plan_of(case.problem, CPU)
        with cute_decode_d256.applied("tile32"):
            knob = plan_of(case.problem, CPU)
        assert (knob == default) == label.startswith("control"), (label, default, knob)
    with cute_decode_d256.applied("tile32"):
        assert plan_of(cases["seed43-6"].problem, CPU) == "32x1 w2x2 s3 splits 1"
    assert _decode_warps.ROW_SPLIT_MAX_TILE_M == TILE32
    row = {"label": "seed43-6", "shape": "s", "plan": "p", "status": "ok", "pct_read_bw": 70.0}
    rows = [{**row, "setting": "default", "us": 170.0}, {**row, "setting": "tile32", "us": 140.0}]
    assert "| 0.82 |" in cute_decode_d256.markdown(rows, 4400.0)
    script = (Path(__file__).parents[1] / "bench" / "cute_decode_d256_ab.sh").read_text()
    assert "tests/test_cute_decode_d256.py" in script and "bench.cute_decode_d256" in script


# ----------------------------------------------------------------------------------------------------
# sm_90a: the knob's D=256 kernels without spills
# ----------------------------------------------------------------------------------------------------
# (group, Sq, page size, ragged, split): seed 43's row (direct, the rule's one split; and split), ragged, paged.
KNOB_COMPILES = [(5, 4, 0, False, False), (5, 4, 0, False, True), (5, 4, 0, True, True), (8, 4, 64, True, True)]


@pytest.mark.cute_compile
@pytest.mark.parametrize(("group", "seqlen_q", "page_size", "ragged", "split"), KNOB_COMPILES)
def test_tile32_compiles_for_sm90_without_spills(
    group: int, seqlen_q: int, page_size: int, ragged: bool, split: bool, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(_decode_warps, "ROW_SPLIT_MAX_TILE_M", TILE32)
    problem = _problem(2, 4, group, seqlen_q, 4096, has_cache_seqlens=ragged, page_size=page_size)
    plan = decode.compile_plan(problem, split=split)
    assert (plan.tile_m, plan.row_warps) == (32, 2), problem.describe()
    (binary,) = decode.compile_sm90(problem, split=split)
    for name, usage in cubin_resources(binary.cubin).items():
        spills = usage["stack_bytes"] + usage["local_bytes"]
        print(f"ROW_SPLIT_MAX_TILE_M {problem.describe()} {name[:40]}: {usage['registers']} registers")
        assert spills == 0, f"{problem.describe()} {name}: {usage['registers']} registers, {spills} B spilled"


# ----------------------------------------------------------------------------------------------------
# GPU: the knob against fp64, and planted bugs
# ----------------------------------------------------------------------------------------------------
# name -> (problem, lengths, forced splits, BALANCED_SPLIT). Packed rows at D=256: 20 (seed 43's group 5 × Sq 4: the
# second row warp holds 4 real rows), 18 (Sq 3: the row warps' rows start at different tokens), 32, and 64 (two
# 32-row tiles).
GPU_CASES = {
    "20rows-full": (_problem(2, 2, 5, 4, 1000), None, 1, "never"),
    "20rows-ragged-split": (_problem(3, 2, 5, 4, 1024, has_cache_seqlens=True), (1, 1000, 77), 3, "never"),
    "18rows-sq3-paged-ragged": (_problem(4, 2, 6, 3, 1024, has_cache_seqlens=True, page_size=32), RAGGED, 1, "never"),
    "32rows-paged-balanced": (_problem(4, 2, 8, 4, 1024, has_cache_seqlens=True, page_size=64), RAGGED, None,
                              "always"),
    "64rows-two-tiles-split": (_problem(2, 2, 16, 4, 777), None, 2, "never"),
}  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gpu_tile32_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    problem, lengths, num_splits, balanced = GPU_CASES[case]
    monkeypatch.setattr(_decode_warps, "ROW_SPLIT_MAX_TILE_M", TILE32)
    monkeypatch.setattr(decode, "BALANCED_SPLIT", balanced)
    assert decode.decode_config(problem, split=True).tile_m == 32, problem.describe()
    result = check_forced_splits(problem, lengths, num_splits, seed=len(case))
    assert result.ok, f"ROW_SPLIT_MAX_TILE_M {problem.describe()}: {result.summary()}"


# bug -> (method of WarpTiles, replacement, GPU case it must fail on). The replacements are the row split's
# (tests/test_cute_decode_rows.py): here the second row warp's O and LSE stored over the first's rows (rows 16.. of
# the tile never merged), and the causal mask taking the second row warp's rows as the first's (Sq 3: rows 16, 17
# are tokens 1, 2, masked as tokens 0, 1).
PLANTED = {
    "second row warp stored over the first's rows": ("part", _first_rows_part, "20rows-full"),
    "mask takes the first row warp's rows": ("mask_m_block", _first_rows_mask, "18rows-sq3-paged-ragged"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_tile32_bug_fails_the_check(bug: str, monkeypatch: pytest.MonkeyPatch):
    name, replacement, case = PLANTED[bug]
    monkeypatch.setattr(_decode_warps, "ROW_SPLIT_MAX_TILE_M", TILE32)
    assert_planted_warp_bug_fails(bug, (name, replacement), GPU_CASES[case], monkeypatch)
