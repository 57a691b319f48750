"""triton/decode's merge of a tile's splits (``triton_impl/decode.py``; gluon/decode's in Gluon is
``gluon/_decode_merge.py``): the arrival protocol (``last_to_arrive``) that elects the tile's last CTA to
finish, and ``merge_splits``, which that CTA (fused merge) or the merge kernel (``_merge_kernel``, the
two-launch path) runs over the splits' partials in split order, element by element, so the same bits
whichever runs it. Kept beside the rung so that the rung file stays readable.
"""

from __future__ import annotations

import triton
import triton.language as tl

from triton_impl._device import LOG2_E

# In the merge, natural-log LSEs are weighed by exp2((lseₛ - lse_max) · LOG2_E).
MERGE_LOG2_E = tl.constexpr(LOG2_E)


@triton.jit
def last_to_arrive(Counter, num_splits):
    """True in the CTA that is the last of its tile's ``num_splits`` splits to have stored its partials,
    which then reads everyone's; that CTA also puts the counter back to 0, so the next launch (or a
    CUDA-graph replay) finds it zeroed with no host memset. Every split arrives, an empty one too (it
    stores O = 0 and LSE = -inf: no CTA returns early), so the count always reaches ``num_splits``.

    Why the partials are visible to it (PTX memory model): every thread stores its rows, then
    ``debug_barrier`` (bar.sync) orders those stores before whatever the CTA does next; the arrival is
    one gpu-scope acq_rel ``atom.add`` (Triton issues a scalar atomic from one thread and passes the old
    value to the others through shared memory, behind a barrier). Its release half is cumulative, so the
    whole CTA's stores that bar.sync ordered before it are published with it; the last CTA's acquire
    half reads the count every other arrival wrote, so it synchronises with each of their releases; the
    barrier behind the broadcast orders every thread's later loads after that acquire. Hence the
    partials the last CTA loads are the ones each split stored, which CUTLASS's split-K semaphore
    (bar.sync, then a release by one thread; an acquire, then bar.sync) relies on too. No other CTA
    touches the counter after the last arrival, and the kernel's end orders the reset before the next
    launch."""
    tl.debug_barrier()
    arrived = tl.atomic_add(Counter, 1, sem="acq_rel", scope="gpu")
    last = arrived == num_splits - 1
    if last:
        tl.store(Counter, 0)
    return last


@triton.jit
def merge_splits(
    OutPartial, LsePartial, row, row_ok, rows, num_splits,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, SPLITS_PER_STEP: tl.constexpr,
):  # fmt: skip
    """``(O, lse)`` of the packed rows ``row`` (their index in one split's (B, H, Sq) slab of ``rows``)
    merged from the splits' partials: lse = lse_max + log Σₛ exp(lseₛ - lse_max) and O = Σₛ exp(lseₛ -
    lse_max) · Oₛ / Σₛ exp(lseₛ - lse_max). The sums run split after split, element by element (no
    reduction across threads), so the bits depend only on the split order: the same whichever CTA
    merges, in kernel 1 or kernel 2, with any warp count. Each step unrolls ``SPLITS_PER_STEP`` splits,
    whose loads are independent and fly together (a step is one round trip to L2, not one a split).
    The loads are ``.cg``, from L2: the acquire of ``last_to_arrive`` already orders them after the
    other splits' stores, and L2 is where those stores are, never in an L1 line that another CTA of
    this SM may have filled earlier in the launch. Splits with no key (-inf) weigh 0; a row with no
    key at all gets O = 0 and lse = -inf."""
    offs_d = tl.arange(0, HEAD_DIM)
    lse_max = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    for first_split in range(0, num_splits, SPLITS_PER_STEP):
        for step in tl.static_range(SPLITS_PER_STEP):
            split = first_split + step
            lse_s = tl.load(
                LsePartial + split * rows + row,
                # tl.where, not row_ok & (a scalar): Triton 3.9's interpreter refuses the mixed mask.
                mask=tl.where(split < num_splits, row_ok, False),
                other=float("-inf"),
                cache_modifier=".cg",
            )
            lse_max = tl.maximum(lse_max, lse_s)
    lse_base = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    weight_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    for first_split in range(0, num_splits, SPLITS_PER_STEP):
        for step in tl.static_range(SPLITS_PER_STEP):
            split = first_split + step
            in_range = tl.where(split < num_splits, row_ok, False)
            partial_row = split * rows + row
            lse_s = tl.load(LsePartial + partial_row, mask=in_range, other=float("-inf"), cache_modifier=".cg")
            o_ptrs = OutPartial + partial_row[:, None] * HEAD_DIM + offs_d[None, :]
            o_s = tl.load(o_ptrs, mask=in_range[:, None], other=0.0, cache_modifier=".cg")
            weight = tl.math.exp2((lse_s - lse_base) * MERGE_LOG2_E)
            weight_sum += weight
            acc += weight[:, None] * o_s
    has_keys = weight_sum > 0.0
    out = acc * tl.where(has_keys, 1.0 / weight_sum, 0.0)[:, None]
    lse = tl.where(has_keys, lse_base + tl.log(weight_sum), float("-inf"))
    return out, lse
