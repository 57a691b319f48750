"""The device vocabulary of the Triton stack, used by every rung from ``pipelined`` on and the backward rungs.

The names are the ones the CuTe and Gluon stacks use, so that a diff of two rungs teaches:

* ``kv_head`` → :func:`kv_head_index`: GQA, the KV head a query head reads,
  ``head // (heads // kv_heads)`` (K and V are indexed by it, never repeated). :func:`batch_and_head`
  splits a grid index batch · heads + head in int64, :func:`query_heads` adds the KV head. The naive
  rungs (forward and backward) index in int32 and widen at the pointer: :func:`program_heads` reads a
  program's (batch, head, kv_head) off its grid axis and :func:`head_base` points at one (batch,
  head) of a strided tensor.
* ``SeqlenInfo`` → :func:`seqlen_info`: ``(seqlen_k, causal_offset)`` of one sequence. ``seqlen_k``
  is the padded key length, or the sequence's own ``cache_seqlens[batch]`` (clamped to [0, Sk], so a
  bad length cannot read out of bounds); ``causal_offset`` shifts the causal diagonal: row i sees
  keys j <= i + causal_offset, 0 for the top-left alignment and ``seqlen_k - seqlen_q`` for the
  bottom-right one. Every later object takes these two, so no rung special-cases either convention.
* ``BlockRange`` → :func:`block_range`: the key blocks one query tile visits,
  ``(n_block_min, n_block_max, n_masked_blocks)``. Blocks [n_block_min, n_block_max) hold every key
  some row of the tile sees (n_block_max exclusive); the last ``n_masked_blocks`` of them need the
  mask, the blocks before them are seen in full by every row; blocks from n_block_max on are never
  loaded. A tile whose rows see no key (bottom-right, Sq > Sk, or a length of 0) gets an empty range.
  Flash decoding (``decode``) also splits the keys across CTAs: :func:`split_key_range` gives split
  ``split``'s share ``[key_begin, key_end)``, whole BLOCK_N blocks cut from the sequence's own keys;
  :func:`balanced_share` (decode's balanced split) plans on the device how many splits each (batch, KV
  head) takes so that every CTA reads about as many keys, and which one a CTA is (the plan itself,
  :func:`balanced_plan`, is gluon/decode's too); :func:`attended_keys` is where the keys any row of a
  sequence sees end.
* ``PagedKVManager`` → :func:`kv_page_slots`: a paged KV cache (``decode``) keeps K and V in pools of
  ``PAGE_SIZE``-key pages; a sequence's logical key j lives in page ``block_table[b, j // PAGE_SIZE]``,
  slot ``j % PAGE_SIZE``. :func:`attend_key_blocks` looks the page up per key (a key block may span
  pages), and with ``PAGE_SIZE = 0`` (a contiguous cache) it builds exactly the code it did before.
* ``AttentionMask.apply`` → :func:`attention_mask`: S set to -inf where the key lies past the
  sequence (the ragged tail, or the sequence's own length) or, causal, after the query row's
  diagonal (j > i + causal_offset).
* ``OnlineSoftmax`` → :func:`online_softmax_update`, :func:`online_softmax_rescale`,
  :func:`online_softmax_finalize`. ``row_max`` is the running maximum of S · softmax_scale_log2,
  i.e. in log2 units of the scaled scores; ``row_sum`` the running sum of P in the same frame.
  ``update`` takes a new block of S and returns P, the rescale factor ``alpha`` and the new state;
  ``rescale`` moves O to the new maximum; ``finalize`` returns O / row_sum and the LSE (natural log;
  -inf with O = 0 for a row that saw no key), which a rung's epilogue stores when asked (``lse``).
* ``LOG2_E`` (the host folds it into ``softmax_scale_log2 = softmax_scale · LOG2_E``, so the kernels
  use ``exp2``) and ``LN_2`` (the kernels turn the log2-domain LSE into a natural log with it).

The mainloop: :func:`attend_key_blocks` folds a range of key blocks into (acc, row_max, row_sum),
masked or not; :func:`attend_key_range` is the peeled loop of ``pipelined`` and ``decode`` (unmasked
blocks, then masked ones).

Triton inlines every ``@triton.jit`` call, so these functions cost nothing at run time. They are
functions that take and return their state, not objects as in the other stacks: Triton's struct
type (``triton.language.core._aggregate``) is private in both tested releases (3.6 and 3.9).
There is no ``RESCALE_THRESHOLD`` in this stack: every Triton rung rescales O at every key block.

The rungs up to ``tiled`` spell all of this out inline so that each file reads alone, except the
head indexing of :func:`program_heads` and :func:`head_base`, which is no rung's idea.
The backward rungs use this vocabulary too (``triton_impl/backward/``).
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

# softmax_scale_log2 = softmax_scale · LOG2_E: exp(x · scale) = exp2(x · softmax_scale_log2).
LOG2_E = math.log2(math.e)
# Natural log of 2, read inside the kernels (hence a constexpr): lse = log2-domain lse · ln 2.
LN_2 = tl.constexpr(math.log(2.0))


# ----------------------------------------------------------------------------------------------
# kv_head and SeqlenInfo
# ----------------------------------------------------------------------------------------------
@triton.jit
def kv_head_index(head, heads, kv_heads):
    """GQA: the KV head query head ``head`` reads (groups of heads // kv_heads query heads)."""
    return head // (heads // kv_heads)


@triton.jit
def batch_and_head(batch_head, heads):
    """``(batch, head)`` of a grid index ``batch_head`` = batch · heads + head, in int64 (they scale
    strides). With ``kv_heads`` for ``heads`` it splits a (batch, KV head) index the same way."""
    return (batch_head // heads).to(tl.int64), (batch_head % heads).to(tl.int64)


@triton.jit
def longest_first_item(batch_kv_head, kv_heads, CacheSeqlens, batch_size, BLOCK_B: tl.constexpr):
    """``LONGEST_FIRST``: the (batch, KV head) index that grid index ``batch_kv_head`` takes when the grid's items run
    longest sequence first: the same KV head of the (batch_kv_head // kv_heads)-th longest ``cache_seqlens`` entry
    (ties by index; the batches past ``batch_size`` last), the order of gluon/decode's ``_batch_ranks``. Each batch's
    rank is the count of entries before it, a [BLOCK_B, BLOCK_B] comparison in the CTA's registers."""
    offs = tl.arange(0, BLOCK_B)
    lengths = tl.load(CacheSeqlens + offs, mask=offs < batch_size, other=-1)
    longer = lengths[None, :] > lengths[:, None]
    tied_before = (lengths[None, :] == lengths[:, None]) & (offs[None, :] < offs[:, None])
    ranks = tl.sum((longer | tied_before).to(tl.int32), axis=1)
    batch = tl.sum(tl.where(ranks == batch_kv_head // kv_heads, offs, 0), axis=0)
    return batch * kv_heads + batch_kv_head % kv_heads


@triton.jit
def item_offset(batch, head, stride_b, stride_h):
    """``batch · stride_b + head · stride_h`` in int64 whatever the indices' type: the balanced plan's are int32,
    and a K or V of more than 2^31 elements wrapped in int32 (an illegal address on an H200: seed 61's B=32 MHA
    47616-key row, results/h200/decode-int64-plan/)."""
    return batch.to(tl.int64) * stride_b + head.to(tl.int64) * stride_h


@triton.jit
def query_heads(batch_head, heads, kv_heads):
    """``(batch, head, kv_head)`` of a query-head grid index ``batch_head`` = batch · heads + head, in
    int64: :func:`batch_and_head`, then :func:`kv_head_index`."""
    batch, head = batch_and_head(batch_head, heads)
    return batch, head, kv_head_index(head, heads, kv_heads)


@triton.jit
def program_heads(AXIS: tl.constexpr, heads, kv_heads):
    """``(batch_head, batch, head, kv_head)`` of this program, whose axis ``AXIS`` runs over
    batch · heads + head, in int32 (the naive rungs, forward and backward, index their S and P
    buffers by batch_head)."""
    batch_head = tl.program_id(AXIS)
    batch = batch_head // heads
    head = batch_head % heads
    return batch_head, batch, head, kv_head_index(head, heads, kv_heads)


@triton.jit
def head_base(X, batch, head, stride_b, stride_h):
    """(batch, head) of a strided (B, H, S, D) tensor X, offsets in int64 (B·H·S·D may pass 2³¹)."""
    return X + batch.to(tl.int64) * stride_b + head.to(tl.int64) * stride_h


@triton.jit
def seqlen_info(
    CacheSeqlens, batch, seqlen_q, seqlen_k, HAS_CACHE_SEQLENS: tl.constexpr, BOTTOM_RIGHT: tl.constexpr
):  # fmt: skip
    """SeqlenInfo of sequence ``batch``: ``(seqlen_k, causal_offset)``, see the module docstring."""
    if HAS_CACHE_SEQLENS:
        seqlen_k = tl.minimum(tl.maximum(tl.load(CacheSeqlens + batch), 0), seqlen_k)
    causal_offset = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0
    return seqlen_k, causal_offset


@triton.jit
def attended_keys(seqlen_k, causal_offset, seqlen_q, CAUSAL: tl.constexpr):
    """The end of the keys any packed row sees (the length; causal: at most Sq + causal_offset); a
    scalar for one sequence or a vector of them (the balanced split's plan)."""
    return tl.maximum(tl.minimum(seqlen_k, seqlen_q + causal_offset), 0) if CAUSAL else seqlen_k


# ----------------------------------------------------------------------------------------------
# BlockRange
# ----------------------------------------------------------------------------------------------
@triton.jit
def block_range(
    m_block, seqlen_k, causal_offset, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):  # fmt: skip
    """BlockRange of query tile ``m_block``: ``(n_block_min, n_block_max, n_masked_blocks)``."""
    start_m = m_block * BLOCK_M
    if CAUSAL:
        # Row i sees keys j <= i + causal_offset. Block n is seen in full by every row of the tile
        # when its last key (n + 1) · BLOCK_N - 1 <= start_m + causal_offset; the tile's last row
        # bounds the blocks worth loading. Clamped at 0: rows before the diagonal see no key.
        n_unmasked = tl.maximum(tl.minimum(seqlen_k, start_m + causal_offset + 1), 0) // BLOCK_N
        last_key_end = tl.maximum(tl.minimum(start_m + BLOCK_M + causal_offset, seqlen_k), 0)
        n_block_max = (last_key_end + BLOCK_N - 1) // BLOCK_N
    else:
        # Only the ragged last block (Sk not a multiple of BLOCK_N) needs the mask.
        n_unmasked = seqlen_k // BLOCK_N
        n_block_max = (seqlen_k + BLOCK_N - 1) // BLOCK_N
    return 0, n_block_max, n_block_max - n_unmasked


@triton.jit
def split_key_range(split, num_splits, key_end, BLOCK_N: tl.constexpr):
    """Split ``split`` of ``num_splits`` over keys [0, key_end): ``(key_begin, key_end)`` of this split.
    Each split gets cdiv(n_blocks, num_splits) whole key blocks from a block boundary, so a short
    sequence gets short splits; the splits past its last block get an empty range (begin >= end)."""
    n_blocks = (key_end + BLOCK_N - 1) // BLOCK_N
    blocks_per_split = (n_blocks + num_splits - 1) // num_splits
    split_begin = tl.minimum(split * blocks_per_split * BLOCK_N, key_end)
    split_end = tl.minimum(split_begin + blocks_per_split * BLOCK_N, key_end)
    return split_begin, split_end


@triton.jit
def item_shares_of(blocks, chunk):
    """Shares of a work item of ``blocks`` key blocks in the balanced split: cdiv(blocks, chunk), at least
    1 (an empty sequence's one share writes O = 0 and LSE = -inf)."""
    return tl.maximum((blocks + chunk - 1) // chunk, 1)


@triton.jit
def capped_item_shares(blocks, chunk, max_item_shares):
    """:func:`item_shares_of`, at most ``max_item_shares`` (``splits.py``'s "item-share cap"; the host passes
    ``splits.NO_ITEM_SHARE_CAP`` for none): an item of more shares cuts its blocks into that many larger ones,
    so its merge reads fewer partials."""
    return tl.minimum(item_shares_of(blocks, chunk), max_item_shares)


@triton.jit
def balanced_share(
    CacheSeqlens, share, batch_size, kv_heads, seqlen_q, seqlen_k, target_shares, min_share_blocks,
    max_item_shares, CAUSAL: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, HAS_CACHE_SEQLENS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr,
):  # fmt: skip
    """The work of CTA ``share`` of the balanced grid: ``(batch, kv_head, split, item_shares, has_work)``
    (:func:`balanced_plan`, at most ``max_item_shares`` shares an item) from the cache lengths, BLOCK_B >=
    batch_size of them in one load."""
    offs_b = tl.arange(0, BLOCK_B)
    in_batch = offs_b < batch_size
    if HAS_CACHE_SEQLENS:
        lengths = tl.minimum(tl.maximum(tl.load(CacheSeqlens + offs_b, mask=in_batch, other=0), 0), seqlen_k)
    else:
        lengths = tl.where(in_batch, seqlen_k, 0)
    sizes = (batch_size, kv_heads, seqlen_q, target_shares, min_share_blocks, max_item_shares)
    return balanced_plan(lengths, offs_b, share, sizes, CAUSAL=CAUSAL, BOTTOM_RIGHT=BOTTOM_RIGHT, BLOCK_N=BLOCK_N)


@triton.jit
def balanced_plan(
    lengths, offs_b, share, sizes, CAUSAL: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, BLOCK_N: tl.constexpr
):  # fmt: skip
    """The balanced split's plan for CTA ``share``: ``(batch, kv_head, split, item_shares, has_work)``,
    split ``split`` of the ``item_shares`` of work item (batch, kv_head), whose shares are consecutive
    CTAs of the grid (from ``share - split`` on). A CTA past the last share gets ``has_work`` False and
    split 1 of 1 of item (0, 0), which :func:`split_key_range` makes an empty range. Both stacks run it
    (gluon/decode through its ``balanced_share``, which loads ``lengths`` in a layout): no op here
    makes a tensor of its own, so it compiles as Gluon too.

    Every CTA computes the same plan from the cache lengths (``offs_b`` their indices, 0 past the batch):
    the key blocks each sequence's rows see, their total over the B · Hkv work items, the share size
    ``chunk`` = that total / ``target_shares`` blocks (at least ``min_share_blocks``), each item's share
    count (:func:`item_shares_of`), and their prefix sum over the sequences, items in (batch, KV head)
    order. The share's sequence is the count of sequences whose shares end at or before it (the binary
    search of a host plan, as one vector compare). Σ items' shares <= target_shares + B · Hkv, the grid
    the host launches. ``max_item_shares`` (the last of ``sizes``) caps an item's share count
    (:func:`capped_item_shares`); fewer shares keep that bound."""
    batch_size, kv_heads, seqlen_q, target_shares, min_share_blocks, max_item_shares = sizes
    in_batch = offs_b < batch_size
    causal_offsets = lengths - seqlen_q if BOTTOM_RIGHT else lengths * 0
    blocks = (attended_keys(lengths, causal_offsets, seqlen_q, CAUSAL) + BLOCK_N - 1) // BLOCK_N
    total_blocks = kv_heads * tl.sum(blocks, axis=0)
    chunk = tl.maximum((total_blocks + target_shares - 1) // target_shares, min_share_blocks)
    batch_shares = tl.where(in_batch, kv_heads * capped_item_shares(blocks, chunk, max_item_shares), 0)
    batch = tl.sum((tl.cumsum(batch_shares, axis=0) <= share).to(tl.int32), axis=0)
    has_work = batch < batch_size
    local = share - tl.sum(tl.where(offs_b < batch, batch_shares, 0), axis=0)
    item_shares = tl.where(has_work, tl.sum(tl.where(offs_b == batch, batch_shares, 0), axis=0) // kv_heads, 1)
    kv_head = tl.where(has_work, local // item_shares, 0)
    split = tl.where(has_work, local % item_shares, 1)
    return tl.where(has_work, batch, 0), kv_head, split, item_shares, has_work


# ----------------------------------------------------------------------------------------------
# PagedKV
# ----------------------------------------------------------------------------------------------
@triton.jit
def kv_page_slots(offs_k, block_table_row, seqlen_k, PAGE_SIZE: tl.constexpr, MASKED: tl.constexpr):
    """PagedKV: ``(page, slot)`` of one sequence's logical keys ``offs_k`` (a vector): page =
    ``block_table_row[j // PAGE_SIZE]`` (int64, as it scales the page stride), slot = ``j % PAGE_SIZE``.
    ``MASKED``: keys past ``seqlen_k`` read no table entry (theirs may be anything, even past the
    table's row) and get page 0; their K and V loads are masked too."""
    if MASKED:
        page = tl.load(block_table_row + offs_k // PAGE_SIZE, mask=offs_k < seqlen_k, other=0)
    else:
        page = tl.load(block_table_row + offs_k // PAGE_SIZE)
    return page.to(tl.int64), offs_k % PAGE_SIZE


@triton.jit
def kv_block_rows(
    n_start, offs_n, block_table_row, seqlen_k, stride_kpage, stride_kn, stride_vpage, stride_vn,
    PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """PagedKV by span (decode's ``PAGED_SPAN_LOOKUP``): the row offsets ``(k_rows, v_rows)`` of the key block
    from ``n_start`` (a multiple of BLOCK_N, below ``seqlen_k``) when BLOCK_N divides PAGE_SIZE or PAGE_SIZE
    divides BLOCK_N, reading one table entry per page the block spans rather than one per key. A page of
    PAGE_SIZE >= BLOCK_N holds the whole block: one scalar entry, and the rows are the contiguous block's from
    that page's slot ``n_start % PAGE_SIZE`` on. A smaller page: BLOCK_N / PAGE_SIZE scalar entries, key k taking
    entry ``k // PAGE_SIZE``'s page base; ``MASKED``: an entry whose first key is at or past ``seqlen_k`` is not
    read (page 0; those keys' loads are masked)."""
    if PAGE_SIZE >= BLOCK_N:
        page = tl.load(block_table_row + n_start // PAGE_SIZE).to(tl.int64)
        slot = n_start % PAGE_SIZE + offs_n
        return page * stride_kpage + slot * stride_kn, page * stride_vpage + slot * stride_vn
    else:
        first_entry = n_start // PAGE_SIZE
        span = offs_n // PAGE_SIZE
        pages = tl.zeros([BLOCK_N], dtype=tl.int32)
        for j in tl.static_range(BLOCK_N // PAGE_SIZE):
            if MASKED:
                page = tl.load(block_table_row + first_entry + j, mask=n_start + j * PAGE_SIZE < seqlen_k, other=0)
            else:
                page = tl.load(block_table_row + first_entry + j)
            pages = tl.where(span == j, page, pages)
        pages = pages.to(tl.int64)
        slot = offs_n % PAGE_SIZE
        return pages * stride_kpage + slot * stride_kn, pages * stride_vpage + slot * stride_vn


# ----------------------------------------------------------------------------------------------
# AttentionMask
# ----------------------------------------------------------------------------------------------
@triton.jit
def attention_mask(S, offs_m, offs_n, seqlen_k, causal_offset, CAUSAL: tl.constexpr):
    """AttentionMask.apply: S (BLOCK_M × BLOCK_N, query rows ``offs_m``, keys ``offs_n``) with -inf
    where the key is past ``seqlen_k`` or, causal, after the query row's diagonal (j > i +
    causal_offset). Apply it to scaled scores: scaling after it would give -inf · 0 = NaN for
    softmax_scale = 0."""
    visible = (offs_n < seqlen_k)[None, :]
    if CAUSAL:
        visible = visible & (offs_n[None, :] <= offs_m[:, None] + causal_offset)
    return tl.where(visible, S, float("-inf"))


# ----------------------------------------------------------------------------------------------
# OnlineSoftmax
# ----------------------------------------------------------------------------------------------
@triton.jit
def online_softmax_update(
    S, row_max, row_sum, softmax_scale_log2,
    S_SCALED: tl.constexpr, MASKED: tl.constexpr, P_EXPONENT: tl.constexpr = 0.0,
):  # fmt: skip
    """OnlineSoftmax.update with one block of scores: ``(P, alpha, row_max, row_sum)``.

    row_max_new = max(row_max, rowmax(S · scale)); P = exp2(S · scale - row_max_new + P_EXPONENT);
    alpha = exp2(row_max - row_max_new), the factor that rescales O and row_sum to the new maximum.

    ``S_SCALED``: S arrives as S · softmax_scale_log2 (masked blocks, and rungs that accept any sign
    of the scale). Otherwise S arrives unscaled and the scale must be >= 0: it then commutes with the
    row maximum, so the maximum is scaled once per row and P's exponent is one FMA per score.
    ``MASKED``: a row may have seen no visible key yet (row_max -inf); it subtracts 0 instead, so
    exp2(-inf) gives P = 0 and alpha = 0, not exp2(-inf - -inf) = NaN.
    ``P_EXPONENT`` > 0 (fp8) lifts P by a constant factor that cancels in O / row_sum.
    """
    if S_SCALED:
        row_max_new = tl.maximum(row_max, tl.max(S, 1))
    else:
        row_max_new = tl.maximum(row_max, tl.max(S, 1) * softmax_scale_log2)
    row_max_base = tl.where(row_max_new == float("-inf"), 0.0, row_max_new) if MASKED else row_max_new
    if S_SCALED:
        P = tl.math.exp2(S - (row_max_base - P_EXPONENT)[:, None])
    else:
        P = tl.math.exp2(S * softmax_scale_log2 - (row_max_base - P_EXPONENT)[:, None])
    alpha = tl.math.exp2(row_max - row_max_base)
    row_sum = row_sum * alpha + tl.sum(P, 1)
    return P, alpha, row_max_new, row_sum


@triton.jit
def online_softmax_rescale(acc, alpha):
    """OnlineSoftmax.rescale: O accumulated under the old row maximum, moved to the new one."""
    return acc * alpha[:, None]


@triton.jit
def online_softmax_finalize(acc, row_max, row_sum, out_scale, P_EXPONENT: tl.constexpr = 0.0):
    """OnlineSoftmax.finalize: ``(O, lse)`` with O = acc · out_scale / row_sum and the natural-log
    lse = (row_max + log2(row_sum) - P_EXPONENT) · ln 2. A row that saw no key (only rows past Sq)
    gets O = 0 and lse = -inf instead of 0 / 0."""
    has_keys = row_sum > 0.0
    out = acc * tl.where(has_keys, out_scale / row_sum, 0.0)[:, None]
    lse = tl.where(has_keys, (row_max + tl.math.log2(row_sum) - P_EXPONENT) * LN_2, float("-inf"))
    return out, lse


# ----------------------------------------------------------------------------------------------
# The FlashAttention step over a range of keys (strided pointers, ``pipelined``)
# ----------------------------------------------------------------------------------------------
@triton.jit
def attend_key_blocks(
    acc, row_max, row_sum, q,
    k_base, v_base, stride_kn, stride_vn,
    offs_m, key_begin, key_end, seqlen_k, causal_offset, softmax_scale_log2,
    CAUSAL: tl.constexpr, MASKED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    block_table_row=None, stride_kpage=0, stride_vpage=0, PAGE_SIZE: tl.constexpr = 0,
    PAGE_SPANS: tl.constexpr = False, mask_from=0, MASK_FROM: tl.constexpr = False,
):  # fmt: skip
    """Fold the keys [key_begin, key_end), BLOCK_N at a time from a block boundary, into (acc, row_max,
    row_sum) of one query tile: S = Q Kᵀ → mask → online softmax → rescale O → O += P V.

    ``MASKED=False`` is the hot loop: every key in range is visible, so loads are unmasked and the
    softmax needs no -inf guard. ``MASKED=True`` handles the sequence tail and the causal diagonal
    (``seqlen_k`` and ``causal_offset`` from :func:`seqlen_info`); with ``MASK_FROM`` it masks S only in the blocks
    from key ``mask_from`` on (the loads and the guard stay masked), so one pipelined loop walks a whole range.
    S is scaled before the maximum, so any sign of the softmax scale works.

    ``PAGE_SIZE`` > 0: K and V are page pools; ``k_base`` and ``v_base`` point at this KV head in page
    0, key j of the sequence is row ``page · stride_kpage + slot · stride_kn`` with (page, slot) from
    :func:`kv_page_slots` on ``block_table_row``, this sequence's row of the block table; ``PAGE_SPANS`` (the
    caller's promise: PAGE_SIZE > 0, BLOCK_N and PAGE_SIZE dividing one another, and ``key_begin`` a multiple of
    BLOCK_N): one table entry per page the block spans instead (:func:`kv_block_rows`).
    """
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for n_start in tl.range(key_begin, key_end, BLOCK_N):
        offs_k = n_start + offs_n
        if PAGE_SPANS:
            k_rows, v_rows = kv_block_rows(
                n_start, offs_n, block_table_row, seqlen_k, stride_kpage, stride_kn, stride_vpage, stride_vn,
                PAGE_SIZE, BLOCK_N, MASKED,
            )  # fmt: skip
            k_ptrs = k_base + k_rows[None, :] + offs_d[:, None]
            v_ptrs = v_base + v_rows[:, None] + offs_d[None, :]
        elif PAGE_SIZE:
            page, slot = kv_page_slots(offs_k, block_table_row, seqlen_k, PAGE_SIZE, MASKED)
            k_ptrs = k_base + (page * stride_kpage + slot * stride_kn)[None, :] + offs_d[:, None]
            v_ptrs = v_base + (page * stride_vpage + slot * stride_vn)[:, None] + offs_d[None, :]
        else:
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
        S = tl.dot(q, k_t) * softmax_scale_log2
        if MASK_FROM:
            if n_start + BLOCK_N > mask_from:
                S = attention_mask(S, offs_m, offs_k, seqlen_k, causal_offset, CAUSAL)
        elif MASKED:
            S = attention_mask(S, offs_m, offs_k, seqlen_k, causal_offset, CAUSAL)
        P, alpha, row_max, row_sum = online_softmax_update(S, row_max, row_sum, softmax_scale_log2, True, MASKED)
        # O += P V with P in the input dtype, onto O rescaled to the new maximum.
        acc = tl.dot(P.to(v.dtype), v, online_softmax_rescale(acc, alpha))
    return acc, row_max, row_sum


@triton.jit
def attend_key_range(
    acc, row_max, row_sum, q,
    k_base, v_base, stride_kn, stride_vn,
    offs_m, key_begin, unmasked_end, key_end, seqlen_k, causal_offset, softmax_scale_log2,
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    block_table_row=None, stride_kpage=0, stride_vpage=0, PAGE_SIZE: tl.constexpr = 0,
    PAGE_SPANS: tl.constexpr = False, ONE_LOOP: tl.constexpr = False,
):  # fmt: skip
    """The peeled mainloop of ``pipelined`` and ``decode`` over keys [key_begin, key_end): first the
    blocks before ``unmasked_end``, which every row of the tile sees in full (no mask: the hot loop),
    then the rest, masked (the sequence tail and the causal diagonal). Arguments as in
    :func:`attend_key_blocks`. ``ONE_LOOP``: one masked loop over the whole range, S masked from ``unmasked_end``
    on (``MASK_FROM``): one pipeline to fill and drain, not two, for a split of few blocks."""
    if ONE_LOOP:
        return attend_key_blocks(
            acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_vn,
            offs_m, key_begin, key_end, seqlen_k, causal_offset, softmax_scale_log2,
            CAUSAL=CAUSAL, MASKED=True, HEAD_DIM=HEAD_DIM, BLOCK_N=BLOCK_N,
            block_table_row=block_table_row, stride_kpage=stride_kpage, stride_vpage=stride_vpage,
            PAGE_SIZE=PAGE_SIZE, PAGE_SPANS=PAGE_SPANS, mask_from=unmasked_end, MASK_FROM=True,
        )  # fmt: skip
    acc, row_max, row_sum = attend_key_blocks(
        acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_vn,
        offs_m, key_begin, unmasked_end, seqlen_k, causal_offset, softmax_scale_log2,
        CAUSAL=CAUSAL, MASKED=False, HEAD_DIM=HEAD_DIM, BLOCK_N=BLOCK_N,
        block_table_row=block_table_row, stride_kpage=stride_kpage, stride_vpage=stride_vpage, PAGE_SIZE=PAGE_SIZE,
        PAGE_SPANS=PAGE_SPANS,
    )  # fmt: skip
    return attend_key_blocks(
        acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_vn,
        offs_m, unmasked_end, key_end, seqlen_k, causal_offset, softmax_scale_log2,
        CAUSAL=CAUSAL, MASKED=True, HEAD_DIM=HEAD_DIM, BLOCK_N=BLOCK_N,
        block_table_row=block_table_row, stride_kpage=stride_kpage, stride_vpage=stride_vpage, PAGE_SIZE=PAGE_SIZE,
        PAGE_SPANS=PAGE_SPANS,
    )  # fmt: skip
