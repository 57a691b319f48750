"""cute/decode beyond the shared decode tests (``tests/test_decode.py``): its key-block arithmetic on
CPU against every key's visibility, the sm_90a compile (no spills, the instructions it claims),
the capability check and input validation before any GPU work, and planted bugs on the GPU."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re

import pytest
import torch

pytest.importorskip("cutlass")

import cutlass

from common.contract import splits
from common.contract.check import check_on_inputs
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from common.reporting.static import cubin_resources
from cute_impl import _decode_merge, _decode_plan, _device, decode
from cute_impl._device import BlockRange, SeqlenInfo
from tests.cute_stubs import BindReachedError, stop_at_bind

CPU = torch.device("cpu")


# ----------------------------------------------------------------------------------------------------
# The split's key blocks (plain arithmetic, the function the kernel calls)
# ----------------------------------------------------------------------------------------------------
def _visible(token: int, key: int, *, seqlen_k: int, causal: bool, offset: int) -> bool:
    return key < seqlen_k and (not causal or key <= token + offset)


# (Sq, this sequence's seqlen_k): one token and sixteen; an empty sequence, shorter than Sq, within
# one block, a multiple of the block, one past it, long.
SPLIT_CASES = list(itertools.product((1, 5, 16), (0, 3, 40, 64, 65, 1000, 4099)))
MASKS = {"full": (False, False), "causal_top_left": (True, False), "causal_bottom_right": (True, True)}


def _coverage_errors(ranges: list[BlockRange], seqlen_q: int, seqlen: SeqlenInfo, causal: bool, tile_n: int) -> list:
    """What is wrong with the blocks the splits of one sequence visit: they must be disjoint and
    consecutive from block 0, hold every key some token sees and no block past the last one, and every
    key of a block below a split's top ``n_masked_blocks`` must be seen by every token (so skipping
    its mask is safe). Packed rows repeat the tokens, so the tokens are the rows that matter."""
    visible = functools.partial(_visible, seqlen_k=seqlen.seqlen_k, causal=causal, offset=seqlen.causal_offset)
    errors = []
    covered = []
    for split, blocks in enumerate(ranges):
        if blocks.n_block_min > blocks.n_block_max:
            errors.append(f"split {split}: range [{blocks.n_block_min}, {blocks.n_block_max})")
        covered.extend(range(blocks.n_block_min, blocks.n_block_max))
        unmasked_end = max(blocks.n_block_max - blocks.n_masked_blocks, blocks.n_block_min) * tile_n
        hidden = [
            (token, key)
            for token in range(seqlen_q)
            for key in range(blocks.n_block_min * tile_n, unmasked_end)
            if not visible(token, key)
        ]
        if hidden:
            errors.append(f"split {split}: (token, key) {hidden[0]} runs without the mask it needs")
    if covered != list(range(len(covered))):
        errors.append(f"blocks visited {covered}, not 0, 1, ... once each")
    last_visible = max(
        (key for token in range(seqlen_q) for key in range(seqlen.seqlen_k) if visible(token, key)), default=-1
    )
    if last_visible >= len(covered) * tile_n:
        errors.append(f"visible key {last_visible} is never loaded")
    if last_visible < (len(covered) - 1) * tile_n:
        errors.append("a block no token sees is loaded")
    return errors


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("num_splits", [1, 3, 16, 100])
def test_split_blocks_cover_every_visible_key_once_and_mask_where_needed(num_splits: int, mask: str):
    """``decode.split_block_range``, the function the kernel calls, over every split of sequences from
    empty to long, for one token to sixteen (:func:`_coverage_errors` says what must hold)."""
    causal, bottom_right = MASKS[mask]
    tile_n = decode.TILE_CONFIGS[128].tile_n
    for seqlen_q, seqlen_k in SPLIT_CASES:
        seqlen = SeqlenInfo(seqlen_k, seqlen_k - seqlen_q if bottom_right else 0, bottom_right)
        ranges = [decode.split_block_range(s, num_splits, seqlen, seqlen_q, tile_n, causal) for s in range(num_splits)]
        errors = _coverage_errors(ranges, seqlen_q, seqlen, causal, tile_n)
        assert not errors, f"Sq={seqlen_q} seqlen_k={seqlen_k} splits={num_splits}: {errors}"


def test_coverage_rule_fails_planted_block_ranges():
    """The rule above is not vacuous: one masked block per causal split misses the diagonal where it
    crosses a block boundary, and a dropped split leaves visible keys unread."""
    seqlen_q, seqlen = 16, SeqlenInfo(70, 70 - 16, True)
    ranges = [decode.split_block_range(s, 2, seqlen, seqlen_q, 64, True) for s in range(2)]
    assert not _coverage_errors(ranges, seqlen_q, seqlen, True, 64)
    # One split of both blocks: the diagonal crosses into the lower one, which must be masked too.
    (whole,) = [decode.split_block_range(0, 1, seqlen, seqlen_q, 64, True)]
    one_masked = [BlockRange(whole.n_block_min, whole.n_block_max, 1)]
    assert any("without the mask" in e for e in _coverage_errors(one_masked, seqlen_q, seqlen, True, 64))
    dropped = [ranges[0], BlockRange(ranges[1].n_block_min, ranges[1].n_block_min, 2)]
    assert any("never loaded" in e for e in _coverage_errors(dropped, seqlen_q, seqlen, True, 64))


def test_tile_m_packs_the_group_and_the_tokens():
    def problem(heads: int, kv_heads: int, seqlen_q: int, head_dim: int = 128) -> Problem:
        return Problem(1, heads, seqlen_q, 4096, head_dim, kv_heads=kv_heads)

    assert decode.tile_m_for(problem(32, 8, 1)) == 16  # 4 rows: mma.sync's 16
    assert decode.tile_m_for(problem(32, 8, 5)) == 32  # 20 rows
    assert decode.m_blocks_for(problem(32, 1, 16)) == 32 * 16 // 64  # MQA, 512 rows in 64-row tiles (WIDE_M_TILE)
    assert decode.tile_m_for(problem(32, 1, 16, head_dim=64)) == 64
    assert decode.tile_m_for(problem(32, 1, 16, head_dim=256)) == 64  # the row split's wide tile (_decode_warps)
    # The split count is the shared rule, fed with this rung's CTAs per split.
    bigger = problem(32, 8, 16)
    assert decode.planned_num_splits(bigger, CPU) == splits.choose_num_splits(
        8 * decode.m_blocks_for(bigger), 4096, splits.DEFAULT_SM_COUNT
    )


# ----------------------------------------------------------------------------------------------------
# sm_90a compile: spill-free, the claimed instructions, one kernel or two
# ----------------------------------------------------------------------------------------------------
def _featured(head_dim: int, dtype: torch.dtype, heads: int = 32, kv_heads: int = 8, seqlen_q: int = 1) -> Problem:
    return Problem(
        2, heads, seqlen_q, 4096, head_dim, dtype=dtype, causal=True, kv_heads=kv_heads,
        causal_alignment="bottom_right", has_cache_seqlens=True, return_lse=True,
    )  # fmt: skip


# (head dim, dtype): D = 64 and 128 in both dtypes, D = 256 (the same code with another tile) in bf16.
COMPILED_CASES = [
    (64, torch.bfloat16), (64, torch.float16), (128, torch.bfloat16), (128, torch.float16), (256, torch.bfloat16),
]  # fmt: skip


@pytest.mark.cute_compile
@pytest.mark.parametrize(
    ("head_dim", "dtype"), COMPILED_CASES, ids=[f"d{d}-{t}".replace("torch.", "") for d, t in COMPILED_CASES]
)
def test_compiles_for_sm90_without_spills(head_dim: int, dtype: torch.dtype):
    """With every feature on: the split form (split and merge kernels) at one 16-row tile and at the
    largest packed tile (MQA, Sq = 16), and the direct form (one kernel writing O); registers are
    printed for the report."""
    small, largest = _featured(head_dim, dtype), _featured(head_dim, dtype, kv_heads=1, seqlen_q=16)
    for problem, split in ((small, True), (largest, True), (small, False)):
        (binary,) = decode.compile_sm90(problem, split=split)
        kernels = cubin_resources(binary.cubin)
        assert len(kernels) == (2 if split else 1), sorted(kernels)
        for name, usage in kernels.items():
            spills = usage["stack_bytes"] + usage["local_bytes"]
            kind = "merge" if "merge_kernel" in name else "split" if split else "direct"
            print(f"{problem.describe()} tile_m={decode.tile_m_for(problem)} {kind}: {usage['registers']} registers")
            assert spills == 0, f"{problem.describe()} {kind}: {usage['registers']} registers, {spills} B spilled"


# The balanced split (BALANCED_SPLIT "always"): each head dim once, one token and 8, paged (pages of 32) and
# contiguous; GQA, bottom-right, cache lengths and the LSE (three of the six, for CI's time: the other three
# compiled without spills when the split was built; the GPU tests run it at every head dim).
BALANCED_COMPILES = [(64, 8, 32), (128, 1, 32), (256, 8, 0)]


@pytest.mark.cute_compile
@pytest.mark.parametrize(("head_dim", "seqlen_q", "page_size"), BALANCED_COMPILES)
def test_balanced_split_compiles_for_sm90_without_spills(
    head_dim: int, seqlen_q: int, page_size: int, monkeypatch: pytest.MonkeyPatch
):
    """Both kernels, spill-free; the merge kernel takes the item slabs the split kernel stored (one tensor;
    ``MERGE_SLABS_FROM_SPLIT``), which the padded split's merge does not (with it off, the plan's inputs:
    tests/test_cute_merge_plan.py)."""
    problem = _featured(head_dim, torch.bfloat16, seqlen_q=seqlen_q).with_(page_size=page_size)
    monkeypatch.setattr(decode, "BALANCED_SPLIT", "never")
    (padded,) = decode.compile_sm90(problem, split=True)
    monkeypatch.setattr(decode, "BALANCED_SPLIT", "always")
    assert decode.compile_plan(problem).balanced_min_blocks == decode.BALANCED_MIN_KEYS // 64
    (balanced,) = decode.compile_sm90(problem, split=True)
    kernels = cubin_resources(balanced.cubin)
    assert len(kernels) == 2, sorted(kernels)
    for name, usage in kernels.items():
        assert usage["stack_bytes"] + usage["local_bytes"] == 0, f"{problem.describe()} {name}: {usage}"
    merge_params = [_merge_params(binary.ptx) for binary in (padded, balanced)]
    assert merge_params[1] == merge_params[0] + 1, merge_params


def _merge_params(ptx: str) -> int:
    """The merge kernel's parameter count in ``ptx``."""
    entry = next(e for e in ptx.split(".entry ")[1:] if e.startswith("kernel_cutlass_merge_kernel"))
    return entry[: entry.index(")")].count(".param")


