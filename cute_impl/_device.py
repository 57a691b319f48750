"""The device vocabulary of the CuTe stack, used by the rungs from ``pipelined`` on; the names are the
ones the Triton and Gluon stacks use, so that a diff of two rungs teaches:

* :func:`kv_head_index`: the KV head a query head reads (GQA); :class:`SeqlenInfo`: one sequence's
  ``seqlen_k`` (its ``cache_seqlens`` entry, if any) and ``causal_offset`` (the causal alignment),
  which the block range and the mask take.
* :class:`BlockRange`: the key blocks ``[n_block_min, n_block_max)`` one query tile visits, last
  first, and ``n_masked_blocks``, how many at the top end of the range need the mask;
  :func:`split_key_range`: the block range of one split of the keys (``decode``).
  These three and the constants are the whole stack's: the Hopper rungs import them too.
* :class:`AttentionMask`: ``apply`` writes -inf for keys past ``seqlen_k`` and, causal, right of the
  diagonal (shifted by ``causal_offset``).
* :class:`OnlineSoftmax`: ``row_max`` (the maximum of S · softmax_scale_log2, log2 units of the
  scaled scores, as in every stack) and ``row_sum``; ``update`` turns a block of S into P and returns
  the rescale factor, ``rescale`` moves O to the new maximum, ``finalize`` divides O by ``row_sum``
  (and, asked for, forms the LSE).
* :func:`kv_copy_partitions`: a thread's share of the K/V copies; :func:`load_kv_block`: the cp.async
  of one K/V block into a slot of the shared-memory ring, from a contiguous cache or, through its
  block table, a paged one (:class:`PagedKV`, ``decode``).
* :func:`ldmatrix_operands`: the ldmatrix (S→R) copies of Q, K and Vᵀ into the ``mma.sync`` fragments.
* :func:`gemm_double_buffered`: ``acc += A B`` over a warp's ``mma.sync`` fragments, each ldmatrix
  issued one piece ahead of the MMAs that consume it.
* :func:`refill_kv_ring`, :func:`scores`, :func:`values_product`: steps 3a (refill the ring, wait for
  this block), 3b (S = Q Kᵀ) and 3e (O += P V) of the main loop that ``pipelined`` and ``decode`` share.
* The constants :data:`LOG2_E` and :data:`RESCALE_THRESHOLD`, defined once for the stack.

The fragment-level objects here (mask, online softmax, copies) speak the ``mma.sync.m16n8k16``
fragment layout of ``pipelined``; the Hopper rungs' WGMMA counterparts live in ``_hopper_device.py``.

The m16n8k16 accumulator gives each thread a fragment ((2 cols, 2 rows), MMA_M, MMA_N): within an
m16n8 tile, lane ``l`` holds rows ``l / 4`` and ``l / 4 + 8``, columns ``2 (l % 4)`` and ``+1``.
A row is therefore spread over the quad of 4 lanes ``4 (l / 4) .. 4 (l / 4) + 3``, which is why
row reductions are two butterfly shuffles.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warp

# The CuTe stack defines its constants once, here (hopper and fp8 import them too); naive, online and
# tiled keep their own LOG2_E so that each reads alone (STYLE.md: rungs up to tiled are self-contained).
# softmax_scale_log2 = softmax_scale · LOG2_E: exp(x · scale) = exp2(x · softmax_scale_log2).
LOG2_E = math.log2(math.e)
# ln 2: the LSE is returned in natural-log units, row_max is in log2 units.
LN_2 = math.log(2.0)
# Lane distances of the butterfly shuffles that combine the 4 lanes holding one accumulator row.
QUAD_SHUFFLE_OFFSETS = (2, 1)
# Lazy rescaling (see OnlineSoftmax): the running max moves only when a block's max exceeds it by
# more than this many powers of two (log2 units, like row_max), so P stays <= 2^8 = 256.
RESCALE_THRESHOLD = 8.0


def rows_by_cols(acc: cute.Tensor) -> cute.Tensor:
    """View an accumulator-shaped fragment ((2, 2), MMA_M, MMA_N) as (rows, cols) of this thread."""
    flat = cute.make_layout(acc.shape)
    by_rows = cute.make_layout(
        ((flat.shape[0][1], flat.shape[1]), (flat.shape[0][0], flat.shape[2])),
        stride=((flat.stride[0][1], flat.stride[1]), (flat.stride[0][0], flat.stride[2])),
    )
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, by_rows))


def accumulator_as_operand_a(rP: cute.Tensor) -> cute.Tensor:
    """Regroup an m16n8 accumulator ((2, 2), MMA_M, MMA_N) as m16k16 A operands
    ((2, 2, 2), MMA_M, MMA_N / 2): two neighbouring n8 tiles are the two k8 halves of one k16."""
    divided = cute.logical_divide(rP.layout, (None, None, 2))
    shape = ((divided.shape[0], divided.shape[2][0]), divided.shape[1], divided.shape[2][1])
    stride = ((divided.stride[0], divided.stride[2][0]), divided.stride[1], divided.stride[2][1])
    return cute.make_tensor(rP.iterator, cute.make_layout(shape, stride=stride))


def split_mode(tensor: cute.Tensor, mode: int, parts: int) -> cute.Tensor:
    """Cut rank-3 ``tensor``'s mode ``mode`` (of size N) into (N / parts, parts): consecutive pieces."""
    tiler = [None, None, None]
    tiler[mode] = cute.size(tensor, mode=[mode]) // parts
    return cute.logical_divide(tensor, tuple(tiler))


