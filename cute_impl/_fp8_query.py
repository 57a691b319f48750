"""cute/fp8's Q quantised inside the attention kernel (``HopperAttentionConfig.quantise_q``, issue #37).

Why: the fused quantiser (``triton_impl/fp8_quantiser.py``) reads Q, K and V in bf16 and writes them in
e4m3 before the kernel runs; at P1 Q is a third of its bytes. The attention kernel reads each 64-row Q
block once per tile anyway, and Q's scale block (``Quantisation.q_block_rows`` = 64 rows of one
(batch, head)) is exactly one consumer warpgroup's Q box, so each warpgroup can quantise its own box:
the quantiser then runs for K and V only (``FusedQuantiser(query=False)``). With GQA too: cute/fp8 does
not pack query heads into a tile (a tile is 128 rows of one (batch, query head); only K, V and their
scales are read at the KV head), so box ``m_block * W + w`` of (batch, head) is always that scale block,
and a box past Sq (its rows zero-filled by TMA) writes no scale.

The same values as the quantiser, step by step (``fp8_quantiser_kernel``'s steps 2-4), per consumer
warpgroup and tile, on the box the producer loaded by TMA in the input dtype:

1. Rotation: the box times the ±1 sign matrix of ``random_hadamard(D, seed)`` on one wgmma chain
   (m64nDk16, both operands in the input dtype from shared memory, fp32 accumulator: x · ±1 is exact,
   the k-blocks summed in order, as the quantiser's ``tl.dot``), then x c, c = the matrix's fp32 entry
   magnitude (``rotation_scale``). The sign matrix is loaded once per CTA. The product is issued at the
   tile's start, or (``rotate_ahead``) at the end of the tile before, after its last P V, so that the
   tensor cores run it under that tile's normalisation and O store (``rotate`` and ``quantise`` apart).
2. amax of the block: |x| per thread (tree), warp (shuffles), then the four warps through shared memory;
   scale = amax / 448 by IEEE division, 1 for an all-zero block; stored to Q's scale tensor.
3. x / scale correctly rounded by the quantiser's reciprocal division (``fp8_quantiser_kernel``'s step 4,
   ``_divisor_of`` and ``_quotient``, the same operations: r = 1 / d once per block by IEEE division,
   then per element q = x · r and ``ROTATED_CORRECTIONS`` Markstein steps of two fmas; a block of tiny
   values moved up by a power of two first, an infinite scale as d = r = 0): five instructions an
   element instead of ``div.rn``'s ten and its slow-path branch. ``HopperAttentionConfig.q_quotient_corrections``
   = 1 (``fp8.Q_QUOTIENT_CORRECTIONS``) takes one step, three instructions an element: the same quotient, for
   every fp32 x and divisor (``common/tools/fp8_quotient.py``). Then e4m3 by ``cvt.rn.satfinite``
   (saturating as the reference's clamp).
4. The e4m3 values go to the warpgroup's e4m3 Q box (the A operand of S = Q Kᵀ), at the accumulator's
   coordinates, then a proxy fence and the warpgroup's barrier before its first wgmma reads them.

``lean`` (``HopperAttentionConfig.lean_quantise_q``): the same bytes from fewer instructions. Step 2 takes the
amax of the products before x c and multiplies it by c once (rounding is monotone and c > 0); step 4 writes the box
with four ``stmatrix.x4`` a thread (``PairedBoxStore``: e4m3 pairs as 16-bit elements) instead of 32 two-byte
stores whose swizzled addresses cost about 100 integer instructions. stmatrix puts a lane's pairs at other columns
than the accumulator's, so the sign matrix's columns come reordered (``paired_columns``): the accumulator then
holds, at each column, the rotated column that stmatrix stores there. At P1, 162 of a consumer thread's ~1960
instructions a tile outside the key-block steps.

Bit equality with the quantiser holds where the fp32 sums of step 1 are the same: the same k16 groups
in the same order on the same tensor cores, which is what Triton's wgmma for the quantiser's
(128, D) x (D, D) product issues; the GPU tests compare the scales and judge the kernel by the FP8
rule against the emulation of the full quantiser's operands.

Cost: both consumer warpgroups quantise at once at a tile's start, so the tensor cores idle meanwhile:
the rotation (two 64 x D x D bf16 products) and about 790 instructions a thread (x c twice, amax, the division's
390, the cast, 32 two-byte stores and their addresses; another 454 in the path of a block of tiny values), per
tile of 128 rows; ``lean`` about 630.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Float32, Int32
from cutlass.cute.nvgpu import warp, warpgroup
from cutlass.tensor_utils import LayoutEnum

from common.contract.fp8 import E4M3_MAX, KEY_GROUP, PERMUTED_KEY_ORDER, random_hadamard
from cute_impl._hopper_device import (
    PRODUCER_ARRIVES,
    ROWS_PER_WARPGROUP,
    SMEM_ALIGN_BYTES,
    THREADS_PER_WARPGROUP,
    WARPS_PER_WARPGROUP,
    NamedBarrier,
    ReadOnlyInRegions,
    tma_partition,
    tree_reduce,
    warpgroup_gemm,
)
from triton_impl.fp8_quantiser import ROTATED_CORRECTIONS
from triton_impl.fp8_quantiser_kernel import FP32_MAX, RECIPROCAL_MIN_SCALE, TINY_SCALE_FACTOR


def rotation_scale(head_dim: int) -> float:
    """c: the fp32 magnitude of every entry of ``random_hadamard(head_dim, seed)`` (the same for every seed),
    read as the quantiser reads it."""
    return random_hadamard(head_dim, 0)[0, 0].abs().item()


def paired_columns(head_dim: int) -> list[int]:
    """``lean``: the rotated column that the accumulator's column c holds when the sign matrix's columns come in
    this order. A lane's accumulator holds, in each group of 16 columns, the pairs 2t, 2t+1 and 2t+8, 2t+9; with the
    e4m3 pairs taken as 16-bit elements, stmatrix stores a lane's two elements at pair slots 2t and 2t+1, i.e.
    column 8h + 2t + e at 4t + 2h + e: the inverse of ``PERMUTED_KEY_ORDER`` (V's keys, reordered for the same
    reason). Column c of the product is one sum over the same k16 groups whichever column of the matrix it uses,
    so the values are the default's, only computed in other registers."""
    inverse = [PERMUTED_KEY_ORDER.index(c) for c in range(KEY_GROUP)]
    return [c - c % KEY_GROUP + inverse[c % KEY_GROUP] for c in range(head_dim)]


