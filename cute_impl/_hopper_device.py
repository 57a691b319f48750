"""Device helpers shared by the CuTe DSL Hopper rungs (``hopper.py`` and ``fp8.py``).

The kernel only orchestrates; these small objects do the work, with the names every stack uses
(issue #19; ``triton_impl/_device.py`` has the same vocabulary). ``kv_head_index``, ``SeqlenInfo``
and ``BlockRange`` (which key blocks a query tile visits, ``BlockRange.create_exact`` here) are the
whole stack's, in ``_device.py``; the objects here speak the WGMMA fragment layout:
:class:`AttentionMask` writes ``-inf`` where a score must not count, :class:`OnlineSoftmax`
carries ``row_max`` (log2 units of the scaled scores) and ``row_sum`` across key blocks,
:class:`NamedBarrier` names the barrier ids, :class:`TileScheduler` deals query tiles to CTAs,
:class:`QueryBoxes` is the Q pipeline and :func:`tma_ring` the K/V rings (:func:`tma_pipeline` the
ring itself, for a consumer that releases slots by index), :class:`WarpgroupGemms` binds a consumer
warpgroup's GEMM operands once, :class:`WarpgroupTurns` is the ping-pong between
consumer warpgroups, :class:`OutputEpilogue` stores O and the LSE, :class:`Fp8Descales` folds the
FP8 scales. The fragment helpers translate between the WGMMA accumulator layout and (row, column)
views. For the launch (``HopperAttention.__call__``), :func:`warpgroup_mmas` builds the two tiled
WGMMAs and :class:`SharedLayouts` the swizzled shared-memory layouts and the storage struct;
:func:`registers_fit` checks the producer/consumer register split against the launch allocation.

WGMMA accumulator layout (m64nNk16, one warpgroup): a thread holds, for every 8-column block ``c``,
the four values ``(row r0, col 8c + 2t)``, ``(r0, 8c + 2t + 1)``, ``(r0 + 8, 8c + 2t)``,
``(r0 + 8, 8c + 2t + 1)`` with ``t = lane % 4`` and ``r0 = 16 * warp + lane // 4``. The mode shape is
``((2, 2, N/8), MMA_M, MMA_N)``: column pair, row half, column block. Four neighbouring lanes share a
row, so a row reduction is a thread-local loop plus two butterfly shuffles.
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Callable
from typing import Any, NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from cute_impl._device import LN_2, SeqlenInfo

WARPS_PER_WARPGROUP = 4
THREADS_PER_WARPGROUP = 128
# Query rows per consumer warpgroup: the M of one WGMMA instruction.
ROWS_PER_WARPGROUP = 64
# Lanes that share one accumulator row (t = lane % 4).
THREADS_PER_ROW = 4
# Accumulator rows per thread in an m64 WGMMA: r0 and r0 + 8.
ROWS_PER_THREAD = 2
# Values per row and 8-column block of the accumulator (a column pair 2t, 2t + 1).
VALUES_PER_PAIR = 2
# 8-column accumulator blocks per 32-wide FP8 k-block.
COLUMN_BLOCKS_PER_FP8_K = 4
# A TMA-filled buffer's full barrier completes with one producer arrive (plus the bytes TMA counts in).
PRODUCER_ARRIVES = 1
# Shared-memory tiles start at 1024-byte boundaries, the period of the 128-byte swizzle pattern.
SMEM_ALIGN_BYTES = 1024


# ----------------------------------------------------------------------------------------------------
# Register budget
# ----------------------------------------------------------------------------------------------------
# The producer warpgroup only issues TMA: setmaxnreg lowers it to 24 registers per thread.
PRODUCER_REGISTERS = 24
# Registers per consumer thread after setmaxnreg, by consumer warpgroups per CTA: the producer
# warpgroup keeps 24, and the total must fit what the CTA was given at launch (``registers_fit``).
CONSUMER_REGISTERS = {2: 240, 3: 160}
REGISTER_FILE = 65536
# Per-thread register counts come in multiples of 8.
REGISTER_GRANULE = 8


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


# ----------------------------------------------------------------------------------------------------
# Fragment views
# ----------------------------------------------------------------------------------------------------
def rows_by_cols(tensor: cute.Tensor) -> cute.Tensor:
    """View an accumulator-shaped fragment ((2, 2, N/8), MMA_M, MMA_N) as (rows, cols)."""
    shape, stride = tensor.layout.shape, tensor.layout.stride
    layout = cute.make_layout(
        ((shape[0][1], shape[1]), (shape[0][0], shape[0][2], shape[2])),
        stride=((stride[0][1], stride[1]), (stride[0][0], stride[0][2], stride[2])),
    )
    return cute.make_tensor(tensor.iterator, layout)


@cute.jit
def scores_to_operand_a(acc_S: cute.Tensor, tOrP: cute.Tensor) -> None:
    """Convert S (fp32 accumulator) into P, the register A operand of O += P V.

    16-bit: the m64k16 A fragment of k-block ``k`` is exactly accumulator column blocks ``2k`` and
    ``2k + 1`` in the same register order, so a plain converting copy is enough. FP8: the m64k32 A
    fragment wants four consecutive k per thread, while the accumulator holds column pairs. Instead
    of shuffling bytes between lanes, value ``(pair j, row r, block c)`` of each 32-column chunk is
    placed at A slot ``(j + 2 (c % 2), r, c // 2)``; the host permutes V's key order to match (see
    ``fp8.py``), which makes the product identical.
    """
    if cutlass.const_expr(tOrP.element_type.width == 16):
        rP_as_S = cute.make_tensor(tOrP.iterator, acc_S.layout)
        rP_as_S.store(acc_S.load().to(tOrP.element_type))
    else:
        # fp32 staging in A order: pure register renaming, then one vectorised conversion.
        staged = cute.make_rmem_tensor(tOrP.layout, Float32)
        blocks = COLUMN_BLOCKS_PER_FP8_K
        values_per_block = ROWS_PER_THREAD * VALUES_PER_PAIR
        for k in cutlass.range_constexpr(cute.size(acc_S, mode=[0]) // (values_per_block * blocks)):
            for c in cutlass.range_constexpr(blocks):
                for r in cutlass.range_constexpr(ROWS_PER_THREAD):
                    for j in cutlass.range_constexpr(VALUES_PER_PAIR):
                        source = j + 2 * r + 4 * (blocks * k + c)
                        target = (j + 2 * (c % 2)) + 4 * r + 8 * (c // 2) + 16 * k
                        staged[target] = acc_S[source]
        tOrP.store(staged.load().to(tOrP.element_type))


def row_values(rows_cols: cute.Tensor, r: int) -> list[Float32]:
    """The values of row ``r`` of a (rows, cols) register view, as a Python list (unrolled)."""
    return [rows_cols[r, c] for c in range(cute.size(rows_cols, mode=[1]))]


def tree_reduce(values: list[Float32], combine: Callable[[Float32, Float32], Float32]) -> Float32:
    """Pairwise reduction: log2(n) dependent steps instead of the n of a running loop."""
    while len(values) > 1:
        paired = [combine(values[i], values[i + 1]) for i in range(0, len(values) - 1, 2)]
        values = paired + values[len(paired) * 2 :]
    return values[0]


# ----------------------------------------------------------------------------------------------------
# Named barriers, tile scheduler, Q pipeline
# ----------------------------------------------------------------------------------------------------
class ReadOnlyInRegions:
    """Base of the helper objects that a kernel builds once, before its warp-role branches and tile
    loops, and only reads inside them. The DSL asks every object that crosses a runtime ``if`` or
    loop for the staged values it must carry; these carry none (their values are defined before the
    region and never rebound), like the pipeline objects of ``cutlass.pipeline``."""

    def __extract_mlir_values__(self) -> list:
        return []

    def __new_from_mlir_values__(self, values: list) -> ReadOnlyInRegions:
        return self


class NamedBarrier(enum.IntEnum):
    """Named barrier ids (0 is ``__syncthreads``); the ``_WG1`` members are offset by the consumer
    warpgroup index (0, 1, 2), so each warpgroup has its own epilogue and WGMMA-turn barrier."""

    EPILOGUE_WG1 = 1
    EPILOGUE_WG2 = 2
    EPILOGUE_WG3 = 3
    TURN_WG1 = 4
    TURN_WG2 = 5
    TURN_WG3 = 6
    # FP8 with Q quantised in the kernel (``_fp8_query.py``): the warpgroup's amax exchange and e4m3 Q box.
    QUANTISE_WG1 = 7
    QUANTISE_WG2 = 8
    QUANTISE_WG3 = 9


class WorkTile(NamedTuple):
    m_block: Int32
    # (head, batch): indexes the last mode of every (S, X, (H, B)) view.
    head_batch: tuple[Int32, Int32]
    # The tile's key split (``HopperAttentionConfig.key_splits``); 0 without splits.
    split: Int32 | int = 0


class TileScheduler(ReadOnlyInRegions):
    """Deals the query tiles (``query_blocks * heads * batch`` of them) to the CTAs of the grid.

    Tiles are dealt in rounds of one per CTA, forwards in even rounds and backwards in odd ones (a
    snake). The query blocks of one (batch, head) are consecutive, so the CTAs running at the same
    time share that head's K and V in L2; causal query blocks go longest first within a head, and the
    snake then hands a CTA that drew a long tile in one round a short one in the next, so the CTAs
    finish together (a plain round robin gives CTA 0 the longest tile of every round). With one CTA
    per tile (grid = tiles) every CTA gets exactly its own tile.

    ``splits`` (``HopperAttentionConfig.key_splits``, a runtime count; None, compile time, without): every query
    tile is that many tiles, one per key split, dealt (query block, split, head, batch) fastest first, so that the
    tiles that read the same K and V (one head's, one split's) stay consecutive.
    """

    def __init__(
        self, tile_m: int, causal: bool, seqlen_q: Int32, heads: Int32, batch: Int32, splits: Int32 | None = None
    ):  # fmt: skip
        self.causal = causal
        self.heads = heads
        self.splits = splits
        self.query_blocks = (seqlen_q + tile_m - 1) // tile_m
        self.tile_count = self.query_blocks * heads * batch
        if splits is not None:
            self.tile_count = self.tile_count * splits
        self.cta, _, _ = cute.arch.block_idx()
        self.ctas, _, _ = cute.arch.grid_dim()

    @staticmethod
    def tile_total(tile_m: int, seqlen_q: Int32, heads: Int32, batch: Int32, splits: Int32 | None = None) -> Int32:
        """All tiles of the launch (host side: sizes the grid): query tiles, times the key splits where given."""
        tiles = (seqlen_q + tile_m - 1) // tile_m * heads * batch
        return tiles if splits is None else tiles * splits

    @staticmethod
    def tile_of_cta(local: Int32, cta: Int32, ctas: Int32) -> Int32:
        """The ``local``-th tile of CTA ``cta`` out of ``ctas`` (the snake)."""
        backwards = local % 2
        return local * ctas + cta + backwards * (ctas - 1 - 2 * cta)

    @staticmethod
    def tiles_of_cta(cta: Int32, ctas: Int32, tile_count: Int32) -> Int32:
        """How many tiles :meth:`tile_of_cta` gives CTA ``cta``: every full round, and the last partial
        round if its slot there is below ``tile_count``."""
        rounds = tile_count // ctas
        # 1 if the slot in the partial round is inside the grid of tiles, else 0 (plain arithmetic, so
        # that it also runs on Python ints in tests).
        in_last_round = cutlass.min(1, cutlass.max(0, tile_count - TileScheduler.tile_of_cta(rounds, cta, ctas)))
        return rounds + in_last_round

    @cute.jit
    def local_tile_count(self) -> Int32:
        return self.tiles_of_cta(self.cta, self.ctas, self.tile_count)

    @cute.jit
    def work_tile(self, local_tile: Int32) -> WorkTile:
        tile = self.tile_of_cta(local_tile, self.cta, self.ctas)
        m_block = tile % self.query_blocks
        if cutlass.const_expr(self.causal):
            m_block = self.query_blocks - 1 - m_block
        head_batch = tile // self.query_blocks
        split = 0
        if cutlass.const_expr(self.splits is not None):
            split = head_batch % self.splits
            head_batch = head_batch // self.splits
        return WorkTile(m_block, (head_batch % self.heads, head_batch // self.heads), split)


class QueryBoxes(ReadOnlyInRegions):
    """The Q pipeline: one box per consumer warpgroup, reloaded once per tile.

    ``full[w]``: 1 producer arrive with expect_tx (the box's bytes), completed by the TMA load.
    ``empty[w]``: one arrive from an elected lane of each of warpgroup ``w``'s 4 warps once its last
    S = Q Kᵀ of the tile has retired. Phases come from one-stage ``PipelineState`` objects that the
    tile loops advance (the producer's starts at phase 1, so its first wait passes at once).
    """

    def __init__(self, full: cute.Pointer, empty: cute.Pointer, warpgroups: int, box_bytes: int):
        self.full = full
        self.empty = empty
        self.warpgroups = warpgroups
        self.box_bytes = box_bytes

    @cute.jit
    def init_barriers(self) -> None:
        """Called by one elected thread before the CTA-wide barrier that publishes the inits."""
        for w in cutlass.range_constexpr(self.warpgroups):
            cute.arch.mbarrier_init(self.full + w, PRODUCER_ARRIVES)
            cute.arch.mbarrier_init(self.empty + w, WARPS_PER_WARPGROUP)

    @staticmethod
    def producer_state() -> pipeline.PipelineState:
        return pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)

    @staticmethod
    def consumer_state() -> pipeline.PipelineState:
        return pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)

    @cute.jit
    def load(self, atom: cute.CopyAtom, source: cute.Tensor, box: cute.Tensor, w: int, state: pipeline.PipelineState):
        """Wait until warpgroup ``w`` has released its box, then TMA the next Q box into it."""
        cute.arch.mbarrier_wait(self.empty + w, state.phase)
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive_and_expect_tx(self.full + w, self.box_bytes)
        cute.copy(atom, source, box, tma_bar_ptr=self.full + w)

    @cute.jit
    def wait(self, w: Int32, state: pipeline.PipelineState) -> None:
        cute.arch.mbarrier_wait(self.full + w, state.phase)

    @cute.jit
    def release(self, w: Int32) -> None:
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive(self.empty + w)


# ----------------------------------------------------------------------------------------------------
# Block range and masking
# ----------------------------------------------------------------------------------------------------
class AttentionMask:
    """Writes -inf into scores of keys past the sequence's ``seqlen_k`` and, when causal, keys after
    the query row's diagonal (j > i + causal_offset).

    ``tScS``: (row, col) inside the tile of every accumulator value; ``row_start``: the first query
    row of this warpgroup's 64 rows; ``seqlen``: the sequence's :class:`SeqlenInfo`. All are bound per
    tile, so :meth:`apply` takes only the block. ``_device.AttentionMask`` is the same rule for the
    ``mma.sync`` fragment of ``pipelined``, whose coordinates it derives from thread 0's static ones
    to save registers; the WGMMA layout differs.

    ``packed_seqlen_q`` (cute/decode's GQA packing on WGMMA, ``_decode_wgmma.py``; compile time None elsewhere): the
    rows are (head in group) · Sq + token, so the causal diagonal follows the row's token, ``row % seqlen_q``.
    """

    def __init__(
        self, tile_n: int, causal: bool, tScS: cute.Tensor, row_start: Int32, seqlen: SeqlenInfo,
        packed_seqlen_q: Int32 | None = None,
    ):  # fmt: skip
        self.tile_n = tile_n
        self.causal = causal
        self.tScS = tScS
        self.row_start = row_start
        self.seqlen = seqlen
        self.packed_seqlen_q = packed_seqlen_q

    @cute.jit
    def apply(self, acc_S: cute.Tensor, n_block: Int32):
        rS = rows_by_cols(acc_S)
        cS = rows_by_cols(self.tScS)
        col_start = n_block * self.tile_n
        for r in cutlass.range_constexpr(cute.size(rS, mode=[0])):
            # Keys col < key_limit count for this row.
            key_limit = self.seqlen.seqlen_k - col_start
            if cutlass.const_expr(self.causal):
                # Row i sees keys j < i + 1 + causal_offset.
                row = self.row_start + cS[r, 0][0]
                if cutlass.const_expr(self.packed_seqlen_q is not None):
                    row = row % self.packed_seqlen_q
                diagonal_end = row + 1
                if cutlass.const_expr(self.seqlen.bottom_right):
                    diagonal_end = diagonal_end + self.seqlen.causal_offset
                key_limit = cutlass.min(key_limit, diagonal_end - col_start)
            for c in cutlass.range_constexpr(cute.size(rS, mode=[1])):
                # A select, not an `if`: the DSL lowers a dynamic `if` that writes one element of a
                # register tensor to selects over the whole tensor (16 FSEL per element here).
                rS[r, c] = Float32(cutlass.select_(cS[r, c][1] >= key_limit, -Float32.inf, rS[r, c]))


# ----------------------------------------------------------------------------------------------------
# Online softmax
# ----------------------------------------------------------------------------------------------------
class OnlineSoftmax:
    """Running ``row_max`` and (thread-partial) ``row_sum`` of one warpgroup's rows.

    ``row_max`` is the maximum of S * softmax_scale_log2: log2 units of the scaled scores, as in every
    stack. ``row_sum`` stays a per-thread partial sum until :meth:`finalize`: the rescale factor is
    the same for the four lanes of a row, so the cross-lane sum is needed only once, at the end.

    Lazy rescaling: ``row_max`` is the reference P is taken against, and it only moves when a block's
    maximum exceeds it by more than ``rescale_threshold`` (log2 units). Until then P = exp2(scaled S -
    row_max) stays <= 2^threshold and O keeps its scale, so :meth:`rescale` skips the row; on random
    data the maximum settles within a few blocks. The result is exact: O, ``row_sum`` and the
    log-sum-exp always share one reference.

    ``_device.OnlineSoftmax`` is the ``mma.sync`` counterpart (``pipelined``): a different fragment
    layout, no FP8 P offset or key-block scales, and no LSE. The two share names and ``row_max`` units.
    """

    def __init__(
        self, rows: int, softmax_scale_log2: Float32, p_exponent_offset: float = 0.0, rescale_threshold: float = 0.0
    ):
        self.softmax_scale_log2 = softmax_scale_log2
        # P = exp2(scaled S - row_max + offset); the offset cancels in O / row_sum.
        self.p_exponent_offset = p_exponent_offset
        self.rescale_threshold = rescale_threshold
        self.rows = rows
        self.row_max = cute.make_rmem_tensor(rows, Float32)
        self.row_sum = cute.make_rmem_tensor(rows, Float32)
        self.row_max.fill(-Float32.inf)
        self.row_sum.fill(0.0)

    @cute.jit
    def update(self, acc_S: cute.Tensor, key_scale: Float32 | None = None) -> cute.Tensor:
        """S -> P in place (exp2 with the scale folded in) and row_sum; returns O's rescale factor
        per row (exactly 1 where the reference did not move) for :meth:`rescale`: 16-bit before the
        next O += P V is issued, FP8 once the in-flight one has retired.

        ``key_scale`` (FP8 block quantisation): this key block's K scale. It joins the scale of the
        block's scores, so ``row_max`` stays in units that every block shares at no cost per score."""
        rS = rows_by_cols(acc_S)
        score_scale_log2 = self.softmax_scale_log2
        if cutlass.const_expr(key_scale is not None):
            score_scale_log2 = self.softmax_scale_log2 * key_scale
        # Local names: the DSL's dynamic `if` below may write tensors, but not attributes of self.
        row_max, row_sum = self.row_max, self.row_sum
        row_scale = cute.make_rmem_tensor(self.rows, Float32)
        for r in cutlass.range_constexpr(cute.size(rS, mode=[0])):
            block_max = tree_reduce(row_values(rS, r), cute.arch.fmax)
            block_max = cute.arch.warp_reduction_max(block_max, threads_in_group=THREADS_PER_ROW)
            # The maximum of the scaled scores: a positive scale commutes with the max.
            block_max = block_max * score_scale_log2
            row_scale[r] = Float32(1.0)
            # The first block with a visible key always moves the reference (-inf + threshold = -inf).
            # The factor is then exp2(-inf) = 0 for a reference of -inf: nothing was accumulated yet.
            if block_max > row_max[r] + self.rescale_threshold:
                factor = cute.math.exp2(row_max[r] - block_max, fastmath=True)
                row_sum[r] = row_sum[r] * factor
                row_scale[r] = factor
                row_max[r] = block_max
            # A row with every key masked so far has max -inf: 0 in its place keeps exp2(-inf) = 0, not NaN.
            reference = row_max[r]
            if row_max[r] == -Float32.inf:
                reference = Float32(0.0)
            p_base = reference - self.p_exponent_offset
            for c in cutlass.range_constexpr(cute.size(rS, mode=[1])):
                rS[r, c] = cute.math.exp2(rS[r, c] * score_scale_log2 - p_base, fastmath=True)
            row_sum[r] = row_sum[r] + tree_reduce(row_values(rS, r), operator.add)
        return row_scale

    @cute.jit
    def rescale(
        self,
        acc_O: cute.Tensor,
        row_scale: cute.Tensor,
        acc_PV: cute.Tensor | None = None,
        pv_scale: Float32 | None = None,
    ):
        """O *= row_scale row by row, skipped when no row of this warp moved its reference in the
        last :meth:`update` (one warp-uniform branch: no divergence, and ptxas keeps the block whole).

        With ``acc_PV`` (the previous block's P V accumulated apart), O = (O + P V) * row_scale; with
        ``pv_scale`` (FP8 block quantisation: that block's V scale), O = (O + P V * pv_scale) * row_scale.
        """
        rO = rows_by_cols(acc_O)
        rows = cute.size(rO, mode=[0])
        if cutlass.const_expr(acc_PV is not None):
            add_block_product(acc_O, acc_PV, pv_scale)
        moved = row_scale[0] != 1.0
        for r in cutlass.range_constexpr(1, rows):
            moved = moved | (row_scale[r] != 1.0)
        if cute.arch.vote_any_sync(moved):
            for r in cutlass.range_constexpr(rows):
                for c in cutlass.range_constexpr(cute.size(rO, mode=[1])):
                    rO[r, c] = rO[r, c] * row_scale[r]

    @cute.jit
    def finalize(self, acc_O: cute.Tensor, output_scale: Float32) -> cute.Tensor:
        """O /= row_sum (times ``output_scale``, the FP8 V descale); returns each row's natural-log
        LSE = ln(sum exp(scaled S)) = (row_max + log2(row_sum)) * ln 2."""
        rO = rows_by_cols(acc_O)
        lse = cute.make_rmem_tensor(self.rows, Float32)
        for r in cutlass.range_constexpr(cute.size(rO, mode=[0])):
            total = cute.arch.warp_reduction_sum(self.row_sum[r], threads_in_group=THREADS_PER_ROW)
            # Rows past Sq (padding of the last query block) have total 0: write 0 and lse -inf.
            inverse = Float32(0.0)
            lse[r] = -Float32.inf
            if total > 0.0:
                inverse = output_scale / total
                log2_sum = cute.math.log2(total, fastmath=True) - self.p_exponent_offset
                lse[r] = (self.row_max[r] + log2_sum) * LN_2
            for c in cutlass.range_constexpr(cute.size(rO, mode=[1])):
                rO[r, c] = rO[r, c] * inverse
        return lse


@cute.jit
def fold_block_product(
    acc_O: cute.Tensor, acc_PV: cute.Tensor, o_scale: cute.Tensor, v_scale: cute.Tensor, pv_scale: Float32 | None
):
    """``fold_v_scale``: O, held as O / s_v(last) and owing ``o_scale``'s row factors, takes one key block's P V in
    one FMA a value, O = O · (factor · s_v(last) / s_v(this)) + P V (``pv_scale``: this block's V scale; None with
    per-tensor scales, which the output scale carries), and this block's frame becomes the last."""
    rO, rPV = rows_by_cols(acc_O), rows_by_cols(acc_PV)
    ratio = Float32(1.0)
    if cutlass.const_expr(pv_scale is not None):
        # An approximate reciprocal (1 ulp): IEEE division's slow path is a call with a stack frame, and an ulp a
        # block of O's frame is far inside e4m3's error.
        ratio = v_scale[0] * cute.arch.rcp_approx(pv_scale)
        v_scale[0] = pv_scale
    for r in cutlass.range_constexpr(cute.size(rO, mode=[0])):
        factor = o_scale[r] * ratio
        for c in cutlass.range_constexpr(cute.size(rO, mode=[1])):
            rO[r, c] = rO[r, c] * factor + rPV[r, c]


@cute.jit
def add_block_product(acc_O: cute.Tensor, acc_PV: cute.Tensor, pv_scale: Float32 | None = None):
    """O += P V of one key block (times its V scale with FP8 block quantisation: one FMA per value)."""
    if cutlass.const_expr(pv_scale is None):
        acc_O.store(acc_O.load() + acc_PV.load())
    else:
        acc_O.store(acc_O.load() + acc_PV.load() * pv_scale)


class BlockScales:
    """FP8 block quantisation: the scales of one (batch, KV head)'s key blocks of K and of V, read from
    global memory (L1-cached, two floats per block) where each block is processed."""

    def __init__(self, key_scales: cute.Tensor, value_scales: cute.Tensor):
        self.key_scales = key_scales
        self.value_scales = value_scales

    def key(self, n_block: Int32) -> Float32:
        return self.key_scales[n_block]

    def value(self, n_block: Int32) -> Float32:
        return self.value_scales[n_block]


class Fp8Descales(ReadOnlyInRegions):
    """FP8: the e4m3 descales of Q, K and V, ``(blocks, (H, B))`` fp32 views for Q and ``(blocks,
    (Hkv, B))`` for K and V, which are quantised per KV head (one block when per tensor).
    :meth:`for_tile` folds what is constant over a tile into its softmax and output scales: per tensor
    all three; with block scales Q's 64-row scale, while K's and V's are read per key block
    (``BlockScales``). ``bh`` indexes Q's scales, ``kv_bh`` (the tile's KV head) K's and V's."""

    def __init__(self, q_scales: cute.Tensor, k_scales: cute.Tensor, v_scales: cute.Tensor, block: bool):
        self.q_scales = q_scales
        self.k_scales = k_scales
        self.v_scales = v_scales
        self.block = block

    def for_tile(
        self,
        softmax_scale_log2: Float32,
        output_scale: Float32,
        q_block: Int32,
        bh: tuple[Int32, Int32],
        kv_bh: tuple[Int32, Int32],
        q_scale: Float32 | None = None,
    ) -> TileScales:
        """``q_scale``: Q's block scale where the kernel quantised Q itself, else read here."""
        if self.block:
            scales = BlockScales(self.k_scales[None, kv_bh], self.v_scales[None, kv_bh])
            if q_scale is None:
                q_scale = self.q_scales[q_block, bh]
            return TileScales(softmax_scale_log2 * q_scale, output_scale, scales)
        scale_log2 = softmax_scale_log2 * self.q_scales[0, bh] * self.k_scales[0, kv_bh]
        return TileScales(scale_log2, output_scale * self.v_scales[0, kv_bh], None)

    @cute.jit
    def store_query_scale(self, q_scale: Float32, q_block: Int32, bh: tuple[Int32, Int32], wg_tidx: Int32) -> None:
        """Q quantised in the kernel: one thread writes its block's scale (none for a block past Sq)."""
        # A compile-time and a runtime test cannot share one `if` in the DSL; nor can two runtime ones.
        if wg_tidx == 0:  # noqa: SIM102
            if q_block < self.q_scales.shape[0]:
                self.q_scales[q_block, bh] = q_scale


class TileScales(NamedTuple):
    """One tile's scales (:meth:`Fp8Descales.for_tile`): its softmax_scale_log2 and output scale, and
    the per-key-block K and V scales (None when per tensor)."""

    softmax_scale_log2: Float32
    output_scale: Float32
    block_scales: BlockScales | None


# ----------------------------------------------------------------------------------------------------
# Views, copies, GEMMs, epilogue
# ----------------------------------------------------------------------------------------------------
def sequence_major(t: cute.Tensor) -> cute.Tensor:
    """(B, H, S, D) -> (S, D, (H, B)): TMA boxes tile (S, D); head and batch index the rest."""
    layout = cute.make_layout(
        (t.shape[2], t.shape[3], (t.shape[1], t.shape[0])),
        stride=(t.stride[2], t.stride[3], (t.stride[1], t.stride[0])),
    )
    return cute.make_tensor(t.iterator, layout)


def value_operand_view(t: cute.Tensor, transposed: bool) -> cute.Tensor:
    """V as the B operand of O = P V, shaped (D, Sk, (H, B)) whatever its memory order."""
    if transposed:  # (B, H, D, Sk): Sk contiguous, K-major
        shape, stride = (t.shape[2], t.shape[3]), (t.stride[2], t.stride[3])
    else:  # (B, H, Sk, D): D contiguous, MN-major
        shape, stride = (t.shape[3], t.shape[2]), (t.stride[3], t.stride[2])
    layout = cute.make_layout((*shape, (t.shape[1], t.shape[0])), stride=(*stride, (t.stride[1], t.stride[0])))
    return cute.make_tensor(t.iterator, layout)


def head_major(t: cute.Tensor | None) -> cute.Tensor | None:
    """(B, H, X) -> (X, (H, B)), the (head, batch) mode indexed like the operands' (LSE, FP8 scales)."""
    if t is None:
        return None
    layout = cute.make_layout((t.shape[2], (t.shape[1], t.shape[0])), stride=(t.stride[2], (t.stride[1], t.stride[0])))
    return cute.make_tensor(t.iterator, layout)


def warpgroup_mmas(
    dtype: type[cutlass.Numeric], tile_n: int, head_dim: int, v_major: cute.nvgpu.OperandMajorMode,
    warpgroups: int = 1,
) -> tuple[cute.TiledMma, cute.TiledMma]:  # fmt: skip
    """One consumer warpgroup's tiled WGMMAs: S = Q Kᵀ (64 x tile_n, both operands from shared
    memory, K-major) and O = P V (64 x D, P from registers, V K-major for FP8 and MN-major else);
    ``warpgroups`` > 1: that many warpgroups stacked along M, each its own 64 rows (cute/decode's two
    warpgroups, ``_decode_wgmma.py``)."""
    k_major, atoms = cute.nvgpu.OperandMajorMode.K, (warpgroups, 1, 1)
    qk_mma = sm90_utils.make_trivial_tiled_mma(
        dtype, dtype, k_major, k_major, Float32, atoms, (ROWS_PER_WARPGROUP, tile_n)
    )
    pv_mma = sm90_utils.make_trivial_tiled_mma(
        dtype, dtype, k_major, v_major, Float32, atoms, (ROWS_PER_WARPGROUP, head_dim), warpgroup.OperandSource.RMEM
    )
    return qk_mma, pv_mma


def one_stage(layout: cute.ComposedLayout) -> cute.ComposedLayout:
    """Stage 0 of a staged (rows, cols, stage) layout: the box one TMA copy moves."""
    return cute.slice_(layout, (None, None, 0))


class SharedLayouts(NamedTuple):
    """The staged shared-memory layouts, swizzled so that WGMMA reads them without bank conflicts:
    Q and O (64, D, warpgroup), a box per consumer warpgroup; K (tile_n, D, stage) and V (D, tile_n,
    stage), a box per ring slot."""

    q: cute.ComposedLayout
    k: cute.ComposedLayout
    v: cute.ComposedLayout
    o: cute.ComposedLayout

    @staticmethod
    def create(
        dtype: type[cutlass.Numeric],
        out_dtype: type[cutlass.Numeric],
        tile_n: int,
        head_dim: int,
        warpgroups: int,
        kv_stages: int,
        v_layout: LayoutEnum,
    ) -> SharedLayouts:
        rows, D, row_major = ROWS_PER_WARPGROUP, head_dim, LayoutEnum.ROW_MAJOR
        return SharedLayouts(
            q=sm90_utils.make_smem_layout_a(row_major, (rows, tile_n, D), dtype, warpgroups),
            k=sm90_utils.make_smem_layout_b(row_major, (rows, tile_n, D), dtype, kv_stages),
            v=sm90_utils.make_smem_layout_b(v_layout, (rows, D, tile_n), dtype, kv_stages),
            o=sm90_utils.make_smem_layout_a(row_major, (rows, D, D), out_dtype, warpgroups),
        )

    def storage(
        self,
        dtype: type[cutlass.Numeric],
        out_dtype: type[cutlass.Numeric],
        warpgroups: int,
        kv_stages: int,
        o_aliases_q: bool,
        extra_fields: dict | None = None,
    ) -> type:
        """The kernel's shared-memory struct: the Q boxes' full/empty barriers, the K and V rings'
        barriers (full and empty per stage), then Q, K, V and O, each 1024-byte aligned (swizzle), then
        ``extra_fields`` (FP8 with Q quantised in the kernel: ``_fp8_query.QueryLayouts.storage_fields``)."""
        q_cosize, k_cosize, v_cosize = cute.cosize(self.q), cute.cosize(self.k), cute.cosize(self.v)
        # 16-bit: O reuses its warpgroup's Q box (dead after the last Q Kᵀ), which is what makes room
        # for larger K/V tiles or more stages. FP8 or persistent: O has its own boxes.
        o_cosize = 0 if o_aliases_q else cute.cosize(self.o)

        fields = {
            "q_full": cute.struct.MemRange[cutlass.Int64, warpgroups],
            "q_empty": cute.struct.MemRange[cutlass.Int64, warpgroups],
            "k_barriers": cute.struct.MemRange[cutlass.Int64, 2 * kv_stages],
            "v_barriers": cute.struct.MemRange[cutlass.Int64, 2 * kv_stages],
            "sQ": cute.struct.Align[cute.struct.MemRange[dtype, q_cosize], SMEM_ALIGN_BYTES],
            "sK": cute.struct.Align[cute.struct.MemRange[dtype, k_cosize], SMEM_ALIGN_BYTES],
            "sV": cute.struct.Align[cute.struct.MemRange[dtype, v_cosize], SMEM_ALIGN_BYTES],
            "sO": cute.struct.Align[cute.struct.MemRange[out_dtype, o_cosize], SMEM_ALIGN_BYTES],
            **(extra_fields or {}),
        }
        # The fields are given as a dict: in a class body, this module's postponed annotations would
        # reach cute.struct as strings.
        return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))


def tma_partition(atom: cute.CopyAtom, smem: cute.Tensor, gmem: cute.Tensor) -> tuple[cute.Tensor, cute.Tensor]:
    """(TMA, stage) view of a staged SMEM tensor and (TMA, tile) view of a tiled global one."""
    return cpasync.tma_partition(
        atom, 0, cute.make_layout(1), cute.group_modes(smem, 0, 2), cute.group_modes(gmem, 0, 2)
    )


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
    tiled_mma: cute.TiledMma,
    acc: cute.Tensor,
    *,
    tA: cute.Tensor,
    tB: cute.Tensor,
    stage: Int32,
    accumulate: cutlass.Constexpr[bool],
):
    """Issue one warpgroup GEMM acc (+)= A B[stage] over all k-blocks (async); the caller waits on the
    group. The accumulate flag lives on a fresh MMA atom: flipping it on the shared tiled MMA inside a
    runtime loop would leak a loop-local value out of the loop."""
    mma_atom = cute.make_mma_atom(tiled_mma.op)
    tB_stage = tB[None, None, None, stage]
    warpgroup.fence()
    for k in cutlass.range_constexpr(cute.size(tA, mode=[2])):
        mma_atom.set(warpgroup.Field.ACCUMULATE, accumulate or k != 0)
        cute.gemm(mma_atom, acc, tA[None, None, k], tB_stage[None, None, k], acc)
    warpgroup.commit_group()