def gemm_double_buffered(
    tiled_mma: cute.TiledMma,
    acc: cute.Tensor,
    tCrA: cute.Tensor,
    tCrB: cute.Tensor,
    pieces: int,
    b_load: OperandLoad,
    a_load: OperandLoad | None = None,
) -> None:
    """acc += A B, each ldmatrix issued one piece ahead of the MMAs that consume it.

    A piece is 1 / ``pieces`` of the N columns of one k-step: B of piece (k, j) is loaded
    before the MMAs of the previous piece run, and A of step k (Q; P is already in registers) with
    piece (k, 0). Double-buffering half-steps rather than whole k-steps halves the operand registers that are
    live next to the O and S accumulators (see the budget at ``pipelined.TILE_CONFIGS``).
    ``b_load`` and ``a_load`` are :class:`OperandLoad` s (shared source (CPY, *, K)). The loops run at
    trace time: straight-line code.
    """
    k_steps = cute.size(tCrB, mode=[2])
    b_copy, b_src, b_dst = b_load
    acc_n = split_mode(acc, 2, pieces)  # (MMA, MMA_M, (MMA_N / pieces, pieces))
    # (MMA or CPY, (N / pieces, pieces), K): B's register fragment, its shared source and its copy view.
    rB, sB, vB = (split_mode(t, 1, pieces) for t in (tCrB, b_src, b_dst))
    order = [(k, piece) for k in range(k_steps) for piece in range(pieces)]

    def load(k: int, piece: int) -> None:
        if a_load is not None and piece == 0:
            a_copy, a_src, a_dst = a_load
            cute.copy(a_copy, a_src[None, None, k], a_dst[None, None, k])
        cute.copy(b_copy, sB[None, (None, piece), k], vB[None, (None, piece), k])

    load(*order[0])
    for i, (k, piece) in enumerate(order):
        if i + 1 < len(order):
            load(*order[i + 1])
        acc_piece = acc_n[None, None, (None, piece)]
        cute.gemm(tiled_mma, acc_piece, tCrA[None, None, k], rB[None, (None, piece), k], acc_piece)


class PagedKV(NamedTuple):
    """A paged KV cache as :func:`load_kv_block` reads it (``decode``): K's and V's page pools seen as
    (num_pages, Hkv, page_size, D), this CTA's KV head, its sequence's row of the block table
    (max_pages_per_seq,) int32, and the page size. Key j is slot ``j % page_size`` of page
    ``block_table_row[j // page_size]``."""

    mK: cute.Tensor
    mV: cute.Tensor
    kv_head: cutlass.Int32
    block_table_row: cute.Tensor
    page_size: cutlass.Int32


class KVCopy(NamedTuple):
    """What :func:`load_kv_block` copies with: the G2S tiled copy and this thread's partitions of K
    and V in HBM, of their shared-memory rings and of the keys' identity coordinates. A paged cache
    (``pages``) has no tiled view of K and V in HBM: its rows are gathered through the block table."""

    tiled_copy: cute.TiledCopy
    tKgK: cute.Tensor | None  # (CPY, CPY_N, CPY_D, n_blocks); None when paged
    tKsK: cute.Tensor  # (CPY, CPY_N, CPY_D, stages)
    tVgV: cute.Tensor | None  # (CPY, CPY_N, CPY_D, n_blocks); None when paged
    tVsV: cute.Tensor  # (CPY, CPY_N, CPY_D, stages)
    tKVcKV: cute.Tensor  # (CPY, CPY_N, CPY_D, n_blocks)
    pages: PagedKV | None = None


def kv_copy_partitions(
    gmem_tiled_copy: cute.TiledCopy,
    gmem_thr_copy: Any,
    gK: cute.Tensor | None,
    sK: cute.Tensor,
    gV: cute.Tensor | None,
    sV: cute.Tensor,
    cKV: cute.Tensor,
    pages: PagedKV | None = None,
) -> KVCopy:
    """The :class:`KVCopy` of K and V in HBM (``n_blocks`` blocks; None when ``pages`` gives a paged
    cache), their shared-memory rings (``stages`` slots) and the keys' identity coordinates, for this
    thread."""
    return KVCopy(
        gmem_tiled_copy,
        tKgK=None if gK is None else gmem_thr_copy.partition_S(gK),
        tKsK=gmem_thr_copy.partition_D(sK),
        tVgV=None if gV is None else gmem_thr_copy.partition_S(gV),
        tVsV=gmem_thr_copy.partition_D(sV),
        tKVcKV=gmem_thr_copy.partition_S(cKV),
        pages=pages,
    )


class OperandLoad(NamedTuple):
    """One S→R load of an ``mma.sync`` operand: the ldmatrix tiled copy, its shared-memory source and
    the register fragment seen as its destination."""

    copy: cute.TiledCopy
    source: cute.Tensor
    destination: cute.Tensor


