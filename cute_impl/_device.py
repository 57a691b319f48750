"""Device helpers shared by the CuTe rungs from ``pipelined`` on: KV-block range, masking, online
softmax, and views of the ``mma.sync.m16n8k16`` register fragments.

The m16n8k16 accumulator gives each thread a fragment ((2 cols, 2 rows), MMA_M, MMA_N): within an
m16n8 tile, lane ``l`` holds rows ``l / 4`` and ``l / 4 + 8``, columns ``2 (l % 4)`` and ``+1``.
A row is therefore spread over the quad of 4 lanes ``4 (l / 4) .. 4 (l / 4) + 3``, which is why
row reductions are two butterfly shuffles.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import cutlass
import cutlass.cute as cute

# The CuTe stack defines its constants once, here (hopper and fp8 import them too); naive, online and
# tiled keep their own LOG2_E so that each reads alone (STYLE.md: rungs up to tiled are self-contained).
LOG2_E = math.log2(math.e)
# Lane distances of the butterfly shuffles that combine the 4 lanes holding one accumulator row.
QUAD_SHUFFLE_OFFSETS = (2, 1)
# Lazy rescaling (see OnlineSoftmax): the running max moves only when a block's max exceeds it by
# more than this many powers of two (log2 units, like row_max), so P stays <= 2^8 = 256.
RESCALE_THRESHOLD = 8.0
# The former name, kept only until cute_impl/hopper.py imports RESCALE_THRESHOLD (issue #19).
RESCALE_THRESHOLD_LOG2 = RESCALE_THRESHOLD


def rows_by_cols(acc: cute.Tensor) -> cute.Tensor:
    """View an accumulator-shaped fragment ((2, 2), MMA_M, MMA_N) as (rows, cols) of this thread."""
    flat = cute.make_layout(acc.shape)
    by_rows = cute.make_layout(
        ((flat.shape[0][1], flat.shape[1]), (flat.shape[0][0], flat.shape[2])),
        stride=((flat.stride[0][1], flat.stride[1]), (flat.stride[0][0], flat.stride[2])),
    )
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, by_rows))


def accumulator_as_operand_a(rP: cute.Tensor) -> cute.Tensor:
    """Regroup an m16n8 accumulator ((2, 2), MMA_M, MMA_N) as m16k16 A operands
    ((2, 2, 2), MMA_M, MMA_N / 2): two neighbouring n8 tiles are the two k8 halves of one k16."""
    divided = cute.logical_divide(rP.layout, (None, None, 2))
    shape = ((divided.shape[0], divided.shape[2][0]), divided.shape[1], divided.shape[2][1])
    stride = ((divided.stride[0], divided.stride[2][0]), divided.stride[1], divided.stride[2][1])
    return cute.make_tensor(rP.iterator, cute.make_layout(shape, stride=stride))


def quad_allreduce(
    value: cutlass.Float32, op: Callable[[cutlass.Float32, cutlass.Float32], cutlass.Float32]
) -> cutlass.Float32:
    """Combine the values of the 4 lanes that hold one accumulator row; all 4 get the result."""
    for offset in QUAD_SHUFFLE_OFFSETS:
        value = op(value, cute.arch.shuffle_sync_bfly(value, offset=offset))
    return value


def _add(a: cutlass.Float32, b: cutlass.Float32) -> cutlass.Float32:
    return a + b


class KVBlockRange:
    """Which K/V blocks a ``tile_m``-row Q tile visits, and how many of them need a mask."""

    def __init__(self, tile_m: int, tile_n: int, causal: bool):
        self.tile_m = tile_m
        self.tile_n = tile_n
        self.causal = causal
        # Visited last block first: causal tiles cross the diagonal in their last tile_m / tile_n
        # blocks; otherwise only the last block can be cut by Sk.
        self.mask_steps = tile_m // tile_n if causal else 1

    @cute.jit
    def n_block_max(self, m_block: cutlass.Int32, seqlen_k: cutlass.Int32) -> cutlass.Int32:
        """Blocks ``[0, n_block_max)``: the causal mask drops blocks right of the tile's last row."""
        n_blocks = cute.ceil_div(seqlen_k, self.tile_n)
        if cutlass.const_expr(self.causal):
            n_blocks = cutlass.min(n_blocks, cute.ceil_div((m_block + 1) * self.tile_m, self.tile_n))
        return n_blocks


class AttentionMask:
    """-inf for keys past Sk and, when causal, for keys right of the diagonal (row i sees j <= i)."""

    def __init__(self, tile_m: int, tile_n: int, causal: bool):
        self.tile_m = tile_m
        self.tile_n = tile_n
        self.causal = causal

    @cute.jit
    def apply(
        self,
        acc_S: cute.Tensor,
        tiled_mma: cute.TiledMma,
        tidx: cutlass.Int32,
        m_block: cutlass.Int32,
        n_block: cutlass.Int32,
        seqlen_q: cutlass.Int32,
        seqlen_k: cutlass.Int32,
    ):
        # A fragment coordinate is (this thread's first coordinate) + (thread 0's coordinate): the
        # thread and value bits of the mma.sync layouts are disjoint. Thread 0's coordinates are
        # compile-time constants, so each element costs one compare with an immediate; comparing
        # full (row, key) coordinates made ptxas keep 32 of them live and spill at 128 registers.
        tile = cute.make_identity_tensor((self.tile_m, self.tile_n))
        tScS = rows_by_cols(tiled_mma.get_slice(tidx).partition_C(tile))  # (rows, cols) of (row, key)
        offsets = rows_by_cols(tiled_mma.get_slice(0).partition_C(tile))  # same, thread 0: static
        first_key = n_block * self.tile_n + tScS[0, 0][1]
        acc_S_mn = rows_by_cols(acc_S)
        for r in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[0])):
            key_limit = seqlen_k
            if cutlass.const_expr(self.causal):
                key_limit = cutlass.min(m_block * self.tile_m + tScS[r, 0][0] + 1, seqlen_k)
            # Keys this thread may keep in row r, counted from its first key.
            keys_left = key_limit - first_key
            for c in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[1])):
                masked = offsets[0, c][1] >= keys_left
                acc_S_mn[r, c] = cutlass.Float32(cutlass.select_(masked, -cutlass.Float32.inf, acc_S_mn[r, c]))


