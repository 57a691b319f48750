"""Backward rung 3, FlashAttention-2 tiled in the CuTe DSL (counterparts: ``triton_impl/backward/tiled.py``;
forward ``cute_impl/tiled.py``).

What it does: the gradients of attention from the forward's O and LSE without ever storing P or dS.
One CTA owns a block of keys, keeps its K and V tiles in shared memory and its dK and dV accumulators
in registers, and walks the query blocks, recomputing P from Q, K and the saved LSE (one exp2 per
score) and using each tile of P and dS where it is made. All five products of a step run on the tensor
cores (``mma.sync.m16n8k16``, fp16/bf16 operands, fp32 accumulators).

As in the Triton rung, the key block is the rows (M) of every product of the dK/dV kernel: it computes
Sᵀ = K Qᵀ (tile_n × tile_m) rather than S = Q Kᵀ, so that Sᵀ, dPᵀ = V dOᵀ, dV += Pᵀ dO and dK += dSᵀ Q
all have the CTA's keys as rows, and Pᵀ and dSᵀ, cast to the input dtype, are already the A operands
of the next products (the accumulator fragment of an m16n8 MMA is the A fragment of an m16k16 one).

dQ is by a separate pass (``_DQKernel``), not fp32 atomics: one CTA per query block walks the key blocks
and recomputes S and dP (seven products per tile instead of five). It is deterministic (no atomics, the
same sum order every run), needs no fp32 accumulator in HBM, no zeroing and no convert kernel, and
every product keeps a whole warp-tile of rows; the Triton rung measured the atomic variants slower at
every anchor shape on an H200 (``triton_impl/backward/tiled.py``'s candidates).

Algorithm (three launches, one kernel class each):
  1. ``_PreprocessKernel`` (one CTA per ``ROWS_TILE_M`` query rows of one (batch, head)): D =
     rowsum(dO ∘ O) − dLSE and LSE₂ = LSE · LOG2_E (+inf where a row sees no key, so that its P is
     exp2(S − inf) = 0 rather than NaN), both (B, H, Sq) fp32. Every load (O, dO, the LSE, dLSE) is issued
     before the first store: an LSE read after its row's D was stored waits for the load before it (the two
     may alias), and eight such waits a CTA made it 1.2x slower (results/h200/backward-preprocess-lse-ahead/).
  2. ``_DKDVKernel`` (one CTA per ``tile_n`` keys of one (batch, KV head)):
     a. K and V to shared memory once; dK = dV = 0 in registers.
     b. For every query head of the KV head's group (GQA sums there, in registers: no atomics), for
        every query block whose rows can see these keys (causal: earlier rows are skipped), first the
        blocks that need a mask (the causal diagonal; all of them when this key block holds the key
        tail), then the rest without one: Q and dO tiles to shared memory;
        Sᵀ = K Qᵀ; Pᵀ = exp2(Sᵀ · softmax_scale_log2 − LSE₂), masked entries 0;
        dPᵀ = V dOᵀ; dV += Pᵀ dO; dSᵀ = Pᵀ ∘ (dPᵀ − D); dK += dSᵀ Q.
     c. dK ·= softmax_scale; both stored in the input dtype (rows past Sk are not written).
  3. ``_DQKernel`` (one CTA per ``tile_m`` query rows of one (batch, head); causal: the last query
     blocks, which see the most keys, launch first): Q, dO, LSE₂ and D once; for every key block the
     rows can see (the masked ones first: the causal diagonal and the key tail, then the rest):
     S = Q Kᵀ, masked to -inf; P = exp2(S · softmax_scale_log2 − LSE₂); dP = dO Vᵀ;
     dS = P ∘ (dP − D); dQ += dS K. dQ ·= softmax_scale, stored in the input dtype.

Data movement: HBM →(cp.async.cg, 16 B per thread, rows past the sequence zero-filled)→ swizzled
shared memory (Swizzle<3,3,3>, as ``cute/pipelined``) →(ldmatrix.x4; ldmatrix.x4.trans for the
operands read transposed: Qᵀ and dOᵀ in the dK/dV kernel, Kᵀ in the dQ kernel)→ registers
→(mma.sync)→ fp32 accumulators → HBM (st.global from the accumulator fragment). LSE₂ and D are read
from HBM (L1/L2) into registers: per column of Sᵀ in the dK/dV kernel, per row of S in the dQ kernel.
Every tile is single-buffered ("commit, wait for all, barrier", as the forward ``cute/tiled``): the
tensor cores idle while the next tile lands, the first thing a pipelined rung would remove.

How CuTe says it, beside the Triton rung: Triton's ``tl.dot(k, tl.trans(q))`` is here a tiled MMA
(``warp_tiled_mma``: warps tile the M rows, 16 each) whose per-thread slices are made by
``partition_A``/``partition_B``/``partition_C``; a transposed operand is not a ``tl.trans`` but a second
layout over the same shared memory (``cute.composition`` with a (D, rows) layout) read by
``ldmatrix.trans``; the masks and the per-column LSE₂ come from an identity tensor partitioned like the
accumulator (each element holds its (row, col) coordinate); a load is a tiled copy partitioned per
thread (``partition_S``/``partition_D``) and the predicate is per copied row. Triton chooses all of that
for the programmer; here each choice is a line.

Tiles (``TILE_SHAPES``, 8 warps of 16 rows each): the dK/dV kernel holds 128 keys and walks 64 query
rows per step at D=64 but only 16 at D=128, where dK and dV take 128 of a thread's 255 registers; the
dQ kernel holds 128 query rows and walks 64 keys. ``mma.sync`` rather than Hopper's WGMMA: this is the
sm80-style rung, correctness first; a ``hopper`` backward (TMA, WGMMA, warp specialisation) is the next.
Measured on an H200 at B=2 H=16 S=8192 D=128 bf16 (``results/h200/backward/``): 169 TFLOP/s, 165 causal,
0.32× cuDNN's backward and under half the Triton rung's: correct, and slow while single-buffered.

Constraints: fp16/bf16; D ∈ {64, 128}; any Sq, Sk ≥ 1; causal (top-left or bottom-right) or not; GQA
and MQA; a differentiable LSE (``d_lse``); softmax_scale > 0; compute capability ≥ 8.0 (``mma.sync``
bf16, ``cp.async``, ``ldmatrix``). ``cache_seqlens`` and paged caches are refused. Every kernel
compiles for sm_90a without spills (``tests/test_cute_backward.py``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch

from common.contract.capability import BOTTOM_RIGHT, GQA, LSE
from common.contract.problem import Problem
from common.contract.registry import Backward
from common.toolchain.compile import KernelBinary
from cute_impl._device import (
    AttentionMask,
    BlockRange,
    SeqlenInfo,
    accumulator_as_operand_a,
    gemm_double_buffered,
    kv_copy_partitions,
    rows_by_cols,
)
from cute_impl._host import (
    COPY_BITS,
    CUTE_DTYPES,
    WARP_THREADS,
    CompiledKernels,
    fake_stream,
    fake_tensor,
    mma_sync_supports,
    static_head_dim_view,
    warp_tiled_mma,
)
from cute_impl.backward._device import (
    BackwardOperands,
    cute_gradients,
    lanes_allreduce_sum,
    load_rows,
    owned_span,
    read_row_values,
    row_tile_copy,
    row_tile_layout,
    smem_operand,
    store_rows,
    transposed,
    two_tile_storage,
    zero_span,
)

# softmax_scale_log2 = softmax_scale · LOG2_E, so the kernels use exp2; the preprocess scales the LSE by it.
LOG2_E = math.log2(math.e)
HEAD_DIMS = (64, 128)
# Rows per CTA of the preprocess, and its threads.
ROWS_TILE_M = 64
ROWS_THREADS = 128
# Register double-buffering of the shared→register loads: a k-step's B operand in this many pieces
# (each at least one ldmatrix.x4 wide: 16 columns).
PIECES_PER_K_STEP = 2
LDMATRIX_COLS = 16


def pieces(columns: int) -> int:
    """How many pieces a B operand of ``columns`` columns loads in (``gemm_double_buffered``)."""
    return min(PIECES_PER_K_STEP, columns // LDMATRIX_COLS)


@dataclass(frozen=True)
class TileShape:
    """The tiles of one head dim: the dK/dV kernel's ``tile_n`` keys per CTA walking ``tile_m`` query
    rows per step, and the dQ kernel's ``dq_tile_m`` query rows per CTA walking ``dq_tile_n`` keys per
    step; 16 rows per warp of the CTA's own block (``tile_n`` or ``dq_tile_m``)."""

    tile_m: int
    tile_n: int
    dq_tile_m: int
    dq_tile_n: int


