"""LSE₂ and D through the ring for the Gluon ``hopper`` backward (``backward.py``,
``BackwardTiles(tma_rows=True)``): the pieces the dK/dV kernel adds to load them by TMA
(counterpart: ``cute_impl/backward/hopper_rows.py``, the same change in the CuTe stack).

What it changes: every dK/dV step needs, for each of its ``BLOCK_M`` query rows, LSE₂ (for Pᵀ =
exp2(Sᵀ · softmax_scale_log2 − LSE₂)) and D (for dSᵀ = Pᵀ ∘ (dPᵀ − D)). Without this variant each consumer
thread reads its columns' values from HBM every step (``step_rows``' second branch: a bounds mask, a 64-bit
address, 2 · BLOCK_M / 8 values in ``LDG.E.64``s), and ptxas issues the D loads after the wait for Sᵀ, so
their L2 latency sits in the step's critical path with only the other warpgroup's tensor-core work to hide
it. Here the load warp adds a (1, 1, BLOCK_M) fp32 box to each streamed tile of a ring slot (``load_slot``:
LSE₂ on the Q tile's barrier, D on dO's, counted in the same transaction), and the step reads them from
shared memory once it has waited for those tiles (``step_rows``: ``LDS``, no bounds arithmetic), as
FlashAttention-4's sm90 backward does (``flash_bwd_sm90.py`` loads LSE and dPsum with each Q and dO stage).

Rows past Sq: the box bounds zero-fill them, so LSE₂ and D are 0 there (not +inf and 0 as the HBM reads
give). Their P is then exp2(0) = 1 rather than 0, but their Q and dO rows are zero-filled too, so Sᵀ, dPᵀ
and D are 0 in those columns: dV gains Pᵀ · 0, dK gains dSᵀ = 1 · (0 − 0) = 0. A TMA source needs 16-byte
outer strides: with ``row_align = ROW_ALIGN`` the preprocess (``tiled.preprocess_launch``) starts each
head's rows at a multiple of four floats (the padding is never read: the box bounds stop at Sq), and the
dQ pass, which reads its rows once per CTA from HBM, finds them there (``head_rows``).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from common.contract.problem import Problem
from triton_impl.gluon._device import _as_box, _tma_load

# A TMA source's outer strides: multiples of 16 bytes, ROW_ALIGN floats.
TMA_STRIDE_BYTES = 16
FLOAT_BYTES = 4
ROW_ALIGN = gl.constexpr(TMA_STRIDE_BYTES // FLOAT_BYTES)
# A row vector's (1, 1, rows) box in shared memory: fp32, unswizzled (read back by plain LDS).
ROW_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3)


def padded_seqlen(seqlen_q: int) -> int:
    """The floats between two heads' rows of LSE₂ and D as the preprocess writes them with ``row_align =
    ROW_ALIGN``."""
    return -(-seqlen_q // ROW_ALIGN.value) * ROW_ALIGN.value


def dkdv_rows(
    lse_log2: torch.Tensor, delta: torch.Tensor, problem: Problem, box_rows: int, tma_rows: bool
) -> tuple[torch.Tensor | TensorDescriptor, ...]:
    """What the dK/dV kernel takes for LSE₂ and D: with ``tma_rows``, a 3-D descriptor each over the padded
    (B, H, Sq) rows with a (1, 1, ``box_rows``) box whose bounds stop at Sq; else the (B·H·Sq) vectors."""
    if not tma_rows:
        return lse_log2, delta
    padded = padded_seqlen(problem.seqlen_q)
    shape = [problem.batch, problem.heads, problem.seqlen_q]
    strides = [problem.heads * padded, padded, 1]
    return tuple(TensorDescriptor(t, shape, strides, [1, 1, box_rows], ROW_LAYOUT) for t in (lse_log2, delta))


@gluon.jit
def head_rows(batch_head, seqlen_q, TMA_ROWS: gl.constexpr):
    """Where the rows of ``batch_head`` (batch · H + head) start in the LSE₂ and D vectors: packed, or with
    TMA_ROWS each head padded to ROW_ALIGN floats."""
    stride = seqlen_q
    if TMA_ROWS:
        stride = (seqlen_q + ROW_ALIGN - 1) // ROW_ALIGN * ROW_ALIGN
    return batch_head.to(gl.int64) * stride


@gluon.jit
def allocate_rows(LseLog2, Delta, q_ring, TMA_ROWS: gl.constexpr):
    """With TMA_ROWS, a ring of LSE₂ and one of D beside the Q ring ``q_ring`` (its slots, a (1, 1, BLOCK_M)
    fp32 box each): ``(loads, lse_log2, delta)``, what the load warp takes (descriptors and rings) and what the
    consumers read (the rings). Without, no load and the vectors themselves."""
    loads = ()
    lse_log2 = LseLog2
    delta = Delta
    if TMA_ROWS:
        shape: gl.constexpr = [q_ring.shape[0], 1, 1, q_ring.shape[1]]
        lse_log2 = gl.allocate_shared_memory(gl.float32, shape, LseLog2.layout)
        delta = gl.allocate_shared_memory(gl.float32, shape, Delta.layout)
        loads = (LseLog2, Delta, lse_log2, delta)
    return loads, lse_log2, delta


@gluon.jit
def load_slot(desc, ring, rows, which: gl.constexpr, coords, ready, stage, TMA_ROWS: gl.constexpr):
    """TMA one streamed tile (rows from ``coords`` = (batch, head, row)) into slot ``stage`` of ``ring`` on
    the slot's barrier ``ready``; with TMA_ROWS also the same rows of LSE₂ (``which`` 0) or D (1) from
    ``rows`` (``allocate_rows``' loads), counted in the same transaction."""
    if TMA_ROWS:
        mbarrier.expect(ready, desc.block_type.nbytes + rows[which].block_type.nbytes)
    else:
        mbarrier.expect(ready, desc.block_type.nbytes)
    _tma_load(desc, [coords[0], coords[1], coords[2], 0], ready, _as_box(ring.index(stage)))
    if TMA_ROWS:
        _tma_load(rows[which], coords, ready, rows[2 + which].index(stage))


@gluon.jit
def step_row(Vector, row_base, offs_m, seqlen_q, step, NUM_STAGES: gl.constexpr, TMA_ROWS: gl.constexpr,
             OTHER: gl.constexpr):  # fmt: skip
    """LSE₂ or D (``Vector``) of a dK/dV step's query columns ``offs_m``, in ``offs_m``'s layout. With TMA_ROWS,
    from slot step % NUM_STAGES of its ring (call after waiting for the slot's Q and dO; rows past Sq 0, the
    box's zero fill). Else from the vector at ``row_base``, rows past Sq ``OTHER``."""
    if TMA_ROWS:
        BLOCK_M: gl.constexpr = Vector.shape[3]
        row = Vector.index(step % NUM_STAGES).reshape([BLOCK_M]).load(offs_m.type.layout)
    else:
        row = gl.load(Vector + row_base + offs_m, mask=offs_m < seqlen_q, other=OTHER)
    return row


@gluon.jit
def step_rows(LseLog2, Delta, row_base, offs_m, seqlen_q, step, NUM_STAGES: gl.constexpr, TMA_ROWS: gl.constexpr):
    """LSE₂ and D of a dK/dV step (``step_row``; rows past Sq: LSE₂ +inf, so that their P is 0, and D 0),
    issued together so that they load under the step's first wgmmas."""
    lse_log2 = step_row(LseLog2, row_base, offs_m, seqlen_q, step, NUM_STAGES, TMA_ROWS, float("inf"))
    delta = step_row(Delta, row_base, offs_m, seqlen_q, step, NUM_STAGES, TMA_ROWS, 0.0)
    return lse_log2, delta
