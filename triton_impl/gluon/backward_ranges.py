"""The causal diagonal in the Gluon ``hopper`` backward (``backward.py``): block ranges per consumer warpgroup
(``BackwardTiles(consumer_ranges=True)``, causal launches only) and masks by a limit per row
(``BackwardTiles(limit_mask=True)``); also the overlapped steps' chain helpers (``previous_stage``,
``release_previous``, ``last_product``) that both kernels and ``skip_step`` use.

Where causal time goes (P1 causal, D=128 tiles; static, from the block ranges and sm_90a SASS under 3.8): each
kernel runs 0.508 of the non-causal steps (the H200 measured 0.511 of the time, FA4 0.541), 3.1 % of them
masked (11.8 % at B=8 S=2048), and a masked step is longer: dQ 493 SASS instructions against 250 unmasked,
dK/dV 268 against 199.

Consumer ranges: a CTA's block range (``query_blocks`` over the dK/dV kernel's 128 keys, ``block_range`` over
the dQ pass's 128 query rows) is the union of its two consumers' ranges, and each consumer ran all of it. On
the diagonal one consumer's half sees nothing in some steps: in the dK/dV kernel the query blocks above the
diagonal of the upper 64 keys (two 32-row blocks per (key block, query head) at D=128, one 64-row block at
D=64), in the dQ pass the key block right of the diagonal of the lower 64 rows (one per CTA). Those steps
ran every product on P = 0, on the tensor cores the other consumer shares. Here each consumer takes its own
range (the same functions over its own 64 keys or rows):
  * dK/dV, the upper consumer skips its leading query blocks of each head (``skip_step``): it waits for the
    slot's tiles and frees it, so the load warp's ring protocol is unchanged; overlapped, the product in
    flight (the previous step's dK += dSᵀ Q) is finished there and the next step's "previous" product reads
    zero words (as step 0's does);
  * dQ, the lower consumer stops before its trailing key block and never frees that slot: a skipped slot's
    next use would be at least NUM_STAGES blocks later, past the CTA's last block (the two consumers' ends
    differ by at most one block, and overlapped tiles have two slots or more);
  * each consumer's masked steps are only those its own keys or rows need (half of the CTA's).
At P1 causal 0.8 % of each kernel's consumer steps are skipped, at B=8 S=2048 causal 2.9 %.

Limit masks: ``_device``'s masks compare every value with two conditions (the key tail, the diagonal), and
the dQ pass masks S before the exp, which splits S · scale − LSE₂ into two instructions. ``mask_p_t`` and
``mask_p`` fold both conditions into one limit per row (its first visible column, or its end), compare each
value once and mask P after the exp: masked steps 493 → 332 (dQ), 268 → 249 (dK/dV); the unmasked steps
are unchanged. Non-causal, the dK/dV kernel keeps ``transposed_mask`` (its key tail is a row predicate).
Neither knob changes a product; where a dQ step is no longer masked before the exp, S · scale − LSE₂ is one
FFMA instead of an FMUL and an FADD (the unmasked steps' rounding), so P may differ in its last bit there.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma_wait

from triton_impl.gluon._device import (
    _operand_p,
    _ready_tile,
    _values_product,
    attention_mask,
    block_range,
    query_blocks,
    transposed_mask,
)


# ----------------------------------------------------------------------------------------------
# The overlapped steps' chain (a step issues the previous step's last product)
# ----------------------------------------------------------------------------------------------
@gluon.jit
def previous_stage(step, NUM_STAGES: gl.constexpr):
    """Overlapped steps: the ring slot of the previous step (step 0: its own, whose tiles have landed)."""
    return gl.maximum(step - 1, 0) % NUM_STAGES


@gluon.jit
def release_previous(empty, step, NUM_STAGES: gl.constexpr):
    """Overlapped steps: free the previous step's ring slot (none before step 0) once the products
    that read it have retired."""
    mbarrier.arrive(empty.index(previous_stage(step, NUM_STAGES)), count=1, pred=step > 0)


@gluon.jit
def last_product(acc, words, ring, steps, p_layout: gl.constexpr, NUM_STAGES: gl.constexpr):
    """Overlapped steps: the last step's dK += dSᵀ Q (or dQ += dS K) from its packed ``words`` and the
    slot it read, run to the end; without steps, the gradient (zero) as it is."""
    if steps > 0:
        last = ring.index((steps - 1) % NUM_STAGES)
        acc = warpgroup_mma_wait(0, deps=[_values_product(words, last, acc, p_layout)])
    return acc


# ----------------------------------------------------------------------------------------------
# Per-consumer ranges
# ----------------------------------------------------------------------------------------------
@gluon.jit
def consumer_query_blocks(n_start, seqlen_q, seqlen_k, causal_offset, first_block, masked_blocks,
                          CONSUMER_RANGES: gl.constexpr, BLOCK_M: gl.constexpr, WG_N: gl.constexpr):  # fmt: skip
    """The dK/dV kernel: per consumer (keys n_start + WG_N · index ...), ``(skip, masked)``: the leading query
    blocks of each head it skips and the masked ones after them, of the CTA's ``query_blocks`` stream (from
    ``first_block``). Without ``CONSUMER_RANGES`` both run the CTA's: ``(0, masked_blocks)``."""
    if CONSUMER_RANGES:
        # The lower consumer's first block is the CTA's; only the upper one skips.
        lower_first, _, lower_masked = query_blocks(
            n_start, seqlen_q, seqlen_k, causal_offset, CAUSAL=True, BLOCK_M=BLOCK_M, BLOCK_N=WG_N
        )
        upper_first, _, upper_masked = query_blocks(
            n_start + WG_N, seqlen_q, seqlen_k, causal_offset, CAUSAL=True, BLOCK_M=BLOCK_M, BLOCK_N=WG_N
        )
        return (lower_first - first_block, lower_masked), (upper_first - first_block, upper_masked)
    return (0, masked_blocks), (0, masked_blocks)


