"""Rung-specific checks of cute/tiled and cute/pipelined beyond the shared registry tests."""

from __future__ import annotations

import functools
import re

import pytest
import torch

pytest.importorskip("cutlass")

from common.contract.check import check_implementation, check_on_inputs
from common.contract.inputs import make_inputs
from common.contract.metrics import error_stats
from common.contract.problem import Problem
from common.contract.reference import reference_attention, sdpa
from common.reporting.static import cubin_resources
from cute_impl import _host, pipelined, tiled
from cute_impl._device import BlockRange, SeqlenInfo
from tests._helpers import check_features, feature_grid, feature_problem
from tests.cute_stubs import BindReachedError, never_bind

MODULES = {"cute/tiled": tiled, "cute/pipelined": pipelined}
# Shared memory per SM on the H100/H200 available to CTAs, in bytes.
SM90_SMEM_PER_SM = 227 * 1024


def _kv_bytes_per_stage(head_dim: int, tile_n: int) -> int:
    return 2 * tile_n * head_dim * 2


@pytest.mark.parametrize("head_dim", sorted(pipelined.TILE_CONFIGS))
def test_pipelined_tiles_leave_room_for_two_ctas_per_sm(head_dim: int):
    shape = pipelined.TILE_CONFIGS[head_dim]
    smem = shape.tile_m * head_dim * 2 + shape.stages * _kv_bytes_per_stage(head_dim, shape.tile_n)
    assert 2 * smem <= SM90_SMEM_PER_SM, f"D={head_dim}: {smem} B of shared memory per CTA"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_refuses_cpu_and_unsupported_head_dim(name: str):
    module = MODULES[name]
    ok, reason = module.supports(Problem(1, 1, 64, 64, 128), torch.device("cpu"))
    assert not ok and "CUDA" in reason
    if torch.cuda.is_available():
        ok, reason = module.supports(Problem(1, 1, 64, 64, 256), torch.device("cuda"))
        assert not ok and "head_dim" in reason


@pytest.mark.parametrize("name", sorted(MODULES))
def test_bad_inputs_raise_before_any_kernel(name: str):
    prepare = MODULES[name].prepare
    q = torch.zeros(1, 1, 8, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="cuda"):
        prepare(q, q, q, Problem(1, 1, 8, 8, 128))
    with pytest.raises(TypeError, match="dtype"):
        prepare(q.float(), q.float(), q.float(), Problem(1, 1, 8, 8, 128))
    if torch.cuda.is_available():
        odd = torch.zeros(1, 1, 8, 96, dtype=torch.bfloat16, device="cuda")
        with pytest.raises(ValueError, match="head_dim"):
            prepare(odd, odd, odd, Problem(1, 1, 8, 8, 96))


@pytest.mark.cute_compile
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128], ids=["d64", "d128"])
@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_spills_at_any_supported_configuration(name: str, head_dim: int, dtype: torch.dtype, causal: bool):
    """The shared static test checks the canonical problem only; every tile config must be spill-free."""
    problem = Problem(1, 1, 1024, 1024, head_dim, dtype=dtype, causal=causal)
    for binary in MODULES[name].compile_sm90(problem):
        for usage in cubin_resources(binary.cubin).values():
            spills = usage["stack_bytes"] + usage["local_bytes"]
            assert spills == 0, f"{name} {problem.describe()}: {usage['registers']} registers, {spills} B stack/local"


@pytest.mark.cute_compile
def test_pipelined_waits_for_one_block_not_for_all():
    """The ring's point: the main loop waits with wait_group(stages-1), tiled with wait_group(0)."""
    problem = Problem(1, 1, 256, 256, 64, causal=True)
    stages = pipelined.tile_config(problem).shape.stages
    pipelined_ptx = pipelined.compile_sm90(problem)[0].ptx
    tiled_ptx = tiled.compile_sm90(problem)[0].ptx
    waits = set(re.findall(r"cp\.async\.wait_group\s+(\d+)", pipelined_ptx))
    assert str(stages - 1) in waits, f"pipelined waits {waits}"
    assert set(re.findall(r"cp\.async\.wait_group\s+(\d+)", tiled_ptx)) == {"0"}


@pytest.fixture
def cpu_prepare(monkeypatch: pytest.MonkeyPatch) -> None:
    """prepare() validates CPU tensors and stops at bind: what it refuses, it refuses before any GPU work."""
    validate = functools.partial(_host.validate_for_problem, device_types=("cpu",))
    monkeypatch.setattr(_host, "validate_for_problem", validate)
    for module in MODULES.values():
        monkeypatch.setattr(module.HOST, "bind", never_bind)


