"""Rung ``hopper`` (CuTe DSL): TMA + WGMMA + warp specialisation. Counterpart: ``triton_impl/hopper.py``.

What it adds over ``pipelined``
-------------------------------
``pipelined`` still spends the threads that do the math on moving data (cp.async issue, ldmatrix)
and runs warp-level ``mma.sync`` whose operands all pass through registers. On Hopper:

* TMA (``cp.async.bulk.tensor``) copies a whole swizzled tile with one instruction from one thread,
  and an mbarrier counts the bytes in: the loads cost the math warps nothing.
* WGMMA (``wgmma.mma_async``) lets a warpgroup (128 threads) multiply a 64-row tile straight from
  shared memory (QKᵀ: both operands; PV: P from registers, V from shared memory), asynchronously.
* Warp specialisation: one producer warp only issues TMA and runs ahead through a K/V ring; two
  (D=128) or three (D=64) consumer warpgroups only compute. ``setmaxnreg`` moves registers from
  the producer (24) to the consumers (240, or 160 with three), which hold the 64 x tile_n fp32
  scores and the 64 x D fp32 output.

Warp roles (n consumer warpgroups: 384 or 512 threads)
-----------------------------------------------------
A tile is 64 n query rows of one (b, h). Launches are persistent (causal D=64 excepted, which runs
one CTA per tile): ``min(tiles, SM count)`` CTAs (the SM count is a launch argument) deal the tiles
in rounds of one tile each, forwards then backwards (a snake, ``TileOrder``), so that causal tiles,
sorted longest first, even out over the CTAs. The tiles of one head are consecutive, so the CTAs
running together share its K and V in L2.

* warpgroup 0, warp 0: producer. Per tile: loads Q (n 64-row boxes), then K and V of every key
  block. Warps 1-3 give their registers back and exit.
* warpgroups 1 .. n: consumers; warpgroup ``1 + w`` owns the tile's query rows ``[64 w, 64 w + 64)``.

Pipelines and barriers (producer -> consumer, arrive counts)
------------------------------------------------------------
* ``q_full[w]`` (mbarrier, one phase per tile): producer arrive+expect_tx (1 arrive, Q box bytes)
  -> consumer warpgroup ``w`` waits.
* ``q_empty[w]`` (mbarrier, one phase per tile): 4 arrives, one elected lane per warp of consumer
  ``w`` once its last S = Q Kᵀ of the tile has retired -> the producer waits before loading the
  next tile's Q box (persistent CTAs only; K and V rings simply run on across tiles).
* K ring and V ring (``PipelineTmaAsync``, ``kv_stages`` = 2 each): full barrier: 1 producer arrive
  with expect_tx(tile bytes), completed by TMA; empty barrier: 4 n arrives, one elected lane per
  consumer warp, released as soon as the WGMMA that read the stage has retired.
* Ping-pong (``WarpgroupTurns``, round robin; non-causal only, and not FP8 at D=128): named barrier
  ``4 + w`` (256 threads: 128 of consumer ``w`` wait, 128 of consumer ``w - 1`` arrive) gates
  consumer ``w``'s WGMMA issue; the last consumer arrives once up front so consumer 0 goes first,
  and consumer 0 consumes the last arrive at the end.
* Epilogue: named barrier ``1 + w`` (128 threads) between the shared-memory writes of O and the
  TMA store issued by one warp of the warpgroup. The store is left in flight; a persistent CTA's
  storing warp waits for it to have read the O box (``cp.async.bulk.wait_group.read``), then the
  same barrier, before the next tile's O is written there.

Algorithm (each consumer warpgroup; numbers match the kernel's sections)
------------------------------------------------------------------------
1. Wait for its Q box.
2. Key blocks n = last .. 0, so the blocks that need a mask come first (``KeyBlockRange``):
   a. wait K[n];  S = Q Kᵀ (WGMMA, both operands from SMEM, fp32 accumulator in registers)
   b. only on the first blocks: -inf for keys >= Sk and, causal, keys after the row
   c. online softmax on the accumulator: block max (tree + two lane shuffles); the reference
      row_max moves only when the block max exceeds it by more than 2^8 (lazy rescaling; 16-bit P
      may then reach 256; fp8 moves it on any increase, its P already spans [0, 2^8]);
      P = exp2(S * scale_log2 - row_max * scale_log2), row_sum, correction = exp2(old - new, scaled)
   d. P -> bf16/fp16 in the WGMMA A-operand register layout (no shared-memory round trip)
   e. wait V[n];  O = O * correction + P V (WGMMA, P from registers); the multiply is skipped,
      by one warp-uniform branch (``vote.any``), when no row of the warp moved its reference
   Steps overlap: block n's S = Q K[n]ᵀ is issued together with block n+1's O += P V, and the
   softmax of S runs while that PV WGMMA is still in flight (``next_block``); O is rescaled only
   after the PV has retired.
3. O /= row_sum; lse = ln(sum exp(scaled S)) = (row_max * scale_log2 + log2(row_sum)) * ln 2.
4. O -> registers in the output dtype -> ``stmatrix`` into the warpgroup's O box (one CTA per
   tile: the now dead Q box; persistent: a box of its own, since the next tile's Q is already
   loading) -> fence.proxy.async -> named barrier -> TMA store (rows past Sq clipped by the TMA
   unit). LSE is stored directly from registers.

Data movement
-------------
HBM -> SMEM: TMA boxes (64 x D for Q, tile_n x D for K, D x tile_n for V) into 128-byte-swizzled
layouts that WGMMA reads without bank conflicts; boxes past Sq/Sk are zero-filled by TMA, which is
why any S >= 1 works. SMEM -> tensor cores: WGMMA descriptors (no ldmatrix). Registers -> SMEM ->
HBM for O: stmatrix then ``cp.async.bulk.tensor`` store. Shared memory at D=128: Q 32 KB (+ O
32 KB when persistent) + 2 x (K 32 KB + V 32 KB) = 160 (192) KB; at D=64 (three consumers): Q 24 KB
(+ O 24 KB) + 2 x (16 + 16 KB) = 88 (112) KB.

Steady-state timeline
---------------------
Producer:  Q | K0 V0 | K1 V1 | K2 V2 ...  (runs up to two blocks ahead; waits on empty barriers)
WG1: [issue QKᵀ(n) + PV(n+1)] softmax(n) ....... [issue QKᵀ(n-1) + PV(n)] softmax(n-1) ...
WG2: ........ [issue QKᵀ(n) + PV(n+1)] softmax(n) ....... [issue QKᵀ(n-1) + PV(n)] ...
The tensor cores alternate between the warpgroups' GEMMs while the other warpgroup runs exp2.
With three consumers (D=64) the turn goes round WG1 -> WG2 -> WG3, and two softmaxes run under
each warpgroup's GEMMs. Persistent: as soon as every consumer has issued its last S = Q Kᵀ of a
tile, the producer loads the next tile's Q and first K/V blocks under that tile's last P V,
normalisation and O store.

Constraints
-----------
sm_90 (sm_90a features), fp16/bf16, head_dim 64 or 128, softmax_scale > 0 (the running max is taken
on unscaled scores), 16-byte aligned row strides (TMA). Any Sq, Sk >= 1; causal is top-left aligned
like SDPA. head_dim 256 is refused: its 64 x 256 fp32 O alone takes 128 of the 240 registers per
consumer thread, and Q plus one K/V stage (64 + 128 KB at tile_n = 128) leaves no room for a
second stage; it would need a different tiling that this rung does not attempt.

What the measurements taught
----------------------------
Current figures are in the generated table of ``docs/ladder.md``; every A/B run behind the choices
below is in ``docs/perf-log.md`` ("Figures moved out of rung docstrings").

* The kernel is bound by the tensor cores and exp2, not by instruction count: overlapping the next
  S = Q Kᵀ with this block's P V inside each warpgroup is the big win; ping-pong between warpgroups
  adds little once that overlap exists (and costs FP8 at D=128 more than it gives, so it is off there).
* Pairwise-tree row max and row sum, and causal query tiles launched longest first, pay off;
  larger key blocks (FlashAttention-3's 176 at D=128) and a third K/V stage do not.
* D=64 is latency-bound with two consumer warpgroups; a third (setmaxnreg 160, 128-key blocks) is
  what fits and helps. A fourth cannot get enough registers; exp2 emulated on the FMA pipes and an
  S accumulator one block ahead measured slower.
* A dynamic ``if`` that writes one element of a register tensor becomes selects over the whole
  fragment: the mask is written as one select per score. The SASS (nvdisasm on the CPU-compiled
  cubin) showed it, not the profile.
* Lazy rescaling measured mostly within noise (the multiplies it saves are FMA-pipe work; the perf
  log has the causal rows). Persistent CTAs with a snake tile order are used everywhere except
  causal D=64, where one CTA per tile measured faster.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from common.problem import Problem
from common.registry import Implementation, KernelBinary, Runner, warmed_up
from common.static import SM90_CAPABILITY
from common.validation import OPERAND_ALIGNMENT_BYTES, kernel_operand, validate_attention_inputs

try:  # The DSL is optional for the rest of the suite; the registry reports the import error.
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    import cutlass.pipeline as pipeline
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass import Float32, Int32
    from cutlass.cute.nvgpu import cpasync, warp, warpgroup
    from cutlass.cute.runtime import make_fake_tensor
    from cutlass.memory import SmemAllocator
    from cutlass.tensor_utils import LayoutEnum
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(f"cute/hopper needs nvidia-cutlass-dsl: {error}") from error

from cute_impl._device import LOG2_E, RESCALE_THRESHOLD_LOG2
from cute_impl._hopper_device import (
    AttentionMask,
    BlockScales,
    KeyBlockRange,
    OnlineSoftmax,
    TileOrder,
    WarpgroupTurns,
    add_block_product,
    rows_cols_view,
    scores_to_operand_a,
)
from cute_impl._host import CUTE_DTYPES, current_stream, to_cute_tensor

HEAD_DIMS = (64, 128)
DTYPES = (torch.float16, torch.bfloat16)
FP8_CUTLASS = cutlass.Float8E4M3FN
# Query rows per consumer warpgroup: the M of one WGMMA instruction.
ROWS_PER_WARPGROUP = 64
THREADS_PER_WARPGROUP = 128
PRODUCER_REGISTERS = 24
# Registers per consumer thread after setmaxnreg, by consumer warpgroups per CTA: the producer
# warpgroup keeps 24, and the total must fit what the CTA was given at launch (``registers_fit``).
CONSUMER_REGISTERS = {2: 240, 3: 160}
REGISTER_FILE = 65536
# Per-thread register counts come in multiples of 8.
REGISTER_GRANULE = 8
SMEM_ALIGN_BYTES = 1024
# Named barrier 0 is __syncthreads; the epilogue of consumer warpgroup w uses 1 + w, its WGMMA turn 4 + w.
EPILOGUE_BARRIER_BASE = 1
SCHEDULER_BARRIER_BASE = EPILOGUE_BARRIER_BASE + max(CONSUMER_REGISTERS)
# The grid is one-dimensional over (query block, head, batch) tiles, indexed by a signed 32-bit int.
MAX_TILES = 2**31 - 1
# The SM count passed when compiling on a CPU (H200); launches pass the real device's.
STATIC_SM_COUNT = 132
# Keys per block: S (tile_n / 2 registers), P and O must fit in the consumers' registers.
DEFAULT_TILE_N = 128
# FP8 P is scaled into [0, 2^8]: small probabilities stay above e4m3's subnormal range (2^-6).
FP8_P_EXPONENT_OFFSET = 8.0


@dataclass(frozen=True)
class HopperConfig:
    """Everything that changes the generated code (the compile-cache key)."""

    dtype: torch.dtype
    head_dim: int
    causal: bool
    tile_n: int = DEFAULT_TILE_N
    kv_stages: int = 2
    # 64-row consumer warpgroups per CTA: 3 only fits when S, P and O need <= 160 registers (D=64).
    consumer_warpgroups: int = 2
    # Consumer warpgroups take turns issuing WGMMA, so that one's softmax overlaps the other's GEMMs.
    pingpong: bool = True
    # FP8 (``fp8.py``): e4m3 operands, V transposed to (B, H, D, Sk) so that both WGMMA operands are
    # K-major, output in bf16.
    fp8: bool = False
    # One CTA per SM looping over query tiles (the SM count is a launch argument), instead of one CTA
    # per tile: the next tile's loads overlap this tile's last GEMM and epilogue.
    persistent: bool = False
    # FP8 block quantisation: Q's scale per consumer warpgroup's 64 rows, K's and V's per key block,
    # read in the kernel (``fp8.py``); per-tensor scales are read once per tile.
    block_scales: bool = False

    @property
    def out_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.fp8 else self.dtype


def registers_fit(consumer_warpgroups: int, consumer_registers: int) -> bool:
    """Whether setmaxnreg can raise every consumer to ``consumer_registers``.

    ``setmaxnreg`` only moves registers inside the CTA's launch allocation: threads x the largest
    per-thread count that fits the register file (rounded down to a multiple of 8). An increase that
    the registers given back by the producer cannot cover never completes: the kernel hangs. Four
    consumer warpgroups (640 threads) launch at 96 registers each, so they reach 112, not 120.
    """
    threads = (1 + consumer_warpgroups) * THREADS_PER_WARPGROUP
    launch_registers = REGISTER_FILE // threads // REGISTER_GRANULE * REGISTER_GRANULE
    needed = THREADS_PER_WARPGROUP * (PRODUCER_REGISTERS + consumer_warpgroups * consumer_registers)
    return needed <= threads * launch_registers


class HopperAttention:
    """Warp-specialised FlashAttention forward for sm_90a: compile-time configuration only."""

    def __init__(
        self,
        dtype: type,
        out_dtype: type,
        head_dim: int,
        causal: bool,
        tile_n: int,
        kv_stages: int,
        v_transposed: bool,
        pingpong: bool,
        consumer_warpgroups: int = 2,
        persistent: bool = False,
        block_scales: bool = False,
    ):
        if consumer_warpgroups not in CONSUMER_REGISTERS:
            raise ValueError(f"consumer_warpgroups must be in {sorted(CONSUMER_REGISTERS)}, got {consumer_warpgroups}")
        self.dtype = dtype
        self.out_dtype = out_dtype
        self.head_dim = head_dim
        self.causal = causal
        self.consumer_warpgroups = consumer_warpgroups
        self.tile_m = ROWS_PER_WARPGROUP * consumer_warpgroups
        self.threads_per_cta = (1 + consumer_warpgroups) * THREADS_PER_WARPGROUP
        self.tile_n = tile_n
        self.kv_stages = kv_stages
        self.v_transposed = v_transposed
        self.persistent = persistent
        # O may reuse Q's shared memory only when no next tile's Q is loaded while O is stored.
        self.o_aliases_q = dtype == out_dtype and not persistent
        # FP8 only: accumulate each block's P V from zero and add it to O in fp32 registers, because the
        # FP8 tensor-core accumulator keeps fewer mantissa bits than fp32 (see fp8.py's measurements).
        self.fp8 = dtype.width == 8
        self.separate_pv = self.fp8
        self.block_scales = block_scales
        self.pingpong = pingpong
        self.tile_order = TileOrder(self.tile_m, causal)
        self.key_blocks = KeyBlockRange(self.tile_m, tile_n, causal)

    # ------------------------------------------------------------------------------------------------
    # Host side: layouts, TMA descriptors, launch
    # ------------------------------------------------------------------------------------------------
    @staticmethod
    def _sequence_major(t: cute.Tensor) -> cute.Tensor:
        """(B, H, S, D) -> (S, D, (H, B)): TMA boxes tile (S, D); head and batch index the rest."""
        layout = cute.make_layout(
            (t.shape[2], t.shape[3], (t.shape[1], t.shape[0])),
            stride=(t.stride[2], t.stride[3], (t.stride[1], t.stride[0])),
        )
        return cute.make_tensor(t.iterator, layout)

    @staticmethod
    def _value_operand(t: cute.Tensor, transposed: bool) -> cute.Tensor:
        """V as the B operand of O = P V, shaped (D, Sk, (H, B)) whatever its memory order."""
        if transposed:  # (B, H, D, Sk): Sk contiguous, K-major
            shape, stride = (t.shape[2], t.shape[3]), (t.stride[2], t.stride[3])
        else:  # (B, H, Sk, D): D contiguous, MN-major
            shape, stride = (t.shape[3], t.shape[2]), (t.stride[3], t.stride[2])
        layout = cute.make_layout((*shape, (t.shape[1], t.shape[0])), stride=(*stride, (t.stride[1], t.stride[0])))
        return cute.make_tensor(t.iterator, layout)

    @staticmethod
    def _head_major(t: cute.Tensor | None) -> cute.Tensor | None:
        """(B, H, X) -> (X, (H, B)), the (head, batch) mode indexed like the operands' (LSE, FP8 scales)."""
        if t is None:
            return None
        layout = cute.make_layout(
            (t.shape[2], (t.shape[1], t.shape[0])), stride=(t.stride[2], (t.stride[1], t.stride[0]))
        )
        return cute.make_tensor(t.iterator, layout)

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        mQScale: cute.Tensor | None,
        mKScale: cute.Tensor | None,
        mVScale: cute.Tensor | None,
        softmax_scale_log2: Float32,
        output_scale: Float32,
        sm_count: Int32,
        stream: cuda.CUstream,
    ):
        """FP8 passes its e4m3 scales as (B, H, blocks) fp32 tensors (one block each when per tensor);
        16-bit passes None for them."""
        q_seq, k_seq, o_seq = (self._sequence_major(t) for t in (mQ, mK, mO))
        v_op = self._value_operand(mV, self.v_transposed)
        LSE, q_scales, k_scales, v_scales = (self._head_major(t) for t in (mLSE, mQScale, mKScale, mVScale))
        D, rows = self.head_dim, ROWS_PER_WARPGROUP
        v_layout = LayoutEnum.ROW_MAJOR if self.v_transposed else LayoutEnum.COL_MAJOR
        k_major = cute.nvgpu.OperandMajorMode.K

        qk_mma = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, k_major, k_major, Float32, (1, 1, 1), (rows, self.tile_n)
        )
        pv_mma = sm90_utils.make_trivial_tiled_mma(
            self.dtype,
            self.dtype,
            k_major,
            v_layout.sm90_mma_major_mode(),
            Float32,
            (1, 1, 1),
            (rows, D),
            warpgroup.OperandSource.RMEM,
        )
        # Staged shared-memory layouts: Q and O stage = consumer warpgroup, K/V stage = ring slot.
        sQ_layout = sm90_utils.make_smem_layout_a(
            LayoutEnum.ROW_MAJOR, (rows, self.tile_n, D), self.dtype, self.consumer_warpgroups
        )
        sK_layout = sm90_utils.make_smem_layout_b(
            LayoutEnum.ROW_MAJOR, (rows, self.tile_n, D), self.dtype, self.kv_stages
        )
        sV_layout = sm90_utils.make_smem_layout_b(v_layout, (rows, D, self.tile_n), self.dtype, self.kv_stages)
        sO_layout = sm90_utils.make_smem_layout_a(
            LayoutEnum.ROW_MAJOR, (rows, D, D), self.out_dtype, self.consumer_warpgroups
        )

        def one_stage(layout: Any) -> Any:
            return cute.slice_(layout, (None, None, 0))

        load = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tma_Q = cpasync.make_tiled_tma_atom(load, q_seq, one_stage(sQ_layout), (rows, D))
        tma_k, tma_K = cpasync.make_tiled_tma_atom(load, k_seq, one_stage(sK_layout), (self.tile_n, D))
        tma_v, tma_V = cpasync.make_tiled_tma_atom(load, v_op, one_stage(sV_layout), (D, self.tile_n))
        tma_o, tma_O = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), o_seq, one_stage(sO_layout), (rows, D)
        )
        self.q_bytes = cute.size_in_bytes(self.dtype, one_stage(sQ_layout))
        self.k_bytes = cute.size_in_bytes(self.dtype, one_stage(sK_layout))
        self.v_bytes = cute.size_in_bytes(self.dtype, one_stage(sV_layout))

        @cute.struct
        class SharedStorage:
            q_full: cute.struct.MemRange[cutlass.Int64, self.consumer_warpgroups]
            q_empty: cute.struct.MemRange[cutlass.Int64, self.consumer_warpgroups]
            k_barriers: cute.struct.MemRange[cutlass.Int64, 2 * self.kv_stages]
            v_barriers: cute.struct.MemRange[cutlass.Int64, 2 * self.kv_stages]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], SMEM_ALIGN_BYTES]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sK_layout)], SMEM_ALIGN_BYTES]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sV_layout)], SMEM_ALIGN_BYTES]
            # 16-bit: O reuses its warpgroup's Q box (dead after the last Q Kᵀ), which is what makes
            # room for larger K/V tiles or more stages. FP8: O (bf16) is larger than Q and has its own.
            sO: cute.struct.Align[
                cute.struct.MemRange[self.out_dtype, 0 if self.o_aliases_q else cute.cosize(sO_layout)],
                SMEM_ALIGN_BYTES,
            ]

        self.shared_storage = SharedStorage
        tiles = self.tile_order.query_blocks(q_seq.shape[0]) * q_seq.shape[2][0] * q_seq.shape[2][1]
        ctas = cutlass.min(tiles, sm_count) if cutlass.const_expr(self.persistent) else tiles
        self.kernel(
            qk_mma, pv_mma, tma_q, tma_Q, tma_k, tma_K, tma_v, tma_V, tma_o, tma_O, LSE, q_scales, k_scales,
            v_scales, softmax_scale_log2, output_scale, sQ_layout, sK_layout, sV_layout, sO_layout,
        ).launch(
            grid=[ctas, 1, 1],
            block=[self.threads_per_cta, 1, 1],
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=1,
        )  # fmt: skip

    # ------------------------------------------------------------------------------------------------
    # Device side
    # ------------------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self,
        qk_mma: cute.TiledMma,
        pv_mma: cute.TiledMma,
        tma_q: cute.CopyAtom,
        mQ: cute.Tensor,
        tma_k: cute.CopyAtom,
        mK: cute.Tensor,
        tma_v: cute.CopyAtom,
        mV: cute.Tensor,
        tma_o: cute.CopyAtom,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        mQScale: cute.Tensor | None,
        mKScale: cute.Tensor | None,
        mVScale: cute.Tensor | None,
        softmax_scale_log2: Float32,
        output_scale: Float32,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sO_layout: cute.ComposedLayout,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        warp_group = cute.arch.make_warp_uniform(tidx // THREADS_PER_WARPGROUP)
        seqlen_q, seqlen_k = mQ.shape[0], mK.shape[0]
        rows, D = ROWS_PER_WARPGROUP, self.head_dim
        heads = mQ.shape[2][0]
        query_blocks = self.tile_order.query_blocks(seqlen_q)
        tile_count = query_blocks * heads * mQ.shape[2][1]
        cta, _, _ = cute.arch.block_idx()
        ctas, _, _ = cute.arch.grid_dim()
        local_tiles = self.tile_order.tiles_of_cta(cta, ctas, tile_count)

        # ==== Shared memory and barriers ==================================================================
        storage = SmemAllocator().allocate(self.shared_storage)
        q_full = storage.q_full.data_ptr()
        q_empty = storage.q_empty.data_ptr()
        if warp_idx == 0:
            with cute.arch.elect_one():
                for w in cutlass.range_constexpr(self.consumer_warpgroups):
                    cute.arch.mbarrier_init(q_full + w, 1)
                    # One elected lane per warp of the warpgroup that read the Q box.
                    cute.arch.mbarrier_init(q_empty + w, 4)
        producer_group = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        # One elected lane per consumer warp releases a stage.
        consumer_group = pipeline.CooperativeGroup(pipeline.Agent.Thread, self.consumer_warpgroups * 4)
        k_producer, k_consumer = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.k_barriers.data_ptr(),
            num_stages=self.kv_stages,
            producer_group=producer_group,
            consumer_group=consumer_group,
            tx_count=self.k_bytes,
            defer_sync=True,
        ).make_participants()
        v_producer, v_consumer = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.v_barriers.data_ptr(),
            num_stages=self.kv_stages,
            producer_group=producer_group,
            consumer_group=consumer_group,
            tx_count=self.v_bytes,
            defer_sync=True,
        ).make_participants()
        cute.arch.mbarrier_init_fence()
        cute.arch.barrier()

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)  # (64, D, warpgroup)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)  # (tile_n, D, stage)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)  # (D, tile_n, stage)
        if cutlass.const_expr(self.o_aliases_q):
            sO = sQ  # (64, D, warpgroup): same dtype and layout as Q
        else:
            sO = storage.sO.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)  # (64, D, warpgroup)

        # ==== Producer warp: all TMA loads =================================================================
        if warp_group == 0:
            cute.arch.setmaxregister_decrease(PRODUCER_REGISTERS)
            if warp_idx == 0:
                for local_tile in cutlass.range(local_tiles, unroll=1):
                    tile = self.tile_order.tile_of_cta(local_tile, cta, ctas)
                    m_block, bh = self.tile_order.coordinates(tile, query_blocks, heads)
                    gQ = cute.local_tile(mQ[None, None, bh], (rows, D), (None, 0))  # (64, D, Sq/64)
                    gK = cute.local_tile(mK[None, None, bh], (self.tile_n, D), (None, 0))  # (tile_n, D, n)
                    gV = cute.local_tile(mV[None, None, bh], (D, self.tile_n), (0, None))  # (D, tile_n, n)
                    tQsQ, tQgQ = self._tma_partition(tma_q, sQ, gQ)  # (TMA, warpgroup), (TMA, Sq/64)
                    tKsK, tKgK = self._tma_partition(tma_k, sK, gK)  # (TMA, stage), (TMA, n)
                    tVsV, tVgV = self._tma_partition(tma_v, sV, gV)  # (TMA, stage), (TMA, n)
                    for w in cutlass.range_constexpr(self.consumer_warpgroups):
                        # A persistent CTA's next Q waits until the warpgroup's last S = Q Kᵀ has retired.
                        if local_tile > 0:
                            cute.arch.mbarrier_wait(q_empty + w, (local_tile - 1) % 2)
                        with cute.arch.elect_one():
                            cute.arch.mbarrier_arrive_and_expect_tx(q_full + w, self.q_bytes)
                        cute.copy(
                            tma_q,
                            tQgQ[None, m_block * self.consumer_warpgroups + w],
                            tQsQ[None, w],
                            tma_bar_ptr=q_full + w,
                        )
                    n_block_count = self.key_blocks.count(m_block, seqlen_k)
                    for i in cutlass.range(n_block_count, unroll=1):
                        n_block = n_block_count - 1 - i
                        k_producer = load_block(tma_k, tKgK[None, n_block], tKsK, k_producer)
                        v_producer = load_block(tma_v, tVgV[None, n_block], tVsV, v_producer)

        # ==== Consumer warpgroups: S = Q Kᵀ -> mask -> online softmax -> O += P V =========================
        if warp_group > 0:
            cute.arch.setmaxregister_increase(CONSUMER_REGISTERS[self.consumer_warpgroups])
            w = warp_group - 1
            wg_tidx = tidx % THREADS_PER_WARPGROUP
            qk_thr = qk_mma.get_slice(wg_tidx)
            pv_thr = pv_mma.get_slice(wg_tidx)
            tSrQ = qk_thr.make_fragment_A(qk_thr.partition_A(sQ[None, None, w]))  # (MMA, 1, D/16)
            tSrK = qk_thr.make_fragment_B(qk_thr.partition_B(sK))  # (MMA, 1, D/16, stage)
            tOrV = pv_thr.make_fragment_B(pv_thr.partition_B(sV))  # (MMA, 1, tile_n/16, stage)
            acc_S_shape = qk_thr.partition_shape_C((rows, self.tile_n))  # ((2, 2, tile_n/8), 1, 1)
            acc_O = pv_thr.make_fragment_C(pv_thr.partition_shape_C((rows, D)))  # ((2, 2, D/8), 1, 1)
            tOrP = cute.make_rmem_tensor(pv_thr.partition_shape_A((rows, self.tile_n)), self.dtype)
            tScS = qk_thr.partition_C(cute.make_identity_tensor((rows, self.tile_n)))  # (row, col) per value
            tOcO = pv_thr.partition_C(cute.make_identity_tensor((rows, D)))  # (row, col) per value
            # Built before the main loop: warpgroup_gemm flips the MMA's accumulate field inside it.
            store_atom = cute.make_copy_atom(warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.out_dtype)
            thr_store = cute.make_tiled_copy_C(store_atom, pv_mma).get_slice(wg_tidx)
            mask = AttentionMask(self.tile_n, self.causal)
            turns = WarpgroupTurns(
                self.pingpong, w, self.consumer_warpgroups, SCHEDULER_BARRIER_BASE, THREADS_PER_WARPGROUP
            )
            # Every warpgroup of the CTA visits the same key blocks of every tile, so the turns balance
            # over the whole tile loop.
            turns.start()
            for local_tile in cutlass.range(local_tiles, unroll=1):
                tile = self.tile_order.tile_of_cta(local_tile, cta, ctas)
                m_block, bh = self.tile_order.coordinates(tile, query_blocks, heads)
                n_block_count, masked_count = self.key_blocks.counts(m_block, seqlen_k)
                row_start = m_block * self.tile_m + w * rows
                tile_scale_log2, tile_output_scale, scales = self.descales(
                    mQScale,
                    mKScale,
                    mVScale,
                    softmax_scale_log2,
                    output_scale,
                    m_block * self.consumer_warpgroups + w,
                    bh,
                )
                acc_O.fill(0.0)
                # FP8: P in [0, 2^8] rather than [0, 1] keeps small probabilities out of e4m3's subnormals,
                # so the reference max must move whenever it grows (P > 448 would overflow e4m3); 16-bit P
                # has range to spare and lets it lag by 2^8 (RESCALE_THRESHOLD_LOG2).
                softmax = OnlineSoftmax(
                    tile_scale_log2,
                    rows=2,
                    p_exponent_offset=FP8_P_EXPONENT_OFFSET if self.separate_pv else 0.0,
                    rescale_threshold=0.0 if self.separate_pv else RESCALE_THRESHOLD_LOG2,
                )

                # 1. This warpgroup's Q box.
                cute.arch.mbarrier_wait(q_full + w, local_tile % 2)
                mma = (qk_mma, pv_mma, tSrQ, tSrK, tOrV, tOrP, acc_S_shape, acc_O, softmax, turns)
                where = (mask, tScS, row_start, seqlen_k, scales)
                # 2. Key blocks from the last. The first needs the sequence mask and starts the softmax;
                # then the causal diagonal blocks (masked), then the rest (no mask). Each later step
                # issues its S = Q Kᵀ together with the previous block's O += P V.
                k_consumer = self.first_block(*mma, *where, k_consumer, n_block_count - 1)
                for i in cutlass.range(1, masked_count, unroll=1):
                    k_consumer, v_consumer = self.next_block(
                        *mma, *where, k_consumer, v_consumer, n_block_count - 1 - i, masked=True
                    )
                for i in cutlass.range(masked_count, n_block_count, unroll=1):
                    k_consumer, v_consumer = self.next_block(
                        *mma, *where, k_consumer, v_consumer, n_block_count - 1 - i, masked=False
                    )
                # Every S = Q Kᵀ of this tile has retired: the producer may load the next tile's Q.
                with cute.arch.elect_one():
                    cute.arch.mbarrier_arrive(q_empty + w)
                self.last_product(*mma, v_consumer, scales)

                # 3. Normalise, log-sum-exp.
                lse = cute.make_rmem_tensor(2, Float32)
                softmax.finalize(acc_O, tile_output_scale, lse)
                self.store_lse(mLSE[None, bh], lse, tOcO, row_start, seqlen_q)

                # 4. O -> SMEM (stmatrix) -> TMA store.
                self.store_output(tma_o, thr_store, acc_O, sO, mO[None, None, bh], m_block, w, wg_tidx)
            turns.finish()
            if wg_tidx < cute.arch.WARP_SIZE:
                # The last TMA store must have read shared memory before the CTA exits.
                cute.arch.cp_async_bulk_wait_group(0, read=True)

    def descales(
        self,
        mQScale: cute.Tensor | None,
        mKScale: cute.Tensor | None,
        mVScale: cute.Tensor | None,
        softmax_scale_log2: Float32,
        output_scale: Float32,
        q_block: Int32,
        bh: Any,
    ) -> tuple[Float32, Float32, BlockScales | None]:
        """FP8: fold this warpgroup's e4m3 descales into the tile's softmax scale and output scale.
        Block scales: Q's 64-row block scale here, K's and V's per key block in the main loop
        (``BlockScales``); per tensor: all three here. 16-bit: the launch scalars unchanged."""
        if not self.fp8:
            return softmax_scale_log2, output_scale, None
        if self.block_scales:
            scales = BlockScales(mKScale[None, bh], mVScale[None, bh])
            return softmax_scale_log2 * mQScale[q_block, bh], output_scale, scales
        return softmax_scale_log2 * mQScale[0, bh] * mKScale[0, bh], output_scale * mVScale[0, bh], None

    @cute.jit
    def store_output(
        self,
        tma_o: cute.CopyAtom,
        thr_store: Any,
        acc_O: cute.Tensor,
        sO: cute.Tensor,
        gO_head: cute.Tensor,
        m_block: Int32,
        w: Int32,
        wg_tidx: Int32,
    ):
        """Step 4: O in the output dtype -> stmatrix into the warpgroup's O box -> TMA store, issued by
        the warpgroup's first warp. The store is left in flight; a persistent CTA waits for it to have
        read the box only before it writes the next tile's O there."""
        epilogue_barrier = EPILOGUE_BARRIER_BASE + w
        if cutlass.const_expr(self.persistent):
            if wg_tidx < cute.arch.WARP_SIZE:
                cute.arch.cp_async_bulk_wait_group(0, read=True)
            cute.arch.barrier(barrier_id=epilogue_barrier, number_of_threads=THREADS_PER_WARPGROUP)
        rO = cute.make_rmem_tensor_like(acc_O, self.out_dtype)
        rO.store(acc_O.load().to(self.out_dtype))
        cute.copy(thr_store, thr_store.retile(rO), thr_store.partition_D(sO[None, None, w]))
        # The TMA unit reads SMEM through the async proxy: make the generic-proxy writes visible.
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(barrier_id=epilogue_barrier, number_of_threads=THREADS_PER_WARPGROUP)
        if wg_tidx < cute.arch.WARP_SIZE:
            gO = cute.local_tile(gO_head, (ROWS_PER_WARPGROUP, self.head_dim), (None, 0))  # (64, D, Sq/64)
            tOsO, tOgO = self._tma_partition(tma_o, sO, gO)
            cute.copy(tma_o, tOsO[None, w], tOgO[None, m_block * self.consumer_warpgroups + w])
            cute.arch.cp_async_bulk_commit_group()

    @staticmethod
    def _tma_partition(atom: cute.CopyAtom, smem: cute.Tensor, gmem: cute.Tensor) -> tuple[cute.Tensor, cute.Tensor]:
        """(TMA, stage) view of a staged SMEM tensor and (TMA, tile) view of a tiled global one."""
        return cpasync.tma_partition(
            atom, 0, cute.make_layout(1), cute.group_modes(smem, 0, 2), cute.group_modes(gmem, 0, 2)
        )

    # The three mainloop steps share their operands: ``mma`` = (qk_mma, pv_mma, tSrQ, tSrK, tOrV, tOrP,
    # acc_S_shape, acc_O, softmax, turns) and ``where`` = (mask, tScS, row_start, seqlen_k). Each returns
    # the pipeline consumers it advanced, so that the runtime loops carry their state.
    @cute.jit
    def first_block(
        self,
        qk_mma: cute.TiledMma,
        pv_mma: cute.TiledMma,
        tSrQ: cute.Tensor,
        tSrK: cute.Tensor,
        tOrV: cute.Tensor,
        tOrP: cute.Tensor,
        acc_S_shape: cute.Shape,
        acc_O: cute.Tensor,
        softmax: OnlineSoftmax,
        turns: WarpgroupTurns,
        mask: AttentionMask,
        tScS: cute.Tensor,
        row_start: Int32,
        seqlen_k: Int32,
        scales: BlockScales | None,
        k_consumer: pipeline.PipelineConsumer,
        n_block: Int32,
    ) -> pipeline.PipelineConsumer:
        """2a-d for the first block: S = Q Kᵀ, mask, first softmax step, P. No O yet."""
        acc_S = cute.make_rmem_tensor(acc_S_shape, Float32)
        k_slot = k_consumer.wait_and_advance()
        turns.wait()
        warpgroup_gemm(qk_mma, acc_S, tSrQ, tSrK[None, None, None, k_slot.index], accumulate=False)
        turns.pass_on()
        # Block scales are loaded while the GEMM runs, so that their latency hides behind it.
        key_scale = None
        if cutlass.const_expr(scales is not None):
            key_scale = scales.key(n_block)
        warpgroup.wait_group(0)
        k_slot.release()
        mask.apply(acc_S, tScS, row_start, n_block, seqlen_k)
        softmax.step(acc_S, key_scale)
        scores_to_operand_a(acc_S, tOrP)
        return k_consumer

    @cute.jit
    def next_block(
        self,
        qk_mma: cute.TiledMma,
        pv_mma: cute.TiledMma,
        tSrQ: cute.Tensor,
        tSrK: cute.Tensor,
        tOrV: cute.Tensor,
        tOrP: cute.Tensor,
        acc_S_shape: cute.Shape,
        acc_O: cute.Tensor,
        softmax: OnlineSoftmax,
        turns: WarpgroupTurns,
        mask: AttentionMask,
        tScS: cute.Tensor,
        row_start: Int32,
        seqlen_k: Int32,
        scales: BlockScales | None,
        k_consumer: pipeline.PipelineConsumer,
        v_consumer: pipeline.PipelineConsumer,
        n_block: Int32,
        masked: cutlass.Constexpr[bool],
    ) -> tuple[pipeline.PipelineConsumer, pipeline.PipelineConsumer]:
        """2a-e overlapped: issue S = Q K[n]ᵀ and O += P V[previous]; softmax S while O's WGMMA runs.
        With block scales, K[n]'s scale joins the softmax and V[n + 1]'s multiplies its P V."""
        acc_S = cute.make_rmem_tensor(acc_S_shape, Float32)
        k_slot = k_consumer.wait_and_advance()
        v_slot = v_consumer.wait_and_advance()
        acc_PV = cute.make_rmem_tensor(acc_O.layout, Float32) if cutlass.const_expr(self.separate_pv) else acc_O
        turns.wait()
        warpgroup_gemm(qk_mma, acc_S, tSrQ, tSrK[None, None, None, k_slot.index], accumulate=False)
        warpgroup_gemm(pv_mma, acc_PV, tOrP, tOrV[None, None, None, v_slot.index], accumulate=not self.separate_pv)
        turns.pass_on()
        # Block scales are loaded once the GEMMs are issued: ptxas copies each into a uniform register
        # right after its load, and loaded before them, that wait held up their issue every block
        # (docs/perf-log.md, issue #17). V's scale is needed only after the softmax.
        key_scale, pv_scale = None, None
        if cutlass.const_expr(scales is not None):
            key_scale = scales.key(n_block)
        # S is ready when at most the (later) O group is still in flight.
        warpgroup.wait_group(1)
        k_slot.release()
        if cutlass.const_expr(scales is not None):
            pv_scale = scales.value(n_block + 1)
        if cutlass.const_expr(masked):
            mask.apply(acc_S, tScS, row_start, n_block, seqlen_k)
        softmax.step(acc_S, key_scale)
        # P's registers and O are rewritten below: the O += P V that reads them must retire first.
        warpgroup.wait_group(0)
        v_slot.release()
        if cutlass.const_expr(self.separate_pv):
            softmax.rescale_output(acc_O, acc_PV, pv_scale)
        else:
            softmax.rescale_output(acc_O)
        scores_to_operand_a(acc_S, tOrP)
        return k_consumer, v_consumer

    @cute.jit
    def last_product(
        self,
        qk_mma: cute.TiledMma,
        pv_mma: cute.TiledMma,
        tSrQ: cute.Tensor,
        tSrK: cute.Tensor,
        tOrV: cute.Tensor,
        tOrP: cute.Tensor,
        acc_S_shape: cute.Shape,
        acc_O: cute.Tensor,
        softmax: OnlineSoftmax,
        turns: WarpgroupTurns,
        v_consumer: pipeline.PipelineConsumer,
        scales: BlockScales | None,
    ) -> None:
        """2e for the last block (key block 0): O += P V."""
        v_slot = v_consumer.wait_and_advance()
        acc_PV = cute.make_rmem_tensor(acc_O.layout, Float32) if cutlass.const_expr(self.separate_pv) else acc_O
        turns.wait()
        warpgroup_gemm(pv_mma, acc_PV, tOrP, tOrV[None, None, None, v_slot.index], accumulate=not self.separate_pv)
        turns.pass_on()
        pv_scale = None
        if cutlass.const_expr(scales is not None):
            pv_scale = scales.value(0)
        warpgroup.wait_group(0)
        v_slot.release()
        if cutlass.const_expr(self.separate_pv):
            add_block_product(acc_O, acc_PV, pv_scale)

    @cute.jit
    def store_lse(self, gLSE: cute.Tensor, lse: cute.Tensor, tOcO: cute.Tensor, row_start: Int32, seqlen_q: Int32):
        """One lane of each row's four writes its two rows' log-sum-exp (rows past Sq are skipped)."""
        cO = rows_cols_view(tOcO)
        if cO[0, 0][1] == 0:
            for r in cutlass.range_constexpr(2):
                row = row_start + cO[r, 0][0]
                if row < seqlen_q:
                    gLSE[row] = lse[r]


