"""cute/decode on a paged KV cache (a block table of pages, FlashAttention's and FlashInfer's NHD
layout), the contract ``tests/test_paged_kv.py`` states for triton/decode: where each key is read
from (plain arithmetic on CPU against the fp64 reference's gather), the capability check and input
validation before any GPU work, the sm_90a build; on the GPU, bf16 against fp64 at every page size
of the contract (pages of 16 to 256 keys, not only multiples of the 64-key block), the paged output
equal bit for bit to the contiguous one, and planted paging bugs the check must fail."""

from __future__ import annotations

import dataclasses
import functools
import itertools

import pytest
import torch

pytest.importorskip("cutlass")

from common.contract.check import check_on_inputs
from common.contract.inputs import make_inputs, make_paged_kv
from common.contract.problem import Problem
from common.contract.registry import Implementation
from common.reporting.static import cubin_resources
from cute_impl import _device, decode, pipelined, tiled
from cute_impl._device import PagedKV
from tests.cute_stubs import BindReachedError, stop_at_bind

CPU = torch.device("cpu")
PAGE_SIZES = (16, 48, 64, 256)


def _paged_problem(page_size: int, seqlen_q: int = 1, kv_heads: int = 8, **changes) -> Problem:
    fields = dict(
        batch=4, heads=32, seqlen_q=seqlen_q, seqlen_k=8192 // page_size * page_size, head_dim=128,
        dtype=torch.bfloat16, causal=True, kv_heads=kv_heads, causal_alignment="bottom_right",
        has_cache_seqlens=True, return_lse=True, page_size=page_size,
    )  # fmt: skip
    return Problem(**{**fields, **changes})