def tma_pipeline(
    barriers: cute.Pointer, *, stages: int, consumer_warps: int, tx_bytes: int
) -> pipeline.PipelineTmaAsync:
    """A ring of ``stages`` shared-memory slots filled by TMA: full barrier 1 producer arrive +
    expect_tx(``tx_bytes``); empty barrier one arrive per consumer warp. Initialised without a CTA
    barrier: the kernel fences and syncs once after all its barriers."""
    return pipeline.PipelineTmaAsync.create(
        barrier_storage=barriers,
        num_stages=stages,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, PRODUCER_ARRIVES),
        consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, consumer_warps),
        tx_count=tx_bytes,
        defer_sync=True,
    )


def tma_ring(
    barriers: cute.Pointer, *, stages: int, consumer_warps: int, tx_bytes: int
) -> tuple[pipeline.PipelineProducer, pipeline.PipelineConsumer]:
    """:func:`tma_pipeline`'s producer and consumer."""
    return tma_pipeline(barriers, stages=stages, consumer_warps=consumer_warps, tx_bytes=tx_bytes).make_participants()


class WarpgroupGemms(NamedTuple):
    """One consumer warpgroup's GEMMs with their operands bound once: ``qk(acc_S, stage)`` issues
    S = Q K[stage]ᵀ, ``pv(acc, stage)`` O (+)= P V[stage]; the turns gate their issue (ping-pong)."""

    qk: Callable[..., None]
    pv: Callable[..., None]
    acc_S_shape: cute.Shape
    acc_O: cute.Tensor  # ((2, 2, D/8), 1, 1) fp32
    tOrP: cute.Tensor  # P in the A-operand register layout
    turns: WarpgroupTurns
    # 16-bit: the factor per row that O still owes the last softmax update; applied just before the
    # next O += P V is issued, while S = Q Kᵀ runs on the tensor cores. FP8 with ``fold_v_scale``: applied in
    # :func:`fold_block_product`.
    o_scale: cute.Tensor  # (ROWS_PER_THREAD,) fp32
    # FP8 with ``fold_v_scale``: the V scale of the last key block O holds (its frame), else None.
    v_scale: cute.Tensor | None = None  # (1,) fp32


