"""A paged KV cache (a block table of fixed-size pages, vLLM's and FlashInfer's layout) through the
contract, triton/decode and gluon/decode: the problem, the page helpers and the fp64 reference that
gathers pages, bad input, capability refusals, the plan cache; triton/decode against fp64 under the
interpreter (pages of 16 to 256 keys, ragged lengths with an empty and a full sequence, GQA, Sq up to
16, shuffled pages, forced splits) and planted paging bugs the check must fail; the sm_90a builds; and
the same on the GPU, for gluon/decode too (its TMA chunks of pages against fp64, bit for bit against
its contiguous build, and planted paging bugs)."""

from __future__ import annotations

import dataclasses
import functools
import itertools

import pytest
import torch
import triton
import triton.language as tl

from common.contract import validation
from common.contract.api import attention, clear_plan_cache, plan_cache_info
from common.contract.capability import FEATURES, KNOWN_FEATURES, PAGED_KV, check_features, needed_features
from common.contract.check import check_implementation, check_on_inputs
from common.contract.inputs import make_block_table, make_inputs, make_paged_kv, pool_pages
from common.contract.problem import Problem
from common.contract.reference import gather_pages, reference_attention
from common.contract.registry import Implementation, discover, per_call_inputs
from common.contract.validation import validate_attention_inputs
from common.measure.peaks import Peaks
from common.measure.runner import TimingOptions, make_workload, measure
from common.toolchain.releases import triton_release
from tests._helpers import child_result, require_supported, scripts_in_one_child
from tests.capability_matrix import pretend_sm90
from triton_impl import _device, decode
from triton_impl._device import kv_page_slots
from triton_impl.gluon import decode as gluon_decode

CPU = torch.device("cpu")
interpreter_only = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter tests run on CPU-only machines")
AVAILABLE, _ = discover()


def _paged_problem(page_size: int = 16, seqlen_q: int = 1, kv_heads: int = 2, **changes) -> Problem:
    """Three sequences of a capacity of about 320 keys in whole pages, a decode step with every feature."""
    fields = dict(
        batch=3, heads=8, seqlen_q=seqlen_q, seqlen_k=max(1, 320 // page_size) * page_size, head_dim=64,
        dtype=torch.float32, causal=True, kv_heads=kv_heads, causal_alignment="bottom_right",
        has_cache_seqlens=True, return_lse=True, page_size=page_size,
    )  # fmt: skip
    return Problem(**{**fields, **changes})


def _lengths(problem: Problem, device: str | torch.device = "cpu") -> torch.Tensor:
    """A full sequence, an empty one, and one ending inside a page (41% of the capacity); more
    sequences (the GPU cases) end one key into a page."""
    capacity = problem.seqlen_k
    values = (capacity, 0, capacity * 41 // 100, problem.page_size + 1)[: problem.batch]
    return torch.tensor(values, dtype=torch.int32, device=device)


def _with_splits(num_splits: int | None) -> Implementation:
    """triton/decode with the split count forced (the bind/prepare keyword the public API lacks)."""
    if num_splits is None:
        return decode.IMPLEMENTATION
    return dataclasses.replace(decode.IMPLEMENTATION, prepare=functools.partial(decode.prepare, num_splits=num_splits))


def _paged_inputs(problem: Problem, *, seed: int, device: str | torch.device = "cpu", offset: float = 0.5):
    """q, the contiguous k and v, their pools and block table, and the lengths."""
    q, k, v = make_inputs(problem, seed=seed, device=device, offset=offset)
    k_pages, v_pages, block_table = make_paged_kv(problem, k, v, seed=seed)
    return q, (k, v), (k_pages, v_pages, block_table), _lengths(problem, device)


def _check_paged(problem: Problem, num_splits: int | None, *, seed: int = 0, device: str = "cpu"):
    q, _, (k_pages, v_pages, block_table), lengths = _paged_inputs(problem, seed=seed, device=device)
    impl = _with_splits(num_splits)
    return check_on_inputs(impl, q, k_pages, v_pages, problem, cache_seqlens=lengths, block_table=block_table)


# ----------------------------------------------------------------------------------------------------
# The problem, the page helpers and the reference
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"page_size": 8}, r"page_size must be 0 .* \[16, 256\], got 8"),
        ({"page_size": 512, "seqlen_k": 512}, r"got 512"),
        ({"page_size": 16.0, "seqlen_k": 320}, r"got 16.0"),
        ({"seqlen_k": 300}, r"whole pages .* got seqlen_k=300 and page_size=16"),
        ({"has_cache_seqlens": False}, r"needs has_cache_seqlens"),
    ],
)
def test_a_bad_paged_problem_is_refused(changes: dict, message: str):
    with pytest.raises(ValueError, match=message):
        _paged_problem(**changes)


def test_the_page_size_is_part_of_the_problem():
    problem = _paged_problem(16)
    assert problem.paged and "paged(16)" in problem.describe()
    assert problem != problem.with_(page_size=32) and hash(problem) != hash(problem.with_(page_size=32))
    assert not problem.with_(page_size=0).paged