def fragment_pair(index: int) -> int:
    """``lean``: the accumulator's e4m3 pair (its ((2, 2, D/8), 1, 1) values taken two by two: pair k is row half
    k % 2 of column group k // 2) that element ``index`` = e + 2 r + 4 m of the 16-bit stmatrix fragment
    ((2, 2, D/16), 1, 1) holds: row half r of group 2 m + e, whose columns stmatrix stores at pair slots 2t + e of
    16-bit group m."""
    e, r, m = index % 2, index // 2 % 2, index // 4
    return r + 2 * (2 * m + e)


def rotation_mma(dtype: type[cutlass.Numeric], head_dim: int) -> cute.TiledMma:
    """One warpgroup's rotation product: (64, D) Q box times the (D, D) sign matrix, both K-major in shared memory."""
    k_major = cute.nvgpu.OperandMajorMode.K
    return sm90_utils.make_trivial_tiled_mma(
        dtype, dtype, k_major, k_major, Float32, (1, 1, 1), (ROWS_PER_WARPGROUP, head_dim)
    )


class QueryLayouts(NamedTuple):
    """Shared memory of the in-kernel quantisation: the input-dtype Q boxes (64, D, warpgroup) the producer
    loads, and the transposed sign matrix (D, D, 1)."""

    box: cute.ComposedLayout
    rotation: cute.ComposedLayout

    @staticmethod
    def create(dtype: type[cutlass.Numeric], head_dim: int, warpgroups: int) -> QueryLayouts:
        tiler, row_major = (ROWS_PER_WARPGROUP, head_dim, head_dim), LayoutEnum.ROW_MAJOR
        return QueryLayouts(
            box=sm90_utils.make_smem_layout_a(row_major, tiler, dtype, warpgroups),
            rotation=sm90_utils.make_smem_layout_b(row_major, tiler, dtype, 1),
        )

    def storage_fields(self, dtype: type[cutlass.Numeric], warpgroups: int) -> dict:
        """The fields ``SharedLayouts.storage`` appends: the rotation's full barrier, each warp's amax, the
        boxes and the sign matrix (1024-byte aligned: swizzle)."""
        return {
            "rotation_full": cute.struct.MemRange[cutlass.Int64, 1],
            "q_amax": cute.struct.MemRange[Float32, warpgroups * WARPS_PER_WARPGROUP],
            "sQ_in": cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(self.box)], SMEM_ALIGN_BYTES],
            "sR": cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(self.rotation)], SMEM_ALIGN_BYTES],
        }


