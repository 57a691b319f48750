"""triton/decode's ``PAGED_SPAN_LOOKUP`` (issue #38's paged rows): one block-table entry per page a key block spans
(``_device.kv_block_rows``) instead of one per key (``kv_page_slots``). The switch is on by default (since its H200 A/B,
results/h200/decode-paged-spans/) and engages only where the key block and the page size divide one another; off, the
per-key lookup against fp64 (the path of any other page size, e.g. 48: tests/test_paged_kv.py); on, triton/decode
against fp64 under the interpreter for pages of 16, 32 (several pages a block), 64 (one) and 256 (several blocks a page)
over ragged lengths (a full, an empty and a mid-page sequence), on both split kernels and at two key-block sizes; and
planted bugs in the span lookup that the check must fail.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from common.contract.problem import Problem
from common.toolchain.releases import triton_release
from tests.test_paged_kv import _check_paged, _paged_problem, interpreter_only
from triton_impl import _device, decode


def _spans_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The switch on in whatever release runs the test (``PAGED_SPAN_SPILLS`` stands it down where its builds spill)."""
    monkeypatch.setattr(decode, "PAGED_SPAN_LOOKUP", True)
    monkeypatch.setattr(decode, "PAGED_SPAN_SPILLS", ())


def test_the_span_lookup_is_on_by_default_and_off_takes_the_per_key_lookup(monkeypatch: pytest.MonkeyPatch):
    assert decode.PAGED_SPAN_LOOKUP is True, "taken after its H200 A/B (results/h200/decode-paged-spans/)"
    on = triton_release() not in decode.PAGED_SPAN_SPILLS
    for page_size in (16, 32, 64, 256):
        assert decode.paged_spans(_paged_problem(page_size)) is on
    assert not decode.paged_spans(_paged_problem(48))
    monkeypatch.setattr(decode, "PAGED_SPAN_LOOKUP", False)
    for page_size in (16, 32, 64, 256):
        assert not decode.paged_spans(_paged_problem(page_size))


@pytest.mark.parametrize(
    ("page_size", "head_dim", "spans"),
    [(16, 64, True), (32, 64, True), (64, 64, True), (256, 64, True), (48, 64, False), (16, 256, True),
     (48, 256, False), (0, 64, False)],
)  # fmt: skip
def test_the_span_lookup_engages_where_block_and_page_divide(
    page_size: int, head_dim: int, spans: bool, monkeypatch: pytest.MonkeyPatch
):
    _spans_on(monkeypatch)
    problem = _paged_problem(page_size or 16, head_dim=head_dim)
    if page_size == 0:
        problem = problem.with_(page_size=0)
    assert decode.paged_spans(problem) is spans
    assert decode._split_constexprs(problem, split=True)["PAGE_SPANS"] is spans


# (page size, Sq, kv_heads of 8 heads, head dim, forced splits, balanced kernel): D=64 takes 64-key blocks, so
# pages of 16 and 32 are 4 and 2 pages a block, 64 one, 256 four blocks a page; D=256 takes 32-key blocks.
CASES = [
    (16, 1, 2, 64, 3, False), (32, 4, 2, 64, 3, False), (64, 1, 1, 64, 16, False), (256, 1, 2, 64, 3, False),
    (256, 3, 2, 64, 5, False),
    (16, 2, 2, 64, 3, True), (32, 1, 8, 64, 4, True), (256, 1, 2, 64, 2, True),
    (16, 1, 2, 256, 3, False), (64, 2, 1, 256, 3, True),
]  # fmt: skip


def _ids(case: tuple) -> str:
    page, sq, hkv, d, splits, balanced = case
    return f"page{page}-sq{sq}-hkv{hkv}-d{d}-splits{splits}-{'balanced' if balanced else 'split'}"


def _span_problem(page_size: int, seqlen_q: int, kv_heads: int, head_dim: int) -> Problem:
    return _paged_problem(page_size, seqlen_q, kv_heads, head_dim=head_dim)


