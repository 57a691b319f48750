"""cute/decode's 64-row tiles on one warpgroup's WGMMA (``decode.WGMMA_MIN_ROWS``, 64; sm_90a only).

Why (issue #38; ``docs/perf-log.md``, "Helper `cutewg`"): with 64 or more packed rows a (batch, KV head) the
step is compute-bound, and ``mma.sync`` on sm_90 issues at about half WGMMA's tensor rate (this ladder's own
prefill: cute/pipelined 365 against cute/hopper 698 TFLOP/s). The row split's 64-row tile is 4 warps × 16 rows ×
all 64 keys of a block: 128 ``HMMA.16816`` a warp a block, each warp waiting on its own MMAs before its softmax.
Here the same 4 warps are one warpgroup and the same 64 rows one WGMMA M tile, as in cute/hopper:

* S = Q Kᵀ: ``wgmma.m64n64k16`` × D/16, both operands from shared memory (descriptors, no ldmatrix);
* mask (``_hopper_device.AttentionMask`` with the packed rows' tokens), ``OnlineSoftmax.update`` and ``rescale``
  in the WGMMA accumulator layout;
* O += P V: ``wgmma.m64nDk16`` × 64/16 with P converted in registers (the A operand) and V from shared memory
  seen as the MN-major B operand.

Everything else is :class:`decode.DecodeKernel`'s: the plan (padded or balanced split, one M tile of 64 rows per
CTA), the grid, the cp.async ring of ``stages`` 64-key blocks (32 on ``decode.WGMMA_D256``'s (32, 6); contiguous or
paged), the packed Q load, the merge through shared memory (one part: the warpgroup's O and LSE) and the merge
kernel. Only the shared layouts
change: WGMMA's 128-byte-swizzled K-major Q and K, and V's MN-major layout, which the cp.async copy fills through
a (key, D) view of the same memory.

Per key block (``attend_wgmma_block``): refill the ring and wait for this block (``refill_kv_ring``), with a
``fence.proxy.async`` before its last barrier (cp.async writes through the generic proxy, WGMMA reads through the async
one); S; wait; mask (the top blocks of a split); softmax; rescale O; P; P V; wait, so that the slot is free
for the next iteration's refill.

Overlapped (``attend_overlapped_block``; cute/hopper's ``next_block``; on a ring of at least
``decode.WGMMA_OVERLAP_MIN_STAGES``): step n waits for block n's K/V, issues S = Q K(n)ᵀ, waits (``wait_group(1)``: S
may still run) for the P V of block n-2, which ran under the last softmax, pays O the factor that softmax left, refills
the slot that P V read (block n+stages-2), issues O += P(n-1) V(n-1), waits for S (``wait_group(1)``: P V may still run)
and masks and softmaxes S(n) into P(n) while P V is on the tensor cores. P lives in two register buffers by step parity
(the loop takes two steps an iteration). The second step of each iteration ``drain``s (``wait_group(0)``) so that no
wgmma is in flight across the loop's back edge (ptxas serialises every wgmma otherwise, C7514); ptxas hoists that wait
above the step's exp2s, so about half of the second step's softmax runs under P V. The first block has no P V before it,
and after the last one its P V is issued alone. Block n-1's V is read during step n, so ``stages - 2`` blocks are in
flight, not ``stages - 1`` (3 stages at D=128: one; 6 at D=64: four). Measured with every ring overlapped: D=64
0.93-0.95× the time, D=128 1.00-1.08× (its one block in flight), hence the rule.

At D=256 (``decode.WGMMA_D256``, off, untimed) O is 64 × 256 fp32 (128 registers a thread), S
``wgmma.m64n{tile_n}k16`` × 16 and P V ``wgmma.m64n256k16`` × tile_n/16, on one of two 224 KB rings (one CTA an SM):
``TILE_CONFIGS``' 3 stages of 64 keys (Q 32 KB, K and V 32 KB a stage), the one chain a block; or 6 stages of 32 keys,
overlapped.

Two warpgroups (``decode.WGMMA_TWO_WARPGROUPS``; the head dims of ``decode.TWO_WARPGROUP_RINGS``, D=128 by default,
the padded split, by default 65-127 packed rows, its second warpgroup part padding: ``decode.TWO_WARPGROUP_MIN_ROWS``
and ``TWO_WARPGROUP_MAX_ROWS``):
one CTA of 8 warps holds two 64-row M tiles, the tiled MMAs' two atoms along M, so each thread's slice of S, P and O is
its warpgroup's 64 rows and each warpgroup issues and waits for its own wgmmas. Both warpgroups share one ring of
``decode.TWO_WARPGROUP_RINGS``' 6 stages at D=128 (Q 32 KB, 192 KB of K/V, one CTA an SM, overlapped, 4 blocks in
flight: the two one-warpgroup CTAs' 2 + 2) and both issue its cp.async copies, 256 threads a block. Not a producer
warp: this kernel's ring is cp.async, whose hand-over is each thread's ``wait_group`` then a CTA barrier, and its two
CTA barriers a step (256 threads) already count both warpgroups' arrivals: ``wait_kv_block``'s before a block is read
(gluon's ready barrier) and ``load_kv_ahead``'s before a slot is refilled, which each thread reaches only after its
own warpgroup's ``wait_group`` retired the P V that read the slot (gluon's per-slot empty barrier counting both
consumers). A producer would need an mbarrier ring (TMA, or ``cp.async.mbarrier.arrive``) and setmaxnreg, with no
register pressure to relieve (186 registers, no spills). The price: the barriers keep the two warpgroups in one step,
so the tensor cores see both warpgroups' wgmmas together and both softmaxes together, under their P Vs. Each K/V block
is read from L2 once per 128 rows, not per 64; the split rule is fed the halved M tiles and one CTA an SM
(``decode.padded_m_blocks``, ``split_policy``).

Measured (H200, 2026-12-02, ``bench/cute_decode_wgmma_ab.sh``, ``results/h200/cute-decode-wgmma/``): 256 packed rows
at D=128 (seed 107 row 0) 362.7 -> 294.0 µs, 128 rows (seed 103 row 0) 540.1 -> 402.1, D=64's 128 rows 0.85-0.91×.
The one chain a block is the tile's limit, so the split rule asks two CTAs an SM for it
(``decode.WGMMA_SPLIT_CTAS_PER_SM``): one CTA's softmax runs under the other's wgmmas; 107/0 295.2 -> 209.7 µs
(``results/h200/cute-decode-wgmma-split/``); the overlap: ``results/h200/cute-decode-wgmma-overlap/``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import warpgroup
from cutlass.tensor_utils import LayoutEnum

from cute_impl._device import (
    LOG2_E,
    RESCALE_THRESHOLD,
    KVCopy,
    kv_copy_partitions,
    load_kv_ahead,
    load_kv_block,
    refill_kv_ring,
    wait_kv_block,
)
from cute_impl._hopper_device import (
    ROWS_PER_THREAD,
    ROWS_PER_WARPGROUP,
    AttentionMask,
    OnlineSoftmax,
    rows_by_cols,
    scores_to_operand_a,
    warpgroup_gemm,
    warpgroup_mmas,
)
from cute_impl._host import SWIZZLE_COLS, cp_async_tiled_copy, qkv_shared_storage
from cute_impl.decode import SMEM_ALIGN_BYTES, DecodeConfig, DecodeKernel

WARPGROUP_THREADS = 128


class WgmmaDecodeKernel(DecodeKernel):
    """:class:`decode.DecodeKernel` with its split kernel's tile on one warpgroup's WGMMA (64 rows, 4 warps)."""

    def __init__(self, config: DecodeConfig):
        super().__init__(config)
        # Two warpgroups (decode.WGMMA_TWO_WARPGROUPS): two 64-row tiles of one CTA, one a warpgroup.
        self.warpgroups = 2 if config.two_warpgroups else 1
        warpgroup_threads = self.warpgroups * WARPGROUP_THREADS
        if self.tile_m != ROWS_PER_WARPGROUP * self.warpgroups or self.threads_per_cta != warpgroup_threads:
            raise ValueError(f"the WGMMA tile is {ROWS_PER_WARPGROUP} rows a warpgroup, got {config}")
        if self.key_warps != 1:
            raise ValueError(f"the WGMMA tile's warps take every key of a block, got {config}")
        # Overlapped, the previous block's slot stays held one step (its V): the ring loads ``ahead`` = stages - 2
        # steps ahead, not stages - 1, and a ring of 3 keeps one block in flight.
        self.ahead = self.stages - 1 - (1 if config.wgmma_overlap else 0)
        if self.ahead < 1:
            raise ValueError(f"the overlapped WGMMA tile needs a ring of 3 stages or more, got {config}")

    @cute.jit
    def __call__(
        self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor | None,
        mOPartial: cute.Tensor | None, mLSEPartial: cute.Tensor | None, mItemSlabs: cute.Tensor | None,
        mCacheSeqlens: cute.Tensor | None, mBlockTable: cute.Tensor | None, softmax_scale: cutlass.Float32,
        stream: cuda.CUstream,
    ):  # fmt: skip
        """:meth:`decode.DecodeKernel.__call__`'s arguments and launches, with WGMMA's layouts and MMAs."""
        dtype = mQ.element_type
        mQ, mK, mV, mO, mOPartial, mCacheSeqlens, mBlockTable = self.launch_views(
            mQ, mK, mV, mO, mOPartial, mCacheSeqlens, mBlockTable
        )  # fmt: skip
        D, rows_m, row_major = self.head_dim, self.tile_m, LayoutEnum.ROW_MAJOR
        v_major = LayoutEnum.COL_MAJOR
        qk_mma, pv_mma = warpgroup_mmas(dtype, self.tile_n, D, v_major.sm90_mma_major_mode(), self.warpgroups)
        sQ_layout = sm90_utils.make_smem_layout_a(row_major, (rows_m, self.tile_n, D), dtype, 1)  # (tile_m, D, 1)
        sK_layout = sm90_utils.make_smem_layout_b(row_major, (rows_m, self.tile_n, D), dtype, self.stages)
        sV_layout = sm90_utils.make_smem_layout_b(v_major, (rows_m, D, self.tile_n), dtype, self.stages)
        # The warpgroups' partial O (1, tile_m, D) and LSE (1, tile_m), fp32, in the drained K ring (and V's beyond).
        sO_parts_layout = cute.make_layout((1, self.tile_m, D), stride=(self.tile_m * D, D, 1))
        sLSE_parts_layout = cute.make_layout((1, self.tile_m), stride=(self.tile_m, 1))
        self.wgmma_split_kernel(
            mQ, mK, mV, mO, mLSE, mOPartial, mLSEPartial, mItemSlabs, mCacheSeqlens, mBlockTable,
            softmax_scale * LOG2_E, sQ_layout, sK_layout, sV_layout, sO_parts_layout, sLSE_parts_layout,
            cp_async_tiled_copy(dtype, self.threads_per_cta, row_elems=SWIZZLE_COLS), qk_mma, pv_mma,
            qkv_shared_storage(dtype, sQ_layout, sK_layout, SMEM_ALIGN_BYTES),
        ).launch(grid=self.split_grid(mO, mOPartial), block=[self.threads_per_cta, 1, 1], stream=stream)  # fmt: skip
        self.launch_merge(mQ, mK, mO, mLSE, mOPartial, mLSEPartial, mItemSlabs, mCacheSeqlens, mBlockTable, stream)

    @cute.kernel
    def wgmma_split_kernel(
        self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor | None,
        mOPartial: cute.Tensor | None, mLSEPartial: cute.Tensor | None, mItemSlabs: cute.Tensor | None,
        mCacheSeqlens: cute.Tensor | None, mBlockTable: cute.Tensor | None, softmax_scale_log2: cutlass.Float32,
        sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout,
        sO_parts_layout: cute.Layout, sLSE_parts_layout: cute.Layout, gmem_tiled_copy: cute.TiledCopy,
        qk_mma: cute.TiledMma, pv_mma: cute.TiledMma, SharedStorage: cutlass.Constexpr,
    ):  # fmt: skip
        tidx, _, _ = cute.arch.thread_idx()
        # ---- 1. This sequence's keys and this split's blocks of them (DecodeKernel's) -----------
        work = self.cta_work(mQ, mK, mO, mOPartial, mCacheSeqlens, mBlockTable)
        m_block, seqlen, block_range, n_blocks = work.m_block, work.seqlen, work.block_range, work.n_blocks

        # ---- Tiles: HBM views, WGMMA's shared layouts, the warpgroup's fragments -----------------
        gK, gV, pages, cKV = self.kv_views(mK, mV, mBlockTable, work)
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)[None, None, 0]  # (tile_m, D)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)  # (tile_n, D, stages)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)  # (D, tile_n, stages)
        # V's ring as the copy writes it: (tile_n, D, stages), the same memory as the B operand (D, tile_n, stages).
        by_key = cute.make_layout(
            (self.tile_n, self.head_dim, self.stages), stride=(self.head_dim, 1, self.tile_n * self.head_dim)
        )
        sV_rows = cute.composition(sV, by_key)

        gmem_thr_copy = gmem_tiled_copy.get_slice(tidx)
        kv_copy = kv_copy_partitions(gmem_tiled_copy, gmem_thr_copy, gK, sK, gV, sV_rows, cKV, pages)

        qk_thr, pv_thr = qk_mma.get_slice(tidx), pv_mma.get_slice(tidx)
        tSrQ = qk_thr.make_fragment_A(qk_thr.partition_A(sQ))  # (MMA, 1, D/16)
        tSrK = qk_thr.make_fragment_B(qk_thr.partition_B(sK))  # (MMA, 1, D/16, stages)
        tOrV = pv_thr.make_fragment_B(pv_thr.partition_B(sV))  # (MMA, 1, tile_n/16, stages)
        # Two warpgroups: the tiled MMAs' second atom along M, so each thread's slice is its warpgroup's 64 rows.
        tile_s, tile_o = (self.tile_m, self.tile_n), (self.tile_m, self.head_dim)
        acc_S_shape = qk_thr.partition_shape_C(tile_s)  # ((2, 2, tile_n/8), 1, 1)
        acc_O = pv_thr.make_fragment_C(pv_thr.partition_shape_C(tile_o))  # ((2, 2, D/8), 1, 1)
        acc_O.fill(0.0)
        tOrP = cute.make_rmem_tensor(pv_thr.partition_shape_A(tile_s), mQ.element_type)  # P, the A operand
        tScS = qk_thr.partition_C(cute.make_identity_tensor(tile_s))  # (row, key) of every S value
        softmax = OnlineSoftmax(ROWS_PER_THREAD, softmax_scale_log2, rescale_threshold=RESCALE_THRESHOLD)
        mask = AttentionMask(
            self.tile_n, self.causal, tScS, m_block * self.tile_m, seqlen, packed_seqlen_q=work.seqlen_q
        )  # fmt: skip

        # ---- 2. Prologue: the packed Q tile and the first K/V blocks in flight (stages-1; overlapped stages-2)
        self.load_packed_q(
            gmem_tiled_copy, gmem_thr_copy, mQ, sQ, work.batch, work.kv_head, work.group, m_block, work.rows
        )  # fmt: skip
        for stage in cutlass.range_constexpr(self.ahead):
            if stage < n_blocks:
                load_kv_block(
                    kv_copy, block_range.n_block_max - 1 - stage, stage, seqlen.seqlen_k, predicated=stage == 0
                )
            cute.arch.cp_async_commit_group()

        # ---- 3. Main loop: the masked blocks first (they top the split), then the rest -----------
        if cutlass.const_expr(not self.config.wgmma_overlap):
            attend = partial(
                self.attend_wgmma_block, kv_copy, qk_mma, pv_mma, tSrQ, tSrK, tOrV, tOrP, acc_S_shape, acc_O,
                softmax, mask, block_range.n_block_max, n_blocks, seqlen.seqlen_k,
            )  # fmt: skip
            for step in cutlass.range_constexpr(block_range.n_masked_blocks):
                if step < n_blocks:
                    attend(step, masked=True)
            for step in cutlass.range(block_range.n_masked_blocks, n_blocks, 1):
                attend(step, masked=False)
        else:
            # Overlapped (WGMMA_OVERLAP_MIN_STAGES): P in two register buffers, step parity's (block n's P is written
            # while block n-1's P V reads the other), and the factor O owes the last softmax update, paid before a P V.
            tOrPs = (tOrP, cute.make_rmem_tensor(tOrP.layout, tOrP.element_type))
            o_scale = cute.make_rmem_tensor(ROWS_PER_THREAD, cutlass.Float32)
            attend = partial(
                self.attend_overlapped_block, kv_copy, qk_mma, pv_mma, tSrQ, tSrK, tOrV, tOrPs, acc_S_shape, acc_O,
                softmax, mask, o_scale, block_range.n_block_max, n_blocks, seqlen.seqlen_k,
            )  # fmt: skip
            # The first block (always masked: the top of the split) has no P V before it.
            n_masked = block_range.n_masked_blocks
            for step in cutlass.range_constexpr(n_masked):
                if step < n_blocks:
                    attend(step, masked=True, first=step == 0, parity=step % 2, drain=True)
            # The rest two steps an iteration, so that each step's P buffer is known at compile time.
            for step in cutlass.range(n_masked, n_blocks - 1, 2):
                attend(step, masked=False, first=False, parity=n_masked % 2, drain=False)
                attend(step + 1, masked=False, first=False, parity=(n_masked + 1) % 2, drain=True)
            if n_blocks > n_masked and (n_blocks - n_masked) % 2 == 1:
                attend(n_blocks - 1, masked=False, first=False, parity=n_masked % 2, drain=True)
            # The last block's P V, alone, from its step's buffer.
            if n_blocks > 0:
                if (n_blocks - 1) % 2 == 0:
                    self.last_values_product(pv_mma, tOrPs[0], tOrV, acc_O, softmax, o_scale, n_blocks - 1)
                else:
                    self.last_values_product(pv_mma, tOrPs[1], tOrV, acc_O, softmax, o_scale, n_blocks - 1)
        cute.arch.cp_async_wait_group(0)

        # ---- 4. Epilogue: the warpgroup's O and LSE through shared memory, stored ---------------
        lse = softmax.finalize(acc_O, cutlass.Float32(1.0))
        cute.arch.barrier()
        sO_parts = storage.sK.get_tensor(sO_parts_layout, dtype=cutlass.Float32)  # (1, tile_m, D)
        sLSE_parts = cute.make_tensor(sO_parts.iterator + cute.cosize(sO_parts_layout), sLSE_parts_layout)
        self.store_warpgroup_part(pv_thr, acc_O, lse, sO_parts[0, None, None], sLSE_parts[0, None])
        cute.arch.barrier()
        gO, gLSE, rows = self.output_slices(mO, mLSE, mOPartial, mLSEPartial, mItemSlabs, work, tidx)
        self.merge_warps_and_store(sO_parts, sLSE_parts, gO, gLSE, m_block * self.tile_m, rows, tidx)

    @cute.jit
    def attend_wgmma_block(
        self, kv_copy: KVCopy, qk_mma: cute.TiledMma, pv_mma: cute.TiledMma, tSrQ: cute.Tensor, tSrK: cute.Tensor,
        tOrV: cute.Tensor, tOrP: cute.Tensor, acc_S_shape: Any, acc_O: cute.Tensor, softmax: OnlineSoftmax,
        mask: AttentionMask, n_block_max: cutlass.Int32, n_blocks: cutlass.Int32, seqlen_k: cutlass.Int32,
        step: cutlass.Int32, masked: cutlass.Constexpr,
    ):  # fmt: skip
        """Iteration ``step`` (block ``n_block_max - 1 - step``): refill the ring, then the warpgroup's
        S = Q Kᵀ → mask → online softmax → rescale O → O += P V."""
        n_block = n_block_max - 1 - step
        slot = step % self.stages

        # ---- 3a. Refill the freed slot, wait for this block, hand it to the async proxy ---------
        refill_kv_ring(kv_copy, step, self.stages, n_block_max, n_blocks, seqlen_k, async_proxy=True)

        # ---- 3b. S = Q Kᵀ -----------------------------------------------------------------------
        acc_S = cute.make_rmem_tensor(acc_S_shape, cutlass.Float32)
        warpgroup_gemm(qk_mma, acc_S, tA=tSrQ, tB=tSrK, stage=slot, accumulate=False)
        warpgroup.wait_group(0)

        # ---- 3c./3d. Mask, online softmax, rescale O ---------------------------------------------
        if cutlass.const_expr(masked):
            mask.apply(acc_S, n_block)
        row_scale = softmax.update(acc_S)
        softmax.rescale(acc_O, row_scale)

        # ---- 3e. O += P V (P from registers); retired before the slot is refilled -------------------
        scores_to_operand_a(acc_S, tOrP)
        warpgroup_gemm(pv_mma, acc_O, tA=tOrP, tB=tOrV, stage=slot, accumulate=True)
        warpgroup.wait_group(0)

    @cute.jit
    def attend_overlapped_block(
        self, kv_copy: KVCopy, qk_mma: cute.TiledMma, pv_mma: cute.TiledMma, tSrQ: cute.Tensor, tSrK: cute.Tensor,
        tOrV: cute.Tensor, tOrPs: tuple[cute.Tensor, cute.Tensor], acc_S_shape: Any, acc_O: cute.Tensor,
        softmax: OnlineSoftmax, mask: AttentionMask, o_scale: cute.Tensor, n_block_max: cutlass.Int32,
        n_blocks: cutlass.Int32, seqlen_k: cutlass.Int32, step: cutlass.Int32, masked: cutlass.Constexpr,
        first: cutlass.Constexpr, parity: cutlass.Constexpr, drain: cutlass.Constexpr,
    ):  # fmt: skip
        """Iteration ``step`` overlapped (cute/hopper's ``next_block``): issue S = Q Kᵀ of block
        ``n_block_max - 1 - step``, refill the slot freed by the P V of two steps back, issue the previous block's
        O += P V, and mask and softmax S while that P V runs. Every wait but ``drain``'s follows an issue, so ptxas
        cannot hoist it above the softmax's exp2s. ``first``: no previous block; ``parity``: ``step % 2``, this
        step's P buffer of ``tOrPs`` (the previous step's P V reads the other); ``drain``: retire that P V at the end
        (the masked steps, the left-over one and the second of each loop iteration: nothing crosses a back edge or a
        runtime branch in flight)."""
        n_block = n_block_max - 1 - step
        slot = step % self.stages

        # ---- 3a. This step's block landed (those of the next ahead-1 steps may still load) -------
        wait_kv_block(self.ahead - 1, async_proxy=True)

        # ---- 3b. S = Q Kᵀ; once P V two steps back retired (it ran under the last softmax), O *= the
        # factor the last update left, under S ---------------------------------------------------------
        acc_S = cute.make_rmem_tensor(acc_S_shape, cutlass.Float32)
        warpgroup_gemm(qk_mma, acc_S, tA=tSrQ, tB=tSrK, stage=slot, accumulate=False)
        if cutlass.const_expr(not first):
            warpgroup.wait_group(1)
            softmax.rescale(acc_O, o_scale)

        # ---- 3a'. Refill the slot that P V read, with the block ahead = stages - 2 steps on ---------
        load_kv_ahead(kv_copy, step + self.ahead, self.stages, n_block_max, n_blocks, seqlen_k)

        # ---- 3e. O += P V of the previous block, from the other P buffer and its slot ------------
        if cutlass.const_expr(not first):
            previous = (step - 1) % self.stages
            warpgroup_gemm(pv_mma, acc_O, tA=tOrPs[1 - parity], tB=tOrV, stage=previous, accumulate=True)
        # S is ready when at most the (later) P V group is still in flight.
        warpgroup.wait_group(0 if first else 1)

        # ---- 3c./3d. Mask, online softmax and P into this step's buffer, while P V runs -----------
        if cutlass.const_expr(masked):
            mask.apply(acc_S, n_block)
        row_scale = softmax.update(acc_S)
        o_scale.store(row_scale.load())
        scores_to_operand_a(acc_S, tOrPs[parity])
        if cutlass.const_expr(drain):
            warpgroup.wait_group(0)

    @cute.jit
    def last_values_product(
        self, pv_mma: cute.TiledMma, tOrP: cute.Tensor, tOrV: cute.Tensor, acc_O: cute.Tensor, softmax: OnlineSoftmax,
        o_scale: cute.Tensor, step: cutlass.Int32,
    ):  # fmt: skip
        """Overlapped, after the loop: the last block's (iteration ``step``'s) rescale and O += P V, alone, once
        the P V before it retired."""
        warpgroup.wait_group(0)
        softmax.rescale(acc_O, o_scale)
        warpgroup_gemm(pv_mma, acc_O, tA=tOrP, tB=tOrV, stage=step % self.stages, accumulate=True)
        warpgroup.wait_group(0)

    @cute.jit
    def store_warpgroup_part(
        self, pv_thr: Any, acc_O: cute.Tensor, lse: cute.Tensor, sO_part: cute.Tensor,
        sLSE_part: cute.Tensor,
    ):  # fmt: skip
        """The warpgroups' normalised O (tile_m, D) and LSE (tile_m,) into the merge scratch; the first lane of each
        row's quad writes the row's LSE (``lse`` in :func:`_hopper_device.rows_by_cols` row order)."""
        pv_thr.partition_C(sO_part).store(acc_O.load())  # ((2, 2, D/8), 1, 1)
        cO = rows_by_cols(pv_thr.partition_C(cute.make_identity_tensor(sO_part.shape)))
        if cO[0, 0][1] == 0:
            for r in cutlass.range_constexpr(cute.size(cO, mode=[0])):
                sLSE_part[cO[r, 0][0]] = lse[r]