class LdmatrixOperands(NamedTuple):
    """The S→R loads of the three ``mma.sync`` operands."""

    q: OperandLoad  # source tSsQ (CPY, CPY_M, CPY_K)
    k: OperandLoad  # source tSsK (CPY, CPY_N, CPY_K, stages)
    vt: OperandLoad  # source tOsVt (CPY, CPY_D, CPY_K, stages)


def ldmatrix_operands(
    tiled_mma: cute.TiledMma,
    thread: cutlass.Int32,
    sQ: cute.Tensor,
    sK: cute.Tensor,
    sVt: cute.Tensor,
    tSrQ: cute.Tensor,
    tSrK: cute.Tensor,
    tOrVt: cute.Tensor,
) -> LdmatrixOperands:
    """The S→R loads of the three ``mma.sync`` operands (:class:`OperandLoad` each): Q and K with
    ``ldmatrix``, Vᵀ (V's memory seen as
    (D, keys)) with ``ldmatrix.trans``. x4 loads four 8×8 matrices = one m16k16 A tile or two n8k16 B
    tiles. ``thread`` is the index inside ``tiled_mma`` (the CTA's thread, or the lane for one warp's
    MMA)."""
    dtype = sQ.element_type
    ldmatrix = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), dtype)
    ldmatrix_t = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), dtype)
    s2r_Q = cute.make_tiled_copy_A(ldmatrix, tiled_mma)
    s2r_K = cute.make_tiled_copy_B(ldmatrix, tiled_mma)
    s2r_V = cute.make_tiled_copy_B(ldmatrix_t, tiled_mma)
    s2r_thr_Q, s2r_thr_K, s2r_thr_V = (c.get_slice(thread) for c in (s2r_Q, s2r_K, s2r_V))
    return LdmatrixOperands(
        q=OperandLoad(s2r_Q, s2r_thr_Q.partition_S(sQ), s2r_thr_Q.retile(tSrQ)),
        k=OperandLoad(s2r_K, s2r_thr_K.partition_S(sK), s2r_thr_K.retile(tSrK)),
        vt=OperandLoad(s2r_V, s2r_thr_V.partition_S(sVt), s2r_thr_V.retile(tOrVt)),
    )


@cute.jit
def load_kv_block(
    kv_copy: KVCopy,
    n_block: cutlass.Int32,
    slot: cutlass.Int32,
    seqlen_k: cutlass.Int32,
    predicated: cutlass.Constexpr,
):
    """Issue the cp.async of K/V block ``n_block`` into ring slot ``slot`` (no commit) with ``kv_copy``
    (:class:`KVCopy`). ``predicated`` (compile time): rows at or past ``seqlen_k`` are zero-filled
    instead of loaded (the one block the sequence's end can cut; a paged cache's block table is not
    read for them either)."""
    for n in cutlass.range_constexpr(cute.size(kv_copy.tKsK, mode=[1])):
        if cutlass.const_expr(predicated):
            if kv_copy.tKVcKV[0, n, 0, n_block][0] < seqlen_k:
                copy_kv_row(kv_copy, n, n_block, slot)
            else:
                # Past Sk: zeros, since P = 0 times uninitialised shared memory could be NaN.
                kv_copy.tKsK[None, n, None, slot].fill(0)
                kv_copy.tVsV[None, n, None, slot].fill(0)
        else:
            copy_kv_row(kv_copy, n, n_block, slot)


# ----------------------------------------------------------------------------------------------
# One step of the ldmatrix rungs' main loop (pipelined: the CTA's tile; decode: one warp's keys of
# it). The two rungs share the ring and the fragments, so steps 3a, 3b and 3e are written once here;
# the mask and the online softmax between them (3c, 3d) stay in each rung's ``attend_block``.
# ----------------------------------------------------------------------------------------------
@cute.jit
def refill_kv_ring(
    kv_copy: KVCopy, step: cutlass.Int32, stages: cutlass.Constexpr, n_block_max: cutlass.Int32,
    n_blocks: cutlass.Int32, seqlen_k: cutlass.Int32, async_proxy: cutlass.Constexpr = False,
):  # fmt: skip
    """3a: once every thread is done with the slot freed last iteration, refill it with the block
    ``stages - 1`` steps ahead (if the ``n_blocks`` blocks below ``n_block_max`` have one), then wait
    only for this step's block: ``cp.async.wait_group(stages - 1)``, never for the whole ring.
    ``async_proxy`` (WGMMA reads the block: ``_decode_wgmma.py``): each thread's landed copies are fenced
    for the async proxy before the barrier that hands the block over."""
    # Always commit (possibly an empty group) so that "stages-1 groups pending" means block i landed.
    load_kv_ahead(kv_copy, step + stages - 1, stages, n_block_max, n_blocks, seqlen_k)
    wait_kv_block(stages - 1, async_proxy)


