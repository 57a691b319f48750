"""Issue #38's rows of many packed rows but few tiles on cute/hopper's kernel: ``decode.PACKED_PREFILL_SPLITS`` (on;
H100, 2026-12-05: 0.61-0.74x the split kernels on eight of twelve rows) splits the packed prefill's keys inside
cute/hopper's kernel (``HopperAttentionConfig.key_splits``, FlashAttention-3's num_splits), fp32 partials per split
merged by cute/decode's merge kernel (``_decode_packed_splits.py``).

CPU: on by default (off, seed 139 row 1 and 107 row 0 stay on the split kernels); on, 139/1 takes 4 splits and 107/0
2, the fewest that fill the waves, bounded by the key blocks (a short cache keeps the split kernels) and the cap;
every sweep row of 128+ packed rows takes it; key splits refused alone, in FP8 and by the launcher of a
configuration without them; the split key ranges against brute force (every key block once across the splits, masked
blocks in their split's masked top, a diagonal across two blocks, empty splits for short ragged rows seeing no key;
planted: a boundary off by one, a masked count of 1, an empty split that sees keys); the launch's partials, their
merge views and the in-place outputs with the kernel and the merge simulated in float64 against the reference
(planted: the merge's weights in log2 units); bench/cute_decode_packed_splits_ab.sh's rows parse, the switch moves
its first rows only and ``--set`` holds the packed prefill on; ``plan_of`` names the splits; ``compile_plan`` of a
row the key splits take while ``balanced_split`` says yes (98/2) is the padded split's (it raised before). Static
(sm_90a): the
split builds compile through cute/decode's kernels (cute/hopper's and the merge) without local memory. GPU (``gpu``
marker): forced splits 2-8 against fp64 on a poisoned output; planted, a split boundary off by one and the merge's
weights in log2 units fail.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("cutlass")

from common.contract import splits
from common.measure.decode_sweep import random_cases
from common.reporting.static import cubin_resources
from cute_impl import _decode_merge, decode
from cute_impl._device import LOG2_E, BlockRange, SeqlenInfo, key_split_range
from cute_impl._hopper_host import HopperAttentionConfig
from tests._helpers import knob_ab_problems
from tests.test_cute_decode_rows import RAGGED, _problem

CPU = torch.device("cpu")
SEED139_ROW1 = random_cases(8, 139)[1].problem  # B=2 H=128 Hkv=8 Sq=16 Sk=32256 D=128: 256 packed rows, 32 tiles
SEED107_ROW0 = random_cases(8, 107)[0].problem  # B=1 H=512 Hkv=32 Sq=16 Sk=40448 D=128, lengths: 64 tiles
TILE = 128  # cute/hopper's tile_n and the packed prefill's 128-row tiles


def _plan(problem, splits_on: bool = True, **switches) -> tuple:
    """``decode.launch_plan`` of ``problem`` on the CPU with the packed prefill at 128 rows and its splits on/off."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decode, "PACKED_PREFILL_MIN_ROWS", 128)
        patch.setattr(decode, "PACKED_PREFILL_SPLITS", splits_on)
        for name, value in switches.items():
            patch.setattr(decode, name, value)
        return decode.launch_plan(problem, CPU)


def test_on_by_default_and_off_the_rows_stay_on_the_split_kernels():
    assert decode.PACKED_PREFILL_SPLITS is True
    assert HopperAttentionConfig(torch.bfloat16, 128, True).key_splits is False
    for problem in (SEED139_ROW1, SEED107_ROW0):
        assert decode.launch_plan(problem, CPU)[3].key_splits, problem.describe()
        assert not isinstance(_plan(problem, splits_on=False)[3], HopperAttentionConfig), problem.describe()


