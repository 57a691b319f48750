"""How cute/decode's warps share a CTA's (tile_m, tile_n) block: ``row_warps`` × ``key_warps`` warps.

The default (``row_warps = 1``) is ``decode.py``'s "warps split the keys": every warp takes all ``tile_m``
packed rows and its own ``tile_n / num_warps`` keys of every K/V block, runs its own online softmax and
the CTA merges the warps' partial O and LSE at the end. That suits 16 packed rows (nothing to share along M),
but with many (seed 41's 8 × 16 = 128 rows, 64-row tiles at D=64) each warp holds all 64 rows' O (128
fp32 registers a thread), rescales all of it every block and the CTA merges four 64-row partials at the end
(sm_90a: 570 instructions a warp a block, 255 registers; ``docs/perf-log.md``, "Seed 41's short prefill").

``decode.WARPS_SPLIT_ROWS`` (on since its GPU A/B, ``results/h200/decode-row-split/``) cuts the warps along M
first: ``row_warps = min(num_warps, tile_m / 16)`` warps each take ``tile_m / row_warps`` rows, and the
remaining ``key_warps = num_warps / row_warps`` split the keys as before. A 64-row tile of 4 warps becomes 4
warps of 16 rows × all 64 keys: each warp's O is 16 × D (32 fp32 registers a thread at D=64), the S and P V
products keep their MMA count (the same m16n8k16 tiles, now along N), each warp reads the whole K/V block
from shared memory instead of the whole Q tile, and the end merge has one part (a copy through shared memory
for coalesced stores). A 16-row tile keeps the key split; 32 rows become 2 × 2. With the row split a warp's O is
16 rows whatever the tile, so D=256 may take 32-row tiles (``ROW_SPLIT_MAX_TILE_M``, on): one M tile, not two, for
17 to 32 packed rows, each K/V byte read once per (batch, KV head). ``decode.WIDE_M_TILE`` (on) gives D=128 and
D=256 64-row tiles (:data:`WIDE_M_TILES`): 4 warps of 16 rows × all 64 keys, so 33 to 64 packed rows take one M tile,
not two 32-row tiles that each stream the share's keys from L2 and run the whole key loop (gluon/decode's
``WIDE_M_TILE``: one CTA copies the group's keys once).

:class:`WarpTiles` is the per-warp arithmetic: which rows and keys a warp takes (views of sQ, sK, sV), where
its rows start for the causal mask, which key sub-block it masks, where its partial goes in the merge scratch.
"""

from __future__ import annotations

from typing import TypeVar

import cutlass
import cutlass.cute as cute

T = TypeVar("T")

# mma.sync.m16n8k16: a warp's rows come in 16s.
MMA_M = 16


# The row split's ring depth per head dim where it differs from ``decode.TILE_CONFIGS`` (empty: the same ring).
# The row split's 64-row D=64 CTA takes 168 registers (128 threads): three CTAs an SM by registers, two by the
# default six-stage ring (96 KB + the Q tile); four stages (64 KB) let three in. Off until the GPU A/B
# (``bench/cute_decode_rows_ab.sh``'s setting ``rows-s4`` sets {64: 4}).
ROW_SPLIT_STAGES: dict[int, int] = {}
# The row split's largest packed tile per head dim where it differs from ``decode.TILE_CONFIGS`` (empty: the table's).
# D=256's table tile is 16 rows (the key split holds all of a tile's rows in each warp: 16 x 256 fp32 of O), so 17 to
# 32 packed rows take two M tiles, each CTA streaming the whole K/V of its (batch, KV head): seed 43's group 5 x Sq 4 =
# 20 rows read every byte twice from L2, 512 CTAs at one an SM (72 % of the read bandwidth, triton and gluon 87 % with
# one tile). {256: 32}: one 32-row tile of 2 x 2 warps, each warp 16 rows x 32 keys, the same 16 x 256 O (sm_90a: 243
# registers, no spills; a key block 575 instructions a warp for 32 rows against 2 x 439 for two 16-row tiles). On
# since its GPU A/B (results/h200/decode-d256-tile32/: 0.57-0.85x the time on five D=256 rows of 17-64 packed rows).
ROW_SPLIT_MAX_TILE_M: dict[int, int] = {256: 32}


# D=128's row-split tile under ``decode.WIDE_M_TILE`` (on since bench/cute_decode_p32_ab.sh: 448 -> 324 us on seed 59
# row 2). That row (B=64 H=32 Hkv=8 Sq=16 D=128 paged(32) ragged: 64 packed rows) ran two 32-row M tiles of 2 x 2 warps:
# 448 us, 48 % of the read bandwidth, where gluon/decode's one 64-row tile took 275 (78 %). sm_90a, a 64-key block a
# warp: 544 instructions (64 HMMA, 16 LDGSTS) per 32-row CTA, so 1088 per 64 rows, and every K/V byte goes to two CTAs
# from L2; the 64-row tile is 682 (128 HMMA, 16 LDGSTS) for all 64 rows, 204 registers, a 96 KiB ring + 16 KiB Q: still
# two CTAs an SM. D=256's 64-row tile (4 warps of 16 rows x all 64 keys: 248-252 registers, no spill; a 192 KiB ring +
# 32 KiB Q + 1 KiB, one CTA an SM as before) halves the M tiles of 33 or more packed rows. H200
# (bench/decode_d256_many_rows_ab.sh, results/h200/decode-d256-many-rows/): 0.77-0.89x the time on all six rows of 64
# to 256 rows, contiguous and paged (seed 67 row 7's 256 rows 692.7 -> 532.6 us, seed 53 row 0's 64 rows 802.4 ->
# 638.8, 68 -> 85 % of the read bandwidth).
WIDE_M_TILES: dict[int, int] = {128: 64, 256: 64}


