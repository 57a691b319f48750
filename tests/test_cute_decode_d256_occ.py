"""Issue #38's D=256 occupancy: ``decode.D256_TWO_CTAS`` in cute/decode (off until bench/cute_decode_d256_occ_ab.sh),
D=256's 32-row tiles on three 32-key stages (``_decode_warps.TWO_CTA_TILES``) so that two CTAs share an SM, and the
split rule and the balanced target counting two CTA slots an SM there.

CPU: off by default, and off the table's ring; on, the compile key (the block: 32 keys, 16 a warp; the balanced
split's least share in blocks) and the planning counts (the split rule's CTA slots, the balanced target) change at
D=256's 32-row tiles only: 16-row D=256 tiles, D=128 and D=64 keep their plan; every head dim's planning counts only
the CTAs whose Q tile and ring fit an SM's shared memory (planted: two CTAs counted on the 192 KiB ring fail it); a
two-CTA block taken by a 16-row tile, whose four key warps would get 8 keys, is refused (planted). Static (sm_90a, two
compiles): on, the padded split (contiguous) and the balanced split (paged, ragged) compile without spills, in
registers and shared memory (read from the storage the kernel allocates) for two CTAs an SM. GPU (``gpu`` marker;
bench/cute_decode_d256_occ_ab.sh runs them): on, against fp64 on a poisoned output on seed 53 row 0's kind shrunk (64
packed rows, a full cache, the rule's splits), a paged(64) ragged balanced row and pages of 16 keys with forced
splits; a split that counts its blocks in the table's 64 keys while the ring holds 32 fails the check.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

pytest.importorskip("cutlass")

from common.contract import splits
from common.contract.problem import Problem
from common.reporting.static import cubin_resources
from cute_impl import _decode_plan, _decode_warps, decode
from tests.test_cute_decode_d256 import _problem  # (B, Hkv, group, Sq, Sk, D=256): causal bottom-right GQA, bf16
from tests.test_cute_decode_rows import check_forced_splits

CPU = torch.device("cpu")
# An SM's shared memory (228 KiB: ncu's "Shared Memory Configuration Size") and what the runtime keeps per CTA.
SM_SHARED_BYTES, CTA_RESERVED_SHARED_BYTES = 233472, 1024
# The most a CTA may ask for where two share an SM: (228 KiB - 2 x 1 KiB) / 2.
TWO_CTA_SHARED_BYTES = 113 * 1024
# An SM's register file (32-bit registers), and ptxas' allocation unit per thread.
REGISTER_FILE, REGISTER_UNIT = 65536, 8


def _plan(problem: Problem) -> tuple:
    """cute/decode's (split count, slabs, compile key, CTAs an SM counted, the split rule's slots) on a CPU device."""
    num_splits, slabs, _, config = decode.launch_plan(problem, CPU)
    return num_splits, slabs, config, decode.ctas_per_sm_fit(problem), decode.split_policy(problem).ctas_per_sm


def _ring_and_q_bytes(config: decode.DecodeConfig) -> int:
    """The Q tile and the K + V ring of ``config`` (16-bit elements), the shared memory its split kernel allocates."""
    ring = 2 * config.shape.tile_n * config.head_dim * config.shape.stages * 2
    return ring + config.tile_m * config.head_dim * 2


# Seed 53 row 0 (B=3 H=64 Hkv=8 Sq=8 96k D=256: 64 packed rows, two 32-row tiles, a full 2.36 GB cache).
SEED53_ROW0 = _problem(3, 8, 8, 8, 96000)


def test_off_by_default_and_off_keeps_the_table_ring():
    assert decode.D256_TWO_CTAS is False, "off until bench/cute_decode_d256_occ_ab.sh"
    num_splits, slabs, config, fit, slots = _plan(SEED53_ROW0)
    assert config.shape == decode.TILE_CONFIGS[256]._replace(max_tile_m=32) and config.row_warps == 2
    assert (num_splits, slabs, fit, slots) == (8, None, 1, 1)  # ncu's grid (8, 2, 24): 384 CTAs, one an SM


# name -> (problem, BALANCED_SPLIT): seed 53 row 0 (padded), a 32-row D=256 ragged batch of 16 items (the balanced
# split's per-slot target reserves the items' rounding on the slots: 132 - 16 -> 264 - 16), and the plans the knob
# leaves: a 16-row D=256 tile, D=128's 32 rows, D=64's 128.
PLANS = {
    "seed53-row0": (SEED53_ROW0, "never"),
    "d256-32rows-balanced": (_problem(2, 8, 4, 8, 32768, has_cache_seqlens=True), "always"),
    "d256-16rows": (_problem(3, 8, 2, 8, 96000), "never"),
    "d128-32rows": (_problem(3, 8, 4, 8, 96000, 128), "never"),
    "d64-128rows-balanced": (_problem(2, 8, 8, 16, 32768, 64, has_cache_seqlens=True), "always"),
}
CHANGED = ("seed53-row0", "d256-32rows-balanced")


@pytest.mark.parametrize("case", sorted(PLANS))
def test_on_changes_the_key_and_the_counts_at_d256s_32_row_tiles_only(case: str, monkeypatch: pytest.MonkeyPatch):
    problem, balanced = PLANS[case]
    monkeypatch.setattr(decode, "BALANCED_SPLIT", balanced)
    off = _plan(problem)
    monkeypatch.setattr(decode, "D256_TWO_CTAS", True)
    on = _plan(problem)
    if case not in CHANGED:
        assert on == off, problem.describe()
        return
    (_, slabs, off_config, _, _), (num_splits, _, config, fit, slots) = off, on
    assert config.shape.tile_n == 32 and config.keys_per_warp == 16 and config.row_warps == 2, config
    least_share = splits.balanced_min_share_blocks(32, decode.BALANCED_MIN_KEYS) if slabs else False
    expected = dataclasses.replace(off_config, shape=config.shape, balanced_min_blocks=least_share)
    assert config == expected and config.shape == off_config.shape._replace(tile_n=32)
    assert fit == slots == 2
    if slabs is None:  # seed 53 row 0: 48 CTAs a split on 264 slots, 11 splits (two full waves), not 8
        assert num_splits == splits.planned_num_splits(problem, 2, CPU, splits.SplitPolicy(2)) == 11
    else:
        rule = {"target": decode.BALANCED_TARGET, "ctas_per_sm": 2}
        target = splits.balanced_target_shares(problem, CPU, 1, 32, decode.BALANCED_SHARES_PER_SM, **rule)
        assert (off[0], num_splits) == (132 - 16, 264 - 16) and num_splits == target


def assert_counts_only_what_fits(problem: Problem) -> None:
    """The CTAs an SM the split rule and the balanced target count for ``problem`` fit an SM's shared memory."""
    config = decode.launch_plan(problem, CPU)[3]
    fit = decode.ctas_per_sm_fit(problem)
    need = fit * (_ring_and_q_bytes(config) + CTA_RESERVED_SHARED_BYTES)
    assert need <= SM_SHARED_BYTES, f"{problem.describe()}: {fit} CTAs an SM need {need} B of shared memory"