def _lengths(problem: Problem, device: str | torch.device) -> torch.Tensor:
    """A full sequence, an empty one, one ending inside a page, one a key into its second page."""
    capacity = problem.seqlen_k
    values = (capacity, 0, capacity * 41 // 100, problem.page_size + 1)[: problem.batch]
    return torch.tensor(values, dtype=torch.int32, device=device)


# ----------------------------------------------------------------------------------------------------
# Where each key is read from (the function the kernel calls, on Python ints)
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_every_key_is_read_from_the_row_the_reference_gathers(page_size: int):
    """page_and_slot of every key of every sequence points at the pool row holding that key: the
    pool built from a contiguous cache whose key j of sequence b is the number (b, j)."""
    problem = _paged_problem(page_size, batch=3, kv_heads=1, head_dim=64).with_(seqlen_k=5 * page_size)
    keys = torch.arange(problem.seqlen_k, dtype=torch.float32)
    cache = torch.stack([keys + 1000 * b for b in range(problem.batch)]).view(problem.batch, 1, -1, 1)
    k = cache.expand(-1, -1, -1, problem.head_dim).contiguous()
    pool, _, table = make_paged_kv(problem, k, k, seed=page_size)
    wrong = []
    for b in range(problem.batch):
        pages = PagedKV(None, None, 0, table[b].tolist(), page_size)
        for key in range(problem.seqlen_k):
            page, in_page = _device.page_and_slot(pages, key)
            if pool[page, in_page, 0, 0].item() != key + 1000 * b:
                wrong.append((b, key, page, in_page))
    assert not wrong, f"{len(wrong)} keys read from the wrong row, first {wrong[:3]}"


def test_a_slot_off_by_one_fails_that_rule():
    """The rule above catches the planted slot bug of the GPU test below."""
    problem = _paged_problem(16, batch=1, kv_heads=1, head_dim=64).with_(seqlen_k=64)
    k = torch.arange(64, dtype=torch.float32).view(1, 1, 64, 1).expand(-1, -1, -1, 64).contiguous()
    pool, _, table = make_paged_kv(problem, k, k)
    pages = PagedKV(None, None, 0, table[0].tolist(), 16)
    spots = [_slot_off_by_one(pages, key) for key in range(64)]
    assert [pool[page, in_page, 0, 0].item() for page, in_page in spots] != list(range(64))


# ----------------------------------------------------------------------------------------------------
# Capability check and validation before any GPU work
# ----------------------------------------------------------------------------------------------------
@pytest.fixture
def on_hopper(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("common.contract.capability._architecture", lambda device: (9, 0))


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_every_page_size_of_the_contract_is_supported(page_size: int, on_hopper: None):
    for seqlen_q, kv_heads in itertools.product((1, 16), (1, 8, 32)):
        problem = _paged_problem(page_size, seqlen_q, kv_heads)
        assert decode.supports(problem, torch.device("cuda")) == (True, ""), problem.describe()


@pytest.mark.parametrize("module", [tiled, pipelined], ids=["tiled", "pipelined"])
def test_the_prefill_rungs_refuse_a_paged_cache_naming_it(module: object, on_hopper: None):
    ok, reason = module.supports(_paged_problem(16, 16, head_dim=64), torch.device("cuda"))
    assert not ok and "paged" in reason, reason


@pytest.fixture
def cpu_prepare(monkeypatch: pytest.MonkeyPatch) -> dict:
    """prepare() validates CPU tensors and stops at bind, recording bind's keywords."""
    return stop_at_bind(monkeypatch)


def test_prepare_validates_the_pools_then_binds_with_the_table(cpu_prepare: dict):
    problem = _paged_problem(16, 2, batch=2, heads=4, kv_heads=2, head_dim=64, seqlen_k=64)
    q = torch.randn(2, 4, 2, 64, dtype=torch.bfloat16)
    pools = torch.randn(9, 16, 2, 64, dtype=torch.bfloat16)
    table = torch.tensor([[0, 3, 5, 7], [1, 2, 4, 6]], dtype=torch.int32)
    lengths = torch.tensor([64, 20], dtype=torch.int32)
    with pytest.raises(BindReachedError):
        decode.decode_attention(q, pools, pools, problem, cache_seqlens=lengths, block_table=table, num_splits=3)
    assert cpu_prepare["block_table"] is table and cpu_prepare["num_splits"] == 3
    with pytest.raises(ValueError, match="block_table"):
        decode.decode_attention(q, pools, pools, problem, cache_seqlens=lengths)
    contiguous = problem.with_(page_size=0)
    k = torch.randn(2, 2, 64, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="block_table"):
        decode.decode_attention(q, k, k, contiguous, cache_seqlens=lengths, block_table=table)


# ----------------------------------------------------------------------------------------------------
# sm_90a: the paged build compiles without spills (one build serves every page size)
# ----------------------------------------------------------------------------------------------------
@pytest.mark.cute_compile
@pytest.mark.static
@pytest.mark.parametrize("head_dim", decode.HEAD_DIMS)
def test_paged_build_compiles_without_spills(head_dim: int):
    for split in (True, False):
        (binary,) = decode.compile_sm90(_paged_problem(16, head_dim=head_dim), split=split)
        assert "cp.async.cg" in binary.ptx
        for name, usage in cubin_resources(binary.cubin).items():
            spills = usage["stack_bytes"] + usage["local_bytes"]
            print(f"paged D={head_dim} split={split} {name[:40]}: {usage['registers']} registers")
            assert spills == 0, f"D={head_dim} split={split}: {spills} B spilled"


# ----------------------------------------------------------------------------------------------------
# GPU: bf16 against fp64, paged == contiguous, planted paging bugs
# ----------------------------------------------------------------------------------------------------
def _with_splits(num_splits: int | None) -> Implementation:
    if num_splits is None:
        return decode.IMPLEMENTATION
    prepare = functools.partial(decode.decode_attention, num_splits=num_splits)
    return dataclasses.replace(decode.IMPLEMENTATION, prepare=prepare)


def _check_paged(problem: Problem, num_splits: int | None, *, seed: int):
    q, k, v = make_inputs(problem, seed=seed, device="cuda", offset=0.5)
    k_pages, v_pages, table = make_paged_kv(problem, k, v, seed=seed)
    lengths = _lengths(problem, "cuda")
    impl = _with_splits(num_splits)
    return check_on_inputs(impl, q, k_pages, v_pages, problem, cache_seqlens=lengths, block_table=table)


# (page size, Sq, kv_heads of 32, forced splits or the rule): 16 (four pages per 64-key block) with the
# rule, 48 (blocks start mid-page), 64 (one page per block), 256 (four blocks per page); GQA 4, MQA and
# MHA; speculative Sq 4 and 16; more splits than a short sequence has blocks.
GPU_CASES = [(16, 1, 8, None), (16, 4, 8, 3), (48, 1, 1, 5), (64, 1, 32, None), (256, 16, 8, 5), (64, 2, 8, 16)]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=[f"page{p}-sq{q}-hkv{h}-splits{s}" for p, q, h, s in GPU_CASES])
def test_gpu_paged_decode_bf16(case: tuple[int, int, int, int | None]):
    page_size, seqlen_q, kv_heads, num_splits = case
    problem = _paged_problem(page_size, seqlen_q, kv_heads)
    result = _check_paged(problem, num_splits, seed=page_size + seqlen_q)
    assert result.ok, f"{problem.describe()} splits={num_splits}: {result.summary()}"


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [16, 48, 256])
def test_gpu_paged_output_equals_the_contiguous_output_bit_for_bit(page_size: int):
    """The same logical cache, the same splits: the pages change the addresses, never the arithmetic."""
    problem = _paged_problem(page_size, 2, 8)
    q, k, v = make_inputs(problem, seed=11, device="cuda", offset=0.5)
    k_pages, v_pages, table = make_paged_kv(problem, k, v, seed=11)
    lengths = _lengths(problem, "cuda")
    paged = decode.decode_attention(q, k_pages, v_pages, problem, cache_seqlens=lengths, block_table=table)
    dense = decode.decode_attention(q, k, v, problem.with_(page_size=0), cache_seqlens=lengths)
    assert paged.num_splits == dense.num_splits
    (out_paged, lse_paged), (out_dense, lse_dense) = paged(), dense()
    assert torch.equal(out_paged, out_dense) and torch.equal(lse_paged, lse_dense)