def row_warps_for(split_rows: bool, tile_m: int, num_warps: int) -> int:
    """Warps along M: 1 (warps split the keys), or with ``split_rows`` as many as the tile's 16-row slices
    allow, at most ``num_warps`` (a power of two, as tile_m and num_warps are)."""
    return min(num_warps, tile_m // MMA_M) if split_rows else 1


def max_tile_m(split_rows: bool, head_dim: int, shapes: dict[int, T], wide: bool = False) -> int:
    """The most packed rows a tile takes at ``head_dim``: its entry of ``shapes`` (``decode.TILE_CONFIGS``), or with
    ``split_rows`` the row split's (:data:`ROW_SPLIT_MAX_TILE_M`) where it has one, and with ``wide``
    (``decode.WIDE_M_TILE``) :data:`WIDE_M_TILES`' where that has one."""
    table = shapes[head_dim].max_tile_m
    if not split_rows:
        return table
    row_split = ROW_SPLIT_MAX_TILE_M.get(head_dim, table)
    return WIDE_M_TILES.get(head_dim, row_split) if wide else row_split


def warp_split(split_rows: bool, tile_m: int, head_dim: int, shapes: dict[int, T]) -> tuple[T, int]:
    """(the tile shape, warps along M) of a ``tile_m``-row tile at ``head_dim``: its entry of ``shapes``
    (``decode.TILE_CONFIGS``), with the row split's largest tile (:func:`max_tile_m`; ``tile_m`` where
    :data:`WIDE_M_TILES` made it wider, so that a tile the knob leaves keeps its compile key) and, where its warps
    split the rows, ring depth (:data:`ROW_SPLIT_STAGES`)."""
    shape = shapes[head_dim]._replace(max_tile_m=max(tile_m, max_tile_m(split_rows, head_dim, shapes)))
    row_warps = row_warps_for(split_rows, tile_m, shape.num_warps)
    if row_warps > 1 and head_dim in ROW_SPLIT_STAGES:
        shape = shape._replace(stages=ROW_SPLIT_STAGES[head_dim])
    return shape, row_warps


class WarpTiles:
    """This warp's share of a CTA's block: ``rows_per_warp`` rows (warp's row slice ``row_warp``) by
    ``keys_per_warp`` keys (key slice ``key_warp``); warp w is (row_warp, key_warp) = divmod(w, key_warps)."""

    def __init__(
        self, tile_m: int, tile_n: int, head_dim: int, num_warps: int, row_warps: int, warp_index: cutlass.Int32
    ):
        if num_warps % row_warps or tile_m % (row_warps * MMA_M):
            raise ValueError(f"{row_warps} row warps cannot split {tile_m} rows among {num_warps} warps")
        self.head_dim = head_dim
        self.row_warps = row_warps
        self.key_warps = num_warps // row_warps
        self.rows_per_warp = tile_m // row_warps
        self.keys_per_warp = tile_n // self.key_warps
        # Static where one side has a single slice, so the key split's code is what it was before the knob.
        self.row_warp = warp_index // self.key_warps if row_warps > 1 else 0
        self.key_warp = warp_index - self.row_warp * self.key_warps if self.key_warps > 1 else 0

    def operands(self, sQ: cute.Tensor, sK: cute.Tensor, sV: cute.Tensor) -> tuple[cute.Tensor, ...]:
        """This warp's views: its Q rows (rows_per_warp, D), its keys of K (keys_per_warp, D, stages) and
        of V seen as the B operand of O += P V (D, keys_per_warp, stages): the same swizzled memory."""
        sQ_warp = cute.local_tile(sQ, (self.rows_per_warp, self.head_dim), (self.row_warp, 0))
        sK_warp = cute.logical_divide(sK, (self.keys_per_warp, None, None))[(None, self.key_warp), None, None]
        sV_warp = cute.logical_divide(sV, (self.keys_per_warp, None, None))[(None, self.key_warp), None, None]
        stages = cute.size(sV, mode=[2])
        transposed = cute.make_layout(
            (self.head_dim, self.keys_per_warp, stages),
            stride=(self.keys_per_warp, 1, self.keys_per_warp * self.head_dim),
        )
        return sQ_warp, sK_warp, cute.composition(sV_warp, transposed)

    def mask_m_block(self, m_block: cutlass.Int32) -> cutlass.Int32:
        """The warp's rows as the mask's row block of ``rows_per_warp`` rows: the CTA's tile ``m_block``
        of ``row_warps · rows_per_warp`` rows, then this warp's slice of it."""
        return m_block * self.row_warps + self.row_warp

    def key_sub_block(self, n_block: cutlass.Int32) -> cutlass.Int32:
        """The warp's keys of block ``n_block`` as the mask's sub-block of ``keys_per_warp`` keys."""
        return n_block * self.key_warps + self.key_warp

    def part(self, sO_parts: cute.Tensor, sLSE_parts: cute.Tensor) -> tuple[cute.Tensor, cute.Tensor]:
        """Where this warp's normalised O (rows_per_warp, D) and LSE (rows_per_warp,) go: its rows of its
        key slice's slab."""
        sO_slab = cute.local_tile(
            sO_parts[self.key_warp, None, None], (self.rows_per_warp, self.head_dim), (self.row_warp, 0)
        )
        sLSE_slab = cute.local_tile(sLSE_parts[self.key_warp, None], (self.rows_per_warp,), (self.row_warp,))
        return sO_slab, sLSE_slab
