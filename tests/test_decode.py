"""triton/decode (flash decoding): split-KV against the fp64 reference under the interpreter, the split
rule, and planted bugs (a dropped split, a log2-unit merge, a split reading past its length) that the
check must fail."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
import triton
import triton.language as tl

from common.contract import splits
from common.contract.check import check_on_inputs
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from common.contract.registry import Implementation
from triton_impl import decode
from triton_impl._device import split_key_range

CPU = torch.device("cpu")
interpreter_only = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter tests run on CPU-only machines")
# A padded cache of 300 keys: ragged lengths with a full sequence, an empty one, and one ending mid-block.
SEQLEN_K = 300
LENGTHS = (SEQLEN_K, 0, 131)


def _with_splits(num_splits: int) -> Implementation:
    """triton/decode with the split count forced (the bind/prepare keyword the public API lacks)."""
    prepare = functools.partial(decode.decode_attention, num_splits=num_splits)
    return dataclasses.replace(decode.IMPLEMENTATION, prepare=prepare)


def _check(problem: Problem, num_splits: int, *, seed: int = 0, offset: float = 0.5):
    q, k, v = make_inputs(problem, seed=seed, device="cpu", offset=offset)
    lengths = torch.tensor(LENGTHS[: problem.batch], dtype=torch.int32) if problem.has_cache_seqlens else None
    return check_on_inputs(_with_splits(num_splits), q, k, v, problem, cache_seqlens=lengths)


def _decode_problem(seqlen_q: int = 1, kv_heads: int = 2, *, heads: int = 8, **changes) -> Problem:
    fields = dict(
        batch=3, heads=heads, seqlen_q=seqlen_q, seqlen_k=SEQLEN_K, head_dim=64, dtype=torch.float32, causal=True,
        kv_heads=kv_heads, causal_alignment="bottom_right", has_cache_seqlens=True, return_lse=True,
    )  # fmt: skip
    return Problem(**{**fields, **changes})


# ----------------------------------------------------------------------------------------------------
# Against fp64: splits, GQA packing, Sq up to 16, ragged lengths, the LSE
# ----------------------------------------------------------------------------------------------------
# (Sq, kv_heads of 8 heads (4 at Sq = 16, to keep the interpreter fast), forced splits): group 1, 4 and
# 8 (MQA), one token to 16, one split, three and many (more splits than a short sequence has key
# blocks: empty splits); 16 tokens of MQA fill a 64-row M tile.
CASES = [(1, 8, 1), (1, 2, 3), (1, 1, 16), (5, 2, 3), (16, 1, 3), (16, 4, 5)]


@interpreter_only
@pytest.mark.parametrize("case", CASES, ids=[f"sq{q}-hkv{h}-splits{s}" for q, h, s in CASES])
def test_ragged_cache_against_fp64(case: tuple[int, int, int]):
    seqlen_q, kv_heads, num_splits = case
    problem = _decode_problem(seqlen_q, kv_heads, heads=8 if seqlen_q < 16 else 4)
    result = _check(problem, num_splits, seed=seqlen_q + kv_heads)
    assert result.ok, f"{problem.describe()} splits={num_splits}: {result.summary()}"


@interpreter_only
@pytest.mark.parametrize("causal_alignment", ["top_left", "bottom_right", None])
def test_padded_cache_alignments_fp16(causal_alignment: str | None):
    """No cache lengths: the padded Sk for every sequence, fp16, each mask; zero-mean V."""
    problem = _decode_problem(
        4, 2, batch=2, dtype=torch.float16, has_cache_seqlens=False, causal=causal_alignment is not None,
        causal_alignment=causal_alignment or "top_left",
    )  # fmt: skip
    result = _check(problem, 3, offset=0.0)
    assert result.ok, f"{problem.describe()}: {result.summary()}"


@interpreter_only
def test_one_split_writes_o_and_lse_directly_and_many_splits_agree():
    problem = _decode_problem(2, 2)
    q, k, v = make_inputs(problem, seed=3, device="cpu")
    lengths = torch.tensor(LENGTHS, dtype=torch.int32)
    one = decode.decode_attention(q, k, v, problem, cache_seqlens=lengths, num_splits=1)
    many = decode.decode_attention(q, k, v, problem, cache_seqlens=lengths, num_splits=7)
    assert (one.num_splits, many.num_splits) == (1, 7)
    (out_one, lse_one), (out_many, lse_many) = one(), many()
    torch.testing.assert_close(out_many, out_one, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse_many, lse_one, atol=1e-5, rtol=1e-5)
    # The empty sequence: O = 0 and LSE = -inf however many splits.
    assert torch.equal(out_many[1], torch.zeros_like(out_many[1])) and torch.isneginf(lse_many[1]).all()


def test_prefill_sized_problem_is_refused():
    ok, reason = decode.supports(Problem(1, 8, 17, 300, 64, dtype=torch.float16), CPU)
    assert not ok and "use a prefill rung" in reason
    ok, reason = decode.supports(Problem(1, 8, 1, 300, 96, dtype=torch.float16), CPU)
    assert not ok and "head_dim" in reason


# ----------------------------------------------------------------------------------------------------
# The split rule
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ctas_per_split", [1, 8, 32, 64, 256, 2048])
@pytest.mark.parametrize("seqlen_k", [4096, 32768, 131072])
def test_split_rule_fills_the_waves(ctas_per_split: int, seqlen_k: int):
    sms = 132
    chosen = splits.choose_num_splits(ctas_per_split, seqlen_k, sms)
    assert 1 <= chosen <= splits.MAX_SPLITS and (chosen == 1 or seqlen_k // chosen >= splits.MIN_KEYS_PER_SPLIT)
    allowed = range(1, min(splits.MAX_SPLITS, seqlen_k // splits.MIN_KEYS_PER_SPLIT) + 1)
    best = max(splits.wave_efficiency(ctas_per_split * s, sms) for s in allowed)
    assert splits.wave_efficiency(ctas_per_split * chosen, sms) >= best * (1 - splits.WAVE_TOLERANCE)
    # Never more splits than needed: no smaller count fills the waves as well.
    assert all(
        splits.wave_efficiency(ctas_per_split * s, sms) < best * (1 - splits.WAVE_TOLERANCE) for s in range(1, chosen)
    )


def test_split_rule_examples():
    # One sequence, 8 KV heads, 128k keys: 8 CTAs alone would use 8 of 132 SMs.
    assert splits.wave_efficiency(8 * splits.choose_num_splits(8, 131072, 132), 132) >= 0.95
    # A full batch already fills the GPU: no split, no merge.
    assert splits.choose_num_splits(64 * 32, 131072, 132) == 1
    # A short cache keeps MIN_KEYS_PER_SPLIT keys per split.
    assert splits.choose_num_splits(1, 1024, 132) == 1024 // splits.MIN_KEYS_PER_SPLIT
    # The plan reads the padded Sk, never the cache lengths (bind takes no lengths' values).
    problem = Problem(1, 32, 1, 131072, 128, kv_heads=8, has_cache_seqlens=True)
    assert decode.planned_num_splits(problem, CPU) == splits.choose_num_splits(8, 131072, splits.DEFAULT_SM_COUNT)


# ----------------------------------------------------------------------------------------------------
# Planted bugs the check must catch
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _drop_split_one(split, num_splits, key_end, BLOCK_N: tl.constexpr):
    key_begin, key_end = split_key_range(split, num_splits, key_end, BLOCK_N)
    return key_begin, tl.where(split == 1, key_begin, key_end)


@triton.jit
def _ignore_cache_seqlens(
    CacheSeqlens, batch, seqlen_q, seqlen_k, HAS_CACHE_SEQLENS: tl.constexpr, BOTTOM_RIGHT: tl.constexpr
):  # fmt: skip
    causal_offset = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0
    return seqlen_k, causal_offset


PLANTED = {
    "dropped split": ("split_key_range", _drop_split_one),
    "merge weighs natural-log LSEs as log2": ("COMBINE_LOG2_E", tl.constexpr(1.0)),
    "split reads past its sequence's length": ("seqlen_info", _ignore_cache_seqlens),
}


@interpreter_only
@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_bug_fails_the_check(bug: str, monkeypatch: pytest.MonkeyPatch):
    problem = _decode_problem(1, 2)  # passes unplanted: test_ragged_cache_against_fp64[sq1-hkv2-splits3]
    name, replacement = PLANTED[bug]
    monkeypatch.setattr(decode, name, replacement)
    result = _check(problem, 3)
    assert not result.ok, f"{bug}: the check passed a wrong kernel ({result.summary()})"


# ----------------------------------------------------------------------------------------------------
# GPU: bf16 at decode sizes
# ----------------------------------------------------------------------------------------------------
GPU_CASES = [(1, 8, 4096, None), (4, 8, 32768, 3), (1, 32, 8192, None), (16, 1, 4096, 5)]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=[f"sq{q}-hkv{h}-sk{k}-splits{s}" for q, h, k, s in GPU_CASES])
def test_gpu_decode_bf16(case: tuple[int, int, int, int | None]):
    seqlen_q, kv_heads, seqlen_k, num_splits = case
    problem = Problem(
        4, 32, seqlen_q, seqlen_k, 128, dtype=torch.bfloat16, causal=True, kv_heads=kv_heads,
        causal_alignment="bottom_right", has_cache_seqlens=True, return_lse=True,
    )  # fmt: skip
    q, k, v = make_inputs(problem, seed=1, device="cuda", offset=0.5)
    lengths = torch.tensor([seqlen_k, 0, seqlen_k // 3 + 1, 17], dtype=torch.int32, device="cuda")
    impl = decode.IMPLEMENTATION if num_splits is None else _with_splits(num_splits)
    result = check_on_inputs(impl, q, k, v, problem, cache_seqlens=lengths)
    assert result.ok, f"{problem.describe()} splits={num_splits}: {result.summary()}"
