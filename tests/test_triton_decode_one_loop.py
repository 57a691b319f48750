"""triton/decode's ``ONE_KEY_LOOP`` (on since 2026-12-04, ``results/h200/triton-decode-one-loop/``): a split's keys
in one pipelined loop, S masked from the first block some row may not see (``_device.attend_key_range(...,
ONE_LOOP=True)``), not an unmasked loop and a masked one, each its own software pipeline in Triton.

CPU: on by default at D=64 and 128 (but under a release of ``ONE_KEY_LOOP_SPILLS``), read into both kernels'
constexprs. Under the interpreter, against fp64 on a poisoned output, with the switch on and off: a paged ragged batch
(an empty sequence, one ending mid-block, one on a block boundary; causal bottom-right over 4 tokens, so the diagonal
and the tail fall in the split's last blocks), 128 packed rows on a full cache (top-left: the diagonal in the first
block), the balanced split over a ragged batch; a planted loop that masks S from past the range's end (never) fails the
same check. Static
(sm_90a): the split and balanced kernels of seed 151 row 1's kind have one key loop (a SASS loop holding the MMAs)
with the switch and two without, and no spill either way (under any release: the spills of ``ONE_KEY_LOOP_SPILLS`` are
on other tiles). GPU: the default runs in every decode GPU test; ``bench/triton_decode_one_loop_ab.sh`` checked both
values against fp64 on the 24 rows it timed.
"""

from __future__ import annotations

import json

import pytest
import torch
import triton
import triton.language as tl

from common.contract.problem import Problem
from tests._helpers import json_from_child
from tests.test_decode import interpreter_only
from tests.test_decode_packed import _interpreter_check
from triton_impl import _device, decode

# The loop the planted one calls (``_device.attend_key_blocks`` as committed).
ATTEND_KEY_BLOCKS = _device.attend_key_blocks


def _problem(batch: int, heads: int, seqlen_q: int, seqlen_k: int, **changes) -> Problem:
    fields = dict(
        dtype=torch.float32, causal=True, kv_heads=changes.pop("kv_heads", 1),
        causal_alignment=changes.pop("causal_alignment", "bottom_right"), return_lse=True,
    )  # fmt: skip
    return Problem(batch, heads, seqlen_q, seqlen_k, 64, **{**fields, **changes})


# name: (problem, cache lengths or None)
CASES = {
    "paged-ragged": (_problem(3, 8, 4, 128, kv_heads=2, has_cache_seqlens=True, page_size=16), (0, 105, 64)),
    "wide-full": (_problem(1, 8, 16, 77, causal_alignment="top_left"), None),
    "balanced-ragged": (_problem(3, 8, 1, 1024, has_cache_seqlens=True), (1, 1000, 517)),
}


def test_on_by_default_in_both_kernels_but_where_it_spills(monkeypatch: pytest.MonkeyPatch):
    assert decode.ONE_KEY_LOOP is True, "taken: results/h200/triton-decode-one-loop/"
    assert decode.ONE_KEY_LOOP_SPILLS == ("3.7", "3.8") and decode.ONE_KEY_LOOP_HEAD_DIMS == (64, 128)
    d256 = CASES["balanced-ragged"][0].with_(head_dim=256)
    for switch, release, expected in ((True, "3.6", True), (True, "3.8", False), (False, "3.6", False)):
        monkeypatch.setattr(decode, "ONE_KEY_LOOP", switch)
        monkeypatch.setattr(decode, "triton_release", lambda release=release: release)
        assert decode._split_constexprs(CASES["wide-full"][0], split=True)["ONE_KEY_LOOP"] is expected
        assert decode.balanced_constexprs(CASES["balanced-ragged"][0], True)["ONE_KEY_LOOP"] is expected
        assert decode.balanced_constexprs(d256, True)["ONE_KEY_LOOP"] is False