@pytest.mark.cute_compile
def test_ptx_streams_through_the_ring_and_merges():
    """The split kernel waits for one block (wait_group(stages - 1)), copies with cp.async, multiplies
    with ldmatrix + mma.sync and forms the LSE (lg2); the merge kernel only in the split form."""
    problem = _featured(128, torch.bfloat16)
    stages = decode.TILE_CONFIGS[128].stages
    (split,) = decode.compile_sm90(problem, split=True)
    (direct,) = decode.compile_sm90(problem.with_(return_lse=False), split=False)
    waits = set(re.findall(r"cp\.async\.wait_group\s+(\d+)", split.ptx))
    assert {str(stages - 1), "0"} <= waits, waits
    for family in decode.IMPLEMENTATION.required_ptx:
        assert re.search(rf"\b{re.escape(family)}\.", split.ptx), family
    assert "lg2.approx" in split.ptx
    assert "merge_kernel" in split.ptx and "merge_kernel" not in direct.ptx


def test_partials_that_exceed_the_ring_are_refused():
    shape = decode.TILE_CONFIGS[128]._replace(stages=1)
    config = decode.DecodeConfig(
        dtype=torch.bfloat16, head_dim=128, tile_m=32, shape=shape, causal=True, bottom_right=True,
        has_cache_seqlens=True, return_lse=True, split=True,
    )  # fmt: skip
    with pytest.raises(ValueError, match="exceed the K/V ring"):
        decode.DecodeKernel(config)


