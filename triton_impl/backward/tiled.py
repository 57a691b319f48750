"""Backward rung 3, FlashAttention-2 tiled (forward counterpart: ``triton_impl/tiled.py``).

What it adds over ``naive``: neither P nor dS touches HBM. The naive backward writes both score-sized
matrices and reads them back twice; here one program owns a block of keys, keeps its K and V tiles and
its dK and dV accumulators in registers, and walks the query blocks, recomputing P from Q, K and the
saved LSE (one exp per score: cheaper than storing it) and using each tile of P and dS right where it
is made. The extra HBM traffic is O(Sq·D) per key block instead of O(Sq·Sk), and all five products of a
step run on tensor cores (fp16/bf16 operands, fp32 accumulation), as in the forward's tiled rung.

dQ is the catch: a query row's gradient sums over every key block, and key blocks live in different
programs. This rung adds each program's share into an fp32 dQ buffer with atomics (relaxed
``atomic_add``; fp32, as an fp16/bf16 running sum would lose the small shares), then a last kernel scales
and casts it, as FlashAttention-2's CUDA backward does. The alternative, a second pass with one program
per query block looping over the keys (the Triton tutorial's ``_attn_bwd_dq``), recomputes P and dP once
more (7 products per tile instead of 5) but needs no atomics and is deterministic. Atomics were chosen
to keep one main kernel; their cost against the separate pass is not measured yet (GPU run pending).

Algorithm (three launches):
  1. ``_preprocess_kernel`` (one program per BLOCK_M query rows of one (batch, head)):
     D = rowsum(dO ∘ O) − dLSE into (B·H·Sq) fp32, and the rows' dQ accumulator zeroed.
  2. ``_tiled_backward_kernel`` (one program per BLOCK_N keys of one (batch, KV head)):
     a. Load the K and V tiles once; dK = dV = 0 in registers.
     b. For every query head of the KV head's group (GQA sums there, no atomics for dK and dV), for
        every query block from the first whose rows can see these keys (causal: earlier rows are
        skipped) to the last:
        - S = Q Kᵀ · softmax_scale_log2, the sequence tail and the causal diagonal -inf;
          P = exp2(S − LSE · LOG2_E) (natural-log LSE of the forward; rows that see no key get P = 0).
        - dV += Pᵀ dO, with P in the input dtype.
        - dP = dO Vᵀ; dS = P ∘ (dP − D).
        - dK += dSᵀ Q and dQ_accum[rows] += dS K (fp32 atomics), dS in the input dtype.
     c. dK ·= softmax_scale; store dK and dV in the input dtype.
  3. ``_dq_convert_kernel``: dQ = softmax_scale · dQ_accum in the input dtype (the scale applied once).

Data movement: Q, dO, the LSE and D go HBM → registers once per (key block, query block); K and V once
per program; the dot operands are staged through shared memory for the MMA. On sm_90a (Triton 3.8) the
products with 64 output rows (dV, dK: one per key) compile to ``wgmma``, those with BLOCK_M = 32 rows
(S, dP, the dQ share) to ``mma.sync``, as a warpgroup MMA covers 64 rows. The dQ shares go to L2 as
``atom.global.gpu.relaxed.add.v4.f32``, four floats per instruction.

Constraints: fp16 and bf16 on a CUDA GPU, fp32 under the Triton interpreter (bf16 refused there, as by
the forward rungs); D ∈ {64, 128}; any Sq, Sk ≥ 1; causal (top-left or bottom-right) or not; GQA and
MQA. ``cache_seqlens`` and paged caches are refused. The tile sizes are a first guess, untuned.

Measurements: none yet; the H200 run of ``compare.py --backward`` (and atomics against a dQ pass) is
pending.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from common.contract.problem import Problem
from common.contract.registry import Backward, Launch
from common.contract.validation import kernel_operand
from common.toolchain.compile import KernelBinary
from triton_impl.backward._host import backward_supported, compile_launches, run_launches

# softmax_scale_log2 = softmax_scale · LOG2_E, so the kernel uses exp2; the kernel scales the LSE by it too.
LOG2_E = tl.constexpr(math.log2(math.e))
# Per head dim: (BLOCK_M query rows per step, BLOCK_N keys per program, num_warps). Untuned first guess
# (the Triton tutorial's backward takes 32 × 128). dK and dV (2 · 64 × D fp32) live in registers: at D=128
# they need two warpgroups, as with four warps the kernel spills 136 bytes per thread (Triton 3.8, sm_90a).
BLOCKS: dict[int, tuple[int, int, int]] = {64: (32, 64, 4), 128: (32, 64, 8)}
HEAD_DIMS = tuple(BLOCKS)
# Rows per program of the preprocess and the dQ conversion.
ROWS_BLOCK_M = 64


# ----------------------------------------------------------------------------------------------
# 1. Preprocess: D = rowsum(dO ∘ O) − dLSE, dQ accumulator zeroed
# ----------------------------------------------------------------------------------------------
@triton.jit
def _preprocess_kernel(
    Out, DOut, DLse, Delta, DQAccum,
    stride_ob, stride_oh, stride_om,
    stride_dob, stride_doh, stride_dom,
    heads, seqlen_q,
    HAS_DLSE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    m_block = tl.program_id(0)
    batch_head = tl.program_id(1)
    batch = (batch_head // heads).to(tl.int64)
    head = (batch_head % heads).to(tl.int64)
    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seqlen_q

    o = tl.load(Out + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)  # fmt: skip
    d_o = tl.load(DOut + batch * stride_dob + head * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :],
                  mask=row_ok[:, None], other=0.0)  # fmt: skip
    delta = tl.sum(o.to(tl.float32) * d_o.to(tl.float32), axis=1)
    # Rows of the (B, H, Sq) LSE, D and the (B, H, Sq, D) dQ accumulator, all contiguous.
    rows = batch_head.to(tl.int64) * seqlen_q + offs_m
    if HAS_DLSE:
        delta -= tl.load(DLse + rows, mask=row_ok, other=0.0)
    tl.store(Delta + rows, delta, mask=row_ok)
    tl.store(DQAccum + rows[:, None] * HEAD_DIM + offs_d[None, :], tl.zeros((BLOCK_M, HEAD_DIM), tl.float32),
             mask=row_ok[:, None])  # fmt: skip


# ----------------------------------------------------------------------------------------------
# 2. Main kernel: one KV block, dK and dV in registers, dQ by atomics
# ----------------------------------------------------------------------------------------------
@triton.jit
def _tiled_backward_kernel(
    Q, K, V, DOut, Lse, Delta, DQAccum, DK, DV,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_dob, stride_doh, stride_dom,
    heads, kv_heads, seqlen_q, seqlen_k, softmax_scale, softmax_scale_log2,
    CAUSAL: tl.constexpr, BOTTOM_RIGHT: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    n_block = tl.program_id(0)
    batch_kv_head = tl.program_id(1)
    batch = (batch_kv_head // kv_heads).to(tl.int64)
    kv_head = (batch_kv_head % kv_heads).to(tl.int64)
    group = heads // kv_heads
    # Row i sees keys j <= i + causal_offset: 0 top-left, Sk − Sq bottom-right.
    causal_offset = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0

    offs_m = tl.arange(0, BLOCK_M)
    offs_n = n_block * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    col_ok = offs_n < seqlen_k

    # 2a. This program's K and V tiles, loaded once; dK and dV accumulate in registers.
    k_ptrs = K + batch * stride_kb + kv_head * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :]
    v_ptrs = V + batch * stride_vb + kv_head * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :]
    k = tl.load(k_ptrs, mask=col_ok[:, None], other=0.0)
    v = tl.load(v_ptrs, mask=col_ok[:, None], other=0.0)
    dk = tl.zeros((BLOCK_N, HEAD_DIM), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, HEAD_DIM), dtype=tl.float32)

    # 2b. Causal: rows i < first key − causal_offset see none of these keys; start at their query block.
    m_begin = 0
    if CAUSAL:
        m_begin = tl.maximum(n_block * BLOCK_N - causal_offset, 0) // BLOCK_M * BLOCK_M
    # GQA: the query heads kv_head · group ... kv_head · group + group − 1 read this KV head.
    for head in range(kv_head * group, kv_head * group + group):
        batch_head = batch * heads + head
        q_base = Q + batch * stride_qb + head * stride_qh
        do_base = DOut + batch * stride_dob + head * stride_doh
        for m_start in tl.range(m_begin, seqlen_q, BLOCK_M):
            rows = m_start + offs_m
            row_ok = rows < seqlen_q
            q = tl.load(q_base + rows[:, None] * stride_qm + offs_d[None, :], mask=row_ok[:, None], other=0.0)
            d_o = tl.load(do_base + rows[:, None] * stride_dom + offs_d[None, :], mask=row_ok[:, None], other=0.0)
            # Guard: a row that sees no key has LSE -inf, and rows past Sq none; +inf gives P = 0, not NaN.
            lse = tl.load(Lse + batch_head * seqlen_q + rows, mask=row_ok, other=float("inf"))
            lse = tl.where(lse == float("-inf"), float("inf"), lse)
            delta = tl.load(Delta + batch_head * seqlen_q + rows, mask=row_ok, other=0.0)

            # P recomputed from the saved LSE, in the log2 domain, with the forward's mask.
            scores = tl.dot(q, tl.trans(k)) * softmax_scale_log2
            visible = col_ok[None, :]
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= rows[:, None] + causal_offset)
            scores = tl.where(visible, scores, float("-inf"))
            probs = tl.exp2(scores - lse[:, None] * LOG2_E)

            # dV += Pᵀ dO; dP = dO Vᵀ; dS = P ∘ (dP − D); dK += dSᵀ Q; dQ += dS K (scaled in step 3).
            dv = tl.dot(tl.trans(probs.to(d_o.dtype)), d_o, dv)
            d_p = tl.dot(d_o, tl.trans(v))
            d_s = (probs * (d_p - delta[:, None])).to(q.dtype)
            dk = tl.dot(tl.trans(d_s), q, dk)
            dq_ptrs = DQAccum + (batch_head * seqlen_q + rows)[:, None] * HEAD_DIM + offs_d[None, :]
            tl.atomic_add(dq_ptrs, tl.dot(d_s, k), mask=row_ok[:, None], sem="relaxed")

    # 2c. dK carries the softmax scale of S = softmax_scale · Q Kᵀ; dV none.
    dk *= softmax_scale
    dk_ptrs = DK + (batch_kv_head.to(tl.int64) * seqlen_k + offs_n)[:, None] * HEAD_DIM + offs_d[None, :]
    dv_ptrs = DV + (batch_kv_head.to(tl.int64) * seqlen_k + offs_n)[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(dk_ptrs, dk.to(DK.dtype.element_ty), mask=col_ok[:, None])
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


# ----------------------------------------------------------------------------------------------
# 3. dQ = softmax_scale · dQ_accum, in the input dtype
# ----------------------------------------------------------------------------------------------
@triton.jit
def _dq_convert_kernel(DQAccum, DQ, seqlen_q, softmax_scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    m_block = tl.program_id(0)
    batch_head = tl.program_id(1)
    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seqlen_q
    # dQ_accum and dQ are both (B, H, Sq, D) contiguous.
    offsets = (batch_head.to(tl.int64) * seqlen_q + offs_m)[:, None] * HEAD_DIM + offs_d[None, :]
    dq = tl.load(DQAccum + offsets, mask=row_ok[:, None], other=0.0) * softmax_scale
    tl.store(DQ + offsets, dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])


# ----------------------------------------------------------------------------------------------
# Host: allocate D, dQ_accum and the gradients, launch the three kernels (or compile them for sm_90a)
# ----------------------------------------------------------------------------------------------
def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    """(batch, head, row) strides of a (B, H, S, D) tensor whose last dim is contiguous."""
    return t.stride(0), t.stride(1), t.stride(2)


def _launches(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    d_out: torch.Tensor,
    problem: Problem,
    d_lse: torch.Tensor | None,
) -> tuple[list[Launch], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The three launches and the (dq, dk, dv) they write; buffers are allocated on the inputs' device."""
    q, k, v, out, d_out = (kernel_operand(t) for t in (q, k, v, out, d_out))
    batch, heads, seqlen_q, seqlen_k = problem.batch, problem.heads, problem.seqlen_q, problem.seqlen_k
    block_m, block_n, num_warps = BLOCKS[problem.head_dim]
    lse = lse.contiguous()
    delta = torch.empty((batch * heads * seqlen_q,), dtype=torch.float32, device=q.device)
    dq_accum = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    # Without d_lse the kernel never reads its argument (HAS_DLSE False): pass the LSE in its place.
    d_lse_arg = d_lse.contiguous() if d_lse is not None else lse
    rows_grid = (triton.cdiv(seqlen_q, ROWS_BLOCK_M), batch * heads)
    rows_options = {"HEAD_DIM": problem.head_dim, "BLOCK_M": ROWS_BLOCK_M}
    launches = [
        (
            _preprocess_kernel, rows_grid,
            (out, d_out, d_lse_arg, delta, dq_accum, *_strides(out), *_strides(d_out), heads, seqlen_q),
            {"HAS_DLSE": d_lse is not None, **rows_options},
        ),
        (
            _tiled_backward_kernel, (triton.cdiv(seqlen_k, block_n), batch * problem.kv_heads),
            (
                q, k, v, d_out, lse, delta, dq_accum, dk, dv,
                *_strides(q), *_strides(k), *_strides(v), *_strides(d_out),
                heads, problem.kv_heads, seqlen_q, seqlen_k, problem.scale, problem.scale * LOG2_E.value,
            ),
            {
                "CAUSAL": problem.causal, "BOTTOM_RIGHT": problem.bottom_right, "HEAD_DIM": problem.head_dim,
                "BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": num_warps,
            },
        ),
        (_dq_convert_kernel, rows_grid, (dq_accum, dq, seqlen_q, problem.scale), rows_options),
    ]  # fmt: skip
    return launches, (dq, dk, dv)


def tiled_gradients(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    d_out: torch.Tensor,
    problem: Problem,
    *,
    d_lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of q (B, H, Sq, D), k and v (B, Hkv, Sk, D), given the forward's O and LSE (B, H, Sq)
    and the loss's gradients d_out (like O) and, optionally, d_lse (like the LSE)."""
    return run_launches(_launches, q, k, v, out, lse, d_out, problem, d_lse)


def compile_sm90(problem: Problem) -> list[KernelBinary]:
    """The three kernels compiled for sm_90a as ``problem``'s launches build them (meta tensors: no GPU)."""
    return compile_launches(_launches, problem)


# ----------------------------------------------------------------------------------------------
# Capability check
# ----------------------------------------------------------------------------------------------
def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    """Device, dtype (bf16 refused under the interpreter), head dim and the features (no
    ``cache_seqlens``, no paged cache)."""
    return backward_supported(BACKWARD_NAME, problem, device, HEAD_DIMS)


BACKWARD_NAME = "triton/backward/tiled"
BACKWARD = Backward(
    name=BACKWARD_NAME,
    gradients=tiled_gradients,
    supports=supports,
    compile_sm90=compile_sm90,
    runs_on_cpu=True,
    source_file=__file__,
)
