"""Rung-specific tests of ``cute/hopper`` (and the FP8 build of its kernel): refusals, registers, LSE,
persistent tiles. FP8 accuracy and variants: ``tests/test_fp8_rungs.py``."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch

pytest.importorskip("cutlass")

from common.contract.check import check_on_inputs, judge_output, run_poisoned, sdpa_error
from common.contract.inputs import make_inputs
from common.contract.metrics import error_stats
from common.contract.problem import Problem
from common.contract.reference import reference_attention
from common.reporting.static import cubin_resources
from cute_impl import _hopper_device, fp8, hopper
from cute_impl._device import BlockRange, SeqlenInfo
from cute_impl._hopper_device import TileScheduler
from tests._helpers import MASKS, check_features, edge_cache_seqlens, feature_grid, feature_problem


# ----------------------------------------------------------------------------------------------------
# CPU
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("impl", [hopper.IMPLEMENTATION, fp8.IMPLEMENTATION], ids=lambda impl: impl.name)
def test_refuses_what_it_cannot_run(impl):
    assert impl.check(Problem(1, 1, 64, 64, 128), torch.device("cpu"))[0] is False
    ok, reason = hopper.common_problem_supported(Problem(1, 1, 64, 64, 256))
    assert not ok and "head_dim" in reason and "256" in reason
    ok, reason = hopper.common_problem_supported(Problem(1, 1, 64, 64, 64, softmax_scale=-0.5))
    assert not ok and "softmax_scale" in reason


@pytest.mark.cute_compile
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_d64_runs_three_consumer_warpgroups_at_160_registers(causal: bool):
    """D=64's default: 512 threads, consumers raised to 160 registers; the non-causal build does not spill."""
    binary = hopper.compile_sm90(Problem(4, 32, 8192, 8192, 64, causal=causal))[0]
    assert ".reqntid 512, 1, 1" in binary.ptx
    assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+160;", binary.ptx)
    stack = max(usage["stack_bytes"] for usage in cubin_resources(binary.cubin).values())
    print(f"cute/hopper D=64 {'causal' if causal else 'full'}: {stack} stack bytes")
    if not causal:
        assert stack == 0, f"non-causal D=64 spills {stack} bytes"


@pytest.mark.cute_compile
@pytest.mark.parametrize("fp8_operands", [False, True], ids=["bf16", "fp8"])
def test_persistent_kernel_loops_over_tiles(fp8_operands: bool):
    """D=128 defaults are persistent, causal too; causal D=64 keeps one CTA per tile. The tile loop
    reloads Q only after its Q-empty barrier."""
    problem = Problem(2, 16, 8192, 8192, 128, causal=True)
    config = hopper.default_config(problem, fp8=fp8_operands)
    assert config.persistent and hopper.default_config(problem.with_(causal=False), fp8=fp8_operands).persistent
    assert not hopper.default_config(problem.with_(head_dim=64), fp8=fp8_operands).persistent
    ptx = hopper.KERNELS.binaries(config, "persistent_probe")[0].ptx
    # Q-full and Q-empty waits plus the K and V rings: more mbarrier waits than the per-tile kernel.
    assert "%nctaid.x" in ptx, "the snake over tiles is dealt by the grid size"
    assert len(re.findall(r"mbarrier\.try_wait", ptx)) >= 4


@pytest.mark.parametrize(("ctas", "tiles"), [(3, 10), (132, 2048), (132, 132), (7, 1000)])
def test_snake_deals_every_tile_once(ctas: int, tiles: int):
    dealt = [
        TileScheduler.tile_of_cta(local, cta, ctas)
        for cta in range(ctas)
        for local in range(TileScheduler.tiles_of_cta(cta, ctas, tiles))
    ]
    assert sorted(dealt) == list(range(tiles))


def test_snake_balances_longest_first_causal_tiles():
    """B=2 H=16 S=8192 causal at 128 rows per tile: 64 query blocks per head, longest (64 key blocks)
    first. Dealt as a snake over 132 CTAs, the busiest CTA has 3 % more key blocks than the average; a
    plain round robin gives CTA 0 the longest tile of every round (+8 %)."""
    ctas, query_blocks, heads = 132, 64, 32
    blocks = [query_blocks - tile % query_blocks for tile in range(query_blocks * heads)]

    def busiest(tiles_per_cta: list[list[int]]) -> float:
        work = [sum(blocks[tile] for tile in tiles) for tiles in tiles_per_cta]
        return max(work) / (sum(work) / ctas)

    snake = busiest(
        [
            [
                TileScheduler.tile_of_cta(local, cta, ctas)
                for local in range(TileScheduler.tiles_of_cta(cta, ctas, len(blocks)))
            ]
            for cta in range(ctas)
        ]
    )
    round_robin = busiest([list(range(cta, len(blocks), ctas)) for cta in range(ctas)])
    assert snake < 1.04 < 1.07 < round_robin, (snake, round_robin)