@cute.jit
def load_block(
    atom: cute.CopyAtom, source: cute.Tensor, ring: cute.Tensor, producer: pipeline.PipelineProducer
) -> pipeline.PipelineProducer:
    """Wait for a free ring slot, then TMA one block into it; returns the producer so loops carry it."""
    slot = producer.acquire_and_advance()
    cute.copy(atom, source, ring[None, slot.index], tma_bar_ptr=slot.barrier)
    return producer


@cute.jit
def warpgroup_gemm(
    tiled_mma: cute.TiledMma, acc: cute.Tensor, tA: cute.Tensor, tB: cute.Tensor, accumulate: cutlass.Constexpr[bool]
):
    """Issue one warpgroup GEMM over all k-blocks (async); the caller waits on the group.

    The accumulate flag lives on a fresh MMA atom: flipping it on the shared tiled MMA inside a
    runtime loop would leak a loop-local value out of the loop.
    """
    mma_atom = cute.make_mma_atom(tiled_mma.op)
    warpgroup.fence()
    for k in cutlass.range_constexpr(cute.size(tA, mode=[2])):
        mma_atom.set(warpgroup.Field.ACCUMULATE, accumulate or k != 0)
        cute.gemm(mma_atom, acc, tA[None, None, k], tB[None, None, k], acc)
    warpgroup.commit_group()


