"""The device vocabulary of the Gluon stack, shared by ``gluon/hopper`` (and ``gluon/fp8``, which runs its
kernel) and ``gluon/decode``; the kernels themselves are in their rung files.

The softmax side uses the names of the Triton stack (``triton_impl/_device.py``) and the CuTe stack
(``cute_impl/_hopper_device.py``), as ``@gluon.jit`` functions (Gluon inlines them):

* ``kv_head`` → :func:`kv_head_index`: GQA, the KV head a query head reads,
  ``head // (heads // kv_heads)``; the K and V TMA coordinates (and FP8's K/V scales) use it, so
  K and V are never repeated.
* ``SeqlenInfo`` → :func:`seqlen_info`: ``(seqlen_k, causal_offset)`` of one sequence: the padded
  Sk or the sequence's own ``cache_seqlens[batch]`` (clamped to [0, Sk]), and the shift of the
  causal diagonal (row i sees keys j <= i + causal_offset: 0 top-left, seqlen_k - Sq bottom-right).
* ``BlockRange`` → :func:`block_range`: ``(n_block_min, n_block_max, n_masked_blocks)``, blocks
  [n_block_min, n_block_max) of which the top ``n_masked_blocks`` need the mask.
* ``split_key_range`` → :func:`split_key_range` (split-KV): one split's [key_begin, key_end) of whole
  key blocks, the Triton stack's rule.
* ``balanced_share`` → :func:`balanced_share` (decode's balanced split): the cache lengths loaded in a
  layout, then the Triton stack's own ``balanced_plan`` (it makes no tensor of its own, so it compiles as
  Gluon): which (batch, KV head) and split a CTA of the balanced grid takes.
* ``AttentionMask.apply`` → :func:`attention_mask`: -inf past the sequence's seqlen_k and, causal,
  after the query row's diagonal (j > i + causal_offset); :func:`transposed_mask` is its transpose for
  the backward's Pᵀ (keys as rows, 0 after the exp).
* ``OnlineSoftmax`` → :func:`online_softmax_update`, :func:`online_softmax_rescale`,
  :func:`online_softmax_finalize`; ``row_max`` is the maximum of S · softmax_scale_log2 (log2 units
  of the scaled scores), ``row_sum`` the sum of P in the same frame. ``P_EXPONENT`` (update and
  finalize, as in the Triton stack) is the lift of P that gluon/fp8 passes (``fp8.P_EXPONENT``).
* ``LOG2_E`` and ``LN_2`` are the Triton stack's (``triton_impl/_device.py``): the host folds
  LOG2_E into softmax_scale_log2, the epilogue turns the LSE into a natural log with LN_2. There
  is no ``RESCALE_THRESHOLD``: as in the Triton stack, O is rescaled at every key block.

The wgmma side, one warpgroup's view of a K/V ring and its two GEMMs: :func:`_ready_tile` (a ring
slot once its TMA copy has landed), :func:`_scores` (issue S = Q Kᵀ), :func:`_values_product` (issue
O += P V with P from registers), and P carried between steps as packed 32-bit words made by inline
``cvt`` PTX (:func:`_operand_p` / :func:`_packed_pairs`; gluon/fp8's e4m3 words are
``fp8.packed_words``), written only after the P V wgmma reading the previous words has retired: left
to Triton, fp16/bf16 P cost a PRMT per word under Triton 3.6's ptxas, and a P written under a running
wgmma makes ptxas serialise every wgmma of the kernel. Also here: the TMA and barrier names of the
installed Triton release (``_tma_load``, ``_tma_store``, ``_partition_barrier``) and ``_as_box``.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
)

from triton_impl._device import LN_2, balanced_plan

# The row reductions fold the in-thread columns of a key block down to the 8 of one wgmma accumulator
# group (2 registers x 4 lanes), which gl.max / gl.sum finish: at most 4 levels, for 128 keys.
TREE_WIDTH = gl.constexpr(8)
TREE_LEVELS = gl.constexpr(4)

# Triton 3.9 renamed the TMA copies (async_copy_global_to_shared -> async_load,
# async_copy_shared_to_global -> async_store); the old names still exist there but raise.
if hasattr(tma, "async_load"):
    _tma_load = tma.async_load
    _tma_store = tma.async_store
else:
    _tma_load = tma.async_copy_global_to_shared
    _tma_store = tma.async_copy_shared_to_global
# and gl.thread_barrier -> gl.barrier (a bar.sync over the warps of the calling partition).
_partition_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier


@gluon.jit
def _as_box(tile):
    """A (rows, D) shared tile seen as the descriptors' (1, 1, rows, D) box of one (batch, head)."""
    return tile.reshape([1, 1, tile.shape[0], tile.shape[1]])


