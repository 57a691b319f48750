"""Gluon rung ``decode``: flash decoding with its TMA copies, mbarriers and wgmmas written out
(counterpart: ``triton_impl/decode.py``; device helpers in ``triton_impl/gluon/_device.py``).

What it is: triton/decode's algorithm, read side by side with it. The keys of each (batch, KV head)
are cut into ``num_splits`` ranges of whole key blocks, one CTA each, by the same rule
(``common/contract/splits.py``, on this rung's CTA count); the ``group = H / Hkv`` query heads of
a KV head are packed into one M tile (row r = head in group · Sq + token), so each K/V byte is read
from HBM once per KV head; each split writes its normalised fp32 partial O and natural-log LSE
(O = 0, LSE = -inf for a split with no key), and the last split of a tile to finish merges them in
the same kernel: triton/decode's arrival protocol (``_last_to_arrive``, in ``_decode_merge.py``: a
barrier, one gpu-scope acq_rel atomic on the tile's counter, the last CTA resets it; the memory-ordering
argument is in triton/decode's ``last_to_arrive``) and its ``merge_splits`` written in Gluon
(``_merge_splits``, beside it: the same operations element by element in split order, so the same bits
as triton/decode's merge kernel, which is the two-launch path here too: ``FUSED_MERGE = False``). With
one split the split kernel writes O and the LSE itself. ``BALANCED_SPLIT`` ("ragged-split-long": a ragged batch the
rule splits, or any call it splits into a long merge chain) takes triton/decode's balanced split instead: a grid of
target shares + B · Hkv CTAs per M tile, each an equal share of the valid keys by the Triton stack's own device plan
(``balanced_share``), its partials in a slab of packed rows and the item's last share merging (``BALANCED``;
``_decode_balanced.py``); ``M_TILE_MAJOR`` puts the M tile on the grid's x, a share's M tiles together
(``splits.balanced_grid``); ``BALANCED_PAIR_TILE`` gives that kernel a ring of 64-key blocks that two CTAs share an SM
with where it makes the grid one wave (``balanced_pair_tile``; pages of 16 or 32 too, by
``BALANCED_PAIR_SMALL_PAGES``, the warpgroup copying their chunks where the load warp would).
``ITEMS_IN_FLIGHT`` ("many-rows": D=64 items of two or more M tiles; issue #38's many short items, one split each)
launches ``_items_kernel`` instead: fewer CTAs
than tiles, each walking the tiles its load warp claims from a counter, the ring and its barrier phases running on
across tiles (``SplitKeys.ring_base``) and the next tile's Q in a second buffer, so that a tile's Q, first copies and
O store pass under its neighbours' key blocks rather than each CTA paying them alone. ``ITEMS_TWO_CONSUMERS`` (D=64)
makes a tile two M tiles of an item on two consumer warpgroups beside the load warp, one CTA an SM, so that an item's K
and V are read once rather than once per M tile; ``ITEMS_LONGEST_FIRST`` has the load warps rank a ragged batch by
length and claim the longest sequences' tiles first, so that the launch does not end on a few long items alone.
``TWO_CONSUMERS`` (D=64 and D=128 items of two or more M tiles; issue #38's compute-bound class, 128-256 packed rows
a KV head; the balanced split's too at D=128, ``BALANCED_TWO_CONSUMERS``, and where it keeps the target shares at
``BALANCED_TWO_CONSUMERS_SAME_TARGET``' head dims) gives a CTA two M tiles on gluon/hopper's
partitions: a load warp filling one ring, two consumer warpgroups each with its own 64 rows, Q tile and register
budget, so that one's softmax runs under the other's wgmmas and each K/V block is copied once for both
(``consumers_for``; ``_split_kernel``'s ``CONSUMERS``).
``PACKED_PREFILL_MIN_ROWS`` (128, cute/decode's; None turns it off) takes that class further, off the split
kernels: at 128+ packed rows a KV head a step is a prefill of group · Sq rows against the cache (256 rows ask 256 FLOPs
a K/V byte, past the read bandwidth's roofline), so a contiguous cache whose 128-row tiles (192 at D=64 where they pad
no more) fill the grid's waves runs gluon/hopper's warp-specialised forward on q packed as (B, Hkv, group · Sq, D),
copied at every call (:class:`PackedPrefill`); O and the LSE, contiguous, are that packing already and are written in
place: no split, no merge. Its kernel's ``PACKED_GROUP`` takes each row's causal diagonal and the bottom-right offset
(Sk - Sq, per sequence with ``cache_seqlens``) from its token, row % Sq. The rule is cute/decode's
(``splits.packed_prefill_splits``: uneven cache lengths only from 256 rows and ``splits.UNEVEN_MIN_WAVES`` waves of
tiles, since a tile runs its sequence's length). Limits: no key splits (gluon/hopper's kernel has none; a grid short of
the waves, few (batch, KV head) items on a long cache, stays on the split kernels), no paged cache, D 64 and 128 only,
and a copy of q (group · Sq · D elements a KV head) before each launch. bench/gluon_packed_prefill_ab.sh times it.

What Gluon makes explicit (what Triton decides in triton/decode / what this file writes):
  * Copies: the pipeliner turns the K and V loads into ``cp.async``, 16 bytes per thread and
    instruction with addresses in registers / one TMA copy per K or V block (``_load_kv_block``): an
    elected thread hands the copy engine a 32 KB box, which computes the addresses, zero-fills past
    the padded cache and counts the bytes into the slot's ready mbarrier.
  * Pipeline: ``num_stages`` buffers and their waits / a ring of ``NUM_STAGES`` K and V slots with
    ready barriers phased by the split's block index (``_ready_tile``), the split's first
    ``NUM_STAGES`` blocks issued before anything waits, and each slot refilled as soon as the wgmmas
    reading it have retired (``_refill``).
  * MMA: ``tl.dot`` on a 16-row tile, lowered to ``mma.sync`` with the warps side by side along the
    keys (row max and sum, and P before P V, cross warps through shared memory) / ``warpgroup_mma``,
    one m64 wgmma per GEMM: each warp holds 16 whole rows of S, P and O, so the softmax stays in the
    warp and P feeds P V from registers (``_operand_p``). The Q tile is padded to 64 rows for it.
  * Overlap inside a CTA: none beyond the loads / gluon/hopper's step (``_decode_step``): S_i = Q K_iᵀ
    is issued with O += P_(i-1) V_(i-1), and the softmax of S_i runs under that P V.
  * Layouts: inferred / ``NVMMADistributedLayout`` for S and O, ``DotOperandLayout`` for P,
    ``NVMMASharedLayout`` for Q and the ring, a ``BlockedLayout`` for Q's pointer load.

Paged KV cache (``block_table``, FlashAttention's / FlashInfer's NHD layout, as ``triton/decode``): K
and V are pools (num_pages, page_size, Hkv, D) shared by every sequence, and sequence b's key j is in
page ``block_table[b, j // page_size]``, slot ``j % page_size``. The descriptors see a pool as
(num_pages, Hkv, page_size, D), a strided view with the same (1, 1, rows, D) box, so a copy of rows
from one page is the contiguous copy with [page, kv_head, slot, 0] for [batch, kv_head, key, 0]
(``_load_paged_kv_block``). A key block is copied in chunks that each lie in one page: the whole block
when BLOCK_N divides page_size (pages of 128 or 256 keys), else the largest power of two dividing
page_size (16 keys for vLLM's 16, or for 48), each chunk's page looked up in the table and its rows
landing in their place in the ring slot, which stays the contiguous build's: same tile, same wgmmas,
same ring. Chunks need pages of a multiple of 16 keys (the capability check refuses other sizes). A
chunk past the sequence's last key reads the sequence's last page in use, never a table entry past
it (those may be anything). Each chunk's copy costs a barrier: Triton's shared-memory barrier pass sees
two copies into one ring slot as a write-after-write, not knowing that their rows differ. So where a
block takes several chunks and one CTA holds an SM (``PAGED_LOAD_WARP``), a warp of its own issues the
copies (``_paged_load_partition``, ``gl.warp_specialize``): it loads a block's table entries, waits for
the slot's empty barrier, which the warpgroup arrives on once the wgmmas reading the slot have retired,
and copies; the barriers between its copies span one warp, and the table's latency is its own. Elsewhere
the warpgroup copies, and a refill's table entries are loaded at the top of the step that ends in the
refill (``PAGE_ENTRIES_AHEAD``), so that their latency passes under the step's wgmmas. With
``page_size = 0`` the kernel is the contiguous one, instruction for instruction.

Why these choices:
  * wgmma rather than mma_v2 (m16): decoding is memory-bound, so the MMA only has to keep up. A
    128-key block at D=128 is 64 KB of K and V, which an SM's share of HBM (about 25 GB/s of an H100's
    3.35 TB/s, 36 GB/s of an H200's 4.8) takes 1.8 to 2.6 µs to deliver; the block's two m64n128k128
    wgmmas take about 0.6 µs at the tensor-core rate, however few of the 64 rows are real. mma_v2's
    16-row tile wastes less tensor-core work but splits every row across the warps, with reductions
    and P through shared memory at every block; wgmma keeps a row in one warp and reuses
    gluon/hopper's device code (``_scores``, ``_values_product``, P as packed words, the online softmax).
  * One warpgroup, no warp specialisation for a contiguous cache: gluon/hopper's load warp exists so
    that copies never wait for a busy consumer; here the consumer waits for memory. The warpgroup issues
    its own copies, and a slot's reuse is ordered by program order plus one barrier over its warps, so the
    ring needs ready barriers only (no empty barriers, no register budgets per partition). A paged cache
    in pages smaller than a key block takes a load warp (above): there each copy would stop the
    warpgroup at a barrier. ``WIDE_M_TILE`` (off):
    more than 64 packed rows take two warpgroups on one ring (8 warps, 128 rows), so the group's keys
    are copied once a CTA rather than once per 64 rows, and one's softmax can run under the other's wgmmas.
  * The ring depth: at least ``NUM_STAGES - 1`` blocks stay in flight while the warpgroup computes
    (128 KB at D=128: 3 stages of 64 KB), above what keeps an SM's share of HBM busy (bandwidth × latency,
    about 36 KB per SM at 4.8 TB/s and 1 µs); D=64's and short caches' rings let two CTAs share an SM, and
    ``PACKED_OCCUPANCY`` shallower ones three or four where 64 packed rows make the softmax the long part.
  * Q by pointers, not by TMA: the packed rows come from ``group`` heads; a load into registers and a
    store to shared memory take any strides and zero the padding rows, and Q is a few KB against
    the megabytes of K and V a split reads.

Algorithm (grid = (num_splits, m_blocks, B · Hkv); one CTA of one warpgroup per split of one M tile; under
``TWO_CONSUMERS`` the M extent is halved and steps 4 to 7 run in each consumer on its tile; the packed prefill runs
gluon/hopper's algorithm instead, on grid (packed tiles, B · Hkv)):
  1. ``seqlen_info``: the sequence's own length and causal offset; the keys any row sees end at
     ``key_end``; ``split_key_range`` cuts this split's [key_begin, key_end) out of them, of which
     blocks [0, n_unmasked) are seen by every row and [n_unmasked, n_blocks) are masked.
  2. Shared memory: the Q tile and the K/V ring; the ready barriers initialised and fenced.
  3. TMA the split's first ``NUM_STAGES`` key blocks (paged: chunk by chunk, each from its page).
  4. ``_stage_packed_q``: row r reads query head kv_head · group + r // Sq, token r % Sq.
  5. A split with keys (``_attend_split``): block 0 (S, mask, ``online_softmax_update``), then
     ``_decode_step`` over the unmasked blocks and the masked ones (the sequence tail and the causal
     diagonal, masked by each row's token), each waiting for K_i and V_(i-1), issuing both wgmmas,
     running the softmax of S_i, waiting for P V and refilling the slot; the last P V.
  6. ``online_softmax_finalize``: O and the natural-log LSE of the split (O = 0, LSE = -inf without
     keys), stored as fp32 partials or, with one split, as O and the LSE.
  7. The merge, in the tile's last CTA to arrive (``_merge_tile``, ``MERGE_ROWS`` packed rows at a
     time, only the tile's real ones): lse = log Σₛ exp(lseₛ), O = Σₛ exp(lseₛ - lse) · Oₛ.

Data movement: K and V HBM → shared memory by ``cp.async.bulk.tensor`` on 4-D descriptors over
(B, Hkv, Sk, D) with a (1, 1, BLOCK_N, D) box, so each (batch, KV head) has its own bounds; Q HBM →
registers → shared memory; shared memory → tensor cores by ``wgmma.mma_async`` (Q and K_i for S; V_i,
with P from registers, for P V); O from the accumulator registers to HBM by plain stores. The fp32
partials, num_splits · rows · (D + 1) · 4 bytes, are read back once by the tile's last CTA, in Q's
load layout (16-byte vectors along D).

Constraints: fp16 and bf16; D ∈ {64, 128, 256} (shared memory 200, 208 and 224 KB of the 227 KB a
CTA may use); 1 <= Sq <= ``MAX_SEQLEN_Q`` (a prefill-sized Sq is refused: use a prefill rung); GQA and
MQA; causal top-left or bottom-right; ``cache_seqlens``; the LSE; softmax_scale >= 0 (the scale is
applied after the row maximum); exactly sm_90; Triton 3.6 to 3.9 (``_device.py`` picks the TMA and
barrier names); a paged cache with pages of a multiple of 16 keys (16 to 256). There is no
interpreter path: Gluon compiles only for a GPU. Not done: FP8 caches, a persistent scheduler but for
``ITEMS_IN_FLIGHT``'s one-split tiles. Keys
past a sequence's own length inside its last block (or chunk) are loaded (TMA clips only at the
padded cache or the page) and weighed by P = 0, so a non-finite value stored there would reach O, as
in gluon/hopper (triton/decode masks those loads).
Measured figures go to ``docs/perf-log.md`` and ``compare.py --decode``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from common.contract import capability, splits
from common.contract.problem import Problem
from common.contract.registry import Runner, warmed_up
from common.contract.validation import kernel_operand, validate_for_problem
from common.toolchain.compile import KernelBinary
from common.toolchain.releases import triton_release
from triton_impl import decode as triton_decode
from triton_impl._host import (
    allocate_lse,
    balanced_workspace,
    feature_buffers,
    feature_constexprs,
    paging_arguments,
    resized,
    rung_result,
    size_arguments,
    split_workspace,
)
from triton_impl.gluon import _decode_balanced
from triton_impl.gluon import hopper as gluon_hopper
from triton_impl.gluon._decode_balanced import (
    _store_balanced,
    arrival_counter_count,
    balanced_constexprs,
    balanced_ring_stages,
    balanced_sizes,
)
from triton_impl.gluon._decode_merge import (
    MERGE_ROWS,
    _last_to_arrive,
    _merge_tile,
    _packed_rows,
    _q_load_layout,
    _store_output,
    _store_partials,
)
from triton_impl.gluon._device import (
    _accumulator_layout,
    _as_box,
    _operand_p,
    _partition_barrier,
    _ready_tile,
    _scores,
    _tma_load,
    _values_product,
    attention_mask,
    balanced_share,
    online_softmax_finalize,
    online_softmax_rescale,
    online_softmax_update,
    seqlen_info,
    split_key_range,
)
from triton_impl.gluon._host import (
    GLUON_DTYPES,
    LOAD_WARPS,
    WARPGROUP_THREADS,
    GluonConfig,
    compile_gluon_sm90,
    descriptor,
    descriptor_type,
    gluon_device_supported,
    gluon_implementation,
)

RUNG = "gluon/decode"
DTYPES = (torch.float16, torch.bfloat16)
# The problem features this rung implements (capability.check_features refuses any other).
IMPLEMENTED_FEATURES = (
    capability.GQA, capability.BOTTOM_RIGHT, capability.CACHE_SEQLENS, capability.LSE, capability.PAGED_KV,
)  # fmt: skip
# Packed rows per CTA: one warpgroup's wgmma M (four warps of 16 rows); more rows are cut into M tiles, a CTA each.
BLOCK_M, NUM_WARPS = 64, 4
# Issue #38's packed rows: more than BLOCK_M rows at D <= 128 in one CTA of two warpgroups on one K/V ring, keys copied
# once, not per 64-row tile (not D=256). Off: 0.99-1.12x the 64-row tiles' time (results/h200/decode-packed-ab/).
WIDE_M_TILE = False
WIDE_BLOCK_M, WIDE_NUM_WARPS, WIDE_HEAD_DIMS = 128, 8, (64, 128)


@dataclass(frozen=True)
class DecodeConfig:
    """Key block and ring depth per head dim (both change the generated code), and the CTAs an SM holds where
    registers, not the ring, set it (0: as many as the ring leaves room for, up to ``SPLIT_CTAS_PER_SM``)."""

    block_n: int
    num_stages: int
    ctas_per_sm: int = 0

    def __post_init__(self) -> None:
        # Block i's copy is issued once block i - num_stages has left its slot, at the end of step
        # i - num_stages + 1: with one stage that is step i itself, after its wait for block i.
        if self.num_stages < 2:
            raise ValueError(f"gluon/decode's ring needs at least 2 stages, got num_stages={self.num_stages}")


# A stage holds a K and a V block: 64 KB at D=128 (128 keys), three keep 128 KB an SM in flight while the warpgroup
# computes on the third. D=64: six 16 KB stages of 64 keys, two CTAs an SM, one's fixed costs under the other's copies
# (H200: ragged B=8 D=64 73 -> 84 %, paged ragged 61 -> 64 %; results/h200/decode-floor/); D=256: 3 x 64 KB (224 KB).
DEFAULT_CONFIGS = {64: DecodeConfig(64, 6), 128: DecodeConfig(128, 3), 256: DecodeConfig(64, 3)}
HEAD_DIMS = tuple(sorted(DEFAULT_CONFIGS))
# Issue #38's fifth stop: triton/decode's split-policy switches (slots up to what the ring leaves); SHORT_CACHE_TILE:
# a short padded cache takes a ring two CTAs share an SM with (D=128's 208 KB ring: 34 % at B=32 MHA Sq=8 1k). All on
# after the H200 A/B (results/h200/decode-floor5/): B=32 MHA Sq=8 1k ragged 35 -> 57 %, B=4 Hkv=2 D=64 276k 78 -> 88 %.
SPLIT_CTAS_PER_SM, SHORT_CACHE_ONE_SPLIT, SHORT_CACHE_TILE = 2, True, True
# ``splits.SplitPolicy.fewer_waves`` (results/h200/decode-fewpairs/): B=3 Hkv=8 13k 63.6 -> 58.5 us, 1 wave.
FEWER_WAVES = True
# triton/decode's balanced split (its switch, values and share plan), where the rule splits a ragged batch
# (H200, results/h200/decode-balanced-gluon-cute/): B=16 MQA D=256 ragged 213.5 -> 154.4 us, B=8 8k 84.9 -> 78.5;
# where the rule does not split, B=32 Hkv=32 ragged 124.3 -> 160.8, and at B=1 128k 136.8 -> 144.0: not there;
# "ragged-split-long" (also any call the rule splits past splits.LONG_CHAIN_SPLITS, a long merge chain): one sequence
# over two KV heads 191.8 -> 114.4 us (D=256 paged), 73.8 -> 59.8 (results/h200/decode-long-few-heads/).
BALANCED_SPLIT = "ragged-split-long"
# True: shares per SM at most the ring's CTA slots (1 at D=128's long ring, D=256): B=1 128k 144.0 -> 200.9 us.
BALANCED_SHARES_BY_SLOTS = False
# Issue #38's ragged row (B=8 Hkv=8 32k D=128, lengths 0..32768; H200, results/h200/decode/): gluon 136.5 us, cute
# 122.7, triton 126.0, FlashInfer 121.9. D=128's 208 KB ring holds one CTA an SM, so "per-slot" (132 slots, 64 items)
# keeps "per-sm"'s 264 shares: 328 CTAs in 2.5 waves, each SM paying every CTA's ramp (Q, the first blocks' latency)
# and drain (partials, merge) with nothing else in flight. BALANCED_PAIR_TILE: where that grid passes one wave and
# two slots an SM make "per-slot" take its one-wave branch (``balanced_pair_tile``), the balanced kernel takes
# BALANCED_PAIR_CONFIGS' ring instead (64-key blocks, 3 stages: 112 KB, 172 registers, two CTAs an SM; sm_90a, Triton
# 3.6): 200 shares + 64 items on 264 slots, cute/decode's plan. H200 (results/h200/gluon-balanced-pair/): the row
# 137.6 -> 120.6 us (FlashInfer 121.8), sweep rows of 45-88 items 0.87-0.97x, the rest 1.00x.
BALANCED_PAIR_TILE, BALANCED_PAIR_CONFIGS = True, {128: DecodeConfig(64, 3)}
# The paged row (B=8 Hkv=8 32k D=128 in pages of 16, full lengths given as cache_seqlens; H200, results/h200/decode/):
# gluon 269.4 us, FlashInfer 249.6. Its balanced grid is the ragged row's 2.5 waves of one CTA an SM (the load warp's
# ring); the same lengths contiguous took 270.3 (results/h200/gluon-paged-load-warp/), so the plan, not the pages, is
# the gap. BALANCED_PAIR_SMALL_PAGES: pages smaller than the pair ring's 64-key blocks take it too, the warpgroup
# issuing a block's 16- or 32-key chunks (two CTAs an SM, no load warp). H200 (results/h200/gluon-pair-small-pages/):
# pages of 16 274.8 -> 253.5 us (the contiguous twin 247.6 in the same run), of 32 272.9 -> 250.4, seed 59 row 1
# 121.0 -> 113.8; controls 1.00x.
BALANCED_PAIR_SMALL_PAGES = True
# Triton release -> head dims whose balanced kernel spills (3.9, D=256: 16-40 bytes a thread): never balanced there.
BALANCED_SPILLS = {"3.9": (256,)}
# The balanced grid's M tile on x, the share on y (triton/decode's switch): H200 (results/h200/decode-mtile-major/),
# seed 47's B=64 MQA D=256 paged row (2 M tiles) 165.5 -> 127.3 us; one M tile level.
M_TILE_MAJOR = True
SHORT_CACHE_CONFIGS = {128: DecodeConfig(64, 3)}
# Issue #38's short prefill (off until bench/decode_packed_ab.sh): a full 64-row tile at D=64 in its 105 KB ring is two
# CTAs an SM, each a serial wgmma-softmax-wgmma chain (seed 41's group 8 Sq=16 1k: 43 %); two stages (41 KB; D=128:
# three of 32 keys, 66 KB; 121-128 registers) let four (three) CTAs, counted by the split rule, share an SM.
PACKED_OCCUPANCY, PACKED_CONFIGS = False, {64: DecodeConfig(64, 2, 4), 128: DecodeConfig(32, 3, 3)}
SM_SHARED_BYTES, CTA_RESERVED_SHARED_BYTES = 233472, 1024
# Paged: the fewest key rows one TMA copy may take from a page (two 8-row swizzle atoms of the tile).
MIN_PAGE_CHUNK = 16
# Paged: a refill's table entries loaded at the top of the step that ends in it (True), their latency under its wgmmas,
# or at the refill (False). H200, Triton 3.6 (results/h200/gluon-paged-ahead/): B=8 Hkv=8 32k D=128 in pages of 16
# 324.2 -> 305.3 us, seed 89's row 1 291.9 -> 266.8, seed 59's row 1 154.1 -> 142.8; pages of 32 and 64 0.98-0.99x.
PAGE_ENTRIES_AHEAD = True
# Triton release -> head dims whose paged build spills more with the entries ahead (3.9, pages of 16: D=128 80 -> 168
# bytes a thread, D=256 64 -> 136): loaded at the refill there.
PAGE_ENTRIES_AHEAD_SPILLS = {"3.9": (128, 256)}
# Paged with pages smaller than a key block: one warp of its own (PAGED_LOAD_REGISTERS a thread) issues every
# chunk's copy, each block's as the warpgroup frees its slot (an empty barrier a slot), so the barrier pass's barriers
# between two copies into one slot span that warp instead of the warpgroup, and the table's latency is that warp's
# (sm_90a, Triton 3.6, pages of 16, D=128: the warpgroup's key loop 859 SASS, 2 barriers, no copy, against 1306, 10,
# 16 UTMALDG; spill-free in 3.6-3.9, where 3.9's warpgroup-copy build spills). On since its H200 A/B
# (bench/gluon_paged_load_warp_ab.sh, results/h200/gluon-paged-load-warp/, 2 rounds, each value checked against fp64
# first): B=8 Hkv=8 32k D=128 in pages of 16 305.6 -> 274.1 us (contiguous 270.3), of 32 287.9 -> 272.6, of 64
# 279.1 -> 269.9; seed 89 row 1 268.0 -> 235.6, seed 59 row 1 144.1 -> 121.7, seed 61 row 1 87.9 -> 80.8, seed 101
# row 0 (D=256) 150.7 -> 148.0; the contiguous row and a short cache's (not engaged) 1.00-1.01x.
PAGED_LOAD_WARP, PAGED_LOAD_REGISTERS = True, gl.constexpr(48)
# Issue #38's short items (seed 151 row 1: B=64 Hkv=32 group 5 Sq=16 D=64 paged, ~650 keys an item: 4096 tiles of
# ~10 key blocks, ~15 CTAs an SM in turn, each paying its Q, its ring's fill and its O store alone: 42 % of the read
# bandwidth). ITEMS_IN_FLIGHT: where the rule plans one split and the tiles pass the CTA slots, min(tiles, slots) CTAs
# each walk tiles that their load warp claims from a counter (``_items_kernel``); the load warp copies the next
# tile's Q (a second buffer) and first key blocks while the warpgroup finishes the current one, the ring and its
# barrier phases running on across tiles. Timed (H200, 2026-12-04, results/h200/gluon-decode-items/; the A/B is
# bench.decode_knob_ab's, bench/README.md): D=64 tiles of more than one 64-row M tile gain (151/1 0.918x, 93/4 0.912x,
# 41/1 0.804x), rows of one M tile are mixed (119/5 0.850x; 41/2 1.064x, 61/7 1.222x) and D=128's shallower ring
# loses (151/5 1.349x, 167/1 1.076x). "many-rows" (the default) takes only the first class; True takes every tile the
# kernel can (the tests' setting), False none.
ITEMS_IN_FLIGHT, ITEMS_HEAD_DIMS, ITEMS_Q_BUFFERS = "many-rows", (64, 128), 2
ITEMS_MANY_ROWS_HEAD_DIMS = (64,)
# The items kernel's lowest rows (seed 6007 row 4: B=32 H=512 Hkv=32 Sq=8 D=64, ragged 16..4292; 44 % of the read
# bandwidth) under Nsight Compute (H100, 2026-12-07, results/h100/gluon-decode-items-2026-12-07/): its SMs asked L2
# for 354 MB, 2.07x the 171 MB of K and V (each of an item's two M tiles reads them), and DRAM gave 231 MB (1.35x;
# triton/decode's split kernel 187 MB). ITEMS_TWO_CONSUMERS: head dim -> the ring (key block, stages) on which a tile
# is two M tiles of an item, on two consumer warpgroups beside the load warp (TWO_CONSUMERS' partitions), so that a
# K/V block is copied once for both; one CTA an SM. Empty: one consumer. H100, 2026-12-07 (same folder, against {},
# two rounds): the seven items rows 0.82-1.00x (6007/4 121.7 -> 115.2 us, 221/7 248.8 -> 203.5, 31/6 0.86x, 23/2 0.87x,
# 151/1 0.89x, 108/1 0.98x, 196/0 1.00x); 11 stages no better than 8.
ITEMS_TWO_CONSUMERS: dict[int, tuple[int, int]] = {64: (64, 8)}
# 6007/4 on two consumers under Nsight Compute (same folder): DRAM 196 MB, but its SMs busy 60 % of the launch on
# average (sm__cycles_active 136k of 229k cycles, the busiest 196k): a ragged batch's long items claimed late run alone
# at the end. ITEMS_LONGEST_FIRST: with ``cache_seqlens`` and at most ITEMS_LONGEST_FIRST_MAX_BATCH sequences, the load
# warps rank the batch by length (``_batch_ranks``) and claim the longest sequences' tiles first (longest processing
# time first). H100, 2026-12-07 (same folder, two consumers, against claim order, two rounds): 6007/4 116.1 -> 88.1 us
# (47 -> 62 % of the read bandwidth), 221/7 205.9 -> 148.6 (57 -> 80 %), 23/2 0.81x, 31/6 0.85x, 151/1 0.85x, 196/0
# 0.96x, timed with the ranks unrolled. The chunked loop that replaced it (the unrolled form spilled under Triton 3.9),
# H100, 2026-12-07 (results/h100/longest-first-2026-12-07/, the same A/B): 6007/4 116.9 -> 85.1 us (46 -> 63 %), 221/7
# 205.9 -> 145.9 (57 -> 81 %), 23/2 0.79x, 31/6 0.82x, 151/1 0.84x, 196/0 0.95x; its GPU tests passed there.
ITEMS_LONGEST_FIRST, ITEMS_LONGEST_FIRST_MAX_BATCH = True, 256
# Issue #38's compute-bound class (seeds 229 and 233: 256 packed rows a KV head, 256 FLOPs a K/V byte, past the read
# bandwidth's roofline; H200, 2026-12-04: gluon/decode at 38-44 % of the read bandwidth, 59-68 % of the roofline). One
# warpgroup a CTA runs one chain a block (S, softmax, P V), and D=128's 208 KB ring holds one CTA an SM; WIDE_M_TILE's
# two warpgroups in one partition keep lockstep (0.87-1.19x the time, results/h200/gluon-decode-wide-256/).
# TWO_CONSUMERS: the padded split's items of two or more M tiles take them two a CTA, on gluon/hopper's partitions: a
# load warp fills one ring, two consumer warpgroups each own 64 rows, a Q tile and a register budget, so that one's
# softmax runs under the other's wgmmas and a K/V block is copied once for 128 rows. Head dim -> the ring (key block,
# stages) for items of two M tiles and for items of more, one CTA an SM (both Q tiles beside it); empty: off.
# H200, 2026-12-04 (results/h200/gluon-decode-two-consumers/, the time against one consumer, 2 rounds):
# - gluon/hopper's two stages (128 keys at D=128, 64 at D=256): 233/5 0.89x, 107/0 0.95x, the rest 0.99-1.53x: a slot
#   is freed once both consumers' P V of its block has retired, so the next block's copy starts one step ahead;
# - D=128, 3 stages of 128 keys: the 256-row rows 0.74-0.89x (233/5 862.8 -> 656.0 us, 38 -> 50 % of the read
#   bandwidth, 59 -> 78 % of the roofline), the 128-row rows 0.92-1.10x;
# - D=128, 6 stages of 64 keys: the 128-row rows 0.87-0.99x, the 256-row rows 0.82-0.96x (O's rescale and a block's
#   fixed steps come twice as often a key);
# - D=256 (64 keys x 2, 32 x 5, 32 x 4): 0.94-1.38x, where the one-consumer ring already holds 3 stages of 64 keys;
# - D=64, 8 stages of 64 keys at two M tiles, 4 of 128 past them (results/h200/decode-many-rows-2026-12-04/): the five
#   rows the padded split kernel ran 0.78-0.92x (234/1 1228.0 -> 987.6 us), the three ITEMS_IN_FLIGHT ran 0.95-1.06x:
#   that kernel keeps its rows (``items_in_flight`` is asked first).
TWO_CONSUMERS: dict[int, tuple[tuple[int, int], tuple[int, int]]] = {128: ((64, 6), (128, 3)), 64: ((64, 8), (128, 4))}
# Triton releases whose two-consumer build spills where a key block is copied in page chunks (3.9: 64-88 bytes a
# thread with the LSE, pages of 16 to 64; 3.6, 3.7.1 and 3.8 none but two 4-byte arguments in two builds, reloaded in
# the consumers' loops from L1):
# one consumer there.
TWO_CONSUMER_CHUNK_SPILLS = ("3.9",)
# Head dims whose balanced split's calls (ragged or paged batches the rule splits, long chains) of the same class take
# two consumers too: the balanced kernel's grid with half the M extent, its target shares fed the CTA's M tiles on that
# ring. H200, 2026-12-04 (results/h200/decode-many-rows-2026-12-04/, D=128): six of seven ragged rows of the class
# 0.84-0.98x (176/6 192.8 -> 162.3 us), 62/1 (Sq=8, two M tiles) 1.04x, the control 1.00x. D=64 not unconditionally
# (bench/gluon_decode_balanced_two_d64_ab.sh timed (64, 128) on the 13 sweep rows it moves: three lost; sm_90a, Triton
# 3.6 and 3.8: 168 registers, 147912 bytes, no spill), but under the next rule.
BALANCED_TWO_CONSUMERS: tuple[int, ...] = (128,)
# Head dims whose balanced calls of the class take two consumers only where that keeps the plan's target shares
# (``balanced_two_consumers``): the target rules count shares over the grid's M tiles, so one CTA of two M tiles
# doubles the target wherever neither "per-slot"'s one-wave branch nor the full sequences' cap sets it (132 -> 264 on
# 132 SMs: a second wave of shares for CTAs that each hold an SM). D=64 at (64, 128) on an H100, 2026-12-06
# (results/h100/gluon-decode-balanced-two-d64-2026-12-06/): the eight rows of the same target 0.86-0.99x (5309/2 152.1
# -> 131.1 us), the three of 132 -> 264 that lose 1.15-1.24x (2026/4, 221/1, 104/3) and two doubled rows that gain
# (214/0 66 -> 132 0.93x, 189/3 132 -> 264 0.87x), which this rule leaves too. On at D=64: the sweep rows it moves are
# exactly those eight, each on the plan that A/B timed (tests/test_gluon_decode_two_consumers_target.py holds both).
BALANCED_TWO_CONSUMERS_SAME_TARGET: tuple[int, ...] = (64,)
# setmaxnreg of each consumer (the register file less the load warp's warpgroup, over two warpgroups: 232) and the
# registers a thread at launch (the file over the CTA's three warpgroups: 168).
TWO_CONSUMER_REGISTERS = (65536 - PAGED_LOAD_REGISTERS.value * WARPGROUP_THREADS) // (2 * WARPGROUP_THREADS) // 8 * 8
TWO_CONSUMER_MAXNREG = 65536 // (3 * WARPGROUP_THREADS) // 8 * 8
# Issue #38's compute-bound class on gluon/hopper's kernel (cute/decode's PACKED_PREFILL_MIN_ROWS, FlashAttention-3's
# pack-GQA): a contiguous cache of at least this many packed rows (group · Sq) a KV head runs gluon/hopper's
# warp-specialised forward on q packed as (B, Hkv, group · Sq, D) (``attention_kernel``'s PACKED_GROUP: each row's
# causal diagonal is its token's), 128-row tiles (192 at D=64 where they pad no more) over all of a sequence's keys, no
# split and no merge, where those tiles fill PACKED_PREFILL_MIN_WAVE_SHARE of the grid's waves, uneven work only from
# PACKED_PREFILL_UNEVEN_MIN_ROWS rows and ``splits.UNEVEN_MIN_WAVES`` waves of tiles: cute/decode's rule and constants
# (``splits.packed_prefill_splits``). No key splits: a grid short of the waves stays on the split kernels. cute/decode
# measured the route at 233/5 860.3 -> 561.7 us (H100, 2026-12-05). Here (bench/gluon_packed_prefill_ab.sh, H100,
# 2026-12-06, Triton 3.6, against None, two rounds): the eight moved rows 0.96-1.02x (231/6 1011.6 -> 974.0 us, 18/2
# 166.9 -> 159.8, 233/5 580.4 -> 570.3; 176/6 165.1 -> 169.0), the five it leaves 0.99-1.00x. None turns it off.
PACKED_PREFILL_MIN_ROWS: int | None = 128
PACKED_PREFILL_UNEVEN_MIN_ROWS = 256
PACKED_PREFILL_MIN_WAVE_SHARE = 0.9


def packed_occupancy(problem: Problem) -> bool:
    """Whether PACKED_OCCUPANCY's ring applies: a full 64-row tile (not WIDE_M_TILE's) at a head dim it has."""
    full_tile = problem.kv_group * problem.seqlen_q >= BLOCK_M and not wide_m_tile(problem)
    return PACKED_OCCUPANCY and full_tile and problem.head_dim in PACKED_CONFIGS


def decode_config(problem: Problem) -> DecodeConfig:
    """``problem``'s ring: PACKED_CONFIGS' under ``packed_occupancy``, SHORT_CACHE_CONFIGS' for a short cache under
    SHORT_CACHE_TILE, else the default."""
    configs = SHORT_CACHE_CONFIGS if SHORT_CACHE_TILE and problem.seqlen_k <= splits.SHORT_CACHE_KEYS else {}
    configs = PACKED_CONFIGS if packed_occupancy(problem) else configs
    return configs.get(problem.head_dim, DEFAULT_CONFIGS[problem.head_dim])


def split_policy(problem: Problem, config: DecodeConfig | None = None) -> splits.SplitPolicy:
    """The split rule's policy from the switches: CTA slots up to what an SM holds (K/V ring, Q tile) of ``config``'s
    ring (default ``decode_config``'s)."""
    config = config or decode_config(problem)
    tiles_bytes = (config.num_stages * 2 * config.block_n + block_m_for(problem)) * problem.head_dim * 2
    fit = max(1, SM_SHARED_BYTES // (tiles_bytes + CTA_RESERVED_SHARED_BYTES))
    return splits.SplitPolicy(config.ctas_per_sm or min(SPLIT_CTAS_PER_SM, fit), SHORT_CACHE_ONE_SPLIT, FEWER_WAVES)


def kv_chunk_rows(problem: Problem, config: DecodeConfig | None = None) -> int | None:
    """Key rows per TMA copy of a K or V block of ``config``'s ring (default ``decode_config``'s): the whole block
    for a contiguous cache; for a paged one the largest power of two up to the block that divides ``page_size``,
    so that each copy lies in one page (a block takes block_n / chunk copies); None when that is below
    ``MIN_PAGE_CHUNK`` (a page size with no factor 16, which this rung refuses)."""
    chunk = (config or decode_config(problem)).block_n
    while problem.paged and chunk >= MIN_PAGE_CHUNK and problem.page_size % chunk:
        chunk //= 2
    return chunk if chunk >= MIN_PAGE_CHUNK else None


class KVRing(NamedTuple):
    """The split's K/V ring: the descriptors it copies from, its ``NUM_STAGES`` slots of K and of V in
    shared memory and their ready barriers (one per slot, completed by the copy's byte count)."""

    desc_k: object
    desc_v: object
    k_ring: object
    v_ring: object
    k_ready: object
    v_ready: object


class SplitKeys(NamedTuple):
    """Where the split's key blocks lie: its (batch, KV head), its first key and its block count; for
    a paged cache also this sequence's row of the block table and the index of its last entry in use
    (both None for a contiguous cache); and under ``ITEMS_IN_FLIGHT`` the ring place of its block 0, the key blocks
    of the CTA's earlier items (the ring and its barrier phases run on across items; None: block i at place i)."""

    batch: object
    kv_head: object
    key_begin: object
    n_blocks: object
    block_table_row: object
    last_page: object
    ring_base: object = None


class StepConstants(NamedTuple):
    """What every key block of the split shares at compile time (a ``gl.constexpr`` on the device)."""

    s_layout: gl.NVMMADistributedLayout  # S = Q Kᵀ's accumulator
    p_layout: gl.DotOperandLayout  # P as the A operand of P V, from registers
    NUM_STAGES: int
    CAUSAL: bool
    PAGE_SIZE: int  # keys per page of a paged cache, 0 for a contiguous one
    PAGES_AHEAD: bool  # paged: a refill's table entries loaded at the top of its step (PAGE_ENTRIES_AHEAD)
    LOAD_WARP: bool  # paged: a warp of its own copies K and V (PAGED_LOAD_WARP); the warpgroup frees each slot
    ITEMS: bool = False  # ITEMS_IN_FLIGHT: the split's last slot freed too (the load warp runs on into the next item)
    CONSUMERS: int = 1  # ITEMS_IN_FLIGHT: M tiles a tile of the items kernel (ITEMS_TWO_CONSUMERS), a consumer each


class OutputConstants(NamedTuple):
    """How the split's O and LSE leave the CTA, at compile time (the kernel's flags of the same names)."""

    RETURN_LSE: bool
    BALANCED: bool
    SPLIT: bool
    FUSED_MERGE: bool
    SPLITS_PER_STEP: int
    M_TILE_MAJOR: bool
    MERGE_GROUP: int
    num_warps: int
    CONSUMERS: int = 1  # M tiles a CTA (TWO_CONSUMERS): the grid's M tiles are its y extent times this


# ----------------------------------------------------------------------------------------------
# Device parts: the packed rows, the K/V ring, one pipelined key block
# ----------------------------------------------------------------------------------------------
@gluon.jit
def _ring_place(keys, i):
    """The ring place of the split's key block ``i``: i, or under ``ITEMS_IN_FLIGHT`` after the CTA's earlier items'
    blocks (its slot place % NUM_STAGES, its lap place // NUM_STAGES)."""
    place = i
    if keys.ring_base is not None:
        place = keys.ring_base + i
    return place


@gluon.jit
def _stage_packed_q(Q, q_smem, batch, kv_head, group, m_block, seqlen_q, q_strides, num_warps: gl.constexpr):
    """Load the packed Q tile by pointers (its rows come from ``group`` heads) into ``q_smem``, zeros
    in the padding rows, and make it visible to the wgmmas (the async proxy) of every warp."""
    BLOCK_M: gl.constexpr = q_smem.shape[0]
    HEAD_DIM: gl.constexpr = q_smem.shape[1]
    stride_qb, stride_qh, stride_qm = q_strides
    layout: gl.constexpr = _q_load_layout(HEAD_DIM, num_warps)
    head, token, row_ok = _packed_rows(m_block, kv_head, group, seqlen_q, BLOCK_M, gl.SliceLayout(1, layout))
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
    rows = batch.to(gl.int64) * stride_qb + head.to(gl.int64) * stride_qh + token * stride_qm
    q = gl.load(Q + rows[:, None] + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    q_smem.store(q)
    # Generic-proxy stores, read by wgmma through the async proxy: fence, then every warp's rows.
    fence_async_shared()
    _partition_barrier()


@gluon.jit
def _block_pages(ring, keys, i, PAGE_SIZE: gl.constexpr):
    """The pool page of each CHUNK-key chunk of the split's key block ``i`` (a tuple, one load each, all
    in flight together): chunk c's first key j lies in page ``block_table_row[j // PAGE_SIZE]``. A chunk
    past the sequence's last key reads its last page in use instead (the table's entries past it may be
    anything), rows that the mask then hides."""
    desc_k, _, k_ring, _, _, _ = ring
    BLOCK_N: gl.constexpr = k_ring.shape[1]
    CHUNK: gl.constexpr = desc_k.block_type.shape[2]
    start_n = keys.key_begin + i * BLOCK_N
    pages = ()
    for c in gl.static_range(BLOCK_N // CHUNK):
        entry = gl.minimum((start_n + c * CHUNK) // PAGE_SIZE, keys.last_page)
        # Gluon's JIT has no starred tuple displays: the tuple grows by concatenation.
        pages = pages + (gl.load(keys.block_table_row + entry),)  # noqa: RUF005
    return pages


@gluon.jit
def _load_paged_kv_block(ring, keys, stage, start_n, pages, PAGE_SIZE: gl.constexpr):
    """PagedKV: K and V of the key block from ``start_n`` out of page pools, which the descriptors see
    as (num_pages, Hkv, page_size, D), into ring slot ``stage``, in chunks of CHUNK keys (the
    descriptors' box) that each lie in one page: chunk c's keys start at page ``pages[c]``
    (:func:`_block_pages`), slot ``j % PAGE_SIZE`` (j its first key), and land in rows
    [c · CHUNK, (c + 1) · CHUNK) of the slot."""
    desc_k, desc_v, k_ring, v_ring, k_ready, v_ready = ring
    BLOCK_N: gl.constexpr = k_ring.shape[1]
    CHUNK: gl.constexpr = desc_k.block_type.shape[2]
    mbarrier.expect(k_ready.index(stage), desc_k.block_type.nbytes * (BLOCK_N // CHUNK))
    mbarrier.expect(v_ready.index(stage), desc_v.block_type.nbytes * (BLOCK_N // CHUNK))
    k_box = _as_box(k_ring.index(stage))
    v_box = _as_box(v_ring.index(stage))
    for c in gl.static_range(BLOCK_N // CHUNK):
        coords = [pages[c], keys.kv_head, (start_n + c * CHUNK) % PAGE_SIZE, 0]
        _tma_load(desc_k, coords, k_ready.index(stage), k_box.slice(c * CHUNK, CHUNK, dim=2))
        _tma_load(desc_v, coords, v_ready.index(stage), v_box.slice(c * CHUNK, CHUNK, dim=2))


@gluon.jit
def _load_kv_block(ring, keys, i, pages, NUM_STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr):
    """TMA K and V of the split's key block ``i`` (``keys``: :class:`SplitKeys`) into ring slot
    (ring_base + i) % NUM_STAGES of ``ring`` (:class:`KVRing`); each copy completes its ready barrier with its byte
    count (a box past the padded cache is zero-filled and counted). ``PAGE_SIZE`` > 0: from page pools
    (:func:`_load_paged_kv_block`), its chunks' ``pages`` already loaded, or () to load them here."""
    desc_k, desc_v, k_ring, v_ring, k_ready, v_ready = ring
    BLOCK_N: gl.constexpr = k_ring.shape[1]
    stage = _ring_place(keys, i) % NUM_STAGES
    start_n = keys.key_begin + i * BLOCK_N
    if PAGE_SIZE:
        if len(pages) == 0:
            pages = _block_pages(ring, keys, i, PAGE_SIZE)
        _load_paged_kv_block(ring, keys, stage, start_n, pages, PAGE_SIZE)
    else:
        mbarrier.expect(k_ready.index(stage), desc_k.block_type.nbytes)
        _tma_load(desc_k, [keys.batch, keys.kv_head, start_n, 0], k_ready.index(stage), _as_box(k_ring.index(stage)))
        mbarrier.expect(v_ready.index(stage), desc_v.block_type.nbytes)
        _tma_load(desc_v, [keys.batch, keys.kv_head, start_n, 0], v_ready.index(stage), _as_box(v_ring.index(stage)))


@gluon.jit
def _refill(ring, keys, i, pages, NUM_STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr):
    """Block ``i`` into the slot that block i - NUM_STAGES has just left, if the split has it. The
    same warps read the slot (their wgmmas have retired) and issue the copy, so program order and one
    barrier over the warpgroup order the two: no empty barriers, as a load warp would need."""
    if i < keys.n_blocks:
        _partition_barrier()
        _load_kv_block(ring, keys, i, pages, NUM_STAGES, PAGE_SIZE)


@gluon.jit
def _decode_step(carry, i, step_args, constants: gl.constexpr, MASKED: gl.constexpr):
    """Key block i ≥ 1 of the split: issue S_i = Q K_iᵀ and O += P_(i-1) V_(i-1), run the softmax of
    S_i while that P V runs, then refill the slot of block i - 1 with block i - 1 + NUM_STAGES (with a
    load warp: free it for that warp's refill)."""
    acc, P, alpha, row_max, row_sum = carry
    q_smem, ring, keys, offs_m, seqlen, softmax_scale_log2, empty = step_args
    s_layout: gl.constexpr = constants.s_layout
    p_layout: gl.constexpr = constants.p_layout
    NUM_STAGES: gl.constexpr = constants.NUM_STAGES
    _, _, k_ring, v_ring, k_ready, v_ready = ring
    seqlen_k, causal_offset = seqlen
    BLOCK_N: gl.constexpr = k_ring.shape[1]

    # Paged: the refill's table entries now, their latency under this step's wgmmas and softmax
    # (loaded at the refill, each step waited for them before its copies could start).
    pages = ()
    if constants.PAGES_AHEAD:
        pages = _block_pages(ring, keys, i - 1 + NUM_STAGES, constants.PAGE_SIZE)
    # O is the P V wgmma's accumulator: rescaled to the running maximum before it is issued.
    acc = online_softmax_rescale(acc, alpha)
    k_tile = _ready_tile(k_ring, k_ready, _ring_place(keys, i), NUM_STAGES)
    v_tile = _ready_tile(v_ring, v_ready, _ring_place(keys, i - 1), NUM_STAGES)
    s_token = _scores(q_smem, k_tile, s_layout)
    pv_token = _values_product(P, v_tile, acc, p_layout)
    # wgmmas retire in order: one left in flight means S_i is done and P V still runs.
    S = warpgroup_mma_wait(1, deps=[s_token])
    if MASKED:
        start_n = keys.key_begin + i * BLOCK_N
        S = attention_mask(S * softmax_scale_log2, offs_m, start_n, seqlen_k, causal_offset, CAUSAL=constants.CAUSAL)
    P_f32, alpha, row_max, row_sum = online_softmax_update(
        S, row_max, row_sum, softmax_scale_log2, S_SCALED=MASKED, MASKED=MASKED
    )
    acc = warpgroup_mma_wait(0, deps=[pv_token])
    # P_i's words are written after the wgmma reading P_(i-1)'s has retired (gluon/hopper: written
    # under a running wgmma, they made ptxas serialise every wgmma).
    P = _operand_p(P_f32, v_ring.dtype, p_layout)
    if constants.LOAD_WARP:
        # Block i - 1's slot is free (S_(i-1) and P V_(i-1) have retired): the load warp may refill it.
        mbarrier.arrive(empty.index(_ring_place(keys, i - 1) % NUM_STAGES))
    else:
        _refill(ring, keys, i - 1 + NUM_STAGES, pages, NUM_STAGES, constants.PAGE_SIZE)
    return acc, P, alpha, row_max, row_sum


@gluon.jit
def _attend_split(q_smem, ring, keys, empty, n_unmasked, step_args, constants: gl.constexpr):
    """Fold the split's key blocks (at least one) into ``(acc, row_max, row_sum)`` of the M tile.
    ``step_args``: the packed rows' tokens (``offs_m``), ``(seqlen_k, causal_offset)`` and the scale.
    ``empty``: the slots' empty barriers where a load warp refills them (``constants.LOAD_WARP``), else None."""
    s_layout: gl.constexpr = constants.s_layout
    p_layout: gl.constexpr = constants.p_layout
    o_layout: gl.constexpr = p_layout.parent
    NUM_STAGES: gl.constexpr = constants.NUM_STAGES
    _, _, k_ring, v_ring, k_ready, v_ready = ring
    offs_m, seqlen, softmax_scale_log2 = step_args
    seqlen_k, causal_offset = seqlen
    BLOCK_M: gl.constexpr = q_smem.shape[0]
    HEAD_DIM: gl.constexpr = q_smem.shape[1]
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

    # Block 0 starts the pipeline: S_0 and its softmax before the loop, always masked (it may be the
    # sequence's tail or on the causal diagonal, and the rows may not have seen a key yet).
    row_max = gl.full([BLOCK_M], float("-inf"), gl.float32, row_layout)
    row_sum = gl.zeros([BLOCK_M], gl.float32, row_layout)
    k_tile = _ready_tile(k_ring, k_ready, _ring_place(keys, 0), NUM_STAGES)
    S = warpgroup_mma_wait(0, deps=[_scores(q_smem, k_tile, s_layout)])
    S = attention_mask(S * softmax_scale_log2, offs_m, keys.key_begin, seqlen_k, causal_offset, CAUSAL=constants.CAUSAL)
    P_f32, alpha, row_max, row_sum = online_softmax_update(
        S, row_max, row_sum, softmax_scale_log2, S_SCALED=True, MASKED=True
    )
    P = _operand_p(P_f32, v_ring.dtype, p_layout)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)

    # Blocks every row sees in full need no mask; then the sequence tail and the causal diagonal.
    carry = (acc, P, alpha, row_max, row_sum)
    step_args = (q_smem, ring, keys, offs_m, seqlen, softmax_scale_log2, empty)
    for i in range(1, n_unmasked):
        carry = _decode_step(carry, i, step_args, constants, MASKED=False)
    for i in range(gl.maximum(n_unmasked, 1), keys.n_blocks):
        carry = _decode_step(carry, i, step_args, constants, MASKED=True)
    acc, P, alpha, row_max, row_sum = carry

    # The last block's P V.
    acc = online_softmax_rescale(acc, alpha)
    last = _ring_place(keys, keys.n_blocks - 1)
    v_tile = _ready_tile(v_ring, v_ready, last, NUM_STAGES)
    acc = warpgroup_mma_wait(0, deps=[_values_product(P, v_tile, acc, p_layout)])
    if constants.ITEMS:
        # The load warp's ring runs on into the CTA's next item: its last slot is free too.
        mbarrier.arrive(empty.index(last % NUM_STAGES))
    return acc, row_max, row_sum


@gluon.jit
def _split_blocks(split, num_splits, seqlen_k, seqlen_q, causal_offset, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr):
    """Step 1's key blocks of split ``split`` of ``num_splits`` of a sequence of ``seqlen_k`` keys: ``(key_begin,
    n_blocks, n_unmasked)``, blocks [0, n_unmasked) seen by every row, [n_unmasked, n_blocks) masked."""
    key_end = gl.maximum(gl.minimum(seqlen_k, seqlen_q + causal_offset), 0) if CAUSAL else seqlen_k
    key_begin, key_end = split_key_range(split, num_splits, key_end, BLOCK_N)
    visible_to_all = gl.minimum(seqlen_k, causal_offset + 1) if CAUSAL else seqlen_k
    unmasked_end = gl.minimum(gl.maximum(visible_to_all // BLOCK_N * BLOCK_N, key_begin), key_end)
    n_blocks = (key_end - key_begin + BLOCK_N - 1) // BLOCK_N
    n_unmasked = (unmasked_end - key_begin) // BLOCK_N
    return key_begin, n_blocks, n_unmasked


@gluon.jit
def _paged_load_partition(ring, keys, empty, NUM_STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr):
    """PAGED_LOAD_WARP (and ``_items_kernel``'s load warp, for a contiguous cache too): the split's key blocks, each
    into its ring slot once the warpgroup has freed it (the empty barrier's phase of the slot's lap; a fresh barrier
    counts as having completed the phase before phase 0, so the first lap passes at once). A block's table entries
    are loaded before the wait, their latency under it. The chunks' copies are this warp's alone: the barrier pass's
    barriers between them span one warp."""
    for i in range(keys.n_blocks):
        place = _ring_place(keys, i)
        if PAGE_SIZE:  # noqa: SIM108 - a constexpr branch, not a value (the contiguous cache has no pages)
            pages = _block_pages(ring, keys, i, PAGE_SIZE)
        else:
            pages = ()
        mbarrier.wait(empty.index(place % NUM_STAGES), ((place // NUM_STAGES) & 1) ^ 1)
        _load_kv_block(ring, keys, i, pages, NUM_STAGES, PAGE_SIZE)


@gluon.jit
def _split_o_lse(q_smem, ring, keys, empty, work, constants: gl.constexpr, q_release):
    """Steps 5 and 6 of ``_split_consumer`` (and of each of ``_items_consumer``'s tiles): the split's key blocks
    folded into O (a split with no key keeps O = 0, row_sum = 0: LSE -inf), then its O and natural-log LSE in wgmma's
    accumulator layout, with the packed rows' output coordinates ``(head, token, row, row_ok, offs_d)`` (``row``: the
    row of the (B, H, Sq) outputs). ``work``: the tile, the split's unmasked blocks, the lengths and scale;
    ``q_release``: a barrier to arrive on once every wgmma reading Q has retired (``_items_consumer``'s Q buffer), or
    None."""
    tile, n_unmasked, seqlen, softmax_scale_log2 = work
    batch, kv_head, group, heads, seqlen_q, m_block = tile
    s_layout: gl.constexpr = constants.s_layout
    o_layout: gl.constexpr = constants.p_layout.parent
    BLOCK_M: gl.constexpr = q_smem.shape[0]
    HEAD_DIM: gl.constexpr = q_smem.shape[1]

    # 5. The split's key blocks.
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    _, offs_m, _ = _packed_rows(m_block, kv_head, group, seqlen_q, BLOCK_M, s_rows)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    row_max = gl.full([BLOCK_M], float("-inf"), gl.float32, s_rows)
    row_sum = gl.zeros([BLOCK_M], gl.float32, s_rows)
    # What every key block shares, bound once: tensors in a tuple, layouts and flags in a constexpr one.
    step_args = (offs_m, seqlen, softmax_scale_log2)
    if keys.n_blocks > 0:
        acc, row_max, row_sum = _attend_split(q_smem, ring, keys, empty, n_unmasked, step_args, constants)
    if q_release is not None:
        mbarrier.arrive(q_release)

    # 6. The split's O and LSE, from wgmma's accumulator layout, and the rows they go to.
    out, lse = online_softmax_finalize(acc, row_max, row_sum)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    head, token, row_ok = _packed_rows(m_block, kv_head, group, seqlen_q, BLOCK_M, o_rows)
    lse = gl.convert_layout(lse, o_rows)
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    row = (batch.to(gl.int64) * heads + head) * seqlen_q + token
    return out, lse, (head, token, row, row_ok, offs_d)


@gluon.jit
def _split_consumer(operands, work, constants: gl.constexpr, flags: gl.constexpr):
    """Steps 4 to 7 of ``_split_kernel`` in the warpgroup: the packed Q tile, the split's key blocks, its O and LSE
    (or partials) and the merge. ``operands``: Q and its strides, the Q tile, the ring, the split's keys, the
    empty barriers (None without a load warp), the outputs and the split workspace; ``work``: the tile, the
    split's unmasked blocks, the lengths and scale, and ``shares``: (share, split, num_splits, has_work) of a
    balanced split, else ((batch, KV head) item of the grid, split, num_splits, True)."""
    Q, q_strides, q_smem, ring, keys, empty, outputs, workspace = operands
    tile, n_unmasked, seqlen, softmax_scale_log2, shares = work
    batch, kv_head, group, _, seqlen_q, m_block = tile
    BLOCK_M: gl.constexpr = q_smem.shape[0]
    HEAD_DIM: gl.constexpr = q_smem.shape[1]
    num_warps: gl.constexpr = flags.num_warps

    # 4. The packed Q tile, by pointers, while the first copies fly.
    _stage_packed_q(Q, q_smem, batch, kv_head, group, m_block, seqlen_q, q_strides, num_warps)

    # 5 and 6. The split's key blocks, then its O and LSE with their rows. The partials are
    # (num_splits, B, H, Sq, D) and (num_splits, B, H, Sq), contiguous.
    tile_work = (tile, n_unmasked, seqlen, softmax_scale_log2)
    out, lse, rows_of = _split_o_lse(q_smem, ring, keys, empty, tile_work, constants, None)
    head, token, row, row_ok, offs_d = rows_of
    OutPartial, LsePartial, Counters = workspace
    if flags.BALANCED:
        # 7'. O, or the partials in the share's slab and the item's merge (``_decode_balanced.py``).
        _store_balanced(
            workspace, outputs, tile, shares, rows_of, out, lse, BLOCK_M, HEAD_DIM,
            flags.SPLITS_PER_STEP, flags.RETURN_LSE, flags.M_TILE_MAJOR, num_warps, flags.MERGE_GROUP, flags.CONSUMERS,
        )  # fmt: skip
    elif flags.SPLIT:
        _, split, num_splits, _ = shares
        rows = gl.num_programs(2).to(gl.int64) * group * seqlen_q
        _store_partials(OutPartial, LsePartial, split * rows + row, out, lse, row_ok, offs_d)
        # 7. Fused merge: the tile's last split to finish merges all of them.
        if flags.FUSED_MERGE:
            work_item = shares[0] * (gl.num_programs(1) * flags.CONSUMERS) + m_block
            if _last_to_arrive(Counters + work_item, num_splits):
                partials = (OutPartial, LsePartial, rows, num_splits)
                _merge_tile(
                    partials, outputs, tile, BLOCK_M, HEAD_DIM, flags.SPLITS_PER_STEP, flags.RETURN_LSE, num_warps
                )
    else:
        _store_output(outputs, batch, head, token, row, row_ok, offs_d, out, lse, flags.RETURN_LSE)


# ----------------------------------------------------------------------------------------------
# Kernel 1: one split of the keys for one packed M tile of one (batch, KV head)
# ----------------------------------------------------------------------------------------------
@gluon.jit
def _split_kernel(
    Q, desc_k, desc_v, Out, Lse, CacheSeqlens, OutPartial, LsePartial,
    stride_qb, stride_qh, stride_qm,
    stride_ob, stride_oh, stride_om,
    heads, kv_heads, seqlen_q, seqlen_k, softmax_scale_log2, BlockTable, stride_btb, Counters,
    batch_size, target_shares, min_share_blocks, max_item_shares,
    CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_CACHE_SEQLENS: gl.constexpr, RETURN_LSE: gl.constexpr,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, SPLIT: gl.constexpr,
    PAGE_SIZE: gl.constexpr, PAGES_AHEAD: gl.constexpr, LOAD_WARP: gl.constexpr, FUSED_MERGE: gl.constexpr,
    SPLITS_PER_STEP: gl.constexpr, BALANCED: gl.constexpr, BLOCK_B: gl.constexpr, M_TILE_MAJOR: gl.constexpr,
    MERGE_GROUP: gl.constexpr, CONSUMERS: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    """K and V are (B, Hkv, Sk, D) caches, or (``PAGE_SIZE`` > 0) page pools (num_pages, page_size, Hkv,
    D) that ``desc_k`` / ``desc_v`` see as (num_pages, Hkv, page_size, D), with ``BlockTable`` the
    (B, max_pages) int32 table and ``stride_btb`` its row stride (both None for a contiguous cache);
    their box is a key block, or for pages a chunk of one (``kv_chunk_rows``). ``Counters``: the
    arrival counters of the fused merge (one per M tile of the grid; None without it). ``BALANCED``: the
    grid is (target_shares + B · Hkv, m_blocks) (``M_TILE_MAJOR``: swapped), CTA ``share`` takes the split
    ``balanced_share`` plans from the ``batch_size`` lengths (the plan's four sizes None without it);
    ``MERGE_GROUP`` > 0 merges an item's shares in runs of that many (``_decode_balanced.py``'s two-level merge).
    ``CONSUMERS`` = 2 (``TWO_CONSUMERS``; the balanced split's under ``BALANCED_TWO_CONSUMERS``): the CTA of M extent y
    takes M tiles 2y and 2y + 1 on two
    consumer partitions of 4 warps (``CONSUMER_REGS`` registers each), each with its own Q tile, beside a load warp
    that fills the one ring they share (an empty barrier a slot, one arrival per consumer)."""
    HEAD_DIM: gl.constexpr = desc_k.block_type.shape[3]
    dtype: gl.constexpr = desc_k.dtype
    # wgmma's accumulators (S: BLOCK_M × BLOCK_N, O: BLOCK_M × D; a warp holds 16 whole rows of each, a
    # warpgroup 64: with WIDE_M_TILE's 8 warps the two warpgroups issue their own wgmmas on the same ring)
    # and P as the A operand of P V from registers.
    s_layout: gl.constexpr = _accumulator_layout(num_warps, BLOCK_N)
    o_layout: gl.constexpr = _accumulator_layout(num_warps, HEAD_DIM)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    if BALANCED:
        # 0. This CTA's work item and split; past the last share: an empty range, nothing stored.
        share = gl.program_id(1 if M_TILE_MAJOR else 0)
        m_block = gl.program_id(0 if M_TILE_MAJOR else 1) * CONSUMERS
        sizes = (batch_size, kv_heads, seqlen_q, target_shares, min_share_blocks, max_item_shares)
        batch, kv_head, split, num_splits, has_work = balanced_share(
            CacheSeqlens, share, sizes, seqlen_k, CAUSAL, BOTTOM_RIGHT, HAS_CACHE_SEQLENS, BLOCK_N, BLOCK_B, num_warps,
        )  # fmt: skip
        shares = (share, split, num_splits, has_work)
    else:
        split = gl.program_id(0)
        num_splits = gl.num_programs(0)
        m_block = gl.program_id(1) * CONSUMERS
        batch_kv_head = gl.program_id(2)
        batch = batch_kv_head // kv_heads
        kv_head = batch_kv_head % kv_heads
        shares = (batch_kv_head, split, num_splits, True)
    group = heads // kv_heads

    # 1. This sequence's keys, the last one any row sees, and this split's share of them: blocks
    # [0, n_unmasked) of the split are seen by every row, the rest [n_unmasked, n_blocks) is masked.
    seqlen_k, causal_offset = seqlen_info(
        CacheSeqlens, batch, seqlen_q, seqlen_k, HAS_CACHE_SEQLENS=HAS_CACHE_SEQLENS, BOTTOM_RIGHT=BOTTOM_RIGHT
    )
    key_begin, n_blocks, n_unmasked = _split_blocks(
        split, num_splits, seqlen_k, seqlen_q, causal_offset, CAUSAL, BLOCK_N
    )

    # 2. Shared memory: the packed Q tile, and a ring of NUM_STAGES K and V slots, each with a ready
    # barrier that its TMA copy completes.
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], dtype)
    if CONSUMERS == 2:
        q_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_M, HEAD_DIM], q_layout)
    else:
        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_layout)
    tile_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
    k_ring = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], tile_layout)
    v_ring = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], tile_layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for stage in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(stage), count=1)
        mbarrier.init(v_ready.index(stage), count=1)
    if LOAD_WARP:
        # One arrival a lap from each consumer, once the wgmmas reading the slot's K and V have retired.
        empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        for stage in gl.static_range(NUM_STAGES):
            mbarrier.init(empty.index(stage), count=CONSUMERS)
    # The inits are generic-proxy writes and the TMA unit completes the barriers through the async
    # proxy: a proxy fence orders them (the barrier after Q's staging shows them to every warp).
    fence_async_shared()
    ring = KVRing(desc_k, desc_v, k_ring, v_ring, k_ready, v_ready)
    # Paged: this sequence's row of the block table says which page holds which of its keys.
    if PAGE_SIZE:
        keys = SplitKeys(
            batch, kv_head, key_begin, n_blocks, BlockTable + batch * stride_btb, (seqlen_k - 1) // PAGE_SIZE
        )
    else:
        keys = SplitKeys(batch, kv_head, key_begin, n_blocks, None, None)

    # 3. Put the split's first NUM_STAGES key blocks in flight at once, before anything waits (with a load
    # warp: all of them, each as the warpgroup frees its slot), then steps 4 to 7 in the warpgroup.
    constants: gl.constexpr = StepConstants(s_layout, p_layout, NUM_STAGES, CAUSAL, PAGE_SIZE, PAGES_AHEAD, LOAD_WARP)
    flags: gl.constexpr = OutputConstants(
        RETURN_LSE, BALANCED, SPLIT, FUSED_MERGE, SPLITS_PER_STEP, M_TILE_MAJOR, MERGE_GROUP, num_warps, CONSUMERS
    )
    outputs = (Out, Lse, stride_ob, stride_oh, stride_om)
    tile = (batch, kv_head, group, heads, seqlen_q, m_block)
    work = (tile, n_unmasked, (seqlen_k, causal_offset), softmax_scale_log2, shares)
    q_strides = (stride_qb, stride_qh, stride_qm)
    workspace = (OutPartial, LsePartial, Counters)
    if CONSUMERS == 2:
        # Each consumer its own partition (one 8-warp partition would keep the two warpgroups in lockstep, as
        # gluon/hopper's docstring says), so that one's softmax runs under the other's wgmmas.
        second = (batch, kv_head, group, heads, seqlen_q, m_block + 1)
        work_1 = (second, n_unmasked, (seqlen_k, causal_offset), softmax_scale_log2, shares)
        operands_0 = (Q, q_strides, q_smem.index(0), ring, keys, empty, outputs, workspace)
        operands_1 = (Q, q_strides, q_smem.index(1), ring, keys, empty, outputs, workspace)
        gl.warp_specialize(
            [
                (_split_consumer, (operands_0, work, constants, flags)),
                (_split_consumer, (operands_1, work_1, constants, flags)),
                (_paged_load_partition, (ring, keys, empty, NUM_STAGES, PAGE_SIZE)),
            ],
            [num_warps, LOAD_WARPS],
            [CONSUMER_REGS, PAGED_LOAD_REGISTERS],
        )
    elif LOAD_WARP:
        operands = (Q, q_strides, q_smem, ring, keys, empty, outputs, workspace)
        gl.warp_specialize(
            [
                (_split_consumer, (operands, work, constants, flags)),
                (_paged_load_partition, (ring, keys, empty, NUM_STAGES, PAGE_SIZE)),
            ],
            [LOAD_WARPS],
            [PAGED_LOAD_REGISTERS],
        )
    else:
        operands = (Q, q_strides, q_smem, ring, keys, None, outputs, workspace)
        for i in gl.static_range(NUM_STAGES):
            if i < n_blocks:
                _load_kv_block(ring, keys, i, (), NUM_STAGES, PAGE_SIZE)
        _split_consumer(operands, work, constants, flags)


# ----------------------------------------------------------------------------------------------
# Kernel 1': ITEMS_IN_FLIGHT, one CTA walking many tiles, its load warp running ahead across them
# ----------------------------------------------------------------------------------------------
class ItemBuffers(NamedTuple):
    """What the load warp hands the consumers, one item at a time, two of each (item j of the CTA in buffer j % 2):
    the packed Q tiles (TMA copies, one a consumer: consumer c's of buffer b at ``b * CONSUMERS + c``), the claim
    (tile, seqlen_k) as two int32, and their barriers: ``q_ready`` (the load warp's arrival, then Q's bytes) and
    ``q_empty`` (one arrival a consumer, once its wgmmas of item j have retired)."""

    q_smem: object
    claim: object
    q_ready: object
    q_empty: object


@gluon.jit
def _item_tile(t, m_groups, kv_heads):
    """(batch, KV head, M group) of tile ``t``: the group of ``CONSUMERS`` M tiles t % m_groups of item t // m_groups,
    so that an item's groups are claimed one after the other (one group, both M tiles, under two consumers)."""
    batch_kv_head = t // m_groups
    return batch_kv_head // kv_heads, batch_kv_head % kv_heads, t % m_groups


@gluon.jit
def _consumer_m_block(m_group, CONSUMERS: gl.constexpr, CONSUMER: gl.constexpr):
    """The M tile that consumer ``CONSUMER`` of ``CONSUMERS`` computes of M group ``m_group``: the group's CONSUMER-th
    (the load warp copied its Q tile into that consumer's buffer)."""
    return m_group * CONSUMERS + CONSUMER


@gluon.jit
def _claimed_item(items, j, layout: gl.constexpr):
    """The CTA's item j: (tile, seqlen_k) once the load warp has published it and, for a tile, Q has landed."""
    buffer = j % 2
    mbarrier.wait(items.q_ready.index(buffer), (j // 2) & 1)
    claim = items.claim.index(buffer).load(layout)
    first = gl.arange(0, 2, layout=layout) == 0
    return gl.sum(gl.where(first, claim, 0), axis=0), gl.sum(gl.where(first, 0, claim), axis=0)


@gluon.jit
def _claim(Counter, layout: gl.constexpr):
    """Issue a claim on the launch's next tile after the first wave's: one lane's atomic on ``Counter``, its old value
    in that lane and 0 in the others (``layout``: a lane an element), so that nothing waits for it until
    :func:`_claimed_tile` reads it (a scalar atomic's value is broadcast at once, through shared memory). Every CTA
    claims until it gets a tile past the last, so a launch makes ``num_tiles`` claims in all, and the last of them
    (the tile grid + num_tiles - 1) puts the counter back to 0 for the next launch."""
    first = gl.arange(0, 32, layout=layout) == 0
    return gl.atomic_add(Counter + first.to(gl.int32) * 0, first.to(gl.int32), mask=first, sem="relaxed", scope="gpu")


@gluon.jit
def _claimed_tile(claim):
    """The tile a :func:`_claim` took: grid + the claims made before it."""
    return gl.num_programs(0) + gl.sum(claim, axis=0)


@gluon.jit
def _tile_length(CacheSeqlens, t, m_groups, kv_heads, seqlen_k, HAS_CACHE_SEQLENS: gl.constexpr):
    """Tile ``t``'s ``cache_seqlens`` entry as loaded (clamped where it is used, so that the load's latency passes
    under what comes between), or the padded Sk."""
    if HAS_CACHE_SEQLENS:
        seqlen_k = gl.load(CacheSeqlens + t // m_groups // kv_heads)
    return seqlen_k


@gluon.jit
def _batch_ranks(CacheSeqlens, batch_size, BLOCK_B: gl.constexpr):
    """``ITEMS_LONGEST_FIRST``: (batch, its rank) for batches 0..BLOCK_B-1 across the load warp's lanes, rank 0 the
    longest ``cache_seqlens`` entry (ties by index; the batches past the last ranked last): each batch counts the
    entries that come before it, CHUNK at a time in a loop (not unrolled: the load warp's 48 registers hold one
    chunk, where every entry's load issued at once spilled)."""
    CHUNK: gl.constexpr = 8
    layout: gl.constexpr = gl.BlockedLayout([1, CHUNK], [32, 1], [1, 1], [1, 0])
    batches = gl.arange(0, BLOCK_B, layout=gl.SliceLayout(1, layout))
    lengths = gl.expand_dims(gl.load(CacheSeqlens + batches, mask=batches < batch_size, other=-1), 1)
    rows = gl.expand_dims(batches, 1)
    ranks = gl.zeros([BLOCK_B], gl.int32, gl.SliceLayout(1, layout))
    for chunk in range(BLOCK_B // CHUNK):
        columns = chunk * CHUNK + gl.arange(0, CHUNK, layout=gl.SliceLayout(0, layout))
        others = gl.expand_dims(gl.load(CacheSeqlens + columns, mask=columns < batch_size, other=-1), 0)
        before = (others > lengths) | ((others == lengths) & (gl.expand_dims(columns, 0) < rows))
        ranks += gl.sum(before.to(gl.int32), axis=1)
    return batches, ranks


@gluon.jit
def _ordered_tile(claim, order, per_batch, num_tiles):
    """The tile that claim ``claim`` (below ``num_tiles``; clamped) takes: the same index without an ``order``, else
    the (claim // per_batch)-th longest batch's tile claim % per_batch, so that the longest items start first and
    the short ones fill the last CTAs' gaps (``ITEMS_LONGEST_FIRST``)."""
    tile = gl.minimum(claim, num_tiles - 1)
    if order is not None:
        batches, ranks = order
        batch = gl.sum(gl.where(ranks == tile // per_batch, batches, 0), axis=0)
        tile = batch * per_batch + tile % per_batch
    return tile


@gluon.jit
def _items_load_partition(operands, sizes, constants: gl.constexpr, BOTTOM_RIGHT: gl.constexpr,
                          HAS_CACHE_SEQLENS: gl.constexpr, ORDER_BLOCK_B: gl.constexpr):  # fmt: skip
    """ITEMS_IN_FLIGHT's load warp: the CTA's tiles (its first by the CTA's index, each next one claimed from
    ``Counter`` a tile ahead, its length loaded under the current tile's copies), each published with its length
    (the claim), its Q tiles copied into the claim's buffer and its key blocks into the ring as the consumers free
    slots (``_paged_load_partition`` at the ring places after the CTA's earlier tiles: the slots' phases run on). A
    claim past the last tile, published without Q, ends every partition. A tile is ``CONSUMERS`` M tiles of an item,
    a Q tile copied for each consumer, their key blocks copied once for all of them. ``ORDER_BLOCK_B`` > 0
    (``ITEMS_LONGEST_FIRST``): claims take the batches longest first (``_ordered_tile``); the claim published is
    the tile taken, or the claim itself past the last."""
    desc_q, items, ring, empty, CacheSeqlens, BlockTable, stride_btb, Counter = operands
    heads, kv_heads, seqlen_q, seqlen_k_padded, m_groups, num_tiles = sizes
    NUM_STAGES: gl.constexpr = constants.NUM_STAGES
    PAGE_SIZE: gl.constexpr = constants.PAGE_SIZE
    CONSUMERS: gl.constexpr = constants.CONSUMERS
    BLOCK_M: gl.constexpr = items.q_smem.shape[1]
    BLOCK_N: gl.constexpr = ring.k_ring.shape[1]
    claim_layout: gl.constexpr = gl.BlockedLayout([2], [32], [1], [0])
    lane_layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    group = heads // kv_heads
    last_claim = gl.num_programs(0) + num_tiles - 1
    t = gl.program_id(0)
    pending = _claim(Counter, lane_layout)
    per_batch = kv_heads * m_groups
    if ORDER_BLOCK_B:  # noqa: SIM108 - a constexpr branch, not a value (claim order has no ranks)
        order = _batch_ranks(CacheSeqlens, num_tiles // per_batch, ORDER_BLOCK_B)
    else:
        order = None
    tile = _ordered_tile(t, order, per_batch, num_tiles)
    length = _tile_length(CacheSeqlens, tile, m_groups, kv_heads, seqlen_k_padded, HAS_CACHE_SEQLENS)
    ring_base = t * 0
    j = ring_base
    claimed = t < num_tiles
    while claimed:
        claimed = t < num_tiles
        buffer = j % 2
        # Item j - 2 has left the buffer (its wgmmas on Q have retired, its claim was read).
        mbarrier.wait(items.q_empty.index(buffer), ((j // 2) & 1) ^ 1)
        batch, kv_head, m_group = _item_tile(tile, m_groups, kv_heads)
        # Clamped, as seqlen_info's, so that a bad length cannot make the copies read past the padded cache.
        seqlen_k = gl.minimum(gl.maximum(length, 0), seqlen_k_padded)
        seqlen_k, causal_offset = seqlen_info(
            None, batch, seqlen_q, seqlen_k, HAS_CACHE_SEQLENS=False, BOTTOM_RIGHT=BOTTOM_RIGHT
        )
        published = gl.where(claimed, tile, t)
        items.claim.index(buffer).store(gl.where(gl.arange(0, 2, layout=claim_layout) == 0, published, seqlen_k))
        # Every lane's store before the arrival that publishes it.
        _partition_barrier()
        q_ready = items.q_ready.index(buffer)
        if claimed:
            mbarrier.expect(q_ready, CONSUMERS * desc_q.block_type.nbytes)
            for consumer in gl.static_range(CONSUMERS):
                # A group's M tile past the item's rows reads the next heads' rows (or TMA's zeros): never stored.
                q_row = kv_head * group * seqlen_q + _consumer_m_block(m_group, CONSUMERS, consumer) * BLOCK_M
                q_box = _as_box(items.q_smem.index(buffer * CONSUMERS + consumer))
                _tma_load(desc_q, [batch, 0, q_row, 0], q_ready, q_box)
            # The claim issued a tile ago (its latency under that tile's copies).
            upcoming = _claimed_tile(pending)
            if upcoming == last_claim:
                gl.store(Counter, 0)
            next_tile = _ordered_tile(upcoming, order, per_batch, num_tiles)
            length = _tile_length(CacheSeqlens, next_tile, m_groups, kv_heads, seqlen_k_padded, HAS_CACHE_SEQLENS)
            key_begin, n_blocks, _ = _split_blocks(0, 1, seqlen_k, seqlen_q, causal_offset, constants.CAUSAL, BLOCK_N)
            if PAGE_SIZE:
                table_row = BlockTable + batch * stride_btb
                keys = SplitKeys(batch, kv_head, key_begin, n_blocks, table_row, (seqlen_k - 1) // PAGE_SIZE, ring_base)
            else:
                keys = SplitKeys(batch, kv_head, key_begin, n_blocks, None, None, ring_base)
            _paged_load_partition(ring, keys, empty, NUM_STAGES, PAGE_SIZE)
            ring_base += n_blocks
            t, tile = upcoming, next_tile
            if t < num_tiles:
                pending = _claim(Counter, lane_layout)
        else:
            mbarrier.arrive(q_ready)
        j += 1


@gluon.jit
def _items_consumer(operands, sizes, constants: gl.constexpr, flags: gl.constexpr, BOTTOM_RIGHT: gl.constexpr,
                    CONSUMER: gl.constexpr):  # fmt: skip
    """ITEMS_IN_FLIGHT's warpgroup ``CONSUMER``: steps 4 to 6 of ``_split_consumer`` for each item the load warp
    publishes, in its order, until a claim past the last tile: its M tile of item j (the tile's ``CONSUMER``-th), Q
    from buffer j % 2, its key blocks at the ring places after the CTA's earlier items (``SplitKeys.ring_base``), its
    last slot freed too (``constants.ITEMS``), Q's buffer freed once its wgmmas have retired, so that the load warp's
    copies of the next items run under this one's last blocks and its O store."""
    items, ring, empty, outputs = operands
    heads, kv_heads, seqlen_q, softmax_scale_log2, m_groups, num_tiles = sizes
    CONSUMERS: gl.constexpr = constants.CONSUMERS
    BLOCK_N: gl.constexpr = ring.k_ring.shape[1]
    claim_layout: gl.constexpr = gl.BlockedLayout([2], [32], [flags.num_warps], [0])
    group = heads // kv_heads
    ring_base = gl.program_id(0) * 0
    j = ring_base
    t, seqlen_k = _claimed_item(items, j, claim_layout)
    while t < num_tiles:
        batch, kv_head, m_group = _item_tile(t, m_groups, kv_heads)
        m_block = _consumer_m_block(m_group, CONSUMERS, CONSUMER)
        seqlen_k, causal_offset = seqlen_info(None, batch, seqlen_q, seqlen_k, HAS_CACHE_SEQLENS=False,
                                              BOTTOM_RIGHT=BOTTOM_RIGHT)  # fmt: skip
        key_begin, n_blocks, n_unmasked = _split_blocks(
            0, 1, seqlen_k, seqlen_q, causal_offset, constants.CAUSAL, BLOCK_N
        )
        keys = SplitKeys(batch, kv_head, key_begin, n_blocks, None, None, ring_base)
        tile = (batch, kv_head, group, heads, seqlen_q, m_block)
        work = (tile, n_unmasked, (seqlen_k, causal_offset), softmax_scale_log2)
        # Once every wgmma reading this Q has retired, its buffer and claim may take item j + 2.
        q_smem, q_release = items.q_smem.index(j % 2 * CONSUMERS + CONSUMER), items.q_empty.index(j % 2)
        out, lse, rows_of = _split_o_lse(q_smem, ring, keys, empty, work, constants, q_release)
        head, token, row, row_ok, offs_d = rows_of
        _store_output(outputs, batch, head, token, row, row_ok, offs_d, out, lse, flags.RETURN_LSE)
        ring_base += n_blocks
        j += 1
        t, seqlen_k = _claimed_item(items, j, claim_layout)


@gluon.jit
def _items_kernel(
    desc_q, desc_k, desc_v, Out, Lse, CacheSeqlens,
    stride_ob, stride_oh, stride_om,
    heads, kv_heads, seqlen_q, seqlen_k, softmax_scale_log2, BlockTable, stride_btb, Counter, num_tiles,
    CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_CACHE_SEQLENS: gl.constexpr, RETURN_LSE: gl.constexpr,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr,
    CONSUMERS: gl.constexpr, CONSUMER_REGS: gl.constexpr, ORDER_BLOCK_B: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    """ITEMS_IN_FLIGHT: the split kernel's one-split form (``SPLIT`` off) for ``num_tiles`` tiles (``CONSUMERS`` M
    tiles of a (batch, KV head) each) on a grid of fewer CTAs, each walking the tiles its load warp claims
    (``_items_load_partition``, ``_items_consumer``). ``desc_q``: Q seen as (B, 1, H · Sq, D), a box of BLOCK_M packed
    rows (the rows past a KV head's group · Sq are the next heads' or TMA's zeros, computed on and never stored);
    ``Counter``: one int32, 0 between launches. K, V, the block table and the outputs as ``_split_kernel``'s.
    ``CONSUMERS`` = 2 (``ITEMS_TWO_CONSUMERS``): two consumer partitions of 4 warps (``CONSUMER_REGS`` registers
    each) take a tile's two M tiles on the one ring, so that an item's K and V are read once, not once an M tile.
    ``ORDER_BLOCK_B`` > 0 (``ITEMS_LONGEST_FIRST``; a power of two, at least the batch): tiles claimed longest batch
    first."""
    HEAD_DIM: gl.constexpr = desc_k.block_type.shape[3]
    dtype: gl.constexpr = desc_k.dtype
    s_layout: gl.constexpr = _accumulator_layout(num_warps, BLOCK_N)
    o_layout: gl.constexpr = _accumulator_layout(num_warps, HEAD_DIM)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    m_blocks = (heads // kv_heads * seqlen_q + BLOCK_M - 1) // BLOCK_M
    m_groups = (m_blocks + CONSUMERS - 1) // CONSUMERS

    # Shared memory: two buffers of Q tiles (one a consumer) and claims, the K/V ring; ready barriers (Q's, the
    # ring's) and empty ones (an arrival a consumer).
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], dtype)
    q_smem = gl.allocate_shared_memory(dtype, [2 * CONSUMERS, BLOCK_M, HEAD_DIM], q_layout)
    claim = gl.allocate_shared_memory(gl.int32, [2, 2], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    tile_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
    k_ring = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], tile_layout)
    v_ring = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], tile_layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for stage in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(stage), count=1)
        mbarrier.init(v_ready.index(stage), count=1)
        mbarrier.init(empty.index(stage), count=CONSUMERS)
    for buffer in gl.static_range(2):
        mbarrier.init(q_ready.index(buffer), count=1)
        mbarrier.init(q_empty.index(buffer), count=CONSUMERS)
    fence_async_shared()
    ring = KVRing(desc_k, desc_v, k_ring, v_ring, k_ready, v_ready)
    items = ItemBuffers(q_smem, claim, q_ready, q_empty)

    constants: gl.constexpr = StepConstants(
        s_layout, p_layout, NUM_STAGES, CAUSAL, PAGE_SIZE, False, True, True, CONSUMERS
    )
    flags: gl.constexpr = OutputConstants(RETURN_LSE, False, False, False, 1, False, 0, num_warps)
    outputs = (Out, Lse, stride_ob, stride_oh, stride_om)
    consumer_operands = (items, ring, empty, outputs)
    consumer_sizes = (heads, kv_heads, seqlen_q, softmax_scale_log2, m_groups, num_tiles)
    load_operands = (desc_q, items, ring, empty, CacheSeqlens, BlockTable, stride_btb, Counter)
    load_sizes = (heads, kv_heads, seqlen_q, seqlen_k, m_groups, num_tiles)
    if CONSUMERS == 2:
        gl.warp_specialize(
            [
                (_items_consumer, (consumer_operands, consumer_sizes, constants, flags, BOTTOM_RIGHT, 0)),
                (_items_consumer, (consumer_operands, consumer_sizes, constants, flags, BOTTOM_RIGHT, 1)),
                (
                    _items_load_partition,
                    (load_operands, load_sizes, constants, BOTTOM_RIGHT, HAS_CACHE_SEQLENS, ORDER_BLOCK_B),
                ),
            ],
            [num_warps, LOAD_WARPS],
            [CONSUMER_REGS, PAGED_LOAD_REGISTERS],
        )
    else:
        gl.warp_specialize(
            [
                (_items_consumer, (consumer_operands, consumer_sizes, constants, flags, BOTTOM_RIGHT, 0)),
                (
                    _items_load_partition,
                    (load_operands, load_sizes, constants, BOTTOM_RIGHT, HAS_CACHE_SEQLENS, ORDER_BLOCK_B),
                ),
            ],
            [LOAD_WARPS],
            [PAGED_LOAD_REGISTERS],
        )


# ----------------------------------------------------------------------------------------------
# Host: tile shape, split rule, bind, prepare
# ----------------------------------------------------------------------------------------------
def wide_m_tile(problem: Problem) -> bool:
    """``WIDE_M_TILE`` applies: more packed rows than one warpgroup's tile, at a head dim it fits."""
    return WIDE_M_TILE and problem.kv_group * problem.seqlen_q > BLOCK_M and problem.head_dim in WIDE_HEAD_DIMS


def block_m_for(problem: Problem) -> int:
    """Packed rows per CTA: one warpgroup's BLOCK_M, or WIDE_BLOCK_M for two (``wide_m_tile``)."""
    return WIDE_BLOCK_M if wide_m_tile(problem) else BLOCK_M


def num_warps_for(problem: Problem) -> int:
    return WIDE_NUM_WARPS if wide_m_tile(problem) else NUM_WARPS


def m_blocks_for(problem: Problem) -> int:
    """M tiles of one (batch, KV head): the group · Sq packed rows in tiles of ``block_m_for``."""
    return -(-problem.kv_group * problem.seqlen_q // block_m_for(problem))


def two_consumers(problem: Problem) -> bool:
    """``TWO_CONSUMERS`` may apply to ``problem``: two or more M tiles an item at a head dim of
    ``TWO_CONSUMERS``, not under WIDE_M_TILE's or PACKED_OCCUPANCY's tiles, nor in page chunks under a release of
    ``TWO_CONSUMER_CHUNK_SPILLS``; ``consumers_for`` decides the launch (the items kernel, the balanced split)."""
    if problem.head_dim not in TWO_CONSUMERS or wide_m_tile(problem):
        return False
    if m_blocks_for(problem) < 2 or packed_occupancy(problem):
        return False
    chunked = problem.paged and problem.page_size < two_consumer_config(problem).block_n
    return not (chunked and triton_release() in TWO_CONSUMER_CHUNK_SPILLS)


def two_consumer_config(problem: Problem) -> DecodeConfig:
    """``TWO_CONSUMERS``' ring at ``problem``'s head dim and M tiles, one CTA an SM."""
    two_tiles, more = TWO_CONSUMERS[problem.head_dim]
    return DecodeConfig(*(two_tiles if m_blocks_for(problem) == 2 else more), ctas_per_sm=1)


def consumers_for(problem: Problem, device: torch.device | None = None) -> int:
    """M tiles a CTA of ``problem``'s launch on ``device`` (None: the default SM count, as the sm_90a compile): two
    where ``two_consumers`` takes it and either the balanced split takes it on two (``balanced_two_consumers``) or,
    ``ITEMS_IN_FLIGHT``'s kernel not taking it, the two-consumer split is one that
    ``BALANCED_SPLIT`` would leave padded (no split of a ragged batch, no merge chain past
    ``splits.LONG_CHAIN_SPLITS``: its CTAs hold twice the rows, so the rule may split an item twice as often; H200,
    seed 222's row 2, B=1 Hkv=2: 63 splits 157.2 us against one consumer's 32 in 122.0); else one."""
    device = device or torch.device("cpu")
    if not two_consumers(problem):
        return 1
    if balanced_split(problem, device):
        return 2 if balanced_two_consumers(problem, device) else 1
    if items_in_flight(problem, device):
        return 1
    two_consumer_splits = lambda: rule_splits(problem, device, 2)  # noqa: E731
    return 1 if splits.balanced_split_applies(BALANCED_SPLIT, problem, two_consumer_splits) else 2


def balanced_two_consumers(problem: Problem, device: torch.device) -> bool:
    """Whether the balanced split's launch of ``problem`` (which ``two_consumers`` takes) on ``device`` runs two M tiles
    a CTA: at a head dim of ``BALANCED_TWO_CONSUMERS`` always; at one of ``BALANCED_TWO_CONSUMERS_SAME_TARGET`` only
    where the two-consumer plan's target shares are no more than the one-consumer plan's (``balanced_target``). Where
    the target holds, the same shares run in half the CTAs and each key block is copied once for both M tiles (D=64:
    0.86-0.99x the time); where it doubles (the target rules count shares over the grid's M tiles, which two a CTA
    halve), every item is cut into twice the shares, whose CTAs, one an SM, take more waves, each paying its ramp and
    drain (seeds 2026/4, 221/1 and 104/3 at D=64: 1.15-1.24x). The targets follow from the shape and the device only,
    never the lengths, so a CUDA graph replayed with new lengths keeps its launch."""
    if problem.head_dim in BALANCED_TWO_CONSUMERS:
        return True
    if problem.head_dim not in BALANCED_TWO_CONSUMERS_SAME_TARGET:
        return False
    return balanced_target(problem, device, 2) <= balanced_target(problem, device, 1)


def grid_m_blocks(problem: Problem, consumers: int) -> int:
    """The split grid's M extent: ``m_blocks_for``'s tiles, ``consumers`` a CTA."""
    return -(-m_blocks_for(problem) // consumers)


def rule_splits(
    problem: Problem, device: torch.device, consumers: int = 1, policy: splits.SplitPolicy | None = None
) -> int:  # fmt: skip
    """The shared split rule (``common/contract/splits.py``) on a launch of ``consumers`` M tiles a CTA: its grid's M
    extent and ``policy`` (default: ``split_policy`` of that launch's ring, ``TWO_CONSUMERS``' for two)."""
    config = two_consumer_config(problem) if consumers == 2 else None
    policy = policy or split_policy(problem, config)
    return splits.planned_num_splits(problem, grid_m_blocks(problem, consumers), device, policy)


def planned_num_splits(problem: Problem, device: torch.device) -> int:
    """The split rule on this rung's padded launch of ``problem`` on ``device`` (its consumers, ``consumers_for``)."""
    return rule_splits(problem, device, consumers_for(problem, device))


def packed_prefill(problem: Problem, device: torch.device | None = None) -> bool:
    """Whether ``PACKED_PREFILL_MIN_ROWS`` runs ``problem`` on gluon/hopper's kernel on ``device`` (None: the CPU, whose
    compile is for sm_90a, at the rule's default SM count): a head dim and dtype gluon/hopper takes, then the rule
    cute/decode shares (``splits.packed_prefill_splits`` on this module's constants) with one split, the only count
    gluon/hopper's kernel runs."""
    if PACKED_PREFILL_MIN_ROWS is None:
        return False
    if problem.head_dim not in gluon_hopper.DEFAULT_CONFIGS or problem.dtype not in gluon_hopper.DTYPES:
        return False
    policy = splits.PackedPrefillPolicy(
        PACKED_PREFILL_MIN_ROWS, PACKED_PREFILL_UNEVEN_MIN_ROWS, PACKED_PREFILL_MIN_WAVE_SHARE
    )
    return splits.packed_prefill_splits(problem, device or torch.device("cpu"), policy) == 1


def packed_prefill_config(problem: Problem) -> GluonConfig:
    """gluon/hopper's configuration for ``problem``'s packed rows: its default at this head dim with the consumer
    warpgroups that pad the rows least (``splits.packed_prefill_warpgroups``: two, 128-row tiles; three at D=64 where
    192-row tiles pad no more)."""
    return replace(gluon_hopper.DEFAULT_CONFIGS[problem.head_dim], consumers=splits.packed_prefill_warpgroups(problem))


def packed_prefill_tiles(problem: Problem) -> int:
    """The packed prefill's CTAs: each (batch, KV head)'s packed rows in tiles of ``packed_prefill_config``'s rows."""
    return splits.packed_prefill_tiles(problem)


def balanced_spills(head_dim: int) -> bool:
    """Whether the balanced kernel spills at ``head_dim`` under this Triton release (``BALANCED_SPILLS``)."""
    return head_dim in BALANCED_SPILLS.get(triton_release(), ())


def balanced_split(problem: Problem, device: torch.device | None = None) -> bool:
    """Whether ``BALANCED_SPLIT`` takes ``problem`` on ``device`` (``splits.balanced_split_applies``, this
    rung's split rule; without a device, its default SM count, as the sm_90a compile assumes; never where
    the balanced kernel spills under this Triton release: ``balanced_spills``)."""
    if balanced_spills(problem.head_dim):
        return False
    rule_device = device or torch.device("cpu")
    policy = split_policy(problem)
    return splits.balanced_split_applies(BALANCED_SPLIT, problem, lambda: rule_splits(problem, rule_device, 1, policy))


def balanced_pair_tile(problem: Problem, device: torch.device | None = None) -> bool:
    """Whether ``BALANCED_PAIR_TILE`` gives ``problem``'s balanced launch on ``device`` (None: the default SM count, as
    the sm_90a compile) ``BALANCED_PAIR_CONFIGS``' ring: where the default ring would take it (no short-cache, packed
    or wide tile), a contiguous cache or pages of whole pair blocks (one copy a block: no load warp, which needs one
    CTA an SM; with ``BALANCED_PAIR_SMALL_PAGES`` pages dividing a pair block too, copied by the warpgroup in
    chunks), and under "per-slot" the pair ring's CTA slots take the one-wave branch (``splits.per_slot_one_wave``)
    where the default ring's do not (items 45-88 at D=128 on 132 SMs): there the default grid is 264 shares + items
    on 132 slots, the pair's slots - items shares + items on 264, one wave. Elsewhere both plans are one wave (few
    items) or many (the items fill the slots), and the longer blocks keep the deeper ring's streaming rate."""
    pair = BALANCED_PAIR_CONFIGS.get(problem.head_dim)
    default = decode_config(problem)
    if not BALANCED_PAIR_TILE or pair is None or default != DEFAULT_CONFIGS[problem.head_dim] or wide_m_tile(problem):
        return False
    whole_blocks = problem.page_size % pair.block_n == 0
    small_pages = BALANCED_PAIR_SMALL_PAGES and problem.paged and pair.block_n % problem.page_size == 0
    if not (whole_blocks or small_pages) or _decode_balanced.BALANCED_TARGET != "per-slot":
        return False
    if not balanced_split(problem, device):
        return False
    device, m_blocks = device or torch.device("cpu"), m_blocks_for(problem)
    items = problem.batch * problem.kv_heads

    def one_wave(config: DecodeConfig) -> bool:
        slots = splits.per_tile(device, split_policy(problem, config).ctas_per_sm, m_blocks)
        return splits.per_slot_one_wave(slots, items)

    return one_wave(pair) and not one_wave(default)


def balanced_config(problem: Problem, device: torch.device | None = None) -> DecodeConfig:
    """The balanced kernel's ring on ``device``: ``BALANCED_PAIR_CONFIGS``' where ``balanced_pair_tile``, else
    ``decode_config``'s."""
    return BALANCED_PAIR_CONFIGS[problem.head_dim] if balanced_pair_tile(problem, device) else decode_config(problem)


def balanced_launch_config(problem: Problem, device: torch.device, consumers: int) -> DecodeConfig:
    """The balanced kernel's ring on ``consumers`` M tiles a CTA: ``two_consumer_config``'s for two, else
    ``balanced_config``'s."""
    return two_consumer_config(problem) if consumers == 2 else balanced_config(problem, device)


def balanced_target(problem: Problem, device: torch.device, consumers: int, num_splits: int | None = None) -> int:
    """The balanced plan's target shares on ``device`` for ``consumers`` M tiles a CTA (``balanced_sizes`` on that
    launch's ring, CTA slots and grid M extent); ``num_splits`` forces them."""
    config = balanced_launch_config(problem, device, consumers)
    slots = (split_policy(problem, config).ctas_per_sm, BALANCED_SHARES_BY_SLOTS)
    m_blocks = grid_m_blocks(problem, consumers)
    return balanced_sizes(problem, device, num_splits, m_blocks, config.block_n, *slots)[1]


def balanced_stages(problem: Problem, device: torch.device, target: int, config: DecodeConfig | None = None) -> int:
    """The balanced kernel's ring depth for ``target`` shares on ``device``: ``config``'s (default ``decode_config``'s),
    or where the grid spills past one wave of its CTA slots ``BALANCED_SHALLOW_RING``'s
    (``_decode_balanced.balanced_ring_stages``)."""
    config = config or decode_config(problem)
    slots, stages = split_policy(problem, config).ctas_per_sm, config.num_stages
    return balanced_ring_stages(problem, device, target, m_blocks_for(problem), slots, stages)


def items_consumers(problem: Problem) -> int:
    """M tiles a tile of ``_items_kernel``: two (``ITEMS_TWO_CONSUMERS``, at its head dims, for items of two or more
    M tiles), else one."""
    return 2 if problem.head_dim in ITEMS_TWO_CONSUMERS and m_blocks_for(problem) >= 2 else 1


def items_tiles(problem: Problem) -> int:
    """The tiles ``_items_kernel`` walks: every ``items_consumers`` M tiles of every (batch, KV head)."""
    return -(-m_blocks_for(problem) // items_consumers(problem)) * problem.batch * problem.kv_heads


def _items_fit(problem: Problem, config: DecodeConfig) -> int:
    """CTAs an SM whose shared memory holds ``config``'s ring and ``ITEMS_Q_BUFFERS`` Q tiles a consumer."""
    q_rows = ITEMS_Q_BUFFERS * items_consumers(problem) * BLOCK_M
    tiles_bytes = (config.num_stages * 2 * config.block_n + q_rows) * problem.head_dim * 2
    return SM_SHARED_BYTES // (tiles_bytes + CTA_RESERVED_SHARED_BYTES)


def items_config(problem: Problem) -> DecodeConfig:
    """``_items_kernel``'s ring: ``ITEMS_TWO_CONSUMERS``' under two consumers; else ``decode_config``'s, one stage
    shallower at a time (down to 2) while the second Q buffer would leave fewer CTAs an SM than the split kernel's
    (D=64: 6 stages, 96 + 16 KB, two CTAs as before; D=128 short caches: 64-key blocks in 2 stages, 64 + 32 KB, two;
    D=128: 192 + 32 KB, one as before). A shallower D=64 ring for three CTAs an SM took 0.97-1.02x the time
    (results/h100/gluon-decode-items-occupancy-2026-12-07/)."""
    if items_consumers(problem) == 2:
        return DecodeConfig(*ITEMS_TWO_CONSUMERS[problem.head_dim])
    config = decode_config(problem)
    wanted = split_policy(problem, config).ctas_per_sm
    while config.num_stages > 2 and _items_fit(problem, config) < wanted:
        config = DecodeConfig(config.block_n, config.num_stages - 1, config.ctas_per_sm)
    return config


def items_ctas_per_sm(problem: Problem) -> int:
    """``_items_kernel``'s CTAs an SM, by the shared memory of ``items_config``'s ring and two Q tiles."""
    return _items_fit(problem, items_config(problem))


def items_maxnreg(problem: Problem) -> int:
    """Registers a thread at launch for ``items_ctas_per_sm`` CTAs an SM: a CTA is a warpgroup a consumer and the load
    warp's (padded: setmaxnreg takes whole warpgroups), 128 a thread for two CTAs of one consumer, of which the load
    warp's warpgroup gives all but ``PAGED_LOAD_REGISTERS`` to the warpgroup (208); 255 (the most) for one; 168 for one
    of two consumers (``TWO_CONSUMER_MAXNREG``, each consumer then taking ``TWO_CONSUMER_REGISTERS``)."""
    threads = (items_consumers(problem) + 1) * WARPGROUP_THREADS
    return min(255, 65536 // (items_ctas_per_sm(problem) * threads) // 8 * 8)


def items_grid(problem: Problem, device: torch.device | None = None) -> int:
    """``_items_kernel``'s CTAs: one a CTA slot of ``device`` (default SM count without one), at most one a tile."""
    slots = items_ctas_per_sm(problem) * splits.sm_count(device or torch.device("cpu"))
    return min(items_tiles(problem), slots)


def items_in_flight(problem: Problem, device: torch.device | None = None) -> bool:
    """Whether ``ITEMS_IN_FLIGHT`` takes ``problem`` on ``device`` (None: the default SM count, as the sm_90a compile):
    a head dim of ``ITEMS_HEAD_DIMS`` in one warpgroup's tile, one split by the rule (not the balanced split), and more
    tiles than the grid's CTAs (otherwise no CTA has a next tile to load ahead), not under PACKED_OCCUPANCY's ring;
    under "many-rows" also a head dim of ``ITEMS_MANY_ROWS_HEAD_DIMS`` and two or more M tiles an item."""
    # PACKED_OCCUPANCY's ring holds more CTAs an SM on fewer registers than the items kernel's two Q tiles allow.
    if (
        not ITEMS_IN_FLIGHT
        or problem.head_dim not in ITEMS_HEAD_DIMS
        or wide_m_tile(problem)
        or packed_occupancy(problem)
    ):
        return False
    many_rows = problem.head_dim in ITEMS_MANY_ROWS_HEAD_DIMS and m_blocks_for(problem) >= 2
    if ITEMS_IN_FLIGHT == "many-rows" and not many_rows:
        return False
    # One split by the one-consumer rule (the kernel's tiles are 64 rows a CTA); asked before TWO_CONSUMERS.
    rule_device = device or torch.device("cpu")
    if balanced_split(problem, device) or rule_splits(problem, rule_device) != 1:
        return False
    return items_tiles(problem) > items_grid(problem, device)


def items_constexprs(problem: Problem) -> dict[str, int | bool]:
    """``_items_kernel``'s constexprs and launch options on ``items_config``'s ring."""
    config, consumers = items_config(problem), items_consumers(problem)
    return {
        **feature_constexprs(problem), "BLOCK_M": BLOCK_M, "BLOCK_N": config.block_n,
        "NUM_STAGES": config.num_stages, "PAGE_SIZE": problem.page_size, "CONSUMERS": consumers,
        "CONSUMER_REGS": TWO_CONSUMER_REGISTERS if consumers == 2 else 0, "ORDER_BLOCK_B": items_order_block(problem),
        "num_warps": NUM_WARPS,
    }  # fmt: skip


def items_order_block(problem: Problem) -> int:
    """``_items_kernel``'s ORDER_BLOCK_B: 0 (claim order) unless ``ITEMS_LONGEST_FIRST`` takes ``problem`` (its
    ``cache_seqlens``, at most ITEMS_LONGEST_FIRST_MAX_BATCH sequences), else the batch as a power of two, at least a
    warp's 32 lanes (sm_90a, Triton 3.8 and 3.9: ``_batch_ranks`` spills nothing in the load warp's 48 registers from 32
    to 256 rows, 112 and 264 bytes at 512)."""
    return splits.longest_first_block(problem, ITEMS_LONGEST_FIRST, ITEMS_LONGEST_FIRST_MAX_BATCH, 32)


def load_warp(problem: Problem, config: DecodeConfig | None = None) -> bool:
    """Whether a paged problem's copies are a load warp's (``PAGED_LOAD_WARP``: pages smaller than a key block of
    ``config``'s ring, default ``decode_config``'s), where one CTA holds an SM (``split_policy``): the build takes 255
    registers a thread (sm_90a, Triton 3.6 and 3.8), so two CTAs of 160 threads would not fit one SM's registers."""
    config = config or decode_config(problem)
    small_pages = problem.paged and problem.page_size < config.block_n
    return PAGED_LOAD_WARP and small_pages and split_policy(problem, config).ctas_per_sm == 1


def pages_ahead(problem: Problem, config: DecodeConfig | None = None) -> bool:
    """Whether a paged problem's refills take table entries loaded a step ahead (``PAGE_ENTRIES_AHEAD``), but not
    where that spills under this Triton release (``PAGE_ENTRIES_AHEAD_SPILLS``) nor in a ring whose CTAs an SM its
    registers set (``DecodeConfig.ctas_per_sm`` of ``config``, default ``decode_config``'s: PACKED_CONFIGS' D=64 build
    in pages of 16 takes 168 registers with them under Triton 3.8, where four CTAs an SM need 128), nor where a load
    warp copies (``load_warp``: it loads its blocks' entries itself)."""
    config = config or decode_config(problem)
    spills = problem.head_dim in PAGE_ENTRIES_AHEAD_SPILLS.get(triton_release(), ())
    warpgroup_copies = not config.ctas_per_sm and not load_warp(problem, config)
    return problem.paged and PAGE_ENTRIES_AHEAD and not spills and warpgroup_copies


def split_constexprs(
    problem: Problem, split: bool, balanced: bool = False, m_tile_major: bool = False, num_stages: int | None = None,
    config: DecodeConfig | None = None, consumers: int = 1,
) -> dict[str, int | bool | None]:  # fmt: skip
    """The split kernel's constexprs on ``config``'s ring (default ``decode_config``'s; ``balanced_config`` for the
    balanced kernel); ``num_stages`` (``balanced_stages``) replaces its depth; ``consumers`` M tiles a CTA
    (``two_consumers``: two, whose copies are a load warp's)."""
    config, num_warps = config or decode_config(problem), num_warps_for(problem)
    if consumers == 2:
        return {
            **split_constexprs(problem, split, balanced, m_tile_major, num_stages, config),
            "LOAD_WARP": True, "PAGES_AHEAD": False,
            "CONSUMERS": 2, "CONSUMER_REGS": TWO_CONSUMER_REGISTERS,
        }  # fmt: skip
    return {
        **feature_constexprs(problem), "BLOCK_M": block_m_for(problem), "BLOCK_N": config.block_n,
        "NUM_STAGES": num_stages or config.num_stages, "SPLIT": split, "PAGE_SIZE": problem.page_size,
        "PAGES_AHEAD": pages_ahead(problem, config),
        "LOAD_WARP": load_warp(problem, config),
        "FUSED_MERGE": split and triton_decode.FUSED_MERGE, "BALANCED": balanced,
        **balanced_constexprs(problem, balanced, m_tile_major),
        "SPLITS_PER_STEP": triton_decode.merge_splits_per_step(MERGE_ROWS.value, problem.head_dim, num_warps),
        "CONSUMERS": 1, "CONSUMER_REGS": 0,
    }  # fmt: skip


def kv_descriptor(
    t: torch.Tensor, problem: Problem, dtype: gl.dtype, config: DecodeConfig | None = None
) -> TensorDescriptor:
    """K's or V's TMA descriptor: over a (B, Hkv, Sk, D) cache, one key block of ``config``'s ring per copy, each
    (batch, KV head) with its own bounds; over a page pool (num_pages, page_size, Hkv, D), the same 4-D box of
    ``kv_chunk_rows`` keys on the pool seen as (num_pages, Hkv, page_size, D) (a strided view, no copy),
    each (page, KV head) with its own bounds."""
    pool_view = t.permute(0, 2, 1, 3) if problem.paged else t
    return descriptor(pool_view, kv_chunk_rows(problem, config), dtype)


def seqlen_k_decisions(
    problem: Problem, device: torch.device, num_splits: int | None = None, consumers: int | None = None
) -> tuple[bool, DecodeConfig | GluonConfig, int]:
    """What a bind of ``problem`` on ``device`` decides from Sk: the balanced split or not, the ring
    (``SHORT_CACHE_TILE``, ``balanced_config``, ``two_consumer_config`` where ``consumers_for`` gives two: its one CTA
    an SM tells it from the one-consumer rings) and the split count (the balanced split's target shares;
    ``num_splits`` forces it). Every other decision of :class:`GluonDecodePlan` follows from these and the rest
    of the problem (:meth:`GluonDecodePlan.grown`). ``consumers``: ``consumers_for``'s answer where the caller
    has it. The packed prefill (``packed_prefill``; not with a forced split count): gluon/hopper's configuration, one
    split (its route reads the padded Sk nowhere, so a longer cache keeps it)."""
    if num_splits is None and packed_prefill(problem, device):
        return False, packed_prefill_config(problem), 1
    consumers = consumers or consumers_for(problem, device)
    if balanced_split(problem, device):
        config = balanced_launch_config(problem, device, consumers)
        return True, config, balanced_target(problem, device, consumers, num_splits)
    config = two_consumer_config(problem) if consumers == 2 else decode_config(problem)
    ctas = grid_m_blocks(problem, consumers)
    return False, config, splits.resolve_num_splits(num_splits, problem, ctas, device, split_policy(problem, config))


class GluonDecodePlan:
    """What a bind of ``problem`` on ``device`` decides before it sees a tensor, worked out once: the split
    count (the balanced split's shares), the grid, the ring's configuration and constexprs, the kernel's
    size arguments and the K/V descriptors' box rows. ``common.attention`` keeps one per plan (the registry's
    ``make_binder``), so a plan hit only allocates, builds the two descriptors and launches.
    ``num_splits`` overrides the rule. ``packed_prefill``: the plan is ``PACKED_PREFILL_MIN_ROWS``' launch on
    gluon/hopper's kernel (``packed_config``, its consumers; :class:`PackedPrefill`), and nothing else of it is set
    but the decisions, the sizes and the one split."""

    def __init__(self, problem: Problem, device: torch.device, num_splits: int | None = None):
        self.problem = problem
        self.items = problem.batch * problem.kv_heads
        self.packed_prefill = num_splits is None and packed_prefill(problem, device)
        if self.packed_prefill:
            self.decisions = seqlen_k_decisions(problem, device)
            self.balanced, self.packed_config, self.num_splits = self.decisions
            self.consumers, self.items_in_flight = self.packed_config.consumers, False
            self.sizes = size_arguments(problem)
            return
        self.consumers = consumers_for(problem, device)
        decisions = seqlen_k_decisions(problem, device, num_splits, self.consumers)
        self.decisions = self.balanced, config, num_splits = decisions
        m_blocks = grid_m_blocks(problem, self.consumers)
        # The split kernel's last arguments: the balanced plan's sizes (``balanced_sizes``), or four Nones.
        if self.balanced:
            slots = (split_policy(problem, config).ctas_per_sm, BALANCED_SHARES_BY_SLOTS)
            self.balanced_args = balanced_sizes(problem, device, num_splits, m_blocks, config.block_n, *slots)
            # The two-consumer ring keeps its depth (two stages lost there: TWO_CONSUMERS' note).
            stages = balanced_stages(problem, device, num_splits, config) if self.consumers == 1 else None
            m_tile_major = splits.balanced_m_tile_major(num_splits + self.items, M_TILE_MAJOR)
            self.split_grid = splits.balanced_grid(num_splits + self.items, m_blocks, m_tile_major)
        else:
            self.balanced_args, m_tile_major, stages = (None,) * 4, False, None
            self.split_grid = (num_splits, m_blocks, self.items)
        self.num_splits = num_splits
        self.box_rows = kv_chunk_rows(problem, config)
        self.sizes = size_arguments(problem)
        split_form = (num_splits > 1 and not self.balanced, self.balanced, m_tile_major, stages)
        self.split_options = {
            **split_constexprs(problem, *split_form, config=config, consumers=self.consumers),
            "num_warps": num_warps_for(problem),
            **({"maxnreg": TWO_CONSUMER_MAXNREG} if self.consumers == 2 else {}),
        }
        self.fused_merge = self.split_options["FUSED_MERGE"] or self.balanced
        # ITEMS_IN_FLIGHT: the one-split launch as ``_items_kernel`` on fewer CTAs, each walking tiles.
        self.items_in_flight = num_splits == 1 and not self.balanced and items_in_flight(problem, device)
        if self.items_in_flight:
            self.items_grid, self.num_tiles = (items_grid(problem, device),), items_tiles(problem)
            self.items_options = {**items_constexprs(problem), "maxnreg": items_maxnreg(problem)}
        counted_m_blocks = m_blocks * self.consumers
        self.work_items = arrival_counter_count(self.items, num_splits + self.items, counted_m_blocks, self.balanced)
        # Only the two-launch path (more than one split, FUSED_MERGE off) launches the merge kernel.
        self.two_launch = num_splits > 1 and not self.fused_merge

    def grown(self, problem: Problem, device: torch.device) -> GluonDecodePlan:
        """The plan of ``problem``, a longer cache of this plan's family: this one with Sk's size argument changed
        where Sk leaves :func:`seqlen_k_decisions` as they were, else a new plan. The module switches stay those read
        when the family was planned (``clear_plan_cache()`` re-reads them)."""
        unchanged = splits.same_padded_split(self.balanced, problem, self.problem)
        if not unchanged and seqlen_k_decisions(problem, device) != self.decisions:
            return GluonDecodePlan(problem, device)
        return resized(self, problem)

    def workspace(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The split partials of one launch: the balanced split's slabs, or the padded-Sk splits'."""
        if self.balanced:
            return balanced_workspace(self.problem, self.num_splits + self.items, device)
        return split_workspace(self.problem, self.num_splits, device)


class GluonDecode:
    """Prepared launch: K's and V's TMA descriptors, O, the LSE and the split workspace built once for
    validated q, k, v; calling it launches the split kernel (which merges its splits itself, or, with
    ``FUSED_MERGE`` off, then triton/decode's merge) and returns O, or (O, lse) when the problem
    returns the LSE.
    ``cache_seqlens`` (and a paged problem's ``block_table``) are read by the kernel at every launch;
    ``num_splits`` overrides the rule; ``plan``: the :class:`GluonDecodePlan` of this problem and device,
    made once for many binds (``num_splits`` is then its own)."""

    def __init__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem,
        cache_seqlens: torch.Tensor | None = None, num_splits: int | None = None,
        block_table: torch.Tensor | None = None, plan: GluonDecodePlan | None = None,
    ):  # fmt: skip
        plan = plan or GluonDecodePlan(problem, q.device, num_splits)
        self.packed = None
        if plan.packed_prefill:
            self.packed = PackedPrefill(q, k, v, plan.problem, plan.packed_config, cache_seqlens)
            self.balanced, self.num_splits = False, 1
            return
        self.balanced, self.split_grid, self.num_splits = plan.balanced, plan.split_grid, plan.num_splits
        self.split_options, self.fused_merge = plan.split_options, plan.fused_merge
        out_partial, lse_partial = plan.workspace(q.device)
        dtype = GLUON_DTYPES[q.dtype]
        self.out = torch.empty_like(q, memory_format=torch.contiguous_format)
        self.lse = allocate_lse(problem, q.device)
        lse_arg, lengths_arg = feature_buffers(self.lse, cache_seqlens, q.device)
        pools = (t.permute(0, 2, 1, 3) for t in (k, v)) if problem.paged else (k, v)
        desc_k, desc_v = (descriptor(t, plan.box_rows, dtype) for t in pools)
        counters = triton_decode.arrival_counters(q.device, plan.work_items) if self.fused_merge else None
        self.split_args = (
            q, desc_k, desc_v, self.out, lse_arg, lengths_arg, out_partial, lse_partial,
            *q.stride()[:3], *self.out.stride()[:3], *plan.sizes, *paging_arguments(block_table),
            counters, *plan.balanced_args,
        )  # fmt: skip
        merge_args = (problem, plan.num_splits, out_partial, lse_partial, self.out, lse_arg)
        self._merge = triton_decode.merge_launch(*merge_args) if plan.two_launch else None
        self.items_args = None
        q_rows = packed_q_rows(q) if plan.items_in_flight else None
        if q_rows is not None:
            self.items_grid, self.items_options = plan.items_grid, plan.items_options
            self.items_args = (
                descriptor(q_rows, BLOCK_M, dtype), desc_k, desc_v, self.out, lse_arg, lengths_arg,
                *self.out.stride()[:3], *plan.sizes, *paging_arguments(block_table),
                triton_decode.arrival_counters(q.device, 1), plan.num_tiles,
            )  # fmt: skip

    def __call__(self) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if self.packed is not None:
            return self.packed()
        if self.items_args is not None:
            _items_kernel[self.items_grid](*self.items_args, **self.items_options)
            return rung_result(self.out, self.lse)
        _split_kernel[self.split_grid](*self.split_args, **self.split_options)
        if self._merge is not None:
            self._merge()
        return rung_result(self.out, self.lse)


class PackedPrefill:
    """The packed prefill's prepared launch (``PACKED_PREFILL_MIN_ROWS``): at every call q (B, H, Sq, D) is copied to
    its packed rows (B, Hkv, group · Sq, D), row (head in group) · Sq + token (so a later write into q is seen), and
    gluon/hopper's kernel runs on them (``GluonAttention`` with ``packed_group``: each row's diagonal its token's). Its
    O and LSE, (B, Hkv, group · Sq, ...) contiguous, are O (B, H, Sq, D) and the LSE (B, H, Sq) as views."""

    def __init__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, config: GluonConfig,
        cache_seqlens: torch.Tensor | None,
    ):  # fmt: skip
        batch, heads, seqlen_q, head_dim = q.shape
        kv_heads, group = problem.kv_heads, problem.kv_group
        self.packed_q = q.new_empty((batch, kv_heads, group * seqlen_q, head_dim))
        self.by_kv_head = q.unflatten(1, (kv_heads, group))  # (B, Hkv, group, Sq, D): a view
        self.attention = gluon_hopper.GluonAttention(
            self.packed_q, k, v, problem, config, cache_seqlens, packed_group=group
        )
        self.out = self.attention.out.view(batch, heads, seqlen_q, head_dim)
        self.lse = self.attention.lse.view(batch, heads, seqlen_q) if problem.return_lse else None

    def pack_q(self) -> None:
        """q's rows into ``packed_q``: (B, Hkv, group, Sq, D) is its (B, Hkv, group · Sq, D), head-major."""
        self.packed_q.view(self.by_kv_head.shape).copy_(self.by_kv_head)

    def __call__(self) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        self.pack_q()
        self.attention()
        return rung_result(self.out, self.lse)


def packed_q_rows(q: torch.Tensor) -> torch.Tensor | None:
    """Q (B, H, Sq, D) as ``_items_kernel``'s TMA reads its packed rows, (B, 1, H · Sq, D): a view where a head's
    tokens follow the previous head's (a contiguous Q), else None (such a launch keeps ``_split_kernel``, which
    loads Q by pointers: a copy made here would not see a later write into q)."""
    batch, heads, seqlen_q, head_dim = q.shape
    try:
        return q.view(batch, 1, heads * seqlen_q, head_dim)
    except RuntimeError:
        return None


def bind(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, *, cache_seqlens: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None, num_splits: int | None = None,
) -> GluonDecode:  # fmt: skip
    """The prepared launch for validated q, k, v (page pools with ``block_table`` when the problem is
    paged; no launch); ``num_splits`` overrides the rule."""
    q, k, v = (kernel_operand(t) for t in (q, k, v))
    return GluonDecode(q, k, v, problem, cache_seqlens, num_splits, block_table)


def make_binder(problem: Problem, device: torch.device, planned: object = None, ready: bool = False) -> GluonBinder:
    """``bind`` in two (the registry's ``make_binder``): the :class:`GluonDecodePlan` once, and a
    :class:`GluonBinder` that builds the launch of each call's tensors on it."""
    return GluonBinder(problem, GluonDecodePlan(problem, device), ready)


class GluonBinder:
    """``binder(q, k, v, cache_seqlens, block_table)``: the launch of those tensors on ``plan``. ``ready``: every
    q, k, v passed is kernel-addressable (the plan key proves it), so no ``kernel_operand``."""

    def __init__(self, problem: Problem, plan: GluonDecodePlan, ready: bool):
        self.problem, self.plan, self.ready = problem, plan, ready

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache_seqlens: torch.Tensor | None,
        block_table: torch.Tensor | None,
    ) -> GluonDecode:  # fmt: skip
        if not self.ready:
            q, k, v = (kernel_operand(t) for t in (q, k, v))
        return GluonDecode(q, k, v, self.problem, cache_seqlens, block_table=block_table, plan=self.plan)

    def grown(self, problem: Problem, device: torch.device) -> GluonBinder:
        """The binder of ``problem``, a longer cache of this binder's family (the registry's growing binder), on
        :meth:`GluonDecodePlan.grown`."""
        return GluonBinder(problem, self.plan.grown(problem, device), self.ready)


def decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, *, cache_seqlens: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None, num_splits: int | None = None,
) -> Runner:  # fmt: skip
    """Validate q (B, H, Sq, D), k and v (B, Hkv, Sk, D) or page pools (num_pages, page_size, Hkv, D)
    with their ``block_table``, bind them and compile by one warm-up launch. ``num_splits`` overrides
    the split rule (not part of the public API)."""
    checked = validate_for_problem(
        q, k, v, problem, cache_seqlens=cache_seqlens, block_table=block_table, dtypes=DTYPES, head_dims=HEAD_DIMS
    )
    ok, reason = supports(checked, q.device)
    if not ok:
        raise ValueError(reason)
    run = bind(q, k, v, checked, cache_seqlens=cache_seqlens, block_table=block_table, num_splits=num_splits)
    return warmed_up(run, q.device)


# ----------------------------------------------------------------------------------------------
# Capability check and sm_90a compile path
# ----------------------------------------------------------------------------------------------
def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    if problem.dtype not in DTYPES:
        return False, f"{RUNG} runs fp16 and bf16, got {problem.dtype_name}"
    if problem.head_dim not in HEAD_DIMS:
        return False, f"{RUNG} supports head_dim in {list(HEAD_DIMS)}, got {problem.head_dim}"
    if problem.seqlen_q > triton_decode.MAX_SEQLEN_Q:
        return (
            False,
            f"{RUNG} takes 1 to {triton_decode.MAX_SEQLEN_Q} query tokens, got Sq={problem.seqlen_q}: "
            "use a prefill rung",
        )
    if problem.scale < 0:
        return False, f"{RUNG} needs softmax_scale >= 0 (it is applied after the row maximum), got {problem.scale}"
    ok, reason = capability.check_features(RUNG, problem, IMPLEMENTED_FEATURES)
    if not ok:
        return ok, reason
    if problem.paged and kv_chunk_rows(problem) is None:
        return (
            False,
            f"{RUNG} copies a paged cache in chunks of {MIN_PAGE_CHUNK} or more keys (a power of two) that "
            f"lie in one page, so page_size must be a multiple of {MIN_PAGE_CHUNK}: got page_size={problem.page_size}",
        )
    return gluon_device_supported(RUNG, device, "TMA and warpgroup_mma are Hopper's")


# Pointer and stride arguments a real launch passes 16-divisible, so the static compile assumes it too.
SPLIT_ALIGNED = (
    "Q", "Out", "Lse", "OutPartial", "LsePartial",
    "stride_qb", "stride_qh", "stride_qm", "stride_ob", "stride_oh", "stride_om",
)  # fmt: skip


def compile_sm90(problem: Problem) -> list[KernelBinary]:
    """The split kernel, in its split-writing form (with the fused merge when triton/decode's
    ``FUSED_MERGE``), for sm_90a at ``problem``'s head dim, dtype and features (one query token when
    ``problem`` is prefill-sized; no GPU needed). The two-launch path's merge is triton/decode's kernel
    and is compiled, and its resources listed, under that rung."""
    problem = triton_decode.decode_shape(problem)
    if packed_prefill(problem):  # PACKED_PREFILL_MIN_ROWS: gluon/hopper's kernel on the packed rows
        return gluon_hopper.compile_sm90(problem, packed_prefill_config(problem), problem.kv_group)
    element = "*fp16" if problem.dtype == torch.float16 else "*bf16"
    if items_in_flight(problem):
        return [compile_items_sm90(problem, element)]
    balanced, stages, consumers = balanced_split(problem), None, consumers_for(problem)
    config = balanced_config(problem) if balanced else decode_config(problem)
    config = two_consumer_config(problem) if consumers == 2 else config
    kv_type = descriptor_type(problem.dtype, kv_chunk_rows(problem, config), problem.head_dim)
    signature = {
        "Q": element, "desc_k": kv_type, "desc_v": kv_type, "Out": element, "Lse": "*fp32", "CacheSeqlens": "*i32",
        "OutPartial": "*fp32", "LsePartial": "*fp32", **dict.fromkeys(SPLIT_ALIGNED[5:], "i32"),
        "heads": "i32", "kv_heads": "i32", "seqlen_q": "i32", "seqlen_k": "i32", "softmax_scale_log2": "fp32",
    }  # fmt: skip
    num_warps = num_warps_for(problem)
    if balanced:  # the plan's target on the rule's default SM count, as balanced_split's
        slots = (split_policy(problem, config).ctas_per_sm, BALANCED_SHARES_BY_SLOTS)
        cpu = torch.device("cpu")
        target = balanced_sizes(problem, cpu, None, grid_m_blocks(problem, consumers), config.block_n, *slots)[1]
        stages = balanced_stages(problem, cpu, target, config) if consumers == 1 else None
    constexprs = split_constexprs(problem, not balanced, balanced, M_TILE_MAJOR, stages, config, consumers)
    constexprs["num_warps"] = num_warps
    options = {"num_warps": num_warps, **({"maxnreg": TWO_CONSUMER_MAXNREG} if consumers == 2 else {})}
    plan = ("batch_size", "target_shares", "min_share_blocks", "max_item_shares")
    if balanced:
        signature.update(dict.fromkeys(plan, "i32"))
    else:
        constexprs.update(dict.fromkeys(plan))
    if problem.paged:
        signature.update({"BlockTable": "*i32", "stride_btb": "i32"})
    else:
        constexprs.update({"BlockTable": None, "stride_btb": None})
    if constexprs["FUSED_MERGE"] or balanced:
        signature["Counters"] = "*i32"
    else:
        constexprs["Counters"] = None
    return [compile_gluon_sm90(_split_kernel, signature, constexprs, options, SPLIT_ALIGNED)]


ITEMS_ALIGNED = ("Out", "Lse", "stride_ob", "stride_oh", "stride_om")


def compile_items_sm90(problem: Problem, element: str) -> KernelBinary:
    """``_items_kernel`` for sm_90a at ``problem``'s head dim, dtype and features (``ITEMS_IN_FLIGHT``)."""
    kv_type = descriptor_type(problem.dtype, kv_chunk_rows(problem, items_config(problem)), problem.head_dim)
    signature = {
        "desc_q": descriptor_type(problem.dtype, BLOCK_M, problem.head_dim), "desc_k": kv_type, "desc_v": kv_type,
        "Out": element, "Lse": "*fp32", "CacheSeqlens": "*i32", **dict.fromkeys(ITEMS_ALIGNED[2:], "i32"),
        "heads": "i32", "kv_heads": "i32", "seqlen_q": "i32", "seqlen_k": "i32", "softmax_scale_log2": "fp32",
        "Counter": "*i32", "num_tiles": "i32",
    }  # fmt: skip
    constexprs = items_constexprs(problem)
    if problem.paged:
        signature.update({"BlockTable": "*i32", "stride_btb": "i32"})
    else:
        constexprs.update({"BlockTable": None, "stride_btb": None})
    options = {"num_warps": NUM_WARPS, "maxnreg": items_maxnreg(problem)}
    return compile_gluon_sm90(_items_kernel, signature, constexprs, options, ITEMS_ALIGNED)


IMPLEMENTATION = gluon_implementation(
    "decode", supports, compile_sm90, prepare=decode_attention, bind=bind, source_file=__file__,
    default_configs=DEFAULT_CONFIGS, check_reads_seqlen_k=False, make_binder=make_binder,
)  # fmt: skip