class OnlineSoftmax:
    """Running row maximum and row sum of the rows this thread holds, in registers.

    Row sums stay per-thread partial sums during the loop (each lane sums its own columns) and are
    reduced across the quad once, in :meth:`normalize`; the maximum must agree across the quad at
    every step, so it is reduced each block.

    Lazy rescaling: the running maximum (kept scaled, in log2 units) only moves when a block's
    maximum exceeds it by more than :data:`RESCALE_THRESHOLD`. Until then P = exp2(S - stale
    max) is at most 2^threshold, harmless in fp32 sums and bf16/fp16 P, and O keeps its scale, so
    the 128 multiplies that rescale a thread's O rows are skipped. On random data the maximum
    settles within the first few blocks, so almost every block skips them; the result is exact
    because O and the row sum always share one reference maximum and cancel in the final division.
    """

    def __init__(self, rows: int, softmax_scale_log2: cutlass.Float32):
        self.softmax_scale_log2 = softmax_scale_log2
        self.row_max_scaled = cute.make_rmem_tensor(rows, cutlass.Float32)
        self.row_sum = cute.make_rmem_tensor(rows, cutlass.Float32)
        self.row_max_scaled.fill(-cutlass.Float32.inf)
        self.row_sum.fill(0.0)

    @cute.jit
    def update(self, acc_S: cute.Tensor, acc_O: cute.Tensor):
        """S → P = exp2(S·scale_log2 − m) in place; m, O and the row sum move only when m must."""
        acc_S_mn = rows_by_cols(acc_S)
        acc_O_mn = rows_by_cols(acc_O)
        rows = cute.size(acc_S_mn, mode=[0])
        scale_log2 = self.softmax_scale_log2
        # Local names: the DSL's dynamic `if` below may write tensors, but not attributes of self.
        row_max_scaled, row_sum = self.row_max_scaled, self.row_sum
        rescale = cute.make_rmem_tensor(rows, cutlass.Float32)
        moved = cutlass.Boolean(False)
        for r in cutlass.range_constexpr(rows):
            block_max = acc_S_mn[r, 0]
            for c in cutlass.range_constexpr(1, cute.size(acc_S_mn, mode=[1])):
                block_max = cute.arch.fmax(block_max, acc_S_mn[r, c])
            block_max_scaled = quad_allreduce(block_max, cute.arch.fmax) * scale_log2
            rescale[r] = cutlass.Float32(1.0)
            # All four lanes of the row see the same values, so they agree. The first block with a
            # visible key always moves the maximum (-inf + threshold = -inf; the factor is then 0).
            if block_max_scaled > row_max_scaled[r] + RESCALE_THRESHOLD:
                rescale[r] = cute.math.exp2(row_max_scaled[r] - block_max_scaled, fastmath=True)
                row_max_scaled[r] = block_max_scaled
                moved = cutlass.Boolean(True)
            row_sum[r] = row_sum[r] * rescale[r]
            # Guard: a row that has seen only masked keys keeps -inf; subtract 0 instead so that
            # exp2(-inf - -inf) = NaN never happens (its P is then 0).
            max_scaled = row_max_scaled[r]
            if max_scaled == -cutlass.Float32.inf:
                max_scaled = cutlass.Float32(0.0)
            block_sum = cutlass.Float32(0.0)
            for c in cutlass.range_constexpr(cute.size(acc_S_mn, mode=[1])):
                p = cute.math.exp2(acc_S_mn[r, c] * scale_log2 - max_scaled, fastmath=True)
                acc_S_mn[r, c] = p
                block_sum = block_sum + p
            row_sum[r] = row_sum[r] + block_sum
        # One warp-uniform branch for all rows: no divergence, and the multiplies stay one block.
        if cute.arch.vote_any_sync(moved):
            for r in cutlass.range_constexpr(rows):
                for c in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[1])):
                    acc_O_mn[r, c] = acc_O_mn[r, c] * rescale[r]

    @cute.jit
    def normalize(self, acc_O: cute.Tensor):
        """O /= row_sum; a row with no visible key (sum 0) is written as zeros, not inf/NaN."""
        acc_O_mn = rows_by_cols(acc_O)
        for r in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[0])):
            total = quad_allreduce(self.row_sum[r], _add)
            inv_total = 0.0 if total == 0.0 else cute.arch.rcp_approx(total)
            for c in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[1])):
                acc_O_mn[r, c] = acc_O_mn[r, c] * inv_total