def test_the_block_table_shuffles_distinct_pages_and_spares_the_last():
    problem = _paged_problem(16, batch=4)
    table = make_block_table(problem, seed=3, device="cpu")
    assert table.dtype == torch.int32 and table.shape == (4, problem.seqlen_k // 16)
    pages = table.flatten().tolist()
    assert len(set(pages)) == len(pages), "two sequences share a page"
    assert min(pages) >= 0 and max(pages) < pool_pages(problem) - 1, "the pool's last page is referenced"
    # Shuffled: logically adjacent pages are not adjacent in memory.
    assert sum(b - a == 1 for a, b in itertools.pairwise(pages)) < len(pages) // 4
    with pytest.raises(ValueError, match="needs a paged problem"):
        make_block_table(problem.with_(page_size=0), device="cpu")


@pytest.mark.parametrize("page_size", [16, 48, 256])
def test_pages_round_trip_and_only_the_used_entries_are_read(page_size: int):
    problem = _paged_problem(page_size)
    _, (k, _), (k_pages, _, table), lengths = _paged_inputs(problem, seed=1)
    assert k_pages.shape == (pool_pages(problem), page_size, problem.kv_heads, problem.head_dim)
    unreferenced = sorted(set(range(pool_pages(problem))) - set(table.flatten().tolist()))
    assert unreferenced and torch.isnan(k_pages[unreferenced]).all(), "pages no sequence names must be NaN"
    # Table entries past a sequence's length may be anything: the gather never reads them.
    garbage = table.clone()
    for b, length in enumerate(lengths.tolist()):
        garbage[b, -(-length // page_size) :] = 10**6
    dense = gather_pages(k_pages, garbage, lengths.tolist())
    assert dense.shape == k.shape
    for b, length in enumerate(lengths.tolist()):
        assert torch.equal(dense[b, :, :length], k[b, :, :length])
        assert not dense[b, :, length:].any()


def test_the_reference_gathers_pages_into_the_contiguous_answer():
    problem = _paged_problem(16, seqlen_q=3)
    q, (k, v), (k_pages, v_pages, table), lengths = _paged_inputs(problem, seed=2)
    paged = reference_attention(q, k_pages, v_pages, problem, cache_seqlens=lengths, block_table=table, with_lse=True)
    dense = reference_attention(q, k, v, problem.with_(page_size=0), cache_seqlens=lengths, with_lse=True)
    assert torch.equal(paged[0], dense[0]) and torch.equal(paged[1], dense[1])
    with pytest.raises(ValueError, match="pass block_table"):
        reference_attention(q, k_pages, v_pages, problem, cache_seqlens=lengths)


def test_per_call_inputs_pass_the_block_table_exactly_when_paged():
    problem = _paged_problem(16)
    lengths, table = _lengths(problem), make_block_table(problem, device="cpu")
    assert per_call_inputs(problem, lengths, table) == {"cache_seqlens": lengths, "block_table": table}
    with pytest.raises(ValueError, match="block_table is None"):
        per_call_inputs(problem, lengths)
    with pytest.raises(ValueError, match=r"without a paged KV cache \(page_size=0\)"):
        per_call_inputs(problem.with_(page_size=0), lengths, table)


# ----------------------------------------------------------------------------------------------------
# Capability: only a rung that names PAGED_KV takes a paged problem; the others say why not
# ----------------------------------------------------------------------------------------------------
def test_paged_kv_is_a_feature_the_rungs_must_name():
    problem = _paged_problem(64)
    assert PAGED_KV in KNOWN_FEATURES and PAGED_KV not in FEATURES
    assert needed_features(problem)[PAGED_KV] == "a paged KV cache (block_table, pages of 64 keys)"
    ok, reason = check_features("some/rung", problem, FEATURES)
    assert not ok and reason == "some/rung: a paged KV cache (block_table, pages of 64 keys) not implemented yet"
    assert check_features("some/rung", problem, KNOWN_FEATURES) == (True, "")


@pytest.mark.parametrize("impl_name", sorted(impl.name for impl in AVAILABLE if impl.runs_on_cpu))
def test_every_other_implementation_refuses_a_paged_problem_naming_it(impl_name: str):
    impl = {impl.name: impl for impl in AVAILABLE}[impl_name]
    problem = _paged_problem(16, return_lse=False)
    ok, reason = impl.check(problem, CPU)
    if impl_name == "triton/decode":
        assert ok, reason
    else:
        assert not ok and "paged" in reason, f"{impl_name}: {reason!r}"


def test_the_runner_reports_a_refusal_as_a_skipped_row_with_its_reason():
    """What compare.py --decode prints for an implementation without a paged path."""
    problem = _paged_problem(16, return_lse=False, seqlen_k=64)
    workload = make_workload(problem, "cpu", _lengths(problem))
    assert workload.block_table is not None and workload.k.shape[1] == 16
    sdpa_math = {impl.name: impl for impl in AVAILABLE}["sdpa/math"]
    row = measure(sdpa_math, workload, CPU, TimingOptions(), Peaks(None, None, None))
    assert row.status == "skipped" and "not a paged one (block_table, pages of 16 keys)" in row.reason


# ----------------------------------------------------------------------------------------------------
# Bad input: a clear error naming what was expected and what was given
# ----------------------------------------------------------------------------------------------------
def _api_inputs(page_size: int = 16):
    problem = _paged_problem(page_size, batch=2, seqlen_k=4 * page_size)
    q, _, (k_pages, v_pages, table), _ = _paged_inputs(problem, seed=0)
    return q, k_pages, v_pages, table, torch.tensor([4 * page_size, 5], dtype=torch.int32)


BAD_PAGED_INPUTS = {
    "table dtype": (lambda q, k, v, t, n: (q, k, v, t.long(), n), TypeError, r"block_table must be int32, got int64"),
    "table type": (lambda q, k, v, t, n: (q, k, v, t.tolist(), n), TypeError, r"torch.Tensor or None, got list"),
    "table rank": (lambda q, k, v, t, n: (q, k, v, t[0], n), ValueError, r"= \(2, >= 1\), got \(4,\)"),
    "table batch": (lambda q, k, v, t, n: (q, k, v, torch.cat([t, t]), n), ValueError, r"got \(4, 4\)"),
    "table device": (lambda q, k, v, t, n: (q, k, v, t.to("meta"), n), ValueError, r"device cpu, got meta"),
    "no lengths": (
        lambda q, k, v, t, n: (q, k, v, t, None),
        ValueError,
        r"needs cache_seqlens.*got cache_seqlens=None",
    ),
    "length past the capacity": (
        lambda q, k, v, t, n: (q, k, v, t, torch.tensor([65, 3], dtype=torch.int32)),
        ValueError,
        r"\[0, 64\] .*capacity.* got values in \[3, 65\]",
    ),
    "page too small": (lambda q, k, v, t, n: (q, k[:, :8], v[:, :8], t, n), ValueError, r"got page_size .* 8"),
    "pool shapes differ": (lambda q, k, v, t, n: (q, k, v[:-1], t, n), ValueError, r"same shape, got k"),
    "pool rank": (lambda q, k, v, t, n: (q, k[0], v[0], t, n), ValueError, r"rank 4 \(num_pages, page_size, kv_heads"),
    "kv heads": (lambda q, k, v, t, n: (q[:, :7], k, v, t, n), ValueError, r"must divide q's heads .* got q 7"),
    "head dim": (lambda q, k, v, t, n: (q[..., :32], k, v, t, n), ValueError, r"same head_dim, got q 32 and k 64"),
    "page past the pool": (
        lambda q, k, v, t, n: (q, k, v, _with_entry(t, 0, 3, k.shape[0]), n),
        ValueError,
        r"page indices in \[0, num_pages\) = \[0, 10\), got values in \[\d+, 10\]",
    ),
    "negative page": (
        lambda q, k, v, t, n: (q, k, v, _with_entry(t, 1, 0, -1), n),
        ValueError,
        r"= \[0, 10\), got values in \[-1, \d+\]",
    ),
}


def _with_entry(table: torch.Tensor, batch: int, slot: int, page: int) -> torch.Tensor:
    changed = table.clone()
    changed[batch, slot] = page
    return changed


@pytest.mark.parametrize("case", sorted(BAD_PAGED_INPUTS))
def test_bad_paged_input_is_refused_clearly(case: str):
    change, error, message = BAD_PAGED_INPUTS[case]
    q, k, v, table, lengths = change(*_api_inputs())
    with pytest.raises(error, match=message):
        attention(
            q, k, v, causal=True, causal_alignment="bottom_right", cache_seqlens=lengths, block_table=table,
            impl="triton/decode",
        )  # fmt: skip


def _page_check_outcomes() -> dict[str, str]:
    """The validation's verdict on two tables of ``_api_inputs`` (lengths 64 and 5, pages of 16): sequence 1's one
    page in use past the pool, and sequence 1's three pages past its length set to indices no pool has."""
    q, k, v, table, lengths = _api_inputs()
    tables = {"in use, past the pool": _with_entry(table, 1, 0, k.shape[0]), "past the length": _past_the_length(table)}
    options = {"allow_gqa": True, "dtypes": (q.dtype,), "device_types": ("cpu",)}
    outcomes = {}
    for name, bad in tables.items():
        try:
            validate_attention_inputs(q, k, v, cache_seqlens=lengths, block_table=bad, **options)
            outcomes[name] = "accepted"
        except ValueError:
            outcomes[name] = "refused"
    return outcomes


def _past_the_length(table: torch.Tensor) -> torch.Tensor:
    """``_api_inputs``' table with sequence 1's three pages past its 5 keys set to indices no pool of 10 pages has."""
    changed = table.clone()
    changed[1, 1:] = torch.tensor([10**6, -7, 10], dtype=torch.int32)
    return changed


PAGE_CHECK_RULE = {"in use, past the pool": "refused", "past the length": "accepted"}


def test_page_indices_are_checked_where_read_and_only_there():
    assert _page_check_outcomes() == PAGE_CHECK_RULE


def test_entries_past_a_sequences_length_change_nothing():
    q, k, v, table, lengths = _api_inputs()
    tables = (table, _past_the_length(table))
    outputs = [attention(q, k, v, cache_seqlens=lengths, block_table=t, impl="triton/decode") for t in tables]
    assert torch.equal(*outputs)


PAGES_IN_USE_BOUNDS = validation._pages_in_use_bounds
PLANTED_PAGE_CHECKS = {
    # Every entry, read or not: refuses vLLM's padding past a sequence's pages.
    "every entry": lambda lengths, table, page_size: (table.amin(), table.amax()),
    # Whole pages only (floor for ceil): misses the page a partial last page of keys is in.
    "whole pages": lambda lengths, table, page_size: PAGES_IN_USE_BOUNDS(
        lengths // page_size * page_size, table, page_size
    ),
}


@pytest.mark.parametrize("bug", sorted(PLANTED_PAGE_CHECKS))
def test_planted_page_check_fails_the_rule(bug: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(validation, "_pages_in_use_bounds", PLANTED_PAGE_CHECKS[bug])
    assert _page_check_outcomes() != PAGE_CHECK_RULE


def test_a_rung_without_paging_refuses_a_block_table_with_its_reason():
    q, k, v, table, lengths = _api_inputs()
    with pytest.raises(ValueError, match=r"triton/pipelined cannot run .*paged KV cache.*not implemented yet"):
        attention(q, k, v, cache_seqlens=lengths, block_table=table, impl="triton/pipelined")


def test_a_rung_given_pools_without_their_block_table_says_so():
    q, k, v, _, lengths = _api_inputs()
    problem = _paged_problem(16, batch=2, seqlen_k=64)
    with pytest.raises(
        ValueError, match=r"block_table must be given exactly when .*page_size=16, got block_table=None"
    ):
        decode.prepare(q, k, v, problem, cache_seqlens=lengths)


# ----------------------------------------------------------------------------------------------------
# triton/decode against fp64 under the interpreter
# ----------------------------------------------------------------------------------------------------
# (page size, Sq, kv_heads of 8 heads (4 at Sq = 16), forced splits): pages of 16 (vLLM's default, four
# per key block), 48 (not a power of two: blocks start mid-page), 64 (one per block) and 256 (four blocks
# per page); GQA groups of 4 and 1, MQA; one token to 16 (a 64-row M tile); one split, a few, and more
# than a short sequence has key blocks (empty splits).
CASES = [(16, 1, 2, 3), (16, 5, 8, 1), (48, 2, 2, 3), (64, 1, 1, 16), (64, 16, 1, 3), (256, 3, 2, 5)]


@interpreter_only
@pytest.mark.parametrize("case", CASES, ids=[f"page{p}-sq{q}-hkv{h}-splits{s}" for p, q, h, s in CASES])
def test_paged_cache_against_fp64(case: tuple[int, int, int, int]):
    page_size, seqlen_q, kv_heads, num_splits = case
    problem = _paged_problem(page_size, seqlen_q, kv_heads, heads=8 if seqlen_q < 16 else 4)
    result = _check_paged(problem, num_splits, seed=page_size + seqlen_q)
    assert result.ok, f"{problem.describe()} splits={num_splits}: {result.summary()}"


@interpreter_only
def test_paged_fp16_without_a_causal_mask():
    problem = _paged_problem(32, 4, 2, dtype=torch.float16, causal=False, causal_alignment="top_left")
    result = _check_paged(problem, 3, seed=5)
    assert result.ok, f"{problem.describe()}: {result.summary()}"


@interpreter_only
@pytest.mark.parametrize("page_size", [16, 48])
def test_paged_output_equals_the_contiguous_output_bit_for_bit(page_size: int):
    """The same logical cache, the same splits: the pages change the addresses, never the arithmetic."""
    problem = _paged_problem(page_size, 2, 2)
    q, (k, v), (k_pages, v_pages, table), lengths = _paged_inputs(problem, seed=7)
    paged = decode.prepare(q, k_pages, v_pages, problem, cache_seqlens=lengths, block_table=table, num_splits=3)
    dense = decode.prepare(q, k, v, problem.with_(page_size=0), cache_seqlens=lengths, num_splits=3)
    (out_paged, lse_paged), (out_dense, lse_dense) = paged(), dense()
    assert torch.equal(out_paged, out_dense) and torch.equal(lse_paged, lse_dense)


@interpreter_only
def test_the_block_table_is_a_per_call_input_of_a_plan():
    """A second call with other pools and another shuffle binds the plan (no prepare) and reads the
    new table; a table of another width is another signature."""
    clear_plan_cache()
    problem = _paged_problem(16, 1, 2, batch=2, seqlen_k=64, return_lse=False)
    options = {"causal": True, "causal_alignment": "bottom_right", "impl": "triton/decode"}
    for seed in (0, 1):
        q, _, (k_pages, v_pages, table), lengths = _paged_inputs(problem, seed=seed)
        out = attention(q, k_pages, v_pages, cache_seqlens=lengths, block_table=table, **options)
        ref = reference_attention(q, k_pages, v_pages, problem, cache_seqlens=lengths, block_table=table)
        torch.testing.assert_close(out, ref.float(), atol=1e-5, rtol=1e-5)
    assert (plan_cache_info().misses, plan_cache_info().hits) == (1, 1)
    wider = problem.with_(seqlen_k=80)
    q, _, (k_pages, v_pages, table), lengths = _paged_inputs(wider, seed=2)
    attention(q, k_pages, v_pages, cache_seqlens=lengths, block_table=table, **options)
    assert plan_cache_info().misses == 2


# ----------------------------------------------------------------------------------------------------
# Planted paging bugs the check must catch
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _next_page(offs_k, block_table_row, seqlen_k, PAGE_SIZE: tl.constexpr, MASKED: tl.constexpr):
    page, slot = kv_page_slots(offs_k, block_table_row, seqlen_k, PAGE_SIZE, MASKED)
    return page + 1, slot


@triton.jit
def _next_slot(offs_k, block_table_row, seqlen_k, PAGE_SIZE: tl.constexpr, MASKED: tl.constexpr):
    page, slot = kv_page_slots(offs_k, block_table_row, seqlen_k, PAGE_SIZE, MASKED)
    return page, (slot + 1) % PAGE_SIZE


@triton.jit
def _pages_in_logical_order(offs_k, block_table_row, seqlen_k, PAGE_SIZE: tl.constexpr, MASKED: tl.constexpr):
    return (offs_k // PAGE_SIZE).to(tl.int64), offs_k % PAGE_SIZE


PLANTED = {
    "page index off by one": _next_page,
    "slot within the page off by one": _next_slot,
    "block table ignored (pages read in logical order)": _pages_in_logical_order,
}


@interpreter_only
@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_paging_bug_fails_the_check(bug: str, monkeypatch: pytest.MonkeyPatch):
    """The lookup per key (``kv_page_slots``: any page size that BLOCK_N and the page do not divide, and every one with
    ``PAGED_SPAN_LOOKUP`` off; the span lookup's own planted bugs are in tests/test_decode_paged_pages.py), unplanted
    then planted on the same problem and seed."""
    monkeypatch.setattr(decode, "PAGED_SPAN_LOOKUP", False)
    problem = _paged_problem(16, 1, 2)
    unplanted = _check_paged(problem, 3, seed=17)
    assert unplanted.ok, unplanted.summary()
    monkeypatch.setattr(_device, "kv_page_slots", PLANTED[bug])
    result = _check_paged(problem, 3, seed=17)
    assert not result.ok, f"{bug}: the check passed a wrong kernel ({result.summary()})"


# ----------------------------------------------------------------------------------------------------
# sm_90a: the paged build compiles, does not spill, and keeps the contiguous build's K/V depth
# ----------------------------------------------------------------------------------------------------
_PAGED_BUILD_PROBE = """
import json
from common.contract.problem import Problem
from common.reporting.static import cubin_resources, ptx_features
from triton_impl import decode
rows = {}
for head_dim in decode.HEAD_DIMS:
    for page_size in (0, 16, 256):
        problem = Problem(8, 32, 1, 32768, head_dim, kv_heads=8, causal=True, causal_alignment="bottom_right",
                          has_cache_seqlens=True, page_size=page_size)
        binary = decode.compile_sm90(problem)[0]
        usage = next(iter(cubin_resources(binary.cubin).values()))
        rows[f"D={head_dim} page={page_size}"] = [usage["stack_bytes"] + usage["local_bytes"], binary.shared_bytes,
                                                  ptx_features(binary.ptx)["cp.async"]]
print(json.dumps(rows))
"""
# The block table's own buffers: one BLOCK_N-entry int32 load per pipeline stage, well under this.
TABLE_BUFFER_BYTES = 4096


@pytest.fixture(scope="session")
def paged_builds() -> dict[str, dict]:
    """Both stacks' paged build probes, ``triton`` (above) and ``gluon`` (below), in one child process without
    TRITON_INTERPRET: one import for the two tests (one pytest-xdist group); read one with ``child_result``."""
    probes = {
        "triton": (_PAGED_BUILD_PROBE, []), "gluon": (_GLUON_PAGED_BUILD_PROBE, []), "ahead": (_GLUON_AHEAD_PROBE, []),
    }  # fmt: skip
    return scripts_in_one_child(probes, timeout=1800)


@pytest.mark.static
@pytest.mark.release
@pytest.mark.xdist_group("static-sm90")
def test_paged_build_compiles_without_spills_at_the_contiguous_depth(paged_builds: dict[str, dict]):
    rows = child_result(paged_builds, "triton")
    for head_dim in decode.HEAD_DIMS:
        _, dense_shared, _ = rows[f"D={head_dim} page=0"]
        for page_size in (16, 256):
            spills, shared, uses_cp_async = rows[f"D={head_dim} page={page_size}"]
            name = f"D={head_dim} page={page_size}"
            assert spills == 0 and uses_cp_async, f"{name}: {spills} bytes spilled, cp.async {uses_cp_async}"
            # PAGED_EXTRA_STAGES: as many K/V blocks in flight as the contiguous build.
            assert dense_shared <= shared < dense_shared + TABLE_BUFFER_BYTES, f"{name}: {shared} vs {dense_shared}"


# ----------------------------------------------------------------------------------------------------
# gluon/decode: K and V copied by TMA in chunks that each lie in one page
# ----------------------------------------------------------------------------------------------------
# The rungs that read a paged cache on a GPU.
PAGED_RUNGS = ("triton/decode", "gluon/decode", "cute/decode")


def chunks_lie_in_pages(chunk: int | None, page_size: int, block_n: int) -> bool:
    """The rule gluon/decode's copies rest on: a chunk of keys starting at a multiple of itself never
    crosses a page boundary (it divides page_size) and the chunks tile the key block (it divides it)."""
    return chunk is not None and page_size % chunk == 0 and block_n % chunk == 0


@pytest.mark.parametrize(
    ("head_dim", "page_size", "chunk"),
    [(128, 16, 16), (128, 48, 16), (128, 64, 64), (128, 256, 128), (256, 256, 64), (64, 32, 32), (64, 160, 32)],
)
def test_gluon_copies_pages_in_chunks_that_lie_in_one_page(
    head_dim: int, page_size: int, chunk: int, monkeypatch: pytest.MonkeyPatch
):
    # The default tiles' chunks (these short caches would take the short-cache tile, 64-key blocks at D=128).
    monkeypatch.setattr(gluon_decode, "SHORT_CACHE_TILE", False)
    problem = _paged_problem(page_size, head_dim=head_dim, dtype=torch.bfloat16)
    block_n = gluon_decode.DEFAULT_CONFIGS[head_dim].block_n
    assert gluon_decode.kv_chunk_rows(problem) == chunk
    assert chunks_lie_in_pages(chunk, page_size, block_n)
    # A contiguous cache is copied a whole key block at a time.
    assert gluon_decode.kv_chunk_rows(problem.with_(page_size=0)) == block_n


def test_the_chunk_rule_catches_a_chunk_that_crosses_pages():
    """Planted: a whole 128-key block copied from a page of 48 keys (the block spans three pages)."""
    assert not chunks_lie_in_pages(128, 48, 128)
    assert not chunks_lie_in_pages(32, 48, 128)
    assert not chunks_lie_in_pages(None, 40, 128)


@pytest.mark.parametrize("page_size", [16, 48, 256])
def test_gluon_accepts_pages_of_a_multiple_of_16_keys(page_size: int):
    problem = _paged_problem(page_size, dtype=torch.bfloat16)
    with pretend_sm90():
        assert gluon_decode.supports(problem, torch.device("cuda")) == (True, "")


@pytest.mark.parametrize("page_size", [20, 40, 200])
def test_gluon_refuses_other_page_sizes_naming_them(page_size: int):
    problem = _paged_problem(page_size, dtype=torch.bfloat16)
    with pretend_sm90():
        ok, reason = gluon_decode.supports(problem, torch.device("cuda"))
    assert gluon_decode.kv_chunk_rows(problem) is None
    assert not ok and f"page_size={page_size}" in reason and "multiple of 16" in reason, reason


_GLUON_PAGED_BUILD_PROBE = """
import json
import torch
from common.contract.problem import Problem
from common.reporting.static import cubin_resources, ptx_features
from triton_impl.gluon import decode
# One ring for every build compared: these 64 items would take the pair ring (test_gluon_decode_pair_tile.py's) where
# contiguous or in pages of 256, the default ring in pages of 16 and 48.
decode.BALANCED_PAIR_TILE = False
rows = {}
for head_dim in decode.HEAD_DIMS:
    for page_size in (0, 16, 48, 256):
        problem = Problem(8, 32, 1, 32640 if page_size == 48 else 32768, head_dim, dtype=torch.bfloat16, kv_heads=8,
                          causal=True, causal_alignment="bottom_right", has_cache_seqlens=True, page_size=page_size)
        (binary,) = decode.compile_sm90(problem)
        usage = next(iter(cubin_resources(binary.cubin).values()))
        features = ptx_features(binary.ptx)
        rows[f"D={head_dim} page={page_size}"] = [usage["stack_bytes"] + usage["local_bytes"], binary.shared_bytes,
                                                  features["cp.async.bulk.tensor"], features["cp.async"],
                                                  binary.ptx.count("cp.async.bulk.tensor"), decode.load_warp(problem)]
print(json.dumps(rows))
"""


# A load warp's build (PAGED_LOAD_WARP) beside the ring: a slot's empty barrier each and warp_specialize's own state
# (164 bytes at D=128 under Triton 3.6 and 3.8), well under a 1 KB reservation.
LOAD_WARP_SHARED_BYTES = 256
# Spills known and accepted per Triton release (bytes per thread), each a bound the build must stay under:
# Triton 3.9's register allocation spills the paged builds at D=128 and 256 (the chunks' page numbers live
# beside the ring's barriers and the accumulator); 3.6-3.8 compile every paged build without spills. The
# cost is unmeasured: the H200 timings of paged gluon/decode (results/h200/paged-decode/) ran Triton 3.6.
# The merge in the split kernel (2026-11-29, fourth stop) took 8-16 more bytes at D=256 under 3.9.
KNOWN_GLUON_PAGED_SPILLS: dict[tuple[str, str], int] = {
    ("3.9", "D=128 page=16"): 128,
    ("3.9", "D=128 page=48"): 128,
    ("3.9", "D=128 page=256"): 8,
    ("3.9", "D=256 page=16"): 64,
    ("3.9", "D=256 page=48"): 64,
    ("3.9", "D=256 page=256"): 32,
}


@pytest.mark.static
@pytest.mark.release
@pytest.mark.xdist_group("static-sm90")
def test_gluon_paged_build_compiles_without_spills_on_the_contiguous_ring(paged_builds: dict[str, dict]):
    """Every head dim, pages smaller than a key block (16, and 48: not a power of two) and larger (256):
    no spills (but a release's known ones, bounded), TMA and no cp.async, the shared memory of the
    contiguous build (the same ring; with a load warp, its empty barriers beside it), and more copy
    instructions when a block takes several chunks."""
    rows = child_result(paged_builds, "gluon")
    for head_dim in gluon_decode.HEAD_DIMS:
        _, dense_shared, _, _, dense_copies, _ = rows[f"D={head_dim} page=0"]
        for page_size in (16, 48, 256):
            name = f"D={head_dim} page={page_size}"
            spills, shared, tma, cp_async, copies, load_warp = rows[name]
            allowed = KNOWN_GLUON_PAGED_SPILLS.get((triton_release(), name), 0)
            assert spills <= allowed and tma and not cp_async, (
                f"{name}: {spills} bytes spilled, TMA {tma}, cp.async {cp_async}"
            )
            extra = LOAD_WARP_SHARED_BYTES if load_warp else 0
            assert dense_shared <= shared <= dense_shared + extra, f"{name}: {shared} bytes, contiguous {dense_shared}"
            assert copies > dense_copies if page_size < 64 else copies == dense_copies, f"{name}: {copies} copies"


_GLUON_AHEAD_PROBE = """
import json
import torch
from common.contract.problem import Problem
from common.reporting.static import cubin_sass, sass_loops
from triton_impl.gluon import decode
problem = Problem(8, 32, 1, 32768, 64, dtype=torch.bfloat16, kv_heads=8, causal=True, causal_alignment="bottom_right",
                  has_cache_seqlens=True, page_size=16)
rows = {}
for ahead in (False, True):
    decode.PAGE_ENTRIES_AHEAD = ahead
    (binary,) = decode.compile_sm90(problem)
    loops = sorted(sass_loops(cubin_sass(binary.cubin)))
    body = next(body for _, body in loops if any(op.startswith("HGMMA") for op in body))
    mmas = [i for i, op in enumerate(body) if op.startswith("HGMMA")]
    loads = [i for i, op in enumerate(body) if op.startswith("LDG")]
    rows[str(ahead)] = {"first_mma": mmas[0], "last_mma": mmas[-1], "loads": loads}
print(json.dumps(rows))
"""


@pytest.mark.static
@pytest.mark.xdist_group("static-sm90")
def test_gluon_loads_a_refills_table_entries_before_the_steps_wgmmas(paged_builds: dict[str, dict]):
    """``PAGE_ENTRIES_AHEAD``: in the first key loop of the D=64 build in pages of 16 (four chunks a block), every
    table load comes before the step's first wgmma; at the refill (the switch off, the planted form) after its
    last. D=64 because the switch stays on there in every release (``PAGE_ENTRIES_AHEAD_SPILLS``)."""
    assert 64 not in itertools.chain(*gluon_decode.PAGE_ENTRIES_AHEAD_SPILLS.values())
    rows = child_result(paged_builds, "ahead")
    ahead, at_refill = rows["True"], rows["False"]
    assert len(ahead["loads"]) == len(at_refill["loads"]) == 4, rows
    assert max(ahead["loads"]) < ahead["first_mma"], rows
    assert min(at_refill["loads"]) > at_refill["last_mma"], rows


def test_pages_ahead_only_where_paged_and_not_in_a_spilling_release(monkeypatch: pytest.MonkeyPatch):
    problem = _gluon_problem(16, 1, 8, head_dim=64)
    assert gluon_decode.pages_ahead(problem) and not gluon_decode.pages_ahead(problem.with_(page_size=0))
    monkeypatch.setattr(gluon_decode, "PAGE_ENTRIES_AHEAD_SPILLS", {triton_release(): (64,)})
    assert not gluon_decode.pages_ahead(problem)


def test_pages_ahead_not_in_a_ring_whose_registers_set_its_ctas_an_sm(monkeypatch: pytest.MonkeyPatch):
    """PACKED_CONFIGS' rings count their CTAs an SM by registers, which the entries held a step would take."""
    monkeypatch.setattr(gluon_decode, "PACKED_OCCUPANCY", True)
    packed = Problem(16, 128, 16, 4352, 64, dtype=torch.bfloat16, causal=True, kv_heads=32,
                     causal_alignment="bottom_right", has_cache_seqlens=True, page_size=16)  # fmt: skip
    assert gluon_decode.decode_config(packed).ctas_per_sm and not gluon_decode.pages_ahead(packed)
    monkeypatch.setattr(gluon_decode, "PACKED_OCCUPANCY", False)
    assert gluon_decode.pages_ahead(packed)


def _gluon_with_splits(num_splits: int | None) -> Implementation:
    """gluon/decode with the split count forced."""
    if num_splits is None:
        return gluon_decode.IMPLEMENTATION
    return dataclasses.replace(
        gluon_decode.IMPLEMENTATION, prepare=functools.partial(gluon_decode.decode_attention, num_splits=num_splits)
    )


def _gluon_problem(page_size: int, seqlen_q: int, kv_heads: int, head_dim: int = 128) -> Problem:
    """bf16 at decode sizes: 4 sequences of a capacity of about 8k keys in whole pages."""
    return Problem(
        4, 32, seqlen_q, 8192 // page_size * page_size, head_dim, dtype=torch.bfloat16, causal=True,
        kv_heads=kv_heads, causal_alignment="bottom_right", has_cache_seqlens=True, return_lse=True,
        page_size=page_size,
    )  # fmt: skip


# (page size, Sq, kv_heads of 32, forced splits or the rule, head dim): pages of 16 (8 chunks a block),
# 48 (chunks of 16, blocks starting mid-page), 64 (2 chunks), 256 (a block in a page); GQA groups of 4
# and 1 (MHA); speculative Sq 2, 4 and 16; the rule, a few splits and more than a short sequence has
# blocks; D = 64 and 256 as well as 128.
GLUON_GPU_CASES = [
    (16, 1, 8, None, 128), (48, 4, 8, 3, 128), (64, 1, 32, None, 128), (256, 16, 8, 5, 128),
    (16, 2, 8, 16, 128), (16, 1, 8, 3, 64), (48, 1, 8, None, 256), (256, 1, 8, 3, 256),
]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize(
    "case", GLUON_GPU_CASES, ids=[f"page{p}-sq{q}-hkv{h}-splits{s}-d{d}" for p, q, h, s, d in GLUON_GPU_CASES]
)
def test_gpu_gluon_paged_decode_bf16(case: tuple[int, int, int, int | None, int]):
    page_size, seqlen_q, kv_heads, num_splits, head_dim = case
    problem = _gluon_problem(page_size, seqlen_q, kv_heads, head_dim)
    q, _, (k_pages, v_pages, table), lengths = _paged_inputs(problem, seed=page_size + seqlen_q, device="cuda")
    impl = _gluon_with_splits(num_splits)
    result = check_on_inputs(impl, q, k_pages, v_pages, problem, cache_seqlens=lengths, block_table=table)
    assert result.ok, f"{problem.describe()} splits={num_splits}: {result.summary()}"


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [16, 48, 256])
def test_gpu_gluon_paged_output_equals_its_contiguous_output_bit_for_bit(page_size: int):
    """The same tile, ring and splits: the pages change where each chunk is copied from, never the
    arithmetic (keys past a sequence's end weigh P = 0 whichever rows fill them)."""
    _assert_paged_equals_contiguous(gluon_decode.decode_attention, _gluon_problem(page_size, 2, 8), seed=13)


def _shifted_pages(t: torch.Tensor) -> torch.Tensor:
    return t.roll(1, dims=1)


def _table_in_logical_order(table: torch.Tensor) -> torch.Tensor:
    return torch.arange(table.numel(), dtype=table.dtype, device=table.device).view_as(table)


# What a paging bug of the kernel would read, planted in what it is given (the reference reads the
# true pools and table): the page after the right one, the slot after the right one, the pool's pages
# in logical order.
GLUON_PLANTED = {
    "page index off by one": lambda k, v, table: (k, v, table + 1),
    "slot within the page off by one": lambda k, v, table: (_shifted_pages(k), _shifted_pages(v), table),
    "block table ignored (pages read in logical order)": lambda k, v, table: (k, v, _table_in_logical_order(table)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("bug", sorted(GLUON_PLANTED))
@pytest.mark.parametrize("page_size", [16, 256])
def test_gpu_planted_gluon_paging_bug_fails_the_check(page_size: int, bug: str):
    problem = _gluon_problem(page_size, 1, 8)  # passes unplanted: test_gpu_gluon_paged_decode_bf16[page16-...]
    _assert_planted_gluon_bug_fails(problem, bug, seed=page_size + 1)


def _assert_planted_gluon_bug_fails(problem: Problem, bug: str, seed: int) -> None:
    """gluon/decode given what GLUON_PLANTED's ``bug`` would read (the reference the true pools) fails the check."""
    q, _, (k_pages, v_pages, table), lengths = _paged_inputs(problem, seed=seed, device="cuda")

    def planted_prepare(q, k, v, problem, *, cache_seqlens=None, block_table=None):
        k, v, block_table = GLUON_PLANTED[bug](k, v, block_table)
        return gluon_decode.decode_attention(q, k, v, problem, cache_seqlens=cache_seqlens, block_table=block_table)

    impl = dataclasses.replace(gluon_decode.IMPLEMENTATION, prepare=planted_prepare)
    result = check_on_inputs(impl, q, k_pages, v_pages, problem, cache_seqlens=lengths, block_table=table)
    assert not result.ok, f"{bug}: the check passed a wrong kernel ({result.summary()})"


# gluon/decode's load warp (PAGED_LOAD_WARP), where it engages: pages smaller than a key block in a
# ring one CTA an SM holds, so caches past the short-cache ring's 8k keys. (page size, Sq, kv_heads of 32, forced
# splits or the rule, head dim): vLLM's 16 with the rule (many laps of the ring in each split) and with 3 splits, 48
# (chunks of 16, blocks starting mid-page) with speculative Sq 4, 32 at D=256 (64-key blocks).
LOAD_WARP_CASES = [(16, 1, 8, None, 128), (16, 2, 8, 3, 128), (48, 4, 8, 3, 128), (32, 1, 8, None, 256)]


def _load_warp_problem(page_size: int, seqlen_q: int, kv_heads: int, head_dim: int) -> Problem:
    """Two sequences of a capacity of about 32k keys in whole pages."""
    problem = _gluon_problem(page_size, seqlen_q, kv_heads, head_dim)
    return problem.with_(batch=2, seqlen_k=32768 // page_size * page_size)


@pytest.fixture
def load_warp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gluon_decode, "PAGED_LOAD_WARP", True)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "case", LOAD_WARP_CASES, ids=[f"page{p}-sq{q}-hkv{h}-splits{s}-d{d}" for p, q, h, s, d in LOAD_WARP_CASES]
)
def test_gpu_gluon_load_warp_paged_decode_bf16(case: tuple[int, int, int, int | None, int], load_warp: None):
    page_size, seqlen_q, kv_heads, num_splits, head_dim = case
    problem = _load_warp_problem(page_size, seqlen_q, kv_heads, head_dim)
    assert gluon_decode.load_warp(problem), problem.describe()
    q, _, (k_pages, v_pages, table), lengths = _paged_inputs(problem, seed=page_size + seqlen_q, device="cuda")
    impl = _gluon_with_splits(num_splits)
    result = check_on_inputs(impl, q, k_pages, v_pages, problem, cache_seqlens=lengths, block_table=table)
    assert result.ok, f"{problem.describe()} splits={num_splits}: {result.summary()}"


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [16, 48])
def test_gpu_gluon_load_warp_output_equals_its_contiguous_output_bit_for_bit(page_size: int, load_warp: None):
    _assert_paged_equals_contiguous(gluon_decode.decode_attention, _load_warp_problem(page_size, 2, 8, 128), seed=13)


@pytest.mark.gpu
@pytest.mark.parametrize("bug", sorted(GLUON_PLANTED))
def test_gpu_planted_load_warp_paging_bug_fails_the_check(bug: str, load_warp: None):
    # Four sequences: a shift of every page's slots permutes a full sequence's keys with their values (attention
    # cannot see it) and shows only where a length ends inside a page (``_lengths``' third and fourth).
    _assert_planted_gluon_bug_fails(_load_warp_problem(16, 1, 8, 128).with_(batch=4), bug, seed=17)


def test_load_warp_engages_only_where_one_cta_holds_an_sm(load_warp: None):
    """The rule: every LOAD_WARP_CASES problem takes the load warp; the same pages on an 8k cache (the short-cache
    ring, two CTAs an SM) and pages of a whole block do not, nor anything with the switch off."""
    for page, seqlen_q, kv_heads, _, head_dim in LOAD_WARP_CASES:
        assert gluon_decode.load_warp(_load_warp_problem(page, seqlen_q, kv_heads, head_dim))
    assert not gluon_decode.load_warp(_gluon_problem(16, 1, 8, 128))
    assert not gluon_decode.load_warp(_load_warp_problem(128, 1, 8, 128))
    gluon_decode.PAGED_LOAD_WARP = False
    assert not gluon_decode.load_warp(_load_warp_problem(16, 1, 8, 128))


_LOAD_WARP_PROBE = """
import json
import torch
from common.contract.problem import Problem
from common.reporting.static import cubin_resources, cubin_sass, sass_loops
from triton_impl.gluon import decode
# The default ring's build, where the load warp engages (these 64 items take the pair ring by default).
decode.BALANCED_PAIR_SMALL_PAGES = False
rows = {}
problem = Problem(8, 32, 1, 32768, 128, dtype=torch.bfloat16, kv_heads=8, causal=True,
                  causal_alignment="bottom_right", has_cache_seqlens=True, page_size=16)
for load_warp in (False, True):
    decode.PAGED_LOAD_WARP = load_warp
    (binary,) = decode.compile_sm90(problem)
    usage = next(iter(cubin_resources(binary.cubin).values()))
    loops = [body for _, body in sass_loops(cubin_sass(binary.cubin))]
    count = lambda body, prefix: sum(op.startswith(prefix) for op in body)
    wgmma_loops = [body for body in loops if count(body, "HGMMA")]
    rows[str(load_warp)] = {
        "spills": usage["stack_bytes"] + usage["local_bytes"],
        "wgmma_loop_copies": sum(count(body, "UTMALDG") for body in wgmma_loops),
        "wgmma_loop_barriers": max(count(body, "BAR.SYNC") for body in wgmma_loops),
        "copy_loops": sum(1 for body in loops if count(body, "UTMALDG") and not count(body, "HGMMA")),
    }
print(json.dumps(rows))
"""


@pytest.mark.static
def test_gluon_load_warp_takes_the_copies_and_their_barriers_out_of_the_key_loop():
    """PAGED_LOAD_WARP's build in pages of 16 (D=128): spill-free, no TMA copy in the wgmma loops and fewer CTA
    barriers there than the build whose warpgroup copies (one barrier a chunk), the copies in loops of their own."""
    from tests._helpers import json_from_child

    rows = json_from_child(["-c", _LOAD_WARP_PROBE], timeout=1200)
    own, warp = rows["False"], rows["True"]
    assert warp["spills"] == 0 and warp["wgmma_loop_copies"] == 0 and warp["copy_loops"] > 0, warp
    assert own["wgmma_loop_copies"] > 0 and warp["wgmma_loop_barriers"] < own["wgmma_loop_barriers"], (own, warp)


# ----------------------------------------------------------------------------------------------------
# GPU: bf16 at decode sizes
# ----------------------------------------------------------------------------------------------------
# (page size, Sq, kv_heads of 32, forced splits or the rule): vLLM's 16 with the rule, 64 and 256
# forced, GQA 4 and 1 (MHA), speculative Sq 4 and 16.
GPU_CASES = [(16, 1, 8, None), (16, 4, 8, 3), (64, 1, 32, None), (256, 16, 8, 5), (64, 2, 8, 16)]


def _gpu_problem(page_size: int, seqlen_q: int, kv_heads: int) -> Problem:
    return Problem(
        4, 32, seqlen_q, 8192, 128, dtype=torch.bfloat16, causal=True, kv_heads=kv_heads,
        causal_alignment="bottom_right", has_cache_seqlens=True, return_lse=True, page_size=page_size,
    )  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=[f"page{p}-sq{q}-hkv{h}-splits{s}" for p, q, h, s in GPU_CASES])
def test_gpu_paged_decode_bf16(case: tuple[int, int, int, int | None]):
    page_size, seqlen_q, kv_heads, num_splits = case
    problem = _gpu_problem(page_size, seqlen_q, kv_heads)
    result = _check_paged(problem, num_splits, seed=page_size + seqlen_q, device="cuda")
    assert result.ok, f"{problem.describe()} splits={num_splits}: {result.summary()}"


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [16, 256])
def test_gpu_paged_output_equals_the_contiguous_output_bit_for_bit(page_size: int):
    _assert_paged_equals_contiguous(decode.prepare, _gpu_problem(page_size, 2, 8), seed=11)


def _assert_paged_equals_contiguous(prepare, problem: Problem, seed: int) -> None:
    """The rung prepared on page pools and on the same keys contiguous: the same splits, and O and
    the LSE equal bit for bit."""
    q, (k, v), (k_pages, v_pages, table), lengths = _paged_inputs(problem, seed=seed, device="cuda")
    paged = prepare(q, k_pages, v_pages, problem, cache_seqlens=lengths, block_table=table)
    dense = prepare(q, k, v, problem.with_(page_size=0), cache_seqlens=lengths)
    assert paged.num_splits == dense.num_splits
    (out_paged, lse_paged), (out_dense, lse_dense) = paged(), dense()
    assert torch.equal(out_paged, out_dense) and torch.equal(lse_paged, lse_dense)


@pytest.mark.gpu
def test_gpu_implementations_without_paging_refuse_it_naming_it():
    problem = _gpu_problem(16, 1, 8).with_(return_lse=False)
    device = torch.device("cuda")
    for impl in AVAILABLE:
        ok, reason = impl.check(problem, device)
        if impl.name in PAGED_RUNGS:
            assert ok, reason
        elif impl.name == "fa4/sm90":
            assert ok or reason, "fa4/sm90 refused without a reason"
        elif impl.name == "flashinfer/decode":
            # Reads a paged cache (its NHD layout is the pools as they are) wherever it runs at all.
            assert ok == impl.check(problem.with_(page_size=0), device)[0], f"{impl.name}: {reason!r}"
        else:
            assert not ok, f"{impl.name} claims to read a paged cache"
            # A rung that refuses this problem for another reason first refuses it unpaged too.
            contiguous_ok = impl.check(problem.with_(page_size=0), device)[0]
            assert "paged" in reason or not contiguous_ok, f"{impl.name}: {reason!r}"


@pytest.mark.gpu
def test_gpu_fa4_paged_against_fp64():
    """FA4's page_table path, where the installed FA4 takes it (its refusal otherwise)."""
    fa4 = {impl.name: impl for impl in AVAILABLE}["fa4/sm90"]
    problem = _gpu_problem(16, 1, 8).with_(return_lse=False)
    require_supported(fa4, problem, "cuda")
    result = check_implementation(fa4, problem, device="cuda", seed=3)
    assert result.ok, f"fa4/sm90 {problem.describe()}: {result.summary()}"
