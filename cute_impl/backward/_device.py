"""Device and host helpers of the CuTe backward rungs (``cute_impl/backward/``): the shared-memory tiles
and their copies, the ldmatrix operand loads (plain and transposed), per-row vectors read into registers
and accumulators stored to HBM; for ``hopper``, the swizzled rings read K-major and MN-major, their TMA
loads, the query blocks of a key block and :class:`SlotRelease`; on the host, :func:`cute_gradients`, the
``Backward.gradients`` every rung wraps around its launches. The kernels live in the rung files; the
forward's vocabulary (block ranges, masks, ``gemm_double_buffered``; WGMMA fragments, TMA rings) is
``cute_impl/_device.py``'s and ``cute_impl/_hopper_device.py``'s.
"""

# No ``from __future__ import annotations``: ``cute.struct`` reads its field annotations as objects.
from collections.abc import Callable
from typing import Any, NamedTuple

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
import torch
from cutlass.cute.nvgpu import warp, warpgroup
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum

from common.contract.problem import Problem
from common.contract.registry import Gradients, Supports
from common.contract.validation import OPERAND_ALIGNMENT_BYTES, kernel_operand
from cute_impl._device import OperandLoad, load_kv_block
from cute_impl._hopper_device import ROWS_PER_WARPGROUP, ReadOnlyInRegions, tma_pipeline, tma_ring
from cute_impl._host import COPY_BITS, cp_async_tiled_copy, swizzled_qkv_layouts

SMEM_ALIGN_BYTES = 1024
# The B operands read both K-major and MN-major (Q and dO, K) are two layouts of the same bytes.
K_MAJOR, MN_MAJOR = LayoutEnum.ROW_MAJOR, LayoutEnum.COL_MAJOR
# hopper: two consumer warpgroups of 64 rows (128 keys per dK/dV CTA, 128 query rows per dQ CTA).
CONSUMER_WARPGROUPS = 2


def smem_operand(
    tiled_mma: cute.TiledMma,
    tidx: cutlass.Int32,
    smem: cute.Tensor,
    fragment: cute.Tensor,
    operand: str,
    transpose: bool = False,
) -> OperandLoad:
    """The ldmatrix (S→R) load of one ``mma.sync`` operand ("A" or "B") from ``smem`` into ``fragment``;
    ``transpose``: ``smem`` is a transposed view of a row-major tile (``ldmatrix.trans``)."""
    atom = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=transpose, num_matrices=4), smem.element_type)
    tiled_copy = (cute.make_tiled_copy_A if operand == "A" else cute.make_tiled_copy_B)(atom, tiled_mma)
    thr_copy = tiled_copy.get_slice(tidx)
    return OperandLoad(tiled_copy, thr_copy.partition_S(smem), thr_copy.retile(fragment))


def transposed(tile: cute.Tensor, rows: int, head_dim: int) -> cute.Tensor:
    """A (rows, D, 1) shared tile seen as (D, rows): the same memory, read column by column."""
    return cute.composition(tile, cute.make_layout((head_dim, rows, 1), stride=(rows, 1, rows * head_dim)))[
        None, None, 0
    ]


def two_tile_storage(dtype: type[cutlass.Numeric], a_layout, b_layout):
    """Shared memory of a CTA: two tiles of ``a_layout`` (K and V, or Q and dO) and two of ``b_layout``."""

    @cute.struct
    class SharedStorage:
        a0: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(a_layout)], SMEM_ALIGN_BYTES]
        a1: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(a_layout)], SMEM_ALIGN_BYTES]
        b0: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(b_layout)], SMEM_ALIGN_BYTES]
        b1: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(b_layout)], SMEM_ALIGN_BYTES]

    return SharedStorage


def row_tile_layout(rows: int, head_dim: int):
    """A swizzled (rows, D, 1) shared tile: the one-slot ring ``load_kv_block`` copies into."""
    return swizzled_qkv_layouts(rows, rows, head_dim, 1)[1]