@interpreter_only
@pytest.mark.parametrize("one_loop", [True, False], ids=["one-loop", "two-loops"])
@pytest.mark.parametrize("name", list(CASES))
def test_against_fp64(name: str, one_loop: bool, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(decode, "ONE_KEY_LOOP", one_loop)
    monkeypatch.setattr(decode, "ONE_KEY_LOOP_SPILLS", ())
    problem, lengths = CASES[name]
    result = _interpreter_check(problem, lengths)
    assert result.ok, f"{name} one_loop={one_loop}: {result.summary()}"


@triton.jit
def _never_masked(
    acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_vn,
    offs_m, key_begin, unmasked_end, key_end, seqlen_k, causal_offset, softmax_scale_log2,
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    block_table_row=None, stride_kpage=0, stride_vpage=0, PAGE_SIZE: tl.constexpr = 0,
    PAGE_SPANS: tl.constexpr = False, ONE_LOOP: tl.constexpr = False,
):  # fmt: skip
    """Planted: the one loop masks S from past the range's end, so never: the tail's zeroed keys and the keys past
    each row's diagonal get weight."""
    return ATTEND_KEY_BLOCKS(
        acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_vn,
        offs_m, key_begin, key_end, seqlen_k, causal_offset, softmax_scale_log2,
        CAUSAL=CAUSAL, MASKED=True, HEAD_DIM=HEAD_DIM, BLOCK_N=BLOCK_N,
        block_table_row=block_table_row, stride_kpage=stride_kpage, stride_vpage=stride_vpage,
        PAGE_SIZE=PAGE_SIZE, PAGE_SPANS=PAGE_SPANS, mask_from=key_end + BLOCK_N, MASK_FROM=True,
    )  # fmt: skip


@interpreter_only
@pytest.mark.parametrize("name", ["paged-ragged", "wide-full"])
def test_planted_unmasked_loop_fails_the_check(name: str, monkeypatch: pytest.MonkeyPatch):
    problem, lengths = CASES[name]
    assert _interpreter_check(problem, lengths).ok, "the unplanted kernel must pass"
    monkeypatch.setattr(decode, "attend_key_range", _never_masked)
    result = _interpreter_check(problem, lengths)
    assert not result.ok, f"{name}: the planted loop passed: {result.summary()}"


# ----------------------------------------------------------------------------------------------------
# sm_90a: one key loop with the switch, two without; no spill
# ----------------------------------------------------------------------------------------------------
_COMPILE_SCRIPT = r"""
import json, sys
import torch
from common.contract.problem import Problem
from common.reporting.static import cubin_resources, cubin_sass, sass_loops
from tests._helpers import triton_balanced_sm90
from triton_impl import decode

results = []
decode.ONE_KEY_LOOP_SPILLS = ()
for one_loop, kind in json.loads(sys.argv[1]):
    decode.ONE_KEY_LOOP = one_loop
    # seed 151 row 1's kind (80 packed rows, D=64, pages of 128, ragged) and seed 31 row 6's (the balanced split).
    problem = Problem(64, 160, 16, 3328, 64, dtype=torch.bfloat16, causal=True, kv_heads=32,
                      causal_alignment="bottom_right", has_cache_seqlens=True, return_lse=True, page_size=128)
    binary = decode.compile_sm90(problem)[0] if kind == "split" else triton_balanced_sm90(problem)
    (resources,) = cubin_resources(binary.cubin).values()
    mma_loops = [body for _, body in sass_loops(cubin_sass(binary.cubin)) if any("MMA" in op for op in body)]
    results.append({"mma_loops": len(mma_loops), "spill": resources["stack_bytes"] + resources["local_bytes"]})
print(json.dumps(results))
"""


@pytest.mark.static
def test_one_key_loop_in_both_kernels_without_spills():
    keys = [[one_loop, kind] for kind in ("split", "balanced") for one_loop in (True, False)]
    compiled = json_from_child(["-c", _COMPILE_SCRIPT, json.dumps(keys)], timeout=900)
    for (one_loop, kind), facts in zip(keys, compiled, strict=True):
        where = f"{kind} one_loop={one_loop}: {facts}"
        assert facts["mma_loops"] == (1 if one_loop else 2), where
        assert facts["spill"] == 0, where
