"""Device helpers shared by the Triton rungs from ``pipelined`` on: key-block ranges and the
FlashAttention step (S = Q Kᵀ → mask → online softmax → rescale O → O += P V).

The rungs up to ``tiled`` spell all of this out inline so that each file reads alone; from
``pipelined`` on the kernel only orchestrates, and the step lives here.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def key_block_range(m_block, seqlen_k, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(full_end, n_end) for query tile ``m_block``: keys [0, full_end) are visible to every row of
    the tile (no mask needed), keys [full_end, n_end) need the mask, keys from n_end on are masked
    for every row and never loaded. full_end is a multiple of BLOCK_N."""
    if CAUSAL:
        # Row i sees keys j <= i: the tile's first row bounds the unmasked blocks, its last row
        # bounds the blocks worth loading at all.
        first_row = m_block * BLOCK_M
        n_end = tl.minimum(seqlen_k, first_row + BLOCK_M)
        full_end = tl.minimum(seqlen_k, first_row + 1) // BLOCK_N * BLOCK_N
    else:
        n_end = seqlen_k
        full_end = seqlen_k // BLOCK_N * BLOCK_N
    return full_end, n_end


@triton.jit
def attend_key_blocks(
    acc, row_max, row_sum, q,
    k_base, v_base, stride_kn, stride_vn,
    offs_m, n_begin, n_end, seqlen_k, softmax_scale_log2,
    CAUSAL: tl.constexpr, MASKED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Fold key blocks [n_begin, n_end) into (acc, row_max, row_sum) of one query tile.

    ``MASKED=False`` is the hot loop: every key in range is visible, so loads are unmasked and the
    softmax needs no -inf guard. ``MASKED=True`` handles the sequence tail and the causal diagonal.
    """
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for n_start in tl.range(n_begin, n_end, BLOCK_N):
        offs_k = n_start + offs_n
        k_ptrs = k_base + offs_k[None, :] * stride_kn + offs_d[:, None]
        v_ptrs = v_base + offs_k[:, None] * stride_vn + offs_d[None, :]
        if MASKED:
            col_ok = offs_k < seqlen_k
            k_t = tl.load(k_ptrs, mask=col_ok[None, :], other=0.0)
            v = tl.load(v_ptrs, mask=col_ok[:, None], other=0.0)
        else:
            k_t = tl.load(k_ptrs)
            v = tl.load(v_ptrs)

        # S = Q Kᵀ on tensor cores, in the log2 domain.
        scores = tl.dot(q, k_t) * softmax_scale_log2
        if MASKED:
            visible = col_ok[None, :]
            if CAUSAL:
                visible = visible & (offs_k[None, :] <= offs_m[:, None])
            scores = tl.where(visible, scores, float("-inf"))

        # Online softmax. In masked blocks a row may have seen no visible key yet (max -inf):
        # shifting by 0 then gives P = 0 and alpha = 0 instead of exp2(-inf - -inf) = NaN.
        new_max = tl.maximum(row_max, tl.max(scores, axis=1))
        shift = tl.where(new_max == float("-inf"), 0.0, new_max) if MASKED else new_max
        p = tl.exp2(scores - shift[:, None])
        alpha = tl.exp2(row_max - shift)

        # Rescale what was accumulated under the old max, then O += P V with P in the input dtype.
        row_sum = row_sum * alpha + tl.sum(p, axis=1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        row_max = new_max
    return acc, row_max, row_sum