# Its two halves, apart for a loop that frees a slot in the middle of its step (the overlapped WGMMA tile,
# ``_decode_wgmma.attend_overlapped_block``: the slot two steps back is free only once that step's P V retired).
@cute.jit
def wait_kv_block(pending: cutlass.Constexpr, async_proxy: cutlass.Constexpr = False):
    """Wait for this step's block: ``cp.async.wait_group(pending)`` (the later blocks still loading), with
    ``async_proxy`` a fence of this thread's landed copies for the async proxy, then the barrier that hands the
    block to every thread."""
    cute.arch.cp_async_wait_group(pending)
    if cutlass.const_expr(async_proxy):
        cute.arch.fence_proxy("async.shared", space="cta")
    cute.arch.barrier()


@cute.jit
def load_kv_ahead(
    kv_copy: KVCopy, ahead: cutlass.Int32, stages: cutlass.Constexpr, n_block_max: cutlass.Int32,
    n_blocks: cutlass.Int32, seqlen_k: cutlass.Int32,
):  # fmt: skip
    """Once every thread is done with slot ``ahead % stages`` (the barrier), load step ``ahead``'s block into it
    (if the ``n_blocks`` blocks below ``n_block_max`` have one) and commit, an empty group past the last block."""
    cute.arch.barrier()
    if ahead < n_blocks:
        load_kv_block(kv_copy, n_block_max - 1 - ahead, ahead % stages, seqlen_k, predicated=False)
    cute.arch.cp_async_commit_group()


def scores(
    tiled_mma: cute.TiledMma, smem_operands: LdmatrixOperands, tSrQ: cute.Tensor, tSrK: cute.Tensor,
    slot: cutlass.Int32, tile_mn: tuple[int, int], pieces: int,
) -> cute.Tensor:  # fmt: skip
    """3b: S = Q Kᵀ (a fresh fp32 accumulator of ``tile_mn``) with K from ring slot ``slot``, Q and K
    loaded by ldmatrix, double-buffered (:func:`gemm_double_buffered`, ``pieces`` per k-step)."""
    copy_K, tSsK, tSrK_view = smem_operands.k
    acc_S = cute.make_rmem_tensor(tiled_mma.partition_shape_C(tile_mn), cutlass.Float32)
    acc_S.fill(0.0)
    gemm_double_buffered(
        tiled_mma, acc_S, tSrQ, tSrK, pieces,
        b_load=OperandLoad(copy_K, tSsK[None, None, None, slot], tSrK_view), a_load=smem_operands.q,
    )  # fmt: skip
    return acc_S


def values_product(
    tiled_mma: cute.TiledMma, smem_operands: LdmatrixOperands, acc_S: cute.Tensor, acc_O: cute.Tensor,
    tOrVt: cute.Tensor, slot: cutlass.Int32, pieces: int, dtype: type[cutlass.Numeric],
) -> None:  # fmt: skip
    """3e: O += P V. P (``acc_S`` after the softmax) is cast to ``dtype`` and reused in registers as
    the A operand (:func:`accumulator_as_operand_a`); Vᵀ from ring slot ``slot`` by ldmatrix.trans."""
    copy_V, tOsVt, tOrVt_view = smem_operands.vt
    rP = cute.make_fragment_like(acc_S, dtype)
    rP.store(acc_S.load().to(dtype))
    tOrP = accumulator_as_operand_a(rP)  # (MMA, MMA_M, MMA_K = keys / 16)
    gemm_double_buffered(
        tiled_mma, acc_O, tOrP, tOrVt, pieces, b_load=OperandLoad(copy_V, tOsVt[None, None, None, slot], tOrVt_view)
    )


@cute.jit
def copy_kv_row(kv_copy: KVCopy, n: cutlass.Constexpr, n_block: cutlass.Int32, slot: cutlass.Int32):
    """The cp.async of this thread's row ``n`` of K/V block ``n_block`` into ring slot ``slot``: from
    the tiled views, or, paged, from the row's page (one block-table read per row; its 16-byte
    chunks are the same columns as the contiguous copy's)."""
    tiled_copy, tKgK, tKsK, tVgV, tVsV, tKVcKV, pages = kv_copy
    if cutlass.const_expr(pages is None):
        cute.copy(tiled_copy, tKgK[None, n, None, n_block], tKsK[None, n, None, slot])
        cute.copy(tiled_copy, tVgV[None, n, None, n_block], tVsV[None, n, None, slot])
    else:
        page, in_page = page_and_slot(pages, tKVcKV[0, n, 0, n_block][0])
        elems = cute.size(tKsK, mode=[0])
        # The key's row (D,) of K and of V, cut into the copy's 16-byte chunks: (elems, D / elems).
        gK_row = cute.zipped_divide(pages.mK[page, pages.kv_head, in_page, None], (elems,))
        gV_row = cute.zipped_divide(pages.mV[page, pages.kv_head, in_page, None], (elems,))
        for d in cutlass.range_constexpr(cute.size(tKsK, mode=[2])):
            chunk = tKVcKV[0, n, d, n_block][1] // elems
            cute.copy(tiled_copy, gK_row[None, chunk], tKsK[None, n, d, slot])
            cute.copy(tiled_copy, gV_row[None, chunk], tVsV[None, n, d, slot])


def page_and_slot(pages: PagedKV, key: cutlass.Int32) -> tuple[cutlass.Int32, cutlass.Int32]:
    """Where key ``key`` of the sequence lives: (its page, from the block table; its slot in the page)."""
    page_index = key // pages.page_size
    return pages.block_table_row[page_index], key - page_index * pages.page_size