# The CTAs of one wave on an H100 or H200 (SXM), and the doublings that reach it from one item: heaviest_first's
# group size (elsewhere only sized for another wave, never wrong).
WAVE_CTAS = gl.constexpr(132)
WAVE_DOUBLINGS = gl.constexpr(WAVE_CTAS.value.bit_length())


@gluon.jit
def heaviest_first(block, item, blocks, items):
    """The (block, item) that the program (``block``, ``item``) of a (blocks, items) grid takes, so that the
    launch order, block fastest, becomes block-major within groups of items (the power of two of them that
    first fills a wave): the CuTe backward's ``heaviest_first`` (its docstring: why, and the schedule's
    numbers), for a grid whose second axis is the (batch, head) item."""
    needed = (WAVE_CTAS + blocks - 1) // blocks
    items_per_group = blocks * 0 + 1  # 1, as a scalar of blocks' type (the loop reassigns it)
    for _ in gl.static_range(WAVE_DOUBLINGS):  # doubled while short of a wave
        items_per_group = gl.where(items_per_group < needed, 2 * items_per_group, items_per_group)
    linear = block + blocks * item
    first = linear // (items_per_group * blocks) * items_per_group
    size = gl.minimum(items_per_group, items - first)  # the last group may be smaller
    within = linear - first * blocks
    block = within // size
    return block, first + within - block * size


# ----------------------------------------------------------------------------------------------
# kv_head and SeqlenInfo
# ----------------------------------------------------------------------------------------------
@gluon.jit
def kv_head_index(head, heads, kv_heads):
    """GQA: the KV head query head ``head`` reads (groups of heads // kv_heads query heads)."""
    return head // (heads // kv_heads)


@gluon.jit
def seqlen_info(
    CacheSeqlens, batch, seqlen_q, seqlen_k, HAS_CACHE_SEQLENS: gl.constexpr, BOTTOM_RIGHT: gl.constexpr
):  # fmt: skip
    """SeqlenInfo of sequence ``batch``: ``(seqlen_k, causal_offset)``, see the module docstring."""
    if HAS_CACHE_SEQLENS:
        # Clamped, so that a bad length cannot make the load warp read past the padded cache.
        seqlen_k = gl.minimum(gl.maximum(gl.load(CacheSeqlens + batch), 0), seqlen_k)
    causal_offset = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0
    return seqlen_k, causal_offset


