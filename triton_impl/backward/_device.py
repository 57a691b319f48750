"""Device code the two Triton backward rungs share (``naive.py`` and ``tiled.py``): D, the row statistic
of the softmax's backward, which both compute the same way before their score kernels run."""

from __future__ import annotations

import triton
import triton.language as tl

from triton_impl._device import batch_and_head


@triton.jit
def softmax_delta(
    Out, DOut, DLse, o_strides, do_strides, batch_head, heads, m_block, seqlen_q,
    WORK: tl.constexpr, HAS_DLSE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    """D = rowsum(dO ∘ O) − dLSE of the query rows [m_block · BLOCK_M, + BLOCK_M) of ``batch_head`` =
    batch · heads + head, in ``WORK`` precision: ``(delta, rows, row_ok)``, with ``rows`` the rows'
    offsets in the contiguous (B, H, Sq) statistics (LSE, D) and ``row_ok`` the rows inside Sq.
    ``o_strides`` and ``do_strides`` are the (batch, head, row) strides of O and dO. D is the softmax's
    Jacobian contracted with dP, as rowsum(P ∘ dP) = rowsum(dO ∘ O); dLSE enters only here."""
    batch, head = batch_and_head(batch_head, heads)
    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seqlen_q

    o_ptrs = Out + batch * o_strides[0] + head * o_strides[1] + offs_m[:, None] * o_strides[2] + offs_d[None, :]
    o = tl.load(o_ptrs, mask=row_ok[:, None], other=0.0)
    do_ptrs = DOut + batch * do_strides[0] + head * do_strides[1] + offs_m[:, None] * do_strides[2] + offs_d[None, :]
    d_o = tl.load(do_ptrs, mask=row_ok[:, None], other=0.0)
    delta = tl.sum(o.to(WORK) * d_o.to(WORK), axis=1)
    rows = batch_head.to(tl.int64) * seqlen_q + offs_m
    if HAS_DLSE:
        delta -= tl.load(DLse + rows, mask=row_ok, other=0.0).to(WORK)
    return delta, rows, row_ok