# ----------------------------------------------------------------------------------------------------
# Host: validate, compile once, launch
# ----------------------------------------------------------------------------------------------------
_COMPILED: dict[HopperConfig, Callable[..., None]] = {}


def make_kernel(config: HopperConfig) -> HopperAttention:
    return HopperAttention(
        dtype=FP8_CUTLASS if config.fp8 else CUTE_DTYPES[config.dtype],
        out_dtype=CUTE_DTYPES[config.out_dtype],
        head_dim=config.head_dim,
        causal=config.causal,
        tile_n=config.tile_n,
        kv_stages=config.kv_stages,
        v_transposed=config.fp8,
        pingpong=config.pingpong,
        consumer_warpgroups=config.consumer_warpgroups,
        persistent=config.persistent,
        block_scales=config.block_scales,
    )


def launcher(
    config: HopperConfig,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale_log2: float,
    output_scale: float,
    sm_count: int | None = None,
    scales: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> Runner:
    """Compile (cached on ``config``), allocate O and LSE once, and return the launch-only ``run``.

    ``sm_count`` caps a persistent grid (default: the device's SMs; tests pass fewer so that every
    CTA walks many tiles). ``scales`` (FP8 only): Q's, K's and V's e4m3 scales, (B, H, blocks) fp32."""
    batch, heads, seqlen_q, head_dim = q.shape
    o = torch.empty((batch, heads, seqlen_q, head_dim), dtype=config.out_dtype, device=q.device)
    lse = torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q.device)
    element = FP8_CUTLASS if config.fp8 else None
    if config.fp8 != (scales is not None):
        raise ValueError(
            f"FP8 operands need their scales and 16-bit ones none: fp8={config.fp8}, scales given={scales is not None}"
        )
    scale_args = (None,) * 3 if scales is None else tuple(to_cute_tensor(t) for t in scales)
    args = (*(to_cute_tensor(t, element) for t in (q, k, v)), to_cute_tensor(o), to_cute_tensor(lse), *scale_args)
    # The SM count is a launch argument (read here, at run time), so compiling never queries a device.
    sm_count = sm_count or torch.cuda.get_device_properties(q.device).multi_processor_count
    scalars = (Float32(softmax_scale_log2), Float32(output_scale), Int32(sm_count))
    if config not in _COMPILED:
        _COMPILED[config] = cute.compile(make_kernel(config), *args, *scalars, current_stream())
    compiled = _COMPILED[config]

    def run() -> torch.Tensor:
        compiled(*args, *scalars, current_stream())
        return o

    run.lse = lse  # for a future backward pass and for tests
    return run