def _unmasked_blocks_are_fully_visible(
    blocks: BlockRange, m_block: int, seqlen_k: int, tile_m: int, tile_n: int, causal_offset: int = 0
):
    """Every key of every block below the masked top ones is visible to every row of the tile."""
    last_unmasked = blocks.n_block_max - blocks.n_masked_blocks
    first_row = m_block * tile_m
    visible = min(seqlen_k, first_row + 1 + causal_offset)
    return all((n + 1) * tile_n <= visible for n in range(blocks.n_block_min, last_unmasked))


@pytest.mark.parametrize(("tile_m", "tile_n"), [(128, 128), (192, 128)], ids=["D128", "D64"])
def test_causal_block_range_visits_every_visible_key_and_masks_every_partial_block(tile_m: int, tile_n: int):
    """BlockRange on Python ints against brute force: n_block_max is one past the last block holding a
    key that some row of the tile sees (causal, top-left), and the unmasked blocks are fully visible.
    Planted bug: one masked block fewer leaves a partial block unmasked somewhere."""
    one_fewer_fails = False
    for seqlen_k in (1, 77, 128, 1000, 1024):
        for m_block in range(-(-1100 // tile_m)):
            blocks = BlockRange.create_exact(
                m_block, SeqlenInfo(seqlen_k, 0, False, False), tile_m, tile_n, causal=True
            )
            last_row = (m_block + 1) * tile_m - 1
            assert blocks.n_block_min == 0
            assert blocks.n_block_max == min(seqlen_k - 1, last_row) // tile_n + 1, (m_block, seqlen_k)
            assert _unmasked_blocks_are_fully_visible(blocks, m_block, seqlen_k, tile_m, tile_n), (m_block, seqlen_k)
            fewer = BlockRange(0, blocks.n_block_max, blocks.n_masked_blocks - 1)
            one_fewer_fails |= not _unmasked_blocks_are_fully_visible(fewer, m_block, seqlen_k, tile_m, tile_n)
    assert one_fewer_fails


@pytest.mark.parametrize(("tile_m", "tile_n"), [(128, 128), (192, 128)], ids=["D128", "D64"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_block_range_with_causal_offset_and_cache_lengths(tile_m: int, tile_n: int, causal: bool):
    """Bottom-right alignment and per-sequence lengths, on Python ints against brute force: every key
    some row of the tile sees (j < seqlen_k, causal j <= i + seqlen_k - Sq) lies below n_block_max, the
    unmasked blocks are seen in full by every row, and a tile whose rows see no key still visits one
    (fully masked) block. Planted bug: the causal offset ignored drops visible keys somewhere."""
    offset_ignored_fails = False
    for seqlen_q in (1, 77, 1000):
        for seqlen_k in (0, 1, 77, 128, 1000):
            offset = seqlen_k - seqlen_q
            seqlen = SeqlenInfo(seqlen_k, offset, bottom_right=causal, has_cache_seqlens=True)
            ignored = SeqlenInfo(seqlen_k, 0, bottom_right=False, has_cache_seqlens=True)
            for m_block in range(-(-seqlen_q // tile_m)):
                rows = range(m_block * tile_m, min((m_block + 1) * tile_m, seqlen_q))
                seen = [j for i in rows for j in range(seqlen_k) if not causal or j <= i + offset]
                blocks = BlockRange.create_exact(m_block, seqlen, tile_m, tile_n, causal=causal)
                where = (seqlen_q, seqlen_k, m_block)
                assert blocks.n_block_min == 0 and blocks.n_block_max >= 1, where
                assert all(j < blocks.n_block_max * tile_n for j in seen), where
                assert blocks.n_block_max == max(1, -(-(max(seen, default=-1) + 1) // tile_n)) or not causal, where
                assert _unmasked_blocks_are_fully_visible(
                    blocks, m_block, seqlen_k, tile_m, tile_n, offset if causal else seqlen_k
                ), where
                wrong = BlockRange.create_exact(m_block, ignored, tile_m, tile_n, causal=causal)
                offset_ignored_fails |= not all(j < wrong.n_block_max * tile_n for j in seen)
    assert offset_ignored_fails or not causal


def test_problem_features_are_in_the_compile_key():
    """Each feature that changes the kernel changes the config (the compile-cache key); returning the
    LSE does not (the epilogue always writes it), and the plain problem keeps the canonical config."""
    plain = Problem(2, 16, 1000, 8192, 128, causal=True)
    base = hopper.default_config(plain)
    assert not (base.gqa or base.bottom_right or base.has_cache_seqlens)
    assert hopper.default_config(plain.with_(kv_heads=4)) == dataclasses.replace(base, gqa=True)
    assert hopper.default_config(plain.with_(causal_alignment="bottom_right")) == dataclasses.replace(
        base, bottom_right=True
    )
    assert hopper.default_config(plain.with_(has_cache_seqlens=True)) == dataclasses.replace(
        base, has_cache_seqlens=True
    )
    assert hopper.default_config(plain.with_(return_lse=True)) == base
    # Sq = Sk: the two alignments are the same mask, and the kernel is the canonical one.
    square = Problem(2, 16, 512, 512, 128, causal=True)
    assert hopper.default_config(square.with_(causal_alignment="bottom_right")) == hopper.default_config(square)


@pytest.mark.cute_compile
@pytest.mark.parametrize("fp8_operands", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_every_feature_at_once_compiles_without_spills(head_dim: int, fp8_operands: bool):
    """GQA, bottom-right causal, per-sequence lengths and the LSE together (16-bit and FP8): no local memory."""
    problem = Problem(
        2, 16, 1000, 8192, head_dim, causal=True, kv_heads=4, causal_alignment="bottom_right",
        has_cache_seqlens=True, return_lse=True,
    )  # fmt: skip
    binary = (fp8 if fp8_operands else hopper).compile_sm90(problem)[0]
    usage = cubin_resources(binary.cubin).values()
    assert max(u["local_bytes"] for u in usage) == 0 and max(u["stack_bytes"] for u in usage) == 0


def test_supports_every_feature(monkeypatch):
    """cute/hopper and cute/fp8 take GQA, both alignments, cache_seqlens and the LSE (fp8's judged
    against its emulation, which takes the key lengths and returns the LSE with a bound)."""
    monkeypatch.setattr(hopper, "hopper_device_supported", lambda device: (True, ""))
    device = torch.device("cuda")
    everything = Problem(
        2, 8, 77, 1000, 128, causal=True, kv_heads=1, causal_alignment="bottom_right",
        has_cache_seqlens=True, return_lse=True,
    )  # fmt: skip
    assert hopper.supports(everything, device) == (True, "")
    assert fp8.supports(everything, device) == (True, "")
    assert fp8.supports(everything.with_(has_cache_seqlens=False, return_lse=False), device) == (True, "")


def test_cache_seqlens_come_exactly_with_a_problem_that_has_them():
    """A problem with per-sequence lengths and no tensor of them (or the reverse) is refused before
    anything is validated or compiled, naming cache_seqlens: never silently run without the lengths."""
    q = torch.zeros(1, 2, 64, 128, dtype=torch.bfloat16)
    problem = Problem(1, 2, 64, 64, 128, causal=True, causal_alignment="bottom_right", has_cache_seqlens=True)
    with pytest.raises(ValueError, match="cache_seqlens"):
        hopper.prepare(q, q, q, problem)
    with pytest.raises(ValueError, match="cache_seqlens"):
        hopper.prepare(q, q, q, problem.with_(has_cache_seqlens=False), cache_seqlens=torch.full((1,), 64))


def test_register_split_fits_the_launch_allocation():
    for warpgroups, registers in _hopper_device.CONSUMER_REGISTERS.items():
        assert _hopper_device.registers_fit(warpgroups, registers), f"{warpgroups} warpgroups at {registers}"
        assert not _hopper_device.registers_fit(warpgroups, registers + _hopper_device.REGISTER_GRANULE)
    # The hang found on the H200: four consumer warpgroups asking for 120 registers.
    assert _hopper_device.registers_fit(4, 112) and not _hopper_device.registers_fit(4, 120)


def _gemm_events(ptx: str) -> str:
    """The PTX's order of WGMMA fences (F), commits (C), waits (W) and warp votes (V, the O rescale)."""
    codes = {"wgmma.fence": "F", "wgmma.commit_group": "C", "wgmma.wait_group": "W", "vote.sync.any": "V"}
    pattern = "|".join(re.escape(op) for op in codes)
    return "".join(codes[match] for match in re.findall(pattern, ptx))


@pytest.mark.cute_compile
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_o_rescale_is_issued_under_the_qk_gemm(head_dim: int, causal: bool):
    """16-bit: a main-loop step issues S = Q Kᵀ, multiplies O by the factor the previous softmax
    update left (its vote.sync.any branch), then issues O += P V, so the multiply runs under the
    tensor cores' S GEMM instead of after the softmax. Every step that issues two GEMMs has the vote
    between them; the kernel before this change issued them back to back (FCFC) and rescaled after
    ``wait_group 0``. FP8 keeps that order: its per-block P V is added to O before the rescale."""
    problem = Problem(2, 16, 8192, 8192, head_dim, causal=causal)
    events = _gemm_events(hopper.compile_sm90(problem)[0].ptx)
    assert "FCVFC" in events, events
    assert "FCFC" not in events, events
    fp8_events = _gemm_events(fp8.compile_sm90(problem)[0].ptx)
    assert "FCFC" in fp8_events and "FCVFC" not in fp8_events, fp8_events


# ----------------------------------------------------------------------------------------------------
# GPU
# ----------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlens", [(1, 1), (77, 1000), (1000, 77), (333, 333)], ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_hopper_lse_matches_reference(seqlens: tuple[int, int], head_dim: int, causal: bool):
    problem = Problem(2, 3, *seqlens, head_dim, dtype=torch.bfloat16, causal=causal)
    q, k, v = make_inputs(problem, seed=5)
    run = hopper.prepare(q, k, v, problem)
    run()
    scores = (q.double() @ k.double().transpose(-1, -2)) * problem.scale
    if causal:
        rows = torch.arange(problem.seqlen_q, device=q.device)[:, None]
        cols = torch.arange(problem.seqlen_k, device=q.device)[None, :]
        scores = scores.masked_fill(cols > rows, -math.inf)
    expected = torch.logsumexp(scores, dim=-1)
    assert torch.allclose(run.lse.double(), expected, atol=2e-2, rtol=1e-3), (run.lse.double() - expected).abs().max()


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("fp8_operands", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("seqlens", [(1, 1), (77, 1000), (1000, 77), (700, 700)], ids=str)
def test_persistent_ctas_walking_many_tiles(seqlens: tuple[int, int], head_dim: int, fp8_operands: bool, causal: bool):
    """Three persistent CTAs for dozens of tiles: every CTA reuses its Q boxes, K/V ring and O boxes
    across tiles, so a missed barrier phase or an O box rewritten under its TMA store shows up here.
    Causal tiles differ in length, so the CTAs also drift apart."""
    problem = Problem(3, 5, *seqlens, head_dim, dtype=torch.bfloat16, causal=causal)
    q, k, v = make_inputs(problem, seed=7, offset=0.5)
    if fp8_operands:
        quantisation = fp8.DEFAULT_QUANTISATION
        config = dataclasses.replace(fp8.fp8_config(problem, quantisation), persistent=True)
        run = fp8.quantised_launcher(config, fp8.quantised(q, k, v, quantisation), problem, sm_count=3)
        impl = fp8.IMPLEMENTATION
    else:
        config = dataclasses.replace(hopper.default_config(problem), persistent=True)
        run = hopper.KERNELS.launcher(config, q, k, v, problem.scale * hopper.LOG2_E, 1.0, sm_count=3)
        impl = hopper.IMPLEMENTATION
    ref = reference_attention(q, k, v, problem)
    out = run_poisoned(run)
    err = error_stats(out, ref)
    ok, reason, _ = judge_output(impl, out, err, (q, k, v), problem, ref, sdpa_error(q, k, v, problem, ref))
    assert ok, f"{problem.describe()}: {reason} ({err.summary()})"


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_reference_overtaken_by_later_key_blocks(head_dim: int, dtype: torch.dtype, causal: bool):
    """Key blocks are visited last to first. Keys 0-199 score about 4x higher, so when their blocks come
    the block maximum passes the lazy reference by far more than 2^8 and O must be rescaled; rows 500+
    have nearly flat scores and keep their reference, in the same warpgroups."""
    problem = Problem(2, 3, 1000, 1000, head_dim, dtype=dtype, causal=causal)
    q, k, v = make_inputs(problem, seed=17, offset=0.5)
    k[:, :, :200] *= 4
    q[:, :, 500:] *= 0.05
    result = check_on_inputs(hopper.IMPLEMENTATION, q, k, v, problem)
    assert result.ok, result.summary()


@pytest.mark.gpu
def test_hopper_reads_strided_views():
    """q, k, v as (B, S, H, D) storage viewed as (B, H, S, D): TMA takes the strides as they are."""
    problem = Problem(2, 4, 300, 500, 64, dtype=torch.float16)
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in make_inputs(problem, seed=3, offset=0.5))
    out = hopper.prepare(q, k, v, problem)()
    ref = reference_attention(q, k, v, problem)
    err = error_stats(out, ref)
    assert err.rel_l2_err < 1e-2, err.summary()


@feature_grid()
def test_hopper_gqa_alignments_cache_seqlens_and_lse(
    head_dim: int, kv_heads: int, seqlens: tuple[int, int], mask: str, cache_lengths: bool
):
    """GQA (8 query heads over 1 or 4 KV heads, each KV head its own values), both causal alignments
    with Sq != Sk (bottom-right with Sq > Sk leaves rows that see no key: O = 0, LSE = -inf), and
    per-sequence lengths Sk, 0 and ragged; O against the fp64 reference by the rung's rule and the LSE
    by the contract's LSE rule, on poisoned outputs."""
    check_features(hopper.IMPLEMENTATION, feature_problem(seqlens, head_dim, kv_heads, mask, cache_lengths), seed=11)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8_operands", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("seqlens", [(77, 1000), (1000, 77), (700, 700)], ids=str)
def test_persistent_ctas_with_gqa_and_bottom_right(seqlens: tuple[int, int], head_dim: int, fp8_operands: bool):
    """Three persistent CTAs over dozens of tiles of a GQA bottom-right problem (and, 16-bit, per-sequence
    lengths): tiles that see no key still run their one fully masked block, so the rings stay in step."""
    cache_lengths = not fp8_operands
    problem = feature_problem(seqlens, head_dim, 1, "causal_bottom_right", cache_lengths, return_lse=False, heads=5)
    q, k, v = make_inputs(problem, seed=7, offset=0.5)
    if fp8_operands:
        quantisation = fp8.DEFAULT_QUANTISATION
        config = dataclasses.replace(fp8.fp8_config(problem, quantisation), persistent=True)
        run = fp8.quantised_launcher(config, fp8.quantised(q, k, v, quantisation), problem, sm_count=3)
        impl, cache_seqlens = fp8.IMPLEMENTATION, None
    else:
        cache_seqlens = edge_cache_seqlens(problem.batch, problem.seqlen_k, q.device)
        config = dataclasses.replace(hopper.default_config(problem), persistent=True)
        run = hopper.KERNELS.launcher(
            config, q, k, v, problem.scale * hopper.LOG2_E, 1.0, sm_count=3, cache_seqlens=cache_seqlens
        )
        impl = hopper.IMPLEMENTATION
    ref = reference_attention(q, k, v, problem, cache_seqlens=cache_seqlens)
    out = run_poisoned(run)
    err = error_stats(out, ref)
    yardstick = sdpa_error(q, k, v, problem, ref, cache_seqlens)
    ok, reason, _ = judge_output(impl, out, err, (q, k, v), problem, ref, yardstick)
    assert ok, f"{problem.describe()}: {reason} ({err.summary()})"


@pytest.mark.gpu
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("seqlens", [(77, 1000), (1000, 77)], ids=str)
@pytest.mark.parametrize("kv_heads", [1, 4], ids=["mqa", "gqa4"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_fp8_gqa_and_bottom_right_match_the_emulation(
    head_dim: int, kv_heads: int, seqlens: tuple[int, int], mask: str
):
    """cute/fp8 with K and V (and their block scales) read at the KV head, judged by FP8_RULE against
    the emulation of its own per-KV-head quantisation; both alignments with Sq != Sk."""
    problem = feature_problem(seqlens, head_dim, kv_heads, mask, False, return_lse=False)
    q, k, v = make_inputs(problem, seed=13, offset=0.5)
    result = check_on_inputs(fp8.IMPLEMENTATION, q, k, v, problem)
    assert result.ok, f"{problem.describe()}: {result.summary()}"
