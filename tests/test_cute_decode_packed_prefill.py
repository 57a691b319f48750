"""Issue #38's compute-bound class on cute/hopper's kernel: ``decode.PACKED_PREFILL_MIN_ROWS`` (128) runs a contiguous
cache of many packed rows (group · Sq a KV head) on cute/hopper's persistent forward, q packed as (B, Hkv, group · Sq,
D) by the launch's prologue and O and the LSE written in place (``HopperAttentionConfig.packed_group``: each row's
causal diagonal is its token's).

CPU: on by default from 128 rows, uneven work only from 256 rows and three waves of tiles (every sweep row of seeds
1-239 it takes; the measured losses kept off, planted: without the guard they move); seed 233 row 5's plan is
cute/hopper's configuration (packed group 16, no GQA in the kernel, 128-row tiles, one split), D=64 choosing the
warpgroups that pad least, and paged caches, too few rows, D=256, a grid short of a wave and a forced split count
keeping the split kernels; the packed tile's key-block range against brute force over every row's token (planted: the
row taken for its token fails); the prologue's packing and the in-place outputs inverting each other (planted:
token-major packing fails); the runner's prologue running before the kernel; bench/cute_decode_packed_prefill_ab.sh's
rows parse and the switch moves its first rows only. Static (sm_90a): the packed builds compile through cute/decode's
own kernels without local memory. GPU (``gpu`` marker): on, against fp64 on a poisoned output; planted, the kernel built
without the packing (``packed_group`` 1: each row's diagonal at its row) must fail the check.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

pytest.importorskip("cutlass")

from common.contract import splits
from common.measure.decode_sweep import random_cases
from common.reporting.static import cubin_resources
from cute_impl import _host, decode
from cute_impl._device import BlockRange, SeqlenInfo
from cute_impl._hopper_host import HopperAttentionConfig, default_config
from tests._helpers import (
    PACKED_STAND_IN_CASES,
    knob_ab_problems,
    packed_rows_by_rule,
    packed_rows_match,
    packed_stand_in_matches,
)
from tests.test_cute_decode_rows import RAGGED, _problem
from tests.test_cute_decode_wgmma import check_gpu_case

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _unsplit(monkeypatch: pytest.MonkeyPatch) -> None:
    """This file is the unsplit route's (its GPU A/B ran with the key splits off); the key splits, on by default, are
    tests/test_cute_decode_packed_splits.py's."""
    monkeypatch.setattr(decode, "PACKED_PREFILL_SPLITS", False)


SEED233_ROW5 = random_cases(8, 233)[5].problem  # B=4 H=512 Hkv=32 Sq=16 Sk=22016 D=128: 256 packed rows, 256 tiles
SWITCH = ("PACKED_PREFILL_MIN_ROWS", 128)