@pytest.mark.parametrize(("problem", "expected"), [(SEED139_ROW1, 4), (SEED107_ROW0, 2)], ids=["139/1", "107/0"])
def test_on_the_fewest_splits_that_fill_the_waves(problem, expected: int):
    num_splits, slabs, items, config = _plan(problem)
    assert (num_splits, slabs, items) == (expected, None, problem.batch * problem.kv_heads)
    assert isinstance(config, HopperAttentionConfig) and config.key_splits and config.packed_group == 16
    tiles, sms = decode.packed_prefill_tiles(problem), splits.sm_count(CPU)
    assert splits.wave_efficiency(tiles * expected, sms) >= decode.PACKED_PREFILL_MIN_WAVE_SHARE
    assert splits.wave_efficiency(tiles * (expected - 1), sms) < decode.PACKED_PREFILL_MIN_WAVE_SHARE
    with pytest.MonkeyPatch.context() as patch:  # the growing binder's question: Sk's decisions carry the count
        patch.setattr(decode, "PACKED_PREFILL_MIN_ROWS", 128)
        patch.setattr(decode, "PACKED_PREFILL_SPLITS", True)
        assert decode.seqlen_k_decisions(problem, CPU) == (False, expected)
    from cute_impl._decode_packed_splits import PackedSplitsKernel

    assert isinstance(decode.decode_kernel(config), PackedSplitsKernel)
    assert len(decode.fake_arguments(config)) == 13


def test_a_tile_filling_grid_keeps_the_unsplit_route():
    seed233_row5 = random_cases(8, 233)[5].problem  # 256 tiles
    assert _plan(seed233_row5) == _plan(seed233_row5, splits_on=False)
    assert _plan(seed233_row5)[0] == 1 and not _plan(seed233_row5)[3].key_splits


def test_the_key_blocks_bound_the_splits():
    """139/1's 32 tiles need 4 splits: a cache of 15 blocks allows 3 (the split kernels keep it), of 16 blocks 4; a
    cap of 3 refuses it; causal top-left sees Sq keys, one block: never split."""
    assert not isinstance(_plan(SEED139_ROW1.with_seqlen_k(15 * TILE))[3], HopperAttentionConfig)
    assert _plan(SEED139_ROW1.with_seqlen_k(16 * TILE))[0] == 4
    assert not isinstance(_plan(SEED139_ROW1, PACKED_PREFILL_MAX_SPLITS=3)[3], HopperAttentionConfig)
    top_left = SEED139_ROW1.with_(causal_alignment="top_left")
    assert decode.packed_prefill_key_blocks(top_left) == 1
    assert not isinstance(_plan(top_left)[3], HopperAttentionConfig)


def test_a_forced_split_count_keeps_the_split_kernel():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decode, "PACKED_PREFILL_MIN_ROWS", 128)
        patch.setattr(decode, "PACKED_PREFILL_SPLITS", True)
        assert not isinstance(decode.launch_plan(SEED139_ROW1, CPU, 3)[3], HopperAttentionConfig)


def test_every_sweep_row_of_many_packed_rows_takes_it():
    """Seeds 1-239: the contiguous rows of 128+ packed rows at D 64/128 (uneven work: 256+) all take the packed prefill
    with the splits on (off, only those whose tiles fill the waves)."""
    rows = [case.problem for seed in range(1, 240) for case in random_cases(8, seed)]
    least_rows = lambda p: 256 if p.has_cache_seqlens and p.batch > 1 else 128  # noqa: E731
    many = [p for p in rows if p.kv_group * p.seqlen_q >= least_rows(p) and not p.paged and p.head_dim in (64, 128)]
    taken = [isinstance(_plan(p)[3], HopperAttentionConfig) for p in many]
    unsplit = [isinstance(_plan(p, splits_on=False)[3], HopperAttentionConfig) for p in many]
    assert all(taken) and sum(taken) - sum(unsplit) >= 30, (sum(taken), sum(unsplit), len(many))