@interpreter_only
@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_span_lookup_against_fp64(case: tuple, monkeypatch: pytest.MonkeyPatch):
    page_size, seqlen_q, kv_heads, head_dim, num_splits, balanced = case
    _spans_on(monkeypatch)
    monkeypatch.setattr(decode, "BALANCED_SPLIT", "always" if balanced else "never")
    problem = _span_problem(page_size, seqlen_q, kv_heads, head_dim)
    assert decode.paged_spans(problem)
    assert decode.balanced_split(problem, torch.device("cpu")) is balanced
    result = _check_paged(problem, num_splits, seed=page_size + seqlen_q + head_dim)
    assert result.ok, f"{problem.describe()} splits={num_splits}: {result.summary()}"


@interpreter_only
@pytest.mark.parametrize("case", [CASES[0], CASES[3], CASES[6], CASES[9]], ids=_ids)
def test_per_key_lookup_against_fp64_with_the_switch_off(case: tuple, monkeypatch: pytest.MonkeyPatch):
    """The lookup per key (the switch off) on the same problems: pages of 16 and 256, balanced at D=64 and D=256."""
    page_size, seqlen_q, kv_heads, head_dim, num_splits, balanced = case
    monkeypatch.setattr(decode, "PAGED_SPAN_LOOKUP", False)
    monkeypatch.setattr(decode, "BALANCED_SPLIT", "always" if balanced else "never")
    problem = _span_problem(page_size, seqlen_q, kv_heads, head_dim)
    assert not decode.paged_spans(problem)
    result = _check_paged(problem, num_splits, seed=page_size + seqlen_q + head_dim)
    assert result.ok, f"{problem.describe()} splits={num_splits}: {result.summary()}"


@interpreter_only
def test_span_lookup_fp16_without_a_causal_mask(monkeypatch: pytest.MonkeyPatch):
    _spans_on(monkeypatch)
    problem = _paged_problem(32, 4, 2, dtype=torch.float16, causal=False, causal_alignment="top_left")
    assert decode.paged_spans(problem)
    result = _check_paged(problem, 3, seed=5)
    assert result.ok, f"{problem.describe()}: {result.summary()}"


