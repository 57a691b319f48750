"""Backward rung 1, naive in the CuTe DSL: P and dS in HBM, five SIMT kernels (counterparts:
``triton_impl/backward/naive.py``; forward ``cute_impl/naive.py``).

The backward pass as the chain rule reads it, one launch per step, with the two score-sized matrices
it needs, P and dS, written to HBM in fp32. It defines the computation every later backward rung
reorganises and is the baseline they are measured against. Given O and the natural-log LSE saved by
the forward and dO, the gradient of the loss with respect to O:

    S = softmax_scale · Q Kᵀ (masked)    P = exp(S − LSE)     (recomputed: no softmax pass)
    dV = Pᵀ dO                            dP = dO Vᵀ
    D = rowsum(dO ∘ O) − dLSE             dS = P ∘ (dP − D)
    dQ = softmax_scale · dS K             dK = softmax_scale · dSᵀ Q

D is the row sum of P ∘ dP (rowsum(dO ∘ O) = rowsum(P ∘ dO Vᵀ)): the softmax's Jacobian contracted
with dP. When the caller differentiates the returned LSE too, dLSE enters only there.

Algorithm (five launches, the kernels below in order):
  1. ``delta_kernel``: D = rowsum(dO ∘ O) − dLSE, one warp per row (lanes stride along D, a warp
     reduction sums them), into (B, H, Sq) fp32.
  2. ``probs_kernel``: one thread per (row, key): the dot product q·k over D with fp32 FMAs, keys the
     row may not see (past Sk; causal: right of the diagonal, shifted by ``causal_offset``) get P = 0,
     the others P = exp2(S · softmax_scale_log2 − LSE · LOG2_E); a row that sees no key (LSE -inf)
     gets P = 0. Into P (B, H, Sq, Sk) fp32.
  3. ``dscores_kernel``: the same threads: dP = dO·v, dS = P ∘ (dP − D) into dS (B, H, Sq, Sk) fp32.
  4. ``dq_kernel``: one thread per element of dQ: softmax_scale · Σ_j dS[i, j] K[j, :].
  5. ``dkdv_kernel``: one thread per element of dK and dV of a KV head: Σ over every query head of the
     group (GQA summed here, no atomics, K and V never repeated) and every row i of Pᵀ dO and
     softmax_scale · dSᵀ Q.

Data movement: HBM/L2 → registers → HBM with scalar ``ld.global``/``st.global``; the caches are the only
reuse; no shared memory, no tensor cores. P and dS (B·H·Sq·Sk·4 bytes each) are written once and read
twice, so the rung is bound by HBM traffic on them, and by capacity: the capability check refuses a
problem whose two buffers do not fit in free device memory.

How CuTe says it: a kernel is a ``@cute.kernel`` method launched from one ``@cute.jit __call__`` with an
explicit grid and block; a thread indexes the (B, H, S, D) tensors element by element, as CUDA C would,
and the loops over D and over the sequence are ``cutlass.range`` loops in the generated code.

Constraints: fp16/bf16 on a CUDA GPU of sm_80+; D ∈ {64, 128}; any Sq, Sk ≥ 1; causal (top-left or
bottom-right) or not; GQA and MQA; a differentiable LSE. ``cache_seqlens`` and paged caches are refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, const_expr

from common.contract.capability import BOTTOM_RIGHT, GQA, LSE, check_common
from common.contract.problem import Problem
from common.contract.registry import Backward
from common.toolchain.compile import KernelBinary
from cute_impl._host import CUTE_DTYPES, CompiledKernels, fake_stream, fake_tensor
from cute_impl.backward._device import BackwardOperands, cute_gradients

LOG2_E = math.log2(math.e)
HEAD_DIMS = (64, 128)
MIN_COMPUTE_CAPABILITY = (8, 0)
# CUDA grid limit on gridDim.y and gridDim.z.
MAX_GRID_YZ = 65535
WARP_SIZE = 32
# Rows per CTA of the delta kernel (one warp each), threads per CTA of the score-shaped kernels.
DELTA_ROWS_PER_CTA = 4
SCORE_THREADS = 128
# Bytes of one fp32 score-sized buffer per (batch, head, row, key); the rung keeps two (P and dS).
SCORE_BYTES = 4


@dataclass(frozen=True)
class NaiveBackwardConfig:
    """Everything that changes the generated code (the compile-cache key)."""

    dtype: torch.dtype
    head_dim: int
    causal: bool
    bottom_right: bool = False  # causal diagonal shifted by causal_offset = seqlen_k - Sq
    has_dlse: bool = False  # D = rowsum(dO ∘ O) − dLSE


class NaiveBackward:
    """Five launches: D, P to HBM, dS to HBM, dQ, then dK and dV."""

    def __init__(self, config: NaiveBackwardConfig):
        self.head_dim = config.head_dim
        self.causal = config.causal
        self.bottom_right = config.bottom_right
        self.has_dlse = config.has_dlse
        self.threads_per_cta = max(SCORE_THREADS, DELTA_ROWS_PER_CTA * WARP_SIZE, self.head_dim)

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mO: cute.Tensor,
        mdO: cute.Tensor,
        mLSE: cute.Tensor,
        mdLSE: cute.Tensor | None,
        mDelta: cute.Tensor,
        mP: cute.Tensor,
        mdS: cute.Tensor,
        mdQ: cute.Tensor,
        mdK: cute.Tensor,
        mdV: cute.Tensor,
        softmax_scale: Float32,
        stream: cuda.CUstream,
    ):
        """q, o, do, dq (B, H, Sq, D); k, v, dk, dv (B, Hkv, Sk, D); lse, dlse (None unless
        differentiated), delta (B, H, Sq) fp32; p, ds (B, H, Sq, Sk) fp32."""
        batch_heads = mQ.shape[0] * mQ.shape[1]
        seqlen_q, seqlen_k = mQ.shape[2], mK.shape[2]
        score_grid = [seqlen_q, cute.ceil_div(seqlen_k, SCORE_THREADS), batch_heads]
        self.delta_kernel(mO, mdO, mdLSE, mDelta).launch(
            grid=[cute.ceil_div(seqlen_q, DELTA_ROWS_PER_CTA), batch_heads, 1],
            block=[DELTA_ROWS_PER_CTA * WARP_SIZE, 1, 1],
            stream=stream,
        )
        self.probs_kernel(mQ, mK, mLSE, mP, softmax_scale * LOG2_E).launch(
            grid=score_grid, block=[SCORE_THREADS, 1, 1], stream=stream
        )
        self.dscores_kernel(mdO, mV, mDelta, mP, mdS).launch(
            grid=score_grid, block=[SCORE_THREADS, 1, 1], stream=stream
        )
        self.dq_kernel(mdS, mK, mdQ, softmax_scale).launch(
            grid=[seqlen_q, batch_heads, 1], block=[self.head_dim, 1, 1], stream=stream
        )
        self.dkdv_kernel(mQ, mdO, mP, mdS, mdK, mdV, softmax_scale).launch(
            grid=[seqlen_k, mK.shape[0] * mK.shape[1], 1], block=[self.head_dim, 1, 1], stream=stream
        )

    # ---- 1. D = rowsum(dO ∘ O) − dLSE, one warp per row ----
    @cute.kernel
    def delta_kernel(self, mO: cute.Tensor, mdO: cute.Tensor, mdLSE: cute.Tensor | None, mDelta: cute.Tensor):
        row_block, batch_head, _ = cute.arch.block_idx()
        lane = cute.arch.lane_idx()
        row = row_block * DELTA_ROWS_PER_CTA + cute.arch.warp_idx()
        heads = mO.shape[1]
        batch, head = batch_head // heads, batch_head % heads
        if row < mO.shape[2]:
            partial = Float32(0.0)
            for d in cutlass.range(lane, self.head_dim, WARP_SIZE):
                partial += mO[batch, head, row, d].to(Float32) * mdO[batch, head, row, d].to(Float32)
            total = cute.arch.warp_reduction_sum(partial)
            if const_expr(self.has_dlse):
                total = total - mdLSE[batch, head, row]
            if lane == 0:
                mDelta[batch, head, row] = total

    # ---- 2. P = exp2(S · softmax_scale_log2 − LSE₂), masked to 0, one thread per (row, key) ----
    @cute.kernel
    def probs_kernel(
        self, mQ: cute.Tensor, mK: cute.Tensor, mLSE: cute.Tensor, mP: cute.Tensor, softmax_scale_log2: Float32
    ):
        tidx, _, _ = cute.arch.thread_idx()
        row, col_block, batch_head = cute.arch.block_idx()
        heads, kv_heads = mQ.shape[1], mK.shape[1]
        batch, head = batch_head // heads, batch_head % heads
        # GQA: this query head reads KV head head // (heads // kv_heads).
        kv_head = head // (heads // kv_heads)
        col = col_block * SCORE_THREADS + tidx
        seqlen_k = mK.shape[2]
        # Row i sees keys j <= i + causal_offset: 0 top-left, Sk − Sq bottom-right.
        causal_offset = 0
        if const_expr(self.bottom_right):
            causal_offset = seqlen_k - mQ.shape[2]
        if col < seqlen_k:
            dot = Float32(0.0)
            for d in cutlass.range(self.head_dim, unroll=8):
                dot += mQ[batch, head, row, d].to(Float32) * mK[batch, kv_head, col, d].to(Float32)
            lse = mLSE[batch, head, row]
            # Guard: a row that sees no key has LSE -inf; its P is 0, not exp2(S + inf).
            p = Float32(0.0)
            if lse != -Float32.inf:
                p = cute.math.exp2(dot * softmax_scale_log2 - lse * LOG2_E, fastmath=True)
            # const_expr is resolved while tracing; the inner test runs on the GPU, so they stay apart.
            if const_expr(self.causal):  # noqa: SIM102
                if col > row + causal_offset:
                    p = Float32(0.0)
            mP[batch, head, row, col] = p

    # ---- 3. dS = P ∘ (dO·v − D), one thread per (row, key) ----
    @cute.kernel
    def dscores_kernel(self, mdO: cute.Tensor, mV: cute.Tensor, mDelta: cute.Tensor, mP: cute.Tensor, mdS: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        row, col_block, batch_head = cute.arch.block_idx()
        heads, kv_heads = mdO.shape[1], mV.shape[1]
        batch, head = batch_head // heads, batch_head % heads
        kv_head = head // (heads // kv_heads)
        col = col_block * SCORE_THREADS + tidx
        if col < mV.shape[2]:
            d_p = Float32(0.0)
            for d in cutlass.range(self.head_dim, unroll=8):
                d_p += mdO[batch, head, row, d].to(Float32) * mV[batch, kv_head, col, d].to(Float32)
            mdS[batch, head, row, col] = mP[batch, head, row, col] * (d_p - mDelta[batch, head, row])

    # ---- 4. dQ = softmax_scale · dS K, one thread per element ----
    @cute.kernel
    def dq_kernel(self, mdS: cute.Tensor, mK: cute.Tensor, mdQ: cute.Tensor, softmax_scale: Float32):
        d, _, _ = cute.arch.thread_idx()
        row, batch_head, _ = cute.arch.block_idx()
        heads, kv_heads = mdQ.shape[1], mK.shape[1]
        batch, head = batch_head // heads, batch_head % heads
        kv_head = head // (heads // kv_heads)
        acc = Float32(0.0)
        for col in cutlass.range(mK.shape[2], unroll=4):
            acc += mdS[batch, head, row, col] * mK[batch, kv_head, col, d].to(Float32)
        mdQ[batch, head, row, d] = (acc * softmax_scale).to(mdQ.element_type)

    # ---- 5. dV = Σ Pᵀ dO and dK = softmax_scale · Σ dSᵀ Q over the group's heads, one thread per element ----
    @cute.kernel
    def dkdv_kernel(
        self,
        mQ: cute.Tensor,
        mdO: cute.Tensor,
        mP: cute.Tensor,
        mdS: cute.Tensor,
        mdK: cute.Tensor,
        mdV: cute.Tensor,
        softmax_scale: Float32,
    ):
        d, _, _ = cute.arch.thread_idx()
        col, batch_kv_head, _ = cute.arch.block_idx()
        kv_heads = mdK.shape[1]
        batch, kv_head = batch_kv_head // kv_heads, batch_kv_head % kv_heads
        group = mQ.shape[1] // kv_heads
        acc_dk = Float32(0.0)
        acc_dv = Float32(0.0)
        # GQA: the query heads kv_head · group ... kv_head · group + group − 1 read this KV head.
        for head_in_group in cutlass.range(group, unroll=1):
            head = kv_head * group + head_in_group
            for row in cutlass.range(mQ.shape[2], unroll=4):
                acc_dv += mP[batch, head, row, col] * mdO[batch, head, row, d].to(Float32)
                acc_dk += mdS[batch, head, row, col] * mQ[batch, head, row, d].to(Float32)
        mdK[batch, kv_head, col, d] = (acc_dk * softmax_scale).to(mdK.element_type)
        mdV[batch, kv_head, col, d] = acc_dv.to(mdV.element_type)


# ----------------------------------------------------------------------------------------------
# Host: validate, allocate D, P, dS and the gradients, launch (compiled once per configuration)
# ----------------------------------------------------------------------------------------------
def _fake_arguments(config: NaiveBackwardConfig) -> tuple:
    element = CUTE_DTYPES[config.dtype]
    operands = [fake_tensor(element, 4) for _ in range(5)]
    lse, delta = fake_tensor(Float32, 3), fake_tensor(Float32, 3)
    d_lse = fake_tensor(Float32, 3) if config.has_dlse else None
    scores = [fake_tensor(Float32, 4) for _ in range(2)]
    gradients = [fake_tensor(element, 4) for _ in range(3)]
    return (*operands, lse, d_lse, delta, *scores, *gradients, Float32(1.0), fake_stream())


KERNELS = CompiledKernels(NaiveBackward, _fake_arguments)


def naive_config(problem: Problem, has_dlse: bool = False) -> NaiveBackwardConfig:
    """The compile key of ``problem``'s backward (``has_dlse``: the LSE is differentiated too)."""
    return NaiveBackwardConfig(problem.dtype, problem.head_dim, problem.causal, problem.bottom_right, has_dlse)