def test_key_splits_are_refused_where_they_cannot_run():
    """A key-split configuration only launches with its merge (cute/decode), only in 16 bits; the launcher of both
    only takes one."""
    from cute_impl import hopper
    from cute_impl._decode_packed_splits import PackedSplitsKernel

    config = decode.packed_prefill_config(SEED139_ROW1, key_splits=True)
    q = torch.zeros(1, 1, 1, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="key_splits launches through cute/decode"):
        hopper.KERNELS.launcher(config, q, q, q, 1.0, 1.0, sm_count=1)
    with pytest.raises(ValueError, match="fp32 partials only, got fp8=True"):
        hopper.HopperAttention(dataclasses.replace(config, fp8=True))
    with pytest.raises(ValueError, match="need a key_splits configuration"):
        PackedSplitsKernel(decode.packed_prefill_config(SEED139_ROW1))


# ----------------------------------------------------------------------------------------------------
# The split key ranges, on Python ints
# ----------------------------------------------------------------------------------------------------
def _split_faults(blocks: BlockRange, seqlen: SeqlenInfo, tokens: list[int], num_splits: int, split_range) -> list:
    """What ``split_range`` (``key_split_range`` or a planted one) gets wrong for one tile against brute force: key
    blocks not covered exactly once, a split off FA3's boundaries, a block that needs the mask (some row of the tile
    misses one of its keys) outside its split's masked top, an empty split whose rows see a key."""
    faults, covered = [], []
    per = -(-(blocks.n_block_max - blocks.n_block_min) // num_splits)
    sees = [min(seqlen.seqlen_k, t + 1 + seqlen.causal_offset) for t in tokens]
    for split in range(num_splits):
        part, part_seqlen = split_range(blocks, seqlen, split, num_splits)
        low = min(blocks.n_block_min + split * per, blocks.n_block_max)
        if low == blocks.n_block_max:  # empty: one block, masked for every row
            if (part.n_block_min, part.n_block_max, part.n_masked_blocks) != (
                blocks.n_block_min,
                blocks.n_block_min + 1,
                1,
            ):
                faults.append(("empty split's block", split))
            if part_seqlen.seqlen_k != 0:
                faults.append(("empty split sees keys", split))
            continue
        if (part.n_block_min, part.n_block_max) != (low, min(low + per, blocks.n_block_max)):
            faults.append(("boundary", split, part.n_block_min, part.n_block_max))
        if (part_seqlen.seqlen_k, part_seqlen.causal_offset) != (seqlen.seqlen_k, seqlen.causal_offset):
            faults.append(("sequence changed", split))
        covered += range(part.n_block_min, part.n_block_max)
        for n in range(part.n_block_min, part.n_block_max):
            needs_mask = any(see < (n + 1) * TILE for see in sees)
            if needs_mask and n < part.n_block_max - part.n_masked_blocks:
                faults.append(("unmasked", split, n))
    if sorted(covered) != list(range(blocks.n_block_min, blocks.n_block_max)):
        faults.append(("coverage", covered))
    return faults


def _tiles():
    """(blocks, seqlen, tokens, where) of packed 128-row tiles: Sq 1/5/16, groups 8/16/40, lengths from 0 (ragged
    rows of no key) past several blocks, both causal alignments and none."""
    for causal, bottom_right in ((True, True), (True, False), (False, False)):
        for seqlen_q in (1, 5, 16):
            for group in (8, 16, 40):
                for seqlen_k in (0, 3, 16, 130, 200, 1000, 1030, 2050):
                    offset = seqlen_k - seqlen_q if bottom_right else 0
                    seqlen = SeqlenInfo(seqlen_k, offset, bottom_right, has_cache_seqlens=True)
                    rows = group * seqlen_q
                    for m_block in range(-(-rows // TILE)):
                        tokens = [r % seqlen_q for r in range(m_block * TILE, min(rows, (m_block + 1) * TILE))]
                        if not causal:
                            tokens = [seqlen_k] * len(tokens)  # every row sees every key
                        blocks = BlockRange.create_exact(m_block, seqlen, TILE, TILE, causal, packed_seqlen_q=seqlen_q)
                        yield blocks, seqlen, tokens, (causal, bottom_right, seqlen_q, group, seqlen_k, m_block)


def test_split_key_ranges_against_brute_force():
    for blocks, seqlen, tokens, where in _tiles():
        for num_splits in range(1, 9):
            faults = _split_faults(blocks, seqlen, tokens, num_splits, key_split_range)
            assert not faults, (where, num_splits, faults)


def test_short_ragged_rows_get_empty_splits():
    """A length of 3 keys (one block) in 4 splits: split 0 takes it, splits 1-3 are empty tiles of no key."""
    seqlen = SeqlenInfo(3, 3 - 16, True, has_cache_seqlens=True)
    blocks = BlockRange.create_exact(0, seqlen, TILE, TILE, True, packed_seqlen_q=16)
    parts = [key_split_range(blocks, seqlen, split, 4) for split in range(4)]
    assert [(p.n_block_min, p.n_block_max, s.seqlen_k) for p, s in parts] == [(0, 1, 3)] + [(0, 1, 0)] * 3


def _off_by_one_boundary(blocks, seqlen, split, num_splits):
    """Planted: every split but the top one stops one block short (a block dropped at each boundary)."""
    part, part_seqlen = key_split_range(blocks, seqlen, split, num_splits)
    if part.n_block_max < blocks.n_block_max and part_seqlen.seqlen_k:
        part = BlockRange(part.n_block_min, part.n_block_max - 1, part.n_masked_blocks)
    return part, part_seqlen


def _one_masked_block(blocks, seqlen, split, num_splits):
    """Planted: only each split's first block masked, whatever the tile's diagonal crosses."""
    part, part_seqlen = key_split_range(blocks, seqlen, split, num_splits)
    return BlockRange(part.n_block_min, part.n_block_max, 1), part_seqlen


def _empty_split_sees_keys(blocks, seqlen, split, num_splits):
    """Planted: an empty split runs block n_block_min with the sequence's keys (it would add them twice)."""
    part, _ = key_split_range(blocks, seqlen, split, num_splits)
    return part, seqlen


@pytest.mark.parametrize("planted", [_off_by_one_boundary, _one_masked_block, _empty_split_sees_keys])
def test_planted_split_range_bugs_fail(planted):
    assert any(_split_faults(b, s, t, n, planted) for b, s, t, _ in _tiles() for n in range(2, 9)), planted.__doc__


# ----------------------------------------------------------------------------------------------------
# The launch's partials and merge, the kernels simulated in float64 (CPU tensors)
# ----------------------------------------------------------------------------------------------------
def _split_stand_in(problem, lengths: tuple[int, ...], num_splits: int, combine_log2_e: float = LOG2_E) -> tuple:
    """The packed split route on CPU tensors: the launch's prologue, each split's normalised O and natural-log LSE
    written into the kernel's (splits, B, Hkv, rows, ·) partials by the kernel's rule (its tile's key split, the
    mask of each row's token), then the merge of ``merge_splits`` (weights exp2((lseₛ - max) · ``combine_log2_e``))
    read through the merge's (splits, B · Hkv, rows, ·) views into the in-place packed outputs. Returns the launch's
    (O, LSE) and the float64 reference's."""
    from common.contract.inputs import make_inputs
    from common.contract.reference import reference_attention

    q, k, v = make_inputs(problem, seed=5, device="cpu", offset=0.5)
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32)
    config = decode.packed_prefill_config(problem, key_splits=True)
    launch = decode.packed_prefill_launch(q, k, v, problem, config, cache_seqlens, num_splits)
    launch.prologue()
    packed_q, o_partial, lse_partial, o_items, lse_items, out, lse = (
        launch.arguments[i] for i in (0, 3, 4, 6, 7, 8, 9)
    )
    seqlen_q, rows = problem.seqlen_q, packed_q.shape[2]
    keys = torch.arange(problem.seqlen_k)
    for b, length in enumerate(lengths):
        offset = length - seqlen_q if problem.causal_alignment == "bottom_right" else 0
        seqlen = SeqlenInfo(length, offset, problem.causal_alignment == "bottom_right", has_cache_seqlens=True)
        for m_block in range(-(-rows // TILE)):
            tile_rows = torch.arange(m_block * TILE, min(rows, (m_block + 1) * TILE))
            blocks = BlockRange.create_exact(m_block, seqlen, TILE, TILE, problem.causal, packed_seqlen_q=seqlen_q)
            for split in range(num_splits):
                part, part_seqlen = key_split_range(blocks, seqlen, split, num_splits)
                visible = (keys >= part.n_block_min * TILE) & (keys < part.n_block_max * TILE)
                visible = (visible & (keys < part_seqlen.seqlen_k))[None, :].expand(len(tile_rows), -1)
                if problem.causal:
                    visible = visible & (keys[None, :] <= (tile_rows % seqlen_q)[:, None] + offset)
                for kv_head in range(problem.kv_heads):
                    scores = packed_q[b, kv_head, tile_rows].double() @ k[b, kv_head].double().T * problem.scale
                    part_lse = torch.logsumexp(scores.masked_fill(~visible, float("-inf")), dim=-1)
                    probs = torch.exp(
                        scores.masked_fill(~visible, float("-inf")) - part_lse.nan_to_num(neginf=0.0)[:, None]
                    )
                    o_partial[split, b, kv_head, tile_rows] = (probs @ v[b, kv_head].double()).float()
                    lse_partial[split, b, kv_head, tile_rows] = part_lse.float()
    lse_max = lse_items.max(dim=0).values
    base = torch.where(torch.isinf(lse_max), torch.zeros_like(lse_max), lse_max)
    weights = torch.exp2((lse_items - base) * combine_log2_e)  # (splits, items, rows)
    total = weights.sum(dim=0)
    merged = (weights[..., None] * o_items).sum(dim=0) / torch.where(total > 0, total, 1.0)[..., None]
    out.copy_(merged.to(out.dtype))
    lse.copy_(torch.where(total > 0, base + torch.log(total), float("-inf")))
    reference = reference_attention(q, k, v, problem, cache_seqlens=cache_seqlens, with_lse=True)
    return launch.result, reference


# (problem, lengths, splits): both alignments and none, Sq 1 and 5, lengths below Sq and of one key, empty splits.
STAND_IN_CASES = {
    "bottom-right-ragged-3": (_problem(3, 2, 8, 5, 700, 64), (700, 3, 260), 3),
    "top-left-2": (_problem(2, 2, 16, 5, 333, 64).with_(causal_alignment="top_left"), (333, 9), 2),
    "non-causal-4": (_problem(2, 1, 8, 4, 900, 64).with_(causal=False), (900, 1), 4),
    "one-token-8": (_problem(2, 2, 16, 1, 1000, 64), (1000, 0), 8),
}


@pytest.mark.parametrize("case", sorted(STAND_IN_CASES))
def test_the_splits_partials_merge_to_the_gqa_problem(case: str):
    problem, lengths, num_splits = STAND_IN_CASES[case]
    problem = problem.with_(dtype=torch.float16, has_cache_seqlens=True)
    (out, lse), (ref_out, ref_lse) = _split_stand_in(problem, lengths, num_splits)
    assert torch.allclose(out.double(), ref_out, rtol=1e-3, atol=1e-3), (out.double() - ref_out).abs().max()
    seen = torch.isfinite(ref_lse)
    assert torch.equal(seen, torch.isfinite(lse)) and torch.allclose(lse.double()[seen], ref_lse[seen], atol=1e-5)


def test_planted_log2_merge_weights_fail_the_gqa_problem():
    problem, lengths, num_splits = STAND_IN_CASES["bottom-right-ragged-3"]
    problem = problem.with_(dtype=torch.float16, has_cache_seqlens=True)
    (out, _), (ref_out, _) = _split_stand_in(problem, lengths, num_splits, combine_log2_e=1.0)
    assert not torch.allclose(out.double(), ref_out, rtol=1e-3, atol=1e-3)


def test_the_merge_views_are_the_partials_memory():
    problem = _problem(2, 3, 16, 8, 2048, 128)
    q = torch.zeros(problem.batch, problem.heads, problem.seqlen_q, problem.head_dim, dtype=problem.dtype)
    k = torch.zeros(problem.batch, problem.kv_heads, problem.seqlen_k, problem.head_dim, dtype=problem.dtype)
    launch = decode.packed_prefill_launch(q, k, k, problem, decode.packed_prefill_config(problem, True), None, 5)
    o_partial, lse_partial, o_items, lse_items = (launch.arguments[i] for i in (3, 4, 6, 7))
    assert o_partial.shape == (5, 2, 3, 128, 128) and lse_partial.shape == (5, 2, 3, 128)
    assert o_items.data_ptr() == o_partial.data_ptr() and o_items.shape == (5, 6, 128, 128)
    assert lse_items.data_ptr() == lse_partial.data_ptr() and lse_items.shape == (5, 6, 128)
    assert launch.chosen["num_splits"] == 5 and launch.arguments[5] is None


# ----------------------------------------------------------------------------------------------------
# The A/B script and the plan column
# ----------------------------------------------------------------------------------------------------
def test_ab_script_rows_parse_and_the_switch_moves_the_first_rows():
    script = (Path(__file__).parents[1] / "bench" / "cute_decode_packed_splits_ab.sh").read_text()
    assert "gpu_tests 130 -n 8 tests/test_cute_decode_packed_splits.py" in script
    head, rows = knob_ab_problems("cute_decode_packed_splits_ab.sh", "packed_splits")
    assert head == ["150", "cute_impl.decode:PACKED_PREFILL_SPLITS", "False,True", "cute/decode"], head
    assert rows[:2] == [SEED139_ROW1, SEED107_ROW0]
    moved = [_plan(p)[3] != _plan(p, splits_on=False)[3] for p in rows]
    # 56/6 is uneven work of 128 rows (the packed prefill's guard keeps it off); the last two are the controls.
    assert moved == [True] * 4 + [False, True, True, False, False], moved
    _, checked = knob_ab_problems("packed_prefill_defaults_check.sh", "packed_splits")
    assert checked[:6] == [rows[index] for index in (0, 1, 2, 3, 5, 6)] and checked[-2:] == rows[-2:]
    assert [_plan(p)[3] != _plan(p, splits_on=False)[3] for p in checked] == [True] * 10 + [False] * 2


def test_the_ab_holds_the_packed_prefill_on_through_knob_ab_set():
    from bench.decode_knob_ab import arguments

    script = (Path(__file__).parents[1] / "bench" / "cute_decode_packed_splits_ab.sh").read_text()
    assert 'export KNOB_AB_SET="cute_impl.decode:PACKED_PREFILL_MIN_ROWS=128"' in script
    base = ["--knob", "cute_impl.decode:PACKED_PREFILL_SPLITS", "--values", "False,True", "--rows", "139/1"]
    held = arguments([*base, "--set", "cute_impl.decode:PACKED_PREFILL_MIN_ROWS=128"]).held
    assert held == {"cute_impl.decode": {"PACKED_PREFILL_MIN_ROWS": 128}}
    assert arguments(base).held == {}
    with pytest.raises(SystemExit):  # planted: the module without its constant's name
        arguments([*base, "--set", "cute_impl.decode=128"])


def test_the_ab_plan_column_names_the_splits(monkeypatch: pytest.MonkeyPatch):
    from bench.decode_ragged_ab import describe_plan, plan_of

    monkeypatch.setattr(decode, "PACKED_PREFILL_MIN_ROWS", 128)
    monkeypatch.setattr(decode, "PACKED_PREFILL_SPLITS", True)
    plan = plan_of("cute/decode", SEED139_ROW1, None, CPU)
    assert plan == ("packed-prefill", 32, 4) and "4 key splits" in describe_plan(plan)


# ----------------------------------------------------------------------------------------------------
# sm_90a: the split builds (cute/hopper's kernel with key splits and the merge)
# ----------------------------------------------------------------------------------------------------
COMPILED = {
    "d128-bottom-right-lengths": SEED107_ROW0,
    "d128-non-causal": SEED139_ROW1.with_(causal=False),
    "d64-bottom-right": random_cases(8, 140)[2].problem,
}


@pytest.mark.cute_compile
@pytest.mark.parametrize("case", sorted(COMPILED))
def test_split_builds_compile_without_local_memory(case: str):
    num_splits, _, _, config = _plan(COMPILED[case])
    assert num_splits > 1 and config.key_splits, (num_splits, config)
    (binary,) = decode.HOST.kernels.binaries(config, "cute_decode_packed_splits")
    assert "wgmma.mma_async" in binary.ptx and "mma.sync" not in binary.ptx
    resources = cubin_resources(binary.cubin)
    assert len(resources) == 2 and any("merge_kernel" in kernel for kernel in resources), sorted(resources)
    for kernel, used in resources.items():
        assert used["local_bytes"] == 0 and used["stack_bytes"] == 0, (case, kernel, used)


# ----------------------------------------------------------------------------------------------------
# GPU: forced splits against fp64; a split boundary off by one and log2 merge weights fail
# ----------------------------------------------------------------------------------------------------
# name -> (problem, lengths, splits); the LSE returned, bottom-right causal unless named.
GPU_CASES = {
    "256rows-g16-sq16-d128-full-4": (_problem(2, 2, 16, 16, 2048, 128), None, 4),
    "256rows-g16-sq16-d128-ragged-3": (_problem(4, 2, 16, 16, 1024, 128, has_cache_seqlens=True), RAGGED, 3),
    "256rows-d128-lengths-below-sq-8": (_problem(4, 2, 16, 16, 700, 128, has_cache_seqlens=True), (0, 700, 5, 16), 8),
    "128rows-g8-sq16-d64-ragged-2": (_problem(4, 2, 8, 16, 1024, 64, has_cache_seqlens=True), RAGGED, 2),
    "192rows-g12-sq16-d64-three-warpgroups-5": (_problem(2, 2, 12, 16, 1000, 64), None, 5),
    "128rows-g16-sq8-top-left-2": (_problem(2, 2, 16, 8, 1000, 128).with_(causal_alignment="top_left"), None, 2),
    "128rows-mqa-sq1-7": (_problem(2, 1, 128, 1, 3000, 128), None, 7),
    "160rows-g32-sq5-half-tile-6": (_problem(2, 2, 32, 5, 777, 128), None, 6),
    "256rows-d128-non-causal-4": (_problem(2, 2, 16, 16, 1500, 128).with_(causal=False), None, 4),
    "128rows-d64-non-causal-ragged-3": (_problem(4, 2, 8, 16, 1024, 64, has_cache_seqlens=True).with_(causal=False),
                                        RAGGED, 3),
}  # fmt: skip


NEEDS_SM90 = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
    reason="cute/hopper's kernel needs sm_90",
)


def _check_forced_packed_splits(monkeypatch: pytest.MonkeyPatch, case: str, seed: int):
    """``case`` through the packed prefill with its split count forced, against fp64 on a poisoned output."""
    from tests.test_cute_decode_rows import check_forced_splits

    problem, lengths, num_splits = GPU_CASES[case]
    monkeypatch.setattr(decode, "PACKED_PREFILL_MIN_ROWS", 128)
    monkeypatch.setattr(decode, "packed_prefill_splits", lambda problem, device=None: num_splits)
    plan = decode.launch_plan(problem, torch.device("cuda"))
    assert plan[0] == num_splits and plan[3].key_splits, plan
    return check_forced_splits(problem, lengths, None, seed=seed)


@pytest.mark.gpu
@NEEDS_SM90
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gpu_packed_splits_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    result = _check_forced_packed_splits(monkeypatch, case, seed=len(case))
    assert result.ok, f"{case}: {result.summary()}"


def _off_by_one_kernel_boundary(blocks, seqlen, split, num_splits):
    """Planted in the kernel: every split below the tile's top ends one block short of FA3's boundary where it keeps
    a block (the block at each boundary never visited). Plain arithmetic, as ``key_split_range``: the range and its
    masked count never drop below one block, so producer and consumers still agree (a wrong answer, not a hang)."""
    import cutlass

    part, part_seqlen = key_split_range(blocks, seqlen, split, num_splits)
    below_top = cutlass.min(cutlass.max(blocks.n_block_max - part.n_block_max, 0), 1)
    keeps_one = cutlass.min(cutlass.max(part.n_block_max - part.n_block_min - 1, 0), 1)
    high = part.n_block_max - below_top * keeps_one
    return BlockRange(part.n_block_min, high, cutlass.min(part.n_masked_blocks, high - part.n_block_min)), part_seqlen


PLANTED = {
    "a split boundary off by one": ("cute_impl.hopper.key_split_range", _off_by_one_kernel_boundary),
    "merge weights in log2 units": ((_decode_merge, "COMBINE_LOG2_E"), 1.0),
}


@pytest.mark.gpu
@NEEDS_SM90
@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_gpu_planted_bugs_fail_the_check(bug: str, monkeypatch: pytest.MonkeyPatch):
    case = "256rows-g16-sq16-d128-ragged-3"
    assert _check_forced_packed_splits(monkeypatch, case, seed=1).ok, "the unplanted kernels must pass"
    monkeypatch.setattr(decode.HOST.kernels, "compiled", {})
    target, planted = PLANTED[bug]
    if isinstance(target, tuple):
        monkeypatch.setattr(*target, planted)
    else:
        monkeypatch.setattr(target, planted)
    result = _check_forced_packed_splits(monkeypatch, case, seed=1)
    assert not result.ok, f"{bug} passed the check ({result.summary()})"


def test_planted_kernel_boundary_drops_blocks_on_ints():
    """The GPU test's planted kernel boundary, on Python ints: it breaks the coverage the brute force checks."""
    seqlen = SeqlenInfo(1000, 1000 - 16, True, has_cache_seqlens=True)
    blocks = BlockRange.create_exact(0, seqlen, TILE, TILE, True, packed_seqlen_q=16)
    assert not _split_faults(blocks, seqlen, [15], 3, key_split_range)
    assert _split_faults(blocks, seqlen, [15], 3, _off_by_one_kernel_boundary)
    assert math.isclose(LOG2_E, _decode_merge.COMBINE_LOG2_E)


def test_compile_plan_of_a_row_the_packed_prefill_takes_is_the_padded_split():
    """Seed 98 row 2 (128 packed rows at D=64 over 353k keys): the split rule's splits pass LONG_CHAIN_SPLITS, so
    ``balanced_split`` says yes, but the packed prefill takes the row in 40 key splits and the launch plan makes no
    balanced slabs.
    ``compile_plan`` follows the plan and compiles the padded split's kernels; asking ``balanced_split`` alone, as it
    did until 2026-12-06, handed the shallow ring's rule no slabs and raised a TypeError."""
    problem = random_cases(8, 98)[2].problem
    assert decode.balanced_split(problem) and decode.launch_plan(problem, torch.device("cpu"))[1] is None
    config = decode.compile_plan(problem)
    assert isinstance(config, decode.DecodeConfig) and not config.balanced_min_blocks, config
    for case in random_cases(8, 98):  # none of the seed's rows raises
        decode.compile_plan(case.problem)