def validated_problem(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem) -> Problem:
    """The Problem that q, k, v (B, H, S, D) describe, refused with a ValueError where ``supports``
    would refuse it (head dim, softmax_scale <= 0, grid size); no GPU work. Shared with ``fp8.py``."""
    checked = validate_attention_inputs(
        q, k, v, causal=problem.causal, softmax_scale=problem.softmax_scale, dtypes=DTYPES, head_dims=HEAD_DIMS
    )
    ok, reason = common_problem_supported(checked)
    if not ok:
        raise ValueError(reason)
    return checked


def prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem) -> Runner:
    """Validate q, k, v (B, H, S, D), bind them (compiling on first use), and launch once to warm up."""
    return warmed_up(bind(q, k, v, validated_problem(q, k, v, problem)), q.device)


def bind(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem) -> Runner:
    """The launch-only ``run`` of validated q, k, v at the default configuration (compiled once)."""
    q, k, v = (kernel_operand(t) for t in (q, k, v))
    return launcher(default_config(problem), q, k, v, problem.scale * LOG2_E, 1.0)


def default_config(problem: Problem, fp8: bool = False) -> HopperConfig:
    """Tile sizes, warpgroups and ring depth per head dim, as measured on the H200 (docs/perf-log.md)."""
    # Persistent CTAs (a static snake over the tiles) overlap the next tile's loads with this tile's
    # epilogue: +2 % causal D=128, +4 % FP8 causal; causal D=64 is 3 % faster with one CTA per tile.
    persistent = not (problem.causal and problem.head_dim == 64)
    # Ping-pong pays off only without the causal mask's work (causal D=128 617 vs 607 without it), and
    # not for FP8 at D=128: its GEMMs take half the bf16 time, so waiting for the turn costs more than
    # the overlap it enforces (+2.4 % without it; bf16 measures the same either way).
    pingpong = not problem.causal and not (fp8 and problem.head_dim == 128)
    # D=64 has half the GEMM work per score: two warpgroups leave the softmax's latency exposed, a
    # third hides it (+22 %, FP8 +19 %).
    consumer_warpgroups = 3 if problem.head_dim == 64 else 2
    return HopperConfig(
        dtype=problem.dtype,
        head_dim=problem.head_dim,
        causal=problem.causal,
        consumer_warpgroups=consumer_warpgroups,
        pingpong=pingpong,
        fp8=fp8,
        persistent=persistent,
    )