def quad_allreduce(
    value: cutlass.Float32, op: Callable[[cutlass.Float32, cutlass.Float32], cutlass.Float32]
) -> cutlass.Float32:
    """Combine the values of the 4 lanes that hold one accumulator row; all 4 get the result."""
    for offset in QUAD_SHUFFLE_OFFSETS:
        value = op(value, cute.arch.shuffle_sync_bfly(value, offset=offset))
    return value


def _add(a: cutlass.Float32, b: cutlass.Float32) -> cutlass.Float32:
    return a + b


def kv_head_index(head: cutlass.Int32, heads: cutlass.Int32, kv_heads: cutlass.Int32) -> cutlass.Int32:
    """GQA: the KV head query head ``head`` reads (groups of heads // kv_heads query heads). K and V
    are indexed by it (the Hopper rungs: their TMA boxes' head coordinate), never repeated."""
    return head // (heads // kv_heads)


class SeqlenInfo:
    """One sequence's ``seqlen_k`` and ``causal_offset``: row i sees keys j <= i + causal_offset.

    ``seqlen_k`` is the padded key length, or the sequence's own ``cache_seqlens[batch]`` (clamped to
    [0, Sk], so a bad length cannot reach past the cache). ``causal_offset`` is 0 for the top-left
    alignment and ``seqlen_k - seqlen_q`` for the bottom-right one (``bottom_right``, compile time);
    without either feature both stay what the canonical kernel had (``seqlen_k`` = Sk, offset 0).
    ``may_see_no_key`` (compile time): some row may see no key at all (a length of 0, or bottom-right
    rows before the diagonal when Sq > Sk); the canonical kernel never has such a row.
    """

    def __init__(
        self,
        seqlen_k: cutlass.Int32,
        causal_offset: cutlass.Int32 | int,
        bottom_right: bool,
        has_cache_seqlens: bool = False,
    ):
        self.seqlen_k = seqlen_k
        self.causal_offset = causal_offset
        self.bottom_right = bottom_right
        self.may_see_no_key = bottom_right or has_cache_seqlens

    @staticmethod
    def create(
        batch: cutlass.Int32,
        seqlen_q: cutlass.Int32,
        seqlen_k: cutlass.Int32,
        cache_seqlens: cute.Tensor | None,
        bottom_right: bool,
    ) -> SeqlenInfo:
        if cutlass.const_expr(cache_seqlens is not None):
            seqlen_k = cutlass.min(cutlass.max(cache_seqlens[batch], 0), seqlen_k)
        causal_offset = 0
        if cutlass.const_expr(bottom_right):
            causal_offset = seqlen_k - seqlen_q
        return SeqlenInfo(seqlen_k, causal_offset, bottom_right, cache_seqlens is not None)