class OutputEpilogue(ReadOnlyInRegions):
    """Step 4 of one consumer warpgroup: O in the output dtype -> ``stmatrix`` into the warpgroup's O
    box -> TMA store issued by its first warp, and the LSE straight from registers.

    The store is left in flight; a persistent CTA waits for it to have read the box only before it
    writes the next tile's O there (``cp.async.bulk.wait_group.read``, then the epilogue barrier).
    """

    def __init__(
        self, tma_atom_O: cute.CopyAtom, thr_store: Any, sO: cute.Tensor, w: Int32, wg_tidx: Int32, persistent: bool
    ):
        self.tma_atom_O = tma_atom_O
        self.thr_store = thr_store
        self.sO = sO  # (64, D, warpgroup)
        self.w = w
        self.wg_tidx = wg_tidx
        self.persistent = persistent
        self.barrier = NamedBarrier.EPILOGUE_WG1 + w

    @cute.jit
    def store_lse(self, gLSE: cute.Tensor, lse: cute.Tensor, tOcO: cute.Tensor, row_start: Int32, seqlen_q: Int32):
        """One lane of each row's four writes its rows' log-sum-exp (rows past Sq are skipped)."""
        cO = rows_by_cols(tOcO)
        if cO[0, 0][1] == 0:
            for r in cutlass.range_constexpr(ROWS_PER_THREAD):
                row = row_start + cO[r, 0][0]
                if row < seqlen_q:
                    gLSE[row] = lse[r]

    @cute.jit
    def store_partial(self, acc_O: cute.Tensor, gO: cute.Tensor, tOcO: cute.Tensor, row_start: Int32, seqlen_q: Int32):
        """Key splits: the normalised fp32 O straight from the accumulator into the split's (Sq, D) partial ``gO``,
        rows past Sq skipped (stmatrix and the TMA store move 16-bit values; the merge reads fp32)."""
        rO, cO = rows_by_cols(acc_O), rows_by_cols(tOcO)
        for r in cutlass.range_constexpr(cute.size(rO, mode=[0])):
            row = row_start + cO[r, 0][0]
            if row < seqlen_q:
                for c in cutlass.range_constexpr(cute.size(rO, mode=[1])):
                    gO[row, cO[r, c][1]] = rO[r, c]

    @cute.jit
    def store_output(self, acc_O: cute.Tensor, gO_head: cute.Tensor, m_block: Int32):
        first_warp = self.wg_tidx < cute.arch.WARP_SIZE
        if cutlass.const_expr(self.persistent):
            if first_warp:
                cute.arch.cp_async_bulk_wait_group(0, read=True)
            cute.arch.barrier(barrier_id=self.barrier, number_of_threads=THREADS_PER_WARPGROUP)
        rO = cute.make_rmem_tensor_like(acc_O, self.sO.element_type)
        rO.store(acc_O.load().to(self.sO.element_type))
        cute.copy(self.thr_store, self.thr_store.retile(rO), self.thr_store.partition_D(self.sO[None, None, self.w]))
        # The TMA unit reads SMEM through the async proxy: make the generic-proxy writes visible.
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(barrier_id=self.barrier, number_of_threads=THREADS_PER_WARPGROUP)
        if first_warp:
            head_dim, warpgroups = cute.size(self.sO, mode=[1]), cute.size(self.sO, mode=[2])
            gO = cute.local_tile(gO_head, (ROWS_PER_WARPGROUP, head_dim), (None, 0))  # (64, D, Sq/64)
            tOsO, tOgO = tma_partition(self.tma_atom_O, self.sO, gO)
            cute.copy(self.tma_atom_O, tOsO[None, self.w], tOgO[None, m_block * warpgroups + self.w])
            cute.arch.cp_async_bulk_commit_group()