@cute.jit
def init_rotation_barrier(full: cute.Pointer, warp_idx: Int32) -> None:
    """One elected thread of warp 0, before the CTA-wide barrier that publishes the kernel's barrier inits."""
    if warp_idx == 0:
        with cute.arch.elect_one():
            cute.arch.mbarrier_init(full, PRODUCER_ARRIVES)


@cute.jit
def load_rotation(atom: cute.CopyAtom, mR: cute.Tensor, sR: cute.Tensor, full: cute.Pointer, rotation_bytes: int):
    """Producer, once per CTA: TMA the (D, D) sign matrix into ``sR``; ``full`` completes with its bytes."""
    head_dim = cute.size(sR, mode=[0])
    gR = cute.local_tile(mR, (head_dim, head_dim), (None, 0))  # (D, D, 1)
    tRsR, tRgR = tma_partition(atom, sR, gR)  # (TMA, 1), (TMA, 1)
    with cute.arch.elect_one():
        cute.arch.mbarrier_arrive_and_expect_tx(full, rotation_bytes)
    cute.copy(atom, tRgR[None, 0], tRsR[None, 0], tma_bar_ptr=full)


def divisor_of(scale: Float32) -> tuple[Float32, Float32, Float32]:
    """The quantiser's ``_divisor_of``: (divisor, reciprocal = 1 / divisor by IEEE division, factor), x / scale =
    (x · factor) / divisor exactly; a scale below 2^-60 moves up by 2^89, an infinite one gives d = r = 0."""
    infinite = scale > Float32(FP32_MAX.value)
    factor = Float32(cutlass.select_(scale < Float32(RECIPROCAL_MIN_SCALE.value), Float32(TINY_SCALE_FACTOR.value),
                                     Float32(1.0)))  # fmt: skip
    divisor = Float32(cutlass.select_(infinite, Float32(0.0), scale * factor))
    reciprocal = Float32(cutlass.select_(infinite, Float32(0.0), Float32(1.0) / divisor))
    return divisor, reciprocal, factor


def quotient(x: Float32, divisor: Float32, reciprocal: Float32, corrections: int = ROTATED_CORRECTIONS) -> Float32:
    """The quantiser's ``_quotient`` (reciprocal division, rotated values): q = x · r, then ``corrections`` times
    q = fma(fma(d, q, -x), -r, q), the residual formed exactly; correctly rounded by Markstein's theorem, the sign of
    a zero kept. The quantiser takes ``ROTATED_CORRECTIONS`` (2); one is already exact for every fp32 x and every
    divisor of the normal range (``common/tools/fp8_quotient.py`` proves it), two fmas an element fewer."""
    q = x * reciprocal
    minus_x, minus_reciprocal = x * Float32(-1.0), reciprocal * Float32(-1.0)
    for _ in range(corrections):
        residual = cute.math.fma(divisor, q, minus_x)
        q = cute.math.fma(residual, minus_reciprocal, q)
    return q