@gluon.jit
def consumer_key_blocks(start_m, seqlen_k, causal_offset, n_block_max, n_masked_blocks, CONSUMER_RANGES: gl.constexpr,
                        BOTTOM_RIGHT: gl.constexpr, WG_M: gl.constexpr, BLOCK_N: gl.constexpr):  # fmt: skip
    """The dQ pass: per consumer (rows start_m + WG_M · index ...), ``(n_block_max, n_masked_blocks)`` of its own
    ``block_range``, a prefix of the CTA's key blocks. Without ``CONSUMER_RANGES`` both run the CTA's."""
    if CONSUMER_RANGES:
        # The upper consumer's last block is the CTA's; only the lower one stops early.
        upper_m = start_m + WG_M
        _, lower_max, lower_masked = block_range(
            start_m, seqlen_k, causal_offset, CAUSAL=True, BOTTOM_RIGHT=BOTTOM_RIGHT, BLOCK_M=WG_M, BLOCK_N=BLOCK_N
        )
        _, upper_max, upper_masked = block_range(
            upper_m, seqlen_k, causal_offset, CAUSAL=True, BOTTOM_RIGHT=BOTTOM_RIGHT, BLOCK_M=WG_M, BLOCK_N=BLOCK_N
        )
        return (lower_max, lower_masked), (upper_max, upper_masked)
    return (n_block_max, n_masked_blocks), (n_block_max, n_masked_blocks)