# ----------------------------------------------------------------------------------------------------
# sm_90a compile on a CPU (static analysis)
# ----------------------------------------------------------------------------------------------------
def fake_operand(element_type: type, shape_tail: tuple[int, ...], leading: Any) -> Any:
    """A (B, H, S, X) fake tensor with symbolic B, H, S and outer strides, unit inner stride."""
    alignment = OPERAND_ALIGNMENT_BYTES * 8 // element_type.width
    sizes = (cute.sym_int(), cute.sym_int(), *leading)
    strides = tuple(cute.sym_int64(divisibility=alignment) for _ in sizes)
    return make_fake_tensor(
        element_type, (*sizes, *shape_tail), stride=(*strides, 1), assumed_align=OPERAND_ALIGNMENT_BYTES
    )


def fake_rows(length: Any) -> Any:
    """A (B, H, length) fp32 fake tensor, last dimension contiguous (LSE, FP8 scales)."""
    return make_fake_tensor(
        Float32,
        (cute.sym_int(), cute.sym_int(), length),
        stride=(cute.sym_int64(), cute.sym_int64(), 1),
        assumed_align=4,
    )


def compile_config_sm90(config: HopperConfig, name: str) -> list[KernelBinary]:
    from cutlass.runtime import make_fake_stream

    from common.static import compile_cute_sm90

    kernel = make_kernel(config)
    seqlen_q, seqlen_k = cute.sym_int(), cute.sym_int()
    D = config.head_dim
    q = fake_operand(kernel.dtype, (D,), (seqlen_q,))
    k = fake_operand(kernel.dtype, (D,), (seqlen_k,))
    v = fake_operand(kernel.dtype, (seqlen_k,), (D,)) if config.fp8 else fake_operand(kernel.dtype, (D,), (seqlen_k,))
    o = fake_operand(kernel.out_dtype, (D,), (seqlen_q,))
    lse = fake_rows(seqlen_q)
    scales = tuple(fake_rows(cute.sym_int()) for _ in range(3)) if config.fp8 else (None,) * 3
    # Any SM count will do: it only sizes the persistent grid at launch.
    scalars = (Float32(1.0), Float32(1.0), Int32(STATIC_SM_COUNT))
    binary = compile_cute_sm90(
        kernel, q, k, v, o, lse, *scales, *scalars, make_fake_stream(), name=name, threads=kernel.threads_per_cta
    )
    return [binary]