class BlockRange:
    """Key blocks ``[n_block_min, n_block_max)`` one query tile visits (``n_block_max`` exclusive),
    visited last first, and ``n_masked_blocks``: how many blocks at the top end of the range need the
    sequence-tail or causal mask, so that the masked blocks come first and the rest of the loop runs
    without a mask. Blocks from ``n_block_max`` on are masked for every row and never loaded. A query
    tile always starts at key 0 (``n_block_min = 0``, no sliding window); a split of ``decode``
    starts at its first block (:func:`split_key_range`).

    Two rules fill it, one per kind of masked loop (the two write ``n_block_max`` in different,
    equivalent forms; either form in both changes one rung's PTX):

    * :meth:`create` (``pipelined``, ``decode``): the masked iterations are unrolled, so
      ``n_masked_blocks`` is a compile-time bound;
    * :meth:`create_exact` (``hopper``, ``fp8``): the masked loop is a runtime loop, so the count is
      exact, at run time.
    """

    def __init__(self, n_block_min: int, n_block_max: cutlass.Int32, n_masked_blocks: int | cutlass.Int32):
        self.n_block_min = n_block_min
        self.n_block_max = n_block_max
        self.n_masked_blocks = n_masked_blocks

    @staticmethod
    def create(m_block: cutlass.Int32, seqlen: SeqlenInfo, tile_m: int, tile_n: int, causal: bool) -> BlockRange:
        """The range of query tile ``m_block`` (``tile_m`` a multiple of ``tile_n``) with a compile-time
        ``n_masked_blocks``: the ``tile_m / tile_n`` blocks that cross a causal tile's diagonal, or the
        one block that Sk may cut. Bottom-right, the diagonal is shifted by ``causal_offset``, not a
        multiple of ``tile_n``, so it crosses one block more: ``tile_m / tile_n + 1``. A range shorter
        than that is masked throughout, and a counted block that happens to be full is masked to no
        effect. (A runtime count would make the ring slot of every later iteration, ``step % stages``,
        runtime arithmetic too; the static one keeps it folded.) A tile none of whose rows sees a key
        (bottom-right with Sq > Sk, or a ``cache_seqlens`` of 0) has an empty range: it visits no
        block and writes O = 0 (LSE -inf)."""
        n_block_max = cute.ceil_div(seqlen.seqlen_k, tile_n)
        if causal:
            if cutlass.const_expr(seqlen.bottom_right):
                # Row i sees keys j <= i + causal_offset: the tile's last row bounds the keys worth
                # loading; none at all (an empty range) when that bound is not positive.
                last_row_end = cutlass.max((m_block + 1) * tile_m + seqlen.causal_offset, 0)
                n_block_max = cutlass.min(n_block_max, cute.ceil_div(last_row_end, tile_n))
                return BlockRange(0, n_block_max, tile_m // tile_n + 1)
            # Row i sees keys j <= i: blocks right of the tile's last row are masked for every row.
            n_block_max = cutlass.min(n_block_max, cute.ceil_div((m_block + 1) * tile_m, tile_n))
        return BlockRange(0, n_block_max, tile_m // tile_n if causal else 1)

    @staticmethod
    def create_exact(
        m_block: cutlass.Int32, seqlen: SeqlenInfo, tile_m: int, tile_n: int, causal: bool,
        packed_seqlen_q: cutlass.Int32 | None = None,
    ) -> BlockRange:  # fmt: skip
        """The range of query tile ``m_block`` with ``n_masked_blocks`` counted at run time: only the
        blocks that reach past the tile's first row's diagonal (and at least the top one, which Sk may
        cut). A tile whose rows see no key (bottom-right with Sq > Sk, or a ``cache_seqlens`` of 0)
        still visits block 0, fully masked: its rows keep row_sum 0 and come out as O = 0 and LSE =
        -inf with no branch around the pipelines (the producer loads that block like any other).
        ``packed_seqlen_q`` (cute/decode's packed rows on ``hopper``'s kernel, compile time None elsewhere): the
        rows are (head in group) · Sq + token, so a tile may hold every token: its diagonal runs from token 0's
        to token Sq - 1's."""
        visible_keys = seqlen.seqlen_k
        if cutlass.const_expr(causal):
            # Row i sees keys j <= i + causal_offset: the tile's last row (m_block + 1) * tile_m - 1
            # bounds the keys worth loading (packed: the last token, Sq - 1).
            if cutlass.const_expr(packed_seqlen_q is not None):
                last_row_end = packed_seqlen_q
            else:
                last_row_end = (m_block + 1) * tile_m
            if cutlass.const_expr(seqlen.bottom_right):
                last_row_end = last_row_end + seqlen.causal_offset
            visible_keys = cutlass.min(seqlen.seqlen_k, last_row_end)
        if cutlass.const_expr(seqlen.may_see_no_key):
            # At least block 0, fully masked where no row sees a key (see above).
            visible_keys = cutlass.max(visible_keys, 1)
        n_block_max = (visible_keys + tile_n - 1) // tile_n
        if cutlass.const_expr(not causal):
            # Only the last key block can be ragged.
            return BlockRange(0, n_block_max, cutlass.Int32(1))
        # Blocks that reach past the tile's first row's diagonal cross it; at least one block is
        # masked so that a ragged Sk is always covered.
        first_row_end = 0 if cutlass.const_expr(packed_seqlen_q is not None) else m_block * tile_m
        if cutlass.const_expr(seqlen.bottom_right):
            # Rows before the diagonal (first_row_end + offset < 0) make every block a crossing one.
            first_row_end = cutlass.max(first_row_end + seqlen.causal_offset, 0)
        first_crossing = cutlass.min(n_block_max, first_row_end // tile_n)
        return BlockRange(0, n_block_max, cutlass.max(n_block_max - first_crossing, 1))


def split_key_range(
    split: cutlass.Int32, num_splits: cutlass.Int32, key_end: cutlass.Int32, tile_n: int, n_masked_blocks: int
) -> BlockRange:
    """Split ``split`` of ``num_splits`` over keys [0, ``key_end``) (``decode``'s flash decoding) as the
    :class:`BlockRange` of its whole ``tile_n`` blocks: each split gets cdiv(n_blocks, num_splits)
    blocks from a block boundary, so a short sequence gets short splits and the splits past its last
    block an empty range (``n_block_min == n_block_max``). ``n_masked_blocks`` counts from the top of
    the split, like :meth:`BlockRange.create`'s. (``triton_impl._device.split_key_range`` cuts the same
    ranges, in keys.)"""
    n_blocks = cute.ceil_div(key_end, tile_n)
    blocks_per_split = cute.ceil_div(n_blocks, num_splits)
    n_block_min = cutlass.min(split * blocks_per_split, n_blocks)
    n_block_max = cutlass.min(n_block_min + blocks_per_split, n_blocks)
    return BlockRange(n_block_min, n_block_max, n_masked_blocks)


def key_split_range(
    blocks: BlockRange, seqlen: SeqlenInfo, split: cutlass.Int32, num_splits: cutlass.Int32
) -> tuple[BlockRange, SeqlenInfo]:
    """Split ``split`` of ``num_splits`` of a query tile's ``blocks`` (``hopper``'s key splits,
    ``HopperAttentionConfig.key_splits``; FlashAttention-3's ``num_splits``), per sequence: cdiv(blocks, num_splits)
    blocks a split from ``n_block_min``, so a short sequence's last splits are empty. The tile's masked blocks (its
    top ``n_masked_blocks``) fall in the splits that hold them, counted from each split's top (the top split's, unless
    they span more than one split's blocks); every split masks its first block, so the count is at least 1.

    An empty split runs as a tile that sees no key (:meth:`BlockRange.create_exact`): block ``n_block_min``, fully
    masked by a ``seqlen_k`` of 0 in the returned :class:`SeqlenInfo`, so it writes O = 0 and LSE = -inf (no weight in
    the merge) and its producer and consumers load and wait for the one block as any tile's. Plain arithmetic, so that
    a CPU test runs it on Python ints."""
    n_blocks = blocks.n_block_max - blocks.n_block_min
    blocks_per_split = (n_blocks + num_splits - 1) // num_splits
    low = cutlass.min(blocks.n_block_min + split * blocks_per_split, blocks.n_block_max)
    high = cutlass.min(low + blocks_per_split, blocks.n_block_max)
    empty = 1 - cutlass.min(high - low, 1)  # 1 for an empty split, else 0
    masked_from = blocks.n_block_max - blocks.n_masked_blocks
    n_masked = cutlass.max(high - cutlass.max(low, masked_from), 1)
    low = low - empty * (low - blocks.n_block_min)
    high = high + empty * (low + 1 - high)
    # A split's rows may see no key (compile time): an empty split's see none.
    split_seqlen = SeqlenInfo(seqlen.seqlen_k * (1 - empty), seqlen.causal_offset, seqlen.bottom_right, True)
    return BlockRange(low, high, n_masked), split_seqlen


class AttentionMask:
    """-inf for keys past the sequence's ``seqlen_k`` and, when causal, for keys right of the diagonal
    (row i sees j <= i + causal_offset), in the S fragment of one query tile; bound to that tile and
    its :class:`SeqlenInfo` once, :meth:`apply` takes the key block.
    ``_hopper_device.AttentionMask`` applies the same rule to the WGMMA accumulator layout.

    ``packed_seqlen_q`` (``decode``'s GQA packing, compile time None elsewhere): the tile's rows are
    (head in group) · Sq + token, so the causal diagonal follows the row's token, ``row % seqlen_q``.
    """

    def __init__(
        self,
        tile_m: int,
        tile_n: int,
        causal: bool,
        tiled_mma: cute.TiledMma,
        tidx: cutlass.Int32,
        m_block: cutlass.Int32,
        seqlen: SeqlenInfo,
        packed_seqlen_q: cutlass.Int32 | None = None,
    ):
        self.tile_m = tile_m
        self.tile_n = tile_n
        self.causal = causal
        self.tiled_mma = tiled_mma
        self.tidx = tidx
        self.m_block = m_block
        self.seqlen_k = seqlen.seqlen_k
        self.causal_offset = seqlen.causal_offset
        self.bottom_right = seqlen.bottom_right
        self.packed_seqlen_q = packed_seqlen_q

    @cute.jit
    def apply(self, acc_S: cute.Tensor, n_block: cutlass.Int32):
        # A fragment coordinate is (this thread's first coordinate) + (thread 0's coordinate): the
        # thread and value bits of the mma.sync layouts are disjoint. Thread 0's coordinates are
        # compile-time constants, so each element costs one compare with an immediate; comparing
        # full (row, key) coordinates made ptxas keep 32 of them live and spill at 128 registers.
        tile = cute.make_identity_tensor((self.tile_m, self.tile_n))
        tScS = rows_by_cols(self.tiled_mma.get_slice(self.tidx).partition_C(tile))  # (rows, cols) of (row, key)
        offsets = rows_by_cols(self.tiled_mma.get_slice(0).partition_C(tile))  # same, thread 0: static
        first_key = n_block * self.tile_n + tScS[0, 0][1]
        acc_S_mn = rows_by_cols(acc_S)
        for r in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[0])):
            key_limit = self.seqlen_k
            if cutlass.const_expr(self.causal):
                row = self.m_block * self.tile_m + tScS[r, 0][0]
                if cutlass.const_expr(self.packed_seqlen_q is not None):
                    row = row % self.packed_seqlen_q
                diagonal_end = row + 1
                if cutlass.const_expr(self.bottom_right):
                    diagonal_end = diagonal_end + self.causal_offset
                key_limit = cutlass.min(diagonal_end, self.seqlen_k)
            # Keys this thread may keep in row r, counted from its first key.
            keys_left = key_limit - first_key
            for c in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[1])):
                masked = offsets[0, c][1] >= keys_left
                acc_S_mn[r, c] = cutlass.Float32(cutlass.select_(masked, -cutlass.Float32.inf, acc_S_mn[r, c]))


