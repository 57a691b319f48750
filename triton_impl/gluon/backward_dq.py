"""dQ inside the dK/dV kernel for the Gluon ``hopper`` backward (``backward.py``, ``BackwardTiles(dq=...)``):
the pieces its dK/dV kernel adds to make each step's share of dQ itself, and the kernel that finishes dQ
(counterpart: ``cute_impl/backward/hopper_dq.py``, ``dq="reduce"`` in the CuTe stack).

What it changes: the default (``dq="pass"``) runs a dQ kernel that recomputes S and dP, seven products per
(query block, key block) where five are counted. Here the dK/dV kernel, which holds dSᵀ for its 128 keys and
the step's BLOCK_M query rows, also makes that block's dQ share and adds it into an fp32 accumulator in HBM;
a last launch scales it by softmax_scale and casts it. Five products per step; dQ is not bitwise
deterministic (the adds of the key blocks come in any order; dK and dV still are).

Plain steps, per step, after dK += dSᵀ Q is issued (``plain_dq_share``):
  1. Each consumer writes its dSᵀ (64 keys × BLOCK_M queries, 16-bit) into its shared buffer of the step's
     parity and waits for the other's (``_device.share_ds``): dQ sums over all 128 keys of the CTA.
  2. Each consumer issues dQᵀ = Kᵀ dSᵀ for its half of D (``_device.dq_t_product``: M = D/2 = 64 rows, as
     the BLOCK_M = 32 query rows are too few for an m64 wgmma; A = Kᵀ, an MN-major view of the K tiles).
  3. Once dQᵀ (and dK) have retired and the ring slot is freed, the share goes out by ``DQ``:
     ``"atomic"`` (``_device.add_dq``): per-element relaxed fp32 atomics from registers into a (B, H, Sq, D)
     accumulator, converted by the Triton rung's ``tiled._dq_convert_kernel``; measured slower than the pass.
     ``"reduce"`` (``reduce_dq``, FlashAttention-3/4's way): the consumer stores its 16 fp32 registers per
     thread into its own D/2 × BLOCK_M staging tile (fp32, 128-byte swizzle: conflict-free, the wgmma
     accumulator's own epilogue store), fences, and one thread issues a TMA reduce-add of the tile into a
     transposed (B·H, D, Sq) accumulator (``cp.reduce.async.bulk.tensor.3d ... .add.f32``): the L2 does the
     adds, the consumer never waits for them; before the next step's store it waits only until the bulk
     copy has read the tile (``store_wait``). ``_dq_transposed_convert_kernel`` turns the accumulator
     into dQ. The transposed layout is what lets dQᵀ leave without a transpose through registers: each row of
     the staging tile is one head-dim index over the step's query rows.

Overlapped steps (``"reduce"`` only; ``BackwardTiles.overlap``): step s issues Sᵀ and dPᵀ, then the previous
step's dK += dSᵀ Q and, once both consumers' dSᵀ of step s − 1 are in their buffer, its dQᵀ = Kᵀ dSᵀ
(``previous_dq_t``), so that both run under step s's exp2; once all have retired (``warpgroup_mma_wait(0)``,
no product in flight across the loop's back edge), the consumer publishes step s's dSᵀ (``publish_ds``: the
other consumer waits for it one step later, not now) and sends step s − 1's share by the reduce-add above, at
that step's (batch_head, m_start), carried through the loop (``overlapped_dq_share``); the last step's product
and add follow the loop (``last_dq_share``). Step 0 has no previous share: its dQᵀ product reads a buffer not
yet written and is not added. D is read again just before dSᵀ (``late_delta``): its registers are free under
the exp2, where dQᵀ's accumulator now sits beside Sᵀ and dPᵀ (spills at causal GQA shapes without it).

Resources (D=128, BLOCK_M = 32): 16 KB of dS buffers (2 parities × 2 consumers × 64 × 32 × 2 bytes), 16 KB of
staging (2 consumers × 64 × 32 × 4 bytes), 16 fp32 registers per thread for dQᵀ; L2 traffic 32 · D · 4 bytes
per (query block, key block) step, FlashAttention-3's ratio (its 64 × 128 tiles add 64 · D · 4).

Limits: D=128 only (each consumer's half of D must be the 64 rows of one m64 wgmma); the atomic dQ runs the
plain steps only; the reduce-add is issued by the consumers (FA4: a warp of its own). Triton 3.6's Gluon has
the TMA reduce op but no Python name for it (3.7 added ``tma.async_atomic_add``): ``_tma_reduce_add`` builds
the same op there.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from common.contract.problem import Problem
from common.contract.registry import Launch
from triton_impl.gluon._device import _partition_barrier, add_dq, dq_t_product, publish_ds, share_ds
from triton_impl.gluon._host import shared_layout
from triton_impl.gluon.backward_rows import padded_seqlen, step_row

# How the backward makes dQ: a separate pass, or in the dK/dV kernel by atomics or by TMA reduce-adds.
DQ_MODES = ("pass", "atomic", "reduce")
# The in-kernel dQ's head dim: each consumer's dQᵀ share is D/2 = 64 rows, one m64 wgmma.
IN_KERNEL_HEAD_DIM = 128
# Releases under which every in-kernel dQ variant's dK/dV kernel spills, in its step loops too (Triton 3.9,
# sm_90a, 2026-11-30: 56-152 bytes per thread at the static test's shapes). No release lists these variants
# (``backward.CANDIDATES`` holds only dq="pass"); the static test checks all but the spills there.
IN_KERNEL_DQ_SPILLS = ("3.9",)
# The conversion kernel's query rows per program.
CONVERT_BLOCK_M = 64

if hasattr(tma, "async_atomic_add"):
    _tma_reduce_add = tma.async_atomic_add
else:
    from triton._C.libtriton import ir
    from triton.experimental.gluon.language._core import builtin

    @builtin
    def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
        """Triton 3.6: the op 3.7's ``tma.async_atomic_add`` builds (``ttng.async_tma_reduce``, kind add),
        which 3.6's Gluon builder has but its ``tma`` module does not name."""
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