def _config(problem, min_rows: int | None = 256, wave_share: float | None = None, num_splits: int | None = None):
    """The compile key of ``problem``'s launch plan on the CPU with the switch at ``min_rows``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decode, "PACKED_PREFILL_MIN_ROWS", min_rows)
        if wave_share is not None:
            patch.setattr(decode, "PACKED_PREFILL_MIN_WAVE_SHARE", wave_share)
        return decode.launch_plan(problem, CPU, num_splits)


def _takes(problem) -> bool:
    """Whether the default plan runs ``problem`` on the packed prefill."""
    return isinstance(decode.launch_plan(problem, CPU)[3], HopperAttentionConfig)


def test_on_by_default_from_128_rows_and_uneven_work_from_256_rows_and_three_waves():
    """Every sweep row of seeds 1-239 the default takes is contiguous with 128+ packed rows, and uneven (lengths over
    more than one sequence) only with 256+ rows and ``splits.UNEVEN_MIN_WAVES`` waves of tiles."""
    assert decode.PACKED_PREFILL_MIN_ROWS == 128 and decode.PACKED_PREFILL_UNEVEN_MIN_ROWS == 256
    taken = [case.problem for seed in range(1, 240) for case in random_cases(8, seed) if _takes(case.problem)]
    assert len(taken) >= 10
    for problem in taken:
        rows = problem.kv_group * problem.seqlen_q
        assert rows >= 128 and not problem.paged, problem.describe()
        if problem.has_cache_seqlens and problem.batch > 1:
            waves = decode.packed_prefill_tiles(problem) / splits.sm_count(CPU)
            assert rows >= 256 and waves >= splits.UNEVEN_MIN_WAVES, problem.describe()
    assert HopperAttentionConfig(torch.bfloat16, 128, True).packed_group == 1
    assert default_config(SEED233_ROW5).packed_group == 1


def test_on_seed233_row5_is_cute_hoppers_kernel_on_packed_rows():
    num_splits, slabs, items, config = _config(SEED233_ROW5)
    assert (num_splits, slabs, items) == (1, None, 4 * 32)
    assert isinstance(config, HopperAttentionConfig)
    expected = dataclasses.replace(default_config(SEED233_ROW5), gqa=False, packed_group=16, consumer_warpgroups=2)
    assert config == expected and config.bottom_right and config.causal
    assert decode.packed_prefill_tiles(SEED233_ROW5) == 256
    with pytest.MonkeyPatch.context() as patch:  # a longer cache keeps the plan (the growing binder's question)
        patch.setattr(decode, "PACKED_PREFILL_MIN_ROWS", 256)
        assert decode.seqlen_k_decisions(SEED233_ROW5.with_seqlen_k(500_000), CPU) == (False, 1)
    assert isinstance(decode.decode_kernel(config), decode.hopper_rung.HopperAttention)


@pytest.mark.parametrize(("group", "seqlen_q", "warpgroups"), [(16, 16, 2), (12, 16, 3), (24, 16, 3), (8, 16, 2)])
def test_d64_takes_the_warpgroups_that_pad_least(group: int, seqlen_q: int, warpgroups: int):
    """256 rows: two 128-row tiles, not two 192-row ones; 192 and 384 rows: 192-row tiles; 128: one 128-row tile."""
    problem = _problem(64, 32, group, seqlen_q, 8192, 64)
    assert decode.packed_prefill_config(problem).consumer_warpgroups == warpgroups


# Problems the switch (at 128 rows) leaves on the split kernels, and why.
LEFT = {
    "paged": SEED233_ROW5.with_(page_size=64, has_cache_seqlens=True),
    "127-rows": _problem(64, 32, 127, 1, 8192, 128),
    "d256": random_cases(8, 229)[2].problem,
    "half-a-wave": SEED233_ROW5.with_(batch=1),  # 64 tiles on 132 SMs
}


@pytest.mark.parametrize("case", sorted(LEFT))
def test_on_leaves_other_problems(case: str):
    assert decode.packed_prefill_splits(LEFT[case]) is None
    assert _config(LEFT[case], 128)[3] == _config(LEFT[case], None)[3]


def test_a_forced_split_count_keeps_the_split_kernel():
    assert _config(SEED233_ROW5, 256, num_splits=3)[0] == 3
    assert not isinstance(_config(SEED233_ROW5, 256, num_splits=3)[3], HopperAttentionConfig)


def test_the_wave_share_decides_a_grid_short_of_the_sms():
    """133 tiles on 132 SMs fill 50 % of two waves: refused at 0.9, taken at 0."""
    problem = _problem(133, 1, 16, 8, 8192, 128)
    assert decode.packed_prefill_tiles(problem) == 133
    assert splits.wave_efficiency(133, splits.sm_count(CPU)) < 0.9
    assert not isinstance(_config(problem, 128)[3], HopperAttentionConfig)
    assert isinstance(_config(problem, 128, wave_share=0.0)[3], HopperAttentionConfig)


# ----------------------------------------------------------------------------------------------------
# The packed tile's key blocks, on Python ints
# ----------------------------------------------------------------------------------------------------
def _tile_blocks_hold(blocks: BlockRange, tokens: list[int], seqlen: SeqlenInfo, tile_n: int) -> bool:
    """Every key some row sees lies below ``n_block_max``, and every key of the unmasked blocks is seen by every row
    (row of token t sees j < seqlen_k with j <= t + causal_offset)."""
    sees = [min(seqlen.seqlen_k, t + 1 + seqlen.causal_offset) for t in tokens]
    reached = max(sees, default=0) <= blocks.n_block_max * tile_n
    last_unmasked = blocks.n_block_max - blocks.n_masked_blocks
    unmasked_seen = all((n + 1) * tile_n <= min(sees) for n in range(blocks.n_block_min, last_unmasked))
    return reached and unmasked_seen


@pytest.mark.parametrize("bottom_right", [True, False], ids=["bottom-right", "top-left"])
def test_packed_block_range_against_every_rows_token(bottom_right: bool):
    """Rows (head in group) · Sq + token in 128-row tiles, against brute force; planted: the range of the same tile
    taken with its row indices as tokens (``packed_seqlen_q`` dropped) must fail somewhere."""
    tile_m, tile_n, row_as_token_fails = 128, 128, False
    for seqlen_q in (1, 5, 16):
        for group in (8, 16, 40):
            for seqlen_k in (0, 3, 16, 130, 200, 1000):
                offset = seqlen_k - seqlen_q if bottom_right else 0
                seqlen = SeqlenInfo(seqlen_k, offset, bottom_right, has_cache_seqlens=True)
                rows = group * seqlen_q
                for m_block in range(-(-rows // tile_m)):
                    tokens = [r % seqlen_q for r in range(m_block * tile_m, min(rows, (m_block + 1) * tile_m))]
                    blocks = BlockRange.create_exact(m_block, seqlen, tile_m, tile_n, True, packed_seqlen_q=seqlen_q)
                    where = (seqlen_q, group, seqlen_k, m_block)
                    assert blocks.n_block_min == 0 and blocks.n_block_max >= 1, where
                    assert _tile_blocks_hold(blocks, tokens, seqlen, tile_n), where
                    as_rows = BlockRange.create_exact(m_block, seqlen, tile_m, tile_n, True)
                    row_as_token_fails |= not _tile_blocks_hold(as_rows, tokens, seqlen, tile_n)
    assert row_as_token_fails


# ----------------------------------------------------------------------------------------------------
# The prologue's packing and the in-place outputs (CPU tensors, the kernel simulated)
# ----------------------------------------------------------------------------------------------------
def _simulated_round_trip(problem, token_major: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q through the launch's prologue, a stand-in kernel writing each packed row's O = 2 q and LSE = its row's
    first value, and the launch's result: (q, O, LSE) as the caller sees them. ``token_major`` (planted) packs row
    token · group + head in group instead of the prologue."""
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(problem.batch, problem.seqlen_q, problem.heads, problem.head_dim, generator=generator)
    q = q.to(problem.dtype).transpose(1, 2)  # (B, H, Sq, D), the layout bind passes
    k = torch.zeros(problem.batch, problem.kv_heads, problem.seqlen_k, problem.head_dim, dtype=problem.dtype)
    launch = decode.packed_prefill_launch(q, k, k, problem, decode.packed_prefill_config(problem), None)
    packed_q, out_packed, lse_packed = launch.arguments[0], launch.arguments[3], launch.arguments[4]
    if token_major:
        by_token = q.unflatten(1, (problem.kv_heads, problem.kv_group)).transpose(2, 3)  # (B, Hkv, Sq, group, D)
        packed_q.view(by_token.shape).copy_(by_token)
    else:
        launch.prologue()
    out_packed.copy_(2 * packed_q)
    lse_packed.copy_(packed_q[..., 0].float())
    out, lse = launch.result
    return q, out, lse