class OnlineSoftmax:
    """Running ``row_max`` and ``row_sum`` of the rows this thread holds, in registers.

    ``row_max`` is the maximum of S · softmax_scale_log2: log2 units of the scaled scores, as in every
    stack. Row sums stay per-thread partial sums during the loop (each lane sums its own columns) and
    are reduced across the quad once, in :meth:`finalize`; the maximum must agree across the quad at
    every step, so it is reduced each block.

    Lazy rescaling: ``row_max`` is the reference P is taken against, and it only moves when a block's
    maximum exceeds it by more than :data:`RESCALE_THRESHOLD`. Until then P = exp2(S · scale_log2 -
    row_max) is at most 2^threshold, harmless in fp32 sums and bf16/fp16 P, and O keeps its scale, so
    :meth:`rescale` skips the 128 multiplies of a thread's O rows. On random data the maximum settles
    within the first few blocks, so almost every block skips them; the result is exact because O and
    the row sum always share one reference maximum and it cancels in the final division.

    ``_hopper_device.OnlineSoftmax`` is the WGMMA counterpart (``hopper``, ``fp8``): another fragment
    layout, FP8's P offset and key-block scales, and an LSE from ``finalize``; same names and units.
    """

    def __init__(self, rows: int, softmax_scale_log2: cutlass.Float32):
        self.softmax_scale_log2 = softmax_scale_log2
        self.row_max = cute.make_rmem_tensor(rows, cutlass.Float32)
        self.row_sum = cute.make_rmem_tensor(rows, cutlass.Float32)
        self.row_max.fill(-cutlass.Float32.inf)
        self.row_sum.fill(0.0)
        # Whether some row of this thread moved its row_max in the last update (read by rescale in
        # the same block; a scalar, not a register tensor, as the ordering of the PTX depends on it).
        self.moved = cutlass.Boolean(False)

    @cute.jit
    def update(self, acc_S: cute.Tensor) -> cute.Tensor:
        """S → P = exp2(S · scale_log2 − row_max) in place and the row sums; returns the rescale factor
        of each row (exactly 1 where ``row_max`` did not move) for :meth:`rescale`."""
        acc_S_mn = rows_by_cols(acc_S)
        rows = cute.size(acc_S_mn, mode=[0])
        scale_log2 = self.softmax_scale_log2
        # Local names: the DSL's dynamic `if` below may write tensors, but not attributes of self.
        row_max, row_sum = self.row_max, self.row_sum
        row_scale = cute.make_rmem_tensor(rows, cutlass.Float32)
        moved = cutlass.Boolean(False)
        for r in cutlass.range_constexpr(rows):
            block_max = acc_S_mn[r, 0]
            for c in cutlass.range_constexpr(1, cute.size(acc_S_mn, mode=[1])):
                block_max = cute.arch.fmax(block_max, acc_S_mn[r, c])
            block_max_scaled = quad_allreduce(block_max, cute.arch.fmax) * scale_log2
            row_scale[r] = cutlass.Float32(1.0)
            # All four lanes of the row see the same values, so they agree. The first block with a
            # visible key always moves the maximum (-inf + threshold = -inf; the factor is then 0).
            if block_max_scaled > row_max[r] + RESCALE_THRESHOLD:
                row_scale[r] = cute.math.exp2(row_max[r] - block_max_scaled, fastmath=True)
                row_max[r] = block_max_scaled
                moved = cutlass.Boolean(True)
            row_sum[r] = row_sum[r] * row_scale[r]
            # Guard: a row that has seen only masked keys keeps -inf; subtract 0 instead so that
            # exp2(-inf - -inf) = NaN never happens (its P is then 0).
            reference = row_max[r]
            if reference == -cutlass.Float32.inf:
                reference = cutlass.Float32(0.0)
            block_sum = cutlass.Float32(0.0)
            for c in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[1])):
                p = cute.math.exp2(acc_S_mn[r, c] * scale_log2 - reference, fastmath=True)
                acc_S_mn[r, c] = p
                block_sum = block_sum + p
            row_sum[r] = row_sum[r] + block_sum
        self.moved = moved
        return row_scale

    @cute.jit
    def rescale(self, acc_O: cute.Tensor, row_scale: cute.Tensor):
        """O *= row_scale row by row, skipped when no row of this warp moved its ``row_max``: one
        warp-uniform branch for all rows, so no divergence, and the multiplies stay one block."""
        acc_O_mn = rows_by_cols(acc_O)
        if cute.arch.vote_any_sync(self.moved):
            for r in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[0])):
                for c in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[1])):
                    acc_O_mn[r, c] = acc_O_mn[r, c] * row_scale[r]

    @cute.jit
    def finalize(self, acc_O: cute.Tensor, lse: cute.Tensor | None = None):
        """O /= row_sum; a row with no visible key (sum 0) is written as zeros, not inf/NaN. With
        ``lse`` (one fp32 register per row of this thread, compile time: only when the LSE is
        returned), also each row's natural-log LSE = (row_max + log2(row_sum)) * ln 2, -inf for a row
        with no visible key (as ``_hopper_device.OnlineSoftmax.finalize`` returns it)."""
        acc_O_mn = rows_by_cols(acc_O)
        for r in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[0])):
            total = quad_allreduce(self.row_sum[r], _add)
            inv_total = 0.0 if total == 0.0 else cute.arch.rcp_approx(total)
            if cutlass.const_expr(lse is not None):
                log_sum_exp = (self.row_max[r] + cute.math.log2(total, fastmath=True)) * LN_2
                lse[r] = cutlass.Float32(cutlass.select_(total == 0.0, -cutlass.Float32.inf, log_sum_exp))
            for c in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[1])):
                acc_O_mn[r, c] = acc_O_mn[r, c] * inv_total