def row_tile_copy(dtype: type[cutlass.Numeric], num_threads: int, head_dim: int, tile_rows: tuple[int, ...]):
    """The cp.async tiled copy of whole rows (D / 8 threads per row, 16 B each) into the swizzled tiles
    (a 16-byte vector never straddles a swizzle chunk). One copy step covers num_threads · 8 / D rows,
    which must divide every tile it copies: a partition does not check it, and a taller step would
    write past a 16-row tile into its neighbour."""
    step_rows = num_threads * (COPY_BITS // dtype.width) // head_dim
    if any(rows % step_rows for rows in tile_rows):
        raise ValueError(f"tiles of {tile_rows} rows are not multiples of the copy's {step_rows} rows")
    return cp_async_tiled_copy(dtype, num_threads, row_elems=head_dim)


@cute.jit
def load_rows(row_copy, block: cutlass.Int32, seqlen: cutlass.Int32):
    """Both tiles of ``row_copy`` (a ``KVCopy``: K and V, or Q and dO) at ``block``, rows past ``seqlen``
    zero-filled; single stage: the previous tile's readers are done before, the new tile has landed
    for every thread after."""
    cute.arch.barrier()
    load_kv_block(row_copy, block, 0, seqlen, predicated=True)
    cute.arch.cp_async_commit_group()
    cute.arch.cp_async_wait_group(0)
    cute.arch.barrier()


@cute.jit
def read_row_values(
    mX: cute.Tensor, index: cutlass.Int32, seqlen: cutlass.Int32, past_end: cutlass.Float32
) -> cutlass.Float32:
    """mX[index] of a (Sq,) fp32 vector, or ``past_end`` past its end (the read itself clamped in bounds)."""
    value = mX[cutlass.min(index, seqlen - 1)]
    return cutlass.Float32(cutlass.select_(index < seqlen, value, past_end))


def lanes_allreduce_sum(value: cutlass.Float32, lanes: int) -> cutlass.Float32:
    """The sum over ``lanes`` neighbouring lanes (a power of two dividing 32), by butterfly shuffles."""
    offset = lanes // 2
    while offset > 0:
        value = value + cute.arch.shuffle_sync_bfly(value, offset=offset)
        offset //= 2
    return value


def owned_span(block, blocks, share: int, extent) -> tuple:
    """The [start, stop) of an fp32 buffer of ``extent`` values that CTA ``block`` of ``blocks`` zeroes: its
    ``share`` (the values of its rows), the last CTA's running on to ``extent`` (a layout's padding past the
    blocks' rows). The spans tile [0, extent) exactly, each value once, when (blocks − 1) · share < extent:
    the buffer holds the last CTA's first row (tests/test_cute_backward_zero.py). Plain arithmetic (no
    select), so that the rule also runs on Python ints."""
    start = block * share
    is_last = 1 - cutlass.min(1, blocks - 1 - block)
    return start, start + share + is_last * (extent - start - share)


# A zeroing store: four fp32, 16 bytes.
ZERO_VECTOR = 4


@cute.jit
def zero_span(vector: cute.Tensor, start, stop, tidx: cutlass.Int32, threads: cutlass.Constexpr):
    """vector[start : stop) = 0 by 16-byte stores, thread ``tidx`` of ``threads`` taking every ``threads``-th
    vector of four: ``vector`` a contiguous fp32 (n,) tensor starting 16-byte aligned, ``start`` and
    ``stop`` multiples of four (which the DSL cannot see through runtime values: said here)."""
    address = vector.iterator
    aligned = cute.make_ptr(cutlass.Float32, address.toint(), address.memspace, assumed_align=ZERO_VECTOR * 4)
    vectors = cute.make_tensor(aligned, cute.make_layout((ZERO_VECTOR, cute.size(vector) // ZERO_VECTOR)))
    zeros = cute.make_rmem_tensor(ZERO_VECTOR, cutlass.Float32)
    zeros.fill(0.0)
    for v in cutlass.range(start // ZERO_VECTOR + tidx, stop // ZERO_VECTOR, threads, unroll=1):
        cute.autovec_copy(zeros, vectors[None, v])


@cute.jit
def store_rows(thr_mma, acc: cute.Tensor, gX: cute.Tensor, cX: cute.Tensor, rows_left: cutlass.Int32):
    """``acc`` (an accumulator of ``thr_mma``) cast to ``gX``'s dtype and stored from the fragment;
    rows at or past ``rows_left`` (the sequence's end, counted from the tile's first row) are not written."""
    rX = cute.make_fragment_like(acc, gX.element_type)
    rX.store(acc.load().to(gX.element_type))
    tXgX = thr_mma.partition_C(gX)  # (MMA, MMA_ROWS, MMA_D)
    tXcX = thr_mma.partition_C(cX)  # (row, col) inside the tile
    for i in cutlass.range_constexpr(cute.size(rX)):
        if tXcX[i][0] < rows_left:
            tXgX[i] = rX[i]


# ----------------------------------------------------------------------------------------------
# hopper: swizzled rings for WGMMA, their TMA loads, query blocks, slot release
# ----------------------------------------------------------------------------------------------
def streamed_layouts(dtype: type[cutlass.Numeric], rows: int, head_dim: int, stages: int) -> tuple:
    """A ring of (rows, D) tiles read as the B operand both K-major, (rows, D, stage), and MN-major,
    (D, rows, stage): two layouts of the same bytes."""
    k_major = sm90_utils.make_smem_layout_b(K_MAJOR, (ROWS_PER_WARPGROUP, rows, head_dim), dtype, stages)
    mn_major = sm90_utils.make_smem_layout_b(MN_MAJOR, (ROWS_PER_WARPGROUP, head_dim, rows), dtype, stages)
    return k_major, mn_major


def fixed_layout(dtype: type[cutlass.Numeric], head_dim: int, warpgroups: int) -> cute.ComposedLayout:
    """One (64, D) A-operand box per consumer warpgroup: (64, D, warpgroup)."""
    return sm90_utils.make_smem_layout_a(K_MAJOR, (ROWS_PER_WARPGROUP, ROWS_PER_WARPGROUP, head_dim), dtype, warpgroups)


def shared_storage(
    dtype: type[cutlass.Numeric],
    fixed: cute.ComposedLayout,
    streamed: cute.ComposedLayout,
    stages: int,
    extra: dict | None = None,
) -> type:
    """Barriers of the fixed pair's one-slot ring and the streamed pair's ring, then the two fixed
    tiles (K and V, or Q and dO) and the two streamed ones, each 1024-byte aligned (swizzle period),
    then the ``extra`` fields (name → struct field type) a variant adds."""
    fixed_cosize, streamed_cosize = cute.cosize(fixed), cute.cosize(streamed)
    fields = {
        "fixed_barriers": cute.struct.MemRange[cutlass.Int64, 2],
        "ring_barriers": cute.struct.MemRange[cutlass.Int64, 2 * stages],
        "fixed_a": cute.struct.Align[cute.struct.MemRange[dtype, fixed_cosize], SMEM_ALIGN_BYTES],
        "fixed_b": cute.struct.Align[cute.struct.MemRange[dtype, fixed_cosize], SMEM_ALIGN_BYTES],
        "ring_a": cute.struct.Align[cute.struct.MemRange[dtype, streamed_cosize], SMEM_ALIGN_BYTES],
        "ring_b": cute.struct.Align[cute.struct.MemRange[dtype, streamed_cosize], SMEM_ALIGN_BYTES],
        **(extra or {}),
    }
    return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))


def smem_tensor(field, layout: cute.ComposedLayout) -> cute.Tensor:
    return field.get_tensor(layout.outer, swizzle=layout.inner)


def allocate_rings(storage_type, stages: int, fixed_bytes: int, ring_bytes: int, consumer_warps: int) -> tuple:
    """The kernel's shared storage (``shared_storage``), the fixed pair's one-slot ring as (producer,
    consumer) and the streamed pair's ring itself (a ``SlotRelease`` frees its slots by index), their
    barriers initialised and published to the whole CTA."""
    storage = SmemAllocator().allocate(storage_type)
    fixed = tma_ring(storage.fixed_barriers.data_ptr(), stages=1, consumer_warps=consumer_warps, tx_bytes=fixed_bytes)
    ring = tma_pipeline(
        storage.ring_barriers.data_ptr(), stages=stages, consumer_warps=consumer_warps, tx_bytes=ring_bytes
    )
    cute.arch.mbarrier_init_fence()
    cute.arch.barrier()
    return storage, fixed, ring


@cute.jit
def load_pair(atoms: tuple, sources: tuple, rings: tuple, producer):
    """Wait for a free slot, then TMA both tiles of a pair (Q and dO, or K and V) into it, completing
    one barrier; returns the producer so that loops carry it."""
    slot = producer.acquire_and_advance()
    for atom, source, ring in zip(atoms, sources, rings, strict=True):
        cute.copy(atom, source, ring[None, slot.index], tma_bar_ptr=slot.barrier)
    return producer


@cute.jit
def load_fixed(atoms: tuple, sources: tuple, boxes: tuple, first_box: cutlass.Int32, producer):
    """The CTA's fixed pair (K and V, or Q and dO), (TMA, warpgroup) boxes: source box ``first_box + w``
    into warpgroup ``w``'s box."""
    slot = producer.acquire_and_advance()
    for atom, source, box in zip(atoms, sources, boxes, strict=True):
        for w in cutlass.range_constexpr(cute.size(box, mode=[1])):
            cute.copy(atom, source[None, first_box + w], box[None, w], tma_bar_ptr=slot.barrier)


def query_block_range(
    n_start: cutlass.Int32,
    tile_n: int,
    tile_m: int,
    seqlen_q: cutlass.Int32,
    seqlen_k: cutlass.Int32,
    causal: bool,
    causal_offset,
) -> tuple[cutlass.Int32, cutlass.Int32, cutlass.Int32]:
    """The query blocks of the keys [n_start, n_start + tile_n): [m_block_min, m_block_unmasked) need the
    mask (the causal diagonal; all of them when this key block holds the key tail), then up to
    m_block_max none. Causal: rows i < n_start − causal_offset see none of these keys."""
    # Plain arithmetic (no select), so that the rule also runs on Python ints (tests/test_cute_backward.py).
    m_block_max = (seqlen_q + tile_m - 1) // tile_m
    m_block_min = 0
    m_block_unmasked = 0
    if cutlass.const_expr(causal):
        m_block_min = cutlass.max(n_start - causal_offset, 0) // tile_m
        diagonal_end = cutlass.max(n_start + tile_n - 1 - causal_offset, 0)
        m_block_unmasked = cutlass.max(cutlass.min((diagonal_end + tile_m - 1) // tile_m, m_block_max), m_block_min)
    # A key block holding the key tail masks all its query blocks (holds_tail: 1 if it does, else 0; where
    # m_block_min > m_block_max both loops stay empty either way).
    holds_tail = cutlass.min(1, cutlass.max(0, n_start + tile_n - seqlen_k))
    m_block_unmasked = cutlass.max(m_block_unmasked, holds_tail * m_block_max)
    return m_block_min, m_block_unmasked, m_block_max


# The CTAs of one wave on an H100 or H200 (SXM): heaviest_first's group size. Elsewhere the groups are only
# sized for another wave, never wrong.
WAVE_CTAS = 132


def heaviest_first(
    block: cutlass.Int32, head: cutlass.Int32, batch: cutlass.Int32, wave: int = WAVE_CTAS, grid: tuple | None = None
) -> tuple[cutlass.Int32, cutlass.Int32, cutlass.Int32]:
    """The (block, head, batch) that the CTA ``(block, head, batch)`` of a (blocks, heads, batches) ``grid``
    (default: this launch's) takes, so that the launch order, block fastest, becomes block-major within groups
    of (batch, head) items: block 0 of every item of a group, then block 1, and so on. A group holds the
    power of two of items that first fills a ``wave`` of CTAs.

    Causal, a dK/dV CTA's work falls with its key block (key block n sees the query blocks from about n on:
    block 0 the most). In the grid's own order every item's blocks run heaviest first, but the last items'
    heaviest blocks start in the last wave and finish alone. A greedy schedule of work ∝ blocks − n on 132
    SMs ends after the even share by 5.9 % at P1 (64 key blocks, 32 items) and 6.9 % at B=8 H=16 S=2048 (16
    blocks, 128 items); in these groups (4 and 16 items) by 0.2 % and 1.6 %, and over 9 block counts × 10
    item counts by 3.2 % on average against the grid order's 12.1 % (groups of exactly a wave: 9.0 %; every
    item in one group: 1.6 %, but then every item's Q, dO and dQ accumulator are in flight at once, where a
    group's few stay in L2). A bijection on the grid; plain arithmetic, so that it also runs on Python ints
    (tests/test_cute_backward.py)."""
    blocks, heads, batches = grid if grid is not None else cute.arch.grid_dim()
    needed = (wave + blocks - 1) // blocks
    items_per_group = 1
    for _ in range(wave.bit_length()):  # doubled while short of a wave (unrolled: a few integer ops a CTA)
        items_per_group = items_per_group + items_per_group * cutlass.min(1, cutlass.max(0, needed - items_per_group))
    linear = block + blocks * (head + heads * batch)
    first = linear // (items_per_group * blocks) * items_per_group
    size = cutlass.min(items_per_group, heads * batches - first)  # the last group may be smaller
    within = linear - first * blocks
    block = within // size
    item = first + within - block * size
    return block, item % heads, item // heads


class SlotRelease(ReadOnlyInRegions):
    """Frees the slots of a streamed ring. Without ``overlap`` a step waits for its last products and
    frees its own slot (:meth:`step_done`). Overlapped, the step's last products still read the slot
    when the next step starts, so the next step frees it (:meth:`free_previous`) once its own first
    product has retired: wgmma groups retire in issue order, so the older ones have too."""

    def __init__(self, ring: pipeline.PipelineTmaAsync, stages: int, overlap: bool):
        self.ring = ring
        self.stages = stages
        self.overlap = overlap

    @cute.jit
    def free_previous(self, steps_done: cutlass.Int32):
        """Overlapped: free the slot of step ``steps_done - 1`` (none before the first step)."""
        if cutlass.const_expr(self.overlap):  # noqa: SIM102 (a compile-time and a runtime test)
            if steps_done > 0:
                previous = steps_done - 1
                phase = previous // self.stages % 2
                self.ring.consumer_release(pipeline.PipelineState(self.stages, previous, previous % self.stages, phase))

    @cute.jit
    def step_done(self, slot):
        """Not overlapped: the step's products retire and its slot is freed."""
        if cutlass.const_expr(not self.overlap):
            warpgroup.wait_group(0)
            slot.release()


def rows_operand(t: torch.Tensor) -> torch.Tensor:
    """A (B, H, Sq) row vector (the LSE, dLSE) as the kernels take it: fp32, contiguous, 16-byte aligned."""
    t = t.float().contiguous()
    return t.clone() if t.data_ptr() % OPERAND_ALIGNMENT_BYTES else t


class BackwardOperands(NamedTuple):
    """What a backward rung's kernels take (torch tensors, passed to the TVM-FFI calls as they are):
    q, O, dO, dQ (B, H, Sq, D); k, v, dK, dV (B, Hkv, Sk, D); the LSE and dLSE (None unless the LSE is
    differentiated) (B, H, Sq) fp32."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    out: torch.Tensor
    d_out: torch.Tensor
    lse: torch.Tensor
    d_lse: torch.Tensor | None
    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor


def cute_gradients(name: str, supports: Supports, launch: Callable[..., None]) -> Gradients:
    """The ``Backward.gradients`` of rung ``name``: its capability check (a refusal raises, with the
    reason), q, k, v, O and dO as kernel operands, the LSE (and dLSE) as fp32 rows, dQ, dK and dV
    allocated in the inputs' dtypes, then ``launch(operands, problem, device, **options)`` runs the rung's
    kernels on them (``options``: a rung's variant, e.g. ``tiles``; none for the default)."""

    def gradients(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        d_out: torch.Tensor,
        problem: Problem,
        *,
        d_lse: torch.Tensor | None = None,
        **options: Any,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(dq, dk, dv) of q (B, H, Sq, D), k and v (B, Hkv, Sk, D), given the forward's O and LSE (B, H,
        Sq) and the loss's gradients d_out (like O) and, optionally, d_lse (like the LSE)."""
        ok, reason = supports(problem, q.device)
        if not ok:
            raise ValueError(f"{name} cannot differentiate {problem.describe()}: {reason}")
        q, k, v, out, d_out = (kernel_operand(t) for t in (q, k, v, out, d_out))
        grads = tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
        rows = (rows_operand(lse), None if d_lse is None else rows_operand(d_lse))
        tensors = (q, k, v, out, d_out, *rows, *grads)
        operands = BackwardOperands(*tensors)
        launch(operands, problem, q.device, **options)
        return grads

    return gradients