def _slot_off_by_one(pages: PagedKV, key):
    page_index = key // pages.page_size
    return pages.block_table_row[page_index], (key - page_index * pages.page_size + 1) % pages.page_size


def _neighbouring_page(pages: PagedKV, key):
    page_index = key // pages.page_size
    return pages.block_table_row[page_index ^ 1], key - page_index * pages.page_size


def _table_ignored(pages: PagedKV, key):
    page_index = key // pages.page_size
    return page_index, key - page_index * pages.page_size


# Each stays inside the pool (the test's table has an even number of entries per sequence), so a
# planted bug reads wrong keys, never outside the allocation.
PLANTED = {
    "slot within the page off by one": _slot_off_by_one,
    "the neighbouring entry of the block table": _neighbouring_page,
    "block table ignored (pages read in logical order)": _table_ignored,
}


@pytest.mark.gpu
@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_gpu_planted_paging_bug_fails_the_check(bug: str, monkeypatch: pytest.MonkeyPatch):
    problem = _paged_problem(16, 1, 8)  # passes unplanted: test_gpu_paged_decode_bf16[page16-sq1-hkv8-splitsNone]
    assert (problem.seqlen_k // problem.page_size) % 2 == 0
    monkeypatch.setattr(decode.HOST.kernels, "compiled", {})
    monkeypatch.setattr(_device, "page_and_slot", PLANTED[bug])
    result = _check_paged(problem, 3, seed=17)
    assert not result.ok, f"{bug}: the check passed a wrong kernel ({result.summary()})"