# ----------------------------------------------------------------------------------------------------
# Planted bugs in the span lookup
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _first_page_for_the_block(
    n_start, offs_n, block_table_row, seqlen_k, stride_kpage, stride_kn, stride_vpage, stride_vn,
    PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """Every key of a block in the block's first page: the slot taken from the wrong page past the first."""
    page = tl.load(block_table_row + n_start // PAGE_SIZE).to(tl.int64)
    slot = offs_n % PAGE_SIZE
    return page * stride_kpage + slot * stride_kn, page * stride_vpage + slot * stride_vn


@triton.jit
def _slot_without_the_block_offset(
    n_start, offs_n, block_table_row, seqlen_k, stride_kpage, stride_kn, stride_vpage, stride_vn,
    PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """The right page, but every block of it read from the page's first slot."""
    page = tl.load(block_table_row + n_start // PAGE_SIZE).to(tl.int64)
    slot = offs_n
    return page * stride_kpage + slot * stride_kn, page * stride_vpage + slot * stride_vn


# (planted function, page size): a page of 16 is a quarter of a 64-key block; one of 256 holds four blocks.
PLANTED = {
    "one page for a block spanning four": (_first_page_for_the_block, 16),
    "slot without the block's offset in its page": (_slot_without_the_block_offset, 256),
}


@interpreter_only
@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_span_bug_fails_the_check(bug: str, monkeypatch: pytest.MonkeyPatch):
    planted, page_size = PLANTED[bug]
    _spans_on(monkeypatch)
    monkeypatch.setattr(decode, "BALANCED_SPLIT", "never")
    # Unplanted, the same problem, splits and seed pass: test_span_lookup_against_fp64[page{16,256}-sq1-hkv2-d64-...].
    problem = _span_problem(page_size, 1, 2, 64)
    monkeypatch.setattr(_device, "kv_block_rows", planted)
    result = _check_paged(problem, 3, seed=page_size + 1 + 64)
    assert not result.ok, f"{bug}: the check passed a wrong kernel ({result.summary()})"


# ----------------------------------------------------------------------------------------------------
# sm_90a: the balanced kernel's unmasked key loop with the switch off and on
# ----------------------------------------------------------------------------------------------------
_LOOP_PROBE = r"""
import json, sys
import torch
from common.contract.problem import Problem
from common.reporting.static import cubin_resources, cubin_sass, sass_loops
from tests._helpers import triton_balanced_sm90
from triton_impl import decode

def first_key_loop(cubin):
    # The first loop holding an exp2 and an MMA: the unmasked key-block loop.
    loops = [(start, body) for start, body in sass_loops(cubin_sass(cubin))
             if any(op.startswith("MUFU.EX2") for op in body) and any(op.startswith(("HMMA", "HGMMA")) for op in body)]
    start, body = min(loops)
    return {"instructions": len(body), "LDS": body.count("LDS"), "IMAD.WIDE.U32": body.count("IMAD.WIDE.U32")}

rows = {}
for head_dim, page_size, batch, heads, kv_heads, seqlen_q in json.loads(sys.argv[1]):
    problem = Problem(batch, heads, seqlen_q, 65536, head_dim, causal=True, kv_heads=kv_heads,
                      causal_alignment="bottom_right", has_cache_seqlens=True, page_size=page_size)
    decode.PAGED_SPAN_SPILLS = ()
    for switch in (False, True):
        decode.PAGED_SPAN_LOOKUP = switch
        binary = triton_balanced_sm90(problem)
        (usage,) = cubin_resources(binary.cubin).values()
        rows[f"D={head_dim} page={page_size} {switch}"] = {
            **first_key_loop(binary.cubin), "local_bytes": usage["local_bytes"], "registers": usage["registers"]
        }
print(json.dumps(rows))
"""
# (D, page size, B, H, Hkv, Sq): seed 71 row 3's D=64 tile in pages of 32 (two a block) and seed 73 row 4's D=256 wgmma
# tile in pages of 32 (one a block), the mma.sync and wgmma loops. (D=128 in pages of 128 and D=256's 32-key tile in
# pages of 64 showed the same, 487 -> 343 and 497 -> 349 instructions under 3.8: two compiles each in every CI leg,
# left out for CI's time.)
LOOP_BUILDS = [(64, 32, 2, 16, 16, 1), (256, 32, 32, 32, 8, 8)]


def test_the_span_lookup_shortens_the_key_loop_without_spilling():
    import json

    from tests._helpers import json_from_child

    if triton_release() in decode.PAGED_SPAN_SPILLS:
        pytest.skip(
            f"the span lookup stands down under Triton {triton.__version__} (PAGED_SPAN_SPILLS; "
            "test_span_builds_spill_only_in_the_releases_that_keep_them_off holds why)"
        )
    rows = json_from_child(["-c", _LOOP_PROBE, json.dumps(LOOP_BUILDS)], timeout=1200)
    for head_dim, page_size, *_ in LOOP_BUILDS:
        off, on = rows[f"D={head_dim} page={page_size} False"], rows[f"D={head_dim} page={page_size} True"]
        assert on["local_bytes"] == off["local_bytes"] == 0, (head_dim, page_size, off, on)
        # Each key's page read back from shared memory and widened to a 64-bit offset: far fewer with the span.
        assert on["LDS"] < off["LDS"] and on["IMAD.WIDE.U32"] < off["IMAD.WIDE.U32"], (head_dim, page_size, off, on)
        assert on["instructions"] < off["instructions"], (head_dim, page_size, off, on)


_SPILL_PROBE = r"""
import json
import torch
from common.contract.problem import Problem
from common.reporting.static import cubin_resources
from triton_impl import decode

decode.PAGED_SPAN_LOOKUP, decode.PAGED_SPAN_SPILLS = True, ()
problem = Problem(8, 32, 1, 32768, 64, kv_heads=8, causal=True, causal_alignment="bottom_right", has_cache_seqlens=True,
                  page_size=256)
usage = next(iter(cubin_resources(decode.compile_sm90(problem)[0].cubin).values()))
print(json.dumps(usage["stack_bytes"] + usage["local_bytes"]))
"""


@pytest.mark.static
def test_span_builds_spill_only_in_the_releases_that_keep_them_off():
    """The D=64 split kernel in pages of 256 with the span lookup forced on (tests/test_paged_kv.py's paged build):
    no spill, except in a release of ``PAGED_SPAN_SPILLS`` (Triton 3.7.1: 8 bytes), which must still spill, so that a
    release that stops shows."""
    from tests._helpers import json_from_child

    spilled = json_from_child(["-c", _SPILL_PROBE], timeout=1200)
    assert (spilled > 0) == (triton_release() in decode.PAGED_SPAN_SPILLS), (triton.__version__, spilled)
