"""Backward rung 1, naive: materialise P and dS in HBM (forward counterpart: ``triton_impl/naive.py``).

The backward pass as the chain rule reads, one launch per step, with the two score-sized matrices
it needs, P and dS, written to HBM in fp32. It exists to define the computation every later
backward rung reorganises, and as the baseline they are measured against. Given O and the natural-log
LSE saved by the forward, and dO, the gradient of the loss with respect to O:

    S = softmax_scale · Q Kᵀ (masked -inf)    P = exp(S − LSE)          (recomputed, no softmax pass)
    dV = Pᵀ dO                                 dP = dO Vᵀ
    D = rowsum(dO ∘ O) (− dLSE)                dS = P ∘ (dP − D)
    dQ = softmax_scale · dS K                  dK = softmax_scale · dSᵀ Q

D is the row sum of P ∘ dP (as rowsum(dO ∘ O) = rowsum(P ∘ dO Vᵀ)): the softmax's Jacobian
contracted with dP. When the caller differentiates the returned LSE as well, dLSE enters only there:
∂LSE_i/∂S_ij = P_ij, so dS = P ∘ (dP − D + dLSE).

Algorithm (five launches, each a section below):
  1. ``_probs_kernel``: one program per BLOCK_M × BLOCK_N tile of one (batch, head): S = softmax_scale ·
     Q Kᵀ with K of the query head's KV head (GQA), the sequence tail and (causal) the keys after the
     row's diagonal set to -inf as in the forward's naive rung, then P = exp(S − LSE) into the P buffer
     (B·H, Sq, Sk). S itself stays in registers: the forward stored it, the backward needs only P.
  2. ``_delta_kernel``: D = rowsum(dO ∘ O) − dLSE, one program per BLOCK_M rows, into (B·H·Sq).
  3. ``_dscores_kernel``: the same tiles as step 1: dP = dO Vᵀ, dS = P ∘ (dP − D) into the dS buffer.
  4. ``_dq_kernel``: one program per BLOCK_M rows of one (batch, head): dQ = softmax_scale · dS K.
  5. ``_dkv_kernel``: one program per BLOCK_N keys of one (batch, KV head): dV = Σ Pᵀ dO and dK =
     softmax_scale · Σ dSᵀ Q, the sums running over every query block of every query head of the KV
     head's group. GQA is summed here, in registers: K and V are never repeated, and no atomics.

Data movement: every operand goes HBM → registers with plain ``ld.global``; the products are fp32
``tl.dot`` with ``input_precision="ieee"`` (CUDA-core FMA, no tensor cores), as in the forward's naive
rung. P and dS (B·H·Sq·Sk·4 bytes each) are written once and read twice (P: steps 3 and 5; dS: steps 4
and 5), so the rung is bound by HBM traffic on them, and by capacity as S grows.

Constraints: fp16 and bf16 on a CUDA GPU, fp32 under the Triton interpreter (bf16 refused there, as by
the forward rungs), and fp64 under the interpreter when called directly (the working precision is
then fp64, so ``torch.autograd.gradcheck`` can check it; no capability check accepts fp64); D ∈ {64,
128, 256} (BLOCK_M × BLOCK_N tiles of 32 × 32, 16 × 16 at D=256, where every dot spanning D would
otherwise spill: ``TILES``); any Sq, Sk ≥ 1; causal (top-left or bottom-right) or not; GQA and MQA.
``cache_seqlens`` and paged caches are refused. Rows that see no key (LSE -inf) get P = 0, so a zero dQ row.

Measurements: none yet; the H200 run of ``compare.py --backward`` is pending.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from common.contract.problem import Problem
from common.contract.registry import Backward, Launch
from common.contract.validation import kernel_operand
from common.toolchain.compile import KernelBinary
from triton_impl._device import batch_and_head, head_base, program_heads
from triton_impl.backward._device import softmax_delta
from triton_impl.backward._host import backward_supported, compile_launches, head_strides, run_launches

# A constexpr: P = exp2((S − LSE) · LOG2_E), S and the LSE in natural units.
LOG2_E = tl.constexpr(1.4426950408889634)


class NaiveTiles(NamedTuple):
    """Tiles of P and dS (``block_m`` × ``block_n``), which are also the rows (keys) a dQ (dK, dV)
    program owns, and the warps of every launch; every dot spans the whole head dim."""

    block_m: int
    block_n: int
    num_warps: int


# Per head dim; each compiles for sm_90a without spills under Triton 3.6 to 3.9 (the static test in
# tests/test_backward.py). With 4 warps the D=128 kernels spill (up to 880 bytes per thread, Triton 3.8):
# the dQ accumulator and the dK, dV pair span D. At D=256 32 × 32 tiles spill even with 8 warps (dQ 328
# and dK/dV 856 bytes, 3.8; 216 and 456 with 16 warps), 16 × 16 ones do not (dK/dV 166-172 registers).
TILES = {64: NaiveTiles(32, 32, 8), 128: NaiveTiles(32, 32, 8), 256: NaiveTiles(16, 16, 8)}
HEAD_DIMS = tuple(TILES)
# The buffers' precision: fp32, fp64 for fp64 inputs (gradcheck under the interpreter).
WORK_DTYPES = {torch.float64: torch.float64}


# ----------------------------------------------------------------------------------------------
# 1. P = exp(softmax_scale · Q Kᵀ − LSE), masked entries 0, into HBM
# ----------------------------------------------------------------------------------------------
@triton.jit
def _probs_kernel(
    Q, K, Lse, P,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    heads, kv_heads, seqlen_q, seqlen_k, softmax_scale,
    CAUSAL: tl.constexpr, BOTTOM_RIGHT: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    m_block = tl.program_id(0)
    n_block = tl.program_id(1)
    batch_head, batch, head, kv_head = program_heads(2, heads, kv_heads)
    q_base = head_base(Q, batch, head, stride_qb, stride_qh)
    k_base = head_base(K, batch, kv_head, stride_kb, stride_kh)
    # Row i sees keys j <= i + causal_offset: 0 top-left, Sk − Sq bottom-right.
    causal_offset = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0
    work = P.dtype.element_ty

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = n_block * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seqlen_q
    col_ok = offs_n < seqlen_k

    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :], mask=col_ok[:, None], other=0.0)
    scores = tl.dot(q.to(work), tl.trans(k.to(work)), input_precision="ieee") * softmax_scale
    visible = col_ok[None, :]
    if CAUSAL:
        visible = visible & (offs_n[None, :] <= offs_m[:, None] + causal_offset)
    scores = tl.where(visible, scores, float("-inf"))

    # Guard: a row that sees no key has LSE -inf; shifting by +inf instead gives P = exp(-inf) = 0, not NaN.
    lse = tl.load(Lse + batch_head.to(tl.int64) * seqlen_q + offs_m, mask=row_ok, other=float("inf")).to(work)
    lse = tl.where(lse == float("-inf"), float("inf"), lse)
    probs = tl.exp2((scores - lse[:, None]) * LOG2_E)

    # P is (B·H, Sq, Sk) contiguous; offsets in int64 because B·H·Sq·Sk passes 2³¹ at S=8192.
    p_rows = (batch_head.to(tl.int64) * seqlen_q + offs_m) * seqlen_k
    tl.store(P + p_rows[:, None] + offs_n[None, :], probs, mask=row_ok[:, None] & col_ok[None, :])


# ----------------------------------------------------------------------------------------------
# 2. D = rowsum(dO ∘ O) − dLSE
# ----------------------------------------------------------------------------------------------
@triton.jit
def _delta_kernel(
    Out, DOut, DLse, Delta,
    stride_ob, stride_oh, stride_om,
    stride_dob, stride_doh, stride_dom,
    heads, seqlen_q,
    HAS_DLSE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    m_block = tl.program_id(0)
    batch_head = tl.program_id(1)
    delta, rows, row_ok = softmax_delta(
        Out, DOut, DLse, (stride_ob, stride_oh, stride_om), (stride_dob, stride_doh, stride_dom),
        batch_head, heads, m_block, seqlen_q, Delta.dtype.element_ty, HAS_DLSE, HEAD_DIM, BLOCK_M,
    )  # fmt: skip
    tl.store(Delta + rows, delta, mask=row_ok)


# ----------------------------------------------------------------------------------------------
# 3. dP = dO Vᵀ, dS = P ∘ (dP − D), into HBM
# ----------------------------------------------------------------------------------------------
@triton.jit
def _dscores_kernel(
    DOut, V, P, Delta, DS,
    stride_dob, stride_doh, stride_dom,
    stride_vb, stride_vh, stride_vn,
    heads, kv_heads, seqlen_q, seqlen_k,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    m_block = tl.program_id(0)
    n_block = tl.program_id(1)
    batch_head, batch, head, kv_head = program_heads(2, heads, kv_heads)
    do_base = head_base(DOut, batch, head, stride_dob, stride_doh)
    v_base = head_base(V, batch, kv_head, stride_vb, stride_vh)
    work = DS.dtype.element_ty

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = n_block * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seqlen_q
    col_ok = offs_n < seqlen_k
    tile_ok = row_ok[:, None] & col_ok[None, :]

    d_o = tl.load(do_base + offs_m[:, None] * stride_dom + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :], mask=col_ok[:, None], other=0.0)
    d_p = tl.dot(d_o.to(work), tl.trans(v.to(work)), input_precision="ieee")

    rows = batch_head.to(tl.int64) * seqlen_q + offs_m
    delta = tl.load(Delta + rows, mask=row_ok, other=0.0)
    p_ptrs = rows[:, None] * seqlen_k + offs_n[None, :]
    probs = tl.load(P + p_ptrs, mask=tile_ok, other=0.0)
    tl.store(DS + p_ptrs, probs * (d_p - delta[:, None]), mask=tile_ok)


# ----------------------------------------------------------------------------------------------
# 4. dQ = softmax_scale · dS K
# ----------------------------------------------------------------------------------------------
@triton.jit
def _dq_kernel(
    DS, K, DQ,
    stride_kb, stride_kh, stride_kn,
    stride_dqb, stride_dqh, stride_dqm,
    heads, kv_heads, seqlen_q, seqlen_k, softmax_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    m_block = tl.program_id(0)
    batch_head, batch, head, kv_head = program_heads(1, heads, kv_heads)
    k_base = head_base(K, batch, kv_head, stride_kb, stride_kh)
    dq_base = head_base(DQ, batch, head, stride_dqb, stride_dqh)
    work = DS.dtype.element_ty

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seqlen_q
    ds_rows = (batch_head.to(tl.int64) * seqlen_q + offs_m) * seqlen_k

    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=work)
    for n_start in tl.range(0, seqlen_k, BLOCK_N):
        col_ok = n_start + offs_n < seqlen_k
        d_s = tl.load(DS + ds_rows[:, None] + (n_start + offs_n)[None, :],
                      mask=row_ok[:, None] & col_ok[None, :], other=0.0)  # fmt: skip
        k = tl.load(k_base + (n_start + offs_n)[:, None] * stride_kn + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        acc = tl.dot(d_s, k.to(work), acc, input_precision="ieee")

    dq = acc * softmax_scale
    tl.store(dq_base + offs_m[:, None] * stride_dqm + offs_d[None, :], dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])


# ----------------------------------------------------------------------------------------------
# 5. dV = Σ Pᵀ dO, dK = softmax_scale · Σ dSᵀ Q over the KV head's query heads
# ----------------------------------------------------------------------------------------------
@triton.jit
def _dkv_kernel(
    P, DS, Q, DOut, DK, DV,
    stride_qb, stride_qh, stride_qm,
    stride_dob, stride_doh, stride_dom,
    stride_dkb, stride_dkh, stride_dkn,
    stride_dvb, stride_dvh, stride_dvn,
    heads, kv_heads, seqlen_q, seqlen_k, softmax_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    n_block = tl.program_id(0)
    batch, kv_head = batch_and_head(tl.program_id(1), kv_heads)
    group = heads // kv_heads
    work = P.dtype.element_ty

    offs_m = tl.arange(0, BLOCK_M)
    offs_n = n_block * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    col_ok = offs_n < seqlen_k

    dk = tl.zeros((BLOCK_N, HEAD_DIM), dtype=work)
    dv = tl.zeros((BLOCK_N, HEAD_DIM), dtype=work)
    # GQA: the query heads kv_head · group ... kv_head · group + group − 1 read this KV head; sum them all.
    for head in range(kv_head * group, kv_head * group + group):
        batch_head = batch * heads + head
        q_base = Q + batch * stride_qb + head * stride_qh
        do_base = DOut + batch * stride_dob + head * stride_doh
        for m_start in tl.range(0, seqlen_q, BLOCK_M):
            row_ok = m_start + offs_m < seqlen_q
            tile_ok = row_ok[:, None] & col_ok[None, :]
            p_ptrs = (batch_head * seqlen_q + m_start + offs_m)[:, None] * seqlen_k + offs_n[None, :]
            probs = tl.load(P + p_ptrs, mask=tile_ok, other=0.0)
            d_s = tl.load(DS + p_ptrs, mask=tile_ok, other=0.0)
            q = tl.load(q_base + (m_start + offs_m)[:, None] * stride_qm + offs_d[None, :],
                        mask=row_ok[:, None], other=0.0)  # fmt: skip
            d_o = tl.load(do_base + (m_start + offs_m)[:, None] * stride_dom + offs_d[None, :],
                          mask=row_ok[:, None], other=0.0)  # fmt: skip
            dv = tl.dot(tl.trans(probs), d_o.to(work), dv, input_precision="ieee")
            dk = tl.dot(tl.trans(d_s), q.to(work), dk, input_precision="ieee")

    dk *= softmax_scale
    dk_ptrs = DK + batch * stride_dkb + kv_head * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :]
    dv_ptrs = DV + batch * stride_dvb + kv_head * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :]
    tl.store(dk_ptrs, dk.to(DK.dtype.element_ty), mask=col_ok[:, None])
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


# ----------------------------------------------------------------------------------------------
# Host: allocate P, dS, D and the gradients, launch the five kernels (or compile them for sm_90a)
# ----------------------------------------------------------------------------------------------
def _launches(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, d_out: torch.Tensor,
    problem: Problem, d_lse: torch.Tensor | None,
) -> tuple[list[Launch], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:  # fmt: skip
    """The five launches and the (dq, dk, dv) they write; buffers are allocated on the inputs' device."""
    q, k, v, out, d_out = (kernel_operand(t) for t in (q, k, v, out, d_out))
    batch, heads, seqlen_q, seqlen_k = problem.batch, problem.heads, problem.seqlen_q, problem.seqlen_k
    work = WORK_DTYPES.get(q.dtype, torch.float32)
    probs = torch.empty((batch * heads, seqlen_q, seqlen_k), dtype=work, device=q.device)
    d_scores = torch.empty_like(probs)
    delta = torch.empty((batch * heads * seqlen_q,), dtype=work, device=q.device)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    lse = lse.contiguous()
    # Without d_lse the kernel never reads its argument (HAS_DLSE False): pass the LSE in its place.
    d_lse_arg = d_lse.contiguous() if d_lse is not None else lse
    sizes = (heads, problem.kv_heads, seqlen_q, seqlen_k)
    block_m, block_n, num_warps = TILES[problem.head_dim]
    tiles = (triton.cdiv(seqlen_q, block_m), triton.cdiv(seqlen_k, block_n), batch * heads)
    blocks = {"HEAD_DIM": problem.head_dim, "BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": num_warps}
    launches = [
        (
            _probs_kernel, tiles,
            (q, k, lse, probs, *head_strides(q), *head_strides(k), *sizes, problem.scale),
            {"CAUSAL": problem.causal, "BOTTOM_RIGHT": problem.bottom_right, **blocks},
        ),
        (
            _delta_kernel, (tiles[0], batch * heads),
            (out, d_out, d_lse_arg, delta, *head_strides(out), *head_strides(d_out), heads, seqlen_q),
            {"HAS_DLSE": d_lse is not None, "HEAD_DIM": problem.head_dim, "BLOCK_M": block_m, "num_warps": num_warps},
        ),
        (
            _dscores_kernel, tiles,
            (d_out, v, probs, delta, d_scores, *head_strides(d_out), *head_strides(v), *sizes), blocks,
        ),
        (
            _dq_kernel, (tiles[0], batch * heads),
            (d_scores, k, dq, *head_strides(k), *head_strides(dq), *sizes, problem.scale),
            blocks,
        ),
        (
            _dkv_kernel, (tiles[1], batch * problem.kv_heads),
            (
                probs, d_scores, q, d_out, dk, dv,
                *(stride for t in (q, d_out, dk, dv) for stride in head_strides(t)), *sizes, problem.scale,
            ),
            blocks,
        ),
    ]  # fmt: skip
    return launches, (dq, dk, dv)