# Registers per thread (16 rows per warp): dK and dV take 2 · 16·D/32 fp32 (128 at D=128), Sᵀ and dPᵀ
# 2 · 16·tile_m/32, plus one piece of operands; at D=128 only 16 query rows per step leave room (32 spill
# 32 bytes), at D=64 64 rows fit. Eight warps (128 keys) share each Q and dO tile between twice the MMAs
# of four. The dQ kernel holds dQ (16·D/32), S and dP (16·64/32 each). Shared memory at D=128: K and V
# 2 · 128·128·2 B = 64 KiB, Q and dO 8 KiB; the dQ kernel Q and dO 64 KiB, K and V 32 KiB.
TILE_SHAPES = {
    64: TileShape(tile_m=64, tile_n=128, dq_tile_m=128, dq_tile_n=64),
    128: TileShape(tile_m=16, tile_n=128, dq_tile_m=128, dq_tile_n=64),
}


@dataclass(frozen=True)
class BackwardConfig:
    """Everything that changes the generated code of the three kernels (the compile-cache key)."""

    dtype: torch.dtype
    head_dim: int
    causal: bool
    bottom_right: bool = False  # causal diagonal shifted by causal_offset = seqlen_k - Sq
    gqa: bool = False  # K and V shared by heads // kv_heads query heads
    has_dlse: bool = False  # the LSE is differentiated too: D = rowsum(dO ∘ O) − dLSE
    # hopper's dq="reduce" with zero_in_preprocess: the preprocess also zeroes its rows of the fp32 dQaccum.
    zero_dq_accum: bool = False
    # hopper's dependent_launch: each CTA signals ``griddepcontrol.launch_dependents`` as it starts, so that the
    # dK/dV kernel (launched with programmatic stream serialisation) starts under this one's last wave.
    launch_dependents: bool = False

    @property
    def tiles(self) -> TileShape:
        return TILE_SHAPES[self.head_dim]