@pytest.mark.parametrize("scale", [-0.125, 0.0])
@pytest.mark.parametrize("name", sorted(MODULES))
def test_non_positive_scale_is_refused(name: str, scale: float, cpu_prepare: None, monkeypatch: pytest.MonkeyPatch):
    """row_max is taken as max(S) * softmax_scale_log2, the maximum of the scaled scores only for scale > 0."""
    problem = Problem(1, 2, 16, 16, 64, dtype=torch.bfloat16, softmax_scale=scale)
    monkeypatch.setattr("common.contract.capability._architecture", lambda device: (9, 0))
    ok, reason = MODULES[name].supports(problem, torch.device("cuda"))
    assert not ok and reason.startswith("softmax_scale must be > 0"), reason
    q = torch.randn(1, 2, 16, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=rf"softmax_scale must be > 0 .*got {scale}"):
        MODULES[name].prepare(q, q, q, problem)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_positive_scale_reaches_bind(name: str, cpu_prepare: None):
    q = torch.randn(1, 2, 16, 64, dtype=torch.bfloat16)
    with pytest.raises(BindReachedError):
        MODULES[name].prepare(q, q, q, Problem(1, 2, 16, 16, 64, dtype=torch.bfloat16, softmax_scale=0.125))


@pytest.mark.parametrize("name", sorted(MODULES))
def test_prepare_takes_the_features(name: str, cpu_prepare: None):
    """Both rungs validate GQA, bottom-right, cache_seqlens and the LSE and reach bind, and refuse
    cache_seqlens that disagree with the problem before any GPU work."""
    problem = Problem(
        2, 4, 16, 48, 64, dtype=torch.bfloat16, causal=True, kv_heads=2, causal_alignment="bottom_right",
        has_cache_seqlens=True, return_lse=True,
    )  # fmt: skip
    q = torch.randn(2, 4, 16, 64, dtype=torch.bfloat16)
    k = torch.randn(2, 2, 48, 64, dtype=torch.bfloat16)
    lengths = torch.tensor([48, 0], dtype=torch.int32)
    module = MODULES[name]
    with pytest.raises(BindReachedError):
        module.prepare(q, k, k, problem, cache_seqlens=lengths)
    with pytest.raises(ValueError, match="cache_seqlens must be given"):
        module.prepare(q, k, k, problem)
    with pytest.raises(ValueError, match="cache_seqlens must be given"):
        module.prepare(q, k, k, problem.with_(has_cache_seqlens=False), cache_seqlens=lengths)


def _visible(row: int, key: int, *, seqlen_k: int, causal: bool, offset: int = 0) -> bool:
    return key < seqlen_k and (not causal or key <= row + offset)


# (Sq, padded Sk, this sequence's seqlen_k or None for the padded one).
BLOCK_RANGE_CASES = [
    (1, 1, None),
    (77, 1000, None),
    (1000, 77, None),
    (1000, 1000, None),
    (512, 512, None),
    (300, 129, None),
    (77, 1000, 0),
    (77, 1000, 1000),
    (77, 1000, 613),
    (1000, 77, 0),
    (1000, 77, 41),
    (300, 129, 77),
]