class PairedBoxStore(ReadOnlyInRegions):
    """``lean``: warpgroup ``w``'s e4m3 Q box written by stmatrix, Q's e4m3 pairs as 16-bit elements of a
    (64, D/2) view of the same swizzled bytes (128-byte rows either way), from a rotation whose columns come in
    :func:`paired_columns`' order: four ``stmatrix.x4`` a thread instead of 32 two-byte stores, each with its own
    swizzled address (about 100 integer instructions a tile)."""

    def __init__(self, sQ_pairs: cute.Tensor, w: Int32, wg_tidx: Int32):
        rows, pair_cols = cute.size(sQ_pairs, mode=[0]), cute.size(sQ_pairs, mode=[1])
        k_major = cute.nvgpu.OperandMajorMode.K
        # Never run: its C partition is the 16-bit accumulator layout that stmatrix stores.
        pairs_mma = sm90_utils.make_trivial_tiled_mma(BFloat16, BFloat16, k_major, k_major, Float32, (1, 1, 1),
                                                      (rows, pair_cols))  # fmt: skip
        atom = cute.make_copy_atom(warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), BFloat16)
        self.thr_store = cute.make_tiled_copy_C(atom, pairs_mma).get_slice(wg_tidx)
        self.pairs_shape = pairs_mma.get_slice(wg_tidx).partition_shape_C((rows, pair_cols))  # ((2, 2, D/16), 1, 1)
        self.box = sQ_pairs[None, None, w]  # (64, D/2) 16-bit

    @staticmethod
    def view(boxes: Any, head_dim: int, warpgroups: int) -> cute.Tensor:
        """The (64, D/2, warpgroup) 16-bit view of the e4m3 Q boxes' shared memory (``boxes``, a storage field)."""
        tiler = (ROWS_PER_WARPGROUP, head_dim // 2, head_dim // 2)
        layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, tiler, BFloat16, warpgroups)
        return boxes.get_tensor(layout.outer, swizzle=layout.inner, dtype=BFloat16)

    @cute.jit
    def store(self, rQ8: cute.Tensor) -> None:
        """``rQ8``: the accumulator's e4m3 values ((2, 2, D/8), 1, 1), into the box by ``fragment_pair``'s register
        renaming (no instruction) and stmatrix."""
        pairs = cute.recast_tensor(rQ8, BFloat16)
        fragment = cute.make_rmem_tensor(self.pairs_shape, BFloat16)
        for i in cutlass.range_constexpr(cute.size(fragment)):
            fragment[i] = pairs[fragment_pair(i)]
        # Partitioned here, not once per CTA: four addresses live across the key-block loops cost a spill there.
        cute.copy(self.thr_store, self.thr_store.retile(fragment), self.thr_store.partition_D(self.box))