# ----------------------------------------------------------------------------------------------
# 1. Preprocess: D = rowsum(dO ∘ O) − dLSE, LSE₂ = LSE · LOG2_E
# ----------------------------------------------------------------------------------------------
class _PreprocessKernel:
    """One CTA per ``ROWS_TILE_M`` rows of one (batch, head); each row's D elements are read by
    ``D / 8`` neighbouring lanes with 16-byte loads, and their partial sums meet by butterfly shuffles.
    Given an fp32 dQaccum (``hopper``'s dq="reduce" with ``zero_in_preprocess``; this rung has none), each
    CTA also zeroes a ``ROWS_TILE_M · D`` share of it by 16-byte stores issued before its loads, the last CTA
    of a head the layout's padding too (``_device.owned_span``): the zeroing launch before the dK/dV kernel
    goes away, as in FlashAttention-4's preprocess. A share holds the CTA's rows' values, except in the 80-row
    dQᵀ layout: any exact partition serves, as the dK/dV kernel starts after this one."""

    def __init__(self, config: BackwardConfig):
        self.head_dim = config.head_dim
        self.has_dlse = config.has_dlse
        self.zero_dq_accum = config.zero_dq_accum
        self.launch_dependents = config.launch_dependents
        self.threads_per_cta = ROWS_THREADS

    @cute.jit
    def __call__(
        self,
        mO: cute.Tensor,
        mdO: cute.Tensor,
        mLSE: cute.Tensor,
        mdLSE: cute.Tensor | None,
        mLSE2: cute.Tensor,
        mDelta: cute.Tensor,
        mdQaccum: cute.Tensor | None,
        stream: cuda.CUstream,
    ):
        """o, do (B, H, Sq, D); lse, dlse (None unless differentiated), lse2, delta (B, H, Sq) fp32; dq_accum
        (None unless zeroed here) (B, H, n) fp32, each head's n values contiguous, n ≥ Sq · D a multiple of 4."""
        dtype = mO.element_type
        mO, mdO = [static_head_dim_view(t, self.head_dim) for t in (mO, mdO)]
        elems = COPY_BITS // dtype.width
        threads_per_row = self.head_dim // elems
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=COPY_BITS)
        tiled_copy = cute.make_tiled_copy_tv(
            atom,
            cute.make_layout((self.threads_per_cta // threads_per_row, threads_per_row), stride=(threads_per_row, 1)),
            cute.make_layout((1, elems)),
        )
        grid = (cute.ceil_div(mO.shape[2], ROWS_TILE_M), mO.shape[1], mO.shape[0])
        self.kernel(mO, mdO, mLSE, mdLSE, mLSE2, mDelta, mdQaccum, tiled_copy, threads_per_row).launch(
            grid=grid, block=[self.threads_per_cta, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(
        self,
        mO: cute.Tensor,
        mdO: cute.Tensor,
        mLSE: cute.Tensor,
        mdLSE: cute.Tensor | None,
        mLSE2: cute.Tensor,
        mDelta: cute.Tensor,
        mdQaccum: cute.Tensor | None,
        tiled_copy: cute.TiledCopy,
        threads_per_row: cutlass.Constexpr,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, batch = cute.arch.block_idx()
        # The dependent dK/dV kernel may start once every CTA of this one has signalled; it waits for this grid's
        # end (``griddepcontrol.wait``) before its first read of D, LSE₂ or dQaccum. Launched without PDL, this
        # kernel starts after everything before it, so what it reads is final.
        if cutlass.const_expr(self.launch_dependents):
            cute.arch.griddepcontrol_launch_dependents()
        seqlen_q = mO.shape[2]
        tile = (ROWS_TILE_M, self.head_dim)
        gO = cute.local_tile(mO[batch, head, None, None], tile, (m_block, 0))  # (ROWS_TILE_M, D)
        gdO = cute.local_tile(mdO[batch, head, None, None], tile, (m_block, 0))  # (ROWS_TILE_M, D)
        cO = cute.local_tile(cute.make_identity_tensor((seqlen_q, self.head_dim)), tile, (m_block, 0))
        thr_copy = tiled_copy.get_slice(tidx)
        tOgO = thr_copy.partition_S(gO)  # (CPY, CPY_M, CPY_D)
        tOgdO = thr_copy.partition_S(gdO)  # (CPY, CPY_M, CPY_D)
        tOcO = thr_copy.partition_S(cO)  # (CPY, CPY_M, CPY_D)
        # Zeros first: stores hold no registers, so the loads below keep the default's (80 at D=128, six CTAs an
        # SM; zeroed after the loads were issued, 90 and five).
        if cutlass.const_expr(self.zero_dq_accum):
            share = ROWS_TILE_M * self.head_dim
            head_accum = mdQaccum[batch, head, None]  # (n,)
            span = owned_span(m_block, cute.ceil_div(seqlen_q, ROWS_TILE_M), share, cute.size(head_accum))
            zero_span(head_accum, *span, tidx, self.threads_per_cta)
        tOrO = cute.make_rmem_tensor_like(tOgO)
        tOrdO = cute.make_rmem_tensor_like(tOgdO)
        tOrO.fill(0.0)
        tOrdO.fill(0.0)
        gLSE, gLSE2, gDelta = (t[batch, head, None] for t in (mLSE, mLSE2, mDelta))  # (Sq,)
        rows = cute.size(tOrO, mode=[1])
        # Each row's LSE (and dLSE) loaded with its O and dO: read after the row's D is stored, as it once was,
        # every load waited for the one before it (the stores may alias them), eight DRAM latencies in series.
        lses = cute.make_rmem_tensor(rows, cutlass.Float32)
        d_lses = cute.make_rmem_tensor(rows, cutlass.Float32)
        lses.fill(0.0)
        d_lses.fill(0.0)
        for m in cutlass.range_constexpr(rows):
            row = tOcO[0, m, 0][0]
            if row < seqlen_q:
                cute.copy(tiled_copy, tOgO[None, m, None], tOrO[None, m, None])
                cute.copy(tiled_copy, tOgdO[None, m, None], tOrdO[None, m, None])
                lses[m] = gLSE[row]
                if cutlass.const_expr(self.has_dlse):
                    d_lses[m] = mdLSE[batch, head, row]
        # This thread's share of each of its rows, summed over the copy vector and the D steps.
        partial_sums = (tOrO.load().to(cutlass.Float32) * tOrdO.load().to(cutlass.Float32)).reduce(
            cute.ReductionOp.ADD, init_val=0.0, reduction_profile=(0, None, 1)
        )
        row_sums = cute.make_rmem_tensor(rows, cutlass.Float32)
        row_sums.store(partial_sums)
        for m in cutlass.range_constexpr(rows):
            total = lanes_allreduce_sum(row_sums[m], threads_per_row)
            row = tOcO[0, m, 0][0]
            # The row's first lane writes D and LSE₂ (rows past Sq are not written).
            # Nested dynamic `if`s, as the forward rungs write their predicates.
            if tOcO[0, m, 0][1] == 0:  # noqa: SIM102
                if row < seqlen_q:
                    if cutlass.const_expr(self.has_dlse):
                        total = total - d_lses[m]
                    gDelta[row] = total
                    # Guard: a row that sees no key has LSE -inf; +inf makes its P = exp2(S − inf) = 0, not NaN.
                    lse = lses[m]
                    lse2 = cutlass.select_(lse == -cutlass.Float32.inf, cutlass.Float32.inf, lse * LOG2_E)
                    gLSE2[row] = cutlass.Float32(lse2)


# ----------------------------------------------------------------------------------------------
# 2. dK and dV: one key block per CTA, the query blocks (of every head of the group) walked
# ----------------------------------------------------------------------------------------------
class _DKDVKernel:
    """FA2's dK/dV kernel: Sᵀ = K Qᵀ → Pᵀ → dPᵀ = V dOᵀ → dV += Pᵀ dO → dSᵀ → dK += dSᵀ Q per query block."""

    def __init__(self, config: BackwardConfig):
        self.head_dim = config.head_dim
        self.causal = config.causal
        self.bottom_right = config.bottom_right
        self.tile_m = config.tiles.tile_m
        self.tile_n = config.tiles.tile_n
        self.threads_per_cta = self.tile_n // 16 * WARP_THREADS

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mdO: cute.Tensor,
        mLSE2: cute.Tensor,
        mDelta: cute.Tensor,
        mdK: cute.Tensor,
        mdV: cute.Tensor,
        softmax_scale: cutlass.Float32,
        stream: cuda.CUstream,
    ):
        """q, do (B, H, Sq, D); k, v, dk, dv (B, Hkv, Sk, D); lse2, delta (B, H, Sq) fp32."""
        dtype = mQ.element_type
        mQ, mK, mV, mdO, mdK, mdV = [static_head_dim_view(t, self.head_dim) for t in (mQ, mK, mV, mdO, mdK, mdV)]
        sQ_layout = row_tile_layout(self.tile_m, self.head_dim)
        sKV_layout = row_tile_layout(self.tile_n, self.head_dim)
        self.kernel(
            mQ, mK, mV, mdO, mLSE2, mDelta, mdK, mdV, softmax_scale, softmax_scale * LOG2_E,
            sQ_layout, sKV_layout,
            row_tile_copy(dtype, self.threads_per_cta, self.head_dim, (self.tile_m, self.tile_n)),
            warp_tiled_mma(dtype, self.threads_per_cta),
            two_tile_storage(dtype, sKV_layout, sQ_layout),
        ).launch(
            grid=(cute.ceil_div(mK.shape[2], self.tile_n), mK.shape[1], mK.shape[0]),
            block=[self.threads_per_cta, 1, 1],
            stream=stream,
        )  # fmt: skip

    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mdO: cute.Tensor,
        mLSE2: cute.Tensor,
        mDelta: cute.Tensor,
        mdK: cute.Tensor,
        mdV: cute.Tensor,
        softmax_scale: cutlass.Float32,
        softmax_scale_log2: cutlass.Float32,
        sQ_layout: cute.ComposedLayout,
        sKV_layout: cute.ComposedLayout,
        gmem_tiled_copy: cute.TiledCopy,
        tiled_mma: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        n_block, kv_head, batch = cute.arch.block_idx()
        seqlen_q = mQ.shape[2]
        seqlen_k = mK.shape[2]
        group = mQ.shape[1] // mK.shape[1]
        causal_offset = 0
        if cutlass.const_expr(self.bottom_right):
            causal_offset = seqlen_k - seqlen_q
        n_start = n_block * self.tile_n

        # ---- Query blocks: [m_block_min, m_block_unmasked) masked, then up to m_block_max --------
        # Causal: rows i < n_start − causal_offset see none of these keys; rows before
        # diagonal_end see only some. A key block holding the key tail masks every query block.
        m_block_max = cute.ceil_div(seqlen_q, self.tile_m)
        m_block_min = 0
        m_block_unmasked = 0
        if cutlass.const_expr(self.causal):
            m_block_min = cutlass.max(n_start - causal_offset, 0) // self.tile_m
            diagonal_end = cutlass.max(n_start + self.tile_n - 1 - causal_offset, 0)
            m_block_unmasked = cutlass.max(cutlass.min(cute.ceil_div(diagonal_end, self.tile_m), m_block_max),
                                           m_block_min)  # fmt: skip
        m_block_unmasked = cutlass.select_(n_start + self.tile_n > seqlen_k, m_block_max, m_block_unmasked)

        # ---- 2a. K and V of this block to shared memory, once ---------------------------------
        tile_q = (self.tile_m, self.head_dim)
        tile_kv = (self.tile_n, self.head_dim)
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sK = storage.a0.get_tensor(sKV_layout)  # (tile_n, D, 1)
        sV = storage.a1.get_tensor(sKV_layout)  # (tile_n, D, 1)
        sQ = storage.b0.get_tensor(sQ_layout)  # (tile_m, D, 1)
        sdO = storage.b1.get_tensor(sQ_layout)  # (tile_m, D, 1)
        gmem_thr_copy = gmem_tiled_copy.get_slice(tidx)
        gK = cute.local_tile(mK[batch, kv_head, None, None], tile_kv, (None, 0))  # (tile_n, D, n_blocks)
        gV = cute.local_tile(mV[batch, kv_head, None, None], tile_kv, (None, 0))  # (tile_n, D, n_blocks)
        cKV = cute.local_tile(cute.make_identity_tensor((seqlen_k, self.head_dim)), tile_kv, (None, 0))
        kv_copy = kv_copy_partitions(gmem_tiled_copy, gmem_thr_copy, gK, sK, gV, sV, cKV)
        load_rows(kv_copy, n_block, seqlen_k)

        # ---- MMA fragments: keys are the rows (M) of every product ----------------------------
        thr_mma = tiled_mma.get_slice(tidx)
        sK0, sV0, sQ0, sdO0 = (t[None, None, 0] for t in (sK, sV, sQ, sdO))
        sQt = transposed(sQ, self.tile_m, self.head_dim)  # (D, tile_m)
        sdOt = transposed(sdO, self.tile_m, self.head_dim)  # (D, tile_m)
        tSrK = thr_mma.make_fragment_A(thr_mma.partition_A(sK0))  # (MMA, MMA_N, MMA_D)
        tSrQ = thr_mma.make_fragment_B(thr_mma.partition_B(sQ0))  # (MMA, MMA_M, MMA_D)
        tdPrV = thr_mma.make_fragment_A(thr_mma.partition_A(sV0))  # (MMA, MMA_N, MMA_D)
        tdPrdO = thr_mma.make_fragment_B(thr_mma.partition_B(sdO0))  # (MMA, MMA_M, MMA_D)
        tdVrdOt = thr_mma.make_fragment_B(thr_mma.partition_B(sdOt))  # (MMA, MMA_D, MMA_M)
        tdKrQt = thr_mma.make_fragment_B(thr_mma.partition_B(sQt))  # (MMA, MMA_D, MMA_M)
        operands = (
            smem_operand(tiled_mma, tidx, sK0, tSrK, "A"),
            smem_operand(tiled_mma, tidx, sQ0, tSrQ, "B"),
            smem_operand(tiled_mma, tidx, sV0, tdPrV, "A"),
            smem_operand(tiled_mma, tidx, sdO0, tdPrdO, "B"),
            smem_operand(tiled_mma, tidx, sdOt, tdVrdOt, "B", transpose=True),
            smem_operand(tiled_mma, tidx, sQt, tdKrQt, "B", transpose=True),
        )
        fragments = (tSrK, tSrQ, tdPrV, tdPrdO, tdVrdOt, tdKrQt)
        acc_dK = cute.make_rmem_tensor(thr_mma.partition_shape_C(tile_kv), cutlass.Float32)  # (MMA, MMA_N, MMA_D)
        acc_dV = cute.make_rmem_tensor(thr_mma.partition_shape_C(tile_kv), cutlass.Float32)  # (MMA, MMA_N, MMA_D)
        acc_dK.fill(0.0)
        acc_dV.fill(0.0)

        # ---- 2b. Every query head of the group, every query block that sees these keys ---------
        cQ = cute.local_tile(cute.make_identity_tensor((seqlen_q, self.head_dim)), tile_q, (None, 0))
        for head_in_group in cutlass.range(group, unroll=1):
            head = kv_head * group + head_in_group
            gQ = cute.local_tile(mQ[batch, head, None, None], tile_q, (None, 0))  # (tile_m, D, m_blocks)
            gdO = cute.local_tile(mdO[batch, head, None, None], tile_q, (None, 0))  # (tile_m, D, m_blocks)
            # Q and dO travel together like K and V in the forward: one two-tile copy.
            q_copy = kv_copy_partitions(gmem_tiled_copy, gmem_thr_copy, gQ, sQ, gdO, sdO, cQ)
            rows = (mLSE2[batch, head, None], mDelta[batch, head, None], seqlen_q, seqlen_k, causal_offset)
            step = functools.partial(
                self.dkdv_step, tiled_mma, q_copy, operands, fragments, acc_dK, acc_dV, rows, n_start,
                softmax_scale_log2,
            )  # fmt: skip
            for m_block in cutlass.range(m_block_min, m_block_unmasked, 1, unroll=1):
                step(m_block, masked=True)
            for m_block in cutlass.range(m_block_unmasked, m_block_max, 1, unroll=1):
                step(m_block, masked=False)

        # ---- 2c. dK carries the softmax scale of S = softmax_scale · Q Kᵀ; dV none -----------
        acc_dK.store(acc_dK.load() * softmax_scale)
        gdK = cute.local_tile(mdK[batch, kv_head, None, None], tile_kv, (n_block, 0))  # (tile_n, D)
        gdV = cute.local_tile(mdV[batch, kv_head, None, None], tile_kv, (n_block, 0))  # (tile_n, D)
        store_rows(thr_mma, acc_dK, gdK, cute.make_identity_tensor(tile_kv), seqlen_k - n_start)
        store_rows(thr_mma, acc_dV, gdV, cute.make_identity_tensor(tile_kv), seqlen_k - n_start)

    @cute.jit
    def dkdv_step(
        self,
        tiled_mma: cute.TiledMma,
        q_copy,
        operands: tuple,
        fragments: tuple,
        acc_dK: cute.Tensor,
        acc_dV: cute.Tensor,
        rows: tuple,
        n_start: cutlass.Int32,
        softmax_scale_log2: cutlass.Float32,
        m_block: cutlass.Int32,
        masked: cutlass.Constexpr,
    ):
        """One query block: Q and dO in, then the five products; ``masked``: the causal diagonal and
        the key tail get Pᵀ = 0 (the query tail needs no mask: its Q and dO are 0 and its LSE₂ +inf)."""
        load_k, load_q, load_v, load_do, load_dot, load_qt = operands
        rK, rQ, rV, rdO, rdOt, rQt = fragments
        gLSE2, gDelta, seqlen_q, seqlen_k, causal_offset = rows
        load_rows(q_copy, m_block, seqlen_q)
        m_start = m_block * self.tile_m

        # ---- Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (tile_n × tile_m) ---------------------------------------
        shape_St = tiled_mma.partition_shape_C((self.tile_n, self.tile_m))
        acc_St = cute.make_rmem_tensor(shape_St, cutlass.Float32)  # (MMA, MMA_N, MMA_M)
        acc_St.fill(0.0)
        gemm_double_buffered(tiled_mma, acc_St, rK, rQ, pieces(self.tile_m), b_load=load_q, a_load=load_k)
        acc_dPt = cute.make_rmem_tensor(shape_St, cutlass.Float32)  # (MMA, MMA_N, MMA_M)
        acc_dPt.fill(0.0)
        gemm_double_buffered(tiled_mma, acc_dPt, rV, rdO, pieces(self.tile_m), b_load=load_do, a_load=load_v)

        # ---- Pᵀ = exp2(Sᵀ · scale_log2 − LSE₂[col]) and dSᵀ = Pᵀ ∘ (dPᵀ − D[col]) --------------
        # Column coordinates (query rows) = this thread's first one + thread 0's (compile-time) offsets.
        tile = cute.make_identity_tensor((self.tile_n, self.tile_m))
        tScS = rows_by_cols(tiled_mma.get_slice(cute.arch.thread_idx()[0]).partition_C(tile))  # (rows, cols)
        offsets = rows_by_cols(tiled_mma.get_slice(0).partition_C(tile))
        first_query = m_start + tScS[0, 0][1]
        St, dPt = rows_by_cols(acc_St), rows_by_cols(acc_dPt)
        lse2 = cute.make_rmem_tensor(cute.size(St, mode=[1]), cutlass.Float32)
        delta = cute.make_rmem_tensor(cute.size(St, mode=[1]), cutlass.Float32)
        for c in cutlass.range_constexpr(cute.size(St, mode=[1])):
            query = first_query + offsets[0, c][1]
            lse2[c] = read_row_values(gLSE2, query, seqlen_q, cutlass.Float32.inf)
            delta[c] = read_row_values(gDelta, query, seqlen_q, cutlass.Float32(0.0))
        for r in cutlass.range_constexpr(cute.size(St, mode=[0])):
            key = n_start + tScS[r, 0][0]
            # Row r keeps the queries with offset >= first_visible (causal: query >= key − causal_offset).
            first_visible = 0
            if cutlass.const_expr(self.causal):
                first_visible = key - causal_offset - first_query
            key_ok = key < seqlen_k
            for c in cutlass.range_constexpr(cute.size(St, mode=[1])):
                p = cute.math.exp2(St[r, c] * softmax_scale_log2 - lse2[c], fastmath=True)
                if cutlass.const_expr(masked):
                    p = cutlass.Float32(cutlass.select_(key_ok & (offsets[0, c][1] >= first_visible), p, 0.0))
                St[r, c] = p
                dPt[r, c] = p * (dPt[r, c] - delta[c])

        # ---- dV += Pᵀ dO; dK += dSᵀ Q (Pᵀ and dSᵀ in the input dtype, as A operands) --------------
        rPt = cute.make_fragment_like(acc_St, rQ.element_type)
        rPt.store(acc_St.load().to(rQ.element_type))
        gemm_double_buffered(
            tiled_mma, acc_dV, accumulator_as_operand_a(rPt), rdOt, pieces(self.head_dim), b_load=load_dot
        )
        rdSt = cute.make_fragment_like(acc_dPt, rQ.element_type)
        rdSt.store(acc_dPt.load().to(rQ.element_type))
        gemm_double_buffered(
            tiled_mma, acc_dK, accumulator_as_operand_a(rdSt), rQt, pieces(self.head_dim), b_load=load_qt
        )


# ----------------------------------------------------------------------------------------------
# 3. dQ: one query block per CTA, the key blocks walked, dQ in registers
# ----------------------------------------------------------------------------------------------
class _DQKernel:
    """The separate dQ pass: S = Q Kᵀ → mask → P → dP = dO Vᵀ → dS → dQ += dS K per key block."""

    def __init__(self, config: BackwardConfig):
        self.head_dim = config.head_dim
        self.causal = config.causal
        self.bottom_right = config.bottom_right
        self.gqa = config.gqa
        self.tile_m = config.tiles.dq_tile_m
        self.tile_n = config.tiles.dq_tile_n
        self.threads_per_cta = self.tile_m // 16 * WARP_THREADS

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mdO: cute.Tensor,
        mLSE2: cute.Tensor,
        mDelta: cute.Tensor,
        mdQ: cute.Tensor,
        softmax_scale: cutlass.Float32,
        stream: cuda.CUstream,
    ):
        """q, do, dq (B, H, Sq, D); k, v (B, Hkv, Sk, D); lse2, delta (B, H, Sq) fp32."""
        dtype = mQ.element_type
        mQ, mK, mV, mdO, mdQ = [static_head_dim_view(t, self.head_dim) for t in (mQ, mK, mV, mdO, mdQ)]
        sQ_layout = row_tile_layout(self.tile_m, self.head_dim)
        sKV_layout = row_tile_layout(self.tile_n, self.head_dim)
        self.kernel(
            mQ, mK, mV, mdO, mLSE2, mDelta, mdQ, softmax_scale, softmax_scale * LOG2_E,
            sQ_layout, sKV_layout,
            row_tile_copy(dtype, self.threads_per_cta, self.head_dim, (self.tile_m, self.tile_n)),
            warp_tiled_mma(dtype, self.threads_per_cta),
            two_tile_storage(dtype, sQ_layout, sKV_layout),
        ).launch(
            grid=(cute.ceil_div(mQ.shape[2], self.tile_m), mQ.shape[1], mQ.shape[0]),
            block=[self.threads_per_cta, 1, 1],
            stream=stream,
        )  # fmt: skip

    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mdO: cute.Tensor,
        mLSE2: cute.Tensor,
        mDelta: cute.Tensor,
        mdQ: cute.Tensor,
        softmax_scale: cutlass.Float32,
        softmax_scale_log2: cutlass.Float32,
        sQ_layout: cute.ComposedLayout,
        sKV_layout: cute.ComposedLayout,
        gmem_tiled_copy: cute.TiledCopy,
        tiled_mma: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        block_m, head, batch = cute.arch.block_idx()
        grid_m, _, _ = cute.arch.grid_dim()
        seqlen_q = mQ.shape[2]
        # Causal: the last query blocks see the most keys; launching them first evens out the tail.
        m_block = block_m
        if cutlass.const_expr(self.causal):
            m_block = grid_m - 1 - block_m
        kv_head = head
        if cutlass.const_expr(self.gqa):
            kv_head = head // (mQ.shape[1] // mK.shape[1])
        seqlen = SeqlenInfo.create(batch, seqlen_q, mK.shape[2], None, self.bottom_right)
        block_range = BlockRange.create(m_block, seqlen, self.tile_m, self.tile_n, self.causal)
        n_block_max = block_range.n_block_max
        tile_q = (self.tile_m, self.head_dim)
        tile_kv = (self.tile_n, self.head_dim)

        # ---- 3a. Q and dO (this block) to shared memory once; K and V per key block ----------
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sQ = storage.a0.get_tensor(sQ_layout)  # (tile_m, D, 1)
        sdO = storage.a1.get_tensor(sQ_layout)  # (tile_m, D, 1)
        sK = storage.b0.get_tensor(sKV_layout)  # (tile_n, D, 1)
        sV = storage.b1.get_tensor(sKV_layout)  # (tile_n, D, 1)
        gmem_thr_copy = gmem_tiled_copy.get_slice(tidx)
        gQ = cute.local_tile(mQ[batch, head, None, None], tile_q, (None, 0))  # (tile_m, D, m_blocks)
        gdO = cute.local_tile(mdO[batch, head, None, None], tile_q, (None, 0))  # (tile_m, D, m_blocks)
        cQ = cute.local_tile(cute.make_identity_tensor((seqlen_q, self.head_dim)), tile_q, (None, 0))
        gK = cute.local_tile(mK[batch, kv_head, None, None], tile_kv, (None, 0))  # (tile_n, D, n_blocks)
        gV = cute.local_tile(mV[batch, kv_head, None, None], tile_kv, (None, 0))  # (tile_n, D, n_blocks)
        cKV = cute.local_tile(cute.make_identity_tensor((seqlen.seqlen_k, self.head_dim)), tile_kv, (None, 0))
        load_rows(kv_copy_partitions(gmem_tiled_copy, gmem_thr_copy, gQ, sQ, gdO, sdO, cQ), m_block, seqlen_q)
        kv_copy = kv_copy_partitions(gmem_tiled_copy, gmem_thr_copy, gK, sK, gV, sV, cKV)

        thr_mma = tiled_mma.get_slice(tidx)
        sQ0, sdO0, sK0, sV0 = (t[None, None, 0] for t in (sQ, sdO, sK, sV))
        sKt = transposed(sK, self.tile_n, self.head_dim)  # (D, tile_n)
        tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ0))  # (MMA, MMA_M, MMA_D)
        tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sK0))  # (MMA, MMA_N, MMA_D)
        tdPrdO = thr_mma.make_fragment_A(thr_mma.partition_A(sdO0))  # (MMA, MMA_M, MMA_D)
        tdPrV = thr_mma.make_fragment_B(thr_mma.partition_B(sV0))  # (MMA, MMA_N, MMA_D)
        tdQrKt = thr_mma.make_fragment_B(thr_mma.partition_B(sKt))  # (MMA, MMA_D, MMA_N)
        operands = (
            smem_operand(tiled_mma, tidx, sQ0, tSrQ, "A"),
            smem_operand(tiled_mma, tidx, sK0, tSrK, "B"),
            smem_operand(tiled_mma, tidx, sdO0, tdPrdO, "A"),
            smem_operand(tiled_mma, tidx, sV0, tdPrV, "B"),
            smem_operand(tiled_mma, tidx, sKt, tdQrKt, "B", transpose=True),
        )
        fragments = (tSrQ, tSrK, tdPrdO, tdPrV, tdQrKt)
        acc_dQ = cute.make_rmem_tensor(thr_mma.partition_shape_C(tile_q), cutlass.Float32)  # (MMA, MMA_M, MMA_D)
        acc_dQ.fill(0.0)

        # LSE₂ and D of this thread's rows (rows past Sq: +inf and 0, so their P and dS are 0).
        tScS = rows_by_cols(thr_mma.partition_C(cute.make_identity_tensor((self.tile_m, self.tile_n))))
        rows_per_thread = cute.size(tScS, mode=[0])
        lse2 = cute.make_rmem_tensor(rows_per_thread, cutlass.Float32)
        delta = cute.make_rmem_tensor(rows_per_thread, cutlass.Float32)
        for r in cutlass.range_constexpr(rows_per_thread):
            row = m_block * self.tile_m + tScS[r, 0][0]
            lse2[r] = read_row_values(mLSE2[batch, head, None], row, seqlen_q, cutlass.Float32.inf)
            delta[r] = read_row_values(mDelta[batch, head, None], row, seqlen_q, cutlass.Float32(0.0))

        # ---- 3b. Key blocks, last first: the masked ones (diagonal, key tail), then the rest ---
        mask = AttentionMask(self.tile_m, self.tile_n, self.causal, tiled_mma, tidx, m_block, seqlen)
        step = functools.partial(
            self.dq_step, tiled_mma, kv_copy, operands, fragments, acc_dQ, lse2, delta, mask, softmax_scale_log2
        )
        for i in cutlass.range_constexpr(block_range.n_masked_blocks):
            if i < n_block_max:
                step(n_block_max - 1 - i, masked=True)
        for i in cutlass.range(block_range.n_masked_blocks, n_block_max, 1, unroll=1):
            step(n_block_max - 1 - i, masked=False)

        # ---- 3c. dQ ·= softmax_scale, stored in the input dtype --------------------------------
        acc_dQ.store(acc_dQ.load() * softmax_scale)
        gdQ = cute.local_tile(mdQ[batch, head, None, None], tile_q, (m_block, 0))  # (tile_m, D)
        store_rows(thr_mma, acc_dQ, gdQ, cute.make_identity_tensor(tile_q), seqlen_q - m_block * self.tile_m)

    @cute.jit
    def dq_step(
        self,
        tiled_mma: cute.TiledMma,
        kv_copy,
        operands: tuple,
        fragments: tuple,
        acc_dQ: cute.Tensor,
        lse2: cute.Tensor,
        delta: cute.Tensor,
        mask: AttentionMask,
        softmax_scale_log2: cutlass.Float32,
        n_block: cutlass.Int32,
        masked: cutlass.Constexpr,
    ):
        """One key block: K and V in, S = Q Kᵀ → mask → P → dP = dO Vᵀ → dS → dQ += dS K."""
        load_q, load_k, load_do, load_v, load_kt = operands
        rQ, rK, rdO, rV, rKt = fragments
        load_rows(kv_copy, n_block, mask.seqlen_k)
        shape_S = tiled_mma.partition_shape_C((self.tile_m, self.tile_n))
        acc_S = cute.make_rmem_tensor(shape_S, cutlass.Float32)  # (MMA, MMA_M, MMA_N)
        acc_S.fill(0.0)
        gemm_double_buffered(tiled_mma, acc_S, rQ, rK, pieces(self.tile_n), b_load=load_k, a_load=load_q)
        if cutlass.const_expr(masked):
            mask.apply(acc_S, n_block)
        acc_dP = cute.make_rmem_tensor(shape_S, cutlass.Float32)  # (MMA, MMA_M, MMA_N)
        acc_dP.fill(0.0)
        gemm_double_buffered(tiled_mma, acc_dP, rdO, rV, pieces(self.tile_n), b_load=load_v, a_load=load_do)
        # P = exp2(S · scale_log2 − LSE₂[row]) (masked -inf → 0); dS = P ∘ (dP − D[row]).
        S, dP = rows_by_cols(acc_S), rows_by_cols(acc_dP)
        for r in cutlass.range_constexpr(cute.size(S, mode=[0])):
            for c in cutlass.range_constexpr(cute.size(S, mode=[1])):
                p = cute.math.exp2(S[r, c] * softmax_scale_log2 - lse2[r], fastmath=True)
                dP[r, c] = p * (dP[r, c] - delta[r])
        rdS = cute.make_fragment_like(acc_dP, rQ.element_type)
        rdS.store(acc_dP.load().to(rQ.element_type))
        gemm_double_buffered(
            tiled_mma, acc_dQ, accumulator_as_operand_a(rdS), rKt, pieces(self.head_dim), b_load=load_kt
        )