@gluon.jit
def skip_step(carry, step, step_args, constants: gl.constexpr):
    """A dK/dV step this consumer skips (all its Pᵀ would be 0; ``step_args`` as ``backward._dkdv_step``'s): wait
    for the slot's tiles, so that its arrival on ``empty`` cannot complete a phase the other consumer still reads
    in (the load warp refills a slot only after both arrived), and free it; overlapped, finish the previous step's
    dK product, free that slot, and carry zero words, whose product in the next step adds nothing."""
    q_ring, do_ring, q_ready, do_ready, empty = step_args[2], step_args[3], step_args[4], step_args[5], step_args[6]
    NUM_STAGES: gl.constexpr = constants.NUM_STAGES
    q_tile = _ready_tile(q_ring, q_ready, step, NUM_STAGES)
    _ready_tile(do_ring, do_ready, step, NUM_STAGES)
    if constants.OVERLAP:
        previous = q_ring.index(previous_stage(step, NUM_STAGES))
        dk = warpgroup_mma_wait(0, deps=[_values_product(carry[2], previous, carry[0], constants.p_layout)])
        release_previous(empty, step, NUM_STAGES)
        WG_N: gl.constexpr = carry[1].shape[0]
        BLOCK_M: gl.constexpr = q_tile.shape[0]
        zero = gl.zeros([WG_N, BLOCK_M], gl.float32, constants.s_layout)
        carry = (dk, carry[1], _operand_p(zero, q_ring.dtype, constants.p_layout))
    else:
        mbarrier.arrive(empty.index(step % NUM_STAGES), count=1)
    return carry


# ----------------------------------------------------------------------------------------------
# Masks by a limit per row (``BackwardTiles.limit_mask``)
# ----------------------------------------------------------------------------------------------
@gluon.jit
def mask_p_t(p_t, offs_n, offs_m, m_start, seqlen_k, causal_offset, constants: gl.constexpr):
    """The dK/dV step's masked Pᵀ (keys ``offs_n`` as rows, query rows ``offs_m`` = m_start + column):
    ``_device.transposed_mask``, or causal with ``LIMIT_MASK`` one compare a value against its key's first
    visible column, j − causal_offset − m_start (BLOCK_M: a key past ``seqlen_k`` sees none). Non-causal, the
    key tail is a predicate per row already."""
    if constants.LIMIT_MASK and constants.CAUSAL:
        BLOCK_M: gl.constexpr = p_t.shape[1]
        columns = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, p_t.type.layout))
        first = gl.where(offs_n < seqlen_k, offs_n - causal_offset - m_start, BLOCK_M)
        return gl.where(columns[None, :] >= first[:, None], p_t, 0.0)
    return transposed_mask(p_t, offs_n, offs_m, seqlen_k, causal_offset, CAUSAL=constants.CAUSAL)


@gluon.jit
def mask_scores(S, offs_m, start_n, seqlen_k, causal_offset, constants: gl.constexpr):
    """The dQ step's scores before the exp: ``_device.attention_mask`` (-inf), or with ``LIMIT_MASK`` as they
    are (``mask_p`` masks P after the exp instead, so that S · scale − LSE₂ stays one FFMA)."""
    if constants.LIMIT_MASK:
        return S
    return attention_mask(S, offs_m, start_n, seqlen_k, causal_offset, CAUSAL=constants.CAUSAL)


@gluon.jit
def mask_p(P, offs_m, start_n, seqlen_k, causal_offset, constants: gl.constexpr):
    """The dQ step's P after the exp: with ``LIMIT_MASK``, 0 where column c (key start_n + c) is at or past its
    row's limit min(i + causal_offset + 1, seqlen_k) − start_n, one compare a value; else as it is (masked
    before the exp by ``mask_scores``). exp2 of an unmasked score may be inf there: the select drops it."""
    if constants.LIMIT_MASK:
        BLOCK_N: gl.constexpr = P.shape[1]
        columns = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, P.type.layout))
        limit = gl.zeros_like(offs_m) + seqlen_k - start_n
        if constants.CAUSAL:
            limit = gl.minimum(limit, offs_m + causal_offset + 1 - start_n)
        return gl.where(columns[None, :] < limit[:, None], P, 0.0)
    return P