# ----------------------------------------------------------------------------------------------------
# Capability check and validation before any GPU work
# ----------------------------------------------------------------------------------------------------
@pytest.fixture
def on_hopper(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("common.contract.capability._architecture", lambda device: (9, 0))


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"seqlen_q": 17}, "use a prefill rung"),
        ({"head_dim": 96}, "head_dim"),
        ({"dtype": torch.float32}, "dtypes"),
        ({"softmax_scale": 0.0}, "softmax_scale must be > 0"),
    ],
)
def test_refusals_name_what_is_needed(changes: dict, needle: str, on_hopper: None):
    problem = _featured(128, torch.bfloat16).with_(**changes)
    ok, reason = decode.supports(problem, torch.device("cuda"))
    assert not ok and needle in reason, reason
    ok, reason = decode.supports(_featured(128, torch.bfloat16), CPU)
    assert not ok and "CUDA" in reason


def test_decode_problems_are_supported(on_hopper: None):
    for head_dim, dtype, seqlen_q in itertools.product(decode.HEAD_DIMS, (torch.bfloat16, torch.float16), (1, 16)):
        problem = _featured(head_dim, dtype, seqlen_q=seqlen_q)
        assert decode.supports(problem, torch.device("cuda")) == (True, ""), problem.describe()


@pytest.fixture
def cpu_prepare(monkeypatch: pytest.MonkeyPatch) -> dict:
    """prepare() validates CPU tensors and stops at bind, recording bind's keywords."""
    return stop_at_bind(monkeypatch)


