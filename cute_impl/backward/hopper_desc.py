"""Rebased wgmma operands of the CuTe ``hopper`` backward's dK/dV kernel (``hopper.py``,
``BackwardTiles(rebased_operands=True)``): the shared-memory boxes that a runtime index picks are
described to the tensor cores from their own address.

What it changes: a wgmma reads a shared-memory operand through a 64-bit descriptor whose low word holds
the tile's address (bits 4-17, masked) and whose high word is a constant (stride, 128-byte swizzle). The
DSL builds the descriptor of an indexed box (``sK[None, None, w]``) from the unindexed tensor's base and adds
the runtime offset to the low word afterwards; each k-step's offset is then a 64-bit add on a low word that
ptxas cannot bound, which it issues as an add with carry, an add of the carry into the high word and a
reload of the constant high word (``UIADD3``, ``UIADD3.X``, ``UMOV``, four uniform instructions per
``HGMMA`` with the other operand's add). Rebased, the box is a fresh tensor whose pointer is its address,
with the alignment and swizzle its type already carries: the descriptor is built from the full address,
its low word is the masked address with known-zero low bits, and the first k-steps' offsets become a
single ``ULOP3`` (an OR) beside the high word's ``UMOV``, as in FlashAttention-4's SM90 backward, where
the warpgroup's K and V rows are a partition of the CTA's tile, not a runtime index of the descriptor.

Where (the boxes that a runtime index selects; the ring's slots, indexed by the stage, already take one
``UIADD3.64`` a k-step and are left as they are):
  1. each consumer warpgroup's K and V boxes, the A operands of Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (``w``);
  2. dq="reduce": its columns (or rows, transposed) of Kᵀ in dQ = dS K (``hopper_dq.dq_box``) where they start
     on a swizzle period (not D=64's 32 columns at 64 query rows: ``rebased_if_aligned``), and the step's dS
     buffer, whose offset (``step % 2``) is folded into the address once per step.
sm_90a, P1's unmasked step (one warp, 32 HGMMA): 438 → 410 SASS instructions, 160 → 138 uniform ones (5.0 →
4.3 a HGMMA; FlashAttention-4's 64-row step: 409 and 113); D=64's 128-row step 578 → 563 (126 → 109 uniform);
the 80-row ``late_dv`` step 522 → 496 (168 → 141). Registers, spills and the wgmma groups are unchanged.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Int32

from cute_impl.backward._device import SMEM_ALIGN_BYTES


def rebased(tensor: cute.Tensor, swizzle: cute.Swizzle, layout: cute.Layout | None = None) -> cute.Tensor:
    """``tensor``'s shared memory through a pointer rebuilt from its address, with the alignment its pointer
    type already proves (at least the swizzle period, checked) and ``swizzle`` (the one its type carries);
    ``layout`` (default: ``tensor``'s) keeps modes past the box, e.g. the slots from the indexed one on."""
    alignment = tensor.iterator.alignment
    if alignment < SMEM_ALIGN_BYTES:
        raise ValueError(f"a rebased operand starts on a swizzle period ({SMEM_ALIGN_BYTES} bytes), got {alignment}")
    address = tensor.iterator.toint()
    pointer = cute.make_ptr(
        tensor.element_type, address, cute.AddressSpace.smem, assumed_align=alignment, swizzle_=swizzle
    )
    return cute.make_tensor(pointer, tensor.layout if layout is None else layout)


def rebased_if_aligned(tensor: cute.Tensor, swizzle: cute.Swizzle) -> cute.Tensor:
    """``tensor`` rebased where its pointer type proves the swizzle period's alignment, else as it is (a box that
    starts inside a swizzle atom, e.g. the second warpgroup's 32 Kᵀ columns at D=64 with 64 query rows, keeps the
    DSL's descriptor arithmetic: its pointer proves only 64 bytes, and ``rebased`` keeps the alignment it is given)."""
    if tensor.iterator.alignment < SMEM_ALIGN_BYTES:
        return tensor
    return rebased(tensor, swizzle)


def box(staged: cute.Tensor, index: Int32, swizzle: cute.Swizzle, rebase: bool) -> cute.Tensor:
    """``staged[None, None, index]``, rebased when ``rebase`` (the knob; off: the DSL's indexed tensor)."""
    selected = staged[None, None, index]
    return rebased(selected, swizzle) if rebase else selected
