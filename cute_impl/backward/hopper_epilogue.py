"""The staged epilogue of the CuTe ``hopper`` backward's dK/dV kernel (``hopper.py``,
``BackwardTiles(staged_epilogue=True)``): dK and dV leave through shared memory by TMA stores.

What it changes: without it each consumer thread stores its dK and dV accumulators to HBM through the
MMA's C partition (``_device.store_rows``), two bytes a store: 2 · D/2 = 128 ``STG.E.U16`` per thread at
D=128, each warp's store touching eight rows' sectors. Here, as in FlashAttention-4's SM90 backward
(``epilogue_dKV``), each warpgroup converts its accumulators to the input dtype, writes them by
``stmatrix`` into the K and V boxes it no longer needs (its own 64 × D boxes, 128-byte swizzle), and one
warp stores each box by TMA (``cp.async.bulk.tensor``, one ``UTMASTG`` per 64 columns: the swizzle atom's
width): the tensor's shape is the real Sk, so rows past it are clipped by the TMA unit, not written.

When the boxes are free (per warpgroup, after the main loop's last ``wait_group(0)``):
  1. dV → its V box: V is read only by this warpgroup's own dPᵀ = V dOᵀ, retired.
  2. dK → its K box, only once the other warpgroup is done too (dq="reduce": the other warpgroup reads
     both K boxes for dQ = dS K until its last step's dQ has retired): a named barrier of both consumer
     warpgroups (``EpilogueBarrier.BOXES_FREE``, 256 threads).
  3. ``fence.proxy.async`` (generic-proxy writes made visible to the TMA unit), a barrier of the warpgroup,
     then its first warp issues both stores, commits them as one bulk group and waits until they have read
     shared memory (the CTA then exits).
No shared memory is added; the ring and its slots are untouched.
"""

from __future__ import annotations

import enum

import cutlass
import cutlass.cute as cute
from cutlass import Int32
from cutlass.cute.nvgpu import cpasync, warp

from cute_impl._hopper_device import ROWS_PER_WARPGROUP, THREADS_PER_WARPGROUP, ReadOnlyInRegions, tma_partition
from cute_impl.backward._device import CONSUMER_WARPGROUPS
from cute_impl.backward.hopper_dq import DQBarrier


class EpilogueBarrier(enum.IntEnum):
    """Named barrier ids of the staged epilogue, after ``hopper_dq.DQBarrier``'s (both may be live in one
    kernel); ``WG1`` is offset by the consumer warpgroup index."""

    BOXES_FREE = max(DQBarrier) + 1
    STAGED_WG1 = max(DQBarrier) + 2


def tma_store_atoms(mdK: cute.Tensor, mdV: cute.Tensor, box_layout: cute.ComposedLayout, head_dim: int) -> tuple:
    """The TMA store atoms of dK and dV from one (64, D) box of ``box_layout`` (the K/V boxes' layout), and
    the coordinate tensors the kernel partitions instead of ``mdK`` and ``mdV``: ((atom_dK, atom_dV), (mdK, mdV))."""
    store = cpasync.CopyBulkTensorTileS2GOp()
    box = (ROWS_PER_WARPGROUP, head_dim)
    atom_dK, mdK_tma = cpasync.make_tiled_tma_atom(store, mdK, box_layout, box)
    atom_dV, mdV_tma = cpasync.make_tiled_tma_atom(store, mdV, box_layout, box)
    return (atom_dK, atom_dV), (mdK_tma, mdV_tma)


class StagedEpilogue(ReadOnlyInRegions):
    """One consumer warpgroup's dK and dV: accumulators → ``stmatrix`` into its K and V boxes → TMA stores."""

    def __init__(
        self, atoms: tuple, grad_mma: cute.TiledMma, sK: cute.Tensor, sV: cute.Tensor, w: Int32, wg_tidx: Int32,
        dq_reduce: bool,
    ):  # fmt: skip
        self.atom_dK, self.atom_dV = atoms
        self.sK = sK  # (64, D, warpgroup)
        self.sV = sV  # (64, D, warpgroup)
        self.w = w
        self.wg_tidx = wg_tidx
        self.dq_reduce = dq_reduce
        store_atom = cute.make_copy_atom(warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), sK.element_type)
        self.thr_store = cute.make_tiled_copy_C(store_atom, grad_mma).get_slice(wg_tidx)

    @cute.jit
    def stage(self, acc: cute.Tensor, box: cute.Tensor):
        """``acc`` (a (64, D) accumulator of the dK/dV product) in the input dtype into ``box`` by stmatrix."""
        rX = cute.make_rmem_tensor_like(acc, box.element_type)
        rX.store(acc.load().to(box.element_type))
        cute.copy(self.thr_store, self.thr_store.retile(rX), self.thr_store.partition_D(box))

    @cute.jit
    def store(self, acc_dK: cute.Tensor, acc_dV: cute.Tensor, mdK_head: cute.Tensor, mdV_head: cute.Tensor, box: Int32):
        """Steps 1-3 of the module docstring: dK and dV (every wgmma retired) into global box ``box`` (of 64
        keys) of ``mdK_head`` and ``mdV_head`` (the TMA coordinate tensors of this (KV head, batch), (Sk, D))."""
        self.stage(acc_dV, self.sV[None, None, self.w])
        if cutlass.const_expr(self.dq_reduce):
            both = CONSUMER_WARPGROUPS * THREADS_PER_WARPGROUP
            cute.arch.barrier(barrier_id=int(EpilogueBarrier.BOXES_FREE), number_of_threads=both)
        self.stage(acc_dK, self.sK[None, None, self.w])
        # The TMA unit reads shared memory through the async proxy: make the generic-proxy writes visible.
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(barrier_id=int(EpilogueBarrier.STAGED_WG1) + self.w, number_of_threads=THREADS_PER_WARPGROUP)
        if self.wg_tidx < cute.arch.WARP_SIZE:
            head_dim = cute.size(self.sK, mode=[1])
            for atom, smem, gmem in ((self.atom_dK, self.sK, mdK_head), (self.atom_dV, self.sV, mdV_head)):
                tiles = cute.local_tile(gmem, (ROWS_PER_WARPGROUP, head_dim), (None, 0))  # (64, D, Sk/64)
                tXsX, tXgX = tma_partition(atom, smem, tiles)  # (TMA, warpgroup), (TMA, Sk/64)
                cute.copy(atom, tXsX[None, self.w], tXgX[None, box])
            cute.arch.cp_async_bulk_commit_group()
            # The stores must have read shared memory before the CTA exits.
            cute.arch.cp_async_bulk_wait_group(0, read=True)
