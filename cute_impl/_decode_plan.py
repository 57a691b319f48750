"""cute/decode's work plan on the device: which key blocks each CTA of the split kernel reads.

:func:`split_block_range`: the padded split's (split ``s`` of ``num_splits`` of one sequence's keys).
The rest is the balanced split's (``decode.BALANCED_SPLIT``), the per-CTA plan.

The plan of ``triton_impl/decode.py``'s "The balanced split" (``balanced_share`` of
``triton_impl/_device.py``), with the same numbers: every CTA reads the B cache lengths, counts the key
blocks each sequence's rows see, sizes a share as total blocks / ``target_shares`` (at least
``min_share_blocks``), gives each (batch, KV head) work item cdiv(its blocks, share) shares (one for an
empty sequence) and finds its own in their prefix sum, items in (batch, KV head) order. Triton loads the
lengths as one vector; here each thread walks them in a scalar loop (B is small: the lengths are one
cached line or two), with ``select`` only, no branch, so every thread of the CTA agrees.

``BalancedPlan.max_item_shares`` (``decode.BALANCED_MAX_ITEM_SHARES``; 0: none, compiled out) caps one item's
share count, ``common/contract/splits.py``'s "item-share cap"; both kernels read the same capped plan.

Both kernels of cute/decode compute it: the split kernel to find its (batch, KV head, split) from its
share index (:meth:`BalancedPlan.share`), the merge kernel to find the slabs of its item's partials
(:meth:`BalancedPlan.item_slabs`). Computing it twice costs each CTA a loop over B lengths and needs no
buffer between the kernels, no ordering beyond the launch order, and nothing to reset under a CUDA graph.
But every merge thread walks the batch twice (``share_blocks``, then ``item_slabs``) for a pair of ints its
item's split CTAs already know: at B=64 with 128 packed rows at D=256 the 4096 merge CTAs execute 37 M warp
instructions, most of them the plan's, in 49 µs beside a 249 µs split kernel (ncu, seed 47 row 4:
results/h200/decode-ncu-2026-11-30-fifth/). ``decode.MERGE_SLABS_FROM_SPLIT`` (off) has the item's first share
store the pair instead (``_decode_merge.store_item_slabs``) into a (B·Hkv, 2) int32 buffer that each bind
allocates beside the partials: every launch rewrites every item's pair before the merge kernel, launched after
the split kernel on the same stream, reads it, so nothing is reset under a CUDA graph either.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import cutlass
import cutlass.cute as cute

from cute_impl._device import BlockRange, SeqlenInfo, split_key_range

# Causal: the keys some row of a split cannot see lie in the last Sq - 1 <= 15 keys of the sequence's
# range [0, key_end) (plus the keys past seqlen_k in its top block), which cross at most one block
# boundary with tile_n >= 16: the top two blocks of a split take the mask. Without causal only the
# top block, which the sequence's end can cut.
CAUSAL_MASKED_BLOCKS, TAIL_MASKED_BLOCKS = 2, 1
# The balanced plan's loops over the B lengths, unrolled so that this many lengths' loads are in flight
# together (one after the other, 32 sequences would cost each CTA 32 round trips to L2 before its first key).
PLAN_UNROLL = 8


def split_block_range(
    split: cutlass.Int32, num_splits: cutlass.Int32, seqlen: SeqlenInfo, seqlen_q: cutlass.Int32, tile_n: int,
    causal: bool,
) -> BlockRange:  # fmt: skip
    """The key blocks split ``split`` of ``num_splits`` visits for one sequence (``seqlen``): the keys
    any row sees end at ``key_end`` (the sequence's ``seqlen_k``; causal: no row sees a key at or past
    the last token's diagonal end, Sq + causal_offset), cut by ``split_key_range``; the top
    ``CAUSAL_MASKED_BLOCKS`` (causal) or ``TAIL_MASKED_BLOCKS`` of the split take the mask. Plain
    arithmetic, so a CPU test checks it against every key's visibility."""
    key_end = seqlen.seqlen_k
    if causal:
        key_end = cutlass.max(cutlass.min(key_end, seqlen_q + seqlen.causal_offset), 0)
    n_masked_blocks = CAUSAL_MASKED_BLOCKS if causal else TAIL_MASKED_BLOCKS
    return split_key_range(split, num_splits, key_end, tile_n, n_masked_blocks)


def sequence_blocks(
    batch: cutlass.Int32, *, seqlen_q: cutlass.Int32, capacity: cutlass.Int32, cache_seqlens: cute.Tensor | None,
    bottom_right: bool, causal: bool, tile_n: int,
) -> cutlass.Int32:  # fmt: skip
    """The key blocks sequence ``batch``'s rows see: those of its one split (:func:`split_block_range`)."""
    seqlen = SeqlenInfo.create(batch, seqlen_q, capacity, cache_seqlens, bottom_right)
    blocks = split_block_range(0, 1, seqlen, seqlen_q, tile_n, causal)
    return blocks.n_block_max - blocks.n_block_min


class BalancedWork(NamedTuple):
    """One CTA's share: split ``split`` of the ``item_shares`` of (batch, kv_head); a CTA past the last
    share gets ``has_work`` False and split 1 of 1 of item (0, 0), an empty key range."""

    batch: cutlass.Int32
    kv_head: cutlass.Int32
    split: cutlass.Int32
    item_shares: cutlass.Int32
    has_work: cutlass.Boolean


def checked_item_cap(max_item_shares: int) -> int:
    """``decode.BALANCED_MAX_ITEM_SHARES`` as the plan takes it: 0 (no cap) or 2 and more. One share an item
    leaves nothing to merge and fails the DSL's compile (a static one-share tile), so it is refused by name."""
    if max_item_shares == 1 or max_item_shares < 0:
        raise ValueError(
            f"cute/decode's BALANCED_MAX_ITEM_SHARES must be 0 (no cap) or at least 2, got {max_item_shares}: "
            "for one share an item use BALANCED_SPLIT = 'never' (the padded split)"
        )
    return max_item_shares


def item_shares_of(blocks: cutlass.Int32, share_blocks: cutlass.Int32) -> cutlass.Int32:
    """Shares of a work item of ``blocks`` key blocks: cdiv(blocks, share_blocks), at least 1 (an empty
    sequence's one share stores O = 0 and LSE = -inf)."""
    return cutlass.max(cute.ceil_div(blocks, share_blocks), 1)


class BalancedPlan(NamedTuple):
    """The plan over ``batch_size`` sequences of ``kv_heads`` items each: ``blocks_of(b)`` is the key
    blocks sequence b's rows see; ``target_shares`` the grid's shares (its CTAs past them: B · Hkv);
    ``max_item_shares`` the most shares one item takes (0: no cap; a compile-time constant)."""

    blocks_of: Callable[[cutlass.Int32], cutlass.Int32]
    batch_size: cutlass.Int32
    kv_heads: cutlass.Int32
    target_shares: cutlass.Int32
    min_share_blocks: int
    max_item_shares: int = 0

    def shares_of(self, blocks: cutlass.Int32, share_blocks: cutlass.Int32) -> cutlass.Int32:
        """An item's shares: :func:`item_shares_of`, at most ``max_item_shares`` where that is not 0 (an item
        of many shares then cuts its blocks into fewer, larger ones: fewer partials for its merge)."""
        shares = item_shares_of(blocks, share_blocks)
        if cutlass.const_expr(self.max_item_shares):
            shares = cutlass.min(shares, self.max_item_shares)
        return shares

    @cute.jit
    def share_blocks(self) -> cutlass.Int32:
        """The share size in key blocks: the items' total blocks / target_shares, at least the minimum."""
        total = cutlass.Int32(0)
        for b in cutlass.range(self.batch_size, unroll=PLAN_UNROLL):
            total = total + self.blocks_of(b)
        return cutlass.max(cute.ceil_div(total * self.kv_heads, self.target_shares), self.min_share_blocks)

    @cute.jit
    def share(self, share: cutlass.Int32) -> BalancedWork:
        """The work of CTA ``share``: its sequence is the count of sequences whose shares end at or
        before it; its first share the end of the last of them; its item's share count that of the
        last sequence starting at or before it."""
        share_blocks = self.share_blocks()
        batch = cutlass.Int32(0)
        first = cutlass.Int32(0)
        item_shares = cutlass.Int32(1)
        start = cutlass.Int32(0)
        for b in cutlass.range(self.batch_size, unroll=PLAN_UNROLL):
            shares = self.shares_of(self.blocks_of(b), share_blocks)
            end = start + self.kv_heads * shares
            batch = batch + cutlass.Int32(cutlass.select_(end <= share, 1, 0))
            first = cutlass.Int32(cutlass.select_(end <= share, end, first))
            item_shares = cutlass.Int32(cutlass.select_(start <= share, shares, item_shares))
            start = end
        has_work = batch < self.batch_size
        local = share - first
        item_shares = cutlass.Int32(cutlass.select_(has_work, item_shares, 1))
        return BalancedWork(
            cutlass.Int32(cutlass.select_(has_work, batch, 0)),
            cutlass.Int32(cutlass.select_(has_work, local // item_shares, 0)),
            cutlass.Int32(cutlass.select_(has_work, local % item_shares, 1)),
            item_shares,
            has_work,
        )

    @cute.jit
    def item_slabs(self, batch: cutlass.Int32, kv_head: cutlass.Int32) -> tuple[cutlass.Int32, cutlass.Int32]:
        """``(first, count)``: the partial slabs the shares of item (batch, kv_head) stored, consecutive
        from ``first`` (a share stores into the slab of its index)."""
        share_blocks = self.share_blocks()
        start = cutlass.Int32(0)
        count = cutlass.Int32(1)
        for b in cutlass.range(self.batch_size, unroll=PLAN_UNROLL):
            shares = self.shares_of(self.blocks_of(b), share_blocks)
            start = start + cutlass.Int32(cutlass.select_(b < batch, self.kv_heads * shares, 0))
            count = cutlass.Int32(cutlass.select_(b == batch, shares, count))
        return start + kv_head * count, count


def slab_range(parts: cute.Tensor, first: cutlass.Int32, count: cutlass.Int32) -> cute.Tensor:
    """Slabs ``[first, first + count)`` of ``parts`` (mode 0: the partials' slabs of one row)."""
    layout = cute.make_layout((count, *parts.shape[1:]), stride=parts.stride)
    return cute.make_tensor(parts.iterator + first * parts.stride[0], layout)
