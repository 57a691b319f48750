"""cute/decode's merge of parts by their LSE (``cute_impl/decode.py``; triton/decode's is ``_decode_merge.py`` of
its stack): :func:`merge_splits`, which both kernels run, the split kernel over its warps' parts in shared memory
and the merge kernel over the splits' partials in HBM, in part order, so that the same parts give the same bits
whichever kernel brought them; :func:`store_item_slabs`, the merge kernel's lookup of an item's partial slabs
under ``decode.MERGE_SLABS_FROM_SPLIT`` (``_decode_plan.py`` says why); and the merge kernel's two-level merge
(``decode.BALANCED_MERGE_RUNS``): :func:`merge_thread`, a thread's place, and :func:`merge_run`, the slabs of its
run. Kept beside the rung so that the rung file stays readable.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from cute_impl._device import LOG2_E

# The merges weigh natural-log LSEs by exp2((lseₛ - lse_max) · COMBINE_LOG2_E) (a name of its own so a
# test can plant the log2-unit bug).
COMBINE_LOG2_E = LOG2_E


@cute.jit
def merge_splits(
    lse_parts: cute.Tensor, o_parts: cute.Tensor, merged: cute.Tensor, parts_per_step: cutlass.Constexpr[int]
) -> cutlass.Float32:
    """Merge the parts s of one row chunk: ``merged`` = Σₛ exp(lseₛ - lse) · Oₛ and the returned lse =
    log Σₛ exp(lseₛ), natural log. ``lse_parts`` (parts,) and ``o_parts`` (parts, ``decode.MERGE_COLS``) are the
    warps' parts in shared memory (split kernel) or the splits' partials in HBM (merge kernel). A
    part with LSE -inf (no key) weighs exp(-inf) = 0; a row no part saw keeps lse = -inf and O = 0.
    ``parts_per_step``: the loops' unrolling, so that parts in HBM are loaded that many at a time (1:
    one after the other; 0: the compiler's choice, for the warps' few parts in shared memory)."""
    num_parts = cute.size(lse_parts)
    lse_max = cutlass.Float32(-cutlass.Float32.inf)
    for s in cutlass.range(num_parts, unroll=parts_per_step):
        lse_max = cute.arch.fmax(lse_max, lse_parts[s])
    # Weights are taken against the largest LSE (so none overflows); against 0 if every part is -inf.
    lse_base = cutlass.Float32(cutlass.select_(lse_max == -cutlass.Float32.inf, 0.0, lse_max))
    weight_sum = cutlass.Float32(0.0)
    merged.fill(0.0)
    for s in cutlass.range(num_parts, unroll=parts_per_step):
        weight = cute.math.exp2((lse_parts[s] - lse_base) * COMBINE_LOG2_E, fastmath=True)
        weight_sum = weight_sum + weight
        merged.store(merged.load() + o_parts[s, None].load() * weight)
    has_keys = weight_sum > 0.0
    merged.store(merged.load() * cutlass.Float32(cutlass.select_(has_keys, 1.0 / weight_sum, 0.0)))
    return cutlass.Float32(cutlass.select_(has_keys, lse_base + cute.math.log(weight_sum), -cutlass.Float32.inf))


@cute.jit
def store_item_slabs(
    item_slabs: cute.Tensor, share: cutlass.Int32, split: cutlass.Int32, item_shares: cutlass.Int32,
    tidx: cutlass.Int32, m_block: cutlass.Int32,
):  # fmt: skip
    """Store ``_decode_plan.BalancedPlan.item_slabs``'s pair of a CTA's item into ``item_slabs`` (2,) int32: the first
    slab, that of the item's first share (``split`` 0, whose slab is ``share``), and the count, ``item_shares``.
    One thread stores it: thread 0 of M tile 0 of the first share (a CTA past the last share is split 1)."""
    if (split | tidx | m_block) == 0:  # each is >= 0
        item_slabs[0] = share
        item_slabs[1] = item_shares


def merge_run(
    first: cutlass.Int32, count: cutlass.Int32, run: cutlass.Int32, runs: int
) -> tuple[cutlass.Int32, cutlass.Int32]:
    """``(first, count)`` of run ``run`` of ``runs`` (``decode.BALANCED_MERGE_RUNS``) of an item's ``count`` partial
    slabs from ``first``: cdiv(count, runs) consecutive slabs a run, in slab order, so the last runs are shorter or
    empty (an empty run merges to O = 0, LSE = -inf: no weight). Which slab a run takes depends on the count alone, so
    the same plan merges in the same order at every launch. Plain arithmetic, so a CPU test checks it."""
    length = cute.ceil_div(count, runs)
    begin = cutlass.min(run * length, count)
    return first + begin, cutlass.min(begin + length, count) - begin


def merge_thread(tidx: cutlass.Int32, chunks: int, runs: int) -> tuple[cutlass.Int32, cutlass.Int32, cutlass.Int32]:
    """``(chunk, run, CTA row)`` of merge-kernel thread ``tidx``: the ``chunks`` chunks of ``MERGE_COLS`` columns of one
    row and run are consecutive threads (a warp's 16-byte loads of a slab row coalesce), then the runs, then the
    CTA's rows. One run: run 0 at compile time (the one-chain kernel as it was). Plain arithmetic, as
    :func:`merge_run`."""
    run = tidx // chunks % runs if cutlass.const_expr(runs > 1) else 0
    return tidx % chunks, run, tidx // (chunks * runs)
