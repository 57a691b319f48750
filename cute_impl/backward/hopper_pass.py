"""The separate dQ pass of the CuTe ``hopper`` backward (``hopper.py``, ``BackwardTiles(dq="pass")``, the
deterministic variant): one CTA per 128 query rows of one (batch, head), the key blocks streamed.

What it does: the dK/dV kernel of ``hopper.py`` leaves dQ to this kernel, which recomputes S and dP in the
forward's shape (seven products per (query block, key block) where five are counted, but every dQ row is
summed in registers in a fixed order: bit-identical run after run). Per key block (``dq_step``): S = Q Kᵀ
and dP = dO Vᵀ issued, S masked (-inf) and P = exp2(S · scale_log2 − LSE₂), dS = P ∘ (dP − D), dQ += dS K
with K read MN-major (the same swizzled bytes as its K-major tile); at the end dQ ·= softmax_scale, stored
from the accumulators (rows past Sq not written).

Data movement: the producer warp TMAs each consumer warpgroup's Q and dO boxes once and streams K and V
through a ring of ``stages`` slots; LSE₂ and D of a thread's two rows are read from HBM once. The causal
grid runs the last query blocks (the most keys) first. ``dq_overlap`` leaves a step's dQ product in flight
under the next step's S and dP (``SlotRelease``).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync, warpgroup

from cute_impl._device import LOG2_E, BlockRange, SeqlenInfo
from cute_impl._hopper_device import (
    CONSUMER_REGISTERS,
    PRODUCER_REGISTERS,
    ROWS_PER_WARPGROUP,
    THREADS_PER_WARPGROUP,
    WARPS_PER_WARPGROUP,
    AttentionMask,
    head_major,
    one_stage,
    rows_by_cols,
    scores_to_operand_a,
    sequence_major,
    tma_partition,
    warpgroup_gemm,
    warpgroup_mmas,
)
from cute_impl._host import CUTE_DTYPES, generic_view
from cute_impl.backward._device import (
    CONSUMER_WARPGROUPS,
    MN_MAJOR,
    SlotRelease,
    allocate_rings,
    fixed_layout,
    load_fixed,
    load_pair,
    read_row_values,
    shared_storage,
    smem_tensor,
    store_rows,
    streamed_layouts,
)

if TYPE_CHECKING:
    from cute_impl.backward.hopper import HopperBackwardConfig

QUERY_TILE = CONSUMER_WARPGROUPS * ROWS_PER_WARPGROUP
THREADS_PER_CTA = (1 + CONSUMER_WARPGROUPS) * THREADS_PER_WARPGROUP


class DQPassKernel:
    """The separate dQ pass: S = Q Kᵀ → mask → P → dP = dO Vᵀ → dS → dQ += dS K per key block."""

    def __init__(self, config: HopperBackwardConfig):
        self.dtype = CUTE_DTYPES[config.dtype]
        self.head_dim = config.head_dim
        self.causal = config.causal
        self.bottom_right = config.bottom_right
        self.gqa = config.gqa
        self.tile_n = config.tiles.dq_tile_n
        self.stages = config.tiles.stages
        self.overlap = config.tiles.dq_overlap
        self.threads_per_cta = THREADS_PER_CTA

    @cute.jit
    def __call__(
        self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE2: cute.Tensor,
        mDelta: cute.Tensor, mdQ: cute.Tensor, softmax_scale: Float32, stream: cuda.CUstream,
    ):  # fmt: skip
        """q, do, dq (B, H, Sq, D); k, v (B, Hkv, Sk, D); lse2, delta (B, H, Sq) fp32."""
        # Every tensor addressed through a generic pointer (``_host.generic_view``), as measured.
        mQ, mK, mV, mdO, mLSE2, mDelta, mdQ = [generic_view(t) for t in (mQ, mK, mV, mdO, mLSE2, mDelta, mdQ)]
        mQ, mK, mV, mdO, mdQ = (sequence_major(t) for t in (mQ, mK, mV, mdO, mdQ))  # (S, D, (H, B))
        mLSE2, mDelta = head_major(mLSE2), head_major(mDelta)  # (Sq, (H, B))
        D, rows = self.head_dim, ROWS_PER_WARPGROUP
        s_mma, dq_mma = warpgroup_mmas(self.dtype, self.tile_n, D, MN_MAJOR.sm90_mma_major_mode())
        sQ_layout = fixed_layout(self.dtype, D, CONSUMER_WARPGROUPS)  # (64, D, warpgroup)
        sK_layout, sKt_layout = streamed_layouts(self.dtype, self.tile_n, D, self.stages)
        load = cpasync.CopyBulkTensorTileG2SOp()
        tma_atom_Q, mQ_tma = cpasync.make_tiled_tma_atom(load, mQ, one_stage(sQ_layout), (rows, D))
        tma_atom_dO, mdO_tma = cpasync.make_tiled_tma_atom(load, mdO, one_stage(sQ_layout), (rows, D))
        tma_atom_K, mK_tma = cpasync.make_tiled_tma_atom(load, mK, one_stage(sK_layout), (self.tile_n, D))
        tma_atom_V, mV_tma = cpasync.make_tiled_tma_atom(load, mV, one_stage(sK_layout), (self.tile_n, D))
        self.q_bytes = 2 * CONSUMER_WARPGROUPS * cute.size_in_bytes(self.dtype, one_stage(sQ_layout))
        self.kv_bytes = 2 * cute.size_in_bytes(self.dtype, one_stage(sK_layout))
        self.shared_storage = shared_storage(self.dtype, sQ_layout, sK_layout, self.stages)
        self.kernel(
            s_mma, dq_mma, tma_atom_Q, mQ_tma, tma_atom_dO, mdO_tma, tma_atom_K, mK_tma, tma_atom_V, mV_tma,
            mLSE2, mDelta, mdQ, softmax_scale, sQ_layout, sK_layout, sKt_layout,
        ).launch(
            grid=[cute.ceil_div(mQ.shape[0], QUERY_TILE), mQ.shape[2][0], mQ.shape[2][1]],
            block=[self.threads_per_cta, 1, 1],
            smem=self.shared_storage.size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=1,
        )  # fmt: skip

    @cute.kernel
    def kernel(
        self, s_mma: cute.TiledMma, dq_mma: cute.TiledMma, tma_atom_Q: cute.CopyAtom, mQ: cute.Tensor,
        tma_atom_dO: cute.CopyAtom, mdO: cute.Tensor, tma_atom_K: cute.CopyAtom, mK: cute.Tensor,
        tma_atom_V: cute.CopyAtom, mV: cute.Tensor, mLSE2: cute.Tensor, mDelta: cute.Tensor, mdQ: cute.Tensor,
        softmax_scale: Float32, sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout,
        sKt_layout: cute.ComposedLayout,
    ):  # fmt: skip
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        warp_group = cute.arch.make_warp_uniform(tidx // THREADS_PER_WARPGROUP)
        block_m, head, batch = cute.arch.block_idx()
        grid_m, _, _ = cute.arch.grid_dim()
        seqlen_q = mQ.shape[0]
        D, rows = self.head_dim, ROWS_PER_WARPGROUP
        # Causal: the last query blocks see the most keys; launching them first evens out the tail.
        m_block = block_m
        if cutlass.const_expr(self.causal):
            m_block = grid_m - 1 - block_m
        kv_head = head
        if cutlass.const_expr(self.gqa):
            kv_head = head // (mQ.shape[2][0] // mK.shape[2][0])
        bh, kv_bh = (head, batch), (kv_head, batch)
        seqlen = SeqlenInfo.create(batch, seqlen_q, mK.shape[0], None, self.bottom_right)
        blocks = BlockRange.create_exact(m_block, seqlen, QUERY_TILE, self.tile_n, self.causal)
        n_blocks = blocks.n_block_max - blocks.n_block_min

        # ==== Shared memory and barriers ==============================================================
        storage, (q_producer, q_consumer), kv_ring = allocate_rings(
            self.shared_storage, self.stages, self.q_bytes, self.kv_bytes, CONSUMER_WARPGROUPS * WARPS_PER_WARPGROUP
        )
        kv_producer, kv_consumer = kv_ring.make_participants()
        sQ = smem_tensor(storage.fixed_a, sQ_layout)  # (64, D, warpgroup)
        sdO = smem_tensor(storage.fixed_b, sQ_layout)  # (64, D, warpgroup)
        sK = smem_tensor(storage.ring_a, sK_layout)  # (tile_n, D, stage)
        sV = smem_tensor(storage.ring_b, sK_layout)  # (tile_n, D, stage)
        sKt = smem_tensor(storage.ring_a, sKt_layout)  # (D, tile_n, stage): sK read MN-major

        # ==== Producer warp: Q and dO once, then K and V per key block, the top one first =============
        if warp_group == 0:
            cute.arch.setmaxregister_decrease(PRODUCER_REGISTERS)
            if warp_idx == 0:
                gQ = cute.local_tile(mQ[None, None, bh], (rows, D), (None, 0))  # (64, D, Sq/64)
                gdO = cute.local_tile(mdO[None, None, bh], (rows, D), (None, 0))  # (64, D, Sq/64)
                tQsQ, tQgQ = tma_partition(tma_atom_Q, sQ, gQ)  # (TMA, warpgroup), (TMA, Sq/64)
                tdOsdO, tdOgdO = tma_partition(tma_atom_dO, sdO, gdO)
                load_fixed((tma_atom_Q, tma_atom_dO), (tQgQ, tdOgdO), (tQsQ, tdOsdO), m_block * CONSUMER_WARPGROUPS,
                           q_producer)  # fmt: skip
                gK = cute.local_tile(mK[None, None, kv_bh], (self.tile_n, D), (None, 0))  # (tile_n, D, n)
                gV = cute.local_tile(mV[None, None, kv_bh], (self.tile_n, D), (None, 0))  # (tile_n, D, n)
                tKsK, tKgK = tma_partition(tma_atom_K, sK, gK)  # (TMA, stage), (TMA, n)
                tVsV, tVgV = tma_partition(tma_atom_V, sV, gV)
                for i in cutlass.range(n_blocks, unroll=1):
                    n_block = blocks.n_block_max - 1 - i
                    kv_producer = load_pair((tma_atom_K, tma_atom_V), (tKgK[None, n_block], tVgV[None, n_block]),
                                            (tKsK, tVsV), kv_producer)  # fmt: skip

        # ==== Consumer warpgroups: 64 query rows each =================================================
        if warp_group > 0:
            cute.arch.setmaxregister_increase(CONSUMER_REGISTERS[CONSUMER_WARPGROUPS])
            w = warp_group - 1
            wg_tidx = tidx % THREADS_PER_WARPGROUP
            s_thr = s_mma.get_slice(wg_tidx)
            dq_thr = dq_mma.get_slice(wg_tidx)
            tSrQ = s_thr.make_fragment_A(s_thr.partition_A(sQ[None, None, w]))  # (MMA, 1, D/16)
            tdPrdO = s_thr.make_fragment_A(s_thr.partition_A(sdO[None, None, w]))  # (MMA, 1, D/16)
            tSrK = s_thr.make_fragment_B(s_thr.partition_B(sK))  # (MMA, 1, D/16, stage)
            tdPrV = s_thr.make_fragment_B(s_thr.partition_B(sV))  # (MMA, 1, D/16, stage)
            tdQrKt = dq_thr.make_fragment_B(dq_thr.partition_B(sKt))  # (MMA, 1, tile_n/16, stage)
            acc_dQ = dq_thr.make_fragment_C(dq_thr.partition_shape_C((rows, D)))  # ((2, 2, D/8), 1, 1)
            acc_dQ.fill(0.0)
            tdQrdS = cute.make_rmem_tensor(dq_thr.partition_shape_A((rows, self.tile_n)), self.dtype)
            gemms = (
                functools.partial(warpgroup_gemm, s_mma, tA=tSrQ, tB=tSrK, accumulate=False),
                functools.partial(warpgroup_gemm, s_mma, tA=tdPrdO, tB=tdPrV, accumulate=False),
                functools.partial(warpgroup_gemm, dq_mma, acc_dQ, tA=tdQrdS, tB=tdQrKt, accumulate=True),
            )
            tScS = s_thr.partition_C(cute.make_identity_tensor((rows, self.tile_n)))  # (row, key) per value
            row_start = m_block * QUERY_TILE + w * rows
            # LSE₂ and D of this thread's two rows (rows past Sq: +inf and 0, so their P and dS are 0).
            cS = rows_by_cols(tScS)
            row_count = cute.size(cS, mode=[0])
            lse2 = cute.make_rmem_tensor(row_count, Float32)
            delta = cute.make_rmem_tensor(row_count, Float32)
            for r in cutlass.range_constexpr(row_count):
                row = row_start + cS[r, 0][0]
                lse2[r] = read_row_values(mLSE2[None, bh], row, seqlen_q, Float32.inf)
                delta[r] = read_row_values(mDelta[None, bh], row, seqlen_q, Float32(0.0))
            mask = AttentionMask(self.tile_n, self.causal, tScS, row_start, seqlen)
            step = functools.partial(
                self.dq_step, gemms, tdQrdS, s_thr.partition_shape_C((rows, self.tile_n)), lse2, delta, mask,
                softmax_scale * LOG2_E, SlotRelease(kv_ring, self.stages, self.overlap),
            )  # fmt: skip
            q_consumer.wait_and_advance()  # Q and dO stay for the whole CTA: never released
            n_top = blocks.n_block_max - 1
            steps_done = Int32(0)
            for i in cutlass.range(blocks.n_masked_blocks, unroll=1):
                kv_consumer, steps_done = step(kv_consumer, steps_done, n_top - i, masked=True)
            for i in cutlass.range(blocks.n_masked_blocks, n_blocks, unroll=1):
                kv_consumer, steps_done = step(kv_consumer, steps_done, n_top - i, masked=False)
            warpgroup.wait_group(0)  # overlapped: the last step's dQ

            # ---- dQ ·= softmax_scale, stored in the input dtype -------------------------------------
            acc_dQ.store(acc_dQ.load() * softmax_scale)
            gdQ = cute.local_tile(mdQ[None, None, bh], (rows, D), (m_block * CONSUMER_WARPGROUPS + w, 0))  # (64, D)
            store_rows(dq_thr, acc_dQ, gdQ, cute.make_identity_tensor((rows, D)), seqlen_q - row_start)

    @cute.jit
    def dq_step(
        self, gemms: tuple, tdQrdS: cute.Tensor, acc_shape: cute.Shape, lse2: cute.Tensor, delta: cute.Tensor,
        mask: AttentionMask, softmax_scale_log2: Float32, release: SlotRelease, kv_consumer, steps_done: Int32,
        n_block: Int32, masked: cutlass.Constexpr,
    ):  # fmt: skip
        """One key block from the ring: S = Q Kᵀ → mask → P → dP = dO Vᵀ → dS → dQ += dS K."""
        s_gemm, dp_gemm, dq_gemm = gemms
        slot = kv_consumer.wait_and_advance()
        acc_S = cute.make_rmem_tensor(acc_shape, Float32)  # ((2, 2, tile_n/8), 1, 1)
        acc_dP = cute.make_rmem_tensor(acc_shape, Float32)
        s_gemm(acc_S, stage=slot.index)
        dp_gemm(acc_dP, stage=slot.index)
        # S has retired (overlapped: so has the previous step's dQ, issued before it).
        warpgroup.wait_group(1)
        release.free_previous(steps_done)
        if cutlass.const_expr(masked):
            mask.apply(acc_S, n_block)
        # P = exp2(S · scale_log2 − LSE₂[row]) (masked -inf → 0); dS = P ∘ (dP − D[row]).
        S, dP = rows_by_cols(acc_S), rows_by_cols(acc_dP)
        for r in cutlass.range_constexpr(cute.size(S, mode=[0])):
            for c in cutlass.range_constexpr(cute.size(S, mode=[1])):
                S[r, c] = cute.math.exp2(S[r, c] * softmax_scale_log2 - lse2[r], fastmath=True)
        warpgroup.wait_group(0)
        for r in cutlass.range_constexpr(cute.size(S, mode=[0])):
            for c in cutlass.range_constexpr(cute.size(S, mode=[1])):
                dP[r, c] = S[r, c] * (dP[r, c] - delta[r])
        scores_to_operand_a(acc_dP, tdQrdS)
        dq_gemm(stage=slot.index)
        release.step_done(slot)
        return kv_consumer, steps_done + 1
