"""triton/decode's ``PAGED_SPAN_CHUNKS`` (off): the span lookup of a page smaller than a key block reads the page's
table entry once per ``SPAN_CHUNK_KEYS`` keys (twice for a page of 32 in a 64-key block; ``_device.kv_block_rows``'
``SPAN_KEYS``), so that Triton 3.6 builds the fitted 16-row D=128 tile in pages of 32 in 157 registers a thread, three
CTAs an SM as the balanced plan counts, not 189 (two); issue #38's paged rows, helper `tpaged16` in docs/perf-log.md.

CPU: the switch off by default and where it engages (pages of more than 16 keys and fewer than a block, the fitted tile,
D=128; never where ``paged_spans`` stands down); triton/decode against fp64 under the interpreter with it on for pages
of 16, 32 and 48 over ragged lengths (a full, an empty and a mid-page sequence), GQA and MHA, two query tokens, on the
balanced kernel (the padded split kernel, which it leaves, once); bit for bit the switch off's output where it engages;
two planted chunk bugs that the check must fail; ``bench/triton_paged_chunks_ab.sh``'s rows. Static (sm_90a): the
chunked build of the sweep's shape in pages of 32 without spills in three CTAs' registers, more table reads in its key
loop, and the pages of 16 and 64 and contiguous builds unchanged instruction for instruction. GPU (``gpu``): against
fp64 on a poisoned output with the switch on (the sweep's shape in pages of 32, full; a ragged fp16 batch with an empty
sequence; two query tokens), and bit for bit the switch off's output.
"""

from __future__ import annotations

import json

import pytest
import torch
import triton
import triton.language as tl

from common.contract.problem import Problem
from common.toolchain.releases import triton_release
from tests._helpers import json_from_child
from tests.test_paged_kv import _check_paged, _paged_inputs, _paged_problem, _with_splits, interpreter_only
from triton_impl import _device, decode

CPU = torch.device("cpu")
# 128-thread CTAs of the fitted 16-row tile (4 warps), the registers an SM has, and CTAS_PER_SM_FIT at D=128.
THREADS, SM_REGISTERS, FITTED_CTAS = 128, 65536, decode.CTAS_PER_SM_FIT[128]


