"""Every error rule fails planted bugs and passes a correct kernel (CPU, float64 references).

A rule is only as good as the bugs it catches. Each rule is fed the output of a small model kernel
written here in torch (block by block, like the real ones) with one bug planted at a time: a 10 %
wrong softmax scale, the last key block dropped, wrong tail rows, the causal mask off by one, and
for FP8 a wrong descale factor. Inputs are zero-mean with no V offset, on ragged shapes.
"""

from __future__ import annotations

import math

import pytest
import torch

from common.contract.fp8 import (
    P_EXPONENT,
    KernelOrder,
    Quantisation,
    QuantisedOperands,
    emulate,
    fa3_inputs,
    quantise,
)
from common.contract.inputs import make_inputs
from common.contract.metrics import (
    FP8_RULE,
    SDPA_RELATIVE_RULE,
    emulation_stats,
    error_stats,
    judge_lse,
    lse_bound,
    lse_stats,
    score_magnitude,
)
from common.contract.problem import Problem
from common.contract.reference import reference_attention, sdpa

LOG2_E = math.log2(math.e)
BUGS = ("scale", "last_block", "tail_rows", "causal_off_by_one", "descale")
# Model-kernel tiles: small, so that small ragged shapes still span several blocks of each kind.
TILE_M, TILE_N = 32, 32
SMALL_BLOCKS = Quantisation(block=True, rotation=True, q_block_rows=TILE_M, kv_block_rows=2 * TILE_N)
# The fp8 wgmma's reduced-precision accumulation, modelled as score noise of this share of Σ|q k|:
# a quarter of what the emulation's bound allows for.
SCORE_NOISE = 2.0**-13
TAIL_ROWS = 16
SHAPES = [(77, 300, False), (300, 77, False), (200, 200, True), (1, 45, False), (100, 40, True)]


def _row_scales(scales: torch.Tensor, block_rows: int, rows: int) -> torch.Tensor:
    return scales.float().repeat_interleave(block_rows, dim=-1)[..., :rows]


