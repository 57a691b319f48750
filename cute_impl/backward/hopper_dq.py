"""dQ without recomputation for the CuTe ``hopper`` backward (``hopper.py``, ``BackwardTiles(dq="reduce")``):
the pieces the dK/dV kernel adds to compute dQ itself, and the small kernel that finishes dQ.

What it adds: ``hopper.py``'s default runs a second kernel for dQ that recomputes S and dP, seven
products per (query block, key block) where five are counted. Here the dK/dV kernel, which already
holds dSᵀ for its 128 keys and the step's 64 query rows, also computes that block's share of dQ,
dQ_block = dS K (64 × D, fp32), and adds it into an fp32 ``dQaccum`` in HBM; a last launch scales it by
softmax_scale and converts it. Five wgmma products per step; the price is the fp32 adds to HBM (64 · D
· 4 bytes per step) and the order of the adds across key blocks, which is not fixed: dQ is not bitwise
deterministic (dK and dV still are).

How data moves, per step (``DQReduce``):
  1. Each consumer warpgroup writes its dSᵀ (64 keys × 64 queries, 16-bit, already converted for
     dK += dSᵀ Q) into shared memory, into one of two buffers (the step's parity: a warpgroup may be a
     step ahead of the other), ``fence.proxy.async`` and a named barrier of both warpgroups: dQ's sum
     runs over all 128 keys, so each warpgroup reads both halves of dS.
  2. dQ[:, half w] = dS K[:, half w]: warpgroup w computes the D/2 columns of its half over the 128
     keys (A = dS read MN-major from the buffer, B = K read MN-major from the CTA's K tiles: the same
     bytes as their K-major layouts), issued before dK += dSᵀ Q so it retires first. 64 · D/2 fp32
     accumulators: 32 registers per thread at D=128. With 128 query rows per step (D=64) warpgroup w
     computes query rows [64w, 64w + 64) and every column instead (``dq_box``): still one m64 tile.
     With 80 (D=128, FlashAttention-4's non-causal tile) no m64 tile of query rows exists: warpgroup w
     computes dQᵀ rows [64w, 64w + 64) of D over the 80 queries instead, dQᵀ = Kᵀ dSᵀ (``dq_transposed``;
     A = Kᵀ, B = dSᵀ: the same two buffers, the operands swapped), m64n80, 40 registers per thread.
  3. Once dQ has retired, the warpgroup waits until its fp32 staging tile is free (named barrier
     ``DQ_EMPTY``), stores its accumulators there in fragment order (16 bytes per thread, consecutive
     threads consecutive: no bank conflicts), fences and signals ``DQ_FULL``.
  4. Warp 1 of the producer warpgroup (``dq_writer``), which walks the same query blocks, adds each
     staged tile to its chunk of ``dQaccum`` with one ``cp.reduce.async.bulk...add.f32`` (the L2 does
     the adds, asynchronously: the consumers never wait on atomics) and frees the tile once the bulk
     copy has read it (``cp.async.bulk.wait_group.read``).
``dQaccum`` is (B, H, query blocks, 2, 64 · D/2) fp32, zeroed before the dK/dV kernel (by a fill, or by the
preprocess: ``BackwardTiles.zero_in_preprocess``), each chunk one warpgroup's tile in fragment order;
``DQPostprocessKernel`` scales each chunk and stores dQ, rows past Sq dropped. It reads a chunk by row quads
(``store_quad_rows``: the four lanes that hold 8 adjacent columns of two rows, whose vectors are 64
contiguous bytes) and writes 16-byte row pieces, so that both sides move whole sectors: read back into the
fragment and stored through the MMA's partition, two bytes a store, it took 139 µs at B=8 S=2048 D=128
(134 MB of dQaccum) against FlashAttention-4's 49 (``results/h200/backward-kernels-2026-11-30/``).
Transposed (80 query rows) it reads each thread's vectors back into the dQᵀ fragment (16-byte loads), writes
them by transposed stmatrix into a (tile_m, 64) tile in shared memory and stores 16-byte row pieces from there
(``store_transposed``, as FlashAttention-4's postprocess does for its transposed dQ). Finishing dQ in the dK/dV
kernel instead (each query block by its last key block, no postprocess) was tried and lost: 0.80-0.87x at the causal
D=128 shapes (H100, 2026-12-05, ``docs/perf-log.md``).

Resources: shared memory gains 32 KB of dS buffers (2 buffers × 2 warpgroups × 64 × 64 × 2 bytes) and
64 · D · 4 bytes of staging (D=128: 192 KB in all with two ring slots); the kernel compiles without
spills at D=64 and 128 under the default's register split (setmaxnreg 240 / 24). dSᵀ goes to shared
memory by ``stmatrix``, one swizzled address per four 8×8 matrices: stored element by element, ptxas
kept 16 precomputed swizzled addresses live across the loop and spilled 72 bytes at D=128. At 80 rows
the dS buffers (64 keys × 80 queries, 160 bytes a row) take a 32-byte swizzle, 40 KB, the staging 40 KB:
226 KB in all with two ring slots of Q, dO, LSE₂ and D (FlashAttention-4's tile takes the same).

Counterparts: FlashAttention-4's ``flash_attn/cute/flash_bwd_sm90.py`` (the model: dQaccum store warp,
bulk reduce-add, postprocess); ``triton_impl/gluon/backward.py``'s ``dq="atomic"`` (the same dS exchange
with per-element fp32 atomics from the consumers' registers, which lost to its dQ pass).

Limits: 64, 80 (D=128, transposed) or 128 query rows per step (one or two m64 dQ tiles); dQ retires within
its step (``hand_over`` waits for it), while a step's dK may stay in flight under the next step's Sᵀ and
dPᵀ (``dkdv_overlap``: ptxas keeps that asynchronous at D=64 and serialises every wgmma at D=128); at 64
rows D=64 runs m64n32 dQ products, at 128 rows (FlashAttention-3's D=64 tile) m64n64 ones, with 64 KB
of dS buffers (``hopper.py`` then issues dV after dSᵀ and ``hopper_rows`` reads LSE₂ and D where used:
both spilled or serialised otherwise), at 80 rows m64n80 dQᵀ ones. Timed: ``bench/cute_bwd_fused_dq_ab.sh``
(128 rows), ``bench/cute_bwd_d128_ab.sh`` (80 rows). With ``BackwardTiles.rebased_operands`` the warpgroup's Kᵀ
box and each step's dS buffer are described from their own addresses (``hopper_desc.py``).
"""