# ----------------------------------------------------------------------------------------------
# Device: shared memory, the transposed K halves and the step's dQ share
# ----------------------------------------------------------------------------------------------
@gluon.jit
def allocate_dq(desc_k, desc_q, ring, ring_ready, DQ: gl.constexpr, NUM_CONSUMERS: gl.constexpr):
    """The in-kernel dQ's shared memory: ``(ds_all, ds_ready, staging)``. ``ds_all``: two buffers (step
    parity; index buffer · NUM_CONSUMERS + consumer) of each consumer's dSᵀ (WG_N keys × BLOCK_M query rows),
    the B operands of both consumers' dQᵀ products; ``ds_ready``: a buffer is ready once both consumers have
    arrived. ``staging`` (``"reduce"``): one fp32 D/2 × BLOCK_M tile per consumer. Where the mode does not
    use them, the Q ring ``ring`` and its barriers ``ring_ready`` stand in (never read)."""
    ds_all = ring
    ds_ready = ring_ready
    staging = ring
    WG_N: gl.constexpr = desc_k.block_type.shape[2]
    BLOCK_M: gl.constexpr = desc_q.block_type.shape[2]
    HALF_D: gl.constexpr = desc_q.block_type.shape[3] // NUM_CONSUMERS
    if DQ != "pass":
        ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([WG_N, BLOCK_M], desc_q.dtype)
        ds_all = gl.allocate_shared_memory(desc_q.dtype, [2 * NUM_CONSUMERS, WG_N, BLOCK_M], ds_layout)
        ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for buffer in gl.static_range(2):
            mbarrier.init(ds_ready.index(buffer), count=NUM_CONSUMERS)
        fence_async_shared()
    if DQ == "reduce":
        staging_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HALF_D, BLOCK_M], gl.float32)
        staging = gl.allocate_shared_memory(gl.float32, [NUM_CONSUMERS, HALF_D, BLOCK_M], staging_layout)
    return ds_all, ds_ready, staging


@gluon.jit
def k_halves(fixed_k, index, DQ: gl.constexpr):
    """Consumer ``index``'s half of D's rows of both consumers' K tiles, transposed (``dq_t_product``'s
    A operands); without an in-kernel dQ, the fixed tiles themselves (never read)."""
    NUM_CONSUMERS: gl.constexpr = fixed_k.shape[0]
    HALF_D: gl.constexpr = fixed_k.shape[2] // NUM_CONSUMERS
    k_t = (fixed_k.index(0), fixed_k.index(1))
    if DQ != "pass":
        k_t = (
            fixed_k.index(0).slice(index * HALF_D, HALF_D, dim=1).permute((1, 0)),
            fixed_k.index(1).slice(index * HALF_D, HALF_D, dim=1).permute((1, 0)),
        )
    return k_t