def compile_sm90(problem: Problem) -> list[KernelBinary]:
    return compile_config_sm90(default_config(problem), "cute_hopper_attention")


# ----------------------------------------------------------------------------------------------------
# Capability check
# ----------------------------------------------------------------------------------------------------
def hopper_device_supported(device: torch.device) -> tuple[bool, str]:
    """sm_90 exactly: WGMMA and setmaxnreg are sm_90a features that later GPUs do not run."""
    if device.type != "cuda":
        return False, f"needs a CUDA sm_90 GPU, got {device}"
    capability = torch.cuda.get_device_capability(device)
    if capability[0] * 10 + capability[1] != SM90_CAPABILITY:
        return (
            False,
            f"needs compute capability 9.0 (sm_90a: TMA, WGMMA, setmaxnreg), got {capability[0]}.{capability[1]}",
        )
    return True, ""


def common_problem_supported(problem: Problem) -> tuple[bool, str]:
    """Checks shared with ``fp8.py``: head dim, scale sign, grid limits."""
    query_blocks = -(-problem.seqlen_q // ROWS_PER_WARPGROUP)
    if query_blocks * problem.heads * problem.batch > MAX_TILES:
        return False, f"B * H * ceil(Sq / 64) must be <= {MAX_TILES} (tile index), got {problem.describe()}"
    if problem.head_dim not in HEAD_DIMS:
        return (
            False,
            f"head_dim must be one of {list(HEAD_DIMS)}, got {problem.head_dim} (256 exceeds registers and SMEM)",
        )
    if problem.scale <= 0:
        return False, f"softmax_scale must be > 0 (the running max is taken before scaling), got {problem.scale}"
    return True, ""


def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    ok, reason = hopper_device_supported(device)
    if not ok:
        return ok, reason
    if problem.dtype not in DTYPES:
        return False, f"dtype must be fp16 or bf16, got {problem.dtype_name}"
    return common_problem_supported(problem)


IMPLEMENTATION = Implementation(
    name="cute/hopper",
    stack="cute",
    rung="hopper",
    prepare=prepare,
    bind=bind,
    supports=supports,
    compile_sm90=compile_sm90,
    runs_on_cpu=False,
    required_ptx=("wgmma.mma_async", "cp.async.bulk.tensor", "mbarrier", "setmaxnreg"),
    forbidden_ptx=("mma.sync", "cp.async"),
    source_file=__file__,
)