def test_the_packing_and_the_in_place_outputs_invert_each_other():
    problem = _problem(2, 3, 8, 5, 64, 128)
    q, out, lse = _simulated_round_trip(problem)
    assert out.shape == q.shape and torch.equal(out, 2 * q)
    assert torch.equal(lse, q[..., 0].float())


def test_planted_token_major_packing_fails_the_round_trip():
    q, out, _ = _simulated_round_trip(_problem(2, 3, 8, 5, 64, 128), token_major=True)
    assert not torch.equal(out, 2 * q)


def _packed_kernel_stand_in(problem, lengths: tuple[int, ...], token_of_row) -> tuple[torch.Tensor, torch.Tensor]:
    """cute/decode's packed route on CPU tensors with the kernel replaced by its rule in float64: packed row r of a KV
    head sees key j < its sequence's length and, causal, j <= token_of_row(r) + causal offset (Sk - Sq bottom-right,
    0 top-left), as ``HopperAttentionConfig.packed_group`` asks of the kernel; returns the launch's (O, LSE) and the
    float64 reference's."""
    from common.contract.inputs import make_inputs
    from common.contract.reference import reference_attention

    q, k, v = make_inputs(problem, seed=3, device="cpu", offset=0.5)  # (B, H, Sq, D), (B, Hkv, Sk, D)
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32)
    launch = decode.packed_prefill_launch(q, k, v, problem, decode.packed_prefill_config(problem), cache_seqlens)
    launch.prologue()
    packed_q, out_packed, lse_packed = launch.arguments[0], launch.arguments[3], launch.arguments[4]
    packed_rows_by_rule(problem, lengths, token_of_row, k, v, packed_q, out_packed, lse_packed)
    reference = reference_attention(q, k, v, problem, cache_seqlens=cache_seqlens, with_lse=True)
    return launch.result, reference