@gluon.jit
def k_tiles_free(ds_ready, steps, DQ: gl.constexpr):
    """After a consumer's last step: wait until both consumers' dQᵀ products have retired, so that a
    consumer may write its dK through its K tile, which the other's products read. Both arrive at the dSᵀ
    barrier of step ``steps`` (never used by a step), each only once its own products have retired
    (``share_ds``' protocol); nothing to wait for without an in-kernel dQ."""
    if DQ != "pass":
        mbarrier.arrive(ds_ready.index(steps % 2), count=1)
        mbarrier.wait(ds_ready.index(steps % 2), (steps // 2) & 1)


@gluon.jit
def reduce_dq(dq_t, staging, DQAccumT, batch_head, m_start, index):
    """``"reduce"``: dQᵀ (consumer ``index``'s half of D × the step's query rows from ``m_start``) added into
    the transposed accumulator by one TMA reduce-add from the consumer's staging tile; query rows past Sq are
    clipped by the descriptor's bounds. The tile is rewritten only once the previous add has read it."""
    HALF_D: gl.constexpr = dq_t.shape[0]
    BLOCK_M: gl.constexpr = dq_t.shape[1]
    tile = staging.index(index)
    # Bulk groups belong to the thread that issued them: it waits, the barrier holds the others.
    tma.store_wait(0)
    _partition_barrier()
    tile.store(dq_t)
    fence_async_shared()
    _partition_barrier()
    _tma_reduce_add(DQAccumT, [batch_head, index * HALF_D, m_start], tile.reshape([1, HALF_D, BLOCK_M]))


@gluon.jit
def plain_dq_share(dk, dv, d_s_t, empty, step, coords, seqlen_q, vectors, s_layout: gl.constexpr, DQ: gl.constexpr):
    """Plain steps, with dK += dSᵀ Q (``dk``) and dV += Pᵀ dO (``dv``) in flight: dSᵀ is shared for dQᵀ while
    they run; dQᵀ's accumulator is made once dV's Pᵀ words are free; once dK and dQᵀ have retired the ring
    slot is freed (``empty``) and the share goes out by ``DQ``. Returns ``(dk, dv)``."""
    dq_out = vectors[2]
    ds_all = vectors[3]
    index = vectors[5]
    buffer = share_ds(d_s_t, step, index, ds_all, vectors[4])
    dv = warpgroup_mma_wait(1, deps=[dv])
    dq_t_token = dq_t_product(buffer, vectors[6], ds_all, s_layout)
    dk, dq_t = warpgroup_mma_wait(0, deps=[dk, dq_t_token])
    mbarrier.arrive(empty, count=1)
    add_dq_share(dq_t, dq_out, coords[0], coords[1], seqlen_q, index, s_layout, DQ)
    return dk, dv


@gluon.jit
def previous_dq_t(step, vectors, s_layout: gl.constexpr):
    """Overlapped steps: issue the previous step's dQᵀ = Kᵀ dSᵀ (``dq_t_product``, a wgmma token) once both
    consumers' dSᵀ of that step are in their buffer (``publish_ds``). Step 0 has no previous step: it waits
    on buffer 1's phase before phase 0, which a fresh barrier has completed, and reads the unwritten buffer;
    that product is never added (``overlapped_dq_share``)."""
    ds_all = vectors[3]
    ds_ready = vectors[4]
    # Buffer and phase of step s − 1, written with s + 1 so that step 0 needs no branch.
    buffer = (step + 1) % 2
    mbarrier.wait(ds_ready.index(buffer), ((step + 1) // 2 + 1) & 1)
    return dq_t_product(buffer, vectors[6], ds_all, s_layout)


@gluon.jit
def late_delta(Delta, row_base, offs_m, seqlen_q, step, NUM_STAGES: gl.constexpr, TMA_ROWS: gl.constexpr):
    """Overlapped steps: the step's D read again when dSᵀ is made (``_dkdv_step``'s early load, then unused,
    is dropped), so that its registers are not live under the exp2 beside dQᵀ's accumulator, Sᵀ and dPᵀ
    (a spill at causal GQA shapes otherwise)."""
    return step_row(Delta, row_base, offs_m, seqlen_q, step, NUM_STAGES, TMA_ROWS, 0.0)


@gluon.jit
def overlapped_dq_share(dq_t, d_s_t, step, coords, vectors):
    """Overlapped steps, once the step's products (the previous step's dQᵀ among them) have retired: this
    step's dSᵀ into its buffer for the next step's product, then the previous step's dQᵀ share out by a
    reduce-add at that step's ``coords`` (batch_head, m_start), none before step 0."""
    dq_out = vectors[2]
    index = vectors[5]
    publish_ds(d_s_t, step, index, vectors[3], vectors[4])
    if step > 0:
        reduce_dq(dq_t, dq_out[1], dq_out[0], coords[0], coords[1], index)


@gluon.jit
def last_dq_share(steps, coords, vectors, s_layout: gl.constexpr):
    """Overlapped steps, after the loop: the last step's dQᵀ product, run to the end, and its reduce-add at
    that step's ``coords``; nothing without steps."""
    dq_out = vectors[2]
    if steps > 0:
        dq_t = warpgroup_mma_wait(0, deps=[previous_dq_t(steps, vectors, s_layout)])
        reduce_dq(dq_t, dq_out[1], dq_out[0], coords[0], coords[1], vectors[5])


@gluon.jit
def add_dq_share(dq_t, dq_out, batch_head, m_start, seqlen_q, index, s_layout: gl.constexpr, DQ: gl.constexpr):
    """A step's dQᵀ share out by ``DQ``: ``dq_out`` is the (B, H, Sq, D) accumulator (``"atomic"``) or the
    transposed accumulator's descriptor and the staging tiles (``"reduce"``)."""
    if DQ == "atomic":
        add_dq(dq_t, dq_out[0], batch_head.to(gl.int64) * seqlen_q, m_start, seqlen_q, index, s_layout)
    else:
        reduce_dq(dq_t, dq_out[1], dq_out[0], batch_head, m_start, index)


# ----------------------------------------------------------------------------------------------
# Host: the accumulator, its descriptor and the conversion
# ----------------------------------------------------------------------------------------------
@triton.jit
def _dq_transposed_convert_kernel(
    DQAccumT, DQ, seqlen_q, padded_q, softmax_scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr
):  # fmt: skip
    """dQ (B, H, Sq, D) = softmax_scale · the transpose of the (B·H, D, padded_q) accumulator, in dQ's dtype."""
    m_block = tl.program_id(0)
    batch_head = tl.program_id(1).to(tl.int64)
    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seqlen_q
    accum = DQAccumT + batch_head * HEAD_DIM * padded_q + offs_d[:, None] * padded_q + offs_m[None, :]
    dq = tl.trans(tl.load(accum, mask=row_ok[None, :], other=0.0)) * softmax_scale
    out = DQ + (batch_head * seqlen_q + offs_m)[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(out, dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])


def transposed_accumulator(problem: Problem, device: torch.device) -> torch.Tensor:
    """The zeroed fp32 (B·H, D, padded Sq) accumulator of ``"reduce"``: each head-dim row of a head starts
    16-byte aligned (a TMA source's strides), the padding never written (the descriptor stops at Sq)."""
    shape = (problem.batch * problem.heads, problem.head_dim, padded_seqlen(problem.seqlen_q))
    return torch.zeros(shape, dtype=torch.float32, device=device)


def accumulator_descriptor(accum_t: torch.Tensor, problem: Problem, block_m: int) -> TensorDescriptor:
    """The reduce-adds' 3-D descriptor over ``accum_t``'s first Sq query rows: a (1, D/2, ``block_m``) box,
    one consumer's dQᵀ share, in the staging tile's layout (fp32, 128-byte swizzle at 32 rows)."""
    view = accum_t[..., : problem.seqlen_q]
    box = (1, problem.head_dim // 2, block_m)
    return TensorDescriptor(view, list(view.shape), list(view.stride()), list(box), shared_layout(box, gl.float32))


def convert_launch(accum_t: torch.Tensor, dq: torch.Tensor, problem: Problem) -> Launch:
    """The last launch of ``"reduce"``: dQ from the transposed accumulator (``_dq_transposed_convert_kernel``)."""
    return (
        _dq_transposed_convert_kernel,
        (triton.cdiv(problem.seqlen_q, CONVERT_BLOCK_M), problem.batch * problem.heads),
        (accum_t, dq, problem.seqlen_q, accum_t.shape[-1], problem.scale),
        {"HEAD_DIM": problem.head_dim, "BLOCK_M": CONVERT_BLOCK_M},
    )