# ----------------------------------------------------------------------------------------------------
# Ping-pong scheduling
# ----------------------------------------------------------------------------------------------------
class WarpgroupTurns:
    """The consumer warpgroups take turns issuing WGMMA, round robin (``NamedBarrier.TURN_WG1 + w``).

    ``wait`` blocks until the previous warpgroup has issued its GEMMs (``pass_on``), so the tensor
    cores run one warpgroup's GEMMs while the others compute their softmax. Each barrier completes
    with the 128 threads that wait plus the 128 that arrive. The last warpgroup arrives once up front
    (warpgroup 0 goes first) and warpgroup 0 consumes the last arrive in ``finish``, so every barrier
    balances. A warpgroup cannot arrive twice on its successor's barrier before the successor has
    waited once: its own next turn needs the turn to come all the way round.
    """

    def __init__(self, enabled: bool, warpgroup: Int32, count: int, threads_per_warpgroup: int):
        self.enabled = enabled
        self.warpgroup = warpgroup
        self.count = count
        self.threads = 2 * threads_per_warpgroup

    @cute.jit
    def start(self):
        # A compile-time and a runtime test cannot share one `if` in the DSL.
        if cutlass.const_expr(self.enabled):  # noqa: SIM102
            if self.warpgroup == self.count - 1:
                cute.arch.barrier_arrive(barrier_id=NamedBarrier.TURN_WG1, number_of_threads=self.threads)

    @cute.jit
    def wait(self):
        if cutlass.const_expr(self.enabled):
            cute.arch.barrier(barrier_id=NamedBarrier.TURN_WG1 + self.warpgroup, number_of_threads=self.threads)

    @cute.jit
    def pass_on(self):
        if cutlass.const_expr(self.enabled):
            successor = (self.warpgroup + 1) % self.count
            cute.arch.barrier_arrive(barrier_id=NamedBarrier.TURN_WG1 + successor, number_of_threads=self.threads)

    @cute.jit
    def finish(self):
        if cutlass.const_expr(self.enabled):  # noqa: SIM102
            if self.warpgroup == 0:
                cute.arch.barrier(barrier_id=NamedBarrier.TURN_WG1, number_of_threads=self.threads)