def test_prepare_validates_then_binds_with_the_forced_split(cpu_prepare: dict):
    problem = _featured(64, torch.bfloat16, heads=4, kv_heads=2, seqlen_q=3).with_(seqlen_k=48)
    q = torch.randn(2, 4, 3, 64, dtype=torch.bfloat16)
    k = torch.randn(2, 2, 48, 64, dtype=torch.bfloat16)
    lengths = torch.tensor([48, 0], dtype=torch.int32)
    with pytest.raises(BindReachedError):
        decode.decode_attention(q, k, k, problem, cache_seqlens=lengths, num_splits=3)
    assert cpu_prepare["num_splits"] == 3 and cpu_prepare["cache_seqlens"] is lengths
    with pytest.raises(ValueError, match="cache_seqlens must be given"):
        decode.decode_attention(q, k, k, problem)
    long_q = torch.randn(2, 4, 17, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="use a prefill rung"):
        decode.decode_attention(long_q, k, k, problem.with_(seqlen_q=17), cache_seqlens=lengths)


def test_bad_inputs_raise_before_any_kernel():
    q = torch.zeros(1, 1, 1, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="cuda"):
        decode.decode_attention(q, q, q, Problem(1, 1, 1, 1, 128))
    with pytest.raises(TypeError, match="dtype"):
        decode.decode_attention(q.float(), q.float(), q.float(), Problem(1, 1, 1, 1, 128, dtype=torch.float32))