# ----------------------------------------------------------------------------------------------
# Host: validate, allocate D, LSE₂ and the gradients, launch the three kernels (compiled once per
# configuration, from fakes, like every CuTe rung)
# ----------------------------------------------------------------------------------------------
def _fake_preprocess_arguments(config: BackwardConfig) -> tuple:
    element = CUTE_DTYPES[config.dtype]
    lse, lse_log2, delta = (fake_tensor(cutlass.Float32, 3) for _ in range(3))
    d_lse = fake_tensor(cutlass.Float32, 3) if config.has_dlse else None
    dq_accum = fake_tensor(cutlass.Float32, 3) if config.zero_dq_accum else None
    return (fake_tensor(element, 4), fake_tensor(element, 4), lse, d_lse, lse_log2, delta, dq_accum, fake_stream())


def _fake_dkdv_arguments(config: BackwardConfig) -> tuple:
    element = CUTE_DTYPES[config.dtype]
    operands = [fake_tensor(element, 4) for _ in range(4)]
    rows = [fake_tensor(cutlass.Float32, 3) for _ in range(2)]
    gradients = [fake_tensor(element, 4) for _ in range(2)]
    return (*operands, *rows, *gradients, cutlass.Float32(1.0), fake_stream())


def _fake_dq_arguments(config: BackwardConfig) -> tuple:
    element = CUTE_DTYPES[config.dtype]
    operands = [fake_tensor(element, 4) for _ in range(4)]
    rows = [fake_tensor(cutlass.Float32, 3) for _ in range(2)]
    return (*operands, *rows, fake_tensor(element, 4), cutlass.Float32(1.0), fake_stream())