def _chunks_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The switch on, with the span lookup it refines on in whatever release runs the test."""
    monkeypatch.setattr(decode, "PAGED_SPAN_CHUNKS", True)
    monkeypatch.setattr(decode, "PAGED_SPAN_LOOKUP", True)
    monkeypatch.setattr(decode, "PAGED_SPAN_SPILLS", ())


def _sweep_shape(page_size: int, **changes) -> Problem:
    """``compare.py --decode``'s paged shape (B=8 H=32 Hkv=8 Sq=1 Sk=32768 D=128 bf16, bottom-right causal) in pages of
    ``page_size``."""
    fields = dict(
        batch=8, heads=32, seqlen_q=1, seqlen_k=32768, head_dim=128, dtype=torch.bfloat16, causal=True, kv_heads=8,
        causal_alignment="bottom_right", has_cache_seqlens=True, page_size=page_size,
    )  # fmt: skip
    return Problem(**{**fields, **changes})


def test_switch_is_off_by_default():
    assert decode.PAGED_SPAN_CHUNKS is False, "off until bench/triton_paged_chunks_ab.sh on an H200"
    assert decode.SPAN_CHUNK_KEYS == 16
    for page_size in (16, 32, 64, 256):
        assert decode.span_keys(_sweep_shape(page_size)) == 0


# name -> (problem, keys per table read with the switch on): pages between 16 keys and the 64-key block on the fitted
# tile at D=128 only.
ENGAGEMENT = {
    "sweep shape, pages of 32": (_sweep_shape(32), 16),
    "two query tokens": (_sweep_shape(32, seqlen_q=2), 16),
    "MHA": (_sweep_shape(32, heads=8), 16),
    "pages of 16 (one entry a page already)": (_sweep_shape(16), 0),
    "pages of 64 (one a block)": (_sweep_shape(64), 0),
    "pages of 48 (the per-key lookup)": (_sweep_shape(48, seqlen_k=32784), 0),
    "contiguous": (_sweep_shape(0, has_cache_seqlens=False), 0),
    "D=64": (_sweep_shape(32, head_dim=64), 0),
    "32 packed rows (two CTAs an SM anyway)": (_sweep_shape(32, heads=256), 0),
    "128 packed rows (the wide tile)": (_sweep_shape(32, heads=256, seqlen_q=4), 0),
}


@pytest.mark.parametrize("name", sorted(ENGAGEMENT))
def test_chunks_engage_on_the_fitted_d128_tile_in_pages_between_16_keys_and_a_block(
    name: str, monkeypatch: pytest.MonkeyPatch
):
    problem, keys = ENGAGEMENT[name]
    _chunks_on(monkeypatch)
    assert decode.span_keys(problem) == keys
    assert "SPAN_KEYS" not in decode._split_constexprs(problem, split=True), "the balanced kernel's only"
    assert decode.balanced_constexprs(problem, True)["SPAN_KEYS"] == keys


def test_chunks_stand_down_with_the_span_lookup(monkeypatch: pytest.MonkeyPatch):
    """Where ``paged_spans`` stands down (the switch off, or a release of ``PAGED_SPAN_SPILLS``) the per-key lookup
    has no spans to chunk."""
    _chunks_on(monkeypatch)
    problem = _sweep_shape(32)
    monkeypatch.setattr(decode, "PAGED_SPAN_SPILLS", (triton_release(),))
    assert decode.span_keys(problem) == 0
    monkeypatch.setattr(decode, "PAGED_SPAN_SPILLS", ())
    monkeypatch.setattr(decode, "PAGED_SPAN_LOOKUP", False)
    assert decode.span_keys(problem) == 0


# ----------------------------------------------------------------------------------------------------
# CPU: against fp64 under the interpreter with the switch on
# ----------------------------------------------------------------------------------------------------
# (page size, Sq, kv_heads of 8 heads, forced splits or shares, balanced kernel): D=128 takes 64-key blocks, so the
# balanced kernel reads a page of 32 in two chunks (engaged); pages of 16 and 48 (one entry a page; the per-key lookup)
# and the padded split kernel are not.
CASES = [
    (32, 1, 2, 3, True), (32, 2, 2, 4, True), (32, 1, 8, 2, True), (32, 1, 1, 16, True),
    (16, 1, 2, 3, True), (48, 1, 2, 3, True), (32, 1, 2, 3, False),
]  # fmt: skip


def _ids(case: tuple) -> str:
    page, sq, hkv, splits, balanced = case
    return f"page{page}-sq{sq}-hkv{hkv}-splits{splits}-{'balanced' if balanced else 'split'}"


def _d128(page_size: int, seqlen_q: int = 1, kv_heads: int = 2) -> Problem:
    return _paged_problem(page_size, seqlen_q, kv_heads, head_dim=128)


@interpreter_only
@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_chunked_lookup_against_fp64(case: tuple, monkeypatch: pytest.MonkeyPatch):
    page_size, seqlen_q, kv_heads, num_splits, balanced = case
    _chunks_on(monkeypatch)
    monkeypatch.setattr(decode, "BALANCED_SPLIT", "always" if balanced else "never")
    problem = _d128(page_size, seqlen_q, kv_heads)
    assert decode.span_keys(problem) == (decode.SPAN_CHUNK_KEYS if page_size == 32 else 0)
    assert decode.balanced_split(problem, CPU) is balanced
    assert balanced or "SPAN_KEYS" not in decode._split_constexprs(problem, split=True)
    result = _check_paged(problem, num_splits, seed=page_size + seqlen_q + kv_heads)
    assert result.ok, f"{problem.describe()} splits={num_splits}: {result.summary()}"


@interpreter_only
def test_chunked_lookup_equals_the_per_page_lookup_bit_for_bit(monkeypatch: pytest.MonkeyPatch):
    """The chunks change how a key's page is found, never which page or the arithmetic: the same O and LSE."""
    monkeypatch.setattr(decode, "PAGED_SPAN_LOOKUP", True)
    monkeypatch.setattr(decode, "PAGED_SPAN_SPILLS", ())
    monkeypatch.setattr(decode, "BALANCED_SPLIT", "always")
    problem = _d128(32, 2, 2)
    q, _, (k_pages, v_pages, table), lengths = _paged_inputs(problem, seed=3)
    outputs = []
    for switch in (False, True):
        monkeypatch.setattr(decode, "PAGED_SPAN_CHUNKS", switch)
        assert decode.span_keys(problem) == (decode.SPAN_CHUNK_KEYS if switch else 0)
        run = _with_splits(3).prepare(q, k_pages, v_pages, problem, cache_seqlens=lengths, block_table=table)
        outputs.append(run())
    (out_off, lse_off), (out_on, lse_on) = outputs
    assert torch.equal(out_off, out_on) and torch.equal(lse_off, lse_on)