class QueryQuantiser(ReadOnlyInRegions):
    """Steps 1-4 of the module docstring for consumer warpgroup ``w``: :meth:`rotate` issues the product of its
    loaded input-dtype Q box, :meth:`quantise` turns it into its e4m3 Q box and returns the block's scale."""

    def __init__(
        self, mma: cute.TiledMma, sQ_in: cute.Tensor, sR: cute.Tensor, sQ: cute.Tensor, amax: cute.Tensor,
        rotation_full: cute.Pointer, w: Int32, wg_tidx: Int32, scale: float, paired: PairedBoxStore | None = None,
        corrections: int = ROTATED_CORRECTIONS,
    ):  # fmt: skip
        thr = mma.get_slice(wg_tidx)
        self.mma = mma
        self.tRsQ = thr.make_fragment_A(thr.partition_A(sQ_in[None, None, w]))  # (MMA, 1, D/16)
        self.tRsR = thr.make_fragment_B(thr.partition_B(sR))  # (MMA, 1, D/16, 1)
        head_dim = cute.size(sQ, mode=[1])
        self.acc_shape = thr.partition_shape_C((ROWS_PER_WARPGROUP, head_dim))  # ((2, 2, D/8), 1, 1)
        self.tRsQ8 = thr.partition_C(sQ[None, None, w])  # ((2, 2, D/8), 1, 1) e4m3, the accumulator's coordinates
        self.amax = amax  # (warps of all warpgroups,) fp32
        self.rotation_full = rotation_full
        self.w = w
        self.warp = wg_tidx // cute.arch.WARP_SIZE
        self.lane = wg_tidx % cute.arch.WARP_SIZE
        self.scale = scale
        self.barrier = NamedBarrier.QUANTISE_WG1 + w
        # ``lean``: the amax taken before x c (one multiply instead of 64) and the box written by ``paired``.
        self.paired = paired
        # Markstein corrections of each quotient (``HopperAttentionConfig.q_quotient_corrections``).
        self.corrections = corrections

    @cute.jit
    def wait_rotation(self) -> None:
        """Once per CTA, before the first tile: the sign matrix has landed."""
        cute.arch.mbarrier_wait(self.rotation_full, 0)

    def accumulator(self) -> cute.Tensor:
        """The rotation's fp32 accumulator, ((2, 2, D/8), 1, 1) a thread: per tile, or (``rotate_ahead``) once
        before the tile loop, the next tile's rotation being issued at the end of a tile."""
        return cute.make_rmem_tensor(self.acc_shape, Float32)

    @cute.jit
    def rotate(self, acc: cute.Tensor, *, cleared: cutlass.Constexpr[bool] = False) -> None:
        """Step 1's product into ``acc``, issued (async, its own wgmma group): the caller has waited for the
        box. ``cleared``: zeros written first, so that the wgmma's in-out accumulator operands do not keep the
        previous tile's values alive through the tile between (an accumulator defined before the loop)."""
        if cutlass.const_expr(cleared):
            acc.fill(0.0)
        warpgroup_gemm(self.mma, acc, tA=self.tRsQ, tB=self.tRsR, stage=0, accumulate=False)

    @cute.jit
    def quantise(self, rotated: cute.Tensor) -> Float32:
        """After :meth:`rotate` into ``rotated``, with no wgmma group issued since: the box's e4m3 values into
        the warpgroup's e4m3 Q box; returns the block's scale. The caller may release the input box once this
        returns (the rotation's wgmma has retired)."""
        # 1. Rotation: the product retired, then x c (into registers of their own: ``rotated`` is left as the
        # wgmma wrote it).
        warpgroup.wait_group(0)
        acc = cute.make_rmem_tensor(self.acc_shape, Float32)
        acc.store(rotated.load() * Float32(self.scale))
        # 2. amax: thread, warp, warpgroup (through shared memory), then the scale. ``lean``: of the products
        # before x c, times c once: rounding is monotone and c > 0, so max |x c| = max |x| c bit for bit.
        values = [cute.math.abs((rotated if self.paired is not None else acc)[i]) for i in range(cute.size(acc))]
        amax = cute.arch.warp_reduction_max(tree_reduce(values, cute.arch.fmax), threads_in_group=cute.arch.WARP_SIZE)
        first = self.w * WARPS_PER_WARPGROUP
        if self.lane == 0:
            self.amax[first + self.warp] = amax
        cute.arch.barrier(barrier_id=self.barrier, number_of_threads=THREADS_PER_WARPGROUP)
        amax = tree_reduce([self.amax[first + i] for i in range(WARPS_PER_WARPGROUP)], cute.arch.fmax)
        if cutlass.const_expr(self.paired is not None):
            amax = amax * Float32(self.scale)
        scale = Float32(cutlass.select_(amax > 0.0, amax / Float32(E4M3_MAX), Float32(1.0)))
        # 3. x / scale correctly rounded (the reciprocal division), e4m3 with saturation.
        divisor, reciprocal, factor = divisor_of(scale)
        # Two copies of the loop, so that the usual one carries no multiply by the factor (predicated, it
        # would still take an issue slot an element); the branch is the same for the whole warpgroup.
        if factor == Float32(1.0):
            for i in cutlass.range(cute.size(acc), unroll_full=True):
                acc[i] = quotient(acc[i], divisor, reciprocal, self.corrections)
        else:  # a block of tiny values, moved up with its divisor by a power of two (exact)
            for i in cutlass.range(cute.size(acc), unroll_full=True):
                acc[i] = quotient(acc[i] * factor, divisor, reciprocal, self.corrections)
        rQ8 = cute.make_rmem_tensor_like(acc, self.tRsQ8.element_type)
        rQ8.store(acc.load().to(self.tRsQ8.element_type))
        # 4. Into the e4m3 box, visible to the async proxy (wgmma) of every warp of the warpgroup.
        if cutlass.const_expr(self.paired is not None):
            self.paired.store(rQ8)
        else:
            cute.autovec_copy(rQ8, self.tRsQ8)
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(barrier_id=self.barrier, number_of_threads=THREADS_PER_WARPGROUP)
        return scale