KERNELS = {
    "preprocess": CompiledKernels(_PreprocessKernel, _fake_preprocess_arguments),
    "dkdv": CompiledKernels(_DKDVKernel, _fake_dkdv_arguments),
    "dq": CompiledKernels(_DQKernel, _fake_dq_arguments),
}


def backward_config(problem: Problem, has_dlse: bool = False) -> BackwardConfig:
    """The compile key of ``problem``'s backward (``has_dlse``: the LSE is differentiated too)."""
    return BackwardConfig(
        dtype=problem.dtype,
        head_dim=problem.head_dim,
        causal=problem.causal,
        bottom_right=problem.bottom_right,
        gqa=problem.kv_heads != problem.heads,
        has_dlse=has_dlse,
    )


def _launch(operands: BackwardOperands, problem: Problem, device: torch.device) -> None:
    """The three launches on ``operands``, with D and LSE₂ allocated here, on the current stream."""
    config = backward_config(problem, has_dlse=operands.d_lse is not None)
    rows_shape = (problem.batch, problem.heads, problem.seqlen_q)
    delta, lse_log2 = (torch.empty(rows_shape, dtype=torch.float32, device=device) for _ in "01")
    q, k, v, out, d_out, lse, d_lse, dq, dk, dv = operands
    KERNELS["preprocess"].kernel(config)(out, d_out, lse, d_lse, lse_log2, delta, None)
    KERNELS["dkdv"].kernel(config)(q, k, v, d_out, lse_log2, delta, dk, dv, problem.scale)
    KERNELS["dq"].kernel(config)(q, k, v, d_out, lse_log2, delta, dq, problem.scale)