# ----------------------------------------------------------------------------------------------------
# Planted bugs in the chunked lookup
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _entry_per_chunk(
    n_start, offs_n, block_table_row, seqlen_k, stride_kpage, stride_kn, stride_vpage, stride_vn,
    PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, SPAN_KEYS: tl.constexpr = 0,
):  # fmt: skip
    """Chunk j of a block reads the block's entry j, as if each chunk were a page: the wrong page from the second
    chunk on (only the 16-key reads are planted; SPAN_KEYS is 16 in every engaged build)."""
    span = offs_n // SPAN_KEYS
    pages = tl.zeros([BLOCK_N], dtype=tl.int32)
    for j in tl.static_range(BLOCK_N // SPAN_KEYS):
        if MASKED:
            page = tl.load(block_table_row + n_start // PAGE_SIZE + j, mask=n_start + j * SPAN_KEYS < seqlen_k, other=0)
        else:
            page = tl.load(block_table_row + n_start // PAGE_SIZE + j)
        pages = tl.where(span == j, page, pages)
    pages = pages.to(tl.int64)
    slot = offs_n % PAGE_SIZE
    return pages * stride_kpage + slot * stride_kn, pages * stride_vpage + slot * stride_vn


@triton.jit
def _slot_within_the_chunk(
    n_start, offs_n, block_table_row, seqlen_k, stride_kpage, stride_kn, stride_vpage, stride_vn,
    PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, SPAN_KEYS: tl.constexpr = 0,
):  # fmt: skip
    """The right page, but the slot counted from the chunk's first key: a page's second chunk reads its first."""
    span = offs_n // SPAN_KEYS
    pages = tl.zeros([BLOCK_N], dtype=tl.int32)
    for j in tl.static_range(BLOCK_N // SPAN_KEYS):
        first_key = n_start + j * SPAN_KEYS
        if MASKED:
            page = tl.load(block_table_row + first_key // PAGE_SIZE, mask=first_key < seqlen_k, other=0)
        else:
            page = tl.load(block_table_row + first_key // PAGE_SIZE)
        pages = tl.where(span == j, page, pages)
    pages = pages.to(tl.int64)
    slot = offs_n % SPAN_KEYS
    return pages * stride_kpage + slot * stride_kn, pages * stride_vpage + slot * stride_vn


PLANTED = {
    "each chunk read as a page of its own": _entry_per_chunk,
    "the slot counted in the chunk": _slot_within_the_chunk,
}


@interpreter_only
@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_chunk_bug_fails_the_check(bug: str, monkeypatch: pytest.MonkeyPatch):
    _chunks_on(monkeypatch)
    monkeypatch.setattr(decode, "BALANCED_SPLIT", "always")
    # Unplanted, the same problem, shares and seed pass: test_chunked_lookup_against_fp64[page32-sq1-hkv2-splits3-
    # balanced].
    problem = _d128(32, 1, 2)
    assert decode.span_keys(problem) == decode.SPAN_CHUNK_KEYS
    monkeypatch.setattr(_device, "kv_block_rows", PLANTED[bug])
    result = _check_paged(problem, 3, seed=32 + 1 + 2)
    assert not result.ok, f"{bug}: the check passed a wrong kernel ({result.summary()})"


# ----------------------------------------------------------------------------------------------------
# The A/B script's rows
# ----------------------------------------------------------------------------------------------------
def test_ab_script_rows_parse_and_engage_where_it_says(monkeypatch: pytest.MonkeyPatch):
    """bench/triton_paged_chunks_ab.sh's rows: each parses (a typo would cost a device call), the first is the
    sweep's shape in pages of 32 at full lengths, and the switch engages on the pages-of-32 rows only (the rest are
    controls)."""
    import shlex
    from pathlib import Path

    from bench.decode_knob_ab import parse_row

    script = (Path(__file__).parents[1] / "bench" / "triton_paged_chunks_ab.sh").read_text()
    shape = script.split("\nSHAPE=", 1)[1].split("\n", 1)[0]
    knob_line = script.split("\nknob_ab chunks ", 1)[1].split("\nknob_ab ", 1)[0]
    words = shlex.split(knob_line.replace("\\\n", " ").replace("$SHAPE", shape))
    assert words[:4] == ["90", "triton_impl.decode:PAGED_SPAN_CHUNKS", "False,True", "triton/decode"], words
    rows = {text: parse_row(text)[1] for text in words[4:]}
    first = rows[words[4]]
    assert (first.problem, first.lengths) == (_sweep_shape(32), (32768,) * 8)
    _chunks_on(monkeypatch)
    engaged = {text: decode.span_keys(case.problem) > 0 for text, case in rows.items()}
    assert engaged == {text: "page_size=32" in text or text in ("43/7", "59/6") for text in rows}, engaged


# ----------------------------------------------------------------------------------------------------
# sm_90a: three CTAs' registers, no spill, the other builds unchanged
# ----------------------------------------------------------------------------------------------------
_SCRIPT = r"""
import hashlib, json, sys
import torch
from common.contract.problem import Problem
from common.reporting.static import cubin_resources, cubin_sass, sass_loops
from tests._helpers import triton_balanced_sm90
from triton_impl import decode

def key_loop(sass):
    # The first loop holding an exp2 and an MMA: the unmasked key-block loop.
    loops = [(start, body) for start, body in sass_loops(sass)
             if any(op.startswith("MUFU.EX2") for op in body) and any(op.startswith("HMMA") for op in body)]
    return min(loops)[1]

decode.PAGED_SPAN_LOOKUP, decode.PAGED_SPAN_SPILLS = True, ()
results = []
for page_size, chunks in json.loads(sys.argv[1]):
    decode.PAGED_SPAN_CHUNKS = chunks
    problem = Problem(8, 32, 1, 32768, 128, dtype=torch.bfloat16, causal=True, kv_heads=8,
                      causal_alignment="bottom_right", has_cache_seqlens=True, page_size=page_size)
    binary = triton_balanced_sm90(problem)
    (usage,) = cubin_resources(binary.cubin).values()
    sass = cubin_sass(binary.cubin)
    body = key_loop(sass)
    results.append({"registers": usage["registers"], "spill_bytes": usage["local_bytes"] + usage["stack_bytes"],
                    "table_reads": sum(op.startswith("LDGSTS.E") and ".128" not in op for op in body),
                    "instructions": len(body), "sass": hashlib.sha256(sass.encode()).hexdigest()})
print(json.dumps(results))
"""


@pytest.mark.static
def test_chunked_build_fits_three_ctas_an_sm_and_leaves_the_others():
    """The balanced kernel of the sweep's shape (sm_90a, this release): in pages of 32 with the switch on, no spill, a
    register count three 128-thread CTAs fit (under Triton 3.6, 157 against 189), four table reads a block in the
    key loop against two; pages of 16 and 64 and the contiguous cache compile the same SASS either way."""
    if triton_release() in decode.PAGED_SPAN_SPILLS:
        pytest.skip(f"the span lookup, hence its chunks, stands down under Triton {triton.__version__}")
    keys = [[page, chunks] for page in (32, 16, 64, 0) for chunks in (False, True)]
    compiled = dict(zip(map(tuple, keys), json_from_child(["-c", _SCRIPT, json.dumps(keys)], timeout=900), strict=True))
    on, off = compiled[32, True], compiled[32, False]
    assert on["spill_bytes"] == off["spill_bytes"] == 0, (off, on)
    allocated = -(-on["registers"] // 8) * 8
    assert SM_REGISTERS // (allocated * THREADS) >= FITTED_CTAS, on
    assert (off["table_reads"], on["table_reads"]) == (2, 4), (off, on)
    if triton_release() == "3.6":
        assert on["registers"] < off["registers"], (off, on)
    for page in (16, 64, 0):
        assert compiled[page, True]["sass"] == compiled[page, False]["sass"], f"the switch changed pages of {page}"


# ----------------------------------------------------------------------------------------------------
# GPU: against fp64 with the switch on, and bit for bit the switch off's output
# ----------------------------------------------------------------------------------------------------
# name -> (problem, lengths): the sweep's shape in pages of 32 at full lengths (the A/B's row), a ragged fp16 batch with
# an empty sequence and one ending inside a page, two query tokens.
GPU_CASES = {
    "sweep-page32-full": (_sweep_shape(32), (32768,) * 8),
    "fp16-ragged-empty": (
        _sweep_shape(32, seqlen_k=16384, dtype=torch.float16),
        (16384, 0, 1, 9000, 127, 12289, 64, 3000),
    ),
    "sq2-ragged": (_sweep_shape(32, seqlen_k=16384, seqlen_q=2), (2, 16384, 777, 10001, 5000, 129, 15999, 63)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gpu_chunked_lookup_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from tests.test_decode_wide import check_on_gpu

    problem, lengths = GPU_CASES[case]
    _chunks_on(monkeypatch)
    assert decode.span_keys(problem) == decode.SPAN_CHUNK_KEYS
    assert decode.balanced_split(problem, torch.device("cuda")), "the chunks are the balanced kernel's"
    result = check_on_gpu("triton/decode", problem, lengths, seed=len(case))
    assert result.ok, f"triton/decode PAGED_SPAN_CHUNKS {problem.describe()}: {result.summary()}"


@pytest.mark.gpu
def test_gpu_chunked_lookup_equals_the_per_page_lookup_bit_for_bit(monkeypatch: pytest.MonkeyPatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from common.contract.inputs import make_inputs, make_paged_kv

    problem, lengths = GPU_CASES["sq2-ragged"]
    problem = problem.with_(return_lse=True)
    assert decode.balanced_split(problem, torch.device("cuda")), "the chunks are the balanced kernel's"
    monkeypatch.setattr(decode, "PAGED_SPAN_LOOKUP", True)
    monkeypatch.setattr(decode, "PAGED_SPAN_SPILLS", ())
    q, k, v = make_inputs(problem, seed=5, device="cuda", offset=0.5)
    k_pages, v_pages, table = make_paged_kv(problem, k, v, seed=5)
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    outputs = []
    for switch in (False, True):
        monkeypatch.setattr(decode, "PAGED_SPAN_CHUNKS", switch)
        run = decode.prepare(q, k_pages, v_pages, problem, cache_seqlens=cache_seqlens, block_table=table)
        outputs.append([t.clone() for t in run()])
    (out_off, lse_off), (out_on, lse_on) = outputs
    assert torch.equal(out_off, out_on) and torch.equal(lse_off, lse_on)