def _launch(operands: BackwardOperands, problem: Problem, device: torch.device) -> None:
    """The five launches on ``operands``, with D, P and dS allocated here, on the current stream."""
    scores_shape = (problem.batch, problem.heads, problem.seqlen_q, problem.seqlen_k)
    delta, probs, d_scores = (
        torch.empty(shape, dtype=torch.float32, device=device) for shape in (scores_shape[:3], *[scores_shape] * 2)
    )
    q, k, v, out, d_out, lse, d_lse, dq, dk, dv = operands
    compiled = KERNELS.kernel(naive_config(problem, has_dlse=d_lse is not None))
    compiled(q, k, v, out, d_out, lse, d_lse, delta, probs, d_scores, dq, dk, dv, problem.scale)


def compile_sm90(problem: Problem, has_dlse: bool = False) -> list[KernelBinary]:
    """The five kernels (one binary) compiled for sm_90a at ``problem``'s configuration, without a GPU."""
    return KERNELS.binaries(naive_config(problem, has_dlse), "cute_backward_naive")


# ----------------------------------------------------------------------------------------------
# Capability check
# ----------------------------------------------------------------------------------------------
def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    """A CUDA device of sm_80+, fp16/bf16, D 64 or 128, GQA, both causal alignments and a differentiable
    LSE (no ``cache_seqlens``, no paged cache), a grid within CUDA's limits, and P and dS in free memory."""
    ok, reason = check_common(
        BACKWARD_NAME, problem, device, dtypes=tuple(CUTE_DTYPES), head_dims=HEAD_DIMS,
        min_capability=MIN_COMPUTE_CAPABILITY, features=(GQA, BOTTOM_RIGHT, LSE),
    )  # fmt: skip
    if not ok:
        return ok, reason
    if problem.batch * problem.heads > MAX_GRID_YZ:
        return False, f"batch * heads must be <= {MAX_GRID_YZ} (CUDA grid limit), got {problem.batch * problem.heads}"
    needed = 2 * problem.batch * problem.heads * problem.seqlen_q * problem.seqlen_k * SCORE_BYTES
    free_bytes, _ = torch.cuda.mem_get_info(device)
    if needed > free_bytes:
        return False, f"P and dS need {needed:,} bytes (2·B·H·Sq·Sk·4) but only {free_bytes:,} bytes are free"
    return True, ""


BACKWARD_NAME = "cute/backward/naive"
naive_gradients = cute_gradients(BACKWARD_NAME, supports, _launch)
BACKWARD = Backward(
    name=BACKWARD_NAME,
    gradients=naive_gradients,
    supports=supports,
    compile_sm90=compile_sm90,
    runs_on_cpu=False,
    source_file=__file__,
)
