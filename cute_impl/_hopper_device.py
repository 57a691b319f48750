"""Device helpers shared by the CuTe DSL Hopper rungs (``hopper.py`` and ``fp8.py``).

Three small objects keep the kernel readable: :class:`KeyBlockRange` says which key blocks a query
block visits and which of them need a mask, :class:`AttentionMask` writes ``-inf`` where a score must
not count, and :class:`OnlineSoftmax` carries ``row_max``/``row_sum`` across key blocks. The
fragment helpers translate between the WGMMA accumulator layout and (row, column) views.

WGMMA accumulator layout (m64nNk16, one warpgroup): a thread holds, for every 8-column block ``c``,
the four values ``(row r0, col 8c + 2t)``, ``(r0, 8c + 2t + 1)``, ``(r0 + 8, 8c + 2t)``,
``(r0 + 8, 8c + 2t + 1)`` with ``t = lane % 4`` and ``r0 = 16 * warp + lane // 4``. The mode shape is
``((2, 2, N/8), MMA_M, MMA_N)``: column pair, row half, column block. Four neighbouring lanes share a
row, so a row reduction is a thread-local loop plus two butterfly shuffles.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

LN_2 = math.log(2.0)
# Lanes that share one accumulator row (t = lane % 4).
THREADS_PER_ROW = 4


# ----------------------------------------------------------------------------------------------------
# Fragment views
# ----------------------------------------------------------------------------------------------------
def rows_cols_view(tensor: cute.Tensor) -> cute.Tensor:
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
        columns_per_chunk = 4  # 8-column accumulator blocks per 32-wide fp8 k-block
        for k in cutlass.range_constexpr(cute.size(acc_S, mode=[0]) // (4 * columns_per_chunk)):
            for c in cutlass.range_constexpr(columns_per_chunk):
                for r in cutlass.range_constexpr(2):
                    for j in cutlass.range_constexpr(2):
                        source = j + 2 * r + 4 * (columns_per_chunk * k + c)
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
# Tile order and key block range
# ----------------------------------------------------------------------------------------------------
class TileOrder:
    """Linear tile index in [0, query_blocks * heads * batch) -> (query block, (head, batch)).

    The query blocks of one (batch, head) are consecutive, so the CTAs running at the same time share
    that head's K and V in L2. Causal query blocks go longest first within a head: the short ones then
    fill the end of the schedule instead of leaving SMs idle behind a long one.
    """

    def __init__(self, tile_m: int, causal: bool):
        self.tile_m = tile_m
        self.causal = causal

    def query_blocks(self, seqlen_q: Int32) -> Int32:
        return (seqlen_q + self.tile_m - 1) // self.tile_m

    @staticmethod
    def tile_of_cta(local: Int32, cta: Int32, ctas: Int32) -> Int32:
        """The ``local``-th tile of CTA ``cta`` out of ``ctas``: tiles are dealt in rounds of ``ctas``,
        forwards in even rounds and backwards in odd ones (a snake). With causal tiles sorted longest
        first, a CTA that drew a long tile in one round draws a short one in the next, so the CTAs
        finish together; a plain round robin gives CTA 0 the longest tile of every round."""
        backwards = local % 2
        return local * ctas + cta + backwards * (ctas - 1 - 2 * cta)

    @staticmethod
    def tiles_of_cta(cta: Int32, ctas: Int32, tile_count: Int32) -> Int32:
        """How many tiles :meth:`tile_of_cta` gives CTA ``cta``: every full round, and the last partial
        round if its slot there is below ``tile_count``."""
        rounds = tile_count // ctas
        # 1 if the slot in the partial round is inside the grid of tiles, else 0 (plain arithmetic, so
        # that it also runs on Python ints in tests).
        in_last_round = cutlass.min(1, cutlass.max(0, tile_count - TileOrder.tile_of_cta(rounds, cta, ctas)))
        return rounds + in_last_round

    def coordinates(self, tile: Int32, query_blocks: Int32, heads: Int32) -> tuple[Int32, tuple[Int32, Int32]]:
        m_block = tile % query_blocks
        if cutlass.const_expr(self.causal):
            m_block = query_blocks - 1 - m_block
        head_batch = tile // query_blocks
        return m_block, (head_batch % heads, head_batch // heads)


class KeyBlockRange:
    """Key blocks [0, count) visited by one query block; the last ``masked`` ones need a mask.

    Blocks are visited from the last to the first, so the blocks that need a mask (the ragged end of
    Sk and, when causal, the diagonal) come first and the rest of the loop runs without one.
    """

    def __init__(self, tile_m: int, tile_n: int, causal: bool):
        self.tile_m = tile_m
        self.tile_n = tile_n
        self.causal = causal

    def count(self, m_block: Int32, seqlen_k: Int32) -> Int32:
        visible_keys = seqlen_k
        if cutlass.const_expr(self.causal):
            # Causal (top-left): the block's last row (m_block + 1) * tile_m - 1 sees keys up to itself.
            visible_keys = cutlass.min(seqlen_k, (m_block + 1) * self.tile_m)
        return (visible_keys + self.tile_n - 1) // self.tile_n

    def counts(self, m_block: Int32, seqlen_k: Int32) -> tuple[Int32, Int32]:
        """(blocks visited, blocks that need a mask)."""
        n_block_count = self.count(m_block, seqlen_k)
        return n_block_count, self.masked(m_block, n_block_count)

    def masked(self, m_block: Int32, n_block_count: Int32) -> Int32:
        if cutlass.const_expr(not self.causal):
            # Only the last key block can be ragged.
            return Int32(1)
        # Blocks that reach past the block's first row cross the diagonal; at least one block is
        # masked so that a ragged Sk is always covered.
        first_crossing = cutlass.min(n_block_count, (m_block * self.tile_m) // self.tile_n)
        return cutlass.max(n_block_count - first_crossing, 1)


# ----------------------------------------------------------------------------------------------------
# Masking
# ----------------------------------------------------------------------------------------------------
class AttentionMask:
    """Writes -inf into scores of keys past Sk and, when causal, keys after the query row."""

    def __init__(self, tile_n: int, causal: bool):
        self.tile_n = tile_n
        self.causal = causal

    @cute.jit
    def apply(self, acc_S: cute.Tensor, tScS: cute.Tensor, row_start: Int32, n_block: Int32, seqlen_k: Int32):
        """``tScS``: (row, col) of every accumulator element inside the tile; ``row_start``: its first row."""
        rS = rows_cols_view(acc_S)
        cS = rows_cols_view(tScS)
        col_start = n_block * self.tile_n
        for r in cutlass.range_constexpr(cute.size(rS, mode=[0])):
            # Keys col < key_limit count for this row.
            key_limit = seqlen_k - col_start
            if cutlass.const_expr(self.causal):
                key_limit = cutlass.min(key_limit, row_start + cS[r, 0][0] + 1 - col_start)
            for c in cutlass.range_constexpr(cute.size(rS, mode=[1])):
                # A select, not an `if`: the DSL lowers a dynamic `if` that writes one element of a
                # register tensor to selects over the whole tensor (16 FSEL per element here).
                rS[r, c] = Float32(cutlass.select_(cS[r, c][1] >= key_limit, -Float32.inf, rS[r, c]))


# ----------------------------------------------------------------------------------------------------
# Online softmax
# ----------------------------------------------------------------------------------------------------
class OnlineSoftmax:
    """Running ``row_max`` and (thread-partial) ``row_sum`` of one warpgroup's rows.

    ``row_sum`` stays a per-thread partial sum until :meth:`finalize`: the rescale factor is the same
    for the four lanes of a row, so the cross-lane sum is needed only once, at the end.

    Lazy rescaling: ``row_max`` is the reference P is taken against, and it only moves when a block's
    maximum exceeds it by more than ``rescale_threshold`` (log2 units of the scaled scores). Until
    then P = exp2(scaled S - scaled reference) stays <= 2^threshold and O keeps its scale, so
    :meth:`rescale_output` skips the row; on random data the maximum settles within a few blocks.
    The result is exact: O, ``row_sum`` and the log-sum-exp always share one reference.
    """

    def __init__(
        self, softmax_scale_log2: Float32, rows: int, p_exponent_offset: float = 0.0, rescale_threshold: float = 0.0
    ):
        self.softmax_scale_log2 = softmax_scale_log2
        # P = exp2(scaled S - scaled max + offset); the offset cancels in O / row_sum.
        self.p_exponent_offset = p_exponent_offset
        self.rescale_threshold = rescale_threshold
        self.row_max = cute.make_rmem_tensor(rows, Float32)
        self.row_sum = cute.make_rmem_tensor(rows, Float32)
        self.correction = cute.make_rmem_tensor(rows, Float32)
        self.row_max.fill(-Float32.inf)
        self.row_sum.fill(0.0)

    @cute.jit
    def step(self, acc_S: cute.Tensor, key_scale: Float32 | None = None):
        """S -> P in place (exp2 with the scale folded in) and row_sum; O's rescale factor is kept in
        ``correction`` (exactly 1 where the reference did not move) for :meth:`rescale_output`, which
        runs once the in-flight O += P V has retired.

        ``key_scale`` (FP8 block quantisation): this key block's K scale. It multiplies the block max
        (positive, so it commutes with the max) and joins the exp2 factor, so ``row_max`` stays in
        units that every block shares at no cost per score."""
        rS = rows_cols_view(acc_S)
        scale_log2 = self.softmax_scale_log2
        score_scale_log2 = scale_log2
        if cutlass.const_expr(key_scale is not None):
            score_scale_log2 = scale_log2 * key_scale
        # Local names: the DSL's dynamic `if` below may write tensors, but not attributes of self.
        row_max, row_sum, correction = self.row_max, self.row_sum, self.correction
        for r in cutlass.range_constexpr(cute.size(rS, mode=[0])):
            block_max = tree_reduce(row_values(rS, r), cute.arch.fmax)
            block_max = cute.arch.warp_reduction_max(block_max, threads_in_group=THREADS_PER_ROW)
            if cutlass.const_expr(key_scale is not None):
                block_max = block_max * key_scale
            correction[r] = Float32(1.0)
            # The first block with a visible key always moves the reference (-inf + threshold = -inf).
            # The factor is then exp2(-inf) = 0 for a reference of -inf: nothing was accumulated yet.
            if block_max * scale_log2 > row_max[r] * scale_log2 + self.rescale_threshold:
                factor = cute.math.exp2((row_max[r] - block_max) * scale_log2, fastmath=True)
                row_sum[r] = row_sum[r] * factor
                correction[r] = factor
                row_max[r] = block_max
            # A row with every key masked so far has max -inf: 0 in its place keeps exp2(-inf) = 0, not NaN.
            max_scaled = row_max[r] * scale_log2
            if row_max[r] == -Float32.inf:
                max_scaled = Float32(0.0)
            p_base = max_scaled - self.p_exponent_offset
            for c in cutlass.range_constexpr(cute.size(rS, mode=[1])):
                rS[r, c] = cute.math.exp2(rS[r, c] * score_scale_log2 - p_base, fastmath=True)
            row_sum[r] = row_sum[r] + tree_reduce(row_values(rS, r), operator.add)

    @cute.jit
    def rescale_output(self, acc_O: cute.Tensor, acc_PV: cute.Tensor | None = None, pv_scale: Float32 | None = None):
        """O *= correction row by row, skipped when no row of this warp moved its reference in the
        last :meth:`step` (one warp-uniform branch: no divergence, and ptxas keeps the block whole).

        With ``acc_PV`` (the previous block's P V accumulated apart), O = (O + P V) * correction; with
        ``pv_scale`` (FP8 block quantisation: that block's V scale), O = (O + P V * pv_scale) * correction.
        """
        rO = rows_cols_view(acc_O)
        rows = cute.size(rO, mode=[0])
        if cutlass.const_expr(acc_PV is not None):
            add_block_product(acc_O, acc_PV, pv_scale)
        correction = self.correction
        moved = correction[0] != 1.0
        for r in cutlass.range_constexpr(1, rows):
            moved = moved | (correction[r] != 1.0)
        if cute.arch.vote_any_sync(moved):
            for r in cutlass.range_constexpr(rows):
                for c in cutlass.range_constexpr(cute.size(rO, mode=[1])):
                    rO[r, c] = rO[r, c] * correction[r]

    @cute.jit
    def finalize(self, acc_O: cute.Tensor, output_scale: Float32, lse: cute.Tensor):
        """O /= row_sum (times ``output_scale``, the FP8 V descale) and lse = ln(sum exp(scaled S))."""
        rO = rows_cols_view(acc_O)
        for r in cutlass.range_constexpr(cute.size(rO, mode=[0])):
            total = cute.arch.warp_reduction_sum(self.row_sum[r], threads_in_group=THREADS_PER_ROW)
            # Rows past Sq (padding of the last query block) have total 0: write 0 and lse -inf.
            inverse = Float32(0.0)
            lse[r] = -Float32.inf
            if total > 0.0:
                inverse = output_scale / total
                log2_sum = cute.math.log2(total, fastmath=True) - self.p_exponent_offset
                lse[r] = (self.row_max[r] * self.softmax_scale_log2 + log2_sum) * LN_2
            for c in cutlass.range_constexpr(cute.size(rO, mode=[1])):
                rO[r, c] = rO[r, c] * inverse


@cute.jit
def add_block_product(acc_O: cute.Tensor, acc_PV: cute.Tensor, pv_scale: Float32 | None = None):
    """O += P V of one key block (times its V scale with FP8 block quantisation: one FMA per value)."""
    if cutlass.const_expr(pv_scale is None):
        acc_O.store(acc_O.load() + acc_PV.load())
    else:
        acc_O.store(acc_O.load() + acc_PV.load() * pv_scale)


class BlockScales:
    """FP8 block quantisation: the scales of one (batch, head)'s key blocks of K and of V, read from
    global memory (L1-cached, two floats per block) where each block is processed."""

    def __init__(self, key_scales: cute.Tensor, value_scales: cute.Tensor):
        self.key_scales = key_scales
        self.value_scales = value_scales

    def key(self, n_block: Int32) -> Float32:
        return self.key_scales[n_block]

    def value(self, n_block: Int32) -> Float32:
        return self.value_scales[n_block]


# ----------------------------------------------------------------------------------------------------
# Ping-pong scheduling
# ----------------------------------------------------------------------------------------------------
class WarpgroupTurns:
    """The consumer warpgroups take turns issuing WGMMA, round robin (one named barrier each).

    ``wait`` blocks until the previous warpgroup has issued its GEMMs (``pass_on``), so the tensor
    cores run one warpgroup's GEMMs while the others compute their softmax. Each barrier completes
    with the 128 threads that wait plus the 128 that arrive. The last warpgroup arrives once up front
    (warpgroup 0 goes first) and warpgroup 0 consumes the last arrive in ``finish``, so every barrier
    balances. A warpgroup cannot arrive twice on its successor's barrier before the successor has
    waited once: its own next turn needs the turn to come all the way round.
    """

    def __init__(self, enabled: bool, warpgroup: Int32, count: int, barrier_base: int, threads_per_warpgroup: int):
        self.enabled = enabled
        self.warpgroup = warpgroup
        self.count = count
        self.barrier_base = barrier_base
        self.threads = 2 * threads_per_warpgroup

    @cute.jit
    def start(self):
        # A compile-time and a runtime test cannot share one `if` in the DSL.
        if cutlass.const_expr(self.enabled):  # noqa: SIM102
            if self.warpgroup == self.count - 1:
                cute.arch.barrier_arrive(barrier_id=self.barrier_base, number_of_threads=self.threads)

    @cute.jit
    def wait(self):
        if cutlass.const_expr(self.enabled):
            cute.arch.barrier(barrier_id=self.barrier_base + self.warpgroup, number_of_threads=self.threads)

    @cute.jit
    def pass_on(self):
        if cutlass.const_expr(self.enabled):
            successor = (self.warpgroup + 1) % self.count
            cute.arch.barrier_arrive(barrier_id=self.barrier_base + successor, number_of_threads=self.threads)

    @cute.jit
    def finish(self):
        if cutlass.const_expr(self.enabled):  # noqa: SIM102
            if self.warpgroup == 0:
                cute.arch.barrier(barrier_id=self.barrier_base, number_of_threads=self.threads)