from __future__ import annotations

import enum

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import warp, warpgroup
from cutlass.cutlass_dsl import dsl_user_op
from cutlass.memory import SmemAllocator

from cute_impl._hopper_device import ROWS_PER_WARPGROUP, THREADS_PER_WARPGROUP, ReadOnlyInRegions, sequence_major
from cute_impl._host import generic_view
from cute_impl.backward import hopper_desc
from cute_impl.backward._device import (
    CONSUMER_WARPGROUPS,
    K_MAJOR,
    MN_MAJOR,
    SMEM_ALIGN_BYTES,
    streamed_layouts,
)

# dS buffers: a warpgroup writes step s + 1's dS while the other may still read step s's.
DS_BUFFERS = 2
# A thread stages its dQ accumulators 4 fp32 (16 bytes) at a time.
VALUES_PER_VECTOR = 4
# A row quad: the four lanes of an m64nN accumulator that hold one row's 8 adjacent columns of a vector.
QUAD = 4
QUADS_PER_WARP = 8
COLUMNS_PER_QUAD = 8
WARP_THREADS = 32
# The transposed postprocess stages each warpgroup's dQ tile (tile_m query rows × 64 columns, 16-bit) in shared
# memory, its rows this many elements apart: 64 + 8, so that the 8 rows of a transposed stmatrix (16 bytes each,
# 144 bytes apart) and a quarter warp's 16-byte row pieces fall in distinct banks.
TRANSPOSED_PITCH = ROWS_PER_WARPGROUP + 8
# 16-bit elements in one 16-byte access.
ELEMENTS_PER_PIECE = 8


class DQBarrier(enum.IntEnum):
    """Named barrier ids of the dK/dV kernel with dQ (0 is ``__syncthreads``); the ``_WG1`` members are
    offset by the consumer warpgroup index."""

    DS_READY = 1
    DQ_EMPTY_WG1 = 2
    DQ_EMPTY_WG2 = 3
    DQ_FULL_WG1 = 4
    DQ_FULL_WG2 = 5


def dq_transposed(tile_m: int) -> bool:
    """A step of 80 query rows (D=128, FlashAttention-4's non-causal tile) has no m64 dQ tile: each
    warpgroup computes dQᵀ = Kᵀ dSᵀ for its D/2 = 64 rows of dQᵀ over the step's queries instead."""
    return tile_m % ROWS_PER_WARPGROUP != 0