# ----------------------------------------------------------------------------------------------
# BlockRange
# ----------------------------------------------------------------------------------------------
@gluon.jit
def block_range(
    start_m,
    seqlen_k,
    causal_offset,
    CAUSAL: gl.constexpr,
    BOTTOM_RIGHT: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
):
    """BlockRange of the BLOCK_M query rows from ``start_m``: ``(n_block_min, n_block_max, n_masked_blocks)``.

    Takes the first row rather than Triton's ``m_block``: a consumer's rows start at the CTA's
    ``start_m`` plus its own offset. ``BOTTOM_RIGHT``: ``causal_offset`` may be negative, so rows
    may see no key and the counts are clamped at 0 (an empty range); top-left needs no clamp."""
    n_full = seqlen_k // BLOCK_N
    if CAUSAL:
        # Row i sees keys j <= i + causal_offset. Block n is unmasked for every row when its last key
        # (n + 1) · BLOCK_N - 1 <= start_m + causal_offset; the last row bounds the blocks to load.
        first_row_keys = start_m + causal_offset + 1
        last_key_end = gl.minimum(start_m + BLOCK_M + causal_offset, seqlen_k)
        if BOTTOM_RIGHT:
            first_row_keys = gl.maximum(first_row_keys, 0)
            last_key_end = gl.maximum(last_key_end, 0)
        n_unmasked = gl.minimum(first_row_keys // BLOCK_N, n_full)
        n_block_max = (last_key_end + BLOCK_N - 1) // BLOCK_N
    else:
        n_unmasked = n_full
        n_block_max = (seqlen_k + BLOCK_N - 1) // BLOCK_N
    return 0, n_block_max, n_block_max - n_unmasked


@gluon.jit
def query_blocks(n_start, seqlen_q, seqlen_k, causal_offset, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr):  # fmt: skip
    """The backward's BlockRange over query blocks (gluon/backward/hopper's dK/dV kernel): the query blocks of
    one query head that the keys [n_start, n_start + BLOCK_N) receive gradient from: ``(first_block, blocks,
    masked_blocks)``. Causal: rows i < n_start − causal_offset see none of these keys and are skipped; the
    blocks up to the last key's diagonal are masked. A key block holding the key tail masks every block (its
    keys past Sk get P = 0)."""
    end_block = (seqlen_q + BLOCK_M - 1) // BLOCK_M
    first_block = 0
    unmasked_from = 0
    if CAUSAL:
        first_block = gl.minimum(gl.maximum(n_start - causal_offset, 0) // BLOCK_M, end_block)
        diagonal_end = gl.maximum(n_start + BLOCK_N - 1 - causal_offset, 0)
        unmasked_from = gl.maximum((diagonal_end + BLOCK_M - 1) // BLOCK_M, first_block)
    unmasked_from = gl.minimum(gl.where(n_start + BLOCK_N > seqlen_k, end_block, unmasked_from), end_block)
    return first_block, end_block - first_block, unmasked_from - first_block


@gluon.jit
def split_key_range(split, num_splits, key_end, BLOCK_N: gl.constexpr):
    """Split-KV (``gluon/decode``): ``(key_begin, key_end)`` of split ``split`` of ``num_splits`` over
    keys [0, key_end), the Triton stack's rule: cdiv(n_blocks, num_splits) whole key blocks each from a
    block boundary, so a short sequence gets short splits and the splits past its last block an empty
    range (begin == end)."""
    n_blocks = (key_end + BLOCK_N - 1) // BLOCK_N
    blocks_per_split = (n_blocks + num_splits - 1) // num_splits
    split_begin = gl.minimum(split * blocks_per_split * BLOCK_N, key_end)
    split_end = gl.minimum(split_begin + blocks_per_split * BLOCK_N, key_end)
    return split_begin, split_end


@gluon.jit
def balanced_share(
    CacheSeqlens, share, sizes, seqlen_k, CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr,
    HAS_CACHE_SEQLENS: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_B: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    """The balanced split (``gluon/decode``): the work of CTA ``share``, ``(batch, kv_head, split,
    item_shares, has_work)``, by the Triton stack's own ``balanced_plan`` on the cache lengths, loaded
    here in a layout over the CTA's warps (BLOCK_B >= batch size of them). ``sizes``: (batch size, Hkv,
    Sq, target shares, the fewest key blocks a share takes, the most shares an item takes)."""
    offs_b = gl.arange(0, BLOCK_B, layout=gl.BlockedLayout([1], [32], [num_warps], [0]))
    in_batch = offs_b < sizes[0]
    if HAS_CACHE_SEQLENS:
        lengths = gl.minimum(gl.maximum(gl.load(CacheSeqlens + offs_b, mask=in_batch, other=0), 0), seqlen_k)
    else:
        lengths = gl.where(in_batch, seqlen_k, 0)
    return balanced_plan(lengths, offs_b, share, sizes, CAUSAL=CAUSAL, BOTTOM_RIGHT=BOTTOM_RIGHT, BLOCK_N=BLOCK_N)


# ----------------------------------------------------------------------------------------------
# AttentionMask
# ----------------------------------------------------------------------------------------------
@gluon.jit
def attention_mask(S, offs_m, start_n, seqlen_k, causal_offset, CAUSAL: gl.constexpr):
    """AttentionMask.apply: S (query rows ``offs_m``, keys from ``start_n``) with -inf where the key
    is past ``seqlen_k`` or, causal, after the query row's diagonal (j > i + causal_offset; both from
    :func:`seqlen_info`). Apply it to scaled scores: scaling after it
    would give -inf · 0 = NaN for softmax_scale = 0. Takes the first key rather than Triton's
    ``offs_n``: the key offsets are built here, in S's own layout."""
    BLOCK_N: gl.constexpr = S.shape[1]
    offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S.type.layout))
    visible = offs_n[None, :] < seqlen_k
    if CAUSAL:
        visible = visible & (offs_n[None, :] <= offs_m[:, None] + causal_offset)
    return gl.where(visible, S, float("-inf"))


@gluon.jit
def transposed_mask(p_t, offs_n, offs_m, seqlen_k, causal_offset, CAUSAL: gl.constexpr):
    """Pᵀ (keys ``offs_n`` as rows, query rows ``offs_m`` as columns) with 0 where the key is past
    ``seqlen_k`` or, causal, after the query row's diagonal (j > i + causal_offset): the transpose of
    :func:`attention_mask`, applied after the exp (Pᵀ, not Sᵀ, is what the products read)."""
    visible = offs_n[:, None] < seqlen_k
    if CAUSAL:
        visible = visible & (offs_n[:, None] <= offs_m[None, :] + causal_offset)
    return gl.where(visible, p_t, 0.0)


# ----------------------------------------------------------------------------------------------
# OnlineSoftmax
# ----------------------------------------------------------------------------------------------
@gluon.jit
def online_softmax_update(
    S,
    row_max,
    row_sum,
    softmax_scale_log2,
    S_SCALED: gl.constexpr,
    MASKED: gl.constexpr,
    P_EXPONENT: gl.constexpr = 0.0,
    ROW_TREE: gl.constexpr = False,
):
    """OnlineSoftmax.update with one block of scores: ``(P, alpha, row_max, row_sum)``.

    row_max_new = max(row_max, rowmax(S · scale)); P = exp2(S · scale - row_max_new + P_EXPONENT);
    alpha = exp2(row_max - row_max_new), the factor that rescales O and row_sum to the new maximum.

    ``S_SCALED``: S arrives as S · softmax_scale_log2 (masked blocks). Otherwise S arrives unscaled:
    the scale (>= 0) commutes with the row maximum, so the maximum is scaled once per row.
    ``MASKED``: a row may have seen no visible key yet (row_max -inf); it subtracts 0 instead, so
    exp2(-inf) gives P = 0 and not NaN. ``P_EXPONENT`` > 0 (gluon/fp8) lifts P by 2^P_EXPONENT
    (row_sum adds the lifted P, so the factor cancels in O / row_sum), as in the Triton stack.
    ``ROW_TREE``: the row max and sum as trees (``_row_tree``)."""
    block_max = _row_tree(S, MAX=True) if ROW_TREE else gl.max(S, 1)
    row_max_new = gl.maximum(row_max, block_max if S_SCALED else block_max * softmax_scale_log2)
    row_max_base = gl.where(row_max_new == float("-inf"), 0.0, row_max_new) if MASKED else row_max_new
    p_base = row_max_base - P_EXPONENT if P_EXPONENT != 0 else row_max_base
    P = gl.exp2(S - p_base[:, None]) if S_SCALED else gl.exp2(S * softmax_scale_log2 - p_base[:, None])
    alpha = gl.exp2(row_max - row_max_base)
    row_sum = row_sum * alpha + (_row_tree(P, MAX=False) if ROW_TREE else gl.sum(P, 1))
    return P, alpha, row_max_new, row_sum


@gluon.jit
def _column_halves(x):
    """x [rows, W] as its two column halves [rows, W / 2]: the top column bit, which the wgmma
    accumulator layout keeps in each thread's registers, so no data moves."""
    ROWS: gl.constexpr = x.shape[0]
    W: gl.constexpr = x.shape[1]
    return gl.split(gl.permute(gl.reshape(x, [ROWS, 2, W // 2]), (0, 2, 1)))


@gluon.jit
def _row_tree(x, MAX: gl.constexpr):
    """Row maximum (``MAX``) or row sum of x as a tree: the in-thread column halves are folded level by
    level (independent FMNMX / FADD), then gl.max / gl.sum take the last 8 columns (2 in the thread,
    4 lanes). Triton 3.6 lowers gl.max / gl.sum over the 32 in-thread values per row as one dependent
    chain; 3.9 as a tree already."""
    row_layout: gl.constexpr = gl.SliceLayout(1, x.type.layout)
    for _ in gl.static_range(TREE_LEVELS):
        if x.shape[1] > TREE_WIDTH:
            low, high = _column_halves(x)
            x = gl.maximum(low, high) if MAX else low + high
    return gl.convert_layout(gl.max(x, 1) if MAX else gl.sum(x, 1), row_layout, assert_trivial=True)


@gluon.jit
def online_softmax_rescale(acc, alpha):
    """OnlineSoftmax.rescale: O · alpha, row by row (alpha comes in the layout of S's rows)."""
    return acc * gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout))[:, None]


@gluon.jit
def online_softmax_finalize(acc, row_max, row_sum, P_EXPONENT: gl.constexpr = 0.0):
    """OnlineSoftmax.finalize: ``(O, lse)`` with O = acc / row_sum and the natural-log
    lse = (row_max + log2(row_sum) - P_EXPONENT) · ln 2. A row that saw no key (rows past Sq, before
    the bottom-right diagonal, or of a sequence of no keys) gets O = 0 and lse = -inf. ``P_EXPONENT``:
    the lift ``online_softmax_update`` gave P (gluon/fp8), which row_sum carries and the lse drops.
    The Triton stack's finalize takes the same ``P_EXPONENT``; its ``out_scale`` (an extra factor on
    O) has no use here, as no Gluon rung scales O after the division."""
    has_keys = row_sum > 0.0
    inv_sum = gl.where(has_keys, 1.0 / row_sum, 0.0)
    out = online_softmax_rescale(acc, inv_sum)
    lse_log2 = row_max + gl.log2(row_sum) - P_EXPONENT if P_EXPONENT != 0 else row_max + gl.log2(row_sum)
    lse = gl.where(has_keys, lse_log2 * LN_2, float("-inf"))
    return out, lse


# ----------------------------------------------------------------------------------------------
# wgmma steps and P in registers (a K/V ring slot, S = Q Kᵀ, O += P V, P's packed words)
# ----------------------------------------------------------------------------------------------


@gluon.jit
def _ready_tile(ring, ready, n_block, NUM_STAGES: gl.constexpr):
    """Block n's tile of a K or V ring, once its TMA copy has landed."""
    stage = n_block % NUM_STAGES
    mbarrier.wait(ready.index(stage), (n_block // NUM_STAGES) & 1)
    return ring.index(stage)


@gluon.constexpr_function
def _accumulator_layout(num_warps, columns):
    """A wgmma accumulator of ``columns`` columns (S: BLOCK_N, O: D; the backward's Sᵀ: BLOCK_M, dK, dV, dQ: D), each
    warp 16 whole rows."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, columns, 16])


@gluon.jit
def _scores(q_smem, k_tile, s_layout: gl.constexpr):
    """Issue S = Q Kᵀ asynchronously: a wgmma token, not yet a tensor."""
    BLOCK_M: gl.constexpr = q_smem.shape[0]
    BLOCK_N: gl.constexpr = k_tile.shape[0]
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    return warpgroup_mma(q_smem, k_tile.permute((1, 0)), zero, use_acc=False, is_async=True)


@gluon.jit
def _values_product(P_words, v_tile, acc, p_layout: gl.constexpr):
    """fp16/bf16: issue O += P V (a wgmma token), P from its packed words."""
    return warpgroup_mma(_words_as_operand(P_words, v_tile.dtype, p_layout), v_tile, acc, is_async=True)


@gluon.jit
def _words_as_operand(P_words, dtype: gl.constexpr, p_layout: gl.constexpr):
    """The inverse of ``fp8.packed_words`` (e4m3, four k per int32 word) and ``_packed_pairs``
    (fp16/bf16, two): P in the A-operand layout, each word split by shifts into its k values."""
    BLOCK_M: gl.constexpr = P_words.shape[0]
    WORDS: gl.constexpr = P_words.shape[1]
    PER_WORD: gl.constexpr = 32 // dtype.primitive_bitwidth
    bits: gl.constexpr = gl.int8 if PER_WORD == 4 else gl.int16
    layout3: gl.constexpr = gl.reshape(
        gl.full([BLOCK_M, WORDS * PER_WORD], 0, bits, p_layout), [BLOCK_M, WORDS, PER_WORD]
    ).type.layout
    P_words = gl.convert_layout(P_words, gl.SliceLayout(2, layout3), assert_trivial=True)
    shifts = gl.arange(0, PER_WORD, layout=gl.SliceLayout(0, gl.SliceLayout(1, layout3))) * (32 // PER_WORD)
    parts = ((P_words[:, :, None] >> shifts[None, None, :]) & ((1 << (32 // PER_WORD)) - 1)).to(bits)
    P = gl.reshape(parts, [BLOCK_M, WORDS * PER_WORD]).to(dtype, bitcast=True)
    return gl.convert_layout(P, p_layout, assert_trivial=True)


@gluon.jit
def _operand_p(P_f32, dtype: gl.constexpr, p_layout: gl.constexpr):
    """fp16/bf16 P in the A-operand layout of P V (a layout change that moves no data), packed in
    words (gluon/fp8's e4m3 P is ``fp8.operand_p``)."""
    return _packed_pairs(gl.convert_layout(P_f32, p_layout, assert_trivial=True), dtype)


@gluon.jit
def _packed_pairs(P, dtype: gl.constexpr):
    """fp16/bf16: fp32 P in the A-operand layout as int32 words of two consecutive k, one
    ``cvt.rn.{bf16,f16}x2.f32`` each (packed by Triton's own conversion, ptxas swapped the halves of
    every word back with a PRMT)."""
    BLOCK_M: gl.constexpr = P.shape[0]
    BLOCK_N: gl.constexpr = P.shape[1]
    k0, k1 = gl.split(gl.reshape(P, [BLOCK_M, BLOCK_N // 2, 2]))
    if dtype == gl.bfloat16:
        asm: gl.constexpr = "cvt.rn.bf16x2.f32 $0, $2, $1;"
    else:
        asm: gl.constexpr = "cvt.rn.f16x2.f32 $0, $2, $1;"
    return gl.inline_asm_elementwise(asm=asm, constraints="=r,r,r", args=[k0, k1], dtype=gl.int32, is_pure=True, pack=1)


# ----------------------------------------------------------------------------------------------
# The backward's in-kernel dQ (gluon/backward/hopper, ``BackwardTiles.dq``, ``backward_dq.py``)
# ----------------------------------------------------------------------------------------------
@gluon.jit
def publish_ds(d_s_t, step, index, ds_all, ds_ready):
    """The backward's in-kernel dQ: consumer ``index``'s dSᵀ into its shared buffer of this step's parity,
    and its arrival on that buffer's barrier; returns the buffer. Double-buffered: a consumer arrives for
    step s + 1 only once its products reading step s − 1's buffer have retired, and writes step s + 2's
    only once it has seen both arrivals of step s + 1, so a buffer is rewritten only once both have read it."""
    NUM_CONSUMERS: gl.constexpr = ds_all.shape[0] // 2
    buffer = step % 2
    ds_all.index(buffer * NUM_CONSUMERS + index).store(d_s_t.to(ds_all.dtype))
    fence_async_shared()
    # All four warps' stores precede the consumer's one arrival.
    _partition_barrier()
    mbarrier.arrive(ds_ready.index(buffer), count=1)
    return buffer


@gluon.jit
def share_ds(d_s_t, step, index, ds_all, ds_ready):
    """The backward's in-kernel dQ, plain steps: ``publish_ds``, then wait until the other consumer's dSᵀ
    is there too; returns the buffer."""
    buffer = publish_ds(d_s_t, step, index, ds_all, ds_ready)
    mbarrier.wait(ds_ready.index(buffer), (step // 2) & 1)
    return buffer


@gluon.jit
def dq_t_product(buffer, k_t, ds_all, s_layout: gl.constexpr):
    """The backward's atomic dQ: issue one consumer's share of dQᵀ = Kᵀ dSᵀ over the CTA's keys (both
    consumers' dSᵀ in ``buffer``, ``share_ds``), its half of D's rows (64 × BLOCK_M: the query rows are
    too few for an m64 wgmma's M), a wgmma token. ``k_t``: that half of D of each consumer's K tile,
    transposed (MN-major A)."""
    NUM_CONSUMERS: gl.constexpr = len(k_t)
    HALF_D: gl.constexpr = k_t[0].shape[0]
    BLOCK_M: gl.constexpr = ds_all.shape[2]
    dq_t = gl.zeros([HALF_D, BLOCK_M], gl.float32, s_layout)
    for keys in gl.static_range(NUM_CONSUMERS):
        dq_t = warpgroup_mma(
            k_t[keys], ds_all.index(buffer * NUM_CONSUMERS + keys), dq_t, use_acc=keys > 0, is_async=True
        )
    return dq_t


@gluon.jit
def add_dq(dq_t, DQAccum, row_base, m_start, seqlen_q, index, s_layout: gl.constexpr):
    """The backward's atomic dQ: dQ_accum[rows m_start ..., consumer ``index``'s half of D] += dQᵀ's
    transpose by relaxed fp32 atomics (the other key blocks add to the same rows); rows past Sq left out."""
    HALF_D: gl.constexpr = dq_t.shape[0]
    HEAD_DIM: gl.constexpr = 2 * HALF_D
    BLOCK_M: gl.constexpr = dq_t.shape[1]
    offs_d = index * HALF_D + gl.arange(0, HALF_D, layout=gl.SliceLayout(1, s_layout))
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
    # One scalar base per step; the tile's offsets are int32 and the same every step.
    tile = DQAccum + (row_base + m_start) * HEAD_DIM
    row_ok = (m_start + rows < seqlen_q)[None, :]
    gl.atomic_add(tile + rows[None, :] * HEAD_DIM + offs_d[:, None], dq_t, mask=row_ok, sem="relaxed")