@pytest.mark.parametrize("case", sorted(PACKED_STAND_IN_CASES))
def test_the_packed_rows_with_their_tokens_diagonal_are_the_gqa_problem(case: str):
    """The route's packing, the kernel's masking rule (each row's token is row % Sq) and the in-place outputs give
    the original problem's O and LSE (float64 against the reference, O rounded once to the output dtype)."""
    assert packed_stand_in_matches(_packed_kernel_stand_in, case)


def test_planted_token_major_diagonal_fails_the_gqa_problem():
    """The diagonal at row // group (a token-major packing's token) on the head-major rows: O differs."""
    problem, lengths = PACKED_STAND_IN_CASES["bottom-right-ragged"]
    (out, lse), reference = _packed_kernel_stand_in(problem, lengths, lambda r: r // problem.kv_group)
    assert not packed_rows_match(out, lse, reference, check_lse=False)


def test_the_runner_runs_the_prologue_before_the_kernel():
    calls = []
    launch = _host.Launch("key", (1, 2), "result", {"num_splits": 1}, prologue=lambda: calls.append("prologue"))
    run = _host.launch_runner(lambda *args: calls.append(("kernel", args)), launch)
    assert run() == "result" and run.num_splits == 1
    assert calls == ["prologue", ("kernel", (1, 2))]
    plain = _host.launch_runner(lambda *args: calls.append("plain"), launch._replace(prologue=None))
    assert plain() == "result" and calls[-1] == "plain"


def test_ab_script_rows_parse_and_the_switch_moves_the_first_rows():

    script = (Path(__file__).parents[1] / "bench" / "cute_decode_packed_prefill_ab.sh").read_text()
    assert "gpu_tests 120 -n 8 tests/test_cute_decode_packed_prefill.py" in script
    head, rows = knob_ab_problems("cute_decode_packed_prefill_ab.sh", "packed_prefill")
    assert head == ["240", "cute_impl.decode:PACKED_PREFILL_MIN_ROWS", "None,128,256", "cute/decode"], head
    assert rows[0] == SEED233_ROW5
    moved = [isinstance(_config(problem, 128)[3], HopperAttentionConfig) for problem in rows]
    # 62/1 (128 tiles), 214/0 (128 tiles) and 69/4 (128 rows) are uneven work the guard keeps on the split kernels;
    # 139/1 and 107/0 fill too little of a wave unsplit.
    assert moved == [True] * 5 + [False, True, False, True, False, True, False, False], moved


def test_defaults_check_rows_parse_and_the_default_moves_all_but_the_control():
    """bench/packed_prefill_defaults_check.sh's rows against None: the default takes every row but the last, uneven
    work of 256 tiles; a drawn row's lengths go with its cache lengths and its batch (a changed batch asks 'full')."""
    from bench.decode_knob_ab import parse_row

    head, rows = knob_ab_problems("packed_prefill_defaults_check.sh", "packed_default")
    assert head == ["110", "cute_impl.decode:PACKED_PREFILL_MIN_ROWS", "128,None", "cute/decode"], head
    assert [_takes(problem) for problem in rows] == [True] * 4 + [False]
    assert parse_row("62/1:has_cache_seqlens=False")[1].lengths is None
    with pytest.raises(SystemExit, match="add 'full'"):
        parse_row("176/6:batch=4")


def test_uneven_work_below_256_rows_or_three_waves_keeps_the_split_kernels(monkeypatch: pytest.MonkeyPatch):
    """The measured losses (H100, 2026-12-05) stay on the split kernels; planted: without the guard they move."""
    from bench.decode_knob_ab import parse_row

    row = lambda name: parse_row(name)[1].problem  # noqa: E731
    lost = [row(name) for name in ("62/1", "214/0", "69/4")]
    assert not any(_takes(problem) for problem in lost) and _takes(row("176/6"))
    monkeypatch.setattr(decode, "PACKED_PREFILL_UNEVEN_MIN_ROWS", 128)
    monkeypatch.setattr(splits, "UNEVEN_MIN_WAVES", 0)
    assert all(_takes(problem) for problem in lost)


def test_the_ab_plan_column_names_the_packed_route(monkeypatch: pytest.MonkeyPatch):
    from bench.decode_ragged_ab import describe_plan, plan_of

    monkeypatch.setattr(decode, "PACKED_PREFILL_MIN_ROWS", None)
    assert plan_of("cute/decode", SEED233_ROW5, None, CPU)[0] == "padded"
    monkeypatch.setattr(decode, "PACKED_PREFILL_MIN_ROWS", 128)
    plan = plan_of("cute/decode", SEED233_ROW5, None, CPU)
    assert plan == ("packed-prefill", 256) and "prefill kernel" in describe_plan(plan)


# ----------------------------------------------------------------------------------------------------
# sm_90a: the packed builds through cute/decode's kernels
# ----------------------------------------------------------------------------------------------------
COMPILED = {
    "d128-bottom-right-lengths": SEED233_ROW5.with_(batch=8, has_cache_seqlens=True),
    "d64-top-left": _problem(64, 32, 16, 16, 8192, 64).with_(causal_alignment="top_left"),
    "d128-non-causal": SEED233_ROW5.with_(causal=False),
}


@pytest.mark.cute_compile
@pytest.mark.parametrize("case", sorted(COMPILED))
def test_packed_builds_compile_without_local_memory(case: str):
    config = _config(COMPILED[case], 128)[3]
    assert isinstance(config, HopperAttentionConfig) and config.packed_group == 16, config
    (binary,) = decode.HOST.kernels.binaries(config, "cute_decode_packed_prefill")
    assert "wgmma.mma_async" in binary.ptx and "mma.sync" not in binary.ptx
    for kernel, resources in cubin_resources(binary.cubin).items():
        assert resources["local_bytes"] == 0 and resources["stack_bytes"] == 0, (case, kernel, resources)


# ----------------------------------------------------------------------------------------------------
# GPU: on, against fp64; the kernel without the packing fails
# ----------------------------------------------------------------------------------------------------
# name -> (problem, lengths, forced splits (None: the packed route), BALANCED_SPLIT); the LSE returned.
GPU_CASES = {
    "256rows-g16-sq16-d128-full": (_problem(2, 2, 16, 16, 2048, 128), None, None, "never"),
    "256rows-g16-sq16-d128-ragged": (_problem(4, 2, 16, 16, 1024, 128, has_cache_seqlens=True), RAGGED, None,
                                     "never"),
    "256rows-d128-lengths-below-sq": (_problem(4, 2, 16, 16, 700, 128, has_cache_seqlens=True), (0, 700, 5, 16),
                                      None, "never"),
    "128rows-g8-sq16-d64-ragged": (_problem(4, 2, 8, 16, 1024, 64, has_cache_seqlens=True), RAGGED, None, "never"),
    "192rows-g12-sq16-d64-three-warpgroups": (_problem(2, 2, 12, 16, 1000, 64), None, None, "never"),
    "128rows-g16-sq8-top-left": (_problem(2, 2, 16, 8, 1000, 128).with_(causal_alignment="top_left"), None, None,
                                 "never"),
    "128rows-mqa-sq1": (_problem(2, 1, 128, 1, 3000, 128), None, None, "never"),
    "160rows-g32-sq5-half-tile": (_problem(2, 2, 32, 5, 777, 128), None, None, "never"),
    "256rows-d128-non-causal": (_problem(2, 2, 16, 16, 1500, 128).with_(causal=False), None, None, "never"),
}  # fmt: skip


NEEDS_SM90 = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
    reason="cute/hopper's kernel needs sm_90",
)