@pytest.mark.parametrize("knob", [False, True], ids=["off", "on"])
def test_planning_counts_only_the_ctas_that_fit(knob: bool, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(decode, "D256_TWO_CTAS", knob)
    for problem, _ in PLANS.values():
        assert_counts_only_what_fits(problem)
    # Planted: two CTAs an SM counted on D=256's 192 KiB ring.
    monkeypatch.setattr(decode, "D256_TWO_CTAS", False)
    monkeypatch.setattr(decode, "CTAS_PER_SM_FIT", {**decode.CTAS_PER_SM_FIT, 256: 2})
    with pytest.raises(AssertionError, match="2 CTAs an SM need"):
        assert_counts_only_what_fits(SEED53_ROW0)


def test_a_16_row_tile_on_the_two_cta_block_is_refused(monkeypatch: pytest.MonkeyPatch):
    """Planted: the two-CTA block taken by a 16-row tile too; its four key warps would get 8 keys (MMA k-step: 16)."""
    monkeypatch.setattr(decode, "D256_TWO_CTAS", True)
    problem = PLANS["d256-16rows"][0]
    decode.DecodeKernel(decode.decode_config(problem, split=True))
    monkeypatch.setattr(_decode_warps, "two_cta_tile", lambda two_ctas, head_dim, row_warps: (32, 2))
    config = decode.decode_config(problem, split=True)
    assert (config.tile_m, config.shape.tile_n, config.keys_per_warp) == (16, 32, 8)
    with pytest.raises(ValueError, match="multiples of 16"):
        decode.DecodeKernel(config)


def test_ab_times_the_named_rows_off_and_on():
    """bench/cute_decode_d256_occ_ab.py: seed 53 row 0, seed 47 rows 6 and 4, seed 53 row 1, the D=128 control; its
    settings change the compile key on the D=256 rows only and restore the switch; the .sh runs this file's GPU tests,
    then the A/B, carrying the CuTe DSL."""
    from bench import cute_balanced_ab, cute_decode_d256_occ_ab
    from bench.decode_fewpairs import switched

    rows = cute_balanced_ab.cases(cute_decode_d256_occ_ab.CASES)
    assert [row.describe().split(" bf16")[0] for row in rows] == [
        "B=3 H=64 Hkv=8 Sq=8 Sk=96000 D=256", "B=1 H=64 Hkv=4 Sq=4 Sk=71168 D=256",
        "B=64 H=8 Hkv=1 Sq=16 Sk=40448 D=256", "B=4 H=128 Hkv=16 Sq=16 Sk=42240 D=256",
        "B=1 H=8 Hkv=2 Sq=4 Sk=366848 D=128",
    ]  # fmt: skip
    plans = {}
    for name, setting, switches in cute_decode_d256_occ_ab.SETTINGS:
        assert name == "cute/decode"
        with switched(decode, switches):
            plans[setting] = [decode.launch_plan(row.problem, CPU)[3] for row in rows]
    assert [off != on for off, on in zip(plans["off"], plans["on"], strict=True)] == [True] * 4 + [False]
    assert decode.D256_TWO_CTAS is False
    script = (Path(__file__).parents[1] / "bench" / "cute_decode_d256_occ_ab.sh").read_text()
    assert "tests/test_cute_decode_d256_occ.py" in script and "bench.cute_decode_d256_occ_ab" in script
    assert '".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"' in script


# ----------------------------------------------------------------------------------------------------
# sm_90a: on, no spills, and two CTAs' registers and shared memory an SM
# ----------------------------------------------------------------------------------------------------
# (page size, BALANCED_SPLIT): the padded split on a contiguous cache, the balanced split on a paged ragged one.
KNOB_COMPILES = [(0, "never"), (64, "always")]


@pytest.mark.cute_compile
@pytest.mark.parametrize(("page_size", "balanced"), KNOB_COMPILES)
def test_on_compiles_for_two_ctas_an_sm(page_size: int, balanced: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(decode, "D256_TWO_CTAS", True)
    monkeypatch.setattr(decode, "BALANCED_SPLIT", balanced)
    problem = _problem(2, 4, 8, 4, 4096, has_cache_seqlens=bool(page_size), page_size=page_size)
    config = decode.compile_plan(problem, split=True)
    assert (config.tile_m, config.shape.tile_n, bool(config.balanced_min_blocks)) == (32, 32, balanced == "always")
    storages = []  # the SharedStorage the split kernel allocates, as the launcher builds it
    real_storage = decode.qkv_ring_storage
    monkeypatch.setattr(decode, "qkv_ring_storage", lambda *args: storages.append(real_storage(*args)) or storages[-1])
    (binary,) = decode.compile_sm90(problem, split=True)
    (shared,) = {storage.size_in_bytes() for storage in storages}
    print(f"D256_TWO_CTAS {problem.describe()}: the split kernel allocates {shared} B of shared memory")
    assert shared == _ring_and_q_bytes(config) <= TWO_CTA_SHARED_BYTES, (problem.describe(), shared)
    kernels = cubin_resources(binary.cubin)
    assert len(kernels) == 2, sorted(kernels)
    for name, usage in kernels.items():
        registers, spills = usage["registers"], usage["stack_bytes"] + usage["local_bytes"]
        print(f"D256_TWO_CTAS {problem.describe()} {name[:40]}: {registers} registers")
        assert spills == 0, f"{problem.describe()} {name}: {registers} registers, {spills} B spilled"
        allocated = -(-registers // REGISTER_UNIT) * REGISTER_UNIT
        assert registers <= 255 and 2 * binary.threads_per_cta * allocated <= REGISTER_FILE, (name, registers)


# ----------------------------------------------------------------------------------------------------
# GPU: on, against fp64; a planted block count
# ----------------------------------------------------------------------------------------------------
# name -> (problem, lengths, forced splits, BALANCED_SPLIT): seed 53 row 0's kind (64 packed rows in two 32-row tiles,
# a full cache, the rule's padded splits), a paged(64) ragged balanced row (32 rows), pages of 16 keys (half a block)
# ragged with forced splits.
GPU_CASES = {
    "seed53-kind-64rows-full": (_problem(1, 2, 8, 8, 3000), None, None, "never"),
    "32rows-paged64-ragged-balanced": (_problem(4, 2, 8, 4, 2048, has_cache_seqlens=True, page_size=64),
                                       (1, 2000, 77, 1029), None, "always"),
    "32rows-paged16-ragged-split": (_problem(3, 2, 4, 8, 1024, has_cache_seqlens=True, page_size=16), (1000, 33, 517),
                                    3, "never"),
}  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gpu_two_ctas_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    problem, lengths, num_splits, balanced = GPU_CASES[case]
    monkeypatch.setattr(decode, "D256_TWO_CTAS", True)
    monkeypatch.setattr(decode, "BALANCED_SPLIT", balanced)
    assert decode.decode_config(problem, split=True).shape.tile_n == 32, problem.describe()
    result = check_forced_splits(problem, lengths, num_splits, seed=len(case))
    assert result.ok, f"D256_TWO_CTAS {problem.describe()}: {result.summary()}"


_REAL_RANGE = _decode_plan.split_block_range


def _table_blocks(split, num_splits, seqlen, seqlen_q, tile_n, causal):
    """Planted: the split's key blocks counted in the table's 64 keys while the ring holds 32-key blocks (each index
    then names a 32-key block: the split reads about half of its keys, and masks the wrong ones)."""
    return _REAL_RANGE(split, num_splits, seqlen, seqlen_q, decode.TILE_CONFIGS[256].tile_n, causal)


@pytest.mark.gpu
def test_gpu_planted_table_block_count_fails_the_check(monkeypatch: pytest.MonkeyPatch):
    problem, lengths, num_splits, balanced = GPU_CASES["seed53-kind-64rows-full"]
    monkeypatch.setattr(decode, "D256_TWO_CTAS", True)
    monkeypatch.setattr(decode, "BALANCED_SPLIT", balanced)
    assert check_forced_splits(problem, lengths, num_splits, seed=1).ok, "the unplanted kernel must pass"
    monkeypatch.setattr(decode.HOST.kernels, "compiled", {})
    monkeypatch.setattr(decode, "split_block_range", _table_blocks)
    result = check_forced_splits(problem, lengths, num_splits, seed=1)
    assert not result.ok, f"64-key block count on 32-key blocks: the check passed a wrong kernel ({result.summary()})"
