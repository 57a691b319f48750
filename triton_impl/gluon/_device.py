"""Device code shared by the Gluon rungs: the warp-specialised Hopper attention kernel and its parts.

The kernel is one CTA per NUM_CONSUMERS × 64 query rows of one (batch, head), split by
``gl.warp_specialize`` into partitions that talk only through shared memory and mbarriers:

* ``_load_partition`` (1 warp, ``LOAD_REGISTERS`` registers per thread): issues the TMA copy of
  each consumer's Q tile once, then K and V tiles into two rings of ``NUM_STAGES`` slots. Each slot
  has a ready barrier (``k_ready``/``v_ready``, completed by the TMA byte count) and an empty
  barrier (``k_empty``/``v_empty``, one arrival per consumer once the wgmma reading it has
  retired). K_n's slot frees one step before V_n's, so the next K copy is issued a step early.
* ``_consumer`` / ``_softmax_partition``, NUM_CONSUMERS times (the default partition and one or
  two workers, 4 warps each, ``CONSUMER_REGS`` registers): its own 64 query rows, S = Q Kᵀ and
  O += P V by ``warpgroup_mma`` (one m64 wgmma per GEMM), the online softmax in registers, then
  the epilogue (O through shared memory and a TMA store, LSE by pointer). Optionally (PINGPONG)
  the consumers pass a ``turn`` mbarrier round so that they issue their wgmmas one after another.

Each consumer's KV loop is software-pipelined by hand (FA3's intra-warpgroup overlap): step n
issues S_n = Q K_nᵀ, then O += P_(n-1) V_(n-1), waits only for S_n (``warpgroup_mma_wait(1)``) and
runs the softmax of S_n while the P V wgmma still runs on the tensor cores.

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
* ``AttentionMask.apply`` → :func:`attention_mask`: -inf past the sequence's seqlen_k and, causal,
  after the query row's diagonal (j > i + causal_offset).
* ``OnlineSoftmax`` → :func:`online_softmax_update`, :func:`online_softmax_rescale`,
  :func:`online_softmax_finalize`; ``row_max`` is the maximum of S · softmax_scale_log2 (log2 units
  of the scaled scores), ``row_sum`` the sum of P in the same frame.
* ``LOG2_E`` and ``LN_2`` are the Triton stack's (``triton_impl/_device.py``): the host folds
  LOG2_E into softmax_scale_log2, the epilogue turns the LSE into a natural log with LN_2. There
  is no ``RESCALE_THRESHOLD``: as in the Triton stack, O is rescaled at every key block.

Block ranges: every consumer visits the CTA's [0, n_block_max) blocks, as the load warp loads them;
the blocks below its own ``n_block_max - n_masked_blocks`` are seen in full by all its rows and skip
the mask; the causal diagonal, the ragged last block and blocks past its own causal range are masked.
Block 0 is peeled (it starts the pipeline) and always masked, which costs one masked block per tile.
A tile whose rows see no key (bottom-right with Sq > Sk, or a cache length of 0) still loads and
masks block 0: the pipeline needs one block, and the mask makes it O = 0, lse = -inf.

The problem features are constexprs (``GQA``, ``BOTTOM_RIGHT``, ``HAS_CACHE_SEQLENS``), so with
them off the kernel is the plain one: the KV head is the head, the causal offset a constant 0, Sk
the argument, and no count is clamped.

``FP8`` (``gluon/fp8``, ``triton_impl/gluon/fp8.py``) switches the same kernel to e4m3 operands:
the V ring holds Vᵀ tiles (D × BLOCK_N, read K-major as fp8 wgmma requires), each consumer folds its
Q block's scale into the softmax scale and each key block's K scale into that block's, P is lifted
by 2^P_EXPONENT before its e4m3 conversion and handed to P V in S's own registers (a renaming of
the key index, ``_scores_as_operand``, matched by V's key order on the host), each P V goes into a
fresh fp32 accumulator that is added to O times the block's V scale (``_fp8_values_product``, one
FFMA per element with the scale ratio carried in alpha), and O (bf16) leaves through a shared buffer
of its own.

``gluon/decode`` (``triton_impl/gluon/decode.py``) runs a kernel of its own (one warpgroup, a TMA ring
with ready barriers only, one split of the keys per CTA) built from this step's parts: ``_scores``,
``_values_product``, ``_operand_p``, ``_ready_tile``, the mask and the online softmax.

Both paths carry P from one step to the next as packed 32-bit words made by inline ``cvt`` PTX
(``_packed_words``, ``_packed_pairs``), written only after the P V wgmma reading the previous words
has retired: left to Triton, fp16/bf16 P cost a PRMT per word under Triton 3.6's ptxas, and a P
written under a running wgmma makes ptxas serialise every wgmma of the kernel.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from common.contract import fp8
from triton_impl._device import LN_2

# FP8: P = 2^(S · scale - row_max + P_EXPONENT) lies in [0, 2^8], clear of e4m3's subnormals; the
# factor cancels because row_sum adds the same scaled P (common/contract/fp8.py, shared with the other fp8 rungs).
P_EXPONENT = gl.constexpr(fp8.P_EXPONENT)
# FP8: keys per group of the register rename of P (``_scores_as_operand``; common.contract.fp8.KEY_GROUP), and
# the permutation of [rows, groups, key bit 3, bit 2, bit 1, bit 0] that puts slot k = 4t + i on key
# 8 (i // 2) + 2t + i % 2 (common.contract.fp8.PERMUTED_KEY_ORDER; tests/test_gluon.py checks they agree).
KEY_GROUP = gl.constexpr(fp8.KEY_GROUP)
KEY_BIT_ORDER = gl.constexpr((0, 1, 3, 4, 2, 5))
# The row reductions fold the in-thread columns of a key block down to the 8 of one wgmma accumulator
# group (2 registers x 4 lanes), which gl.max / gl.sum finish: at most 4 levels, for 128 keys.
TREE_WIDTH = gl.constexpr(8)
TREE_LEVELS = gl.constexpr(4)
# The load partition's register budget per thread (setmaxnreg): it holds only scalars.
LOAD_REGISTERS = gl.constexpr(24)
LOAD_WARPS = gl.constexpr(1)
# Consumer warpgroups: the default partition and one or two workers, each with its own query rows.
CONSUMER_WARPS = gl.constexpr(4)

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


# ----------------------------------------------------------------------------------------------
# Load partition: one warp issuing TMA copies
# ----------------------------------------------------------------------------------------------
@gluon.jit
def _load_partition(operands, NUM_STAGES: gl.constexpr, CONSUMERS: gl.constexpr, FP8: gl.constexpr):
    descs, smem, barriers, coords = operands
    desc_q, desc_k, desc_v, _ = descs
    q_smem, k_ring, v_ring = smem
    q_ready, k_ready, v_ready, k_empty, v_empty = barriers
    batch, head, kv_head, start_m, n_block_max = coords
    BLOCK_N: gl.constexpr = k_ring.shape[1]

    # One Q tile per consumer warpgroup, each with its own barrier.
    for consumer in gl.static_range(CONSUMERS):
        mbarrier.expect(q_ready.index(consumer), desc_q.block_type.nbytes)
        consumer_m = start_m + consumer * q_smem.shape[1]
        _tma_load(desc_q, [batch, head, consumer_m, 0], q_ready.index(consumer), _as_box(q_smem.index(consumer)))
    for n_block in range(n_block_max):
        stage = n_block % NUM_STAGES
        # A fresh mbarrier counts as having completed the phase before phase 0: the first lap waits on
        # phase 1 and passes at once.
        empty_phase = ((n_block // NUM_STAGES) & 1) ^ 1
        start_n = n_block * BLOCK_N
        mbarrier.wait(k_empty.index(stage), empty_phase)
        mbarrier.expect(k_ready.index(stage), desc_k.block_type.nbytes)
        # GQA: K and V of the KV head this query head reads, straight from its (B, Hkv, Sk, D) tensor.
        _tma_load(desc_k, [batch, kv_head, start_n, 0], k_ready.index(stage), _as_box(k_ring.index(stage)))
        mbarrier.wait(v_empty.index(stage), empty_phase)
        mbarrier.expect(v_ready.index(stage), desc_v.block_type.nbytes)
        # FP8 reads Vᵀ (B, H, D, Sk): its key block is a column block.
        v_coords = [batch, kv_head, 0, start_n] if FP8 else [batch, kv_head, start_n, 0]
        _tma_load(desc_v, v_coords, v_ready.index(stage), _as_box(v_ring.index(stage)))


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
    FP8: gl.constexpr,
    ROW_TREE: gl.constexpr,
):
    """OnlineSoftmax.update with one block of scores: ``(P, alpha, row_max, row_sum)``.

    row_max_new = max(row_max, rowmax(S · scale)); P = exp2(S · scale - row_max_new);
    alpha = exp2(row_max - row_max_new), the factor that rescales O and row_sum to the new maximum.

    ``S_SCALED``: S arrives as S · softmax_scale_log2 (masked blocks). Otherwise S arrives unscaled:
    the scale (>= 0) commutes with the row maximum, so the maximum is scaled once per row.
    ``MASKED``: a row may have seen no visible key yet (row_max -inf); it subtracts 0 instead, so
    exp2(-inf) gives P = 0 and not NaN. ``FP8`` lifts P by 2^P_EXPONENT (row_sum adds the lifted P,
    so the factor cancels in O / row_sum). ``ROW_TREE``: the row max and sum as trees (``_row_tree``)."""
    block_max = _row_tree(S, True) if ROW_TREE else gl.max(S, 1)
    row_max_new = gl.maximum(row_max, block_max if S_SCALED else block_max * softmax_scale_log2)
    row_max_base = gl.where(row_max_new == float("-inf"), 0.0, row_max_new) if MASKED else row_max_new
    p_base = row_max_base - P_EXPONENT if FP8 else row_max_base
    P = gl.exp2(S - p_base[:, None]) if S_SCALED else gl.exp2(S * softmax_scale_log2 - p_base[:, None])
    alpha = gl.exp2(row_max - row_max_base)
    row_sum = row_sum * alpha + (_row_tree(P, False) if ROW_TREE else gl.sum(P, 1))
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
def online_softmax_finalize(acc, row_max, row_sum, FP8: gl.constexpr):
    """OnlineSoftmax.finalize: ``(O, lse)`` with O = acc / row_sum and the natural-log
    lse = (row_max + log2(row_sum)) · ln 2. A row that saw no key (rows past Sq, before the
    bottom-right diagonal, or of a sequence of no keys) gets O = 0 and lse = -inf. FP8's row_sum
    carries the 2^P_EXPONENT of P, taken off the lse."""
    has_keys = row_sum > 0.0
    inv_sum = gl.where(has_keys, 1.0 / row_sum, 0.0)
    out = online_softmax_rescale(acc, inv_sum)
    lse_log2 = row_max + gl.log2(row_sum) - P_EXPONENT if FP8 else row_max + gl.log2(row_sum)
    lse = gl.where(has_keys, lse_log2 * LN_2, float("-inf"))
    return out, lse


# ----------------------------------------------------------------------------------------------
# Softmax partition: wgmma, online softmax, epilogue
# ----------------------------------------------------------------------------------------------


@gluon.jit
def _ready_tile(ring, ready, n_block, NUM_STAGES: gl.constexpr):
    """Block n's tile of a K or V ring, once its TMA copy has landed."""
    stage = n_block % NUM_STAGES
    mbarrier.wait(ready.index(stage), (n_block // NUM_STAGES) & 1)
    return ring.index(stage)


@gluon.jit
def _take_turn(turn, event, PINGPONG: gl.constexpr):
    """Ping-pong: wait until the other consumer has issued its wgmmas of the same event."""
    if PINGPONG:
        mbarrier.wait(turn[0], event & 1)


@gluon.jit
def _pass_turn(turn, PINGPONG: gl.constexpr):
    """Ping-pong: let the other consumer issue its wgmmas while this one runs its softmax."""
    if PINGPONG:
        mbarrier.arrive(turn[1], count=1)


@gluon.jit
def _scores(q_smem, k_tile, s_layout: gl.constexpr):
    """Issue S = Q Kᵀ asynchronously: a wgmma token, not yet a tensor."""
    BLOCK_M: gl.constexpr = q_smem.shape[0]
    BLOCK_N: gl.constexpr = k_tile.shape[0]
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    return warpgroup_mma(q_smem, k_tile.permute((1, 0)), zero, use_acc=False, is_async=True)


@gluon.jit
def _fp8_values_product(P_words, vt_tile, p_layout: gl.constexpr):
    """Issue one key block's P8 V8 into a fresh fp32 accumulator (a wgmma token). fp8 wgmma
    accumulates with reduced precision, so O is not chained through it: each block's product starts
    from zero and is added to O in fp32 (see triton_impl/fp8.py). Vᵀ's tile is read K-major."""
    P = _words_as_operand(P_words, vt_tile.dtype, p_layout)
    BLOCK_M: gl.constexpr = P.shape[0]
    HEAD_DIM: gl.constexpr = vt_tile.shape[0]
    # P's operand layout is derived from O's accumulator layout, which the product takes.
    o_layout: gl.constexpr = p_layout.parent
    zero = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    return warpgroup_mma(P, vt_tile.permute((1, 0)), zero, use_acc=False, is_async=True)


@gluon.jit
def _values_product(P_words, v_tile, acc, p_layout: gl.constexpr):
    """fp16/bf16: issue O += P V (a wgmma token), P from its packed words."""
    return warpgroup_mma(_words_as_operand(P_words, v_tile.dtype, p_layout), v_tile, acc, is_async=True)


@gluon.jit
def _packed_words(P):
    """FP8: fp32 P in the A-operand layout as e4m3 in int32 words of four consecutive k (the
    operand's own registers): two ``cvt.rn.satfinite.e4m3x2.f32`` per word. Carried from one loop
    iteration to the next as e4m3 bytes, P would be unpacked after the softmax and packed again
    before its wgmma (about three integer instructions per word); as words, it is not."""
    BLOCK_M: gl.constexpr = P.shape[0]
    BLOCK_N: gl.constexpr = P.shape[1]
    # k = 4 word + 2 j1 + j0; gl.split takes the last dimension (j0) apart, then j1.
    k02, k13 = gl.split(gl.reshape(P, [BLOCK_M, BLOCK_N // 4, 2, 2]))
    k0, k2 = gl.split(k02)
    k1, k3 = gl.split(k13)
    words = gl.inline_asm_elementwise(
        asm="""
        {
        .reg .b16 lo, hi;
        cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;
        cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;
        mov.b32 $0, {lo, hi};
        }
        """,
        constraints="=r,r,r,r,r",
        args=[k0, k1, k2, k3],
        dtype=gl.int32,
        is_pure=True,
        pack=1,
    )
    return words


@gluon.jit
def _words_as_operand(P_words, dtype: gl.constexpr, p_layout: gl.constexpr):
    """The inverse of ``_packed_words`` (e4m3, four k per int32 word) and ``_packed_pairs``
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
def _scores_as_operand(P, p_layout: gl.constexpr):
    """FP8: P (e4m3, in S's accumulator layout) as the A operand of P V without moving data.

    Per 16 keys, S's accumulator gives lane t the keys 2t, 2t+1, 2t+8, 2t+9 (key bits 1-2 from the
    lane, bits 0 and 3 from the register), while the e4m3 A operand wants lane t to hold four
    consecutive k, 4t..4t+3 (k bits 2-3 from the lane, bits 0-1 from the register). Swapping the key
    bits so that slot k = 4t + i holds key 8 (i // 2) + 2t + i % 2 makes the two layouts the same
    registers: the reshape / permute below only renames them, and ``assert_trivial`` makes the
    compiler refuse a conversion that would exchange data. V's keys are stored in the same order
    (``common.contract.fp8.permuted_key_values``), so the product is unchanged."""
    BLOCK_M: gl.constexpr = P.shape[0]
    BLOCK_N: gl.constexpr = P.shape[1]
    # Key bits (from the top) 3, 2, 1, 0 of each group of 16 -> slot bits 1, 3, 2, 0.
    P = gl.reshape(P, [BLOCK_M, BLOCK_N // KEY_GROUP, 2, 2, 2, 2])
    P = gl.permute(P, KEY_BIT_ORDER.value)
    P = gl.reshape(P, [BLOCK_M, BLOCK_N])
    return gl.convert_layout(P, p_layout, assert_trivial=True)


@gluon.jit
def _operand_p(P_f32, dtype: gl.constexpr, p_layout: gl.constexpr, FP8: gl.constexpr):
    """P in the A-operand layout of P V: renamed registers for e4m3, a layout change for fp16/bf16."""
    if FP8:
        return _packed_words(_scores_as_operand(P_f32, p_layout))
    else:
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


@gluon.jit
def _block_scale(scales, n_block, BLOCK_N: gl.constexpr, KV_QUANT_BLOCK: gl.constexpr):
    """FP8: key block n's scale (K's or V's) of this (batch, head); a key block lies in one quantisation block."""
    return gl.load(scales + n_block * BLOCK_N // KV_QUANT_BLOCK)


@gluon.jit
def _fp8_rescale_factor(alpha, v_scales, n_block, BLOCK_N: gl.constexpr, KV_QUANT_BLOCK: gl.constexpr):
    """FP8: the factor that takes acc = O / s_v(n-1) to the frame of block n, alpha · s_v(n-1) / s_v(n)
    (one division per row and step, against one multiply per element of O)."""
    ratio = _block_scale(v_scales, n_block - 1, BLOCK_N, KV_QUANT_BLOCK) / _block_scale(
        v_scales, n_block, BLOCK_N, KV_QUANT_BLOCK
    )
    return alpha * ratio


@gluon.jit
def _release(k_empty, v_empty, n_block, NUM_STAGES: gl.constexpr):
    """Hand K_n's and V_(n-1)'s slots back to the load warp (the wgmmas reading them have retired).

    Gluon lowers an arrive to one thread of the partition after a barrier over the partition's
    warps, so this warpgroup's arrival comes after all four of its warps passed their wait; the
    slot's barrier completes when every consumer warpgroup has arrived."""
    mbarrier.arrive(k_empty.index(n_block % NUM_STAGES), count=1)
    mbarrier.arrive(v_empty.index((n_block - 1) % NUM_STAGES), count=1)


@gluon.jit
def _pipelined_step(carry, n_block, MASKED: gl.constexpr, step_args, step_constants: gl.constexpr):
    """Issue S_n, issue O += P_(n-1) V_(n-1), softmax of S_n under that wgmma, free the slots.

    FP8: P_(n-1) V_(n-1) goes into a fresh accumulator; K_n's scale joins the softmax scale of S_n
    (positive, so the row max commutes with it). ``acc`` holds O over V_(n-2)'s scale s_v, and the
    carried ``alpha`` already includes s_v(n-2) / s_v(n-1) (``_fp8_rescale_factor``), so one FFMA per
    element, acc · alpha + P V, both rescales O and adds the block: multiplying the product by its
    scale and O by alpha separately took a second pass over O's 64 registers per block."""
    smem, barriers, turn, offs_m, seqlen, softmax_scale_log2, fp8_scales = step_args
    seqlen_k, causal_offset = seqlen
    s_layout: gl.constexpr = step_constants[0]
    p_layout: gl.constexpr = step_constants[1]
    NUM_STAGES: gl.constexpr = step_constants[2]
    CAUSAL: gl.constexpr = step_constants[3]
    PINGPONG: gl.constexpr = step_constants[4]
    FP8: gl.constexpr = step_constants[5]
    KV_QUANT_BLOCK: gl.constexpr = step_constants[6]
    ROW_TREE: gl.constexpr = step_constants[7]
    acc, P, alpha, row_max, row_sum = carry
    q_smem, k_ring, v_ring = smem
    _, k_ready, v_ready, k_empty, v_empty = barriers
    BLOCK_N: gl.constexpr = k_ring.shape[1]

    if not FP8:
        # O is this block's wgmma accumulator: rescaled before the wgmma is issued.
        acc = online_softmax_rescale(acc, alpha)
    k_tile = _ready_tile(k_ring, k_ready, n_block, NUM_STAGES)
    v_tile = _ready_tile(v_ring, v_ready, n_block - 1, NUM_STAGES)
    FP8_MASKED: gl.constexpr = FP8 and MASKED
    _take_turn(turn, n_block, PINGPONG)
    if FP8_MASKED:
        # FP8 masked blocks (the ragged last block, the causal diagonal) run P_(n-1) V_(n-1) to the end
        # before S_n is issued: its product's and P's registers are free again while S_n is masked
        # (overlapped, 128-key blocks spilled). Non-causal tiles have at most one such block.
        pv = warpgroup_mma_wait(0, deps=[_fp8_values_product(P, v_tile, p_layout)])
        acc = online_softmax_rescale(acc, alpha) + pv
        s_token = _scores(q_smem, k_tile, s_layout)
    else:
        s_token = _scores(q_smem, k_tile, s_layout)
        pv_token = _fp8_values_product(P, v_tile, p_layout) if FP8 else _values_product(P, v_tile, acc, p_layout)
    _pass_turn(turn, PINGPONG)
    if FP8:
        k_scales, v_scales = fp8_scales
        softmax_scale_log2 = softmax_scale_log2 * _block_scale(k_scales, n_block, BLOCK_N, KV_QUANT_BLOCK)
    # wgmmas retire in order: waiting until one is in flight retires S_n, leaves P V running.
    S = warpgroup_mma_wait(0 if FP8_MASKED else 1, deps=[s_token])
    if MASKED:
        S = attention_mask(S * softmax_scale_log2, offs_m, n_block * BLOCK_N, seqlen_k, causal_offset, CAUSAL)
    P_f32, alpha_n, row_max, row_sum = online_softmax_update(
        S, row_max, row_sum, softmax_scale_log2, MASKED, MASKED, FP8, ROW_TREE
    )
    if FP8:
        if not MASKED:
            # P_n's words take the registers of P_(n-1)'s, which the running wgmma reads: made after it.
            pv = warpgroup_mma_wait(0, deps=[pv_token])
            acc = online_softmax_rescale(acc, alpha) + pv
        P = _operand_p(P_f32, v_ring.dtype, p_layout, FP8)
        alpha = _fp8_rescale_factor(alpha_n, v_scales, n_block, BLOCK_N, KV_QUANT_BLOCK)
    else:
        # As for FP8: P_n's words are written after the wgmma that reads P_(n-1)'s has retired.
        acc = warpgroup_mma_wait(0, deps=[pv_token])
        P = _operand_p(P_f32, v_ring.dtype, p_layout, FP8)
        alpha = alpha_n
    _release(k_empty, v_empty, n_block, NUM_STAGES)
    return acc, P, alpha, row_max, row_sum


@gluon.jit
def _softmax_partition(
    descs,
    smem,
    o_smem,
    barriers,
    turn,
    coords,
    LSE,
    seqlen_q,
    seqlen,
    softmax_scale_log2,
    scales,
    s_layout: gl.constexpr,
    o_layout: gl.constexpr,
    NUM_STAGES: gl.constexpr,
    CAUSAL: gl.constexpr,
    BOTTOM_RIGHT: gl.constexpr,
    PINGPONG: gl.constexpr,
    HANDS_FIRST_TURN: gl.constexpr,
    FP8: gl.constexpr,
    Q_QUANT_BLOCK: gl.constexpr,
    KV_QUANT_BLOCK: gl.constexpr,
    ROW_TREE: gl.constexpr,
):
    """One consumer warpgroup: its own BLOCK_M query rows (its Q tile and q_ready barrier), the
    CTA's K/V rings shared with the other consumer. With PINGPONG the two consumers take turns
    issuing their wgmmas in a ring (consumer 0 first: the last one hands it the first turn), so
    one's softmax runs under the others' GEMMs. O leaves through ``o_smem`` (the Q buffer itself
    for fp16/bf16; FP8 writes bf16 O, twice the bytes of its e4m3 Q tile, through its own buffer).

    ``seqlen``: this sequence's ``(seqlen_k, causal_offset)`` (:func:`seqlen_info`).
    FP8 (``scales``: the fp32 scales of Q (B, H, blocks), K and V (B, Hkv, blocks) and the block
    counts): this warpgroup's 64 rows lie in one Q quantisation block, whose scale joins the softmax
    scale; K's and V's scales are those of the KV head (``kv_batch_head`` = batch · Hkv + kv_head)."""
    desc_o = descs[3]
    q_smem, k_ring, v_ring = smem
    q_ready, k_ready, v_ready, k_empty, _ = barriers
    batch, head, start_m, n_block_max, batch_head, kv_batch_head = coords
    seqlen_k, causal_offset = seqlen
    BLOCK_M: gl.constexpr = q_smem.shape[0]
    BLOCK_N: gl.constexpr = k_ring.shape[1]
    HEAD_DIM: gl.constexpr = q_smem.shape[1]
    # P as wgmma's A operand from registers: 32 bits of k per thread and register (2 × 16-bit, 4 × e4m3).
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4 if FP8 else 2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    offs_m = start_m + gl.arange(0, BLOCK_M, layout=row_layout)
    # This warpgroup's unmasked blocks; it visits the CTA's n_block_max blocks, as the load warp
    # loads them (blocks past its own causal range are masked out in full).
    _, n_block_max_own, n_masked_blocks = block_range(
        start_m, seqlen_k, causal_offset, CAUSAL, BOTTOM_RIGHT, BLOCK_M, BLOCK_N
    )
    n_unmasked = n_block_max_own - n_masked_blocks
    if HANDS_FIRST_TURN:
        _pass_turn(turn, PINGPONG)
    if FP8:
        Q_SCALE, K_SCALE, V_SCALE, q_blocks, kv_blocks = scales
        fp8_scales = (K_SCALE + kv_batch_head * kv_blocks, V_SCALE + kv_batch_head * kv_blocks)
        # The CTA's last consumer may start past Sq (its rows are never stored): clamp to the last block.
        q_block = gl.minimum(start_m // Q_QUANT_BLOCK, q_blocks - 1)
        softmax_scale_log2 = softmax_scale_log2 * gl.load(Q_SCALE + batch_head * q_blocks + q_block)
        first_scale_log2 = softmax_scale_log2 * _block_scale(fp8_scales[0], 0, BLOCK_N, KV_QUANT_BLOCK)
    else:
        fp8_scales = scales
        first_scale_log2 = softmax_scale_log2

    # Block 0 starts the pipeline: its S and softmax run before the loop (masked: it may be ragged
    # or on the causal diagonal).
    mbarrier.wait(q_ready, 0)
    row_max = gl.full([BLOCK_M], float("-inf"), gl.float32, row_layout)
    row_sum = gl.zeros([BLOCK_M], gl.float32, row_layout)
    k_tile = _ready_tile(k_ring, k_ready, 0, NUM_STAGES)
    _take_turn(turn, 0, PINGPONG)
    s_token = _scores(q_smem, k_tile, s_layout)
    _pass_turn(turn, PINGPONG)
    S = warpgroup_mma_wait(0, deps=[s_token])
    mbarrier.arrive(k_empty.index(0), count=1)
    S = attention_mask(S * first_scale_log2, offs_m, 0, seqlen_k, causal_offset, CAUSAL)
    P_f32, alpha, row_max, row_sum = online_softmax_update(
        S, row_max, row_sum, first_scale_log2, True, True, FP8, ROW_TREE
    )
    P = _operand_p(P_f32, v_ring.dtype, p_layout, FP8)
    # FP8: acc is zero, so block 0's alpha (finite: 0 for rows that saw no key) needs no V-scale ratio.
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    # Blocks every row sees in full, then the causal diagonal and the ragged last block. What every
    # step shares is bound once: tensors in a tuple, layouts and flags in a constexpr tuple.
    carry = (acc, P, alpha, row_max, row_sum)
    step_args = (smem, barriers, turn, offs_m, seqlen, softmax_scale_log2, fp8_scales)
    step_constants: gl.constexpr = (s_layout, p_layout, NUM_STAGES, CAUSAL, PINGPONG, FP8, KV_QUANT_BLOCK, ROW_TREE)
    for n_block in range(1, n_unmasked):
        carry = _pipelined_step(carry, n_block, False, step_args, step_constants)
    FP8_FULL: gl.constexpr = FP8 and not CAUSAL
    if FP8_FULL:
        # Without the causal mask only the ragged last block is masked: one step, not a loop (as a loop,
        # Triton 3.9 kept its invariants live across it and spilled at 128 keys).
        n_block = gl.maximum(n_unmasked, 1)
        if n_block < n_block_max:
            carry = _pipelined_step(carry, n_block, True, step_args, step_constants)
    else:
        for n_block in range(gl.maximum(n_unmasked, 1), n_block_max):
            carry = _pipelined_step(carry, n_block, True, step_args, step_constants)
    acc, P, alpha, row_max, row_sum = carry

    # The last block's P V, then normalise (FP8: acc is O over the last V block's scale, s_v).
    if not FP8:
        acc = online_softmax_rescale(acc, alpha)
    v_tile = _ready_tile(v_ring, v_ready, n_block_max - 1, NUM_STAGES)
    _take_turn(turn, n_block_max, PINGPONG)
    pv_token = _fp8_values_product(P, v_tile, p_layout) if FP8 else _values_product(P, v_tile, acc, p_layout)
    _pass_turn(turn, PINGPONG)
    if FP8:
        pv = warpgroup_mma_wait(0, deps=[pv_token])
        acc = (online_softmax_rescale(acc, alpha) + pv) * _block_scale(
            fp8_scales[1], n_block_max - 1, BLOCK_N, KV_QUANT_BLOCK
        )
    else:
        acc = warpgroup_mma_wait(0, deps=[pv_token])

    # The LSE is (B, H, Sq) contiguous, indexed by the query head (batch_head), not the KV head.
    out, lse = online_softmax_finalize(acc, row_max, row_sum, FP8)
    gl.store(LSE + batch_head.to(gl.int64) * seqlen_q + offs_m, lse, mask=offs_m < seqlen_q)

    # O through shared memory (o_smem: this warpgroup's Q buffer, free now, for fp16/bf16) and one
    # TMA store; rows past Sq are clipped by the descriptor's per-(batch, head) bounds.
    _partition_barrier()
    o_smem.store(out.to(desc_o.dtype))
    fence_async_shared()
    _partition_barrier()
    _tma_store(desc_o, [batch, head, start_m, 0], _as_box(o_smem))
    tma.store_wait(0)


@gluon.jit
def _consumer(index: gl.constexpr, consumer_args, constants: gl.constexpr):
    """Consumer ``index``: its slice of the CTA's query rows, Q and O buffers, Q barrier and turn.
    ``consumer_args`` (tensors, buffers, barriers) and ``constants`` (layouts and flags) are what every
    consumer shares, built once by ``attention_kernel``."""
    descs, io_smem, q_ready, turn, rings, ring_barriers, tile, shapes = consumer_args
    s_layout: gl.constexpr = constants[0]
    o_layout: gl.constexpr = constants[1]
    NUM_STAGES: gl.constexpr = constants[2]
    CAUSAL: gl.constexpr = constants[3]
    PINGPONG: gl.constexpr = constants[4]
    NUM_CONSUMERS: gl.constexpr = constants[5]
    FP8: gl.constexpr = constants[6]
    Q_QUANT_BLOCK: gl.constexpr = constants[7]
    KV_QUANT_BLOCK: gl.constexpr = constants[8]
    ROW_TREE: gl.constexpr = constants[9]
    BOTTOM_RIGHT: gl.constexpr = constants[10]
    q_smem, o_smem = io_smem
    k_ring, v_ring = rings
    k_ready, v_ready, k_empty, v_empty = ring_barriers
    batch, head, start_m, n_block_max, batch_head, kv_batch_head = tile
    LSE, seqlen_q, seqlen, softmax_scale_log2, scales = shapes
    WG_M: gl.constexpr = q_smem.shape[1]
    _softmax_partition(
        descs,
        (q_smem.index(index), k_ring, v_ring),
        o_smem.index(index),
        (q_ready.index(index), k_ready, v_ready, k_empty, v_empty),
        (turn.index(index), turn.index((index + 1) % NUM_CONSUMERS)),
        (batch, head, start_m + index * WG_M, n_block_max, batch_head, kv_batch_head),
        LSE,
        seqlen_q,
        seqlen,
        softmax_scale_log2,
        scales,
        s_layout,
        o_layout,
        NUM_STAGES,
        CAUSAL,
        BOTTOM_RIGHT,
        PINGPONG,
        index == NUM_CONSUMERS - 1,
        FP8,
        Q_QUANT_BLOCK,
        KV_QUANT_BLOCK,
        ROW_TREE,
    )


# ----------------------------------------------------------------------------------------------
# Kernel: allocate shared memory and barriers, fork the partitions
# ----------------------------------------------------------------------------------------------
# Triton compiles a separate kernel for an integer argument equal to 1, with the value folded in. For
# seqlen_k = 1 that folding leaves FP8's P words with repeated inputs, and Triton 3.6's ptxas (CUDA
# 12.8) then assembles one word's upper half from a register it never writes (F2FP ... MERGE_C):
# garbage e4m3 P, non-finite rows on the H200. One kernel for every key length avoids it.
@gluon.jit(do_not_specialize=["seqlen_k"])
def attention_kernel(
    desc_q,
    desc_k,
    desc_v,
    desc_o,
    LSE,
    CacheSeqlens,
    heads,
    kv_heads,
    seqlen_q,
    seqlen_k,
    softmax_scale_log2,
    Q_SCALE,
    K_SCALE,
    V_SCALE,
    q_blocks,
    kv_blocks,
    NUM_STAGES: gl.constexpr,
    CAUSAL: gl.constexpr,
    GQA: gl.constexpr,
    BOTTOM_RIGHT: gl.constexpr,
    HAS_CACHE_SEQLENS: gl.constexpr,
    PINGPONG: gl.constexpr,
    NUM_CONSUMERS: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
    FP8: gl.constexpr,
    Q_QUANT_BLOCK: gl.constexpr,
    KV_QUANT_BLOCK: gl.constexpr,
    ROW_TREE: gl.constexpr,
    num_warps: gl.constexpr,
):
    """fp16/bf16, or (FP8) e4m3 Q, K and Vᵀ with fp32 scales per (batch, head, quantisation block)
    (Q_SCALE etc., None for fp16/bf16; K's and V's per KV head) and O in bf16. K and V have
    ``kv_heads`` heads (``GQA`` when fewer than ``heads``); ``CacheSeqlens`` is the (B,) int32 key
    lengths (``HAS_CACHE_SEQLENS``, else None); ``LSE`` the (B, H, Sq) fp32 output."""
    # Each consumer warpgroup (num_warps = 4) owns WG_M = 64 query rows: one m64 wgmma per GEMM.
    WG_M: gl.constexpr = desc_q.block_type.shape[2]
    BLOCK_M: gl.constexpr = NUM_CONSUMERS * WG_M
    BLOCK_N: gl.constexpr = desc_k.block_type.shape[2]
    HEAD_DIM: gl.constexpr = desc_q.block_type.shape[3]
    dtype: gl.constexpr = desc_q.dtype
    # wgmma's k per instruction: 32 bytes of operand (16 fp16/bf16, 32 e4m3).
    INSTR_K: gl.constexpr = 32 if FP8 else 16
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, INSTR_K]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_DIM, INSTR_K]
    )
    tile_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)

    # Causal tiles near the bottom do the most work: launching them first shortens the tail.
    m_block = gl.num_programs(0) - 1 - gl.program_id(0) if CAUSAL else gl.program_id(0)
    batch_head = gl.program_id(1)
    batch = batch_head // heads
    head = batch_head % heads
    kv_head = kv_head_index(head, heads, kv_heads) if GQA else head
    kv_batch_head = batch * kv_heads + kv_head if GQA else batch_head
    seqlen_k, causal_offset = seqlen_info(CacheSeqlens, batch, seqlen_q, seqlen_k, HAS_CACHE_SEQLENS, BOTTOM_RIGHT)
    start_m = m_block * BLOCK_M
    _, n_block_max, _ = block_range(start_m, seqlen_k, causal_offset, CAUSAL, BOTTOM_RIGHT, BLOCK_M, BLOCK_N)
    if BOTTOM_RIGHT or HAS_CACHE_SEQLENS:
        # Rows that see no key still take block 0 (loaded, then masked in full): the consumers'
        # pipeline starts with it, and the mask makes their O 0 and their lse -inf.
        n_block_max = gl.maximum(n_block_max, 1)

    q_smem = gl.allocate_shared_memory(dtype, [NUM_CONSUMERS, WG_M, HEAD_DIM], tile_layout)
    k_ring = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], tile_layout)
    if FP8:
        # fp8 wgmma reads B K-major only: the host stores Vᵀ, and a V tile is D × BLOCK_N (keys contiguous).
        vt_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HEAD_DIM, BLOCK_N], dtype)
        v_ring = gl.allocate_shared_memory(dtype, [NUM_STAGES, HEAD_DIM, BLOCK_N], vt_layout)
        o_tile_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([WG_M, HEAD_DIM], desc_o.dtype)
        o_smem = gl.allocate_shared_memory(desc_o.dtype, [NUM_CONSUMERS, WG_M, HEAD_DIM], o_tile_layout)
    else:
        v_ring = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], tile_layout)
        o_smem = q_smem
    q_ready = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    # turn.index(i): consumer i may issue its wgmmas (ping-pong), arrived by the other consumer.
    turn = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS, 1], mbarrier.MBarrierLayout())
    for consumer in gl.static_range(NUM_CONSUMERS):
        mbarrier.init(q_ready.index(consumer), count=1)
        mbarrier.init(turn.index(consumer), count=1)
    for stage in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(stage), count=1)
        mbarrier.init(v_ready.index(stage), count=1)
        # A slot is empty once every consumer warpgroup has arrived.
        mbarrier.init(k_empty.index(stage), count=NUM_CONSUMERS)
        mbarrier.init(v_empty.index(stage), count=NUM_CONSUMERS)
    # mbarrier.init is a generic-proxy write and the TMA unit completes these barriers through the
    # async proxy: the PTX memory model orders the two only through a proxy fence (Triton's own TMA
    # pipeline emits the same fence.proxy.async after its inits); warp_specialize's entry barrier
    # then orders it before every partition's first use.
    fence_async_shared()

    descs = (desc_q, desc_k, desc_v, desc_o)
    rings = (k_ring, v_ring)
    ring_barriers = (k_ready, v_ready, k_empty, v_empty)
    tile = (batch, head, start_m, n_block_max, batch_head, kv_batch_head)
    seqlen = (seqlen_k, causal_offset)
    shapes = (LSE, seqlen_q, seqlen, softmax_scale_log2, (Q_SCALE, K_SCALE, V_SCALE, q_blocks, kv_blocks))
    loader = (
        descs,
        (q_smem, k_ring, v_ring),
        (q_ready, k_ready, v_ready, k_empty, v_empty),
        (batch, head, kv_head, start_m, n_block_max),
    )
    # What every consumer shares, written once: a constexpr tuple keeps its layouts and flags
    # compile-time values (a plain tuple variable would turn them into tensors).
    consumer_args = (descs, (q_smem, o_smem), q_ready, turn, rings, ring_barriers, tile, shapes)
    constants: gl.constexpr = (
        s_layout,
        o_layout,
        NUM_STAGES,
        CAUSAL,
        PINGPONG,
        NUM_CONSUMERS,
        FP8,
        Q_QUANT_BLOCK,
        KV_QUANT_BLOCK,
        ROW_TREE,
        BOTTOM_RIGHT,
    )
    # The first partition runs in the kernel's own warps; the others are workers with their warp
    # counts and register budgets.
    if NUM_CONSUMERS == 2:
        gl.warp_specialize(
            [
                (_consumer, (0, consumer_args, constants)),
                (_consumer, (1, consumer_args, constants)),
                (_load_partition, (loader, NUM_STAGES, NUM_CONSUMERS, FP8)),
            ],
            [CONSUMER_WARPS, LOAD_WARPS],
            [CONSUMER_REGS, LOAD_REGISTERS],
        )
    else:
        gl.warp_specialize(
            [
                (_consumer, (0, consumer_args, constants)),
                (_consumer, (1, consumer_args, constants)),
                (_consumer, (2, consumer_args, constants)),
                (_load_partition, (loader, NUM_STAGES, NUM_CONSUMERS, FP8)),
            ],
            [CONSUMER_WARPS, CONSUMER_WARPS, LOAD_WARPS],
            [CONSUMER_REGS, CONSUMER_REGS, LOAD_REGISTERS],
        )