def _small_grids_take_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test grids are small and their lengths few: the plan's wave share and uneven-work guard let them in."""
    monkeypatch.setattr(decode, "PACKED_PREFILL_MIN_WAVE_SHARE", 0.0)
    monkeypatch.setattr(decode, "PACKED_PREFILL_UNEVEN_MIN_ROWS", 128)
    monkeypatch.setattr(splits, "UNEVEN_MIN_WAVES", 0)


@pytest.mark.gpu
@NEEDS_SM90
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gpu_packed_prefill_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    _small_grids_take_it(monkeypatch)
    check_gpu_case(case, GPU_CASES[case], monkeypatch, SWITCH, "packed_group")


@pytest.mark.gpu
@NEEDS_SM90
@pytest.mark.parametrize("case", ["256rows-g16-sq16-d128-ragged", "128rows-g16-sq8-top-left"])
def test_gpu_planted_kernel_without_the_packing_fails_the_check(case: str, monkeypatch: pytest.MonkeyPatch):
    """The same plan with ``packed_group`` 1 compiled in: the kernel takes its rows for tokens (the diagonal at the
    row, the bottom-right offset Sk - group · Sq)."""
    from tests.test_cute_decode_rows import check_forced_splits

    _small_grids_take_it(monkeypatch)
    monkeypatch.setattr(decode, *SWITCH)
    problem, lengths, _, balanced = GPU_CASES[case]
    monkeypatch.setattr(decode, "BALANCED_SPLIT", balanced)
    assert check_forced_splits(problem, lengths, None, seed=1).ok, "the unplanted kernel must pass"
    real = decode.packed_prefill_config
    unpacked = lambda p, key_splits=False: dataclasses.replace(real(p, key_splits), packed_group=1)  # noqa: E731
    monkeypatch.setattr(decode, "packed_prefill_config", unpacked)
    result = check_forced_splits(problem, lengths, None, seed=1)
    assert not result.ok, f"the kernel without the packing passed the check ({result.summary()})"