def dq_columns(head_dim: int, tile_m: int) -> int:
    """The N of one warpgroup's dQ tile (64 × N): a step of 64 rows splits D between the two warpgroups
    (N = D/2), a step of 128 rows gives each warpgroup 64 rows and every column (N = D); transposed, the
    step's tile_m queries (N = tile_m, D = 128 only: its 64 rows are half of D)."""
    if dq_transposed(tile_m):
        return tile_m
    return head_dim * tile_m // (CONSUMER_WARPGROUPS * ROWS_PER_WARPGROUP)


def dq_box(w: Int32, tile_m: int) -> tuple:
    """Warpgroup ``w``'s dQ tile inside the step's (tile_m, D), or transposed inside its (D, tile_m):
    (64-row box, column box)."""
    if tile_m == ROWS_PER_WARPGROUP:
        return 0, w
    return w, 0


def dq_mma(dtype: type[cutlass.Numeric], head_dim: int, tile_m: int) -> cute.TiledMma:
    """One warpgroup's dQ tile = dS K over 128 keys, 64 × ``dq_columns``, both operands MN-major in
    shared memory (transposed, dQᵀ = Kᵀ dSᵀ: Kᵀ is MN-major as A, dSᵀ as B, the same bytes)."""
    mn_major = MN_MAJOR.sm90_mma_major_mode()
    return sm90_utils.make_trivial_tiled_mma(
        dtype, dtype, mn_major, mn_major, Float32, (1, 1, 1), (ROWS_PER_WARPGROUP, dq_columns(head_dim, tile_m))
    )


def ds_layouts(dtype: type[cutlass.Numeric], tile_m: int) -> tuple[cute.ComposedLayout, cute.ComposedLayout]:
    """The dS tiles, (buffer, warpgroup) slots of 64 keys × tile_m queries: written as dSᵀ (keys,
    queries, slot), queries contiguous, and read as the A operand dS (queries, keys, slot), MN-major: the
    same bytes (the 128-byte swizzle atom is both)."""
    rows, slots = ROWS_PER_WARPGROUP, DS_BUFFERS * CONSUMER_WARPGROUPS
    written = sm90_utils.make_smem_layout_b(K_MAJOR, (rows, rows, tile_m), dtype, slots)
    read = sm90_utils.make_smem_layout_a(MN_MAJOR, (tile_m, rows, rows), dtype, slots)
    return written, read


def keys_mn_major(dtype: type[cutlass.Numeric], head_dim: int) -> cute.ComposedLayout:
    """The CTA's K tiles (64 keys, D, warpgroup) read as dQ's B operand: (D, 64 keys, warpgroup)."""
    return streamed_layouts(dtype, ROWS_PER_WARPGROUP, head_dim, CONSUMER_WARPGROUPS)[1]


def dq_storage_fields(dtype: type[cutlass.Numeric], head_dim: int, tile_m: int) -> dict:
    """The shared memory the dQ path adds: the dS buffers and one fp32 staging tile per warpgroup (128
    query rows per step: D=64 only, the kernel then takes 195 KB; at D=128 it would not fit the 227 KB;
    80 rows, transposed: D=128 only, 226 KB in all with two ring slots)."""
    if tile_m == CONSUMER_WARPGROUPS * ROWS_PER_WARPGROUP and head_dim > ROWS_PER_WARPGROUP:
        raise ValueError(f"dq='reduce' takes 128 query rows per step at D=64 only (shared memory), got D={head_dim}")
    if dq_transposed(tile_m) and head_dim != CONSUMER_WARPGROUPS * ROWS_PER_WARPGROUP:
        raise ValueError(f"dq='reduce' takes {tile_m} query rows per step at D=128 only (dQᵀ), got D={head_dim}")
    staged = CONSUMER_WARPGROUPS * ROWS_PER_WARPGROUP * dq_columns(head_dim, tile_m)
    written = ds_layouts(dtype, tile_m)[0]
    return {
        "dS": cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(written)], SMEM_ALIGN_BYTES],
        "dQ": cute.struct.Align[cute.struct.MemRange[Float32, staged], SMEM_ALIGN_BYTES],
    }


def staged_dq_layout(columns: int) -> cute.Layout:
    """One warpgroup's dQ tile (64 × ``columns``) in fragment order: (value in vector, thread, vector) →
    offset. Thread t's vector v (accumulators 4v..4v+3) is at (v · 128 + t) · 4: a warp's 16-byte stores
    are contiguous."""
    vectors = ROWS_PER_WARPGROUP * columns // THREADS_PER_WARPGROUP // VALUES_PER_VECTOR
    return cute.make_layout(
        (VALUES_PER_VECTOR, THREADS_PER_WARPGROUP, vectors),
        stride=(1, VALUES_PER_VECTOR, VALUES_PER_VECTOR * THREADS_PER_WARPGROUP),
    )