def compile_sm90(problem: Problem, has_dlse: bool = False) -> list[KernelBinary]:
    """The three kernels compiled for sm_90a at ``problem``'s configuration (fakes: no GPU needed)."""
    config = backward_config(problem, has_dlse)
    return [
        binary
        for name, kernels in KERNELS.items()
        for binary in kernels.binaries(config, f"cute_backward_tiled_{name}")
    ]


# ----------------------------------------------------------------------------------------------
# Capability check
# ----------------------------------------------------------------------------------------------
def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    """A CUDA device of sm_80+ (mma.sync bf16, cp.async, ldmatrix), fp16/bf16, D 64 or 128, softmax_scale
    > 0, and the features GQA, both causal alignments and a differentiable LSE; ``cache_seqlens`` and
    paged caches are refused."""
    return mma_sync_supports(BACKWARD_NAME, problem, device, head_dims=HEAD_DIMS, features=(GQA, BOTTOM_RIGHT, LSE))


BACKWARD_NAME = "cute/backward/tiled"
tiled_gradients = cute_gradients(BACKWARD_NAME, supports, _launch)
BACKWARD = Backward(
    name=BACKWARD_NAME,
    gradients=tiled_gradients,
    supports=supports,
    compile_sm90=compile_sm90,
    runs_on_cpu=False,
    source_file=__file__,
)
