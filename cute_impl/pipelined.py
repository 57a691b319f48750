"""cute/pipelined — FA2 with swizzled shared memory, ldmatrix and a cp.async ring
(counterpart: ``triton_impl/pipelined.py``).

What it adds over ``cute/tiled``, and which bottleneck each step removes:

* **Swizzled shared memory** (``Swizzle<3,3,3>`` over 8 × 64-element atoms): the 16-byte chunks of
  a row are XOR-permuted with the row index, so the 8 rows an ``ldmatrix`` phase reads fall in 8
  different bank groups. The unswizzled tiles of ``tiled`` serialise those reads 8 ways.
* **ldmatrix** for shared→register: one instruction loads four 8×8 matrices straight into the MMA
  fragment layout (``.trans`` for V, which is stored (keys, D) but consumed as the B operand
  (D, keys)), replacing many scalar ``ld.shared``.
* **A multi-stage cp.async ring for K and V**: ``stages`` buffers; while block ``i`` is computed,
  blocks ``i+1 .. i+stages-1`` are in flight. Each iteration issues the load ``stages-1`` blocks
  ahead, commits it, and waits with ``cp.async.wait_group(stages-1)``, i.e. only for block ``i``,
  never ``wait_group(0)``: the tensor cores no longer idle while the next tile streams in.
* **Register double-buffering** inside the k-loops: the ldmatrix of the next piece (half the N
  columns of a k-step) is issued before the MMAs of the current one, so shared-memory latency
  hides behind tensor-core work while only two half-step operand buffers are live.
* **Lazy rescaling of O**: ``row_max`` (the reference P is taken against) only moves when a
  block's max exceeds it by more than ``RESCALE_THRESHOLD`` = 8 (log2 units, so 2^8); until then
  P <= 256 (safe in bf16/fp16 and the fp32 sums) and the multiplies that rescale a thread's O rows
  are skipped, decided by one warp-uniform branch (``vote.any``). The maximum of random scores
  settles within a few blocks, so almost every block skips the rescale; the result is exact, since
  O and the row sum share one reference and it cancels in the final division.
* Causal CTAs are launched heaviest first (largest ``m_block`` first) so the short diagonal tiles
  fill the tail of the grid.

Shapes: q (B, H, Sq, D), k and v (B, Hkv, Sk, D), o (B, H, Sq, D), lse (B, H, Sq) fp32. One CTA of ``num_warps`` warps
computes one ``tile_m``-row block of O for one (batch, head); each warp owns ``tile_m / num_warps``
rows, and its accumulator rows sit in quads of 4 lanes, as ``_device`` describes.

The kernel only orchestrates; the step's pieces are the CuTe stack's shared objects of
``_device.py``, named as in every stack: ``BlockRange``, ``AttentionMask``, ``OnlineSoftmax``
(``update``, ``rescale``, ``finalize``), and the ring refill and the two GEMMs of a step, which
``decode`` runs too (``refill_kv_ring``, ``scores``, ``values_product``). ``attend_block`` has its
operands bound once (``functools.partial``), so the main loop passes only the step and whether it masks.

Algorithm (the sections of :meth:`PipelinedAttentionKernel.kernel`):
1. Tiles of this CTA and its ``BlockRange`` (fully masked causal blocks are never visited).
2. Prologue: cp.async Q (rows past Sq zero-filled) and the first ``stages-1`` K/V blocks, one
   commit group per block; the first block visited is the last one, the only one cut by Sk, so only
   it needs row predicates (its rows past Sk are zero-filled).
3. Main loop over K/V blocks, last first; the top ``n_masked_blocks`` of the range run the masked
   variant (they come first), the rest the unmasked one:
   a. barrier (everyone is done with the slot about to be refilled), issue block ``i+stages-1``,
      commit, ``wait_group(stages-1)``, barrier: block ``i`` is in shared memory.
   b. ``S = Q Kᵀ``: ldmatrix Q and K half k-step by half k-step, double-buffered, ``mma.sync``
      m16n8k16.
   c. ``AttentionMask.apply`` (masked iterations only): -inf past Sk and right of the causal diagonal.
   d. ``OnlineSoftmax.update``: quad-reduced ``row_max`` (the maximum of S · softmax_scale_log2),
      ``P = exp2(S · softmax_scale_log2 − row_max)``, the row sums; it returns the rescale factor,
      and ``rescale`` multiplies O by it only if some row of the warp moved its ``row_max``.
   e. ``O += P V``: P cast and reused in registers as the A operand; V via ``ldmatrix.trans``.
4. Epilogue: ``OnlineSoftmax.finalize`` (quad-reduced row sums, ``O /= row_sum``), cast, per-row
   predicated store.

Data movement: HBM →(cp.async.cg 16 B)→ swizzled SMEM ring →(ldmatrix.x4 / ldmatrix.x4.trans)→
registers →(mma.sync.m16n8k16, fp32 accumulate)→ registers → HBM (st.global, rows < Sq).

Tile budget (the comment on :data:`TILE_CONFIGS` has the arithmetic): tile_m = 128, 4 warps of
32 rows, 3 stages. D = 128: tile_n = 32, 80 KiB of shared memory, two CTAs per SM. D = 64:
tile_n = 64, 64 KiB. Every configuration is spill-free (``tests/test_cute_tiled_pipelined.py``
checks it; the registers per thread are in the static table). D = 256 is refused: the O
accumulator alone would be 256 fp32 registers per thread with 32 rows per warp.

Problem features (each a compile-time flag of :class:`TileConfig`, so the canonical problem's kernel
is unchanged): GQA/MQA (K and V read at ``kv_head_index(head)``, never repeated); the bottom-right
causal alignment (``SeqlenInfo.causal_offset`` = seqlen_k - Sq shifts the diagonal in ``BlockRange``
and ``AttentionMask``; one more unrolled masked block, since the shifted diagonal crosses
``tile_m / tile_n + 1`` blocks); ``cache_seqlens`` ((B,) int32, contiguous: each sequence's
``seqlen_k``, clamped to [0, Sk], cuts the key range, predicates the first block's loads and sets the
bottom-right offset); ``return_lse`` (``OnlineSoftmax.finalize`` forms each row's natural-log LSE, the
epilogue stores it; ``run()`` returns (O, lse)). A tile none of whose rows sees a key visits no block:
O = 0, LSE = -inf.

Backward (``common.attention`` with inputs that require grad): ``cute_impl/backward/tiled.py``, from
this rung's O and LSE.

Constraints: fp16/bf16, D in {64, 128}, any Sq, Sk >= 1, softmax_scale > 0
(``row_max`` is taken as max(S) · softmax_scale_log2), compute capability >= 8.0.

What the measurements taught (A/B runs in ``docs/perf-log.md``, "Figures moved out of rung
docstrings"; current figures in the generated table of ``docs/ladder.md``): removing the
bank-conflicted scalar shared loads and the exposed K/V load latency of ``cute/tiled`` is worth
several times its speed and reaches the hand-written CUDA of FA2. Why this tile at D = 128: a
64-key tile is faster but spills (the row sums and swizzled ldmatrix addresses) for every split of
the double-buffering tried; 8 warps of 16 rows do not spill but are slower, because each warp reads
the whole K and V tile for half the rows and one 8-warp CTA per SM stalls all its warps at each
barrier. The spill-free 32-key tile catches up with SDPA's FA2 backend through two changes: lazy
rescaling and a third K/V stage. The ceiling left is the ``mma.sync`` path itself: Hopper's
``wgmma`` (``cute/hopper``) issues warpgroup-wide MMAs straight from shared memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch

from common.contract.capability import FEATURES
from common.contract.problem import Problem
from cute_impl._device import (
    LOG2_E,
    AttentionMask,
    BlockRange,
    KVCopy,
    LdmatrixOperands,
    OnlineSoftmax,
    SeqlenInfo,
    kv_copy_partitions,
    kv_head_index,
    ldmatrix_operands,
    load_kv_block,
    refill_kv_ring,
    rows_by_cols,
    scores,
    values_product,
)
from cute_impl._host import (
    SWIZZLE_COLS,
    WARP_THREADS,
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
    swizzled_qkv_layouts,
    warp_tiled_mma,
)
from cute_impl.backward import tiled as tiled_backward

SMEM_ALIGN_BYTES = 1024
# All of the unified L1/shared array as shared memory: two CTAs of the largest tile need 192 KiB.
SMEM_CARVEOUT_PERCENT = 100


class TileShape(NamedTuple):
    """One entry of :data:`TILE_CONFIGS`: the tile and the warps that compute it."""

    tile_m: int
    tile_n: int
    stages: int  # depth of the K/V cp.async ring
    num_warps: int  # each warp owns tile_m / num_warps rows of Q (a multiple of 16)
    pieces_per_k_step: int  # register double-buffering: a k-step's B operand loads in this many pieces
    min_ctas_per_sm: int  # launch bound, 0 = none: ptxas caps registers at 65536 / (this · threads)


@dataclass(frozen=True)
class TileConfig:
    """Everything that changes the generated code (the compile-cache key)."""

    dtype: torch.dtype
    head_dim: int
    causal: bool
    shape: TileShape
    # Problem features, all compile time so that the canonical kernel stays as it was.
    gqa: bool = False  # K and V read at kv_head_index(head), Hkv < H
    bottom_right: bool = False  # causal diagonal shifted by causal_offset = seqlen_k - Sq
    has_cache_seqlens: bool = False  # a (B,) int32 kernel argument: each sequence's seqlen_k
    return_lse: bool = False  # the epilogue also writes the (B, H, Sq) fp32 LSE


# Budget per head dim (bf16/fp16; H200 SM: 227 KiB smem, 64 Ki registers):
#   D = 128, 4 warps (each warp 32 rows), the default (128, 32, 3, 4, 2, 0): O 32·128/32 = 128 fp32
#            + S 32·32/32 = 32 fp32 per thread, no spills, two CTAs per SM;
#            smem = Q 128·128·2 = 32 KiB + 3 stages · (K 32·128·2 + V 32·128·2) = 48 KiB → 80 KiB
#            (2 CTAs: 160 of 227 KiB). At tile_n = 64 (S 64 fp32) ptxas spills.
#   D = 128, 8 warps (each warp 16 rows), tile_n = 64: O 64 + S 32 fp32, no spills, 96 KiB smem,
#            one CTA per SM; measured slower than the default (docs/perf-log.md).
#   D = 64:  4 warps, smem = Q 16 KiB + 3 stages · 16 KiB = 64 KiB; O 64 fp32 + S 64 fp32 per thread.
# A bench script may replace an entry before prepare(): tile_config reads it there, and the compile
# cache is keyed on the whole TileConfig, so a replaced entry compiles afresh.
TILE_CONFIGS = {
    128: TileShape(tile_m=128, tile_n=32, stages=3, num_warps=4, pieces_per_k_step=2, min_ctas_per_sm=0),
    64: TileShape(tile_m=128, tile_n=64, stages=3, num_warps=4, pieces_per_k_step=2, min_ctas_per_sm=0),
}


class PipelinedAttentionKernel:
    """FA2 forward: swizzled SMEM, ldmatrix, ``stages``-deep cp.async ring, register double-buffering."""

    def __init__(self, config: TileConfig):
        shape = config.shape
        self.head_dim = config.head_dim
        self.causal = config.causal
        self.tile_m = shape.tile_m
        self.tile_n = shape.tile_n
        self.stages = shape.stages
        self.threads_per_cta = shape.num_warps * WARP_THREADS
        self.pieces_per_k_step = shape.pieces_per_k_step
        self.min_ctas_per_sm = shape.min_ctas_per_sm
        self.gqa = config.gqa
        self.bottom_right = config.bottom_right
        self.has_cache_seqlens = config.has_cache_seqlens
        self.return_lse = config.return_lse

    # ------------------------------------------------------------------------------------------
    # Host side of the launch: layouts, copy atoms, tiled MMA, grid (shared with cute/tiled).
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
        sQ_layout, sKV_layout = swizzled_qkv_layouts(self.tile_m, self.tile_n, self.head_dim, self.stages)
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
            # 8 threads cover one 64-element swizzle row with 16 B each.
            cp_async_tiled_copy(dtype, self.threads_per_cta, row_elems=SWIZZLE_COLS),
            warp_tiled_mma(dtype, self.threads_per_cta),
            qkv_shared_storage(dtype, sQ_layout, sKV_layout, SMEM_ALIGN_BYTES),
        ).launch(
            grid=query_tile_grid(mQ, self.tile_m),
            block=[self.threads_per_cta, 1, 1],
            min_blocks_per_mp=self.min_ctas_per_sm,
            # Only a launch bound above 1 needs the carveout (the DSL would otherwise query the device).
            preferred_smem_carveout=SMEM_CARVEOUT_PERCENT if self.min_ctas_per_sm > 1 else None,
            stream=stream,
        )

    # ------------------------------------------------------------------------------------------
    # Device side.
    # ------------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor | None,
        mCacheSeqlens: cute.Tensor | None, softmax_scale_log2: cutlass.Float32, sQ_layout: cute.ComposedLayout,
        sKV_layout: cute.ComposedLayout, gmem_tiled_copy: cute.TiledCopy, tiled_mma: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):  # fmt: skip
        tidx, _, _ = cute.arch.thread_idx()
        block_m, head, batch = cute.arch.block_idx()
        grid_m, _, _ = cute.arch.grid_dim()
        seqlen_q = mQ.shape[2]
        dtype = mQ.element_type

        # ---- 1. Tiles of this CTA and its K/V block range ------------------------------------
        # Largest m_block first: under causal masking it has the most blocks to visit.
        m_block = grid_m - 1 - block_m
        # This sequence's seqlen_k (its cache_seqlens entry, if any) and causal_offset.
        seqlen = SeqlenInfo.create(batch, seqlen_q, mK.shape[2], mCacheSeqlens, self.bottom_right)
        seqlen_k = seqlen.seqlen_k
        block_range = BlockRange.create(m_block, seqlen, self.tile_m, self.tile_n, self.causal)
        n_block_max = block_range.n_block_max
        # GQA: K and V of the KV head this query head reads, never a repeated copy.
        kv_head = head
        if cutlass.const_expr(self.gqa):
            kv_head = kv_head_index(head, mQ.shape[1], mK.shape[1])
        tile_q = (self.tile_m, self.head_dim)
        tile_kv = (self.tile_n, self.head_dim)
        gQ = cute.local_tile(mQ[batch, head, None, None], tile_q, (m_block, 0))  # (tile_m, D)
        gK = cute.local_tile(mK[batch, kv_head, None, None], tile_kv, (None, 0))  # (tile_n, D, n_blocks)
        gV = cute.local_tile(mV[batch, kv_head, None, None], tile_kv, (None, 0))  # (tile_n, D, n_blocks)
        gO = cute.local_tile(mO[batch, head, None, None], tile_q, (m_block, 0))  # (tile_m, D)
        cQ = cute.local_tile(cute.make_identity_tensor((seqlen_q, self.head_dim)), tile_q, (m_block, 0))
        cKV = cute.local_tile(cute.make_identity_tensor((seqlen_k, self.head_dim)), tile_kv, (None, 0))

        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout)  # (tile_m, D)
        sK = storage.sK.get_tensor(sKV_layout)  # (tile_n, D, stages)
        sV = storage.sV.get_tensor(sKV_layout)  # (tile_n, D, stages)
        # V as the B operand (D, tile_n) of O += P V: the same swizzled memory, transposed view.
        sVt = cute.composition(
            sV,
            cute.make_layout(
                (self.head_dim, self.tile_n, self.stages), stride=(self.tile_n, 1, self.tile_n * self.head_dim)
            ),
        )  # (D, tile_n, stages)

        gmem_thr_copy = gmem_tiled_copy.get_slice(tidx)
        tQgQ = gmem_thr_copy.partition_S(gQ)  # (CPY, CPY_M, CPY_D)
        tQsQ = gmem_thr_copy.partition_D(sQ)  # (CPY, CPY_M, CPY_D)
        tQcQ = gmem_thr_copy.partition_S(cQ)  # (CPY, CPY_M, CPY_D)
        kv_copy = kv_copy_partitions(gmem_tiled_copy, gmem_thr_copy, gK, sK, gV, sV, cKV)

        thr_mma = tiled_mma.get_slice(tidx)
        tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))  # (MMA, MMA_M, MMA_K)
        tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sK[None, None, 0]))  # (MMA, MMA_N, MMA_K)
        tOrVt = thr_mma.make_fragment_B(thr_mma.partition_B(sVt[None, None, 0]))  # (MMA, MMA_D, MMA_K)
        acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C(tile_q), cutlass.Float32)  # (MMA, MMA_M, MMA_D)
        acc_O.fill(0.0)

        smem_operands = ldmatrix_operands(tiled_mma, tidx, sQ, sK, sVt, tSrQ, tSrK, tOrVt)

        rows_per_thread = cute.size(acc_O, mode=[0, 1]) * cute.size(acc_O, mode=[1])
        softmax = OnlineSoftmax(rows_per_thread, softmax_scale_log2)
        mask = AttentionMask(self.tile_m, self.tile_n, self.causal, tiled_mma, tidx, m_block, seqlen)

        # ---- 2. Prologue: Q and the first stages-1 K/V blocks in flight ----------------------
        for m in cutlass.range_constexpr(cute.size(tQsQ, mode=[1])):
            if tQcQ[0, m, 0][0] < seqlen_q:
                cute.copy(gmem_tiled_copy, tQgQ[None, m, None], tQsQ[None, m, None])
            else:
                tQsQ[None, m, None].fill(0)
        for stage in cutlass.range_constexpr(self.stages - 1):
            if stage < n_block_max:
                # Q joins the group of the first block; only that block can be cut by Sk.
                load_kv_block(kv_copy, n_block_max - 1 - stage, stage, seqlen_k, predicated=stage == 0)
            cute.arch.cp_async_commit_group()

        # ---- 3. Main loop: the masked blocks first (they top the range), then the unmasked rest ---
        # Operands bound once: an iteration passes only its step and whether it masks.
        attend = partial(
            self.attend_block, kv_copy, tiled_mma, smem_operands, tSrQ, tSrK, tOrVt, acc_O, softmax, mask, n_block_max
        )
        for step in cutlass.range_constexpr(block_range.n_masked_blocks):
            if step < n_block_max - block_range.n_block_min:
                attend(step, masked=True)
        for step in cutlass.range(block_range.n_masked_blocks, n_block_max - block_range.n_block_min, 1):
            attend(step, masked=False)
        # Retire the empty trailing groups so no cp.async is outstanding at exit.
        cute.arch.cp_async_wait_group(0)

        # ---- 4. Epilogue: normalise, cast, predicated store (and the LSE) --------------------
        lse = cute.make_rmem_tensor(rows_per_thread, cutlass.Float32) if cutlass.const_expr(self.return_lse) else None
        softmax.finalize(acc_O, lse)
        rO = cute.make_fragment_like(acc_O, dtype)
        rO.store(acc_O.load().to(dtype))
        tOgO = thr_mma.partition_C(gO)  # (MMA, MMA_M, MMA_D)
        tOcO = thr_mma.partition_C(cute.make_identity_tensor(tile_q))  # (row, col) inside the tile
        for i in cutlass.range_constexpr(cute.size(rO)):
            if m_block * self.tile_m + tOcO[i][0] < seqlen_q:
                tOgO[i] = rO[i]
        if cutlass.const_expr(self.return_lse):
            self.store_lse(mLSE[batch, head, None], lse, tOcO, m_block * self.tile_m, seqlen_q)

    @cute.jit
    def store_lse(
        self, gLSE: cute.Tensor, lse: cute.Tensor, tOcO: cute.Tensor, row_start: cutlass.Int32, seqlen_q: cutlass.Int32
    ):
        """The first lane of each row's quad writes the LSE of its rows (rows past Sq are skipped);
        ``lse`` holds one value per row of :func:`rows_by_cols`, in that order."""
        cO = rows_by_cols(tOcO)
        if cO[0, 0][1] == 0:
            for r in cutlass.range_constexpr(cute.size(cO, mode=[0])):
                row = row_start + cO[r, 0][0]
                if row < seqlen_q:
                    gLSE[row] = lse[r]

    @cute.jit
    def attend_block(
        self, kv_copy: KVCopy, tiled_mma: cute.TiledMma, smem_operands: LdmatrixOperands, tSrQ: cute.Tensor,
        tSrK: cute.Tensor, tOrVt: cute.Tensor, acc_O: cute.Tensor, softmax: OnlineSoftmax, mask: AttentionMask,
        n_block_max: cutlass.Int32, step: cutlass.Int32, masked: cutlass.Constexpr,
    ):  # fmt: skip
        """Iteration ``step`` (block ``n_block_max - 1 - step``): refill the ring, then
        S = Q Kᵀ → mask → online softmax → rescale O → O += P V."""
        n_block = n_block_max - 1 - step
        slot = step % self.stages

        # ---- 3a. Refill the slot freed last iteration; wait only for this block --------------
        refill_kv_ring(kv_copy, step, self.stages, n_block_max, n_block_max, mask.seqlen_k)

        # ---- 3b. S = Q Kᵀ -------------------------------------------------------------------
        acc_S = scores(tiled_mma, smem_operands, tSrQ, tSrK, slot, (self.tile_m, self.tile_n), self.pieces_per_k_step)

        # ---- 3c./3d. Mask, online softmax, rescale O ------------------------------------------
        if cutlass.const_expr(masked):
            mask.apply(acc_S, n_block)
        row_scale = softmax.update(acc_S)
        softmax.rescale(acc_O, row_scale)

        # ---- 3e. O += P V ---------------------------------------------------------------------
        values_product(tiled_mma, smem_operands, acc_S, acc_O, tOrVt, slot, self.pieces_per_k_step, tSrQ.element_type)


# ----------------------------------------------------------------------------------------------
# Host function: validate, compile once per configuration, allocate O, launch.
# ----------------------------------------------------------------------------------------------
def tile_config(problem: Problem) -> TileConfig:
    """The configuration :data:`TILE_CONFIGS` holds for this head dim now (read at every prepare),
    with the problem's features as compile-time flags (all off for the canonical problem)."""
    shape = TILE_CONFIGS[problem.head_dim]
    return TileConfig(
        dtype=problem.dtype, head_dim=problem.head_dim, causal=problem.causal, shape=shape, **feature_flags(problem)
    )


