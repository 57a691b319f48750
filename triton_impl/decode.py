"""Flash decoding in Triton: a few new query tokens against a long KV cache (counterpart: ``cute_impl/decode.py``).

What it adds over ``pipelined``, which gives each CTA BLOCK_M query rows of one (batch, head) and
walks every key: at decode time Sq is 1 to 16, so that grid has B·H CTAs, each streaming the whole
cache alone. One long sequence then runs on a handful of SMs while the rest of the GPU idles, and
every query head of a GQA group reads the same K/V bytes again. This rung removes both:
  * Split-KV: the keys of each sequence are cut into ``num_splits`` ranges of whole key blocks, one
    CTA each (``split_key_range`` of ``_device.py``), so B·Hkv·num_splits CTAs fill the GPU however
    small B is. Each split writes its normalised partial O (fp32) and its LSE, and the last split of a
    tile to finish merges them all: lse = log Σₛ exp(lseₛ), O = Σₛ exp(lseₛ - lse) · Oₛ.
  * GQA packing: the ``group = H / Hkv`` query heads of one KV head share a CTA. Their rows are
    stacked into one M tile, row r = (head in group) · Sq + query token, padded to at least 16 rows
    for ``tl.dot`` (and cut into several tiles past ``MAX_BLOCK_M``; ``WIDE_M_TILE``: one 128-row tile on 8
    warps at D=128 (``WIDE_M_TILE_HEAD_DIMS``), two an SM under ``PACKED_OCCUPANCY``; ``WIDE_D256``: 128-row
    tiles on 8 warps past 64 rows of a paged cache at D=256; ``WGMMA_D256``, on: from 17 rows at D=256 (past 64
    on a contiguous cache only) 64-row wgmma tiles of one warpgroup, not 32-row mma.sync tiles), so
    each K/V byte is read from HBM once per KV head, not once per query head.
    Many packed rows make a step compute-heavy: a key's 4 · D bytes feed 4 · D · rows FLOPs, rows FLOPs a
    byte, so 128 rows at 4.4 TB/s ask 564 TFLOP/s of the tensor cores (``decode_sweep.roofline_us``).
  * Paged KV cache (``block_table``, vLLM's and FlashInfer's layout): K and V live in pools of pages
    (num_pages, page_size, Hkv, D) shared by every sequence, and sequence b's key j is in page
    ``block_table[b, j // page_size]``, slot ``j % page_size``, so a serving engine grows a sequence
    a page at a time without moving its cache. The key loop only computes each key row's address
    differently (``PAGE_SIZE`` constexpr; 0 builds the contiguous kernel with the same PTX
    instructions as before paging).

Paging, one table entry per page a key block spans (``PAGED_SPAN_LOOKUP``, on, but not under Triton 3.7, whose span
builds spill: ``PAGED_SPAN_SPILLS``; ``_device.kv_block_rows``): where BLOCK_N and the page size divide one another
(every power-of-two page from 16 to 256), a block inside one page is
addressed as a contiguous block from one scalar load of its page, and a block over several pages (pages of 16 or
32) loads each of its 2-4 pages once and picks a key's page from them. Requiring BLOCK_N to divide page_size instead
would force 16-key blocks on vLLM's default page of 16: four times the loop trips, each with a quarter-size MMA. Any
other page size (48, say) takes the lookup per key: ``kv_page_slots`` reads the table entry of every key of a block
(one BLOCK_N-entry load, which Triton's pipeliner issues by ``cp.async`` ahead of the K/V loads that need it, and
each key's page read back from shared memory), the only path before the switch; per key, the paged loop ran about
1.7-2.2x the contiguous one's instructions, per span 1.1-1.25x. A K or V row is D contiguous elements (256 bytes at
D=128 in bf16) wherever its page lies, so the loads stay coalesced. The table's load takes pipeline stages of its
own, so a paged build asks for ``PAGED_EXTRA_STAGES`` more to keep as many K/V blocks in flight as the contiguous
one. Page indices are not checked (a device synchronisation per call): each must name a page of the pools, the
caller's contract as in FlashAttention; the entries of pages past a sequence's length are never read.

The merge, in the split kernel (issue #38): a separate merge kernel costs a launch, and the tail of
the split kernel and the ramp of the merge's CTAs, about 10-15 µs of a 36 µs step at a 160 MB cache;
eager, a second launch is also host time. So each split CTA, once its partials are stored, counts
itself in on its tile's arrival counter (one int32 per (batch, KV head, M tile), ``last_to_arrive``),
and the CTA that arrives last reads every split's partials in split order (``merge_splits``) and writes
O and the LSE. Reading in split order, element by element, makes the result independent of which CTA
came last: deterministic, and bit for bit the two-launch path's (``FUSED_MERGE = False``: the same
``merge_splits`` as a second kernel, ``_merge_kernel``, kept for the A/B, gluon/decode's too).
The ordering argument (stores, bar.sync, one acq_rel atomic at gpu scope) is in ``last_to_arrive``.
The last CTA also puts the counter back to 0, so a launch or a CUDA-graph replay needs no memset;
the counters live for the process, per device (``arrival_counters``), grown (outside a capture) for
a larger grid. Atomics on O instead would change the order of fp32 adds from run to run. The merge
reads the fp32 partials, num_splits · rows · (D + 1) · 4 bytes, small beside the cache, but one split
after the other each is an L2 round trip (about 0.5 µs), 10-20 µs at 20-30 splits; so it unrolls
``merge_splits_per_step`` splits a step, their loads in flight together (``bench/decode_model.py``); a
D=256 tile of more than ``MERGE_CHUNK_ROWS`` rows (``WIDE_D256``'s) merges 32 rows at a time
(``merge_in_chunks``). The merge and the stores live in ``_decode_merge.py``.
With one split the split kernel writes O and the LSE itself: no counter, no merge.

The split count: the shared rule of ``common/contract/splits.py`` (examples and reasons there) on this
rung's CTAs per split, ``B · Hkv · m_blocks``, and the padded Sk, never ``cache_seqlens`` (inside the kernel
each sequence's splits follow its own length: a short one gets short or empty splits). The grid's items run in z
order, so in a ragged batch a long sequence late in the batch would run alone at the end; ``LONGEST_FIRST`` (on at D=64,
with ``cache_seqlens`` and at most ``LONGEST_FIRST_MAX_BATCH`` sequences) has each CTA rank the batch by length
(``longest_first_item``) so that grid item z takes the (z // Hkv)-th longest sequence. Fifth-stop switches
(issue #38, timed by ``bench/decode_floor5.sh``): ``SPLIT_CTAS_PER_SM`` (two), ``SHORT_CACHE_ONE_SPLIT``, ``DEEP_RING``
(cute's ring depth), ``SHORT_CACHE_TILE`` (32-key blocks). ``bind(..., num_splits=n)`` forces a count.

The balanced split (``BALANCED_SPLIT = "ragged-split-long"``: a call with ``cache_seqlens`` over several sequences
whose split rule splits them, as in cute/decode, and, as in gluon/decode, any call the rule splits into a long merge
chain; H200 A/Bs in ``results/h200/decode-balanced/``, ``results/h200/decode-balanced-triton/`` and
``results/h200/decode-long-few-heads/``): in a ragged batch the rule's splits of a short sequence end at once while the
long one's few carry its keys. ``_balanced_split_kernel`` gives every CTA an equal share of the valid keys, FlashInfer's
plan done on the device (``balanced_share``): each CTA reads the B lengths, sizes a share as total key blocks /
``target_shares`` (at least ``BALANCED_MIN_KEYS``), gives each (batch, KV head) cdiv(its blocks, share) splits (one for
an empty sequence; at most ``BALANCED_MAX_ITEM_SHARES`` unless 0) and finds its own in their prefix sum. The grid,
target_shares (``BALANCED_SHARES_PER_SM`` per SM over the M tiles; ``BALANCED_TARGET``: "per-slot-many" here,
splits.py's "The target rule"; ``BALANCED_BUILD_FIT``: at most one wave of the CTAs the build holds) + B · Hkv
CTAs per M tile, holds every share whatever the lengths: the shape fixes it, and a CUDA graph replays it with new
lengths (CTAs past the last share store nothing). An item's shares fill consecutive slabs of the partials; its last to
arrive merges them (``merge_splits``; an item of one share writes O itself), in two levels past ``BALANCED_MERGE_GROUP``
shares (gluon/decode's): each run of that many shares has its own arrival counter, its last share merges the run into
the run's first slab, and the item's last run merges the runs (``_decode_merge.store_balanced_partials``), so the item's
merge is two short chains, not one of all its shares (seed 73's 164677-key sequence: 81). ``num_splits=`` forces
target_shares; the merge is always fused. The grid is (M tiles, shares), the M tile on x (``M_TILE_MAJOR``): the M tiles
of a share run together and read its keys once from DRAM, not once per M tile's pass (``splits.balanced_grid``).

Algorithm (grid = (num_splits, m_blocks, B · Hkv); one program per split of one M tile; one launch):
  1. ``seqlen_info``: the sequence's own length and causal offset; the keys any row sees end at
     ``key_end`` (the length; causal: at most Sq + causal_offset); ``split_key_range`` cuts this
     split's [key_begin, key_end) out of them.
  2. Load the packed Q tile: row r reads query head kv_head · group + r // Sq, token r % Sq.
  3. ``attend_key_range``: the split's blocks in one pipelined loop (``ONE_KEY_LOOP``), its loads masked at the
     sequence's end and S masked with each row's own token index in the blocks some row may not see (the sequence
     tail and the causal diagonal); with the switch off, the blocks seen by every row in an unmasked loop, then
     the rest in a masked one. Paged: the
     block's rows are found through this sequence's row of the block table, one entry per page the block
     spans (``kv_block_rows``; per key, ``kv_page_slots``, where block and page do not divide).
  4. ``online_softmax_finalize``: O and the natural-log LSE of the split; a split with no key writes
     O = 0 and LSE = -inf, which the merge weighs by exp(-inf) = 0.
  5. Merge (``last_to_arrive``, then ``merge_splits`` in the tile's last CTA): the maximum LSE, then,
     split after split, the sum of exp(lseₛ - max) and of exp(lseₛ - max) · Oₛ; O and lse stored in
     the output dtype and fp32.

Data movement: Q is read once per CTA (rows = group · Sq); K (as Kᵀ) and V stream HBM → shared memory
through ``cp.async`` in ``num_stages`` buffers (Triton's pipeliner; paged, a block's 1-4 page entries by
scalar loads, or, per key, its BLOCK_N entries by ``cp.async`` a stage ahead of the K/V rows), S, P and O stay
in registers;
the partials go to an fp32 workspace in HBM ((num_splits, B, H, Sq, D) and (num_splits, B, H, Sq)),
read back once by the tile's last CTA (mostly from L2, where they were just written).

Constraints: fp16 and bf16 on a CUDA GPU (fp32 under the Triton interpreter only); D ∈ {64, 128,
256}; 1 <= Sq <= ``MAX_SEQLEN_Q`` (a prefill-sized Sq is refused: use a prefill rung); GQA and MQA;
causal top-left or bottom-right (the KV-cache convention); ``cache_seqlens``; the LSE; a paged KV
cache with pages of 16 to 256 keys (with ``cache_seqlens``). The fused merge's arrival counters are one
buffer a device, shared with gluon/decode: a bind on another stream than the last waits for it
(``order_counter_users``), so decode launches from several streams run one after another, and a CUDA graph
replayed beside eager decode launches must be ordered by its caller. Not yet: a persistent scheduler, FP8
caches. Measured figures go to ``docs/perf-log.md`` and ``compare.py --decode``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from common.contract import splits
from common.contract.capability import FEATURES, PAGED_KV, check_features
from common.contract.devices import lasting, triton_device_supported, triton_dtype_supported
from common.contract.problem import Problem
from common.contract.registry import Runner
from common.contract.validation import kernel_operand
from common.toolchain.compile import KernelBinary, compile_triton_sm90
from common.toolchain.releases import triton_release
from triton_impl._decode_merge import (
    MERGE_CHUNK_HEAD_DIM,
    MERGE_CHUNK_ROWS,
    last_to_arrive,
    merge_in_chunks,
    merge_splits,
    packed_rows,
    store_balanced_partials,
    store_output,
    store_partials,
)
from triton_impl._device import (
    attend_key_range,
    attended_keys,
    balanced_share,
    batch_and_head,
    item_offset,
    longest_first_item,
    online_softmax_finalize,
    seqlen_info,
    split_key_range,
)
from triton_impl._host import (
    POINTER_ALIGNED,
    TritonEntry,
    TritonInputs,
    allocate_lse,
    balanced_workspace,
    feature_buffers,
    feature_constexprs,
    kv_row_strides,
    paging_arguments,
    pointer_signature,
    resized,
    rung_result,
    size_arguments,
    split_workspace,
)

# Query tokens per step this rung takes; more is prefill.
MAX_SEQLEN_Q = 16
# Packed rows per M tile: tl.dot needs 16, and past 64 rows (32 at D=256) a group is cut into tiles.
MIN_BLOCK_M, MAX_BLOCK_M = 16, 64
# The most splits the merge reads a step (independent loads in flight together). 1 reads them one
# after the other, a chain of num_splits round trips to L2 (the merge before issue #38's decode
# floor), which bench/decode_floor.py sets to time both in one process.
MERGE_SPLITS_PER_STEP = 8
# Registers per thread a merge step's O tiles may take (``merge_splits_per_step``): 4 splits of a
# 16 × 128 tile on 4 warps. The fused split kernel at D=128 then takes 148 registers (96 without the
# merge; sm_90a): 3 CTAs an SM either way, as its 70 KB of shared memory already allows no more.
MERGE_STEP_REGISTERS = 64
# The splits of a tile merged by the last of them to finish, in the split kernel (one launch a step);
# False: by a second kernel (bench/decode_floor.py sets it to time both in one process).
FUSED_MERGE = True
# The balanced split (module docstring; switch values: splits.BALANCED_SWITCHES): on an H200 +2 to +19 points
# on ragged caches, up to -8 on full ones (results/h200/decode-balanced/); "ragged-split" rather than "ragged"
# (every call with cache_seqlens): level on every ragged row, B=1 128k 146.7 -> 145.2 us (decode-balanced-triton);
# "ragged-split-long" (also any call the rule splits past splits.LONG_CHAIN_SPLITS: the padded split's merge chain):
# one sequence over two KV heads 65.9 -> 45.8 us, 100.0 -> 61.7 paged (results/h200/decode-long-few-heads/).
# Shares >= BALANCED_MIN_KEYS keys, BALANCED_SHARES_PER_SM per SM, <= BALANCED_MAX_ITEM_SHARES an item (0: no cap,
# off until bench/decode_ragged_ab.sh: splits.py's "item-share cap"); the lengths' vector >= MIN_BLOCK_B.
BALANCED_SPLIT = "ragged-split-long"
BALANCED_SHARES_PER_SM, BALANCED_MAX_ITEM_SHARES = 2, 0
# Shares a run of the balanced split's two-level merge takes (``_decode_merge.store_balanced_partials``; 0: one level,
# the item's last share merges all its shares), gluon/decode's BALANCED_MERGE_GROUP. 8 against 0 (H200,
# results/h200/decode-merge-group-triton/half-step/): seed 73's paged row (one item of 81 shares) 61.6 -> 49.4 us, seed
# 43's MQA D=256 paged row (155) 112.2 -> 68.6, controls 1.00-1.01x.
BALANCED_MERGE_GROUP = 8
# The grid's target rule (splits.BALANCED_TARGETS; splits.py's "The target rule"): "per-slot-many", two shares a
# CTAS_PER_SM_FIT slot where the items fill a wave, else BALANCED_SHARES_PER_SM an SM. "per-slot" (H200,
# results/h200/decode-target/): its two-shares rows won (seed 43's B=64 Hkv=16 row 218.3 -> 166.9 us), its one-wave
# rows lost (the B=2 row 90.5 -> 99.3, a full D=64 cache 150.5 -> 162.3).
BALANCED_TARGET = "per-slot-many"
BALANCED_MIN_KEYS, MIN_BLOCK_B = splits.MIN_KEYS_PER_SPLIT, 16
# The balanced grid's M tile on x, fastest, the share on y (``splits.balanced_m_tile_major``): with 2+ M tiles each
# tile's pass read the cache again. H200 (results/h200/decode-mtile-major/): B=16 Hkv=2 Sq=4 D=256 paged(64) ragged
# (2 M tiles) 285.2 -> 262.5 us; rows of one M tile level.
M_TILE_MAJOR = True
# Fifth stop's switches (results/h200/decode-floor5/): two CTA slots an SM on full caches (276k D=64 63 -> 85 %).
SPLIT_CTAS_PER_SM, SHORT_CACHE_ONE_SPLIT, DEEP_RING, SHORT_CACHE_TILE = 2, False, False, False
# Seventh stop's switch, off until bench/decode_fewpairs_ab.sh (``splits.SplitPolicy.fewer_waves``).
FEWER_WAVES = False
# ``splits.SplitPolicy.past_wave_ctas_per_sm`` at the tile's full fit: where the items alone pass a wave of
# SPLIT_CTAS_PER_SM an SM, the rule counts the CTAs that really share an SM, for tiles whose fit is known (a config's
# own ctas_per_sm, or CTAS_PER_SM_FIT's FIT_BLOCK_M rows). H200 (results/h200/decode-full-fit/): B=64 Hkv=8 D=128 1 -> 3
# splits, 4k 272.7 -> 255.3 us, 32k 2127.0 -> 1923.9, seed 31's row 1 661.8 -> 606.8; seed 59's row 0, a 32-row tile
# that fits two, 194.4 -> 222.7 when counted at three (so not counted: its plan stays).
MANY_ITEMS_FULL_FIT = True
# Issue #38's seed 127 row 5 (H200: triton 76.4 us, gluon 70.4; taken 2026-12-02, results/h200/triton-decode-build-fit/:
# 127/5 76.1 -> 66.1 us, the long rows 68/2, 48/3 and 84/7 0.74-0.80x, the controls 1.00x): at
# D=128 the default tile's builds of 17-64 packed rows hold two CTAs an SM, not CTAS_PER_SM_FIT's three (sm_90a, the
# balanced kernel, Triton 3.6 and 3.8: 168-255 registers, 77-116 KB of shared memory, contiguous and paged).
# "per-slot-many" keeps the per-SM target where the items are few, so 127/5's 264 shares and 64 items put 296 working
# CTAs on the build's 264 slots: a second wave, started as the first ends (gluon/decode: 200 + 64, one wave). On:
# where the launched tile's build holds fewer CTAs an SM than the plan counts (BALANCED_BUILD_CTAS_PER_SM, by (head
# dim, packed rows a tile); a static test compiles each), the target is at most the build's slots less the items
# ("per-slot"'s one-wave branch at the slots the kernel has), where the items are at most a third of those slots.
# Only the target, a kernel argument, changes: no build does. Its many-items branch (2 x 396 shares) stays: the fluid
# model has it within 3 % at 2 x 264 (docs/perf-log.md, "Helper `tfit`").
BALANCED_BUILD_FIT = True
BALANCED_BUILD_CTAS_PER_SM = {(128, 32): 2, (128, 64): 2}
# Issue #38's seed 137 row 5 (B=32 H=5 Hkv=1 Sq=4 D=256 ragged; H200: triton 48 % of the read bandwidth, gluon 61 %,
# cute 63 %): a tile whose config holds one CTA an SM (``ctas_per_sm=1``: the D=256 wgmma tile, the wide tiles) counts
# one slot an SM in "per-slot-many", whose per-SM target where the items are few is then two shares a slot: 264 shares
# and 32 items are 296 CTAs on 132 slots, 2.2 waves (gluon and cute plan 100 shares, one wave). On: BALANCED_BUILD_FIT's
# one-wave cap at the one slot such a config declares. Taken 2026-12-02 (H200, Triton 3.6,
# bench/triton_decode_mqa256_ab.sh, results/h200/triton-decode-one-wave/): 137/5 87.1 -> 71.6 us (48 -> 59 %), 43/4
# 109.2 -> 85.4, 83/5 178.2 -> 132.5, controls 1.00x.
ONE_SLOT_ONE_WAVE = True
# The fewest arrival counters allocated on a device (a small grid's buffer then serves larger ones).
MIN_ARRIVAL_COUNTERS = 1024
# Issue #38's short items: a split's keys in one pipelined loop whose loads are masked and whose S is masked from the
# first block a row may not see, not an unmasked loop and a masked one, each a pipeline to fill and drain (seed 151
# row 1's ~10-block items paid two ramps an item). sm_90a, Triton 3.6: one loop of 459-501 static instructions against
# 314-353 + 458-498, no spill. On since its H200 A/B (bench/triton_decode_one_loop_ab.sh, 24 sweep rows, each value
# checked against fp64 first; results/h200/triton-decode-one-loop/): 151/1 196.1 -> 180.9 us (39 -> 42 %), the short
# and ragged rows 0.92-0.97x, 22 others 0.98-1.00x, one 1.02x (117/3, D=128 paged(32) with long items).
# D=256 gains nothing (163/7 0.99x, 181/0 1.00x) and its one-loop builds spill past the two loops' under Triton 3.6
# (the 64-row wgmma tile's split kernel 264 bytes outside its loop against 192; seed 43 row 1's balanced kernel with
# runs 184 registers against 159, two CTAs an SM not three): ONE_KEY_LOOP_HEAD_DIMS leaves it out.
ONE_KEY_LOOP = True
ONE_KEY_LOOP_HEAD_DIMS = (64, 128)
# Triton releases whose one-loop builds spill (sm_90a; 3.8: the 16-row D=128 split kernel in pages of 256, 8 bytes at
# 128 registers, and seed 73 row 0's balanced kernel with runs one CTA an SM short of one level's; 3.7.1: the balanced
# D=64 Sq=2 kernel in pages of 64, 8 bytes outside its loop): two loops there.
ONE_KEY_LOOP_SPILLS = ("3.7", "3.8")
# Issue #38's ragged rows on the padded split (seed 6007 row 4, B=32 Hkv=32 Sq=8 D=64, ragged 16..4292: 54 % of the
# read bandwidth; under Nsight Compute, H100, 2026-12-07, results/h100/gluon-decode-items-2026-12-07/, the SMs busy
# 140k of 177k cycles on average, min 106k, max 170k): the grid's items are dispatched in z order, so a long sequence
# late in the batch runs alone at the end. LONGEST_FIRST: with ``cache_seqlens`` and at most LONGEST_FIRST_MAX_BATCH
# sequences, each CTA ranks the batch by length (``longest_first_item``) and grid item z takes the (z // Hkv)-th
# longest sequence, gluon/decode's ITEMS_LONGEST_FIRST order; 6007/4's build (sm_90a) keeps its registers under
# Triton 3.8 (156) and takes 189 for 180 under 3.9, no spill. H100, 2026-12-07 (results/h100/longest-first-2026-12-07/,
# against z order, two rounds): 6007/4 101.5 -> 81.9 us (53 -> 66 % of the read bandwidth), 221/7 189.4 -> 146.8 (62 ->
# 80 %), 23/2 0.95x, 31/6 0.90x, 151/1 0.92x, 196/0 1.00x. Those rows are all D=64, and the rank's [B, B] comparison
# costs registers the wide builds lack (Triton 3.8, sm_90a: WIDE_D256's 128-row split kernel 64 bytes of spill at 255
# registers, WIDE_CONTIGUOUS_RINGS' D=128 split 72 bytes), so the switch takes the head dims it was timed on.
LONGEST_FIRST, LONGEST_FIRST_MAX_BATCH, LONGEST_FIRST_HEAD_DIMS = True, 64, (64,)


@dataclass(frozen=True)
class TileConfig:
    """Key tile, warps, depth, the largest packed M tile (BLOCK_M: group · Sq up to it), the CTAs an SM holds
    (0: ``CTAS_PER_SM_FIT``'s), the register cap per thread (Triton's ``maxnreg``) that lets it hold them, and the
    smallest M tile (fewer rows are padded to it: 64 for wgmma's m64)."""

    block_n: int
    num_warps: int
    num_stages: int
    max_block_m: int = MAX_BLOCK_M
    ctas_per_sm: int = 0
    max_registers: int | None = None
    min_block_m: int = MIN_BLOCK_M


# K and V stages of BLOCK_N × D: 3 stages of 64 × 128 bf16 take 96 KiB of shared memory. At D=256
# a 64-row M tile spills (40 bytes, sm_90a), so that head dim packs at most 32 rows per tile.
DEFAULT_CONFIGS = {64: TileConfig(64, 4, 3), 128: TileConfig(64, 4, 3), 256: TileConfig(32, 4, 3, max_block_m=32)}
HEAD_DIMS = tuple(sorted(DEFAULT_CONFIGS))
# Triton's pipeliner gives the block-table load of a paged cache stages of its own: a paged build of
# n stages keeps (n - 1) // 2 K/V blocks in flight where the contiguous one keeps n - 1. Two more
# stages keep both at the same depth (sm_90a, D=128: 71680 bytes of shared memory contiguous at 3
# stages, 72704 paged at 5, 39424 paged at 3 or 4).
PAGED_EXTRA_STAGES = 2
# Issue #38's paged rows: one block-table entry per page a key block spans (``_device.kv_block_rows``: scalar loads; a
# block inside one page is addressed as a contiguous one from the page's slot), not one per key (``kv_page_slots``: a
# BLOCK_N-entry cp.async, each key's page read back from shared memory). Only where BLOCK_N and the page size divide
# one another (``paged_spans``); other sizes keep the per-key lookup. sm_90a, the balanced kernel's unmasked key loop,
# instructions a block (contiguous beside), Triton 3.6 / 3.8: D=64 paged(32) 380 -> 243 (213) / 311 -> 228 (202); D=256
# paged(64) 638 -> 360 (289) / 497 -> 349 (282), and under 3.6 204 -> 156 registers (contiguous 168); the D=256 wgmma
# tile paged(32) 772 -> 478 (402) / 653 -> 493 (406). No spill either way (tests/test_decode_paged_pages.py). On since
# its H200 A/B (bench/decode_knob_ab.py, results/h200/decode-paged-spans/), each value checked against fp64 first:
# 0.67-0.86x the time on five paged rows of seeds 71 and 73 (seed 71's 2.2 GB D=64 paged(32) row 819.0 -> 601.3 us, 62
# -> 84 % of the read bandwidth; seed 73's D=256 paged(32) row 219.3 -> 147.2, 40 -> 60 %), 0.97x on seed 47's
# 16-key WIDE_D256 row.
PAGED_SPAN_LOOKUP = True
# Triton releases whose span builds spill (3.7.1, sm_90a: the D=64 split kernel in pages of 256 8 bytes, the D=256
# wgmma tile's split kernel in pages of 64 304 against 192 per key; none under 3.6, 3.8, 3.9): the lookup per key there.
PAGED_SPAN_SPILLS = ("3.7",)
# Split-kernel CTAs an SM holds at its 16-row tile (FIT_BLOCK_M; a 32-row tile at D=128 takes 184 registers, sm_90a,
# Triton 3.6: two an SM); DEEP_RING's depths; SHORT_CACHE_TILE's (D=128: 37 KB, 96 registers: 5 an SM).
CTAS_PER_SM_FIT, FIT_BLOCK_M, DEEP_RING_STAGES = {64: 4, 128: 3, 256: 2}, 16, {64: 6, 128: 5, 256: 5}
SHORT_CACHE_CONFIGS = {128: TileConfig(32, 4, 3)}
# Issue #38's packed rows: more than MAX_BLOCK_M packed rows at D <= 128 take one 128-row tile on 8 warps, so the
# group's keys are loaded once a CTA, not once per 64 rows. Its 8 warps take 170-255 registers a thread (sm_90a):
# one CTA an SM, so D=64 keeps 4 blocks in flight, not 2. On: 0.80-0.92x the 64-row tiles' time on three of four
# such shapes, 1.00x on the fourth (H200, results/h200/decode-packed-ab/); gluon/decode's lost there (off).
# WIDE_M_TILE_HEAD_DIMS: where it applies. On the tree of 2026-12-06 (H100,
# results/h100/triton-decode-wide-d64-2026-12-06/) the 64-row tiles took 0.71-1.00x its time on the seven D=64 rows
# timed, never more (seed 2026 row 4's 128 rows on the balanced split 374.6 -> 267.1 us, 57 -> 80 % of the read
# bandwidth; seed 31 row 6 paged 0.84x; seed 41 row 1 0.85x), the D=128 rows 0.91-1.03x: D=128 keeps it.
WIDE_M_TILE = True
WIDE_M_TILE_HEAD_DIMS = (128,)
WIDE_CONFIGS = {64: TileConfig(64, 8, 5, 128, ctas_per_sm=1), 128: TileConfig(64, 8, 3, 128, ctas_per_sm=1)}
# Issue #38's compute-bound rows (128-256 packed rows a KV head: seed 233's row 5 at 62 % of the roofline): the wide
# tile's (key block, stages) on a contiguous cache, by head dim ({}: WIDE_CONFIGS' everywhere; off, untimed). A
# 128-key block halves the per-block work (the row max and sum's shuffles, O's rescale, the ring's waits) per key:
# sm_90a, the unmasked key loop's instructions a warp against its tensor cycles, 64 keys twice -> 128 keys once,
# Triton 3.6: D=128 1064 -> 934 (1024 tensor cycles: issue-bound -> tensor-bound), D=64 918 -> 812 (512); 3.8: 760 ->
# 605 and 638 -> 530; 255 registers at D=128 and 207-237 at D=64, one CTA an SM (D=128 two stages 160 KB, three 224
# KB). No spill at D=64; at D=128 none in the padded split kernel under 3.6-3.8, 48 bytes under 3.9, 8-32 bytes in the
# balanced kernel. Paged caches keep 64-key blocks: a 128-key block spills there (8 bytes under 3.8, 104-120 under 3.6).
WIDE_CONTIGUOUS_RINGS: dict[int, tuple[int, int]] = {}
# Issue #38's short prefill (off until bench/decode_packed_ab.sh): at D=64 the wide tile takes 209 registers (sm_90a),
# one CTA an SM whose warpgroups meet at a barrier every block (seed 41's group 8 Sq=16 1k row: 41 % of the read
# bandwidth); 32-key blocks take 128: two CTAs an SM, one's softmax under the other's wgmmas (D=128: 238 registers).
PACKED_OCCUPANCY, PACKED_CONFIGS = False, {64: TileConfig(32, 8, 5, 128, ctas_per_sm=2, max_registers=128)}
# Issue #38's D=256 packed rows: more than WIDE_D256_ABOVE_ROWS packed rows at D=256 take 128-row tiles on 8 warps,
# one CTA an SM, so 128 rows read the KV head's keys once, not four times. 16-key blocks, with the merge in chunks
# (MERGE_CHUNK_ROWS): 224-255 registers a thread, no spill (sm_90a, Triton 3.6 and 3.8); 32-key blocks spill 8-88
# bytes; 128 rows merged at once spill 592. Against the 32-row tiles (H200, results/h200/decode-d256-wide/): 0.60x
# the time on seed 47's B=64 H=8 Hkv=1 Sq=16 paged ragged row (11 -> 19 % of the read bandwidth), 0.59x on 128 rows
# of a full 4k cache, 1.00x on a 128k MQA cache. A 64-row tile for 33-64 rows was mixed (0.79x on a paged ragged row,
# 1.19x on seed 47's B=1 H=64 Hkv=4 Sq=4 row: half the CTAs on a batch of one) and is not kept.
WIDE_D256, WIDE_D256_ABOVE_ROWS = True, 64
WIDE_D256_CONFIG = TileConfig(16, 8, 3, 128, ctas_per_sm=1)
# Triton releases whose WIDE_D256 kernels spill (3.9: 16-24 bytes, sm_90a): not there.
WIDE_D256_SPILLS = ("3.9",)
# Issue #38's D=256 rows of one wgmma tile (on since bench/triton_decode_d256_rows_ab.sh on an
# H200, results/h200/decode-triton-wgmma-d256/: seed 53 row 0 981.8 -> 618.5 us, seed 47 row 6 166.7 -> 131.4, seed 59
# row 5 130.3 -> 114.7, row 0's lengths given 1608.9 -> 608.3, paged(64) 2755.7 -> 975.0; 16- and 128-row controls
# level): WGMMA_D256_FROM_ROWS to 64 rows at D=256 take one 64-row tile (padded to 64) on wgmma, 32-key blocks, 4
# stages (3 blocks, 96 KB, in flight, 160 KB of shared memory; paged 2 blocks, 129 KB), one CTA an SM, not 32-row
# mma.sync tiles each reading the item's K/V (gluon/decode's one 64-row tile: 97 % on seed 53's row 0, triton 55 %).
# One warpgroup: gluon's shape, a row's softmax in its warp, 255 registers with 64-192 bytes of spill outside the key
# loops (sm_90a, Triton 3.6/3.8; 256 in the split kernel under 3.9). The same A/B timed 8 warps as 4 x 2 (row max, sum
# and P crossing warpgroups through shared memory): 0.60-1.01x the 32-row tiles' time, behind one warpgroup on every
# row; removed. 64-key blocks on 4 warps spill in the paged loop.
WGMMA_D256 = True
WGMMA_D256_FROM_ROWS = 17
# Past 64 rows at D=256, a contiguous cache takes the wgmma tile too (cut into 64-row M tiles, each reading the item's
# K/V), a paged one WIDE_D256's 128-row tile. H200 A/B of the most rows the wgmma tile takes, 64 against all
# (bench/decode_d256_many_rows_ab.sh, results/h200/decode-d256-many-rows/): contiguous, 0.65-0.88x the time (seed 67
# row 0's 256 rows 408.6 -> 308.9 us, row 7 543.2 -> 443.0, seed 47 row 4's 128 rows unpaged 233.1 -> 151.4); paged,
# 1.09-1.65x (seed 47 row 4 in pages of 256 253.7 -> 284.1, seed 67 row 7 in pages of 64 669.2 -> 1107.3): the paged
# wgmma tile keeps 2 blocks in flight, and WIDE_D256 reads each page once for 128 rows.
WGMMA_D256_CONTIGUOUS_ALL_ROWS = True
WGMMA_D256_CONFIG = TileConfig(32, 4, 4, 64, ctas_per_sm=1, min_block_m=64)


def tile_config(problem: Problem) -> TileConfig:
    """``problem``'s tile: PACKED_CONFIGS' for many packed rows under WIDE_M_TILE and PACKED_OCCUPANCY, else
    WIDE_CONFIGS' at WIDE_M_TILE_HEAD_DIMS (WIDE_CONTIGUOUS_RINGS' key block and depth on a contiguous cache),
    WIDE_D256_CONFIG for more than WIDE_D256_ABOVE_ROWS at D=256 under WIDE_D256 (not in a release of
    WIDE_D256_SPILLS), WGMMA_D256_CONFIG for WGMMA_D256_FROM_ROWS to 64 rows at D=256 under WGMMA_D256 (every count
    from WGMMA_D256_FROM_ROWS on a contiguous cache under WGMMA_D256_CONTIGUOUS_ALL_ROWS, before WIDE_D256),
    SHORT_CACHE_CONFIGS' for a short cache under SHORT_CACHE_TILE, else the default."""
    rows = problem.kv_group * problem.seqlen_q
    wide = WIDE_M_TILE and rows > MAX_BLOCK_M
    if wide and PACKED_OCCUPANCY and problem.head_dim in PACKED_CONFIGS:
        return PACKED_CONFIGS[problem.head_dim]
    if wide and problem.head_dim in WIDE_M_TILE_HEAD_DIMS:
        if not problem.paged and problem.head_dim in WIDE_CONTIGUOUS_RINGS:
            block_n, num_stages = WIDE_CONTIGUOUS_RINGS[problem.head_dim]
            return replace(WIDE_CONFIGS[problem.head_dim], block_n=block_n, num_stages=num_stages)
        return WIDE_CONFIGS[problem.head_dim]
    wgmma_rows = rows <= MAX_BLOCK_M or (WGMMA_D256_CONTIGUOUS_ALL_ROWS and not problem.paged)
    if WGMMA_D256 and problem.head_dim == 256 and rows >= WGMMA_D256_FROM_ROWS and wgmma_rows:
        return WGMMA_D256_CONFIG
    wide_d256 = WIDE_D256 and problem.head_dim == 256 and triton_release() not in WIDE_D256_SPILLS
    if wide_d256 and rows > WIDE_D256_ABOVE_ROWS:
        return WIDE_D256_CONFIG
    configs = SHORT_CACHE_CONFIGS if SHORT_CACHE_TILE and problem.seqlen_k <= splits.SHORT_CACHE_KEYS else {}
    return configs.get(problem.head_dim, DEFAULT_CONFIGS[problem.head_dim])


def num_stages_for(problem: Problem, deep: bool = False) -> int:
    """The split kernel's depth: the tile's (``deep``: DEEP_RING's), plus PAGED_EXTRA_STAGES when paged."""
    stages = DEEP_RING_STAGES[problem.head_dim] if deep else tile_config(problem).num_stages
    return stages + (PAGED_EXTRA_STAGES if problem.paged else 0)


def paged_spans(problem: Problem) -> bool:
    """Whether ``problem``'s key loop reads one table entry per page a block spans (``PAGED_SPAN_LOOKUP``, not in a
    release of ``PAGED_SPAN_SPILLS``, a paged cache whose page size and key block divide one another)."""
    page, block_n = problem.page_size, tile_config(problem).block_n
    switched_on = PAGED_SPAN_LOOKUP and triton_release() not in PAGED_SPAN_SPILLS
    return bool(switched_on and page and (page % block_n == 0 or block_n % page == 0))


def one_key_loop(problem: Problem) -> bool:
    """Whether the split kernels walk ``problem``'s splits in one loop each (``ONE_KEY_LOOP``, at a head dim of
    ``ONE_KEY_LOOP_HEAD_DIMS``, not in a release of ``ONE_KEY_LOOP_SPILLS``)."""
    in_scope = problem.head_dim in ONE_KEY_LOOP_HEAD_DIMS and triton_release() not in ONE_KEY_LOOP_SPILLS
    return ONE_KEY_LOOP and in_scope


def launch_options(problem: Problem, deep: bool = False) -> dict[str, int | None]:
    """The split kernels' warps, depth (``num_stages_for``) and register cap."""
    config = tile_config(problem)
    return {"num_warps": config.num_warps, "num_stages": num_stages_for(problem, deep), "maxnreg": config.max_registers}


def split_policy(problem: Problem) -> splits.SplitPolicy:
    """This rung's ask of the split rule, from its fifth-stop switches (default: the rule as it was) and
    ``MANY_ITEMS_FULL_FIT`` (the tile's full fit counted where the items alone pass a wave)."""
    config = tile_config(problem)
    fit = config.ctas_per_sm or CTAS_PER_SM_FIT[problem.head_dim]
    known_fit = config.ctas_per_sm or block_m_for(problem) <= FIT_BLOCK_M
    past_wave = fit if MANY_ITEMS_FULL_FIT and known_fit else 0
    return splits.SplitPolicy(min(SPLIT_CTAS_PER_SM, fit), SHORT_CACHE_ONE_SPLIT, FEWER_WAVES, past_wave)


# ----------------------------------------------------------------------------------------------
# One CTA's work: the packed Q tile of one (batch, KV head) against a range of its keys
# ----------------------------------------------------------------------------------------------
@triton.jit
def attend_split(
    q_operand, k_operand, v_operand, BlockTable, stride_btb, CacheSeqlens,
    batch, kv_head, m_block, split, num_splits, group, seqlen_q, seqlen_k, softmax_scale_log2,
    CAUSAL: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, HAS_CACHE_SEQLENS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, PAGE_SPANS: tl.constexpr,
    ONE_KEY_LOOP: tl.constexpr = False,
):  # fmt: skip
    """Steps 1-4 of the algorithm for M tile ``m_block`` of (``batch``, ``kv_head``) over split ``split``
    of ``num_splits`` of its keys: ``(out, lse, head, offs_m, row_ok)``, O normalised and the natural-log
    LSE of those keys. ``q_operand`` is (Q, batch, head and row strides), ``k_operand`` and ``v_operand``
    the same for K and V (paged: the page stride where the batch stride stands)."""
    Q, stride_qb, stride_qh, stride_qm = q_operand
    K, stride_kb, stride_kh, stride_kn = k_operand
    V, stride_vb, stride_vh, stride_vn = v_operand
    # 1. This sequence's keys, the last one any row sees, and this split's share of them.
    seqlen_k, causal_offset = seqlen_info(CacheSeqlens, batch, seqlen_q, seqlen_k, HAS_CACHE_SEQLENS, BOTTOM_RIGHT)
    key_end = attended_keys(seqlen_k, causal_offset, seqlen_q, CAUSAL)
    key_begin, key_end = split_key_range(split, num_splits, key_end, BLOCK_N)

    # 2. The packed Q tile: row r is token r % Sq of query head kv_head · group + r // Sq.
    head, offs_m, row_ok = packed_rows(m_block, kv_head, group, seqlen_q, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q_ptrs = Q + batch * stride_qb + head[:, None] * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
    if PAGE_SIZE:
        # Paged: K and V are pools shared by every sequence (stride_kb is their page stride); this
        # sequence's row of the block table says which page holds which of its keys.
        block_table_row = BlockTable + batch * stride_btb
        k_base = K + kv_head * stride_kh
        v_base = V + kv_head * stride_vh
    else:
        block_table_row = BlockTable
        k_base = K + item_offset(batch, kv_head, stride_kb, stride_kh)
        v_base = V + item_offset(batch, kv_head, stride_vb, stride_vh)

    row_max = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)

    # 3. Keys every row sees (below the first token's diagonal and inside the sequence) need no
    # mask; the rest of the range (the tail and the diagonal) takes each row's own token index
    # (``ONE_KEY_LOOP``: in the same loop, from ``unmasked_end`` on).
    visible_to_all = tl.minimum(seqlen_k, causal_offset + 1) if CAUSAL else seqlen_k
    unmasked_end = tl.minimum(tl.maximum(visible_to_all // BLOCK_N * BLOCK_N, key_begin), key_end)
    acc, row_max, row_sum = attend_key_range(
        acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_vn,
        offs_m, key_begin, unmasked_end, key_end, seqlen_k, causal_offset, softmax_scale_log2,
        CAUSAL=CAUSAL, HEAD_DIM=HEAD_DIM, BLOCK_N=BLOCK_N,
        block_table_row=block_table_row, stride_kpage=stride_kb, stride_vpage=stride_vb, PAGE_SIZE=PAGE_SIZE,
        PAGE_SPANS=PAGE_SPANS, ONE_LOOP=ONE_KEY_LOOP,
    )  # fmt: skip

    # 4. O and the natural-log LSE of these keys (O = 0, LSE = -inf where there were none).
    out, lse = online_softmax_finalize(acc, row_max, row_sum, 1.0)
    return out, lse, head, offs_m, row_ok


# ----------------------------------------------------------------------------------------------
# Kernel 1: one split of the keys for one packed M tile of one (batch, KV head)
# ----------------------------------------------------------------------------------------------
@triton.jit
def _split_kernel(
    Q, K, V, Out, Lse, CacheSeqlens, OutPartial, LsePartial,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om,
    heads, kv_heads, seqlen_q, seqlen_k, softmax_scale_log2,
    BlockTable, stride_btb, Counters,
    CAUSAL: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, HAS_CACHE_SEQLENS: tl.constexpr, RETURN_LSE: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
    PAGE_SIZE: tl.constexpr, FUSED_MERGE: tl.constexpr, SPLITS_PER_STEP: tl.constexpr, PAGE_SPANS: tl.constexpr,
    ONE_KEY_LOOP: tl.constexpr, ORDER_BLOCK_B: tl.constexpr,
):  # fmt: skip
    split = tl.program_id(0)
    num_splits = tl.num_programs(0)
    m_block = tl.program_id(1)
    batch_kv_head = tl.program_id(2)
    if ORDER_BLOCK_B:  # LONGEST_FIRST: the grid's items (dispatched in z order) longest sequence first
        batch_size = tl.num_programs(2) // kv_heads
        batch_kv_head = longest_first_item(batch_kv_head, kv_heads, CacheSeqlens, batch_size, ORDER_BLOCK_B)
    batch, kv_head = batch_and_head(batch_kv_head, kv_heads)
    group = heads // kv_heads

    # 1.-4. The split's keys of this sequence against the packed Q tile: its O and natural-log LSE (O = 0, LSE
    # = -inf for a split that saw no key). Partials: (num_splits, B, H, Sq, D) and (num_splits, B, H, Sq).
    k_operand, v_operand = (K, stride_kb, stride_kh, stride_kn), (V, stride_vb, stride_vh, stride_vn)
    out, lse, head, offs_m, row_ok = attend_split(
        (Q, stride_qb, stride_qh, stride_qm), k_operand, v_operand, BlockTable, stride_btb, CacheSeqlens,
        batch, kv_head, m_block, split, num_splits, group, seqlen_q, seqlen_k, softmax_scale_log2,
        CAUSAL=CAUSAL, BOTTOM_RIGHT=BOTTOM_RIGHT, HAS_CACHE_SEQLENS=HAS_CACHE_SEQLENS, HEAD_DIM=HEAD_DIM,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, PAGE_SIZE=PAGE_SIZE, PAGE_SPANS=PAGE_SPANS, ONE_KEY_LOOP=ONE_KEY_LOOP,
    )  # fmt: skip
    row = (batch * heads + head) * seqlen_q + offs_m
    out_rows = (Out, batch * stride_ob + head * stride_oh + offs_m * stride_om)
    if SPLIT:
        rows = tl.num_programs(2).to(tl.int64) * group * seqlen_q
        store_partials(OutPartial, LsePartial, split * rows + row, out, lse, row_ok, HEAD_DIM=HEAD_DIM)
        # 5. Fused merge: the tile's last split to finish merges all of them (``last_to_arrive``).
        if FUSED_MERGE:
            work_item = batch_kv_head * tl.num_programs(1) + m_block
            if last_to_arrive(Counters + work_item, num_splits):
                if HEAD_DIM >= MERGE_CHUNK_HEAD_DIM and BLOCK_M > MERGE_CHUNK_ROWS:
                    # Partial row = (batch · H + kv_head · group) · Sq + packed row, as ``row``.
                    merge_in_chunks(
                        (OutPartial, LsePartial), (batch * heads + kv_head * group) * seqlen_q,
                        (Out, Lse, stride_ob, stride_oh, stride_om), batch, kv_head, m_block, group, heads, seqlen_q,
                        rows, num_splits, RETURN_LSE, HEAD_DIM, BLOCK_M, SPLITS_PER_STEP,
                    )  # fmt: skip
                else:
                    out, lse = merge_splits(
                        OutPartial, LsePartial, row, row_ok, rows, num_splits,
                        HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M, SPLITS_PER_STEP=SPLITS_PER_STEP,
                    )  # fmt: skip
                    store_output(out_rows, Lse, out, lse, row, row_ok, HEAD_DIM=HEAD_DIM, RETURN_LSE=RETURN_LSE)
    else:
        store_output(out_rows, Lse, out, lse, row, row_ok, HEAD_DIM=HEAD_DIM, RETURN_LSE=RETURN_LSE)


# ----------------------------------------------------------------------------------------------
# Kernel 1, balanced (``BALANCED_SPLIT``): equal shares of the valid keys, planned on the device
# ----------------------------------------------------------------------------------------------
@triton.jit
def _balanced_split_kernel(
    Q, K, V, Out, Lse, CacheSeqlens, OutPartial, LsePartial,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om,
    heads, kv_heads, seqlen_q, seqlen_k, softmax_scale_log2,
    BlockTable, stride_btb, Counters, batch_size, target_shares, min_share_blocks, max_item_shares,
    CAUSAL: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, HAS_CACHE_SEQLENS: tl.constexpr, RETURN_LSE: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
    SPLITS_PER_STEP: tl.constexpr, BLOCK_B: tl.constexpr, M_TILE_MAJOR: tl.constexpr, PAGE_SPANS: tl.constexpr,
    MERGE_GROUP: tl.constexpr, ONE_KEY_LOOP: tl.constexpr,
):  # fmt: skip
    """Grid (target_shares + B · Hkv, m_blocks) (``M_TILE_MAJOR``: the axes swapped): one share of one M tile's keys
    per program, then the item's last share to arrive merges (an item of one share writes O and the LSE itself)."""
    share = tl.program_id(1 if M_TILE_MAJOR else 0)
    m_block = tl.program_id(0 if M_TILE_MAJOR else 1)
    group = heads // kv_heads
    # 0. This CTA's work item and split (``balanced_share``); a CTA past the last share attends an
    # empty range and stores nothing.
    batch, kv_head, split, item_shares, has_work = balanced_share(
        CacheSeqlens, share, batch_size, kv_heads, seqlen_q, seqlen_k, target_shares, min_share_blocks,
        max_item_shares, CAUSAL, BOTTOM_RIGHT, HAS_CACHE_SEQLENS, BLOCK_N, BLOCK_B,
    )  # fmt: skip

    # 1.-4. As in ``_split_kernel``, over the item's ``item_shares`` splits.
    k_operand, v_operand = (K, stride_kb, stride_kh, stride_kn), (V, stride_vb, stride_vh, stride_vn)
    out, lse, head, offs_m, row_ok = attend_split(
        (Q, stride_qb, stride_qh, stride_qm), k_operand, v_operand, BlockTable, stride_btb, CacheSeqlens,
        batch, kv_head, m_block, split, item_shares, group, seqlen_q, seqlen_k, softmax_scale_log2,
        CAUSAL=CAUSAL, BOTTOM_RIGHT=BOTTOM_RIGHT, HAS_CACHE_SEQLENS=HAS_CACHE_SEQLENS, HEAD_DIM=HEAD_DIM,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, PAGE_SIZE=PAGE_SIZE, PAGE_SPANS=PAGE_SPANS, ONE_KEY_LOOP=ONE_KEY_LOOP,
    )  # fmt: skip
    row = (batch * heads + head) * seqlen_q + offs_m
    out_rows = (Out, batch * stride_ob + head * stride_oh + offs_m * stride_om)
    if has_work:
        if item_shares == 1:
            store_output(out_rows, Lse, out, lse, row, row_ok, HEAD_DIM=HEAD_DIM, RETURN_LSE=RETURN_LSE)
        else:
            # 5. Each share's partials are slab ``share`` of group · Sq rows, so the item's are the slabs
            # from share - split on; its last share to arrive merges them, in runs of MERGE_GROUP.
            store_balanced_partials(
                (OutPartial, LsePartial, Counters), (Out, Lse, stride_ob, stride_oh, stride_om),
                (batch, kv_head, m_block, group, heads, seqlen_q), (share, split, item_shares), out, lse, row_ok,
                RETURN_LSE, HEAD_DIM, BLOCK_M, SPLITS_PER_STEP, M_TILE_MAJOR, MERGE_GROUP,
            )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Kernel 2, the two-launch merge (``last_to_arrive`` and ``merge_splits``: ``_decode_merge.py``)
# ----------------------------------------------------------------------------------------------
@triton.jit
def _merge_kernel(
    OutPartial, LsePartial, Out, Lse,
    stride_ob, stride_oh, stride_om,
    heads, kv_heads, seqlen_q, num_splits,
    RETURN_LSE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, SPLITS_PER_STEP: tl.constexpr,
):  # fmt: skip
    """Kernel 2 (``FUSED_MERGE = False``, and gluon/decode): one program per packed M tile, the tile
    kernel 1 wrote, merged by the same :func:`merge_splits`."""
    m_block = tl.program_id(0)
    batch, kv_head = batch_and_head(tl.program_id(1), kv_heads)
    group = heads // kv_heads
    if HEAD_DIM >= MERGE_CHUNK_HEAD_DIM and BLOCK_M > MERGE_CHUNK_ROWS:
        merge_in_chunks(
            (OutPartial, LsePartial), (batch * heads + kv_head * group) * seqlen_q,
            (Out, Lse, stride_ob, stride_oh, stride_om), batch, kv_head, m_block, group, heads, seqlen_q,
            tl.num_programs(1).to(tl.int64) * group * seqlen_q, num_splits, RETURN_LSE, HEAD_DIM, BLOCK_M,
            SPLITS_PER_STEP,
        )  # fmt: skip
    else:
        head, offs_m, row_ok = packed_rows(m_block, kv_head, group, seqlen_q, BLOCK_M)
        row = (batch * heads + head) * seqlen_q + offs_m
        rows = tl.num_programs(1).to(tl.int64) * group * seqlen_q
        out, lse = merge_splits(
            OutPartial, LsePartial, row, row_ok, rows, num_splits,
            HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M, SPLITS_PER_STEP=SPLITS_PER_STEP,
        )  # fmt: skip
        out_rows = (Out, batch * stride_ob + head * stride_oh + offs_m * stride_om)
        store_output(out_rows, Lse, out, lse, row, row_ok, HEAD_DIM=HEAD_DIM, RETURN_LSE=RETURN_LSE)


# ----------------------------------------------------------------------------------------------
# Host: tile shape, split rule, bind, prepare
# ----------------------------------------------------------------------------------------------
def next_power_of_2(n: int) -> int:
    """The least power of two >= n (n >= 1), in plain Python: ``triton.next_power_of_2`` goes through
    Triton's constexpr machinery, a measurable cost in a host path that runs at every decode step."""
    return 1 << (n - 1).bit_length()


def block_m_for(problem: Problem) -> int:
    """Rows of one packed M tile: group · Sq rounded up to a power of two in [min_block_m, max_block_m]."""
    config = tile_config(problem)
    return min(config.max_block_m, max(config.min_block_m, next_power_of_2(problem.kv_group * problem.seqlen_q)))


def m_blocks_for(problem: Problem) -> int:
    return -(-problem.kv_group * problem.seqlen_q // block_m_for(problem))


def planned_num_splits(problem: Problem, device: torch.device) -> int:
    """The shared split rule (``common/contract/splits.py``) for this rung's M tiles and policy."""
    return splits.planned_num_splits(problem, m_blocks_for(problem), device, split_policy(problem))


def merge_splits_per_step(block_m: int, head_dim: int, num_warps: int) -> int:
    """Splits :func:`merge_splits` unrolls a step on ``block_m`` rows: ``MERGE_SPLITS_PER_STEP``, fewer
    where a step's O tiles (block_m × D fp32 each) would take more than ``MERGE_STEP_REGISTERS`` per
    thread of ``num_warps`` warps. Shared with gluon/decode."""
    fitting = MERGE_STEP_REGISTERS * 32 * num_warps // (block_m * head_dim)
    return max(1, min(MERGE_SPLITS_PER_STEP, fitting))


def _merge_step(problem: Problem) -> int:
    return merge_splits_per_step(block_m_for(problem), problem.head_dim, tile_config(problem).num_warps)


def _split_constexprs(problem: Problem, *, split: bool) -> dict[str, int | bool]:
    return {
        **feature_constexprs(problem), "HEAD_DIM": problem.head_dim, "BLOCK_M": block_m_for(problem),
        "BLOCK_N": tile_config(problem).block_n, "SPLIT": split, "PAGE_SIZE": problem.page_size,
        "FUSED_MERGE": split and FUSED_MERGE, "SPLITS_PER_STEP": _merge_step(problem),
        "PAGE_SPANS": paged_spans(problem), "ONE_KEY_LOOP": one_key_loop(problem),
        "ORDER_BLOCK_B": order_block(problem),
    }  # fmt: skip


def order_block(problem: Problem) -> int:
    """``_split_kernel``'s ORDER_BLOCK_B: 0 (grid order) unless ``LONGEST_FIRST`` takes ``problem`` (its
    ``cache_seqlens``, at most LONGEST_FIRST_MAX_BATCH sequences, a head dim of LONGEST_FIRST_HEAD_DIMS), else the
    batch as a power of two, at least 16."""
    switch = LONGEST_FIRST and problem.head_dim in LONGEST_FIRST_HEAD_DIMS
    return splits.longest_first_block(problem, switch, LONGEST_FIRST_MAX_BATCH, 16)


# Per device, the arrival counters of the fused merge (one int32 per M tile of the grid), zeroed once
# and kept zero between launches by the kernel itself.
_ARRIVAL_COUNTERS: dict[torch.device, torch.Tensor] = {}
# Per device, the stream of the last eager bind that took the counters (see order_counter_users).
_COUNTER_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def arrival_counters(device: torch.device, work_items: int) -> torch.Tensor:
    """The process-lifetime counters of ``device``, at least ``work_items`` of them: a larger grid than
    any before allocates a new zeroed buffer (a power of two of counters) outside any CUDA-graph pool
    (:func:`~common.contract.devices.lasting`); runners bound earlier keep theirs. Every launch of the
    device shares them, so a bind on another stream than the last one's is ordered after it
    (:func:`order_counter_users`); the runner must then run on the stream it was bound on."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    order_counter_users(device)
    counters = _ARRIVAL_COUNTERS.get(device)
    if counters is None or counters.numel() < work_items:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"triton/decode: the fused merge needs {work_items} arrival counters on {device}, more than "
                "any launch before; bind (or run) this shape once before capturing it in a CUDA graph"
            )
        size = next_power_of_2(max(work_items, MIN_ARRIVAL_COUNTERS))
        counters = lasting(lambda: torch.zeros(size, dtype=torch.int32, device=device), device)
        _ARRIVAL_COUNTERS[device] = counters
    return counters


def order_counter_users(device: torch.device) -> None:
    """Make the current stream of ``device`` wait for the stream of the last eager bind there, when they differ.

    Two launches that share the arrival counters must not overlap: both would count their CTAs in one counter, so
    a CTA would take itself for its tile's last before the others had stored their partials, and merge a partial
    that is not written yet (a wrong answer, no error). Waiting costs nothing while a process keeps to one stream;
    on a switch the new stream waits for what is queued on the last one (``Stream.wait_stream``). A capturing
    stream neither waits (a captured wait on an event recorded outside the capture is refused by CUDA) nor becomes
    the last one; so a graph replayed on one stream while decode launches run on another is not ordered by this,
    and the caller must order them, as for any two users of one buffer."""
    if device.type != "cuda":
        return
    stream = torch.cuda.current_stream(device)
    last = _COUNTER_STREAMS.get(device)
    if last == stream or torch.cuda.is_current_stream_capturing():
        return
    if last is not None:
        stream.wait_stream(last)
    _COUNTER_STREAMS[device] = stream


def merge_launch(
    problem: Problem, num_splits: int, out_partial: torch.Tensor, lse_partial: torch.Tensor, out: torch.Tensor,
    lse_arg: torch.Tensor | None,
) -> Callable[[], None]:  # fmt: skip
    """The merge kernel's launch over the splits' partials into O (and the LSE), one program per packed
    M tile of triton/decode's. Shared with gluon/decode."""
    merge_sizes = (problem.heads, problem.kv_heads, problem.seqlen_q, num_splits)
    merge_args = (out_partial, lse_partial, out, lse_arg, *out.stride()[:3], *merge_sizes)
    merge_grid = (m_blocks_for(problem), problem.batch * problem.kv_heads)
    merge_options = {
        "RETURN_LSE": problem.return_lse, "HEAD_DIM": problem.head_dim, "BLOCK_M": block_m_for(problem),
        "SPLITS_PER_STEP": _merge_step(problem), "num_warps": tile_config(problem).num_warps,
    }  # fmt: skip

    def merge() -> None:
        _merge_kernel[merge_grid](*merge_args, **merge_options)

    return merge


def launch_arguments(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, workspace: tuple[torch.Tensor, torch.Tensor],
    cache_seqlens: torch.Tensor | None, block_table: torch.Tensor | None, *, ready: bool = False,
    sizes: tuple | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, tuple]:  # fmt: skip
    """``(out, lse, lse_arg, args)``: O and the LSE allocated, and the arguments both split kernels
    take before ``Counters``, with ``workspace`` (the partial O and LSE) as OutPartial, LsePartial.
    ``ready``: q, k and v are known kernel-addressable (a plan key proves it), so no check runs;
    ``sizes``: :func:`size_arguments` of ``problem``, where a binder made them once."""
    if not ready:
        q, k, v = (kernel_operand(t) for t in (q, k, v))
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = allocate_lse(problem, q.device)
    lse_arg, lengths_arg = feature_buffers(lse, cache_seqlens, q.device)
    kv_strides = (*kv_row_strides(k, problem.paged), *kv_row_strides(v, problem.paged))
    strides = (*q.stride()[:3], *kv_strides, *out.stride()[:3])
    args = (
        q, k, v, out, lse_arg, lengths_arg, *workspace,
        *strides, *(sizes or size_arguments(problem)), *paging_arguments(block_table),
    )  # fmt: skip
    return out, lse, lse_arg, args


def bind(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, *,
    cache_seqlens: torch.Tensor | None = None, block_table: torch.Tensor | None = None, num_splits: int | None = None,
) -> Runner:  # fmt: skip
    """Allocate O, the LSE and the split workspace for validated q, k, v (page pools with
    ``block_table`` when the problem is paged) and return ``run()`` launching the split kernel, which
    merges its splits itself (with ``FUSED_MERGE`` off and more than one split, the merge kernel
    follows). ``num_splits`` overrides the rule (sweeps, tests). A call with ``cache_seqlens`` binds
    :func:`bind_balanced` instead (``BALANCED_SPLIT``). :func:`make_binder` and one call of its binder."""
    return make_binder(problem, q.device, num_splits=num_splits)(q, k, v, cache_seqlens, block_table)


def make_binder(
    problem: Problem, device: torch.device, planned: object = None, ready: bool = False, num_splits: int | None = None
) -> SplitBinder:
    """``bind`` in two: what ``problem`` and ``device`` decide (the split count, grid, constexprs and the
    kernels' size arguments), worked out here once, and the returned binder ``(q, k, v, cache_seqlens,
    block_table)``, which only allocates O, the LSE and the workspace and returns ``run()``.
    ``common.attention`` keeps one per plan (the registry's ``make_binder``; ``planned`` unused), so a plan
    hit skips the dozen small functions that decide the launch. ``ready``: every q, k, v passed is
    kernel-addressable (the plan key proves it), so the binder skips ``kernel_operand``."""
    if balanced_split(problem, device):
        return BalancedBinder(problem, device, ready, shares=num_splits)
    return PaddedBinder(problem, device, ready, num_splits)


def seqlen_k_decisions(problem: Problem, device: torch.device) -> tuple[bool, TileConfig, int]:
    """What :func:`make_binder` decides from Sk by the rule: the balanced split or not, the tile
    (``SHORT_CACHE_TILE``) and the split count (the balanced split's target shares). Every other decision
    follows from these and the rest of the problem, so a longer cache whose decisions are its family's
    binds as that binder does with Sk's size argument changed (:meth:`SplitBinder.grown`)."""
    if balanced_split(problem, device):
        return True, tile_config(problem), balanced_target_shares(problem, device)
    return False, tile_config(problem), planned_num_splits(problem, device)


class SplitBinder:
    """What both binders hold: the problem, whether q, k, v are kernel-addressable (``ready``), the kernels'
    size arguments, and the decisions that Sk enters (:func:`seqlen_k_decisions`)."""

    problem: Problem
    ready: bool
    sizes: tuple[int | float, ...]
    decisions: tuple[bool, TileConfig, int]

    def grown(self, problem: Problem, device: torch.device) -> SplitBinder:
        """The binder of ``problem``, a longer cache of this binder's family (the registry's growing binder): this
        one with Sk's size argument changed where Sk leaves :func:`seqlen_k_decisions` as they were, else a new one.
        The module switches stay those read when the family was planned (``clear_plan_cache()`` re-reads them)."""
        unchanged = splits.same_padded_split(self.decisions[0], problem, self.problem)
        if not unchanged and seqlen_k_decisions(problem, device) != self.decisions:
            return make_binder(problem, device, ready=self.ready)
        return resized(self, problem)


class PaddedBinder(SplitBinder):
    """The split kernel over the padded Sk's splits (and the merge kernel where ``FUSED_MERGE`` is off)."""

    def __init__(self, problem: Problem, device: torch.device, ready: bool, num_splits: int | None = None):
        num_splits = splits.resolve_num_splits(
            num_splits, problem, m_blocks_for(problem), device, split_policy(problem)
        )
        self.problem, self.ready, self.num_splits = problem, ready, num_splits
        self.decisions = (False, tile_config(problem), num_splits)
        self.split_grid = (num_splits, m_blocks_for(problem), problem.batch * problem.kv_heads)
        deep = DEEP_RING and num_splits * self.split_grid[1] * self.split_grid[2] <= splits.sm_count(device)
        self.split_options = {**_split_constexprs(problem, split=num_splits > 1), **launch_options(problem, deep)}
        self.fused = self.split_options["FUSED_MERGE"]
        # Only the two-launch path (more than one split, FUSED_MERGE off) launches the merge kernel.
        self.two_launch = num_splits > 1 and not self.fused
        self.sizes = size_arguments(problem)

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache_seqlens: torch.Tensor | None,
        block_table: torch.Tensor | None,
    ) -> Runner:  # fmt: skip
        problem, num_splits = self.problem, self.num_splits
        split_grid, split_options = self.split_grid, self.split_options
        out_partial, lse_partial = workspace = split_workspace(problem, num_splits, q.device)
        out, lse, lse_arg, split_args = launch_arguments(
            q, k, v, problem, workspace, cache_seqlens, block_table, ready=self.ready, sizes=self.sizes
        )
        # Looked up per bind: a larger grid bound since may have replaced the device's counters.
        counters = arrival_counters(q.device, split_grid[1] * split_grid[2]) if self.fused else None
        two_launch = self.two_launch
        merge = merge_launch(problem, num_splits, out_partial, lse_partial, out, lse_arg) if two_launch else None

        def run() -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
            _split_kernel[split_grid](*split_args, counters, **split_options)
            if merge is not None:
                merge()
            return rung_result(out, lse)

        run.num_splits = num_splits
        run.fused_merge = self.fused
        run.balanced = False
        run.num_stages = split_options["num_stages"]
        return run


def balanced_split(problem: Problem, device: torch.device) -> bool:
    """Whether ``BALANCED_SPLIT`` gives ``problem``'s calls on ``device`` the balanced split
    (``splits.balanced_split_applies`` with this rung's split rule)."""
    return splits.balanced_split_applies(BALANCED_SPLIT, problem, lambda: planned_num_splits(problem, device))


def balanced_target_shares(problem: Problem, device: torch.device, shares: int | None = None) -> int:
    """The balanced grid's shares per M tile (``splits.resolve_balanced_shares``; ``shares`` forces them) at this
    rung's ``BALANCED_TARGET`` rule, ``BALANCED_SHARES_PER_SM``, CTA slots, ``BALANCED_MIN_KEYS`` and key block; under
    ``BALANCED_BUILD_FIT``, at most :func:`balanced_one_wave_target`."""
    config = tile_config(problem)
    rule = {"target": BALANCED_TARGET, "ctas_per_sm": config.ctas_per_sm or CTAS_PER_SM_FIT[problem.head_dim]}
    sizes = (m_blocks_for(problem), config.block_n, BALANCED_SHARES_PER_SM, BALANCED_MIN_KEYS)
    target = splits.resolve_balanced_shares(shares, problem, device, *sizes, **rule)
    one_wave = None if shares else balanced_one_wave_target(problem, device)
    return target if one_wave is None else min(target, one_wave)


def balanced_build_ctas_per_sm(problem: Problem) -> int | None:
    """The CTAs an SM the balanced kernel's build of ``problem`` holds where it is fewer than the plan counts
    (``BALANCED_BUILD_CTAS_PER_SM``: the default tile, by head dim and packed rows a tile; with ``ONE_SLOT_ONE_WAVE``,
    a config's own one CTA an SM), else None."""
    config = tile_config(problem)
    if ONE_SLOT_ONE_WAVE and config.ctas_per_sm == 1:
        return 1
    if config != DEFAULT_CONFIGS[problem.head_dim]:
        return None
    return BALANCED_BUILD_CTAS_PER_SM.get((problem.head_dim, block_m_for(problem)))


def balanced_one_wave_target(problem: Problem, device: torch.device) -> int | None:
    """Under ``BALANCED_BUILD_FIT``, the most target shares that keep the balanced grid in one wave of the slots
    the build holds (slots - B · Hkv items, per M tile) where the items are few (``splits.per_slot_one_wave``);
    else None."""
    fit = balanced_build_ctas_per_sm(problem) if BALANCED_BUILD_FIT else None
    if fit is None:
        return None
    slots, items = splits.per_tile(device, fit, m_blocks_for(problem)), problem.batch * problem.kv_heads
    return slots - items if splits.per_slot_one_wave(slots, items) else None


def balanced_constexprs(problem: Problem, m_tile_major: bool) -> dict[str, int | bool]:
    """:func:`_balanced_split_kernel`'s constexprs for ``problem`` with the grid's axes ``m_tile_major``."""
    return {
        **feature_constexprs(problem), "HEAD_DIM": problem.head_dim, "BLOCK_M": block_m_for(problem),
        "BLOCK_N": tile_config(problem).block_n, "PAGE_SIZE": problem.page_size,
        "SPLITS_PER_STEP": _merge_step(problem), "BLOCK_B": next_power_of_2(max(problem.batch, MIN_BLOCK_B)),
        "M_TILE_MAJOR": m_tile_major,
        "PAGE_SPANS": paged_spans(problem), "MERGE_GROUP": BALANCED_MERGE_GROUP, "ONE_KEY_LOOP": one_key_loop(problem),
    }  # fmt: skip


def balanced_counter_count(items: int, slabs: int, m_blocks: int) -> int:
    """The balanced split's arrival counters: one per (item, M tile), and with runs (``BALANCED_MERGE_GROUP``) one
    per (slab, M tile) past the grid's slabs · M tiles (a run's counter, at its first slab)."""
    if BALANCED_MERGE_GROUP < 0:
        raise ValueError(f"BALANCED_MERGE_GROUP must be >= 0 (0: one-level merge), got {BALANCED_MERGE_GROUP}")
    return m_blocks * (2 * slabs if BALANCED_MERGE_GROUP else items)


def bind_balanced(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, *,
    cache_seqlens: torch.Tensor | None = None, block_table: torch.Tensor | None = None, shares: int | None = None,
) -> Runner:  # fmt: skip
    """``run()`` launching :func:`_balanced_split_kernel` on a grid of ``shares`` (default
    :func:`balanced_target_shares`; forced for tests and sweeps, at least 1) + B · Hkv CTAs per M tile,
    with a workspace of as many slabs of group · Sq partial rows: every allocation and the grid follow
    from the shape, so a CUDA graph captures it once and replays it with new ``cache_seqlens``."""
    return BalancedBinder(problem, q.device, shares=shares)(q, k, v, cache_seqlens, block_table)


class BalancedBinder(SplitBinder):
    """:func:`bind_balanced` in two, as :func:`make_binder`: the grid, sizes and constexprs once, the
    allocations at each call of the binder."""

    def __init__(self, problem: Problem, device: torch.device, ready: bool = False, shares: int | None = None):
        block_n, target = tile_config(problem).block_n, balanced_target_shares(problem, device, shares)
        m_blocks, items = m_blocks_for(problem), problem.batch * problem.kv_heads
        self.problem, self.ready, self.target, self.slabs = problem, ready, target, target + items
        self.decisions = (True, tile_config(problem), target)
        m_tile_major = splits.balanced_m_tile_major(self.slabs, M_TILE_MAJOR)
        self.grid = splits.balanced_grid(self.slabs, m_blocks, m_tile_major)
        min_share_blocks, max_item_shares = splits.balanced_plan_sizes(
            block_n, BALANCED_MIN_KEYS, BALANCED_MAX_ITEM_SHARES
        )
        self.plan_sizes = (problem.batch, target, min_share_blocks, max_item_shares)
        self.options = {**balanced_constexprs(problem, m_tile_major), **launch_options(problem)}
        self.counter_count = balanced_counter_count(items, self.slabs, m_blocks)
        self.sizes = size_arguments(problem)

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache_seqlens: torch.Tensor | None,
        block_table: torch.Tensor | None,
    ) -> Runner:  # fmt: skip
        problem, grid, plan_sizes, options = self.problem, self.grid, self.plan_sizes, self.options
        workspace = balanced_workspace(problem, self.slabs, q.device)
        out, lse, _, args = launch_arguments(
            q, k, v, problem, workspace, cache_seqlens, block_table, ready=self.ready, sizes=self.sizes
        )
        counters = arrival_counters(q.device, self.counter_count)

        def run() -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
            _balanced_split_kernel[grid](*args, counters, *plan_sizes, **options)
            return rung_result(out, lse)

        run.num_splits = self.target
        run.fused_merge = True
        run.balanced = True
        return run


# prepare = validate (paged caches too) → the capability check on the validated problem → bind → warm
# up; ``num_splits=`` overrides the split rule (sweeps, tests; not part of the public API).
INPUTS = TritonInputs("triton/decode", HEAD_DIMS, check=lambda problem, device: supports(problem, device), paged=True)
ENTRY = TritonEntry(INPUTS, bind)
prepare = ENTRY.prepare


# ----------------------------------------------------------------------------------------------
# Capability check and sm_90a compile path
# ----------------------------------------------------------------------------------------------
def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    for ok, reason in (triton_device_supported(device), triton_dtype_supported(problem.dtype)):
        if not ok:
            return False, reason
    if problem.head_dim not in HEAD_DIMS:
        return False, f"triton/decode supports head_dim in {list(HEAD_DIMS)}, got {problem.head_dim}"
    if problem.seqlen_q > MAX_SEQLEN_Q:
        return (
            False,
            f"triton/decode takes 1 to {MAX_SEQLEN_Q} query tokens, got Sq={problem.seqlen_q}: use a prefill rung",
        )
    return check_features("triton/decode", problem, (*FEATURES, PAGED_KV))


def decode_shape(problem: Problem) -> Problem:
    """The problem itself when it is decode-sized, else one token of it (the canonical problem is a prefill)."""
    return problem if problem.seqlen_q <= MAX_SEQLEN_Q else problem.with_(seqlen_q=1)


def compile_sm90(problem: Problem) -> list[KernelBinary]:
    """Both kernels compiled for sm_90a at ``problem``'s head dim, dtype, mask and paging (one query
    token when ``problem`` is prefill-sized); the split kernel in its split-writing form, with the
    fused merge when ``FUSED_MERGE`` (the merge kernel is then gluon/decode's and the A/B's), at the
    ``DEEP_RING`` depth when that switch is on."""
    problem = decode_shape(problem)
    config = tile_config(problem)
    signature = {**pointer_signature(problem.dtype), "OutPartial": "*fp32", "LsePartial": "*fp32"}
    constexprs = _split_constexprs(problem, split=True)
    if problem.paged:
        signature.update({"BlockTable": "*i32", "stride_btb": "i32"})
    else:
        constexprs.update({"BlockTable": None, "stride_btb": None})
    if constexprs["FUSED_MERGE"]:
        signature["Counters"] = "*i32"
    else:
        constexprs["Counters"] = None
    split = compile_triton_sm90(
        _split_kernel, signature, constexprs, options=launch_options(problem, DEEP_RING),
        aligned=(*POINTER_ALIGNED, "OutPartial", "LsePartial"),
    )  # fmt: skip
    element = "*fp16" if problem.dtype == torch.float16 else "*bf16"
    merge = compile_triton_sm90(
        _merge_kernel,
        {
            "OutPartial": "*fp32", "LsePartial": "*fp32", "Out": element, "Lse": "*fp32",
            **{name: "i32" for name in ("stride_ob", "stride_oh", "stride_om", "heads", "kv_heads", "seqlen_q")},
            "num_splits": "i32",
        },
        {"RETURN_LSE": problem.return_lse, "HEAD_DIM": problem.head_dim, "BLOCK_M": block_m_for(problem),
         "SPLITS_PER_STEP": _merge_step(problem)},
        num_warps=config.num_warps, num_stages=1, aligned=("OutPartial", "LsePartial", "Out", "Lse"),
    )  # fmt: skip
    return [split, merge]


IMPLEMENTATION = ENTRY.implementation(
    supports, compile_sm90, required_ptx=("mma.sync", "cp.async"), source_file=__file__,
    default_configs=DEFAULT_CONFIGS, check_reads_seqlen_k=False, make_binder=make_binder,
)  # fmt: skip