# ----------------------------------------------------------------------------------------------------
# GPU: planted bugs the check must catch (each compiles afresh: the compile cache is emptied)
# ----------------------------------------------------------------------------------------------------
def _drop_split_one(split, num_splits, key_end, tile_n, n_masked_blocks) -> BlockRange:
    blocks = _device.split_key_range(split, num_splits, key_end, tile_n, n_masked_blocks)
    n_block_max = cutlass.Int32(cutlass.select_(split == 1, blocks.n_block_min, blocks.n_block_max))
    return BlockRange(blocks.n_block_min, n_block_max, blocks.n_masked_blocks)


class _IgnoringCacheSeqlens(SeqlenInfo):
    @staticmethod
    def create(batch, seqlen_q, seqlen_k, cache_seqlens, bottom_right) -> SeqlenInfo:
        return SeqlenInfo.create(batch, seqlen_q, seqlen_k, None, bottom_right)


def _last_slab_missed(parts, first, count):
    return _decode_plan.slab_range(parts, first, cutlass.max(count - 1, 1))


# bug: (module, name, replacement, forced split count; None: the balanced split's own shares). With one
# split only the warps' merge runs. The balanced ones: 4096 keys of 2 KV heads in 8 shares of 8 blocks.
# A wrong share count per item is no bug to plant: the split kernel and the merge read the same plan and
# each share's keys are the item's divided by that count, so one share fewer still covers every key (on
# the H200 such a plant passed the check: results/h200/decode-balanced-gluon-cute/).
PLANTED = {
    "dropped split": (_decode_plan, "split_key_range", _drop_split_one, 3),
    "merges weigh natural-log LSEs as log2": (_decode_merge, "COMBINE_LOG2_E", 1.0, 3),
    "the warps' merge weighs natural-log LSEs as log2": (_decode_merge, "COMBINE_LOG2_E", 1.0, 1),
    "split reads past its sequence's length": (decode, "SeqlenInfo", _IgnoringCacheSeqlens, 3),
    "balanced: the merge misses an item's last slab": (decode, "slab_range", _last_slab_missed, None),
}


@pytest.mark.gpu
@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_bug_fails_the_check(bug: str, monkeypatch: pytest.MonkeyPatch):
    problem = Problem(
        4, 8, 1, 4096, 128, dtype=torch.bfloat16, causal=True, kv_heads=2,
        causal_alignment="bottom_right", has_cache_seqlens=True, return_lse=True,
    )  # fmt: skip
    q, k, v = make_inputs(problem, seed=2, offset=0.5)
    # A merge in the wrong units shows only where the parts' LSEs differ: 392 keys in 3 splits of 64-key
    # blocks are 192, 192 and 8 keys; 20 keys are 16, 4, 0 and 0 keys for the 4 warps.
    lengths = torch.tensor([4096, 0, 392, 20], dtype=torch.int32, device="cuda")
    tile_n = decode.TILE_CONFIGS[128].tile_n
    blocks = [decode.split_block_range(s, 3, SeqlenInfo(392, 391, True), 1, tile_n, True) for s in range(3)]
    assert [min(r.n_block_max * tile_n, 392) - r.n_block_min * tile_n for r in blocks] == [192, 192, 8]
    module, name, replacement, num_splits = PLANTED[bug]
    # The balanced split's bug under its switch "always"; the padded split's under "never" (the committed
    # "ragged-split" would give these ragged lengths the balanced split, which plants nothing of theirs).
    monkeypatch.setattr(decode, "BALANCED_SPLIT", "always" if num_splits is None else "never")
    prepare = functools.partial(decode.decode_attention, num_splits=num_splits)
    impl = dataclasses.replace(decode.IMPLEMENTATION, prepare=prepare)
    assert check_on_inputs(impl, q, k, v, problem, cache_seqlens=lengths).ok, "the unplanted kernel must pass"
    monkeypatch.setattr(decode.HOST.kernels, "compiled", {})
    monkeypatch.setattr(module, name, replacement)
    result = check_on_inputs(impl, q, k, v, problem, cache_seqlens=lengths)
    assert not result.ok, f"{bug}: the check passed a wrong kernel ({result.summary()})"
