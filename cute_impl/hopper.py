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
  (D=128) or three (D=64) consumer warpgroups only compute. ``setmaxnreg`` moves registers from the
  producer (24) to the consumers (240, or 160 with three), which hold the 64 x tile_n fp32 scores
  and the 64 x D fp32 output.

Warp roles (n consumer warpgroups: 384 or 512 threads)
-----------------------------------------------------
A tile is 64 n query rows of one (b, h). Launches are persistent (causal D=64 excepted: one CTA per
tile): ``min(tiles, SM count)`` CTAs take the tiles from a ``TileScheduler`` (a snake over the CTAs,
so that causal tiles, sorted longest first, even out; a head's tiles are consecutive, so the CTAs
running together share its K and V in L2).

* warpgroup 0, warp 0: producer. Per tile: Q (n 64-row boxes), then K and V of every key block,
  at the KV head ``kv_head_index(h)`` = h // (H / Hkv) (GQA/MQA: the TMA boxes' head coordinate; no
  repeated copy, and the query heads of one KV head are consecutive tiles, so they share it in L2).
  Warps 1-3 give their registers back and exit.
* warpgroups 1 .. n: consumers; warpgroup ``1 + w`` owns the tile's query rows ``[64 w, 64 w + 64)``.

Pipelines and barriers (producer -> consumer, arrive counts)
------------------------------------------------------------
* Q (``QueryBoxes``, one box per consumer, one phase per tile): full: 1 producer arrive + expect_tx
  (the box's bytes), completed by TMA; empty: 4 arrives, one elected lane per warp of consumer ``w``
  once its last S = Q Kᵀ of the tile has retired; the producer then loads the next tile's Q box.
  FP8 with ``quantise_q``: the box arrives in bf16/fp16 and the consumer writes its e4m3 box itself
  (``_fp8_query.py``: rotation wgmma against a sign matrix loaded once per CTA on its own mbarrier, amax
  over named barrier ``QUANTISE_WG1 + w``), then releases the input box at once. ``rotate_ahead``
  issues the next tile's rotation after the tile's last P V, under its normalisation and O store.
* K ring and V ring (``PipelineTmaAsync``, ``kv_stages`` = 2 each): full: 1 producer arrive with
  expect_tx (the tile's bytes), completed by TMA; empty: 4 n arrives, one elected lane per consumer
  warp, as soon as the WGMMA that read the stage has retired. The rings run on across tiles.
* Ping-pong (``WarpgroupTurns``; 16-bit non-causal only): named barrier ``TURN_WG1 + w``
  (256 threads: 128 of consumer ``w`` wait, 128 of consumer ``w - 1`` arrive) gates consumer ``w``'s
  WGMMA issue; the last consumer arrives once up front, so consumer 0 goes first.
* Epilogue (``OutputEpilogue``): named barrier ``EPILOGUE_WG1 + w`` (128 threads) between the
  shared-memory writes of O and the TMA store that one warp issues. The store stays in flight; a
  persistent CTA waits for it to have read the box before writing the next tile's O there.
* Programmatic dependent launch (``pdl``: cute/fp8 end to end, ``fp8.PROGRAMMATIC_LAUNCH``): launched with
  programmatic stream serialisation, the CTAs may start while the grid before (the fused quantiser) still runs,
  and read its writes only after ``griddepcontrol.wait``: the producer before a tile's Q boxes (the quantiser's
  e4m3 Q) or, with ``quantise_q``, after them and before K and V; each consumer before the tile's scales (after
  quantising its Q box). What comes before the wait (barriers, the sign matrix, Q in the input dtype and its
  quantisation, Q's scales, the key lengths) must not touch what the grid before writes or reads.

Algorithm (each consumer warpgroup; numbers match the kernel's sections)
------------------------------------------------------------------------
1. Wait for its Q box.
2. Key blocks from ``n_block_max - 1`` down (``BlockRange`` from the sequence's ``SeqlenInfo``:
   its ``seqlen_k``, the ``cache_seqlens`` entry when given, and ``causal_offset``, Sk - Sq when
   aligned bottom-right, else 0), so the blocks that need a mask come
   first: the top one (sequence tail), the rest of the causal diagonal, then the unmasked rest.
   a. wait K[n];  S = Q Kᵀ (WGMMA, both operands from SMEM, fp32 accumulator in registers)
   b. masked blocks only (``AttentionMask``): -inf for keys >= seqlen_k and, causal, keys after the
      row's diagonal (j > i + causal_offset); a tile that sees no key runs one fully masked block
   c. ``OnlineSoftmax.update``: block max (tree + two lane shuffles) times softmax_scale_log2; the
      reference ``row_max`` moves only when that exceeds it by more than ``RESCALE_THRESHOLD`` (lazy
      rescaling; FP8 moves it on any increase). P = exp2(S * scale_log2 - row_max), row_sum, and the
      rescale factor exp2(old row_max - new row_max)
   d. P -> bf16/fp16 in the WGMMA A-operand register layout (no shared-memory round trip)
   e. wait V[n];  O = O * factor + P V (``OnlineSoftmax.rescale``; WGMMA, P from registers); the
      multiply is skipped by one warp-uniform branch when no row of the warp moved its reference
   Steps overlap (``next_block``): block n's S = Q K[n]ᵀ is issued together with block n+1's
   O += P V, and the softmax of S runs while that WGMMA is in flight. 16-bit: O's multiply by
   block n+1's factor sits between the two issues, under the S GEMM, so that after the softmax only
   the wait for P V and the conversion of P remain before the next issue; FP8 adds the block's
   separate P V to O first, so it rescales once that WGMMA retired.
3. ``OnlineSoftmax.finalize``: O /= row_sum; lse = (row_max + log2(row_sum)) * ln 2.
4. O -> registers in the output dtype -> ``stmatrix`` into the warpgroup's O box (one CTA per tile:
   the dead Q box; persistent: a box of its own, since the next tile's Q is already loading) ->
   fence.proxy.async -> named barrier -> TMA store (rows past Sq clipped). LSE from registers,
   always written; ``run()`` returns it with O when ``return_lse`` (rows that see no key: O = 0,
   LSE = -inf).

Data movement
-------------
HBM -> SMEM: TMA boxes (64 x D for Q, tile_n x D for K, D x tile_n for V) into 128-byte-swizzled
layouts (``SharedLayouts``), zero-filled past Sq/Sk so that any S >= 1 works. SMEM -> tensor cores:
WGMMA descriptors (no ldmatrix). O: stmatrix, then a TMA store. Shared memory at D=128: Q 32 KB
(+ O 32 KB when persistent) + 2 x (K 32 KB + V 32 KB) = 160 (192) KB; at D=64 (three consumers):
Q 24 KB (+ O 24 KB) + 2 x (16 + 16 KB) = 88 (112) KB.

Steady-state timeline
---------------------
Producer:  Q | K0 V0 | K1 V1 | K2 V2 ...  (runs up to two blocks ahead; waits on empty barriers)
WG1: [issue QKᵀ(n) + PV(n+1)] softmax(n) ....... [issue QKᵀ(n-1) + PV(n)] softmax(n-1) ...
WG2: ........ [issue QKᵀ(n) + PV(n+1)] softmax(n) ....... [issue QKᵀ(n-1) + PV(n)] ...
The tensor cores alternate between the warpgroups' GEMMs while the other warpgroup runs exp2; with
three consumers (D=64) the turn goes round WG1 -> WG2 -> WG3. Persistent: once every consumer has
issued its last S = Q Kᵀ of a tile, the producer loads the next tile's Q and first K/V blocks under
that tile's last P V, normalisation and O store.

Backward (``common.attention`` with inputs that require grad): ``cute_impl/backward/hopper.py`` (TMA,
WGMMA and a producer warp, as here), from this rung's O and LSE.

Constraints
-----------
sm_90 (sm_90a features), fp16/bf16, head_dim 64 or 128, softmax_scale > 0 (a positive scale commutes
with the block max; a zero one would turn the mask's -inf into NaN in the exp2 FMA), 16-byte aligned
row strides (TMA). Any Sq, Sk >= 1; GQA/MQA (Hkv divides H); causal aligned top-left (SDPA's) or
bottom-right (KV cache); ``cache_seqlens`` (B,) int32, contiguous; ``return_lse``. Each feature is a
compile-time flag of ``HopperAttentionConfig``: without them the kernel is the canonical one, unchanged.
``packed_group`` (cute/decode's many packed rows): q and O hold (head in group) · Sq + token rows of each KV head,
so the kernel's tokens are its rows / group and the mask and key range follow each row's token.
``key_splits`` (cute/decode's packed prefill on a grid short of the SMs, ``decode.PACKED_PREFILL_SPLITS``; FA3's
``num_splits``): O and the LSE are fp32 partials (splits, B, H, Sq, D) and (splits, B, H, Sq), the split count their
leading extent (a runtime size); the scheduler deals (query block, split, head, batch) tiles, query block fastest
(a head's and split's tiles, which read the same K and V, run together); a tile visits its split's share of its key
blocks (``_device.key_split_range``: cdiv(blocks, splits) a split, per sequence, the masked blocks in the split that
holds them, an empty split one fully masked block, so its producer and consumers agree as for any tile) and writes
its normalised O and natural-log LSE straight from the accumulator registers (no stmatrix or TMA store: fp32), rows
past Sq skipped, for cute/decode's merge kernel (``_decode_packed_splits.py``). 16-bit only.
head_dim 256 is refused: its 64 x 256 fp32 O alone takes 128 of the 240 registers per consumer
thread, and Q plus one K/V stage (64 + 128 KB at tile_n = 128) leaves no room for a second stage.

What the measurements taught (figures: ``docs/ladder.md``; A/B runs: ``docs/perf-log.md``)
------------------------------------------------------------------------------------------
* The kernel is bound by the tensor cores and exp2: overlapping the next S = Q Kᵀ with this block's
  P V inside each warpgroup is the big win; ping-pong adds little on top (and costs FP8 at D=128).
* Pairwise-tree row max and sum and longest-first causal tiles pay off; larger key blocks (FA3's
  176 at D=128) and a third K/V stage do not. D=64 needs a third consumer warpgroup to hide the
  softmax latency; a fourth cannot get enough registers.
* Lazy rescaling measured mostly within noise; persistent CTAs pay off except at causal D=64.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from common.contract.capability import FEATURES, check_features
from common.contract.problem import Problem
from common.contract.registry import Implementation, Runner, per_call_inputs, warmed_up
from common.contract.validation import kernel_operand, validate_for_problem
from common.toolchain.arch import check_sm90
from common.toolchain.compile import KernelBinary

try:  # The DSL is optional for the rest of the suite; the registry reports the import error.
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    import cutlass.pipeline as pipeline
    from cutlass import Float32, Int32
    from cutlass.cute.nvgpu import cpasync, warp, warpgroup
    from cutlass.memory import SmemAllocator
    from cutlass.tensor_utils import LayoutEnum
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(f"cute/hopper needs nvidia-cutlass-dsl: {error}") from error

from cute_impl._device import LOG2_E, RESCALE_THRESHOLD, BlockRange, SeqlenInfo, key_split_range, kv_head_index
from cute_impl._fp8_query import (
    PairedBoxStore,
    QueryLayouts,
    QueryQuantiser,
    init_rotation_barrier,
    load_rotation,
    rotation_mma,
    rotation_scale,
)
from cute_impl._hopper_device import (
    CONSUMER_REGISTERS,
    PRODUCER_REGISTERS,
    ROWS_PER_THREAD,
    ROWS_PER_WARPGROUP,
    THREADS_PER_WARPGROUP,
    WARPS_PER_WARPGROUP,
    AttentionMask,
    BlockScales,
    Fp8Descales,
    OnlineSoftmax,
    OutputEpilogue,
    QueryBoxes,
    SharedLayouts,
    TileScheduler,
    WarpgroupGemms,
    WarpgroupTurns,
    WorkTile,
    add_block_product,
    fold_block_product,
    head_major,
    load_block,
    one_stage,
    scores_to_operand_a,
    sequence_major,
    tma_partition,
    tma_ring,
    value_operand_view,
    warpgroup_gemm,
    warpgroup_mmas,
)
from cute_impl._hopper_host import FP8_CUTLASS, HopperAttentionConfig, HopperKernels, default_config
from cute_impl._host import CUTE_DTYPES, generic_view
from cute_impl.backward import hopper as hopper_backward

HEAD_DIMS = (64, 128)
DTYPES = (torch.float16, torch.bfloat16)
# The grid is one-dimensional over (query block, head, batch) tiles, indexed by a signed 32-bit int.
MAX_TILES = 2**31 - 1
# FP8 P is scaled into [0, 2^8]: small probabilities stay above e4m3's subnormal range (2^-6).
FP8_P_EXPONENT_OFFSET = 8.0


class HopperAttention:
    """Warp-specialised FlashAttention forward for sm_90a: compile-time configuration only."""

    def __init__(self, config: HopperAttentionConfig):
        if config.consumer_warpgroups not in CONSUMER_REGISTERS:
            raise ValueError(
                f"consumer_warpgroups must be in {sorted(CONSUMER_REGISTERS)}, got {config.consumer_warpgroups}"
            )
        self.dtype = FP8_CUTLASS if config.fp8 else CUTE_DTYPES[config.dtype]
        self.out_dtype = CUTE_DTYPES[config.out_dtype]
        self.head_dim = config.head_dim
        self.causal = config.causal
        self.consumer_warpgroups = config.consumer_warpgroups
        self.tile_m = ROWS_PER_WARPGROUP * config.consumer_warpgroups
        self.threads_per_cta = (1 + config.consumer_warpgroups) * THREADS_PER_WARPGROUP
        self.tile_n = config.tile_n
        self.kv_stages = config.kv_stages
        # FP8 reads V transposed, (B, H, D, Sk): both WGMMA operands K-major.
        self.v_transposed = config.fp8
        self.persistent = config.persistent
        # O may reuse Q's shared memory only when no next tile's Q is loaded while O is stored.
        self.o_aliases_q = self.dtype == self.out_dtype and not config.persistent
        # FP8 only: accumulate each block's P V from zero and add it to O in fp32 registers, because the
        # FP8 tensor-core accumulator keeps fewer mantissa bits than fp32 (see fp8.py's measurements).
        self.fp8 = config.fp8
        self.separate_pv = config.fp8
        # FP8: each block's P V folded into O in one FMA a value, O in its last V block's frame (``fp8.FOLD_V_SCALE``).
        self.fold_v_scale = config.fp8 and config.fold_v_scale
        self.block_scales = config.block_scales
        self.pingpong = config.pingpong
        # FP8: Q read in its input dtype and quantised by each consumer warpgroup (``_fp8_query.py``).
        self.quantise_q, self.rotate_ahead = config.quantise_q, config.quantise_q and config.rotate_ahead
        self.lean_quantise_q = config.quantise_q and config.lean_quantise_q
        self.q_quotient_corrections = config.q_quotient_corrections
        self.input_dtype = CUTE_DTYPES[config.dtype]
        self.rotation_scale = rotation_scale(config.head_dim) if config.quantise_q else 1.0
        # Problem features, all compile time so that the canonical kernel stays as it was.
        self.gqa, self.bottom_right, self.has_cache_seqlens = config.gqa, config.bottom_right, config.has_cache_seqlens
        self.pdl = config.pdl
        self.packed_group = config.packed_group
        # Key splits (cute/decode's packed prefill): O and the LSE are fp32 partials per split, merged afterwards.
        self.key_splits = config.key_splits
        if config.key_splits and config.fp8:
            raise ValueError(f"key_splits writes 16-bit rungs' fp32 partials only, got fp8=True: {config}")

    # ------------------------------------------------------------------------------------------------
    # Host side: layouts, TMA descriptors, launch
    # ------------------------------------------------------------------------------------------------
    @cute.jit
    def __call__(
        self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
        mCacheSeqlens: cute.Tensor | None, mQScale: cute.Tensor | None, mKScale: cute.Tensor | None,
        mVScale: cute.Tensor | None, mRotation: cute.Tensor | None, softmax_scale_log2: Float32,
        output_scale: Float32, sm_count: Int32, stream: cuda.CUstream,
    ):  # fmt: skip
        """q, o (B, H, Sq, D), k, v (B, Hkv, Sk, D) (FP8: v as (B, Hkv, D, Sk')), lse (B, H, Sq) fp32;
        ``mCacheSeqlens`` the (B,) int32 key lengths, None without them. FP8 passes its e4m3 scales
        as (B, H, blocks) for Q and (B, Hkv, blocks) for K and V, fp32 tensors (one block each when per
        tensor); 16-bit passes None for them. ``quantise_q``: q in its input dtype, Q's scales written by
        the kernel, ``mRotation`` the transposed (D, D) sign matrix (else None)."""
        # Every tensor addressed through a generic pointer (``_host.generic_view``), as measured.
        mQ, mK, mV, mO, mLSE, mCacheSeqlens, mQScale, mKScale, mVScale, mRotation = [
            generic_view(t) for t in (mQ, mK, mV, mO, mLSE, mCacheSeqlens, mQScale, mKScale, mVScale, mRotation)
        ]
        # Views of the same memory: (S, D, (H, B)) for the TMA boxes, V as the B operand of P V, and
        # (X, (H, B)) for the LSE and the FP8 scales.
        mQ, mK = sequence_major(mQ), sequence_major(mK)
        mV = value_operand_view(mV, self.v_transposed)
        mQScale, mKScale, mVScale = (head_major(t) for t in (mQScale, mKScale, mVScale))
        # Key splits: O and the LSE are the fp32 partials (splits, B, H, Sq, D) and (splits, B, H, Sq), indexed as
        # they are (no TMA store); else O is TMA-stored through its (S, D, (H, B)) view.
        splits = None
        if cutlass.const_expr(self.key_splits):
            splits = mO.shape[0]
        else:
            mO, mLSE = sequence_major(mO), head_major(mLSE)
        D, rows = self.head_dim, ROWS_PER_WARPGROUP
        v_layout = LayoutEnum.ROW_MAJOR if self.v_transposed else LayoutEnum.COL_MAJOR
        qk_mma, pv_mma = warpgroup_mmas(self.dtype, self.tile_n, D, v_layout.sm90_mma_major_mode())
        smem = SharedLayouts.create(
            self.dtype, self.out_dtype, self.tile_n, D, self.consumer_warpgroups, self.kv_stages, v_layout
        )
        # One TMA atom per operand, copying one stage's box: Q and O (64, D), K (tile_n, D), V (D, tile_n);
        # each with the TMA view of its whole tensor (``mX_tma``), which the kernel takes as ``mX``.
        load = cpasync.CopyBulkTensorTileG2SOp()
        # quantise_q: Q's boxes are loaded in the input dtype; the consumers write the e4m3 boxes ``smem.q``.
        query, q_box, q_dtype, extra_fields = None, smem.q, self.dtype, None
        tma_atom_R, mR_tma, rotation_layout = None, None, None
        if cutlass.const_expr(self.quantise_q):
            query, q_dtype = QueryLayouts.create(self.input_dtype, D, self.consumer_warpgroups), self.input_dtype
            q_box, rotation_layout = query.box, query.rotation
            extra_fields = query.storage_fields(self.input_dtype, self.consumer_warpgroups)
            tma_atom_R, mR_tma = cpasync.make_tiled_tma_atom(load, mRotation, one_stage(rotation_layout), (D, D))
            self.rotation_bytes = cute.size_in_bytes(self.input_dtype, one_stage(rotation_layout))
        tma_atom_Q, mQ_tma = cpasync.make_tiled_tma_atom(load, mQ, one_stage(q_box), (rows, D))
        tma_atom_K, mK_tma = cpasync.make_tiled_tma_atom(load, mK, one_stage(smem.k), (self.tile_n, D))
        tma_atom_V, mV_tma = cpasync.make_tiled_tma_atom(load, mV, one_stage(smem.v), (D, self.tile_n))
        tma_atom_O, mO_tma = None, mO
        if cutlass.const_expr(not self.key_splits):
            store = cpasync.CopyBulkTensorTileS2GOp()
            tma_atom_O, mO_tma = cpasync.make_tiled_tma_atom(store, mO, one_stage(smem.o), (rows, D))
        self.q_bytes, self.k_bytes, self.v_bytes = (
            cute.size_in_bytes(dtype, one_stage(layout))
            for dtype, layout in ((q_dtype, q_box), (self.dtype, smem.k), (self.dtype, smem.v))
        )
        self.shared_storage = smem.storage(
            self.dtype, self.out_dtype, self.consumer_warpgroups, self.kv_stages, self.o_aliases_q, extra_fields
        )
        tiles = TileScheduler.tile_total(self.tile_m, mQ.shape[0], mQ.shape[2][0], mQ.shape[2][1], splits)
        ctas = cutlass.min(tiles, sm_count) if cutlass.const_expr(self.persistent) else tiles
        self.kernel(
            qk_mma, pv_mma, tma_atom_Q, mQ_tma, tma_atom_K, mK_tma, tma_atom_V, mV_tma, tma_atom_O, mO_tma, mLSE,
            mCacheSeqlens, mQScale, mKScale, mVScale, softmax_scale_log2, output_scale, smem.q, smem.k, smem.v,
            smem.o, None if query is None else q_box, tma_atom_R, mR_tma, rotation_layout,
        ).launch(
            grid=[ctas, 1, 1],
            block=[self.threads_per_cta, 1, 1],
            smem=self.shared_storage.size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=1,
            use_pdl=self.pdl,
        )  # fmt: skip

    # ------------------------------------------------------------------------------------------------
    # Device side
    # ------------------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self, qk_mma: cute.TiledMma, pv_mma: cute.TiledMma, tma_atom_Q: cute.CopyAtom, mQ: cute.Tensor,
        tma_atom_K: cute.CopyAtom, mK: cute.Tensor, tma_atom_V: cute.CopyAtom, mV: cute.Tensor,
        tma_atom_O: cute.CopyAtom, mO: cute.Tensor, mLSE: cute.Tensor, mCacheSeqlens: cute.Tensor | None,
        mQScale: cute.Tensor | None, mKScale: cute.Tensor | None, mVScale: cute.Tensor | None,
        softmax_scale_log2: Float32, output_scale: Float32, sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout, sO_layout: cute.ComposedLayout,
        sQ_in_layout: cute.ComposedLayout | None, tma_atom_R: cute.CopyAtom | None, mR: cute.Tensor | None,
        sR_layout: cute.ComposedLayout | None,
    ):  # fmt: skip
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        warp_group = cute.arch.make_warp_uniform(tidx // THREADS_PER_WARPGROUP)
        seqlen_q, seqlen_k = mQ.shape[0], mK.shape[0]
        rows, D, W = ROWS_PER_WARPGROUP, self.head_dim, self.consumer_warpgroups
        splits = mO.shape[0] if cutlass.const_expr(self.key_splits) else None  # the partials' leading extent
        scheduler = TileScheduler(self.tile_m, self.causal, seqlen_q, mQ.shape[2][0], mQ.shape[2][1], splits)
        local_tiles = scheduler.local_tile_count()
        # Packed rows (cute/decode): group · Sq rows of Sq tokens; the diagonal is each row's token's.
        tokens, packed_seqlen_q = seqlen_q, None
        if cutlass.const_expr(self.packed_group > 1):
            tokens = seqlen_q // self.packed_group
            packed_seqlen_q = tokens
        seqlen_info = functools.partial(
            SeqlenInfo.create,
            seqlen_q=tokens,
            seqlen_k=seqlen_k,
            cache_seqlens=mCacheSeqlens,
            bottom_right=self.bottom_right,
        )
        block_range = functools.partial(
            BlockRange.create_exact, tile_m=self.tile_m, tile_n=self.tile_n, causal=self.causal,
            packed_seqlen_q=packed_seqlen_q,
        )  # fmt: skip
        kv_head_batch = functools.partial(self.kv_head_batch, heads=mQ.shape[2][0], kv_heads=mK.shape[2][0])
        tile_keys = functools.partial(self.tile_keys, seqlen_info=seqlen_info, block_range=block_range, splits=splits)

        # ==== Shared memory and barriers ==================================================================
        storage = SmemAllocator().allocate(self.shared_storage)
        q_boxes = QueryBoxes(storage.q_full.data_ptr(), storage.q_empty.data_ptr(), W, self.q_bytes)
        if warp_idx == 0:
            with cute.arch.elect_one():
                q_boxes.init_barriers()
        if cutlass.const_expr(self.quantise_q):
            init_rotation_barrier(storage.rotation_full.data_ptr(), warp_idx)
        # K and V rings: one elected lane per consumer warp releases a stage.
        kv_ring = functools.partial(tma_ring, stages=self.kv_stages, consumer_warps=W * WARPS_PER_WARPGROUP)
        k_producer, k_consumer = kv_ring(storage.k_barriers.data_ptr(), tx_bytes=self.k_bytes)
        v_producer, v_consumer = kv_ring(storage.v_barriers.data_ptr(), tx_bytes=self.v_bytes)
        cute.arch.mbarrier_init_fence()
        cute.arch.barrier()

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)  # (64, D, warpgroup)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)  # (tile_n, D, stage)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)  # (D, tile_n, stage)
        if cutlass.const_expr(self.o_aliases_q):
            sO = sQ  # (64, D, warpgroup): same dtype and layout as Q
        else:
            sO = storage.sO.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)  # (64, D, warpgroup)
        # The boxes the producer loads Q into: the e4m3 ones, or (quantise_q) the input-dtype ones.
        sQ_in, sR = sQ, None
        if cutlass.const_expr(self.quantise_q):
            sQ_in = storage.sQ_in.get_tensor(sQ_in_layout.outer, swizzle=sQ_in_layout.inner)  # (64, D, warpgroup)
            sR = storage.sR.get_tensor(sR_layout.outer, swizzle=sR_layout.inner)  # (D, D, 1)

        # ==== Producer warp: all TMA loads =================================================================
        if warp_group == 0:
            cute.arch.setmaxregister_decrease(PRODUCER_REGISTERS)
            if warp_idx == 0:
                if cutlass.const_expr(self.quantise_q):
                    load_rotation(tma_atom_R, mR, sR, storage.rotation_full.data_ptr(), self.rotation_bytes)
                q_state = QueryBoxes.producer_state()
                for local_tile in cutlass.range(local_tiles, unroll=1):
                    tile = scheduler.work_tile(local_tile)
                    m_block, bh = tile.m_block, tile.head_batch
                    # GQA: K and V boxes come from the query head's KV head, never from a repeated copy.
                    kv_bh = kv_head_batch(bh)
                    gQ = cute.local_tile(mQ[None, None, bh], (rows, D), (None, 0))  # (64, D, Sq/64)
                    gK = cute.local_tile(mK[None, None, kv_bh], (self.tile_n, D), (None, 0))  # (tile_n, D, n)
                    gV = cute.local_tile(mV[None, None, kv_bh], (D, self.tile_n), (0, None))  # (D, tile_n, n)
                    tQsQ, tQgQ = tma_partition(tma_atom_Q, sQ_in, gQ)  # (TMA, warpgroup), (TMA, Sq/64)
                    tKsK, tKgK = tma_partition(tma_atom_K, sK, gK)  # (TMA, stage), (TMA, n)
                    tVsV, tVgV = tma_partition(tma_atom_V, sV, gV)  # (TMA, stage), (TMA, n)
                    # PDL: the previous grid's writes are read from here on (returns at once after the first
                    # tile): the e4m3 Q's boxes, or (quantise_q, Q the caller's) K's and V's.
                    if cutlass.const_expr(self.pdl and not self.quantise_q):
                        cute.arch.griddepcontrol_wait()
                    for w in cutlass.range_constexpr(W):
                        q_boxes.load(tma_atom_Q, tQgQ[None, m_block * W + w], tQsQ[None, w], w, q_state)
                    q_state.advance()
                    if cutlass.const_expr(self.pdl and self.quantise_q):
                        cute.arch.griddepcontrol_wait()
                    _, blocks = tile_keys(tile)
                    for i in cutlass.range(blocks.n_block_max - blocks.n_block_min, unroll=1):
                        n_block = blocks.n_block_max - 1 - i
                        k_producer = load_block(tma_atom_K, tKgK[None, n_block], tKsK, k_producer)
                        v_producer = load_block(tma_atom_V, tVgV[None, n_block], tVsV, v_producer)

        # ==== Consumer warpgroups: S = Q Kᵀ -> mask -> online softmax -> O += P V =========================
        if warp_group > 0:
            cute.arch.setmaxregister_increase(CONSUMER_REGISTERS[W])
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
            turns = WarpgroupTurns(self.pingpong, w, W, THREADS_PER_WARPGROUP)
            epilogue = OutputEpilogue(tma_atom_O, thr_store, sO, w, wg_tidx, self.persistent)
            descales = Fp8Descales(mQScale, mKScale, mVScale, self.block_scales) if self.fp8 else None
            gemms = WarpgroupGemms(
                qk=functools.partial(warpgroup_gemm, qk_mma, tA=tSrQ, tB=tSrK, accumulate=False),
                pv=functools.partial(warpgroup_gemm, pv_mma, tA=tOrP, tB=tOrV, accumulate=not self.separate_pv),
                acc_S_shape=acc_S_shape,
                acc_O=acc_O,
                tOrP=tOrP,
                turns=turns,
                o_scale=cute.make_rmem_tensor(ROWS_PER_THREAD, Float32),
                v_scale=cute.make_rmem_tensor(1, Float32) if cutlass.const_expr(self.fold_v_scale) else None,
            )
            quantiser = None
            if cutlass.const_expr(self.quantise_q):
                q_amax = storage.q_amax.get_tensor(cute.make_layout(W * WARPS_PER_WARPGROUP))
                paired = None
                if cutlass.const_expr(self.lean_quantise_q):
                    paired = PairedBoxStore(PairedBoxStore.view(storage.sQ, D, W), w, wg_tidx)
                quantiser = QueryQuantiser(
                    rotation_mma(self.input_dtype, D), sQ_in, sR, sQ, q_amax, storage.rotation_full.data_ptr(), w,
                    wg_tidx, self.rotation_scale, paired, self.q_quotient_corrections,
                )  # fmt: skip
                quantiser.wait_rotation()
            q_state = QueryBoxes.consumer_state()
            if cutlass.const_expr(self.rotate_ahead):
                # The first tile's rotation; each later one is issued at the end of the tile before.
                rotated_ahead = quantiser.accumulator()
                q_boxes.wait(w, q_state)
                quantiser.rotate(rotated_ahead, cleared=True)
            # Every warpgroup of the CTA visits the same key blocks of every tile, so the turns balance
            # over the whole tile loop.
            turns.start()
            for local_tile in cutlass.range(local_tiles, unroll=1):
                tile = scheduler.work_tile(local_tile)
                m_block, bh = tile.m_block, tile.head_batch
                seqlen, blocks = tile_keys(tile)
                row_start = m_block * self.tile_m + w * rows
                tile_scale_log2, tile_output_scale, scales = softmax_scale_log2, output_scale, None
                q_scale = None
                if cutlass.const_expr(self.quantise_q):
                    # 1. This warpgroup's Q box in the input dtype, quantised to its e4m3 box (the input box
                    # is free once the rotation has read it), and Q's block scale written for the caller.
                    if cutlass.const_expr(self.rotate_ahead):
                        q_scale = quantiser.quantise(rotated_ahead)
                    else:
                        q_boxes.wait(w, q_state)
                        rotated = quantiser.accumulator()
                        quantiser.rotate(rotated)
                        q_scale = quantiser.quantise(rotated)
                    q_boxes.release(w)
                    q_state.advance()
                    descales.store_query_scale(q_scale, m_block * W + w, bh, wg_tidx)
                if cutlass.const_expr(self.fp8):
                    if cutlass.const_expr(self.pdl):
                        cute.arch.griddepcontrol_wait()  # the scales are the previous grid's (PDL)
                    tile_scale_log2, tile_output_scale, scales = descales.for_tile(
                        softmax_scale_log2, output_scale, m_block * W + w, bh, kv_head_batch(bh), q_scale
                    )
                acc_O.fill(0.0)
                # FP8: P in [0, 2^8] rather than [0, 1] keeps small probabilities out of e4m3's subnormals,
                # so the reference max must move whenever it grows (P > 448 would overflow e4m3); 16-bit P
                # has range to spare and lets it lag by 2^8 (RESCALE_THRESHOLD).
                softmax = OnlineSoftmax(
                    ROWS_PER_THREAD,
                    tile_scale_log2,
                    p_exponent_offset=FP8_P_EXPONENT_OFFSET if self.separate_pv else 0.0,
                    rescale_threshold=0.0 if self.separate_pv else RESCALE_THRESHOLD,
                )
                mask = AttentionMask(self.tile_n, self.causal, tScS, row_start, seqlen, packed_seqlen_q)
                first_block = functools.partial(self.first_block, gemms, softmax, scales, mask)
                masked_block = functools.partial(self.next_block, gemms, softmax, scales, mask)
                unmasked_block = functools.partial(self.next_block, gemms, softmax, scales, None)
                last_block = functools.partial(self.last_block, gemms, scales, softmax)

                # 1. This warpgroup's Q box.
                if cutlass.const_expr(not self.quantise_q):
                    q_boxes.wait(w, q_state)
                # 2. Key blocks from the top: the first needs the sequence mask and starts the softmax,
                # then the rest of the causal diagonal (masked), then the rest (no mask). Each later step
                # issues its S = Q Kᵀ together with the previous block's O += P V.
                n_top = blocks.n_block_max - 1
                k_consumer = first_block(k_consumer, n_top)
                for i in cutlass.range(1, blocks.n_masked_blocks, unroll=1):
                    k_consumer, v_consumer = masked_block(k_consumer, v_consumer, n_top - i)
                for i in cutlass.range(blocks.n_masked_blocks, blocks.n_block_max - blocks.n_block_min, unroll=1):
                    k_consumer, v_consumer = unmasked_block(k_consumer, v_consumer, n_top - i)
                # Every S = Q Kᵀ of this tile has retired: the producer may load the next tile's Q.
                if cutlass.const_expr(not self.quantise_q):
                    q_boxes.release(w)
                    q_state.advance()
                v_consumer = last_block(v_consumer, blocks.n_block_min)
                if cutlass.const_expr(self.rotate_ahead):
                    # Ahead of steps 3-4: the next tile's rotation, issued now, runs on the tensor cores
                    # under them; its box was loaded during this tile (released at the tile's start).
                    # After the CTA's last tile it rotates that tile's box again (no wait: nothing loads it),
                    # which the loop's exit waits for: one issue on every path keeps the accumulator in
                    # registers (a conditional one left it in local memory).
                    if local_tile + 1 < local_tiles:
                        q_boxes.wait(w, q_state)
                    quantiser.rotate(rotated_ahead, cleared=True)

                # 3. Normalise, log-sum-exp.
                if cutlass.const_expr(self.fold_v_scale and self.block_scales):
                    tile_output_scale = tile_output_scale * gemms.v_scale[0]  # O is in its last V block's frame
                lse = softmax.finalize(acc_O, tile_output_scale)
                if cutlass.const_expr(self.key_splits):
                    # 4, key splits: the split's fp32 partials straight from registers (the merge follows).
                    head, batch = bh
                    epilogue.store_lse(mLSE[tile.split, batch, head, None], lse, tOcO, row_start, seqlen_q)
                    epilogue.store_partial(acc_O, mO[tile.split, batch, head, None, None], tOcO, row_start, seqlen_q)
                else:
                    epilogue.store_lse(mLSE[None, bh], lse, tOcO, row_start, seqlen_q)
                    # 4. O -> SMEM (stmatrix) -> TMA store.
                    epilogue.store_output(acc_O, mO[None, None, bh], m_block)
            turns.finish()
            if cutlass.const_expr(self.rotate_ahead):
                warpgroup.wait_group(0)  # the rotation issued after the last tile
            if wg_tidx < cute.arch.WARP_SIZE:
                # The last TMA store must have read shared memory before the CTA exits.
                cute.arch.cp_async_bulk_wait_group(0, read=True)

    def tile_keys(
        self, tile: WorkTile, seqlen_info: Callable[..., SeqlenInfo], block_range: Callable[..., BlockRange],
        splits: Int32 | None,
    ) -> tuple[SeqlenInfo, BlockRange]:  # fmt: skip
        """The tile's sequence and key blocks, the same for its producer and its consumers (each load is one wait):
        all the blocks its rows see, or with key splits its split's share (``key_split_range``: an empty split is
        one fully masked block)."""
        seqlen = seqlen_info(tile.head_batch[1])
        blocks = block_range(tile.m_block, seqlen)
        if self.key_splits:
            blocks, seqlen = key_split_range(blocks, seqlen, tile.split, splits)
        return seqlen, blocks

    def kv_head_batch(self, bh: tuple[Int32, Int32], heads: Int32, kv_heads: Int32) -> tuple[Int32, Int32]:
        """(KV head, batch) of the tile's (head, batch): what indexes K, V and their FP8 scales."""
        if cutlass.const_expr(not self.gqa):
            return bh
        head, batch = bh
        return kv_head_index(head, heads, kv_heads), batch

    # The three main-loop steps, with their operands bound by functools.partial (``gemms`` once, the
    # tile's softmax, scales and mask per tile). Each takes the pipeline consumers it advances and
    # returns them, so that the runtime loops carry their state.
    @cute.jit
    def first_block(
        self, gemms: WarpgroupGemms, softmax: OnlineSoftmax, scales: BlockScales | None, mask: AttentionMask,
        k_consumer: pipeline.PipelineConsumer, n_block: Int32,
    ) -> pipeline.PipelineConsumer:  # fmt: skip
        """2a-d for the first block: S = Q Kᵀ, mask, first softmax update, P. No O yet."""
        acc_S = cute.make_rmem_tensor(gemms.acc_S_shape, Float32)
        k_slot = k_consumer.wait_and_advance()
        gemms.turns.wait()
        gemms.qk(acc_S, stage=k_slot.index)
        gemms.turns.pass_on()
        # Block scales are loaded while the GEMM runs, so that their latency hides behind it.
        key_scale = None if scales is None else scales.key(n_block)
        warpgroup.wait_group(0)
        k_slot.release()
        mask.apply(acc_S, n_block)
        row_scale = softmax.update(acc_S, key_scale)
        if cutlass.const_expr(not self.separate_pv or self.fold_v_scale):
            gemms.o_scale.store(row_scale.load())
        if cutlass.const_expr(self.fold_v_scale):
            gemms.v_scale[0] = Float32(1.0)  # any finite frame: O is still zero
        scores_to_operand_a(acc_S, gemms.tOrP)
        return k_consumer

    @cute.jit
    def next_block(
        self, gemms: WarpgroupGemms, softmax: OnlineSoftmax, scales: BlockScales | None, mask: AttentionMask | None,
        k_consumer: pipeline.PipelineConsumer, v_consumer: pipeline.PipelineConsumer, n_block: Int32,
    ) -> tuple[pipeline.PipelineConsumer, pipeline.PipelineConsumer]:  # fmt: skip
        """2a-e overlapped: issue S = Q K[n]ᵀ and O += P V[n + 1]; softmax S while O's WGMMA runs.
        With block scales, K[n]'s scale joins the softmax and V[n + 1]'s multiplies its P V."""
        acc_S = cute.make_rmem_tensor(gemms.acc_S_shape, Float32)
        k_slot = k_consumer.wait_and_advance()
        v_slot = v_consumer.wait_and_advance()
        acc_O = gemms.acc_O
        acc_PV = cute.make_rmem_tensor(acc_O.layout, Float32) if cutlass.const_expr(self.separate_pv) else acc_O
        gemms.turns.wait()
        gemms.qk(acc_S, stage=k_slot.index)
        if cutlass.const_expr(not self.separate_pv):
            # O owes the previous block's factor: pay it while S = Q Kᵀ runs, before P V adds to O.
            softmax.rescale(acc_O, gemms.o_scale)
        gemms.pv(acc_PV, stage=v_slot.index)
        gemms.turns.pass_on()
        # Block scales are loaded once the GEMMs are issued: ptxas copies each into a uniform register
        # right after its load, and loaded before them, that wait held up their issue every block
        # (docs/perf-log.md, issue #17). V's scale is needed only after the softmax.
        key_scale = None if scales is None else scales.key(n_block)
        # S is ready when at most the (later) O group is still in flight.
        warpgroup.wait_group(1)
        k_slot.release()
        pv_scale = None if scales is None else scales.value(n_block + 1)
        if cutlass.const_expr(mask is not None):
            mask.apply(acc_S, n_block)
        row_scale = softmax.update(acc_S, key_scale)
        # P's registers (and, FP8, O) are rewritten below: the O += P V that reads them must retire first.
        warpgroup.wait_group(0)
        v_slot.release()
        if cutlass.const_expr(self.fold_v_scale):
            fold_block_product(acc_O, acc_PV, gemms.o_scale, gemms.v_scale, pv_scale)
            gemms.o_scale.store(row_scale.load())
        elif cutlass.const_expr(self.separate_pv):
            softmax.rescale(acc_O, row_scale, acc_PV, pv_scale)
        else:
            gemms.o_scale.store(row_scale.load())
        scores_to_operand_a(acc_S, gemms.tOrP)
        return k_consumer, v_consumer

    @cute.jit
    def last_block(
        self, gemms: WarpgroupGemms, scales: BlockScales | None, softmax: OnlineSoftmax,
        v_consumer: pipeline.PipelineConsumer, n_block: Int32,
    ) -> pipeline.PipelineConsumer:  # fmt: skip
        """2e for the last block (the lowest, ``n_block_min``): O += P V."""
        v_slot = v_consumer.wait_and_advance()
        acc_O = gemms.acc_O
        acc_PV = cute.make_rmem_tensor(acc_O.layout, Float32) if cutlass.const_expr(self.separate_pv) else acc_O
        gemms.turns.wait()
        if cutlass.const_expr(not self.separate_pv):
            softmax.rescale(acc_O, gemms.o_scale)
        gemms.pv(acc_PV, stage=v_slot.index)
        gemms.turns.pass_on()
        pv_scale = None if scales is None else scales.value(n_block)
        warpgroup.wait_group(0)
        v_slot.release()
        if cutlass.const_expr(self.fold_v_scale):
            fold_block_product(acc_O, acc_PV, gemms.o_scale, gemms.v_scale, pv_scale)
        elif cutlass.const_expr(self.separate_pv):
            add_block_product(acc_O, acc_PV, pv_scale)
        return v_consumer


# ----------------------------------------------------------------------------------------------------
# Host: compile once per configuration, validate, bind
# ----------------------------------------------------------------------------------------------------
# The one compile cache of hopper and fp8, keyed on HopperAttentionConfig; GPU launches and CPU compiles alike
# compile from fake tensors (``_hopper_host.py``).
KERNELS = HopperKernels(HopperAttention)


def validated_problem(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, *,
    cache_seqlens: torch.Tensor | None = None, name: str = "cute/hopper", features: tuple[str, ...] = FEATURES,
) -> Problem:  # fmt: skip
    """The Problem that q (B, H, Sq, D), k and v (B, Hkv, Sk, D) describe, refused with a ValueError
    where ``supports`` would refuse it (dtype, head dim, softmax_scale <= 0, grid size, a device other
    than sm_90, a problem feature not in ``features``); no GPU work. Shared with ``fp8.py``."""
    checked = validate_for_problem(q, k, v, problem, cache_seqlens=cache_seqlens, dtypes=DTYPES, head_dims=HEAD_DIMS)
    checks = (
        check_features(name, checked, features),
        common_problem_supported(checked),
        hopper_device_supported(q.device),
    )
    for ok, reason in checks:
        if not ok:
            raise ValueError(reason)
    return checked


def prepare(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, *, cache_seqlens: torch.Tensor | None = None
) -> Runner:
    """Validate q (B, H, Sq, D), k and v (B, Hkv, Sk, D), bind them (compiling on first use), and
    launch once to warm up."""
    checked = validated_problem(q, k, v, problem, cache_seqlens=cache_seqlens)
    return warmed_up(bind(q, k, v, checked, **per_call_inputs(checked, cache_seqlens)), q.device)


def bind(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, *, cache_seqlens: torch.Tensor | None = None
) -> Runner:
    """The launch-only ``run`` of validated q, k, v at the default configuration (compiled once)."""
    q, k, v = (kernel_operand(t) for t in (q, k, v))
    return KERNELS.launcher(
        default_config(problem),
        q,
        k,
        v,
        problem.scale * LOG2_E,
        1.0,
        cache_seqlens=cache_seqlens,
        return_lse=problem.return_lse,
    )


def compile_sm90(problem: Problem) -> list[KernelBinary]:
    return KERNELS.binaries(default_config(problem), "cute_hopper_attention")


# ----------------------------------------------------------------------------------------------------
# Capability check
# ----------------------------------------------------------------------------------------------------
def hopper_device_supported(device: torch.device) -> tuple[bool, str]:
    """sm_90 exactly: WGMMA and setmaxnreg are sm_90a features that later GPUs do not run."""
    return check_sm90("cute/hopper and cute/fp8", device, "sm_90a: TMA, WGMMA, setmaxnreg")


def common_problem_supported(problem: Problem) -> tuple[bool, str]:
    """Checks shared with ``fp8.py``: head dim, scale sign, grid limits."""
    query_blocks = -(-problem.seqlen_q // ROWS_PER_WARPGROUP)
    if query_blocks * problem.heads * problem.batch > MAX_TILES:
        return False, f"B * H * ceil(Sq / 64) must be <= {MAX_TILES} (tile index), got {problem.describe()}"
    if problem.head_dim not in HEAD_DIMS:
        got = f"got {problem.head_dim} (256 exceeds registers and SMEM)"
        return False, f"head_dim must be one of {list(HEAD_DIMS)}, {got}"
    if problem.scale <= 0:
        return False, (
            "softmax_scale must be > 0 (the block max is taken before scaling, and a zero scale turns the "
            f"mask's -inf into NaN in the exp2 FMA), got {problem.scale}"
        )
    return True, ""


def wgmma_supports(name: str, problem: Problem, device: torch.device, dtype_rule: str) -> tuple[bool, str]:
    """The capability check of the WGMMA rungs (this one and ``fp8.py``; the counterpart of the
    ``mma.sync`` rungs' ``mma_sync_supports``), the first refusal in this order: an sm_90 device, fp16/bf16
    inputs (``dtype_rule`` says what the rung does with them), the problem features, the limits of
    :func:`common_problem_supported`."""
    checks = (
        hopper_device_supported(device),
        (problem.dtype in DTYPES, f"{dtype_rule}, got {problem.dtype_name}"),
        check_features(name, problem, FEATURES),
        common_problem_supported(problem),
    )
    return next(((ok, reason) for ok, reason in checks if not ok), (True, ""))


def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    return wgmma_supports("cute/hopper", problem, device, "dtype must be fp16 or bf16")


IMPLEMENTATION = Implementation(
    name="cute/hopper", stack="cute", rung="hopper", prepare=prepare, bind=bind, supports=supports,
    compile_sm90=compile_sm90, runs_on_cpu=False, source_file=__file__,
    required_ptx=("wgmma.mma_async", "cp.async.bulk.tensor", "mbarrier", "setmaxnreg"),
    forbidden_ptx=("mma.sync", "cp.async"), backward=hopper_backward.BACKWARD,
)  # fmt: skip