def naive_gradients(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, d_out: torch.Tensor,
    problem: Problem, *, d_lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(dq, dk, dv) of q (B, H, Sq, D), k and v (B, Hkv, Sk, D), given the forward's O and LSE (B, H, Sq)
    and the loss's gradients d_out (like O) and, optionally, d_lse (like the LSE)."""
    return run_launches(_launches, q, k, v, out, lse, d_out, problem, d_lse)


def compile_sm90(problem: Problem) -> list[KernelBinary]:
    """The five kernels compiled for sm_90a as ``problem``'s launches build them (meta tensors: no GPU)."""
    return compile_launches(_launches, problem)


# ----------------------------------------------------------------------------------------------
# Capability check
# ----------------------------------------------------------------------------------------------
def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    """Device, dtype (bf16 refused under the interpreter), head dim, the features (no ``cache_seqlens``,
    no paged cache) and, on a GPU, room for the P and dS buffers."""
    ok, reason = backward_supported(BACKWARD_NAME, problem, device, HEAD_DIMS)
    if not ok:
        return False, reason
    if device.type == "cuda":
        needed = 2 * problem.score_buffer_bytes
        free_bytes, _ = torch.cuda.mem_get_info(device)
        if needed > free_bytes:
            return False, (
                f"the fp32 P and dS buffers need {needed:,} bytes (2·B·H·Sq·Sk·4) "
                f"but only {free_bytes:,} bytes of device memory are free"
            )
    return True, ""


BACKWARD_NAME = "triton/backward/naive"
BACKWARD = Backward(BACKWARD_NAME, naive_gradients, supports, compile_sm90, runs_on_cpu=True, source_file=__file__)