def model_fp8_kernel(
    operands: QuantisedOperands, problem: Problem, order: KernelOrder, bug: str | None = None, seed: int = 0
) -> torch.Tensor:
    """What both FP8 kernels compute, in fp32 with torch: per key block S = Q8 K8ᵀ (plus accumulation
    noise), online softmax with the 2^8 headroom, P rounded to e4m3, P V scaled by V's block scale and
    added to O; O / row_sum in bf16. ``bug`` plants one mistake."""
    quantisation = operands.quantisation
    generator = torch.Generator().manual_seed(seed)
    q8, k8, v8 = (t.float() for t in (operands.q8, operands.k8, operands.v8))
    q_row = _row_scales(operands.q_scale, quantisation.q_block_rows, problem.seqlen_q)
    kv_block = quantisation.kv_block_rows
    scale_log2 = problem.scale * LOG2_E * (1.1 if bug == "scale" else 1.0)
    rows = torch.arange(problem.seqlen_q)[:, None]
    blocks = list(range(-(-problem.seqlen_k // order.block_n)))
    if bug == "last_block":
        blocks = blocks[:-1]
    out = torch.empty(q8.shape, dtype=torch.bfloat16)
    for b in range(problem.batch):
        for h in range(problem.heads):
            row_max = torch.full((problem.seqlen_q,), -math.inf)
            row_sum = torch.zeros(problem.seqlen_q)
            acc = torch.zeros(problem.seqlen_q, problem.head_dim)
            for n in reversed(blocks) if order.reverse else blocks:
                keys = torch.arange(n * order.block_n, min((n + 1) * order.block_n, problem.seqlen_k))
                quant_block = keys[0] // kv_block
                k_scale = operands.k_scale[b, h, quant_block].float()
                v_scale = operands.v_scale[b, h, quant_block].float() * (1.1 if bug == "descale" else 1.0)
                s = q8[b, h] @ k8[b, h, keys].T
                noise = (torch.rand(s.shape, generator=generator) * 2 - 1) * SCORE_NOISE
                s = (s + noise * (q8[b, h].abs() @ k8[b, h, keys].abs().T)) * (
                    scale_log2 * q_row[b, h][:, None] * k_scale
                )
                if problem.causal:
                    limit = rows + (1 if bug == "causal_off_by_one" else 0)
                    s = s.masked_fill(keys[None, :] > limit, -math.inf)
                new_max = torch.maximum(row_max, s.amax(dim=-1))
                base = torch.where(torch.isfinite(new_max), new_max, torch.zeros_like(new_max))
                p = torch.exp2(s - base[:, None] + P_EXPONENT)
                alpha = torch.exp2(row_max - base)
                row_sum = row_sum * alpha + p.sum(dim=-1)
                pv = p.to(torch.float8_e4m3fn).float() @ v8[b, h, keys]
                acc = acc * alpha[:, None] + pv * v_scale
                row_max = new_max
            out[b, h] = (acc / row_sum[:, None]).to(torch.bfloat16)
    if bug == "tail_rows":
        out[:, :, -TAIL_ROWS:] = 0
    return out


# ----------------------------------------------------------------------------------------------------
# FP8: the emulation rule
# ----------------------------------------------------------------------------------------------------
def _fp8_case(shape: tuple[int, int, bool], inputs: str, reverse: bool, bug: str | None):
    seqlen_q, seqlen_k, causal = shape
    problem = Problem(1, 2, seqlen_q, seqlen_k, 64, dtype=torch.float16, causal=causal)
    if inputs == "fa3":
        q, k, v = fa3_inputs(problem, seed=seqlen_q + seqlen_k, device="cpu")
    else:
        q, k, v = make_inputs(problem, seed=seqlen_q + seqlen_k, device="cpu")
    order = KernelOrder(block_n=TILE_N, reverse=reverse)
    operands = quantise(q, k, v, SMALL_BLOCKS)
    out = model_fp8_kernel(operands, problem, order, bug)
    ref = reference_attention(q, k, v, problem)
    emulated = emulate(operands, problem, order)
    err = error_stats(out, ref)
    stats = emulation_stats(out, emulated.out, emulated.bound, ref)
    return FP8_RULE.judge(err, None, stats), err, stats


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("inputs", ["normal", "fa3"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fp8_rule_passes_the_model_kernel(shape, inputs: str, reverse: bool):
    (ok, reason), err, stats = _fp8_case(shape, inputs, reverse, bug=None)
    print(f"{shape} {inputs}: {err.summary()} | {stats.summary()}")
    assert ok, f"{reason}: {err.summary()} | {stats.summary()}"


@pytest.mark.parametrize("bug", BUGS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fp8_rule_fails_planted_bugs(shape, bug: str):
    if bug == "causal_off_by_one" and not shape[2]:
        pytest.skip("the causal mask exists only in causal shapes")
    if bug == "tail_rows" and shape[0] < TAIL_ROWS:
        pytest.skip(f"needs at least {TAIL_ROWS} query rows")
    (ok, reason), err, stats = _fp8_case(shape, "normal", reverse=True, bug=bug)
    print(f"{bug} {shape}: {reason} | {stats.summary()}")
    assert not ok, f"planted bug {bug} passed: {err.summary()} | {stats.summary()}"


def test_fp8_rule_needs_the_emulation_and_rejects_nan():
    stats = error_stats(torch.zeros(1, 1, 2, 2), torch.ones(1, 1, 2, 2, dtype=torch.float64))
    ok, reason = FP8_RULE.judge(stats, None)
    assert not ok and "emulation" in reason
    nan = torch.full((1, 1, 2, 2), math.nan)
    ref = torch.ones(1, 1, 2, 2, dtype=torch.float64)
    emulated = emulation_stats(nan, ref, torch.ones_like(ref), ref)
    assert not FP8_RULE.judge(error_stats(nan, ref), None, emulated)[0]


# ----------------------------------------------------------------------------------------------------
# 16-bit: the SDPA-relative rule
# ----------------------------------------------------------------------------------------------------
def model_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, bug: str | None) -> torch.Tensor:
    """fp32 attention rounded to the inputs' dtype, with one planted ``bug`` (TILE_N-key blocks)."""
    scale = problem.scale * (1.1 if bug == "scale" else 1.0)
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    cols = torch.arange(problem.seqlen_k)
    if problem.causal:
        limit = torch.arange(problem.seqlen_q)[:, None] + (1 if bug == "causal_off_by_one" else 0)
        s = s.masked_fill(cols[None, :] > limit, -math.inf)
    if bug == "last_block":
        last_block_start = (problem.seqlen_k - 1) // TILE_N * TILE_N
        s[..., last_block_start:] = -math.inf
    out = (torch.softmax(s, dim=-1) @ v.float()).to(q.dtype)
    if bug == "tail_rows":
        out[:, :, -TAIL_ROWS:] = 0
    if bug == "descale":
        out = out * 1.1
    return out


@pytest.mark.parametrize("bug", [None, *BUGS])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_sdpa_relative_rule_fails_planted_bugs(shape, dtype: torch.dtype, bug: str | None):
    seqlen_q, seqlen_k, causal = shape
    if bug == "causal_off_by_one" and not causal:
        pytest.skip("the causal mask exists only in causal shapes")
    if bug == "tail_rows" and seqlen_q < TAIL_ROWS:
        pytest.skip(f"needs at least {TAIL_ROWS} query rows")
    problem = Problem(1, 2, seqlen_q, seqlen_k, 64, dtype=dtype, causal=causal)
    q, k, v = make_inputs(problem, seed=seqlen_q + seqlen_k, device="cpu")
    ref = reference_attention(q, k, v, problem)
    ok, reason = SDPA_RELATIVE_RULE.judge(
        error_stats(model_kernel(q, k, v, problem, bug), ref), error_stats(sdpa(q, k, v, problem), ref)
    )
    assert ok == (bug is None), f"bug {bug}: ok={ok} {reason}"


# ----------------------------------------------------------------------------------------------------
# GQA, the bottom-right alignment, per-sequence lengths and the LSE rule
# ----------------------------------------------------------------------------------------------------
FEATURE_BUGS = ("kv_head_modulo", "bottom_right_off_by_one", "cache_length_ignored", "lse_log2", "lse_unscaled")
# (Sq, Sk): decode-like and prefill-past-the-cache shapes, with odd lengths.
FEATURE_SHAPES = [(1, 77), (45, 130), (130, 45)]


def model_feature_kernel(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, lengths: list[int], bug: str | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 attention with GQA, the bottom-right alignment and per-sequence lengths: (O in the inputs'
    dtype, fp32 natural-log LSE), with one planted ``bug``."""
    out = torch.empty(q.shape, dtype=q.dtype)
    lse = torch.empty(q.shape[:3], dtype=torch.float32)
    rows = torch.arange(problem.seqlen_q)[:, None]
    cols = torch.arange(problem.seqlen_k)[None, :]
    for b in range(problem.batch):
        seqlen_k = problem.seqlen_k if bug == "cache_length_ignored" else lengths[b]
        offset = seqlen_k - problem.seqlen_q + (1 if bug == "bottom_right_off_by_one" else 0)
        visible = (cols < seqlen_k) & (cols <= rows + offset)
        for h in range(problem.heads):
            kv_head = h % problem.kv_heads if bug == "kv_head_modulo" else problem.kv_head(h)
            s = q[b, h].float() @ k[b, kv_head].float().T
            scaled = (s * problem.scale).masked_fill(~visible, -math.inf)
            row_lse = torch.logsumexp(scaled, dim=-1)
            # A row that sees no key: P = 0 (exp(-inf - 0)), so O = 0; its LSE stays -inf.
            p = torch.exp(scaled - torch.where(torch.isfinite(row_lse), row_lse, 0)[:, None])
            out[b, h] = (p @ v[b, kv_head].float()).to(q.dtype)
            if bug == "lse_unscaled":
                row_lse = torch.logsumexp(s.masked_fill(~visible, -math.inf), dim=-1)
            lse[b, h] = row_lse * (LOG2_E if bug == "lse_log2" else 1.0)
    return out, lse


@pytest.mark.parametrize("bug", [None, *FEATURE_BUGS])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", FEATURE_SHAPES, ids=str)
def test_output_and_lse_rules_fail_planted_feature_bugs(shape, dtype: torch.dtype, bug: str | None):
    """GQA (4 query heads per KV head), bottom-right, ragged lengths with 0 and Sk: the output rule or
    the LSE rule (:func:`lse_bound`) must fail every planted bug, and both pass the correct model."""
    seqlen_q, seqlen_k = shape
    if bug == "bottom_right_off_by_one" and seqlen_q == 1:
        pytest.skip("one query row sees every key bottom-right: the key one past the diagonal is past Sk")
    problem = Problem(
        3, 4, seqlen_q, seqlen_k, 64, dtype=dtype, causal=True, kv_heads=2,
        causal_alignment="bottom_right", has_cache_seqlens=True, return_lse=True,
    )  # fmt: skip
    q, k, v = make_inputs(problem, seed=seqlen_q + seqlen_k, device="cpu")
    lengths = torch.tensor([seqlen_k, 0, (2 * seqlen_k) // 3], dtype=torch.int32)
    ref, ref_lse = reference_attention(q, k, v, problem, cache_seqlens=lengths, with_lse=True)
    out, lse = model_feature_kernel(q, k, v, problem, lengths.tolist(), bug)
    out_ok, out_reason = SDPA_RELATIVE_RULE.judge(
        error_stats(out, ref), error_stats(sdpa(q, k, v, problem, lengths), ref)
    )
    lse_ok, lse_reason = judge_lse(lse_stats(lse, ref_lse, lse_bound(dtype, seqlen_k, ref_lse)))
    if bug is None:
        assert out_ok and lse_ok, f"correct model failed: {out_reason} {lse_reason}"
    elif bug.startswith("lse"):
        # An LSE bug leaves O right: the LSE rule alone must catch it.
        assert out_ok and not lse_ok, f"bug {bug}: output ok={out_ok}, lse ok={lse_ok}"
    else:
        assert not out_ok and not lse_ok, f"bug {bug}: output ok={out_ok} ({out_reason}), lse ok={lse_ok}"


def test_lse_rule_rejects_nan_and_wrong_infinities():
    ref = torch.tensor([[[0.5, -math.inf]]], dtype=torch.float64)
    bound = lse_bound(torch.float16, 10, ref)
    assert judge_lse(lse_stats(ref.float(), ref, bound))[0]
    for wrong in ([math.nan, -math.inf], [0.5, 0.0], [-math.inf, -math.inf], [math.inf, -math.inf]):
        ok, _ = judge_lse(lse_stats(torch.tensor([[wrong]], dtype=torch.float32), ref, bound))
        assert not ok, f"{wrong} passed"
    assert not judge_lse(lse_stats(ref.double(), ref, bound))[0], "an fp64 LSE is not the contract's fp32"


def test_lse_bound_allows_an_fp32_scores_rounding_where_the_score_cancels():
    """One key whose score is the difference of two large terms: fp32 accumulation may be off by
    u(fp32) of the terms, far beyond 4 u(fp32) |lse|; the score magnitude term allows it, and an error
    ten times the bound still fails."""
    q = torch.tensor([[[[3.0, 3.0]]]], dtype=torch.float64)
    k = torch.tensor([[[[3.0, -3.0 + 2.0**-10]]]], dtype=torch.float64)
    scale = 0.5
    ref_lse = (q @ k.transpose(-1, -2)).squeeze(-1) * scale
    magnitude = score_magnitude(q, k, scale)
    assert magnitude.item() == pytest.approx(scale * 18.0, rel=1e-3)
    off = ref_lse + 2 * 2.0**-24 * magnitude
    without = lse_bound(torch.float32, 1, ref_lse)
    with_terms = lse_bound(torch.float32, 1, ref_lse, score_magnitude=magnitude)
    assert not judge_lse(lse_stats(off.float(), ref_lse, without))[0]
    assert judge_lse(lse_stats(off.float(), ref_lse, with_terms))[0]
    far = ref_lse + 10 * with_terms
    assert not judge_lse(lse_stats(far.float(), ref_lse, with_terms))[0]