def thread_chunk(chunk: cute.Tensor, columns: int, thread: Int32) -> cute.Tensor:
    """Thread ``thread``'s accumulators inside a flat tile in fragment order: (4, vectors). Every tile
    starts 16-byte aligned (dQaccum's chunks and the staging tiles are multiples of 4 KB apart),
    which the DSL cannot see through a runtime index: said here, so that copies use 16-byte vectors."""
    start = chunk.iterator
    aligned = cute.make_ptr(Float32, start.toint(), start.memspace, assumed_align=VALUES_PER_VECTOR * 4)
    return cute.make_tensor(aligned, staged_dq_layout(columns))[None, thread, None]


def fragment_as_vectors(acc: cute.Tensor, columns: int) -> cute.Tensor:
    """A dQ accumulator fragment (64 × ``columns``) seen as (4, vectors), its registers in order."""
    vectors = ROWS_PER_WARPGROUP * columns // THREADS_PER_WARPGROUP // VALUES_PER_VECTOR
    return cute.make_tensor(acc.iterator, cute.make_layout((VALUES_PER_VECTOR, vectors)))


@dsl_user_op
def reduce_add_bulk(gmem: cute.Pointer, smem: cute.Pointer, size_bytes: int, *, loc=None, ip=None) -> None:
    """gmem[0 : size_bytes) += smem[0 : size_bytes) in fp32, one bulk copy of the async proxy, added to
    the calling thread's current bulk group (``cp.async.bulk.commit_group`` closes it)."""
    llvm.inline_asm(
        None,
        [gmem.llvm_ptr, smem.toint(loc=loc, ip=ip).ir_value(), Int32(size_bytes).ir_value()],
        "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [$0], [$1], $2;",
        "l,r,r",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )


class DQReduce(ReadOnlyInRegions):
    """One consumer warpgroup's share of the dQ path (steps 1-3 of the module docstring)."""

    def __init__(
        self, storage, dtype: type[cutlass.Numeric], head_dim: int, tile_m: int, st_mma: cute.TiledMma, w: Int32,
        wg_tidx: Int32, rebase: bool = False,
    ):  # fmt: skip
        """``rebase`` (``BackwardTiles.rebased_operands``): Kᵀ's box and each step's dS buffer described from their
        own addresses (``hopper_desc.py``)."""
        self.columns = dq_columns(head_dim, tile_m)
        self.w = w
        self.wg_tidx = wg_tidx
        self.mma = dq_mma(dtype, head_dim, tile_m)
        written, read = ds_layouts(dtype, tile_m)
        sdSt = storage.dS.get_tensor(written.outer, swizzle=written.inner)  # (64 keys, tile_m queries, slot)
        # stmatrix: one swizzled address per 8x8 matrices; element stores would keep one per pair live.
        store_atom = cute.make_copy_atom(warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), dtype)
        self.thr_store = cute.make_tiled_copy_C(store_atom, st_mma).get_slice(wg_tidx)
        self.tSsdSt = self.thr_store.partition_D(sdSt)  # (CPY, CPY_M, CPY_N, slot)
        sdS = storage.dS.get_tensor(read.outer, swizzle=read.inner)  # (tile_m queries, 64 keys, slot)
        kt = keys_mn_major(dtype, head_dim)
        sKt = storage.fixed_a.get_tensor(kt.outer, swizzle=kt.inner)  # (D, 64 keys, warpgroup): sK MN-major
        rows, slots = ROWS_PER_WARPGROUP, DS_BUFFERS * CONSUMER_WARPGROUPS
        row_box, column_box = dq_box(w, tile_m)
        self.thr = thr = self.mma.get_slice(wg_tidx)
        self.transposed = dq_transposed(tile_m)
        self.rebase, self.ds_swizzle = rebase, read.inner
        if self.transposed:  # dQᵀ rows [64w, 64w + 64) of D: A = those rows of Kᵀ, B = dSᵀ (all its queries)
            sKt_rows = cute.local_tile(sKt, (rows, rows, CONSUMER_WARPGROUPS), (row_box, 0, 0))  # (64 D, 64 keys, wg)
            if rebase:
                sKt_rows = hopper_desc.rebased_if_aligned(sKt_rows, kt.inner)
            self.sdS = sdS  # (tile_m queries, 64 keys, slot)
            self.tdQrKt = thr.make_fragment_A(thr.partition_A(sKt_rows))  # (MMA, 1, 64/16, warpgroup)
            self.tdQrdS = thr.make_fragment_B(thr.partition_B(sdS))  # (MMA, 1, 64/16, slot)
        else:
            self.sdS = cute.local_tile(sdS, (rows, rows, slots), (row_box, 0, 0))  # (64 queries, 64 keys, slot)
            sKt_columns = cute.local_tile(sKt, (self.columns, rows, CONSUMER_WARPGROUPS), (column_box, 0, 0))
            if rebase:
                sKt_columns = hopper_desc.rebased_if_aligned(sKt_columns, kt.inner)
            self.tdQrdS = thr.make_fragment_A(thr.partition_A(self.sdS))  # (MMA, 1, 64/16, slot)
            self.tdQrKt = thr.make_fragment_B(thr.partition_B(sKt_columns))  # (MMA, 1, 64/16, warpgroup)
        self.acc_shape = thr.partition_shape_C((rows, self.columns))  # ((2, 2, columns/8), 1, 1)
        self.sdQ = storage.dQ.get_tensor(cute.make_layout((rows * self.columns, CONSUMER_WARPGROUPS)))

    @cute.jit
    def share_dS(self, tdKrdSt: cute.Tensor, acc_layout: cute.Layout, step: Int32):
        """Step 1: this warpgroup's dSᵀ (the dK product's A fragment, in accumulator order) into its slot
        of the step's buffer, visible to both warpgroups' wgmma once the barrier is passed."""
        slot = step % DS_BUFFERS * CONSUMER_WARPGROUPS + self.w
        rdSt = self.thr_store.retile(cute.make_tensor(tdKrdSt.iterator, acc_layout))
        cute.copy(self.thr_store, rdSt, self.tSsdSt[None, None, None, slot])
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=int(DQBarrier.DS_READY), number_of_threads=2 * THREADS_PER_WARPGROUP)

    @cute.jit
    def issue(self, step: Int32) -> cute.Tensor:
        """Step 2: warpgroup w's dQ tile (``dq_box``) = dS K (or dQᵀ = Kᵀ dSᵀ) over both warpgroups' keys, one
        wgmma group."""
        acc_dQ = cute.make_rmem_tensor(self.acc_shape, Float32)
        mma_atom = cute.make_mma_atom(self.mma.op)
        buffer = step % DS_BUFFERS * CONSUMER_WARPGROUPS
        tdQrdS = self.tdQrdS
        if cutlass.const_expr(self.rebase):  # the buffer's offset folded into its address, once per step
            sdS = hopper_desc.rebased(self.sdS[None, None, buffer], self.ds_swizzle, self.sdS.layout)  # slots from it
            tdQrdS = self.fragment_dS(sdS)
            buffer = 0
        warpgroup.fence()
        for box in cutlass.range_constexpr(CONSUMER_WARPGROUPS):
            for k in cutlass.range_constexpr(cute.size(self.tdQrKt, mode=[2])):
                mma_atom.set(warpgroup.Field.ACCUMULATE, box != 0 or k != 0)
                dS, Kt = tdQrdS[None, None, k, buffer + box], self.tdQrKt[None, None, k, box]
                tA, tB = (Kt, dS) if cutlass.const_expr(self.transposed) else (dS, Kt)
                cute.gemm(mma_atom, acc_dQ, tA, tB, acc_dQ)
        warpgroup.commit_group()
        return acc_dQ

    def fragment_dS(self, sdS: cute.Tensor) -> cute.Tensor:
        """dS's wgmma operand over ``sdS``: B of dQᵀ (transposed), else A of dQ."""
        if self.transposed:
            return self.thr.make_fragment_B(self.thr.partition_B(sdS))
        return self.thr.make_fragment_A(self.thr.partition_A(sdS))

    @cute.jit
    def hand_over(self, acc_dQ: cute.Tensor):
        """Step 3 (the dQ group retired: issued before dK's, one group left in flight): stage dQ for the
        writer warp once it has freed the tile."""
        warpgroup.wait_group(1)
        handshake = WARP_THREADS + THREADS_PER_WARPGROUP
        cute.arch.barrier(barrier_id=int(DQBarrier.DQ_EMPTY_WG1) + self.w, number_of_threads=handshake)
        staged = thread_chunk(self.sdQ[None, self.w], self.columns, self.wg_tidx)
        cute.autovec_copy(fragment_as_vectors(acc_dQ, self.columns), staged)
        cute.arch.fence_view_async_shared()
        cute.arch.barrier_arrive(barrier_id=int(DQBarrier.DQ_FULL_WG1) + self.w, number_of_threads=handshake)


