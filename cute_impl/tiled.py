"""cute/tiled — FlashAttention-2 on tensor cores, Ampere-style (counterpart: ``triton_impl/tiled.py``).

What it adds over ``cute/online``: both GEMMs of the inner step (``S = Q Kᵀ`` and ``O += P V``) run on
the tensor cores through the warp-level ``mma.sync.m16n8k16`` (``MmaF16BF16Op``) with fp32
accumulators, instead of fp32 FMAs on the CUDA cores. S and P never leave the registers: the
accumulator fragment of the first MMA is, after a cast to fp16/bf16, exactly the A-operand fragment
of the second one, so P is reinterpreted in place. Global→shared copies use ``cp.async`` so the
loads bypass the registers. This removes the CUDA-core FLOP ceiling of the previous rung.

What it deliberately leaves out (the next rung, ``cute/pipelined``, adds them): shared memory is
plain row-major, so the shared→register loads are scalar ``ld.shared`` with bank conflicts; there is
one K/V buffer and every tile is loaded with "commit, wait for all, barrier", so the tensor cores
idle while the next tile streams in.

Shapes: q (B, H, Sq, D), k and v (B, Hkv, Sk, D), o (B, H, Sq, D), SDPA's layout; lse (B, H, Sq)
fp32 when returned. One CTA of ``num_threads`` threads computes one ``tile_m``-row block of O for one
(batch, head).

Algorithm (the sections of :meth:`TiledAttentionKernel.kernel`):
1. Tiles of this CTA: Q rows ``[m_block * tile_m, +tile_m)``, K and V of its KV head; this
   sequence's ``seqlen_k`` and ``causal_offset``; the K/V blocks it must visit are
   ``n_block < n_block_max``, where causal masking (row i sees keys j <= i + causal_offset) drops
   every block to the right of the diagonal: fully masked tiles are never loaded. (``cute/pipelined``
   calls these ``SeqlenInfo`` and ``BlockRange``; here they are a few lines, so the rung reads alone.)
2. Load Q to shared memory with ``cp.async`` (rows past Sq are zero-filled).
3. For each K/V block, last block first (it carries the masks, see 4):
   a. ``cp.async`` K and V to shared memory, commit, wait for all groups, barrier.
   b. ``S = Q Kᵀ`` with ``mma.sync``; operands read from shared memory into registers per k-step.
   c. Mask: keys past seqlen_k and, when causal, keys right of the diagonal get ``-inf``. Only the first
      ``n_masked_blocks`` iterations can need it; the rest run the unmasked variant.
   d. Online softmax in registers: the row maximum is reduced across the quad of 4 lanes that
      shares a row of the MMA accumulator (``shfl.bfly`` 2 and 1) and kept as ``row_max``, the
      maximum of ``S * softmax_scale_log2`` (log2 units of the scaled scores, as in every stack);
      ``P = exp2(S * softmax_scale_log2 - row_max)``, the accumulator and the row sum are rescaled
      by ``exp2(row_max_old - row_max_new)``; a row whose maximum is still ``-inf`` (all keys
      masked so far) uses 0 as its maximum so no NaN appears.
   e. ``O += P V``: P cast to the input dtype and viewed as the A operand; V read transposed
      through a (D, tile_n) view of its shared tile. Barrier before the buffers are overwritten.
4. Epilogue: row sums reduced across the quad, ``O /= row_sum``, cast, stored to global memory
   from the accumulator fragment with a per-row predicate (rows past Sq are not written); with
   ``return_lse``, each row's LSE too.

Data movement: HBM →(cp.async.cg, 16 B per thread)→ SMEM →(ld.shared, 32-bit pairs for Q/K and
16-bit scalars for the transposed V)→ registers →(mma.sync m16n8k16)→ fp32 registers → HBM (st.global).

Tiles: tile_m = 64 rows of Q over 4 warps (each warp owns 16 rows), tile_n = 64 keys.
Shared memory at D = 128: Q 64·128·2 B = 16 KiB + K 16 KiB + V 16 KiB = 48 KiB (24 KiB at D = 64);
registers per thread at D = 128: O accumulator 16·128/32 = 64 fp32, S accumulator 16·64/32 = 32
fp32, P 16 packed registers, plus the operands of one k-step and the scalar loads of V. This fits
without spills at every supported configuration (``tests/test_cute_tiled_pipelined.py`` checks it;
the registers per thread are in the static table), while 32 rows per warp would hold twice the O
and S accumulators and spill.

Problem features (each a compile-time flag of :class:`TileConfig`, so the canonical problem's kernel
is unchanged), as ``cute/pipelined`` implements them: GQA/MQA (K and V read at the KV head
``head // (H // Hkv)``, never repeated); the bottom-right causal alignment (``causal_offset`` =
seqlen_k - Sq shifts the diagonal in the block range and the mask; one more masked block, since the
shifted diagonal crosses ``tile_m / tile_n + 1`` blocks); ``cache_seqlens`` ((B,) int32, contiguous:
each sequence's ``seqlen_k``, clamped to [0, Sk], cuts the key range, predicates the K/V loads and
sets the bottom-right offset); ``return_lse`` (the epilogue forms each row's natural-log LSE,
(row_max + log2(row_sum)) · ln 2, and stores it; ``run()`` returns (O, lse)). A tile none of whose
rows sees a key visits no block: O = 0, LSE = -inf.

Backward (``common.attention`` with inputs that require grad): ``cute_impl/backward/tiled.py``, from
this rung's O and LSE.

Constraints: fp16/bf16, D in {64, 128}; any Sq, Sk >= 1; softmax_scale > 0
(``row_max`` is taken as max(S) · softmax_scale_log2); compute capability >= 8.0 (``mma.sync`` bf16
and ``cp.async`` are sm_80 features; Hopper runs them too).

What the measurements taught (figures in the generated table of ``docs/ladder.md``; the A/B of the
tiles in ``docs/perf-log.md``, "Figures moved out of rung docstrings"): halving the rows per CTA to
avoid spills costs speed, because every K/V tile is then loaded and read from shared memory for
half as much MMA work. The tensor cores are fed, but not fast enough: per 16-wide k-step every warp
issues scalar ``ld.shared`` (8-way bank conflicts on the unswizzled rows) and each K/V tile is
waited for in full before any MMA starts. ``cute/pipelined`` removes exactly these two stalls.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch

from common.contract.capability import FEATURES
from common.contract.problem import Problem
from cute_impl._host import (
    CompiledKernels,
    RungHost,
    attention_launch,
    cp_async_tiled_copy,
    fake_attention_arguments,
    feature_flags,
    generic_view,
    mma_sync_supports,
    positive_scale,
    qkv_shared_storage,
    query_tile_grid,
    static_head_dim_view,
    warp_tiled_mma,
)
from cute_impl.backward import tiled as tiled_backward

LOG2_E = math.log2(math.e)
# ln 2: the LSE is returned in natural-log units, row_max is in log2 units.
LN_2 = math.log(2.0)
HEAD_DIMS = (64, 128)
SMEM_ALIGN_BYTES = 128
# Lanes of an m16n8k16 accumulator that hold pieces of the same row: a quad of 4, combined by
# butterfly shuffles with these lane distances.
QUAD_SHUFFLE_OFFSETS = (2, 1)


@dataclass(frozen=True)
class TileConfig:
    """Everything that changes the generated code (the compile-cache key)."""

    dtype: torch.dtype
    head_dim: int
    causal: bool
    tile_m: int = 64
    tile_n: int = 64
    num_threads: int = 128
    # Problem features, all compile time so that the canonical kernel stays as it was.
    gqa: bool = False  # K and V read at the KV head head // (H // Hkv), Hkv < H
    bottom_right: bool = False  # causal diagonal shifted by causal_offset = seqlen_k - Sq
    has_cache_seqlens: bool = False  # a (B,) int32 kernel argument: each sequence's seqlen_k
    return_lse: bool = False  # the epilogue also writes the (B, H, Sq) fp32 LSE


class TiledAttentionKernel:
    """FA2 forward with ``mma.sync``, single-stage ``cp.async`` and unswizzled shared memory."""

    def __init__(self, config: TileConfig):
        self.head_dim = config.head_dim
        self.causal = config.causal
        self.tile_m = config.tile_m
        self.tile_n = config.tile_n
        self.threads_per_cta = config.num_threads
        self.gqa = config.gqa
        self.bottom_right = config.bottom_right
        self.has_cache_seqlens = config.has_cache_seqlens
        self.return_lse = config.return_lse
        # Causal: the blocks that cross the diagonal of a tile_m-row tile (bottom-right, the diagonal
        # is shifted by causal_offset, not a multiple of tile_n, so it crosses one block more);
        # otherwise the last block, the only one that can be cut by seqlen_k.
        self.n_masked_blocks = self.tile_m // self.tile_n if self.causal else 1
        if self.causal and self.bottom_right:
            self.n_masked_blocks += 1

    # ------------------------------------------------------------------------------------------
    # Host side of the launch: layouts, copy atoms, tiled MMA, grid (shared with cute/pipelined).
    # ------------------------------------------------------------------------------------------
    @cute.jit
    def __call__(
        self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor | None,
        mCacheSeqlens: cute.Tensor | None, softmax_scale: cutlass.Float32, stream: cuda.CUstream,
    ):  # fmt: skip
        """q, o (B, H, Sq, D), k, v (B, Hkv, Sk, D); ``mLSE`` the (B, H, Sq) fp32 LSE when returned and
        ``mCacheSeqlens`` the (B,) int32 key lengths when given, else None (compile time)."""
        mCacheSeqlens = generic_view(mCacheSeqlens)  # read through a generic pointer (``_host.generic_view``)
        dtype = mQ.element_type
        mQ, mK, mV, mO = [static_head_dim_view(t, self.head_dim) for t in (mQ, mK, mV, mO)]
        # Plain row-major tiles: consecutive rows of 128 (or 64) elements share banks, which is
        # what the swizzle of the next rung removes.
        sQ_layout = cute.make_layout((self.tile_m, self.head_dim), stride=(self.head_dim, 1))
        sKV_layout = cute.make_layout((self.tile_n, self.head_dim), stride=(self.head_dim, 1))
        self.kernel(
            mQ,
            mK,
            mV,
            mO,
            mLSE,
            mCacheSeqlens,
            softmax_scale * LOG2_E,
            sQ_layout,
            sKV_layout,
            cp_async_tiled_copy(dtype, self.threads_per_cta, row_elems=self.head_dim),
            warp_tiled_mma(dtype, self.threads_per_cta),
            qkv_shared_storage(dtype, sQ_layout, sKV_layout, SMEM_ALIGN_BYTES),
        ).launch(grid=query_tile_grid(mQ, self.tile_m), block=[self.threads_per_cta, 1, 1], stream=stream)

    # ------------------------------------------------------------------------------------------
    # Device side.
    # ------------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor | None,
        mCacheSeqlens: cute.Tensor | None, softmax_scale_log2: cutlass.Float32, sQ_layout: cute.Layout,
        sKV_layout: cute.Layout, gmem_tiled_copy: cute.TiledCopy, tiled_mma: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):  # fmt: skip
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, batch = cute.arch.block_idx()
        seqlen_q = mQ.shape[2]
        seqlen_k = mK.shape[2]

        # ---- 1. Tiles of this CTA and the range of K/V blocks it visits ----------------------
        # This sequence's seqlen_k: its cache_seqlens entry, clamped to [0, Sk] so that a bad length
        # cannot reach past the cache. Row i sees keys j <= i + causal_offset: 0 top-left,
        # seqlen_k - Sq bottom-right.
        if cutlass.const_expr(self.has_cache_seqlens):
            seqlen_k = cutlass.min(cutlass.max(mCacheSeqlens[batch], 0), seqlen_k)
        causal_offset = 0
        if cutlass.const_expr(self.bottom_right):
            causal_offset = seqlen_k - seqlen_q
        n_block_max = cute.ceil_div(seqlen_k, self.tile_n)
        if cutlass.const_expr(self.causal):
            if cutlass.const_expr(self.bottom_right):
                # The tile's last row bounds the keys worth loading; none at all (no block visited:
                # O = 0, LSE = -inf) when that bound is not positive.
                last_row_end = cutlass.max((m_block + 1) * self.tile_m + causal_offset, 0)
                n_block_max = cutlass.min(n_block_max, cute.ceil_div(last_row_end, self.tile_n))
            else:
                # Keys beyond the last row of this tile are masked for every row: skip those tiles.
                n_block_max = cutlass.min(n_block_max, cute.ceil_div((m_block + 1) * self.tile_m, self.tile_n))
        # GQA: K and V of the KV head this query head reads, never a repeated copy.
        kv_head = head
        if cutlass.const_expr(self.gqa):
            kv_head = head // (mQ.shape[1] // mK.shape[1])
        tile_q = (self.tile_m, self.head_dim)
        tile_kv = (self.tile_n, self.head_dim)
        gQ = cute.local_tile(mQ[batch, head, None, None], tile_q, (m_block, 0))  # (tile_m, D)
        gK = cute.local_tile(mK[batch, kv_head, None, None], tile_kv, (None, 0))  # (tile_n, D, n_blocks)
        gV = cute.local_tile(mV[batch, kv_head, None, None], tile_kv, (None, 0))  # (tile_n, D, n_blocks)
        gO = cute.local_tile(mO[batch, head, None, None], tile_q, (m_block, 0))  # (tile_m, D)
        # Identity tensors: each element holds its own (row, col) coordinate, for predicates.
        cQ = cute.local_tile(cute.make_identity_tensor((seqlen_q, self.head_dim)), tile_q, (m_block, 0))
        cKV = cute.local_tile(cute.make_identity_tensor((seqlen_k, self.head_dim)), tile_kv, (None, 0))

        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout)  # (tile_m, D)
        sK = storage.sK.get_tensor(sKV_layout)  # (tile_n, D)
        sV = storage.sV.get_tensor(sKV_layout)  # (tile_n, D)
        # V as the B operand of O += P V must be indexed (D, tile_n): same memory, transposed view.
        sVt = cute.composition(sV, cute.make_layout((self.head_dim, self.tile_n), stride=(self.tile_n, 1)))

        gmem_thr_copy = gmem_tiled_copy.get_slice(tidx)
        tQgQ = gmem_thr_copy.partition_S(gQ)  # (CPY, CPY_M, CPY_D)
        tQsQ = gmem_thr_copy.partition_D(sQ)  # (CPY, CPY_M, CPY_D)
        tQcQ = gmem_thr_copy.partition_S(cQ)  # (CPY, CPY_M, CPY_D)
        tKgK = gmem_thr_copy.partition_S(gK)  # (CPY, CPY_N, CPY_D, n_blocks)
        tKsK = gmem_thr_copy.partition_D(sK)  # (CPY, CPY_N, CPY_D)
        tVgV = gmem_thr_copy.partition_S(gV)  # (CPY, CPY_N, CPY_D, n_blocks)
        tVsV = gmem_thr_copy.partition_D(sV)  # (CPY, CPY_N, CPY_D)
        tKVcKV = gmem_thr_copy.partition_S(cKV)  # (CPY, CPY_N, CPY_D, n_blocks)

        thr_mma = tiled_mma.get_slice(tidx)
        tSsQ = thr_mma.partition_A(sQ)  # (MMA, MMA_M, MMA_K)
        tSsK = thr_mma.partition_B(sK)  # (MMA, MMA_N, MMA_K)
        tOsVt = thr_mma.partition_B(sVt)  # (MMA, MMA_D, MMA_K)
        tSrQ = thr_mma.make_fragment_A(tSsQ)
        tSrK = thr_mma.make_fragment_B(tSsK)
        tOrVt = thr_mma.make_fragment_B(tOsVt)
        acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((self.tile_m, self.head_dim)), cutlass.Float32)
        acc_O.fill(0.0)
        rows_per_thread = cute.size(acc_O, mode=[0, 1]) * cute.size(acc_O, mode=[1])
        row_max = cute.make_rmem_tensor(rows_per_thread, cutlass.Float32)
        row_sum = cute.make_rmem_tensor(rows_per_thread, cutlass.Float32)
        row_max.fill(-cutlass.Float32.inf)
        row_sum.fill(0.0)

        # ---- 2. Q to shared memory (joins the first K/V group of 3a) --------------------------
        for m in cutlass.range_constexpr(cute.size(tQsQ, mode=[1])):
            if tQcQ[0, m, 0][0] < seqlen_q:
                cute.copy(gmem_tiled_copy, tQgQ[None, m, None], tQsQ[None, m, None])
            else:
                tQsQ[None, m, None].fill(0)

        # ---- 3. K/V blocks, last first: masked iterations, then the unmasked rest ------------
        # Operands bound once: an iteration passes only its block (and whether it masks).
        load_kv = partial(self.load_kv, gmem_tiled_copy, tKgK, tKsK, tVgV, tVsV, tKVcKV, seqlen_k=seqlen_k)
        attend = partial(
            self.attend_block, tiled_mma, thr_mma, tSsQ, tSrQ, tSsK, tSrK, tOsVt, tOrVt, acc_O, row_max, row_sum,
            softmax_scale_log2, m_block, seqlen_q, seqlen_k, causal_offset,
        )  # fmt: skip
        for step in cutlass.range_constexpr(self.n_masked_blocks):
            if step < n_block_max:
                n_block = n_block_max - 1 - step
                load_kv(n_block)
                attend(n_block, masked=True)
        for step in cutlass.range(self.n_masked_blocks, n_block_max, 1):
            n_block = n_block_max - 1 - step
            load_kv(n_block)
            attend(n_block, masked=False)

        # ---- 4. Epilogue: normalise, cast, predicated store (and the LSE) --------------------
        lse = cute.make_rmem_tensor(rows_per_thread, cutlass.Float32) if cutlass.const_expr(self.return_lse) else None
        acc_O_mn = _rows_by_cols(acc_O)
        for r in cutlass.range_constexpr(rows_per_thread):
            total = _quad_allreduce(row_sum[r], _add)
            # A row with no visible key would have total 0; write zeros rather than inf/NaN.
            inv_total = 0.0 if total == 0.0 else cute.arch.rcp_approx(total)
            if cutlass.const_expr(self.return_lse):
                # Natural-log LSE = (row_max + log2(row_sum)) · ln 2; -inf for a row with no visible key.
                log_sum_exp = (row_max[r] + cute.math.log2(total, fastmath=True)) * LN_2
                lse[r] = cutlass.Float32(cutlass.select_(total == 0.0, -cutlass.Float32.inf, log_sum_exp))
            for c in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[1])):
                acc_O_mn[r, c] = acc_O_mn[r, c] * inv_total
        rO = cute.make_fragment_like(acc_O, mO.element_type)
        rO.store(acc_O.load().to(mO.element_type))
        tOgO = thr_mma.partition_C(gO)  # (MMA, MMA_M, MMA_D)
        tOcO = thr_mma.partition_C(cute.make_identity_tensor(tile_q))  # (row, col) inside the tile
        for i in cutlass.range_constexpr(cute.size(rO)):
            if m_block * self.tile_m + tOcO[i][0] < seqlen_q:
                tOgO[i] = rO[i]
        if cutlass.const_expr(self.return_lse):
            # The first lane of each row's quad writes the LSE of its rows (rows past Sq are skipped);
            # lse holds one value per row of _rows_by_cols, in that order.
            gLSE = mLSE[batch, head, None]  # (Sq,)
            tOcO_mn = _rows_by_cols(tOcO)
            if tOcO_mn[0, 0][1] == 0:
                for r in cutlass.range_constexpr(rows_per_thread):
                    row = m_block * self.tile_m + tOcO_mn[r, 0][0]
                    if row < seqlen_q:
                        gLSE[row] = lse[r]

    @cute.jit
    def load_kv(
        self, gmem_tiled_copy: cute.TiledCopy, tKgK: cute.Tensor, tKsK: cute.Tensor, tVgV: cute.Tensor,
        tVsV: cute.Tensor, tKVcKV: cute.Tensor, n_block: cutlass.Int32, seqlen_k: cutlass.Int32,
    ):  # fmt: skip
        """Single stage: every thread must be done with the previous tile before it is
        overwritten, and the new tile must have landed before anyone reads it."""
        cute.arch.barrier()
        for n in cutlass.range_constexpr(cute.size(tKsK, mode=[1])):
            if tKVcKV[0, n, 0, n_block][0] < seqlen_k:
                cute.copy(gmem_tiled_copy, tKgK[None, n, None, n_block], tKsK[None, n, None])
                cute.copy(gmem_tiled_copy, tVgV[None, n, None, n_block], tVsV[None, n, None])
            else:
                # Past Sk: zeros, since P = 0 times uninitialised shared memory could be NaN.
                tKsK[None, n, None].fill(0)
                tVsV[None, n, None].fill(0)
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()

    @cute.jit
    def attend_block(
        self, tiled_mma: cute.TiledMma, thr_mma: cute.ThrMma, tSsQ: cute.Tensor, tSrQ: cute.Tensor, tSsK: cute.Tensor,
        tSrK: cute.Tensor, tOsVt: cute.Tensor, tOrVt: cute.Tensor, acc_O: cute.Tensor, row_max: cute.Tensor,
        row_sum: cute.Tensor, softmax_scale_log2: cutlass.Float32, m_block: cutlass.Int32, seqlen_q: cutlass.Int32,
        seqlen_k: cutlass.Int32, causal_offset: cutlass.Int32, n_block: cutlass.Int32, masked: cutlass.Constexpr,
    ):  # fmt: skip
        """One K/V block: S = Q Kᵀ → mask → online softmax → rescale O → O += P V."""
        # ---- 3b. S = Q Kᵀ, one 16-wide k-step of D at a time ---------------------------------
        acc_S = cute.make_rmem_tensor(thr_mma.partition_shape_C((self.tile_m, self.tile_n)), cutlass.Float32)
        acc_S.fill(0.0)
        for k in cutlass.range_constexpr(cute.size(tSsQ, mode=[2])):
            cute.autovec_copy(tSsQ[None, None, k], tSrQ[None, None, k])
            cute.autovec_copy(tSsK[None, None, k], tSrK[None, None, k])
            cute.gemm(tiled_mma, acc_S, tSrQ[None, None, k], tSrK[None, None, k], acc_S)

        # ---- 3c. Mask keys past seqlen_k and, when causal, right of the diagonal -------------
        acc_S_mn = _rows_by_cols(acc_S)  # (rows of this thread, cols of this thread)
        if cutlass.const_expr(masked):
            cS = cute.local_tile(
                cute.make_identity_tensor((seqlen_q, seqlen_k)), (self.tile_m, self.tile_n), (m_block, n_block)
            )
            tScS_mn = _rows_by_cols(thr_mma.partition_C(cS))
            for r in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[0])):
                key_limit = seqlen_k
                if cutlass.const_expr(self.causal):
                    diagonal_end = tScS_mn[r, 0][0] + 1
                    if cutlass.const_expr(self.bottom_right):
                        diagonal_end = diagonal_end + causal_offset
                    key_limit = cutlass.min(diagonal_end, seqlen_k)
                for c in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[1])):
                    masked = tScS_mn[0, c][1] >= key_limit
                    # A select, not an `if`: the DSL lowers a dynamic `if` that writes one element of a
                    # register tensor to selects over the whole tensor.
                    acc_S_mn[r, c] = cutlass.Float32(cutlass.select_(masked, -cutlass.Float32.inf, acc_S_mn[r, c]))

        # ---- 3d. Online softmax, row by row of this thread -----------------------------------
        acc_O_mn = _rows_by_cols(acc_O)
        for r in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[0])):
            block_max = acc_S_mn[r, 0]
            for c in cutlass.range_constexpr(1, cute.size(acc_S_mn, mode=[1])):
                block_max = cute.arch.fmax(block_max, acc_S_mn[r, c])
            # row_max is the maximum of S · softmax_scale_log2 (log2 units of the scaled scores); a
            # positive scale commutes with the maximum, so the block maximum is scaled once per row.
            block_max_scaled = _quad_allreduce(block_max, cute.arch.fmax) * softmax_scale_log2
            new_max = cute.arch.fmax(row_max[r], block_max_scaled)
            # Guard: a row that has seen only masked keys keeps -inf; subtract 0 instead so that
            # exp2(-inf - -inf) = NaN never happens (its P and rescale factor become 0).
            reference = 0.0 if new_max == -cutlass.Float32.inf else new_max
            rescale = cute.math.exp2(row_max[r] - reference, fastmath=True)
            block_sum = cutlass.Float32(0.0)
            for c in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[1])):
                p = cute.math.exp2(acc_S_mn[r, c] * softmax_scale_log2 - reference, fastmath=True)
                acc_S_mn[r, c] = p
                block_sum = block_sum + p
            # Row sums stay per-thread partial sums; they are reduced across the quad once, at the end.
            row_sum[r] = row_sum[r] * rescale + block_sum
            row_max[r] = new_max
            for c in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[1])):
                acc_O_mn[r, c] = acc_O_mn[r, c] * rescale

        # ---- 3e. O += P V, P reused in registers as the A operand ----------------------------
        rP = cute.make_fragment_like(acc_S, tSrQ.element_type)
        rP.store(acc_S.load().to(tSrQ.element_type))
        tOrP = _accumulator_as_operand_a(rP)  # (MMA, MMA_M, MMA_K = tile_n / 16)
        for k in cutlass.range_constexpr(cute.size(tOsVt, mode=[2])):
            cute.autovec_copy(tOsVt[None, None, k], tOrVt[None, None, k])
            cute.gemm(tiled_mma, acc_O, tOrP[None, None, k], tOrVt[None, None, k], acc_O)


# ----------------------------------------------------------------------------------------------
# Register-fragment helpers (the m16n8k16 accumulator layout).
# ----------------------------------------------------------------------------------------------
def _rows_by_cols(acc: cute.Tensor) -> cute.Tensor:
    """View an accumulator ((2 cols, 2 rows), MMA_M, MMA_N) as (rows, cols) of this thread."""
    flat = cute.make_layout(acc.shape)
    rows = ((flat.shape[0][1], flat.shape[1]), (flat.stride[0][1], flat.stride[1]))
    cols = ((flat.shape[0][0], flat.shape[2]), (flat.stride[0][0], flat.stride[2]))
    by_rows = cute.make_layout((rows[0], cols[0]), stride=(rows[1], cols[1]))
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, by_rows))


def _accumulator_as_operand_a(rP: cute.Tensor) -> cute.Tensor:
    """Regroup an m16n8 accumulator ((2, 2), MMA_M, MMA_N) as m16k16 A operands
    ((2, 2, 2), MMA_M, MMA_N / 2): two neighbouring n8 tiles are the two k8 halves of one k16."""
    divided = cute.logical_divide(rP.layout, (None, None, 2))
    shape = ((divided.shape[0], divided.shape[2][0]), divided.shape[1], divided.shape[2][1])
    stride = ((divided.stride[0], divided.stride[2][0]), divided.stride[1], divided.stride[2][1])
    return cute.make_tensor(rP.iterator, cute.make_layout(shape, stride=stride))


def _add(a: cutlass.Float32, b: cutlass.Float32) -> cutlass.Float32:
    return a + b


def _quad_allreduce(value: cutlass.Float32, op: Any) -> cutlass.Float32:
    """Combine the values of the 4 lanes that hold one accumulator row; all 4 get the result."""
    for offset in QUAD_SHUFFLE_OFFSETS:
        value = op(value, cute.arch.shuffle_sync_bfly(value, offset=offset))
    return value


# ----------------------------------------------------------------------------------------------
# Host function: validate, compile once per configuration, allocate O, launch.
# ----------------------------------------------------------------------------------------------
def tile_config(problem: Problem) -> TileConfig:
    """The compile-cache key of this problem: head dim, causal, and the problem's features as
    compile-time flags (all off for the canonical problem)."""
    return TileConfig(dtype=problem.dtype, head_dim=problem.head_dim, causal=problem.causal, **feature_flags(problem))


# The host entry points: validate (head dims, every feature, a positive scale) → plan (the TileConfig,
# the compile key; GPU launches and CPU compiles alike compile from fakes) → bind (O and the LSE).
HOST = RungHost(
    "cute/tiled",
    CompiledKernels(TiledAttentionKernel, fake_attention_arguments),
    plan=tile_config,
    plan_launch=partial(attention_launch, plan=tile_config),
    head_dims=HEAD_DIMS,
    problem_check=positive_scale,
)
prepare, bind, compile_sm90 = HOST.prepare, HOST.bind, HOST.compile_sm90


# ----------------------------------------------------------------------------------------------
# Capability check.
# ----------------------------------------------------------------------------------------------
def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    """The capability check: a CUDA device of sm_80+ (mma.sync bf16, cp.async), fp16/bf16, D 64 or 128
    (D=256 has not been validated on the GPU for this rung), softmax_scale > 0. Every problem feature
    is implemented (GQA, both causal alignments, ``cache_seqlens``, the LSE)."""
    return mma_sync_supports("cute/tiled", problem, device, head_dims=HEAD_DIMS, features=FEATURES)


IMPLEMENTATION = HOST.implementation(
    supports=supports, required_ptx=("mma.sync", "cp.async"), source_file=__file__, backward=tiled_backward.BACKWARD
)