# The host entry points: validate (head dims, every feature, a positive scale) → plan (the TileConfig,
# the compile key; GPU launches and CPU compiles alike compile from fakes) → bind (O and the LSE).
HOST = RungHost(
    "cute/pipelined",
    CompiledKernels(PipelinedAttentionKernel, fake_attention_arguments),
    plan=tile_config,
    plan_launch=partial(attention_launch, plan=tile_config),
    head_dims=tuple(TILE_CONFIGS),
    problem_check=positive_scale,
)
prepare, bind, compile_sm90 = HOST.prepare, HOST.bind, HOST.compile_sm90


# ----------------------------------------------------------------------------------------------
# Capability check.
# ----------------------------------------------------------------------------------------------
def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    """The capability check: a CUDA device of sm_80+ (mma.sync bf16, cp.async), fp16/bf16, a head dim
    of :data:`TILE_CONFIGS` (D=256 would need 256 fp32 O-accumulator registers per thread at tile_m=128),
    softmax_scale > 0. Every problem feature is implemented (GQA, both causal alignments,
    ``cache_seqlens``, the LSE)."""
    return mma_sync_supports("cute/pipelined", problem, device, head_dims=tuple(TILE_CONFIGS), features=FEATURES)


IMPLEMENTATION = HOST.implementation(
    supports=supports,
    required_ptx=("mma.sync", "ldmatrix", "cp.async"),
    source_file=__file__,
    backward=tiled_backward.BACKWARD,
)