@cute.jit
def dq_writer(
    mdQaccum: cute.Tensor, sdQ_storage, columns: cutlass.Constexpr, query_blocks, group: Int32, kv_head: Int32,
    batch: Int32, n_start: Int32,
):  # fmt: skip
    """Step 4, one warp: per query block of every head of the group (the consumers' order), free both
    staging tiles (their last bulk reads done), then add each, once staged, to its ``dQaccum`` chunk."""
    chunk_values = ROWS_PER_WARPGROUP * columns
    sdQ = sdQ_storage.get_tensor(cute.make_layout((chunk_values, CONSUMER_WARPGROUPS)))
    handshake = WARP_THREADS + THREADS_PER_WARPGROUP
    m_block_min, _, m_block_max = query_blocks(n_start)
    for head_in_group in cutlass.range(group, unroll=1):
        head = kv_head * group + head_in_group
        for m_block in cutlass.range(m_block_min, m_block_max, unroll=1):
            for w in cutlass.range_constexpr(CONSUMER_WARPGROUPS):
                cute.arch.cp_async_bulk_wait_group(CONSUMER_WARPGROUPS - 1 - w, read=True)
                cute.arch.barrier_arrive(barrier_id=int(DQBarrier.DQ_EMPTY_WG1) + w, number_of_threads=handshake)
            for w in cutlass.range_constexpr(CONSUMER_WARPGROUPS):
                cute.arch.barrier(barrier_id=int(DQBarrier.DQ_FULL_WG1) + w, number_of_threads=handshake)
                with cute.arch.elect_one():
                    gdQaccum = mdQaccum[batch, head, m_block, w, None]  # (64 · columns,)
                    reduce_add_bulk(gdQaccum.iterator, sdQ[None, w].iterator, chunk_values * Float32.width // 8)
                cute.arch.cp_async_bulk_commit_group()
    cute.arch.cp_async_bulk_wait_group(0, read=True)


class DQPostprocessKernel:
    """dQ = softmax_scale · dQaccum in the input dtype: one CTA of two warpgroups per (query block of
    ``tile_m`` rows, head, batch), warpgroup w finishing chunk w. A chunk is in fragment order, so the
    thread that held a value is known from its offset: ``store_quad_rows`` reads, per thread, the 64
    contiguous bytes of a row quad's vector (8 adjacent columns of two rows) and writes them as two
    16-byte row pieces, a warp's pieces whole 128-byte lines (rows past Sq not written). Transposed
    (80 query rows): read back into the fragment, then through shared memory (``store_transposed``)."""

    def __init__(
        self,
        dtype: type[cutlass.Numeric],
        head_dim: int,
        tile_m: int,
        dependent_launch: bool = False,
        last_items_first: bool = False,
    ):
        self.dtype = dtype
        self.head_dim = head_dim
        self.tile_m = tile_m
        # Launched with programmatic stream serialisation after the dK/dV kernel (``BackwardTiles.dependent_launch``):
        # its CTAs may start in the dK/dV kernel's tail and wait (``griddepcontrol.wait``) before reading dQaccum.
        self.dependent_launch = dependent_launch
        # The (batch, head) items in reverse order (``BackwardTiles.postprocess_reversed``): the dK/dV kernel's last
        # CTAs (the last items, in its grid's order and in ``heaviest_first``'s groups) leave their dQaccum in L2.
        self.last_items_first = last_items_first
        self.threads_per_cta = CONSUMER_WARPGROUPS * THREADS_PER_WARPGROUP
        # Transposed: each warpgroup's (tile_m, 64) dQ tile staged in shared memory (``store_transposed``).
        staged = CONSUMER_WARPGROUPS * tile_m * TRANSPOSED_PITCH * dtype.width // 8
        self.shared_bytes = staged if dq_transposed(tile_m) else 0

    @cute.jit
    def __call__(self, mdQaccum: cute.Tensor, mdQ: cute.Tensor, softmax_scale: Float32, stream: cuda.CUstream):
        """dq_accum (B, H, query blocks, 2, 64 · columns) fp32 (``dq_columns``); dq (B, H, Sq, D)."""
        # Addressed through generic pointers (``_host.generic_view``), as the dK/dV kernel's tensors.
        mdQaccum, mdQ = generic_view(mdQaccum), generic_view(mdQ)
        mdQ = sequence_major(mdQ)  # (Sq, D, (H, B))
        self.kernel(dq_mma(self.dtype, self.head_dim, self.tile_m), mdQaccum, mdQ, softmax_scale).launch(
            grid=[mdQaccum.shape[2], mdQaccum.shape[1], mdQaccum.shape[0]],
            block=[self.threads_per_cta, 1, 1],
            smem=self.shared_bytes,
            stream=stream,
            use_pdl=self.dependent_launch,
        )

    @cute.kernel
    def kernel(self, mma: cute.TiledMma, mdQaccum: cute.Tensor, mdQ: cute.Tensor, softmax_scale: Float32):
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, batch = cute.arch.block_idx()
        if cutlass.const_expr(self.last_items_first):
            head, batch = mdQaccum.shape[1] - 1 - head, mdQaccum.shape[0] - 1 - batch
        if cutlass.const_expr(self.dependent_launch):
            cute.arch.griddepcontrol_wait()  # dQaccum is final once the dK/dV grid has ended
        w = tidx // THREADS_PER_WARPGROUP
        wg_tidx = tidx % THREADS_PER_WARPGROUP
        columns, rows = dq_columns(self.head_dim, self.tile_m), ROWS_PER_WARPGROUP
        chunk = mdQaccum[batch, head, m_block, w, None]
        row_box, column_box = dq_box(w, self.tile_m)
        if cutlass.const_expr(dq_transposed(self.tile_m)):  # dQᵀ rows [64w, 64w + 64) of D, the block's queries
            thr = mma.get_slice(wg_tidx)
            acc_dQ = cute.make_rmem_tensor(thr.partition_shape_C((rows, columns)), Float32)  # ((2, 2, columns/8), 1, 1)
            cute.autovec_copy(thread_chunk(chunk, columns, wg_tidx), fragment_as_vectors(acc_dQ, columns))
            rdQ = cute.make_rmem_tensor_like(acc_dQ, self.dtype)
            rdQ.store((acc_dQ.load() * softmax_scale).to(self.dtype))
            staged = cute.make_layout(
                (self.tile_m, rows, CONSUMER_WARPGROUPS), stride=(TRANSPOSED_PITCH, 1, self.tile_m * TRANSPOSED_PITCH)
            )
            sdQ = SmemAllocator().allocate_tensor(self.dtype, staged, byte_alignment=128)  # (tile_m, 64, warpgroup)
            gdQ = cute.local_tile(mdQ[None, None, (head, batch)], (self.tile_m, rows), (m_block, row_box))
            rows_left = mdQ.shape[0] - m_block * self.tile_m
            store_transposed(mma, rdQ, sdQ[None, None, w], gdQ, rows_left, w, wg_tidx)  # (tile_m, 64)
        else:
            box = m_block * (self.tile_m // rows) + row_box
            gdQ = cute.local_tile(mdQ[None, None, (head, batch)], (rows, columns), (box, column_box))  # (64, columns)
            store_quad_rows(chunk, gdQ, columns, wg_tidx, mdQ.shape[0] - box * rows, softmax_scale)


@cute.jit
def store_quad_rows(
    chunk: cute.Tensor, gX: cute.Tensor, columns: cutlass.Constexpr, thread: Int32, rows_left: Int32, scale: Float32
):  # fmt: skip
    """A 64 × ``columns`` fp32 tile in fragment order (``staged_dq_layout``) scaled, cast and stored into
    ``gX``, coalesced both ways. In an m64nN accumulator, lane l of warp u holds, as its vector v, columns
    8v + 2(l % 4) + {0, 1} of rows 16u + l // 4 and that + 8: the four lanes of a quad (4q .. 4q + 3, q =
    16 rows' quad index) hold a row's 8 adjacent columns 8v .. 8v + 7, and their vectors v are 64 contiguous
    bytes. Each (quad, v) pair is one group; this thread takes groups ``thread + 128 s`` with v fastest, so
    that a warp reads whole 64-byte pieces and writes four rows' 128 contiguous bytes each; rows at or past
    ``rows_left`` (the sequence's end, from the tile's first row) are not written."""
    vectors = columns // COLUMNS_PER_QUAD
    quads = THREADS_PER_WARPGROUP // QUAD
    start = chunk.iterator
    flat = cute.make_tensor(
        cute.make_ptr(Float32, start.toint(), start.memspace, assumed_align=QUAD * VALUES_PER_VECTOR * 4),
        cute.make_layout(ROWS_PER_WARPGROUP * columns),
    )
    for s in cutlass.range_constexpr(quads * vectors // THREADS_PER_WARPGROUP):
        group = thread + s * THREADS_PER_WARPGROUP
        vector, quad = group % vectors, group // vectors
        values = cute.make_rmem_tensor(QUAD * VALUES_PER_VECTOR, Float32)
        cute.autovec_copy(cute.local_tile(flat, (QUAD * VALUES_PER_VECTOR,), (vector * quads + quad,)), values)
        row = (quad // QUADS_PER_WARP) * 16 + quad % QUADS_PER_WARP
        for half in cutlass.range_constexpr(2):  # rows row and row + 8: values 0, 1 and 2, 3 of each vector
            piece = cute.make_rmem_tensor(COLUMNS_PER_QUAD, Float32)
            for lane in cutlass.range_constexpr(QUAD):
                for column in cutlass.range_constexpr(2):
                    piece[2 * lane + column] = values[lane * VALUES_PER_VECTOR + 2 * half + column] * scale
            out = cute.make_rmem_tensor(COLUMNS_PER_QUAD, gX.element_type)
            out.store(piece.load().to(gX.element_type))
            if row + 8 * half < rows_left:
                target = cute.local_tile(gX[row + 8 * half, None], (COLUMNS_PER_QUAD,), (vector,))
                aligned = cute.make_ptr(
                    gX.element_type, target.iterator.toint(), target.iterator.memspace, assumed_align=16
                )
                cute.autovec_copy(out, cute.make_tensor(aligned, target.layout))


@cute.jit
def store_transposed(
    mma: cute.TiledMma, rdQ: cute.Tensor, sX: cute.Tensor, gX: cute.Tensor, rows_left: Int32, w: Int32, thread: Int32
):  # fmt: skip
    """A warpgroup's dQᵀ fragment (``mma``'s accumulator over (64 columns of dQ, tile_m query rows), 16-bit)
    stored into ``gX`` (tile_m, 64) through ``sX`` (the same shape, rows ``TRANSPOSED_PITCH`` apart): transposed
    stmatrix (each 8 × 8 matrix's columns, 8 adjacent dQ columns of one query row, 16 contiguous bytes), a barrier
    of the warpgroup, then 16-byte row pieces read back and stored, a warp's four rows' 128 bytes each; query rows
    at or past ``rows_left`` are not written. Two bytes a store through the MMA's partition instead took 139 µs
    at B=8 S=2048 D=128 against 50 for the 64-row postprocess (``results/h200/backward-kernels-2026-11-30/``)."""
    tile_m, columns = cute.size(sX, mode=[0]), cute.size(sX, mode=[1])
    sXt = cute.make_tensor(sX.iterator, cute.select(sX.layout, mode=[1, 0]))  # (64, tile_m): the fragment's shape
    store_atom = cute.make_copy_atom(warp.StMatrix8x8x16bOp(transpose=True, num_matrices=4), sX.element_type)
    thr_store = cute.make_tiled_copy_C(store_atom, mma).get_slice(thread)
    cute.copy(thr_store, thr_store.retile(rdQ), thr_store.partition_D(sXt))
    cute.arch.barrier(barrier_id=1 + w, number_of_threads=THREADS_PER_WARPGROUP)
    pieces = columns // ELEMENTS_PER_PIECE
    for s in cutlass.range_constexpr(tile_m * pieces // THREADS_PER_WARPGROUP):
        piece = thread + s * THREADS_PER_WARPGROUP
        row, column = piece // pieces, piece % pieces
        if row < rows_left:
            values = cute.make_rmem_tensor(ELEMENTS_PER_PIECE, sX.element_type)
            source = cute.local_tile(sX[row, None], (ELEMENTS_PER_PIECE,), (column,))
            cute.autovec_copy(aligned_16(source), values)
            cute.autovec_copy(values, aligned_16(cute.local_tile(gX[row, None], (ELEMENTS_PER_PIECE,), (column,))))


def aligned_16(x: cute.Tensor) -> cute.Tensor:
    """``x`` (8 contiguous 16-bit elements at a 16-byte boundary, which the DSL cannot see through runtime
    indices) with that alignment declared, so that copies use one 16-byte access."""
    start = x.iterator
    return cute.make_tensor(cute.make_ptr(x.element_type, start.toint(), start.memspace, assumed_align=16), x.layout)