@pytest.mark.parametrize("bottom_right", [False, True], ids=["top_left", "bottom_right"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("tile_n", [32, 64])
@pytest.mark.parametrize("tile_m", [64, 128])
def test_block_range_visits_every_visible_key_and_masks_where_needed(
    tile_m: int, tile_n: int, causal: bool, bottom_right: bool
):
    """cute/pipelined's BlockRange: blocks from n_block_max on are masked for every row of the tile,
    every visible key lies below n_block_max, and the blocks below the top n_masked_blocks are seen in
    full by every row (so skipping their mask is safe); for both alignments and per-sequence lengths
    (the sequence's seqlen_k, and bottom-right its causal_offset = seqlen_k - Sq). tile_m = 64 is
    cute/tiled's tile, whose inline block range follows the same rule."""
    for seqlen_q, padded_k, length in BLOCK_RANGE_CASES:
        seqlen_k = padded_k if length is None else length
        offset = seqlen_k - seqlen_q if bottom_right else 0
        seqlen = SeqlenInfo(seqlen_k, offset, bottom_right)
        for m_block in range(-(-seqlen_q // tile_m)):
            blocks = BlockRange.create(m_block, seqlen, tile_m, tile_n, causal)
            # Every row of the tile, the padding past Sq included: the kernel computes those too.
            rows = range(m_block * tile_m, (m_block + 1) * tile_m)
            visible = functools.partial(_visible, seqlen_k=seqlen_k, causal=causal, offset=offset)
            where = f"m_block={m_block} Sq={seqlen_q} seqlen_k={seqlen_k} offset={offset}"
            assert blocks.n_block_min == 0
            assert blocks.n_block_max >= 0, where
            last_visible = max((key for row in rows for key in range(seqlen_k) if visible(row, key)), default=-1)
            assert last_visible < blocks.n_block_max * tile_n, f"{where}: a visible key is never loaded"
            assert last_visible >= (blocks.n_block_max - 1) * tile_n, f"{where}: a fully masked block is loaded"
            unmasked_end = max(blocks.n_block_max - blocks.n_masked_blocks, 0) * tile_n
            hidden = [(row, key) for row in rows for key in range(unmasked_end) if not visible(row, key)]
            assert not hidden, f"{where}: block of (row, key) {hidden[0]} runs without the mask it needs"


@pytest.mark.cute_compile
@pytest.mark.parametrize("head_dim", [64, 128], ids=["d64", "d128"])
@pytest.mark.parametrize("name", sorted(MODULES))
def test_features_compile_without_spills_and_keep_the_canonical_kernel(name: str, head_dim: int):
    """GQA, bottom-right, cache lengths and the LSE are compile-time flags: the feature kernel is
    spill-free and stores the LSE; the canonical problem's kernel forms and stores none."""
    module = MODULES[name]
    canonical = Problem(1, 8, 1024, 1024, head_dim, dtype=torch.bfloat16, causal=True)
    featured = canonical.with_(
        seqlen_q=77, kv_heads=2, causal_alignment="bottom_right", has_cache_seqlens=True, return_lse=True
    )
    assert module.tile_config(featured) != module.tile_config(canonical)
    ptx = {}
    for problem in (canonical, featured):
        (binary,) = module.compile_sm90(problem)
        for usage in cubin_resources(binary.cubin).values():
            spills = usage["stack_bytes"] + usage["local_bytes"]
            assert spills == 0, f"{name} {problem.describe()}: {usage['registers']} registers, {spills} B stack/local"
        ptx[problem] = binary.ptx
    # O is stored as 32-bit pairs (st.global.b32) in both; the LSE adds one store and one lg2 per row.
    stores = {problem: len(re.findall(r"st\.global\.", text)) for problem, text in ptx.items()}
    assert stores[featured] > stores[canonical], stores
    assert "lg2.approx" in ptx[featured]
    assert "lg2.approx" not in ptx[canonical]


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(MODULES))
def test_strided_inputs_and_custom_scale(name: str):
    """q/k/v as (B, S, H, D) transposed views (non-contiguous heads) and a non-default scale."""
    torch.manual_seed(0)
    batch, heads, seqlen_q, seqlen_k, head_dim = 2, 3, 333, 517, 64
    q = torch.randn(batch, seqlen_q, heads, head_dim, device="cuda", dtype=torch.float16).transpose(1, 2)
    k = torch.randn(batch, seqlen_k, heads, head_dim, device="cuda", dtype=torch.float16).transpose(1, 2)
    v = torch.randn(batch, seqlen_k, heads, head_dim, device="cuda", dtype=torch.float16).transpose(1, 2) + 0.5
    problem = Problem(batch, heads, seqlen_q, seqlen_k, head_dim, dtype=torch.float16, causal=True, softmax_scale=0.3)
    out = MODULES[name].prepare(q, k, v, problem)()
    ref = reference_attention(q, k, v, problem)
    err, sdpa_err = error_stats(out, ref), error_stats(sdpa(q, k, v, problem), ref)
    ok, reason = MODULES[name].IMPLEMENTATION.error_rule.judge(err, sdpa_err)
    assert ok, f"{name}: {reason}; {err.summary()}"


@pytest.mark.gpu
@pytest.mark.parametrize("seqlens", [(129, 63), (64, 700), (5000, 130)], ids=["q129-k63", "q64-k700", "q5000-k130"])
@pytest.mark.parametrize("name", sorted(MODULES))
def test_tile_boundaries_causal(name: str, seqlens: tuple[int, int]):
    problem = Problem(1, 2, *seqlens, 128, dtype=torch.bfloat16, causal=True)
    result = check_implementation(MODULES[name].IMPLEMENTATION, problem, device="cuda", seed=sum(seqlens))
    assert result.ok, f"{name} {problem.describe()}: {result.summary()}"


# The masks of the feature tests: (causal, causal_alignment).
@feature_grid()
@pytest.mark.parametrize("name", sorted(MODULES))
def test_gqa_alignments_cache_seqlens_and_lse(
    name: str, head_dim: int, kv_heads: int, seqlens: tuple[int, int], mask: str, cache_lengths: bool
):
    """Both rungs: GQA (8 query heads over 1 or 4 KV heads, each KV head its own values), both
    causal alignments with Sq != Sk (bottom-right with Sq > Sk leaves rows that see no key: O = 0,
    LSE = -inf), per-sequence lengths Sk, 0 and ragged; O against the fp64 reference by the rung's rule
    and the LSE by the contract's LSE rule, on poisoned outputs."""
    problem = feature_problem(seqlens, head_dim, kv_heads, mask, cache_lengths)
    check_features(MODULES[name].IMPLEMENTATION, problem, seed=11)


@pytest.mark.gpu
@pytest.mark.parametrize("return_lse", [False, True], ids=["o", "o_lse"])
@pytest.mark.parametrize("name", sorted(MODULES))
def test_gqa_without_lse_returns_o_only(name: str, return_lse: bool):
    """run() returns O alone without return_lse, the pair (O, lse) with it; a GQA problem with Sq = Sk."""
    problem = Problem(2, 4, 200, 200, 128, dtype=torch.float16, causal=True, kv_heads=2, return_lse=return_lse)
    q, k, v = make_inputs(problem, seed=5, offset=0.5)
    out = MODULES[name].prepare(q, k, v, problem)()
    assert isinstance(out, tuple) == return_lse
    result = check_on_inputs(MODULES[name].IMPLEMENTATION, q, k, v, problem)
    assert result.ok, f"{name} {problem.describe()}: {result.summary()}"
