"""cute/decode — flash decoding: a few new query tokens against a long KV cache
(counterpart: ``triton_impl/decode.py``).

What it adds over ``pipelined``, which gives each CTA 128 query rows of one (batch, head) and walks
every key: at decode time Sq is 1 to 16, so that grid has B·H CTAs of mostly empty rows, each
streaming the whole cache alone, and every query head of a GQA group reads the same K/V bytes again.
The step is bound by HBM bandwidth (every K/V byte is read once per step), so this rung is about
keeping the memory system busy, not the tensor cores:

* **Split-KV**: the keys of each sequence are cut into ``num_splits`` ranges of whole key blocks
  (``split_key_range`` of ``_device.py``), one CTA each, so B·Hkv·num_splits CTAs fill the GPU
  however small B is. Each split writes its normalised partial O (fp32) and natural-log LSE; a
  second kernel merges them: lse = log Σₛ exp(lseₛ), O = Σₛ exp(lseₛ - lse) · Oₛ. With one split
  the split kernel writes O and the LSE itself and the merge is not launched. The split count is the
  shared rule of ``common/contract/splits.py`` (the one ``triton/decode`` uses), fed with this
  rung's CTAs per split, B·Hkv·m_blocks; ``bind(..., num_splits=n)`` forces a count.
* **GQA packing**: the ``group = H / Hkv`` query heads of one KV head share a CTA; their rows are
  stacked into one M tile, row r = (head in group) · Sq + token, so each K/V byte is read from HBM
  once per KV head. ``tile_m`` is group · Sq rounded up to a power of two from 16 (``mma.sync``'s M)
  to ``max_tile_m``; a larger group is cut into ``m_blocks`` tiles.
* **Warps split the keys, not the rows**: with 16 packed rows there is nothing to share among warps
  along M, so each warp takes its own ``keys_per_warp`` keys of every K/V block and runs its own online
  softmax: a split inside the split, the warps' partial O and LSE merged through shared memory at the end
  (:func:`merge_splits`, both kernels' formula, ``_decode_merge.py``). ``WARPS_SPLIT_ROWS`` (on) splits the rows
  first where a tile has more than 16 (``_decode_warps.py``; ``WIDE_M_TILE``, on: D=128's and D=256's 64-row tiles). Why
  ``mma.sync`` (SM80-style, warp-level), not WGMMA: a 64-row warpgroup tile would be three quarters padding for 16
  packed rows, and no MMA choice matters when the tensor cores idle on memory; ``mma.sync`` lets each warp own its
  keys and its softmax. With 64 or more packed rows the step is compute-bound and ``mma.sync`` (half WGMMA's tensor
  rate on sm_90) trails the WGMMA rungs: ``WGMMA_MIN_ROWS`` (64) runs those 64-row tiles on one warpgroup's WGMMA
  (``_decode_wgmma.py``).
* **Many packed rows on the prefill kernel** (``PACKED_PREFILL_MIN_ROWS``, 128): with 256 packed rows a K/V byte
  carries 256 FLOPs, past the read bandwidth's roofline, and the step is a prefill of group · Sq rows against the
  cache. Where its tiles fill the machine and the cache is contiguous (uneven cache lengths: 256 rows and
  ``splits.UNEVEN_MIN_WAVES`` waves of tiles, as a tile's work is its sequence's length), the step copies q to its
  packed rows and runs cute/hopper's persistent kernel on them (FlashAttention-3's pack-GQA;
  ``HopperAttentionConfig.packed_group``: each row's causal diagonal is its token's), writing O and the LSE in place:
  no split and no merge. With ``PACKED_PREFILL_SPLITS`` (on), a problem whose tiles fall short of the waves (B · Hkv
  small, long caches: seed 139 row 1's 32 tiles) takes the fewest key splits that fill them inside that kernel
  (``HopperAttentionConfig.key_splits``, FlashAttention-3's num_splits; each split several key blocks), fp32 partials
  merged by this rung's merge kernel (``_decode_packed_splits.py``, step 5 below), so that every contiguous row of many
  packed rows runs there.
* **The balanced split** (``BALANCED_SPLIT``, triton/decode's switch and plan, ``_decode_plan.py``):
  in a ragged batch the padded split leaves most of a short sequence's CTAs without a key while the
  long one's few carry its keys. Balanced, the grid is target_shares + B·Hkv CTAs per M tile (the shape
  fixes it: a CUDA graph replays it with new lengths); each CTA reads the B lengths, sizes a share as
  total key blocks / target_shares, finds its (batch, KV head, split) and stores its partials into the
  slab of its index; each item's first share also stores its (first slab, count), two int32, which the merge
  kernel reads (``MERGE_SLABS_FROM_SPLIT``; off: every merge thread walks the same plan again).
  The grid is (M tiles, slabs, 1), the M tile on x (``M_TILE_MAJOR``), so that a share's M tiles run together and
  read its K/V blocks once from DRAM, not once per M tile's pass (``splits.balanced_grid``). ``BALANCED_SHALLOW_RING``
  gives it a shallower ring where the grid spills past one wave of the table's CTA slots
  (:func:`balanced_ring_stages`; splits.py's "The balanced grid past one wave").
* **The two-level merge** (``BALANCED_MERGE_RUNS``, gluon/decode's ``BALANCED_MERGE_GROUP`` in this rung's separate
  merge kernel): the item-share cap (``BALANCED_MAX_ITEM_SHARES``) bounds the merge of one item's partials, a chain of
  dependent L2 round trips in one thread, but leaves a long item's shares longer than the others' (seed 73's B=4
  Hkv=2 paged row: its 164677-key sequence 48 shares of 54 key blocks against 33, the split's tail). The merge kernel
  instead cuts an item's partials into up to ``runs`` runs of consecutive slabs (:func:`merge_run`), each merged by
  its own threads, then merges the runs' results in run order through shared memory; the cap then counts a run's
  slabs, so that item takes 78 even shares, merged in runs of 10. The order depends on the plan alone: the same bits
  at every launch. ``runs`` is halved where the merge grid would pass one wave of the GPU's threads
  (:func:`balanced_merge_runs`: a merge of many items already runs their chains side by side).

Why a second kernel for the merge (as in ``triton/decode``): atomics on O would make the order of fp32
adds change from run to run, and "the last split to finish merges" needs a global counter per tile,
a fence and counters to reset under CUDA graphs. The merge kernel is launched from the same
``@cute.jit`` launcher right after the split kernel, so one host call runs both.

Shapes: q (B, H, Sq, D) with any 16-byte-aligned strides; k, v (B, Hkv, Sk, D); O (B, H, Sq, D) and
the LSE (B, H, Sq), contiguous and allocated here, so that the packed rows of one (batch, KV head)
are one (group · Sq, D) slab: the kernels see them as (B·Hkv, group · Sq, D) and (B·Hkv, group · Sq).
The split workspace is (num_splits, B·Hkv, group · Sq, D) and (num_splits, B·Hkv, group · Sq), fp32.

Algorithm (split kernel, grid (num_splits, m_blocks, B·Hkv); sections of :meth:`DecodeKernel.split_kernel`):
1. ``SeqlenInfo``: the sequence's own ``seqlen_k`` (its ``cache_seqlens`` entry) and causal_offset;
   the keys any row sees end at ``key_end`` (causal: at most Sq + causal_offset); :func:`split_block_range`
   (``split_key_range`` of ``_device.py``) gives this split's blocks ``[n_block_min, n_block_max)``,
   empty for a split past the sequence, and how many at its top take the mask.
2. Prologue: cp.async the packed Q tile (row r reads head kv_head · group + r // Sq, token r % Sq;
   rows past group · Sq zero-filled) and the first ``stages - 1`` K/V blocks, one commit group each;
   the top block of the split is the only one the sequence's end can cut, so only its loads are
   predicated (rows past ``seqlen_k`` zero-filled).
3. Main loop over the split's blocks, last first (the masked ones come first):
   a. refill the ring ``stages - 1`` blocks ahead, ``wait_group(stages - 1)``, barrier;
   b. each warp: S = Q Kᵀ, its rows by its ``keys_per_warp`` keys (ldmatrix, ``mma.sync.m16n8k16``);
   c. the top ``n_masked_blocks`` of a split: ``AttentionMask`` (-inf past ``seqlen_k`` and right of
      each row's diagonal, taken at the row's token, ``row % Sq``);
   d. ``OnlineSoftmax.update`` / ``rescale`` (the warp's own row_max and row_sum, lazy rescaling);
   e. O += P V over the warp's keys (P reused in registers, V via ``ldmatrix.trans``).
   Steps a, b and e are ``pipelined``'s, with a warp's keys for its tile (``refill_kv_ring``,
   ``scores``, ``values_product`` of ``_device.py``).
4. Epilogue: each warp's ``OnlineSoftmax.finalize`` (its O and natural-log LSE; no key: O = 0,
   LSE = -inf) goes to shared memory (the drained K/V ring); barrier; :func:`merge_splits` over the
   warps, row chunk by row chunk; the result goes to O (one split: cast to the output dtype, and the
   LSE if returned) or to this split's fp32 partials (and its LSE, always).
5. Merge kernel (more than one split; grid (row blocks, B·Hkv)): one thread per 4 columns of a row,
   :func:`merge_splits` over the splits' partials in HBM, its loops unrolled ``MERGE_SPLITS_PER_STEP``
   times so that as many splits' loads are in flight together, O cast to the output dtype, and the LSE.
   With ``runs`` > 1 (balanced): ``runs`` threads per 4 columns of a row, each merging its run of the item's slabs;
   each run's 4 columns and LSE go to shared memory (runs, rows, D + 1 fp32); barrier; the run-0 thread merges the
   runs (:func:`merge_splits` again) and stores.

Data movement: K and V HBM →(cp.async.cg, 16 B)→ a ``stages``-deep swizzled shared-memory ring
(``Swizzle<3,3,3>``, as ``pipelined``) →(ldmatrix / ldmatrix.trans)→ registers → ``mma.sync``
(fp32 accumulate). Q is read once per CTA. Each block is ``tile_n`` keys (64): K + V of one block is
32 KB at D=128, so ``stages - 1`` = 2 blocks, 64 KB, are in flight per CTA while one is computed, and
two CTAs fit per SM (``TILE_CONFIGS`` has the budget). Partials: one fp32 write and one read,
num_splits · rows · (D + 1) · 4 bytes, small beside the cache (two-level: each read once by its run's thread;
the runs' results, runs · rows · (D + 1) · 4 bytes a merge CTA, pass through shared memory). A paged
cache (``block_table``; pools (num_pages, page_size, Hkv, D), FlashAttention's and FlashInfer's NHD layout,
seen by the kernel as (num_pages, Hkv, page_size, D)) changes only where a K/V row comes from: each thread reads
its rows' pages from the block table and issues the same 16-byte cp.async chunks (``_device.PagedKV``), so
any page size of the contract (16 to 256 keys, not necessarily a multiple of ``tile_n``) works.

Constraints: fp16/bf16, D ∈ {64, 128, 256} (``TILE_CONFIGS``), 1 <= Sq <= ``MAX_SEQLEN_Q`` (a longer
Sq is prefill: use a prefill rung), softmax_scale > 0 (``row_max`` is max(S) · softmax_scale_log2),
sm_80 or newer (``mma.sync`` bf16, cp.async). GQA/MQA, causal top-left or bottom-right,
``cache_seqlens``, ``return_lse`` and a paged cache are implemented (compile-time flags; the GQA group
and the page size are runtime sizes). Not here: FP8 caches, a persistent scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Any, NamedTuple

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch

from common.contract import splits
from common.contract.capability import FEATURES, PAGED_KV
from common.contract.problem import Problem
from cute_impl import hopper as hopper_rung
from cute_impl._decode_merge import merge_run, merge_splits, merge_thread, store_item_slabs
from cute_impl._decode_plan import BalancedPlan, checked_item_cap, sequence_blocks, slab_range, split_block_range
from cute_impl._decode_warps import MMA_M, WarpTiles, max_tile_m, warp_split
from cute_impl._device import (
    LOG2_E,
    AttentionMask,
    KVCopy,
    LdmatrixOperands,
    OnlineSoftmax,
    PagedKV,
    SeqlenInfo,
    kv_copy_partitions,
    ldmatrix_operands,
    load_kv_block,
    refill_kv_ring,
    rows_by_cols,
    scores,
    values_product,
)
from cute_impl._hopper_host import DEFAULT_TILE_N, HopperAttentionConfig, default_config
from cute_impl._hopper_host import fake_arguments as hopper_fake_arguments
from cute_impl._hopper_host import tensor_arguments as hopper_tensor_arguments
from cute_impl._host import (
    CUTE_DTYPES,
    SWIZZLE_COLS,
    WARP_THREADS,
    CompiledKernels,
    Launch,
    RungHost,
    block_table_tensor,
    cache_seqlens_tensor,
    cp_async_tiled_copy,
    fake_block_table,
    fake_cache_seqlens,
    fake_stream,
    fake_tensor,
    generic_view,
    mma_sync_supports,
    positive_scale,
    qkv_ring_storage,
    static_head_dim_view,
    swizzled_qkv_layouts,
    warp_tiled_mma,
)

MAX_SEQLEN_Q = 16  # query tokens per step this rung takes; more is prefill
# mma.sync.m16n8k16 (MMA_M: ``_decode_warps.py``): a tile has at least 16 rows, a warp's keys and S's k-steps 16s.
MMA_K = 16
SMEM_ALIGN_BYTES = 1024
# The merges: each thread merges 4 fp32 columns of a row (16-byte loads); merge kernel CTAs of 4 warps.
MERGE_COLS, MERGE_THREADS = 4, 128
# Splits the merge kernel reads a step: its two loops over the splits (LSEs, then O) unrolled that many
# times, so that as many loads are in flight together (triton/decode's merge has the same name and
# meaning). 0 leaves the unrolling to the compiler, the merge before issue #38's decode floor (sm_90a:
# the LSE loop 16 times, the O loop only twice, num_splits / 2 round trips to L2), which
# bench/decode_floor.py sets to time both in one process.
MERGE_SPLITS_PER_STEP = 8


class TileShape(NamedTuple):
    """One entry of :data:`TILE_CONFIGS`."""

    tile_n: int  # keys per K/V block of the ring: num_warps · keys_per_warp
    stages: int  # depth of the cp.async ring (stages - 1 blocks in flight)
    num_warps: int  # each warp takes tile_n / num_warps keys of every block (rows split: _decode_warps.py)
    max_tile_m: int  # packed rows per CTA at most (O is max_tile_m · D / 32 fp32 registers per thread)
    pieces_per_k_step: int  # register double-buffering of O += P V: V's k-step loads in this many pieces


# Per head dim (bf16/fp16; 227 KiB of shared memory per SM): 4 warps of 16 keys per 64-key block.
#   D = 64:  a block is 16 KiB of K + V; 6 stages (96 KiB, 80 KiB in flight), up to 64 packed rows
#            (O 128 fp32 registers per thread).
#   D = 128: a block is 32 KiB; 3 stages (96 KiB, 64 KiB in flight), two CTAs per SM; up to 64 rows (WIDE_M_TILE).
#   D = 256: a block is 64 KiB; 3 stages (192 KiB, 128 KiB in flight, one CTA per SM); 16 rows (the row split:
#            32 where ``_decode_warps.ROW_SPLIT_MAX_TILE_M`` says, on; 64 under WIDE_M_TILE).
# The warps' partials take num_warps · tile_m · D · 4 bytes of the drained ring (64 KiB at most). The
# first H100 run (results/h100/decode/three-stacks-first/) is this table's; a deeper ring with one CTA
# per SM (4 stages at D = 128) is untimed.
TILE_CONFIGS = {
    64: TileShape(tile_n=64, stages=6, num_warps=4, max_tile_m=64, pieces_per_k_step=2),
    128: TileShape(tile_n=64, stages=3, num_warps=4, max_tile_m=32, pieces_per_k_step=2),
    256: TileShape(tile_n=64, stages=3, num_warps=4, max_tile_m=16, pieces_per_k_step=2),
}
HEAD_DIMS = tuple(sorted(TILE_CONFIGS))
# Issue #38's fifth stop, off: bench/decode_floor5.sh's call ran out before cute's rows (``splits.SplitPolicy``, as in
# triton/decode): the split rule's even work fills SPLIT_CTAS_PER_SM CTA slots per SM, at most the
# CTAS_PER_SM_FIT this table's rings leave room for; SHORT_CACHE_ONE_SPLIT keeps a short cache whose
# items fill a wave in one split (no merge kernel, a CTA's fixed cost paid once per item).
# bench/cute_decode_short_one_split_ab.sh timed SHORT_CACHE_ONE_SPLIT (H100, 2026-12-06, twenty-sixth stop,
# results/h100/cute-decode-short-one-split-2026-12-06/): of 13 rows that move (balanced -> one padded split), the ten
# at D=64 and 128 ran 0.81-0.97x the time on nine (seed 5309 row 1 92.7 -> 74.7 us, 53 -> 65 % of the read bandwidth)
# and 1.08x on one (147/7, paged(16) D=64); at D=256 1.25x (211/7) and 1.02x (53/5) against 0.95x (179/3): taken where
# it won (SHORT_CACHE_ONE_SPLIT_HEAD_DIMS), D=256 keeps the balanced split.
SPLIT_CTAS_PER_SM, SHORT_CACHE_ONE_SPLIT, SHORT_CACHE_ONE_SPLIT_HEAD_DIMS = 1, True, (64, 128)
# Seventh stop's switch, off until bench/decode_fewpairs_ab.sh (``splits.SplitPolicy.fewer_waves``).
FEWER_WAVES = False
CTAS_PER_SM_FIT = {64: 2, 128: 2, 256: 1}
# Issue #38's balanced split (triton/decode's plan, ``_decode_plan.py``; the switch's values in splits.py) where
# the rule splits a ragged batch (H200, results/h200/decode-balanced-gluon-cute/): B=16 MQA D=256 ragged 190.0
# -> 147.2 us, B=32 Hkv=2 D=64 ragged 197.8 -> 184.6, B=8 8k 85.0 -> 83.0; B=1 128k 138.1 -> 144.3: not there;
# "ragged-split-long" (also any call the rule splits past splits.LONG_CHAIN_SPLITS, a long merge chain): one sequence
# over two KV heads 65.4 -> 54.8 us (paged 16), 52.9 -> 45.1 (MQA D=256 Sq=8) (results/h200/decode-long-chain/).
BALANCED_SPLIT = "ragged-split-long"
# The item-share cap (splits.py; 0: none): 48, seed 43 MQA D=256 row 97.1 -> 84.8 us (results/h200/decode-ragged-cap/).
BALANCED_SHARES_PER_SM, BALANCED_MAX_ITEM_SHARES = 2, 48
# The target rule (splits.py's "The target rule"): "per-slot" against "per-sm" (H200, results/h200/decode-target/):
# seed 43's B=2 paged row 91.1 -> 72.8 us, B=64 Hkv=16 219.8 -> 204.0, B=8 MQA D=256 98.1 -> 83.7; none 2 % slower.
BALANCED_TARGET, BALANCED_MIN_KEYS = "per-slot", splits.MIN_KEYS_PER_SPLIT
# Balanced: the merge kernel reads each item's (first slab, count) that the item's first share stored, instead of
# every thread walking the plan over the batch twice (_decode_plan.py; ncu, seed 47 row 4: a 49 us merge, most of
# it the plan, beside a 249 us split). H200 (results/h200/decode-merge-plan/): that row 300.4 -> 263.7 us (graph),
# seed 43's B=64 Hkv=16 D=64 row 219.8 -> 180.1; the B=2 control level.
MERGE_SLABS_FROM_SPLIT = True
# The two-level merge (module docstring; 0 or 1: one chain an item): the most runs the merge kernel cuts an item's
# partials into, a power of two; the item-share cap counts a run's slabs (BALANCED_MAX_ITEM_SHARES · runs shares an
# item). 8 against 0 (H200, results/h200/decode-merge-group-cute/, bench/decode_merge_group_cute_ab.sh): seed 73's
# paged row 62.8 -> 47.8 us (48 capped shares -> 78 even ones), seed 43's MQA D=256 paged row 71.6 -> 59.3, no row
# slower (controls 1.00-1.01x).
BALANCED_MERGE_RUNS = 8
# A merge CTA holds runs · D / MERGE_COLS threads a row: 16 runs of a D=256 row fill 1024, a CTA's most. SM_THREADS:
# an SM's resident threads (sm_80, sm_90), one wave of which bounds the merge grid (balanced_merge_runs).
MAX_MERGE_RUNS, SM_THREADS = 16, 2048
# The balanced grid's M tile on x, the share on y (``splits.balanced_m_tile_major``; ncu, seed 47's B=64 MQA D=256
# paged row: 4 M tiles of 32 rows read about 4x its 213 MB cache from DRAM). H200 (results/h200/decode-mtile-major/):
# that row 304.0 -> 258.7 us, B=16 Hkv=2 Sq=4 D=256 paged(64) (2 M tiles) 164.7 -> 135.8; one M tile level.
M_TILE_MAJOR = True
WARPS_SPLIT_ROWS = True  # many packed rows (_decode_warps.py): 0.83-0.94x the time (results/h200/decode-row-split/)
# D=128's and D=256's 64-row tiles (_decode_warps.WIDE_M_TILES: seed 59 row 2's 64 rows in one M tile, not two). H200
# (results/h200/decode-cute-wide-tile/): that row 448.5 -> 324.1 us, its lengths contiguous 407.0 -> 304.2, in pages of
# 128 / 64 444.6 -> 319.0 / 448.5 -> 321.6; Sq=1 and D=64 (plans unchanged) level. D=256: 0.77-0.89x on 64-256 rows
# (results/h200/decode-d256-many-rows/).
WIDE_M_TILE = True
# Head dim -> the ring's stages where the balanced grid spills past one wave of the table's CTA slots (CTAS_PER_SM_FIT;
# ``splits.balanced_grid_spills``, splits.py's "The balanced grid past one wave"). {64: 4}: a 64 KB ring, three CTAs
# an SM (sm_90a: 168 registers at 64 rows, 124 at 16), not six stages' two, so seed 73's 392-CTA 64-row row runs every
# share at once. The plan stays. H200 (results/h200/decode-shallow-ring/): 0.77-0.90x on the four rows that spill (seed
# 73's 90.6 -> 73.9 us, seed 71's paged 357.2 -> 274.7), one-wave and many-wave rows 1.00x. {128: 2}: a two-stage
# D=128 ring (70 KB, 128 registers at 16 rows: three CTAs an SM, not three stages' two), seed 131 row 4's 392-CTA
# paged(32) grid 93.3 -> 84.5 us, 107/1 0.96x, 128/5 0.95x, 90/1 (64 rows, still two an SM) 0.99x, control 1.00x (H200,
# 2026-12-02, results/h200/decode-seed131-rings/).
BALANCED_SHALLOW_RING: dict[int, int] = {64: 4, 128: 2}
# Issue #38's compute-bound class (64+ packed rows a KV head): a 64-row tile of at least this many packed rows runs on
# one warpgroup's WGMMA (``_decode_wgmma.py``; sm_90a only), not 4 warps' mma.sync; 0: never. At 128: seed 107 row 0
# 362.7 -> 294.0 us, 103/0 540.1 -> 402.1, D=64's 128 rows 0.85-0.91x, controls 1.00x (results/h200/cute-decode-wgmma/).
# At 64 (the tiles of 64-127 rows too, the WGMMA tile's two-CTA ask doubling a padded split): seed 137 row 1 (80 rows,
# D=64) 214.8 -> 125.9 us, 97/7 0.70x, the other seven sweep rows of 64-127 rows 0.84-0.97x, controls 1.00x (H200,
# 2026-12-02, results/h200/cute-decode-wgmma-64/). WGMMA_HEAD_DIMS: those compiled.
WGMMA_MIN_ROWS, WGMMA_HEAD_DIMS = 64, (64, 128)
# Issue #38's D=256 rows of 64+ packed rows (seed 229 row 2: 256 rows, cute 2092.0 us against gluon's 1206.9, 39 % of
# the tensor roofline on mma.sync): WGMMA_D256 adds 256 to WGMMA_HEAD_DIMS with the WGMMA tile's ring as (keys a
# block, stages); None: D=256 stays on mma.sync. Both rings are 224 KB (Q 32 KB, K and V 256 keys' worth), one CTA an
# SM, so the split rule's WGMMA ask reads CTAS_PER_SM_FIT's one. (64, 3): TILE_CONFIGS' ring, short of the overlap's
# WGMMA_OVERLAP_MIN_STAGES, so the one chain a block; (32, 6): 32-key blocks, deep enough for the overlap (sm_90a:
# 204-211 registers, no spills). H200, 2026-12-04 (results/h200/decode-many-rows-2026-12-04/, 2 rounds): the seven
# rows of 128-256 packed rows at D=256 0.69-0.75x on either ring (229/2 2109.6 -> 1476.7 us at (64, 3), 1482.7 at
# (32, 6): the overlap buys nothing here), the control 1.00x; (64, 3) taken, the shorter loop.
WGMMA_D256: tuple[int, int] | None = (64, 3)
WGMMA_D256_RINGS = ((64, 3), (32, 6))
# The WGMMA tile's ask of the split rule: two CTAs an SM (its ring leaves room for them), so that one CTA's softmax
# runs under the other's wgmmas where the grid held one an SM: 107/0 295.2 -> 209.7 us, paged(64) 377.4 -> 256.7, rows
# already past a wave 1.00x; the same ask of the mma.sync tile cost 107/0 at Sq=1 1.02x (H200, 2026-12-02,
# results/h200/cute-decode-wgmma-split/).
WGMMA_SPLIT_CTAS_PER_SM = 2
# Issue #38, the WGMMA tile's overlap inside the warpgroup (cute/hopper's ``next_block``): each block issues its
# S = Q Kᵀ with the previous block's O += P V and runs its softmax while that P V is on the tensor cores, instead of one
# chain (S, wait, softmax, P V, wait) a block. The price is one block fewer in flight in the ring (the previous block's
# V is still read): taken where the ring has at least WGMMA_OVERLAP_MIN_STAGES stages (0: never), so that two or more
# blocks stay in flight. H200, 2026-12-02 (results/h200/cute-decode-wgmma-overlap/, every WGMMA ring overlapped):
# D=64's 6 stages 0.93x and 0.95x; D=128's 3 stages (one block in flight) 103/0 1.08x, paged(64) 1.04x, 107/0 1.00x.
WGMMA_OVERLAP_MIN_STAGES = 4
# Issue #38's 128-256 packed rows at D=128 (seed 233 row 5, 256 rows: cute 789.4 us, gluon's two consumers 656.0): two
# of the WGMMA tile's 64-row M tiles in one CTA of two warpgroups sharing one K/V ring (``_decode_wgmma.py``, "Two
# warpgroups"), so that a block is read from L2 once per 128 rows and one warpgroup's softmax runs under the other's
# wgmmas in one CTA, not across two. Padded split only (the balanced split keeps one warpgroup: its two-warpgroup
# candidate lost, below), head dim -> the ring's stages: Q (32 KB) and 6 blocks of 32 KB fill the SM, one CTA (the
# split rule's ask), deep enough for the overlap.
# Built for rows of two tiles or more, which the packed prefill now takes on contiguous caches; on by default for the
# 65-127 rows where it was timed to pay (TWO_WARPGROUP_MIN_ROWS and TWO_WARPGROUP_MAX_ROWS below).
# TWO_WARPGROUP_RINGS: the head dims it takes and their ring's stages. D=64 is not in it: {64: 8} and {64: 10} (Q 16
# KB and eight or ten 16 KB blocks; sm_90a: 143 registers, no spills) ran 1.02-1.13x the time of two 64-row CTAs a
# split on every D=64 row they took (H100, 2026-12-06, bench/cute_decode_two_wg_d64_ab.sh,
# results/h100/cute-decode-two-wg-candidates-2026-12-06/: 137/1 128.1 -> 143.9 us), whose two CTAs an SM already run
# one's softmax under the other's loads.
WGMMA_TWO_WARPGROUPS = True
TWO_WARPGROUP_RINGS = {128: 6}
WARPGROUP_ROWS, TWO_WARPGROUP_CTAS_PER_SM = 64, 1
# Issue #38's 65-127 packed rows at D=128 (seed 1206 row 1: B=8 H=10 Hkv=2 Sq=16 Sk=66304, 80 rows, 8 padded splits;
# H100, 2026-12-06: triton 200.8 us, gluon's two consumers 203.2, cute 263.9, 87/86/66 % of the read bandwidth, cute
# on two 64-row CTAs a split): the fewest packed rows WGMMA_TWO_WARPGROUPS' CTA takes. Below two tiles' rows its
# second warpgroup is part padding (80 rows: 48 of its 64), but each K/V block is read once per CTA, not once per
# 64-row CTA, as triton's one 128-row tile and gluon's two consumers read it. The kernel pads such a CTA as it pads
# the one-warpgroup tile: Q zero-filled past group · Sq (``load_packed_q``), so S is finite; a padded row's causal
# diagonal is its row % Sq, a real token's; no row past group · Sq is stored (``merge_warps_and_store``), nor read by
# the merge. A wholly padded second warpgroup (192 rows' second CTA) runs the same loop on zeros. One tile's rows (64
# or fewer) never take it, whatever this says: its second warpgroup would be all padding. H100, 2026-12-06, off
# against on from 65 rows (results/h100/cute-decode-two-wg-rows-2026-12-06/, cute-decode-two-wg-left-2026-12-06/):
# every 80-row row of the sweep 0.58-0.90x (1206/1 255.6 -> 192.0 us, 67 -> 89 %; 56/0 1552.4 -> 896.2), controls
# 1.00x. TWO_WARPGROUP_MAX_ROWS: the most packed rows it takes (None: no bound). Of the rows of two tiles or more the
# packed prefill leaves (paged or ragged), 7/3 (256 rows, paged 16) gained 0.93x but 69/4 (128 rows, ragged, 1 split
# of at most 12 key blocks) lost 2.20x: one CTA an SM has no other CTA to run under a short split's fill and drain.
TWO_WARPGROUP_MIN_ROWS = WARPGROUP_ROWS + 1
TWO_WARPGROUP_MAX_ROWS: int | None = 2 * WARPGROUP_ROWS - 1
# The balanced split's shares of 65-127 packed rows on the same CTA (86/4 at 54 % of the read bandwidth; the same
# shares, the 6-stage ring) lost on an H100, 2026-12-06: 0.97-1.06x the one-warpgroup tiles' time over nine rows
# (86/4 1.03x; results/h100/cute-decode-two-wg-candidates-2026-12-06/). Each share is a few key blocks an item, and one
# CTA an SM has no other to run under its fill and drain. Removed after that A/B (ced40d1 built it).
# Issue #38's compute-bound class on cute/hopper's kernel (FlashAttention-3's pack-GQA): a contiguous cache of at least
# this many packed rows (group · Sq) a KV head runs cute/hopper's persistent forward on q packed as (B, Hkv, group · Sq,
# D) (``HopperAttentionConfig.packed_group``: each row's causal diagonal is its token's), 128-row tiles over all of a
# sequence's keys, no split and no merge, where those tiles fill at least PACKED_PREFILL_MIN_WAVE_SHARE of the grid's
# waves (that kernel does not split the keys: a grid short of the SMs stays on the split kernels). 256 packed rows ask
# 256 FLOPs a K/V byte, past the read bandwidth's roofline, where cute/hopper's loop runs at 670-690 TFLOP/s (P1) and
# the WGMMA tile's at about 470 (233/5 on H100, 2026-12-05: 860.3 us split, 561.7 packed; None turns it off).
# Uneven work (cache lengths over more than one sequence, ``splits``' module docstring): a tile runs its sequence's
# length, unknown to the plan, so a grid of one wave waits on the longest sequence (H100, 2026-12-05: 214/0, 128 tiles,
# lengths 21..129169, 2.59x the split kernels' time) and short uneven tiles pay their prologue on a few blocks (69/4,
# 128 rows, lengths 20..1426: 1.27x). Such a problem takes the packed prefill only at PACKED_PREFILL_UNEVEN_MIN_ROWS
# packed rows and ``splits.UNEVEN_MIN_WAVES`` waves of tiles, so that a freed SM takes the next tile (176/6, 256 rows,
# 3.9 waves, lengths 23..6920: 0.75x). Full caches take it from 128 rows (157/4 0.89x, 204/4 0.87x, 140/1 0.95x;
# 256-row rows 0.63-0.90x; results/h100/decode-packed-prefill-2026-12-05/).
PACKED_PREFILL_MIN_ROWS: int | None = 128
PACKED_PREFILL_UNEVEN_MIN_ROWS = 256
PACKED_PREFILL_MIN_WAVE_SHARE = 0.9
# Issue #38's rows of many packed rows but few tiles (B · Hkv small, long caches: seed 139 row 1's 32 tiles, 107/0's 64
# on 132 SMs): the packed prefill splits the keys inside cute/hopper's kernel (``HopperAttentionConfig.key_splits``,
# FlashAttention-3's num_splits), the fewest splits whose tiles fill PACKED_PREFILL_MIN_WAVE_SHARE of the waves with at
# least PACKED_PREFILL_MIN_SPLIT_BLOCKS key blocks of 128 keys a split (a split's Q load, first masked block and
# partials' write are paid once, so a split keeps several blocks) and at most PACKED_PREFILL_MAX_SPLITS (the merge's
# chain a row), then cute/decode's merge kernel (``_decode_packed_splits.py``). False: such rows stay on the split
# kernels. H100, 2026-12-05 (bench/packed_prefill_defaults_check.sh, results/h100/decode-packed-prefill-2026-12-05/):
# 0.61-0.74x the split kernels' time on eight of its twelve rows (four never timed before), 0.87x on 248/4, 1.00-1.01x
# on 246/0 and the controls, 1.05x on 228/0 (two tiles of 60 splits against the balanced split at 89 % of the
# bandwidth).
PACKED_PREFILL_SPLITS = True
PACKED_PREFILL_MIN_SPLIT_BLOCKS = 4
PACKED_PREFILL_MAX_SPLITS = 128
DECODE_FEATURES = (*FEATURES, PAGED_KV)  # every problem feature, and the paged KV cache (pages of 16 to 256 keys)


@dataclass(frozen=True)
class DecodeConfig:
    """Everything that changes the generated code (the compile-cache key)."""

    dtype: torch.dtype
    head_dim: int
    tile_m: int  # packed rows per CTA (a power of two, 16 .. shape.max_tile_m)
    shape: TileShape
    causal: bool
    bottom_right: bool  # causal diagonal shifted by causal_offset = seqlen_k - Sq
    has_cache_seqlens: bool  # a (B,) int32 kernel argument: each sequence's seqlen_k
    return_lse: bool  # O's LSE is returned (B, H, Sq)
    split: bool  # more than one split: partials, then the merge kernel
    paged: bool = False  # K and V are page pools read through a (B, max_pages_per_seq) int32 block table
    merge_splits_per_step: int = MERGE_SPLITS_PER_STEP  # the merge kernel's unrolling over the splits
    balanced_min_blocks: int = 0  # the balanced split's least share in key blocks; 0: the padded split
    row_warps: int = 1  # warps along M (``_decode_warps.py``; WARPS_SPLIT_ROWS): 1, the warps split the keys
    balanced_max_shares: int = 0  # the balanced split's most shares an item (BALANCED_MAX_ITEM_SHARES · merge_runs)
    merge_slabs_from_split: bool = False  # balanced: the merge reads the item slabs (MERGE_SLABS_FROM_SPLIT)
    m_tile_major: bool = False  # the balanced grid's M tile on x, the share on y (M_TILE_MAJOR)
    merge_runs: int = 1  # balanced: the merge kernel's runs an item (BALANCED_MERGE_RUNS); 1: one chain
    wgmma: bool = False  # the 64-row tile on one warpgroup's WGMMA (WGMMA_MIN_ROWS, _decode_wgmma.py; sm_90a)
    wgmma_overlap: bool = False  # S of a block issued with the previous P V (WGMMA_OVERLAP_MIN_STAGES)
    two_warpgroups: bool = False  # two 64-row WGMMA tiles a CTA on one ring (WGMMA_TWO_WARPGROUPS)

    @property
    def keys_per_warp(self) -> int:
        return self.shape.tile_n * self.row_warps // self.shape.num_warps


class CtaWork(NamedTuple):
    """What one CTA of a split kernel works on (:meth:`DecodeKernel.cta_work`): its packed M tile, its share of the
    keys (the grid's split, or under the balanced split the slab the plan maps to an item and split), that item's
    (batch, KV head), the sequence's lengths and the split's key blocks."""

    m_block: Any
    share: Any  # the grid's split index: under the balanced split, this CTA's partial slab
    split: Any
    num_splits: Any
    batch: Any
    kv_head: Any
    kv_heads: Any
    batch_kv_head: Any  # the grid's item (padded split): the row of O and of the partials
    has_work: Any  # False for a balanced CTA past the last share
    seqlen: SeqlenInfo
    block_range: Any
    n_blocks: Any
    seqlen_q: Any
    group: Any
    rows: Any  # group · Sq packed rows


class DecodeKernel:
    """The split kernel and the merge kernel, launched together by :meth:`__call__`."""

    def __init__(self, config: DecodeConfig):
        self.config = config
        self.head_dim = config.head_dim
        self.tile_m = config.tile_m
        self.tile_n = config.shape.tile_n
        self.stages = config.shape.stages
        self.num_warps = config.shape.num_warps
        self.threads_per_cta = self.num_warps * WARP_THREADS
        self.keys_per_warp, self.key_warps = config.keys_per_warp, self.num_warps // config.row_warps
        self.causal = config.causal
        self.bottom_right = config.bottom_right
        self.split = config.split
        # The split kernel stores an LSE as a split's partial, or as O's when it is returned.
        self.store_lse = config.split or config.return_lse
        if config.merge_slabs_from_split and not config.balanced_min_blocks:
            raise ValueError(f"the merge reads item slabs only under the balanced split, got {config}")
        # Balanced: the merge kernel plans afresh which slabs hold its item's partials, unless it reads them.
        self.merge_plans = bool(config.balanced_min_blocks) and not config.merge_slabs_from_split
        if config.merge_runs > 1 and not config.balanced_min_blocks:
            raise ValueError(f"the merge runs only under the balanced split, got {config}")
        # The merge kernel: a thread per MERGE_COLS columns of a row and run, MERGE_THREADS (at least one row) a CTA.
        merge_row_threads = self.head_dim // MERGE_COLS * config.merge_runs
        self.merge_rows_per_cta = max(MERGE_THREADS // merge_row_threads, 1)
        self.merge_threads = self.merge_rows_per_cta * merge_row_threads
        if self.keys_per_warp % MMA_K or self.tile_m % (MMA_M * config.row_warps):
            raise ValueError(f"keys per warp and tile_m must be multiples of 16, got {config}")
        # The warps' fp32 partials (O and LSE) reuse the drained K/V ring (16-bit elements).
        ring_bytes = 2 * self.tile_n * self.head_dim * self.stages * 2
        parts_bytes = self.key_warps * self.tile_m * (self.head_dim + 1) * 4
        if parts_bytes > ring_bytes:
            raise ValueError(f"the warps' partials ({parts_bytes} B) exceed the K/V ring ({ring_bytes} B): {config}")

    # ------------------------------------------------------------------------------------------
    # Host side of the launch: views, layouts, copy atoms, the warp's MMA, both grids.
    # ------------------------------------------------------------------------------------------
    @cute.jit
    def __call__(
        self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor | None,
        mOPartial: cute.Tensor | None, mLSEPartial: cute.Tensor | None, mItemSlabs: cute.Tensor | None,
        mCacheSeqlens: cute.Tensor | None, mBlockTable: cute.Tensor | None, softmax_scale: cutlass.Float32,
        stream: cuda.CUstream,
    ):  # fmt: skip
        """q (B, H, Sq, D), k, v (B, Hkv, Sk, D); mO (B·Hkv, group·Sq, D) and mLSE (B·Hkv, group·Sq) or
        None: the packed rows of O and its LSE; mOPartial (num_splits, B·Hkv, group·Sq, D) and
        mLSEPartial (num_splits, B·Hkv, group·Sq), fp32, when split, else None; mItemSlabs (B·Hkv, 2) int32
        where the merge reads the item slabs (``merge_slabs_from_split``), else None; mCacheSeqlens (B,)
        int32 or None; paged, k and v are pools (num_pages, Hkv, page_size, D) and mBlockTable the
        (B, max_pages_per_seq) int32 table, else None. None-ness is compile time."""
        dtype = mQ.element_type
        mQ, mK, mV, mO, mOPartial, mCacheSeqlens, mBlockTable = self.launch_views(
            mQ, mK, mV, mO, mOPartial, mCacheSeqlens, mBlockTable
        )  # fmt: skip
        sQ_layout, sKV_layout = swizzled_qkv_layouts(self.tile_m, self.tile_n, self.head_dim, self.stages)
        # The key slices' partial O (key_warps, tile_m, D) and LSE (key_warps, tile_m), fp32, in the ring.
        sO_parts_layout = cute.make_layout(
            (self.key_warps, self.tile_m, self.head_dim), stride=(self.tile_m * self.head_dim, self.head_dim, 1)
        )
        sLSE_parts_layout = cute.make_layout((self.key_warps, self.tile_m), stride=(self.tile_m, 1))
        self.split_kernel(
            mQ, mK, mV, mO, mLSE, mOPartial, mLSEPartial, mItemSlabs, mCacheSeqlens, mBlockTable,
            softmax_scale * LOG2_E, sQ_layout, sKV_layout, sO_parts_layout, sLSE_parts_layout,
            # 8 threads cover one 64-element swizzle row with 16 B each.
            cp_async_tiled_copy(dtype, self.threads_per_cta, row_elems=SWIZZLE_COLS),
            # One warp's MMA: each warp multiplies all tile_m rows by its own keys.
            warp_tiled_mma(dtype, WARP_THREADS),
            qkv_ring_storage(dtype, sQ_layout, sKV_layout, SMEM_ALIGN_BYTES),
        ).launch(grid=self.split_grid(mO, mOPartial), block=[self.threads_per_cta, 1, 1], stream=stream)  # fmt: skip
        self.launch_merge(mQ, mK, mO, mLSE, mOPartial, mLSEPartial, mItemSlabs, mCacheSeqlens, mBlockTable, stream)

    def launch_views(
        self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mOPartial: cute.Tensor | None,
        mCacheSeqlens: cute.Tensor | None, mBlockTable: cute.Tensor | None,
    ) -> tuple:  # fmt: skip
        """The tensors as the split kernels read them: the head dim static, the plan's inputs through generic
        pointers (``_host.generic_view``), as they were compiled and measured."""
        mQ, mK, mV, mO = [static_head_dim_view(t, self.head_dim) for t in (mQ, mK, mV, mO)]
        if self.split:
            mOPartial = static_head_dim_view(mOPartial, self.head_dim)
        return mQ, mK, mV, mO, mOPartial, generic_view(mCacheSeqlens), generic_view(mBlockTable)

    def split_grid(self, mO: cute.Tensor, mOPartial: cute.Tensor | None) -> tuple:
        """(splits, M tiles, items); balanced, one CTA per partial slab (the partials' first extent) and M tile,
        each planning its item, with the M tile on x (``m_tile_major``) so that a share's M tiles run together."""
        num_splits = mOPartial.shape[0] if self.split else 1
        grid_items = 1 if self.config.balanced_min_blocks else mO.shape[0]
        grid = (num_splits, cute.ceil_div(mO.shape[1], self.tile_m), grid_items)
        return (grid[1], grid[0], grid_items) if self.config.m_tile_major else grid

    def launch_merge(
        self, mQ: cute.Tensor, mK: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor | None,
        mOPartial: cute.Tensor | None, mLSEPartial: cute.Tensor | None, mItemSlabs: cute.Tensor | None,
        mCacheSeqlens: cute.Tensor | None, mBlockTable: cute.Tensor | None, stream: cuda.CUstream,
    ) -> None:  # fmt: skip
        """The merge kernel after a split kernel that wrote partials (none unsplit)."""
        if self.split:
            plan_inputs = (mQ, mK, mCacheSeqlens, mBlockTable) if self.merge_plans else (None,) * 4
            self.merge_kernel(mOPartial, mLSEPartial, mO, mLSE, *plan_inputs, mItemSlabs).launch(
                grid=(cute.ceil_div(mO.shape[1], self.merge_rows_per_cta), mO.shape[0], 1),
                block=[self.merge_threads, 1, 1],
                stream=stream,
            )

    # ------------------------------------------------------------------------------------------
    # Kernel 1: one split of the keys for one packed M tile of one (batch, KV head).
    # ------------------------------------------------------------------------------------------
    @cute.kernel
    def split_kernel(
        self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor | None,
        mOPartial: cute.Tensor | None, mLSEPartial: cute.Tensor | None, mItemSlabs: cute.Tensor | None,
        mCacheSeqlens: cute.Tensor | None, mBlockTable: cute.Tensor | None, softmax_scale_log2: cutlass.Float32,
        sQ_layout: cute.ComposedLayout, sKV_layout: cute.ComposedLayout, sO_parts_layout: cute.Layout,
        sLSE_parts_layout: cute.Layout, gmem_tiled_copy: cute.TiledCopy, warp_mma: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):  # fmt: skip
        tidx, _, _ = cute.arch.thread_idx()
        # ---- 1. This sequence's keys and this split's blocks of them ---------------------------
        work = self.cta_work(mQ, mK, mO, mOPartial, mCacheSeqlens, mBlockTable)
        warp_index = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()
        m_block, seqlen, block_range, n_blocks = work.m_block, work.seqlen, work.block_range, work.n_blocks

        # ---- Tiles: HBM views, shared memory, each warp's share of a block ----------------------
        gK, gV, pages, cKV = self.kv_views(mK, mV, mBlockTable, work)
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout)  # (tile_m, D)
        sK = storage.sKV.get_tensor(sKV_layout)  # (tile_n, D, stages)
        sV = cute.make_tensor(sK.iterator + cute.cosize(sKV_layout), sKV_layout)  # (tile_n, D, stages)
        # This warp's rows of Q and keys of every block (``_decode_warps.py``): Q (rows_per_warp, D), K
        # (keys_per_warp, D, stages), V as the B operand of O += P V (D, keys_per_warp, stages).
        warps = WarpTiles(self.tile_m, self.tile_n, self.head_dim, self.num_warps, self.config.row_warps, warp_index)
        sQ_warp, sK_warp, sVt_warp = warps.operands(sQ, sK, sV)

        gmem_thr_copy = gmem_tiled_copy.get_slice(tidx)
        kv_copy = kv_copy_partitions(gmem_tiled_copy, gmem_thr_copy, gK, sK, gV, sV, cKV, pages)

        thr_mma = warp_mma.get_slice(lane)
        tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ_warp))  # (MMA, MMA_M, MMA_K)
        tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sK_warp[None, None, 0]))  # (MMA, MMA_N, MMA_K)
        tOrVt = thr_mma.make_fragment_B(thr_mma.partition_B(sVt_warp[None, None, 0]))  # (MMA, MMA_D, MMA_K)
        tile_o = (warps.rows_per_warp, self.head_dim)
        acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C(tile_o), cutlass.Float32)  # (MMA, MMA_M, MMA_D)
        acc_O.fill(0.0)

        smem_operands = ldmatrix_operands(warp_mma, lane, sQ_warp, sK_warp, sVt_warp, tSrQ, tSrK, tOrVt)

        rows_per_thread = cute.size(acc_O, mode=[0, 1]) * cute.size(acc_O, mode=[1])
        softmax = OnlineSoftmax(rows_per_thread, softmax_scale_log2)
        # Rows and keys counted in the warp's sub-tiles: its row block and its keys' sub-block of each block.
        mask = AttentionMask(
            warps.rows_per_warp, self.keys_per_warp, self.causal, warp_mma, lane, warps.mask_m_block(m_block), seqlen,
            packed_seqlen_q=work.seqlen_q,
        )  # fmt: skip

        # ---- 2. Prologue: the packed Q tile and the first stages-1 K/V blocks in flight ----------
        self.load_packed_q(
            gmem_tiled_copy, gmem_thr_copy, mQ, sQ, work.batch, work.kv_head, work.group, m_block, work.rows
        )  # fmt: skip
        for stage in cutlass.range_constexpr(self.stages - 1):
            if stage < n_blocks:
                # Q joins the group of the first block; only that block can be cut by seqlen_k.
                load_kv_block(
                    kv_copy, block_range.n_block_max - 1 - stage, stage, seqlen.seqlen_k, predicated=stage == 0
                )
            cute.arch.cp_async_commit_group()

        # ---- 3. Main loop: the masked blocks first (they top the split), then the rest -----------
        attend = partial(
            self.attend_block,
            kv_copy,
            warp_mma,
            smem_operands,
            tSrQ,
            tSrK,
            tOrVt,
            acc_O,
            softmax,
            mask,
            warps,
            block_range.n_block_max,
            n_blocks,
            seqlen.seqlen_k,
        )
        for step in cutlass.range_constexpr(block_range.n_masked_blocks):
            if step < n_blocks:
                attend(step, masked=True)
        for step in cutlass.range(block_range.n_masked_blocks, n_blocks, 1):
            attend(step, masked=False)
        cute.arch.cp_async_wait_group(0)

        # ---- 4. Epilogue: each warp's O and LSE, merged over the warps, stored ------------------
        lse = cute.make_rmem_tensor(rows_per_thread, cutlass.Float32)
        softmax.finalize(acc_O, lse)
        # Every warp is done with the ring (and no cp.async is in flight): it becomes the merge's scratch.
        cute.arch.barrier()
        sO_parts = storage.sKV.get_tensor(sO_parts_layout, dtype=cutlass.Float32)  # (key_warps, tile_m, D)
        sLSE_parts = cute.make_tensor(sO_parts.iterator + cute.cosize(sO_parts_layout), sLSE_parts_layout)
        self.store_warp_part(thr_mma, acc_O, lse, *warps.part(sO_parts, sLSE_parts))
        cute.arch.barrier()
        gO, gLSE, rows = self.output_slices(mO, mLSE, mOPartial, mLSEPartial, mItemSlabs, work, tidx)
        self.merge_warps_and_store(sO_parts, sLSE_parts, gO, gLSE, m_block * self.tile_m, rows, tidx)

    def cta_work(
        self, mQ: cute.Tensor, mK: cute.Tensor, mO: cute.Tensor, mOPartial: cute.Tensor | None,
        mCacheSeqlens: cute.Tensor | None, mBlockTable: cute.Tensor | None,
    ) -> CtaWork:  # fmt: skip
        """This CTA's :class:`CtaWork` from its block index: the padded split's (split, M tile, item), or the balanced
        split's (slab, M tile) planned into an item and split (``balanced_plan``); the split's key blocks."""
        if self.config.m_tile_major:  # the balanced grid's axes swapped (M_TILE_MAJOR)
            m_block, split, batch_kv_head = cute.arch.block_idx()
        else:
            split, m_block, batch_kv_head = cute.arch.block_idx()
        num_splits, _, _ = cute.arch.grid_dim()  # the padded split's (balanced: the plan's, below)
        kv_heads = mK.shape[1]
        batch = batch_kv_head // kv_heads
        kv_head = batch_kv_head - batch * kv_heads
        seqlen_q = mQ.shape[2]
        group, rows = mQ.shape[1] // kv_heads, mO.shape[1]
        capacity = self.cache_capacity(mK, mBlockTable)
        share, has_work = split, True
        if self.config.balanced_min_blocks:
            plan = self.balanced_plan(mQ, mK, mCacheSeqlens, mBlockTable, mOPartial.shape[0] - mO.shape[0])
            batch, kv_head, split, num_splits, has_work = plan.share(share)
        seqlen = SeqlenInfo.create(batch, seqlen_q, capacity, mCacheSeqlens, self.bottom_right)
        block_range = split_block_range(split, num_splits, seqlen, seqlen_q, self.tile_n, self.causal)
        n_blocks = block_range.n_block_max - block_range.n_block_min
        return CtaWork(
            m_block, share, split, num_splits, batch, kv_head, kv_heads, batch_kv_head, has_work, seqlen, block_range,
            n_blocks, seqlen_q, group, rows,
        )  # fmt: skip

    def kv_views(self, mK: cute.Tensor, mV: cute.Tensor, mBlockTable: cute.Tensor | None, work: CtaWork) -> tuple:
        """(gK, gV, pages, cKV): the item's K and V tiled by blocks (tile_n, D, n_blocks), or under a paged cache
        none and its pages (each row of a block gathered from its page, ``load_kv_block``); the blocks' (key, d)."""
        tile_kv = (self.tile_n, self.head_dim)
        gK = gV = pages = None
        if self.config.paged:
            pages = PagedKV(mK, mV, work.kv_head, mBlockTable[work.batch, None], mK.shape[2])
        else:
            gK = cute.local_tile(mK[work.batch, work.kv_head, None, None], tile_kv, (None, 0))
            gV = cute.local_tile(mV[work.batch, work.kv_head, None, None], tile_kv, (None, 0))
        cKV = cute.local_tile(cute.make_identity_tensor((work.seqlen.seqlen_k, self.head_dim)), tile_kv, (None, 0))
        return gK, gV, pages, cKV

    def output_slices(
        self, mO: cute.Tensor, mLSE: cute.Tensor | None, mOPartial: cute.Tensor | None,
        mLSEPartial: cute.Tensor | None, mItemSlabs: cute.Tensor | None, work: CtaWork, tidx: Any,
    ) -> tuple:  # fmt: skip
        """(gO, gLSE, rows) this CTA stores: its share's slab (balanced; no rows past the last share, and the item's
        slabs where the merge reads them), its split's partials, or O and the LSE themselves."""
        rows = work.rows
        if self.config.balanced_min_blocks:
            gO, gLSE = mOPartial[work.share, 0, None, None], mLSEPartial[work.share, 0, None]  # this share's slab
            rows = cutlass.Int32(cutlass.select_(work.has_work, rows, 0))  # a CTA past the last share: no store
            # Here, not where the plan is made: there ptxas kept the slabs' address over the key loop (an 8-byte
            # stack frame at D=64 paged). The merge kernel runs after this launch, so the place is free.
            if self.config.merge_slabs_from_split:
                item_slabs = mItemSlabs[work.batch * work.kv_heads + work.kv_head, None]
                store_item_slabs(item_slabs, work.share, work.split, work.num_splits, tidx, work.m_block)
        elif self.split:
            gO = mOPartial[work.split, work.batch_kv_head, None, None]  # (rows, D) fp32
            gLSE = mLSEPartial[work.split, work.batch_kv_head, None]  # (rows,)
        else:
            gO = mO[work.batch_kv_head, None, None]  # (rows, D)
            gLSE = mLSE[work.batch_kv_head, None] if self.store_lse else None  # (rows,)
        return gO, gLSE, rows

    @cute.jit
    def cache_capacity(self, mK: cute.Tensor, mBlockTable: cute.Tensor | None) -> cutlass.Int32:
        """The cache's capacity in keys: Sk, or the block table's pages of page_size keys."""
        capacity = mK.shape[2]
        if cutlass.const_expr(self.config.paged):
            capacity = mK.shape[2] * mBlockTable.shape[1]
        return capacity

    def balanced_plan(
        self, mQ: cute.Tensor, mK: cute.Tensor, mCacheSeqlens: cute.Tensor | None, mBlockTable: cute.Tensor | None,
        target_shares: cutlass.Int32,
    ) -> BalancedPlan:  # fmt: skip
        """The balanced split's plan (``_decode_plan.py``) over the batch of q; a sequence's blocks are
        those its rows see (:func:`split_block_range` of one split), as the split kernel walks them."""
        blocks_of = partial(
            sequence_blocks, seqlen_q=mQ.shape[2], capacity=self.cache_capacity(mK, mBlockTable),
            cache_seqlens=mCacheSeqlens, bottom_right=self.bottom_right, causal=self.causal, tile_n=self.tile_n,
        )  # fmt: skip
        sizes = (self.config.balanced_min_blocks, self.config.balanced_max_shares)
        return BalancedPlan(blocks_of, mQ.shape[0], mK.shape[1], target_shares, *sizes)

    @cute.jit
    def load_packed_q(
        self, gmem_tiled_copy: cute.TiledCopy, gmem_thr_copy: Any, mQ: cute.Tensor, sQ: cute.Tensor,
        batch: cutlass.Int32, kv_head: cutlass.Int32, group: cutlass.Int32, m_block: cutlass.Int32, rows: cutlass.Int32,
    ):  # fmt: skip
        """cp.async the packed Q tile (no commit): tile row r is packed row m_block · tile_m + r, query
        head kv_head · group + row // Sq, token row % Sq; rows past group · Sq are zero-filled (their
        S is then finite, and they are never stored)."""
        seqlen_q = mQ.shape[2]
        tQsQ = gmem_thr_copy.partition_D(sQ)  # (CPY, CPY_M, CPY_D)
        tQcQ = gmem_thr_copy.partition_S(cute.make_identity_tensor((self.tile_m, self.head_dim)))  # (row, col)
        elems = cute.size(tQsQ, mode=[0])
        for m in cutlass.range_constexpr(cute.size(tQsQ, mode=[1])):
            row = m_block * self.tile_m + tQcQ[0, m, 0][0]
            if row < rows:
                head = kv_head * group + row // seqlen_q
                # One query row (D,) cut into the copy's 16-byte chunks: (elems, D / elems).
                gQ_row = cute.zipped_divide(mQ[batch, head, row % seqlen_q, None], (elems,))
                for d in cutlass.range_constexpr(cute.size(tQsQ, mode=[2])):
                    cute.copy(gmem_tiled_copy, gQ_row[None, tQcQ[0, m, d][1] // elems], tQsQ[None, m, d])
            else:
                tQsQ[None, m, None].fill(0)

    @cute.jit
    def attend_block(
        self, kv_copy: KVCopy, warp_mma: cute.TiledMma, smem_operands: LdmatrixOperands, tSrQ: cute.Tensor,
        tSrK: cute.Tensor, tOrVt: cute.Tensor, acc_O: cute.Tensor, softmax: OnlineSoftmax, mask: AttentionMask,
        warps: WarpTiles, n_block_max: cutlass.Int32, n_blocks: cutlass.Int32, seqlen_k: cutlass.Int32,
        step: cutlass.Int32, masked: cutlass.Constexpr,
    ):  # fmt: skip
        """Iteration ``step`` of the split (block ``n_block_max - 1 - step``): refill the ring, then this
        warp's S = Q Kᵀ → mask → online softmax → rescale O → O += P V."""
        n_block = n_block_max - 1 - step
        slot = step % self.stages

        # ---- 3a. Refill the slot freed last iteration; wait only for this block ------------------
        refill_kv_ring(kv_copy, step, self.stages, n_block_max, n_blocks, seqlen_k)

        # ---- 3b. S = Q Kᵀ over this warp's keys --------------------------------------------------
        tile_mn = (warps.rows_per_warp, self.keys_per_warp)
        acc_S = scores(warp_mma, smem_operands, tSrQ, tSrK, slot, tile_mn, self.keys_per_warp // MMA_K)

        # ---- 3c./3d. Mask, online softmax, rescale O ---------------------------------------------
        if cutlass.const_expr(masked):
            mask.apply(acc_S, warps.key_sub_block(n_block))
        row_scale = softmax.update(acc_S)
        softmax.rescale(acc_O, row_scale)

        # ---- 3e. O += P V over this warp's keys ---------------------------------------------------
        pieces = self.config.shape.pieces_per_k_step
        values_product(warp_mma, smem_operands, acc_S, acc_O, tOrVt, slot, pieces, tSrQ.element_type)

    @cute.jit
    def store_warp_part(
        self, thr_mma: Any, acc_O: cute.Tensor, lse: cute.Tensor, sO_part: cute.Tensor, sLSE_part: cute.Tensor
    ):
        """This warp's normalised O (tile_m, D) and LSE (tile_m,) into its slot of the merge scratch;
        the first lane of each row's quad writes the row's LSE (``lse`` is in :func:`rows_by_cols` order)."""
        thr_mma.partition_C(sO_part).store(acc_O.load())  # (MMA, MMA_M, MMA_D)
        cO = rows_by_cols(thr_mma.partition_C(cute.make_identity_tensor(sO_part.shape)))
        if cO[0, 0][1] == 0:
            for r in cutlass.range_constexpr(cute.size(cO, mode=[0])):
                sLSE_part[cO[r, 0][0]] = lse[r]

    @cute.jit
    def merge_warps_and_store(
        self, sO_parts: cute.Tensor, sLSE_parts: cute.Tensor, gO: cute.Tensor, gLSE: cute.Tensor | None,
        row_start: cutlass.Int32, rows: cutlass.Int32, tidx: cutlass.Int32,
    ):  # fmt: skip
        """Merge the warps' parts of each tile row and store it: a thread takes ``MERGE_COLS`` columns
        of one row per pass (a warp covers 128 columns); rows past ``rows`` are skipped. ``gO`` is
        O's packed rows (B·Hkv slice, output dtype) or this split's fp32 partial rows; ``gLSE`` likewise
        or None."""
        chunks = self.head_dim // MERGE_COLS
        rows_per_pass = self.threads_per_cta // chunks
        chunk = tidx % chunks
        sO_chunks = cute.logical_divide(sO_parts, (None, None, MERGE_COLS))  # (key_warps, tile_m, (4, chunks))
        for tile_pass in cutlass.range_constexpr(self.tile_m // rows_per_pass):
            r = tile_pass * rows_per_pass + tidx // chunks
            merged = cute.make_rmem_tensor(MERGE_COLS, cutlass.Float32)
            lse = merge_splits(sLSE_parts[None, r], sO_chunks[None, r, (None, chunk)], merged, 0)
            row = row_start + r
            if row < rows:
                _store_row_chunk(merged, cute.local_tile(gO[row, None], (MERGE_COLS,), (chunk,)))
                # Compile time, then per thread: the DSL cannot join the two in one condition.
                if cutlass.const_expr(gLSE is not None):  # noqa: SIM102
                    if chunk == 0:
                        gLSE[row] = lse

    # ------------------------------------------------------------------------------------------
    # Kernel 2: merge the splits of every packed row of one (batch, KV head) by their LSE.
    # ------------------------------------------------------------------------------------------
    @cute.kernel
    def merge_kernel(
        self, mOPartial: cute.Tensor, mLSEPartial: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor | None,
        mQ: cute.Tensor | None, mK: cute.Tensor | None, mCacheSeqlens: cute.Tensor | None,
        mBlockTable: cute.Tensor | None, mItemSlabs: cute.Tensor | None,
    ):  # fmt: skip
        tidx, _, _ = cute.arch.thread_idx()
        row_block, batch_kv_head, _ = cute.arch.block_idx()
        chunks, runs = self.head_dim // MERGE_COLS, self.config.merge_runs
        chunk, run, cta_row = merge_thread(tidx, chunks, runs)
        row = row_block * self.merge_rows_per_cta + cta_row
        rows = mO.shape[1]
        merged = cute.make_rmem_tensor(MERGE_COLS, cutlass.Float32)
        lse = cutlass.Float32(-cutlass.Float32.inf)
        if row < rows:
            o_parts, lse_parts = mOPartial[None, batch_kv_head, row, None], mLSEPartial[None, batch_kv_head, row]
            if cutlass.const_expr(self.merge_plans):  # mQ, mK, the lengths and table given
                kv_heads = mK.shape[1]
                plan = self.balanced_plan(mQ, mK, mCacheSeqlens, mBlockTable, mOPartial.shape[0] - mO.shape[0])
                first, count = plan.item_slabs(batch_kv_head // kv_heads, batch_kv_head % kv_heads)
            elif cutlass.const_expr(self.config.merge_slabs_from_split):  # stored by the item's first share
                first, count = mItemSlabs[batch_kv_head, 0], mItemSlabs[batch_kv_head, 1]
            if cutlass.const_expr(self.config.balanced_min_blocks):
                if cutlass.const_expr(runs > 1):  # this thread's run of the item's slabs
                    first, count = merge_run(first, count, run, runs)
                o_parts, lse_parts = (
                    slab_range(t, first, count) for t in (mOPartial[None, 0, row, None], mLSEPartial[None, 0, row])
                )
            # (num_splits, (4, chunks)) of this row: each split's partial O, cut into 16-byte chunks.
            o_chunks = cute.logical_divide(o_parts, (None, MERGE_COLS))
            lse = merge_splits(
                lse_parts, o_chunks[None, (None, chunk)], merged,
                self.config.merge_splits_per_step,
            )  # fmt: skip
            if cutlass.const_expr(runs == 1):
                _store_merged_row(merged, lse, mO[batch_kv_head, row, None], mLSE, batch_kv_head, row, chunk)
        if cutlass.const_expr(runs > 1):  # every thread of the CTA, for its barrier
            lse = self.merge_row_runs(merged, lse, chunk, run, cta_row)
            if row < rows and run == 0:  # run 0 holds the row's merge
                _store_merged_row(merged, lse, mO[batch_kv_head, row, None], mLSE, batch_kv_head, row, chunk)

    @cute.jit
    def merge_row_runs(
        self, merged: cute.Tensor, lse: cutlass.Float32, chunk: cutlass.Int32, run: cutlass.Int32,
        cta_row: cutlass.Int32,
    ) -> cutlass.Float32:  # fmt: skip
        """The two-level merge's second level: this thread's run of its row chunk (``merged``, ``lse``) into shared
        memory, (runs, CTA rows, D) and (runs, CTA rows) fp32; barrier; the run-0 thread merges the runs in run order
        (:func:`merge_splits`, the order fixed by the plan: the same bits every launch) into ``merged`` and returns
        the row's LSE (another run's return is not stored)."""
        runs, cta_rows = self.config.merge_runs, self.merge_rows_per_cta
        smem = cutlass.memory.SmemAllocator()
        o_shape = (runs, cta_rows, self.head_dim)
        o_layout = cute.make_layout(o_shape, stride=(cta_rows * self.head_dim, self.head_dim, 1))
        sO_runs = smem.allocate_tensor(cutlass.Float32, o_layout, 16)  # (runs, CTA rows, D)
        sLSE_runs = smem.allocate_tensor(cutlass.Float32, cute.make_layout((runs, cta_rows), stride=(cta_rows, 1)), 16)
        cute.autovec_copy(merged, cute.local_tile(sO_runs[run, cta_row, None], (MERGE_COLS,), (chunk,)))
        if chunk == 0:
            sLSE_runs[run, cta_row] = lse
        cute.arch.barrier()
        sO_chunks = cute.logical_divide(sO_runs, (None, None, MERGE_COLS))  # (runs, CTA rows, (4, chunks))
        if run == 0:
            lse = merge_splits(sLSE_runs[None, cta_row], sO_chunks[None, cta_row, (None, chunk)], merged, 0)
        return lse


# ----------------------------------------------------------------------------------------------
# The stores (the merge both kernels share, ``merge_splits``: ``_decode_merge.py``).
# ----------------------------------------------------------------------------------------------
@cute.jit
def _store_row_chunk(merged: cute.Tensor, gO_chunk: cute.Tensor):
    """``merged`` (fp32) into ``MERGE_COLS`` consecutive columns of an output row, cast to its dtype."""
    out = cute.make_rmem_tensor(MERGE_COLS, gO_chunk.element_type)
    out.store(merged.load().to(gO_chunk.element_type))
    cute.autovec_copy(out, gO_chunk)


@cute.jit
def _store_merged_row(
    merged: cute.Tensor, lse: cutlass.Float32, gO_row: cute.Tensor, mLSE: cute.Tensor | None,
    batch_kv_head: cutlass.Int32, row: cutlass.Int32, chunk: cutlass.Int32,
):  # fmt: skip
    """The merge kernel's store of one row chunk: ``merged`` into chunk ``chunk`` of O's packed row ``gO_row``, and
    the row's LSE (chunk 0's thread) where it is returned."""
    _store_row_chunk(merged, cute.local_tile(gO_row, (MERGE_COLS,), (chunk,)))
    if cutlass.const_expr(mLSE is not None):  # noqa: SIM102
        if chunk == 0:
            mLSE[batch_kv_head, row] = lse


# ----------------------------------------------------------------------------------------------
# Host: tile shape, split count, bind, prepare.
# ----------------------------------------------------------------------------------------------
def tile_m_for(problem: Problem) -> int:
    """Packed rows per CTA: group · Sq rounded up to a power of two in [16, max_tile_m] (the row split's own)."""
    most = max_tile_m(WARPS_SPLIT_ROWS, problem.head_dim, TILE_CONFIGS, WIDE_M_TILE)
    return min(most, max(MMA_M, 1 << (problem.kv_group * problem.seqlen_q - 1).bit_length()))


def m_blocks_for(problem: Problem) -> int:
    return -(-problem.kv_group * problem.seqlen_q // tile_m_for(problem))


def padded_m_blocks(problem: Problem, device: torch.device) -> int:
    """The padded split's CTAs along M: :func:`m_blocks_for`'s tiles, two a CTA on :func:`two_warpgroup_tile`."""
    m_blocks = m_blocks_for(problem)
    return -(-m_blocks // 2) if two_warpgroup_tile(problem, device) else m_blocks


def planned_num_splits(problem: Problem, device: torch.device) -> int:
    """The shared split rule (``common/contract/splits.py``) for this rung's one-warpgroup M tiles and policy: the
    balanced split's question, which the padded split's two-warpgroup CTA leaves as it was."""
    return splits.planned_num_splits(problem, m_blocks_for(problem), device, split_policy(problem, device))


def split_policy(
    problem: Problem, device: torch.device | None = None, two_warpgroups: bool = False
) -> splits.SplitPolicy:  # fmt: skip
    """This rung's ask of the split rule, from its fifth-stop switches (default: the rule as it was); the WGMMA
    tile asks for ``WGMMA_SPLIT_CTAS_PER_SM`` (``device`` as :func:`wgmma_tile` reads it; None: the sm_90a compile),
    the padded split's ``two_warpgroups`` CTA for the one its ring leaves room for (``TWO_WARPGROUP_CTAS_PER_SM``)."""
    fit = CTAS_PER_SM_FIT[problem.head_dim]
    ctas_per_sm = WGMMA_SPLIT_CTAS_PER_SM if wgmma_tile(problem, device or torch.device("cpu")) else SPLIT_CTAS_PER_SM
    if two_warpgroups:
        ctas_per_sm = TWO_WARPGROUP_CTAS_PER_SM
    one_split = SHORT_CACHE_ONE_SPLIT and problem.head_dim in SHORT_CACHE_ONE_SPLIT_HEAD_DIMS
    return splits.SplitPolicy(min(ctas_per_sm, fit), one_split, FEWER_WAVES)


def balanced_split(problem: Problem, device: torch.device | None = None) -> bool:
    """Whether ``BALANCED_SPLIT`` takes ``problem`` on ``device`` (``splits.balanced_split_applies``, this
    rung's split rule; without a device, the rule's default SM count, as the sm_90a compile assumes)."""
    rule_device = device or torch.device("cpu")
    return splits.balanced_split_applies(BALANCED_SPLIT, problem, lambda: planned_num_splits(problem, rule_device))


def wgmma_tile(problem: Problem, device: torch.device) -> bool:
    """Whether ``WGMMA_MIN_ROWS`` puts ``problem``'s 64-row tiles on WGMMA on ``device`` (a CUDA device of sm_90, or
    the CPU, whose compile is for sm_90a): at least that many packed rows, at a head dim in ``WGMMA_HEAD_DIMS`` (and
    256 with ``WGMMA_D256``)."""
    rows = problem.kv_group * problem.seqlen_q
    head_dims = (*WGMMA_HEAD_DIMS, 256) if wgmma_d256_ring() else WGMMA_HEAD_DIMS
    if not WGMMA_MIN_ROWS or rows < WGMMA_MIN_ROWS or problem.head_dim not in head_dims:
        return False
    hopper = device.type != "cuda" or torch.cuda.get_device_capability(device)[0] == 9
    return hopper and tile_m_for(problem) == 64


def two_warpgroup_tile(problem: Problem, device: torch.device) -> bool:
    """Whether ``WGMMA_TWO_WARPGROUPS`` would put two of ``problem``'s WGMMA tiles in one CTA of the padded split: a
    WGMMA tile (:func:`wgmma_tile`) at a head dim of ``TWO_WARPGROUP_RINGS`` with ``TWO_WARPGROUP_MIN_ROWS`` to
    ``TWO_WARPGROUP_MAX_ROWS`` packed rows and more than one tile's (the balanced split, decided from this padded plan,
    keeps one warpgroup: :func:`launch_plan`)."""
    rows = problem.kv_group * problem.seqlen_q
    if not WGMMA_TWO_WARPGROUPS or problem.head_dim not in TWO_WARPGROUP_RINGS:
        return False
    if rows < TWO_WARPGROUP_MIN_ROWS or rows <= WARPGROUP_ROWS:
        return False
    if TWO_WARPGROUP_MAX_ROWS is not None and rows > TWO_WARPGROUP_MAX_ROWS:
        return False
    return wgmma_tile(problem, device)


def packed_prefill_config(problem: Problem, key_splits: bool = False) -> HopperAttentionConfig:
    """cute/hopper's configuration for ``problem``'s packed rows (Hkv heads of group · Sq rows, so no GQA in the
    kernel): its default for ``problem``, with the consumer warpgroups that pad the rows least (two, 128-row tiles;
    three at D=64 where 192-row tiles pad no more); ``key_splits``: the keys split (:func:`packed_prefill_splits`)."""
    warpgroups = splits.packed_prefill_warpgroups(problem)
    config = default_config(problem)
    return replace(
        config, gqa=False, packed_group=problem.kv_group, consumer_warpgroups=warpgroups, key_splits=key_splits
    )


def packed_prefill_tiles(problem: Problem) -> int:
    """The packed prefill's tiles: each (batch, KV head)'s group · Sq rows in tiles of its configuration's rows
    (``splits.packed_prefill_tiles``, the rule both decode rungs share)."""
    return splits.packed_prefill_tiles(problem)


def packed_prefill_key_blocks(problem: Problem) -> int:
    """The key blocks of 128 keys (cute/hopper's ``tile_n``) that a packed tile of ``problem``'s padded Sk visits: all
    of them, or causal top-left only those up to the last token's diagonal (Sq keys)."""
    keys = problem.seqlen_k
    if problem.causal and not problem.bottom_right:
        keys = min(keys, problem.seqlen_q)
    return -(-keys // DEFAULT_TILE_N)


def packed_prefill_splits(problem: Problem, device: torch.device | None = None) -> int | None:
    """Whether ``PACKED_PREFILL_MIN_ROWS`` runs ``problem`` on cute/hopper's kernel (module constants) on ``device`` (a
    CUDA device of sm_90, or the CPU, whose compile is for sm_90a; None: the CPU), and with how many key splits: None
    where it does not run (fewer packed rows, a paged cache, a head dim or dtype cute/hopper does not take, uneven work
    below ``PACKED_PREFILL_UNEVEN_MIN_ROWS`` rows, or no split count whose tiles fill the grid's waves, and for uneven
    work ``splits.UNEVEN_MIN_WAVES`` waves); 1 where its tiles fill ``PACKED_PREFILL_MIN_WAVE_SHARE`` of the
    grid's waves; with ``PACKED_PREFILL_SPLITS`` else the fewest splits whose tiles do, each keeping
    ``PACKED_PREFILL_MIN_SPLIT_BLOCKS`` key blocks of the padded Sk, at most ``PACKED_PREFILL_MAX_SPLITS``. The rule
    past this rung's own checks is ``splits.packed_prefill_splits``, which gluon/decode asks too."""
    if PACKED_PREFILL_MIN_ROWS is None:
        return None
    if problem.head_dim not in hopper_rung.HEAD_DIMS or problem.dtype not in hopper_rung.DTYPES:
        return None
    device = device or torch.device("cpu")
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] != 9:
        return None
    most = 1
    if PACKED_PREFILL_SPLITS:
        most = min(PACKED_PREFILL_MAX_SPLITS, packed_prefill_key_blocks(problem) // PACKED_PREFILL_MIN_SPLIT_BLOCKS)
    policy = splits.PackedPrefillPolicy(
        PACKED_PREFILL_MIN_ROWS, PACKED_PREFILL_UNEVEN_MIN_ROWS, PACKED_PREFILL_MIN_WAVE_SHARE
    )
    return splits.packed_prefill_splits(problem, device, policy, most)


def packed_prefill_launch(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, config: HopperAttentionConfig,
    cache_seqlens: torch.Tensor | None, num_splits: int = 1,
) -> Launch:  # fmt: skip
    """The launch of :func:`packed_prefill_splits`: q (B, H, Sq, D) copied to its packed rows (B, Hkv, group · Sq, D),
    row (head in group) · Sq + token, at every run (the launch's prologue); O (B, H, Sq, D) contiguous is already that
    packing, (B, Hkv, group · Sq, D), and so is the LSE, so the kernel writes both in place (with ``key_splits``, the
    merge kernel after the ``num_splits`` splits' partials: ``_decode_packed_splits.py``)."""
    batch, kv_heads, group, seqlen_q, head_dim = (
        problem.batch, problem.kv_heads, problem.kv_group, problem.seqlen_q, problem.head_dim
    )  # fmt: skip
    rows = group * seqlen_q
    packed_q = q.new_empty((batch, kv_heads, rows, head_dim))
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((batch, problem.heads, seqlen_q), dtype=torch.float32, device=q.device)
    outputs = (out.view(batch, kv_heads, rows, head_dim), lse.view(batch, kv_heads, rows))
    if config.key_splits:
        from cute_impl import _decode_packed_splits

        scalars = (problem.scale * LOG2_E, splits.sm_count(q.device))
        arguments = _decode_packed_splits.launch_arguments(packed_q, k, v, outputs, num_splits, cache_seqlens, scalars)
    else:
        tensors = hopper_tensor_arguments(config, (packed_q, k, v, *outputs), None, cache_seqlens)
        arguments = (*tensors, problem.scale * LOG2_E, 1.0, splits.sm_count(q.device))
    by_kv_head = q.unflatten(1, (kv_heads, group))  # (B, Hkv, group, Sq, D): a view

    def pack_q() -> None:
        packed_q.view(batch, kv_heads, group, seqlen_q, head_dim).copy_(by_kv_head)

    result = (out, lse) if problem.return_lse else out
    chosen = {"num_splits": num_splits, "balanced": False, "packed_prefill": True}
    return Launch(config, arguments, result, chosen, prologue=pack_q)


def wgmma_d256_ring() -> tuple[int, int] | None:
    """``WGMMA_D256`` checked: None, or one of :data:`WGMMA_D256_RINGS` (those compiled and fitting one CTA an SM)."""
    if WGMMA_D256 is not None and WGMMA_D256 not in WGMMA_D256_RINGS:
        raise ValueError(f"cute/decode's WGMMA_D256 must be None or one of {WGMMA_D256_RINGS}, got {WGMMA_D256!r}")
    return WGMMA_D256


def wgmma_ring(shape: TileShape, head_dim: int, wgmma: bool) -> TileShape:
    """``shape`` (a :data:`TILE_CONFIGS` entry), with ``WGMMA_D256``'s block and stages on the WGMMA tile at D=256: the
    ring the kernel runs, whose blocks the balanced split's shares count."""
    ring = wgmma_d256_ring()
    if wgmma and head_dim == 256 and ring is not None:
        return shape._replace(tile_n=ring[0], stages=ring[1])
    return shape


def decode_config(
    problem: Problem, split: bool, balanced: bool = False, m_tile_major: bool = False, stages: int | None = None,
    merge_runs: int = 1, wgmma: bool = False, two_warpgroups: bool = False,
) -> DecodeConfig:  # fmt: skip
    """The configuration :data:`TILE_CONFIGS` holds for this head dim now (read at every bind), with
    the problem's features as compile-time flags; ``balanced``: the balanced split's (always split), its grid's
    M tile on x with ``m_tile_major`` (``splits.balanced_m_tile_major``), its ring ``stages`` deep where given
    (:func:`balanced_ring_stages`), its merge in ``merge_runs`` runs (:func:`balanced_merge_runs`), which its
    item-share cap counts; ``wgmma``: the tile on WGMMA (:func:`wgmma_tile`; at D=256 on ``WGMMA_D256``'s ring,
    :func:`wgmma_ring`), overlapped where its ring has ``WGMMA_OVERLAP_MIN_STAGES``; ``two_warpgroups``: two of
    those tiles a CTA, 8 warps on ``TWO_WARPGROUP_RINGS``' ring (:func:`two_warpgroup_tile`)."""
    tile_m = tile_m_for(problem)
    shape, row_warps = warp_split(WARPS_SPLIT_ROWS, tile_m, problem.head_dim, TILE_CONFIGS)
    shape = wgmma_ring(shape, problem.head_dim, wgmma)
    if two_warpgroups:  # each warp 16 rows of the CTA's two tiles, all keys of a block (the WGMMA layout)
        tile_m, stages = 2 * WARPGROUP_ROWS, TWO_WARPGROUP_RINGS[problem.head_dim]
        shape = shape._replace(num_warps=2 * shape.num_warps, max_tile_m=tile_m, stages=stages)
        row_warps = shape.num_warps
    shape = shape._replace(stages=min(stages, shape.stages)) if stages else shape  # shallower, never deeper
    return DecodeConfig(
        dtype=problem.dtype,
        head_dim=problem.head_dim,
        tile_m=tile_m,
        shape=shape,
        row_warps=row_warps,
        causal=problem.causal,
        bottom_right=problem.bottom_right,
        has_cache_seqlens=problem.has_cache_seqlens,
        return_lse=problem.return_lse,
        split=split,
        paged=problem.paged,
        merge_splits_per_step=MERGE_SPLITS_PER_STEP,
        balanced_min_blocks=balanced and splits.balanced_min_share_blocks(shape.tile_n, BALANCED_MIN_KEYS),
        balanced_max_shares=checked_item_cap(BALANCED_MAX_ITEM_SHARES) * merge_runs if balanced else 0,
        merge_slabs_from_split=balanced and MERGE_SLABS_FROM_SPLIT,
        m_tile_major=balanced and m_tile_major,
        merge_runs=merge_runs if balanced else 1,
        wgmma=wgmma,
        wgmma_overlap=wgmma and 0 < WGMMA_OVERLAP_MIN_STAGES <= shape.stages,
        two_warpgroups=two_warpgroups,
    )


def checked_merge_runs(merge_runs: int) -> int:
    """``BALANCED_MERGE_RUNS`` as the merge takes it: 0 or 1 (one chain) as 1, else a power of two up to
    :data:`MAX_MERGE_RUNS` (a CTA's threads); anything else is refused by name."""
    runs = max(merge_runs, 1)
    if merge_runs < 0 or runs & (runs - 1) or runs > MAX_MERGE_RUNS:
        raise ValueError(
            f"cute/decode's BALANCED_MERGE_RUNS must be 0 (one chain) or a power of two up to {MAX_MERGE_RUNS}, "
            f"got {merge_runs}"
        )
    return runs


def balanced_merge_runs(problem: Problem, device: torch.device) -> int:
    """The balanced merge's runs an item (module docstring, "The two-level merge"): ``BALANCED_MERGE_RUNS``, halved
    while the merge grid, a thread per ``MERGE_COLS`` columns of every packed row of every item and run, would pass
    one wave of ``device``'s resident threads (:data:`SM_THREADS` an SM). Where the items alone fill the GPU their
    chains already run side by side; more runs would only add waves of merge CTAs (seed 43's B=64 Hkv=16 Sq=4 row:
    one run; seed 73's B=4 Hkv=32 Sq=16 row: two)."""
    runs = checked_merge_runs(BALANCED_MERGE_RUNS)
    row_threads = problem.batch * problem.kv_heads * problem.kv_group * problem.seqlen_q
    threads = row_threads * (problem.head_dim // MERGE_COLS)
    wave = splits.sm_count(device) * SM_THREADS
    while runs > 1 and threads * runs > wave:
        runs //= 2
    return runs


def balanced_ring_stages(problem: Problem, device: torch.device, slabs: int) -> int | None:
    """``BALANCED_SHALLOW_RING``'s depth where the balanced grid of ``slabs`` share CTAs per M tile spills past one
    wave of the table's CTA slots on ``device`` (``splits.balanced_grid_spills``), else None (the table's ring)."""
    slots = splits.sm_count(device) * CTAS_PER_SM_FIT[problem.head_dim]
    return splits.shallow_ring_depth(BALANCED_SHALLOW_RING, problem.head_dim, slabs * m_blocks_for(problem), slots)


def seqlen_k_decisions(problem: Problem, device: torch.device, num_splits: int | None = None) -> tuple[bool, int]:
    """What :func:`launch_plan` decides from Sk: the balanced split or not, and the split count (the balanced
    split's target shares; ``num_splits`` forces it). Everything else it decides (slabs, ring, merge runs, the
    configuration) follows from these and the rest of the problem, so equal decisions are an equal launch plan
    (``RungHost``'s growing binder)."""
    # cute/hopper's kernel: all of a sequence's keys a tile, or its key splits' share.
    packed_splits = None if num_splits is not None else packed_prefill_splits(problem, device)
    if packed_splits is not None:
        return False, packed_splits
    if balanced_split(problem, device):  # one warpgroup a CTA: the 64-row tiles
        m_blocks = m_blocks_for(problem)
        tile_n = wgmma_ring(TILE_CONFIGS[problem.head_dim], problem.head_dim, wgmma_tile(problem, device)).tile_n
        shares = (BALANCED_SHARES_PER_SM, BALANCED_MIN_KEYS)
        rule = {"target": BALANCED_TARGET, "ctas_per_sm": CTAS_PER_SM_FIT[problem.head_dim]}
        return True, splits.resolve_balanced_shares(num_splits, problem, device, m_blocks, tile_n, *shares, **rule)
    # The padded split: its CTAs along M and what an SM holds of them, two tiles a CTA on the two-warpgroup tile.
    policy = split_policy(problem, device, two_warpgroup_tile(problem, device))
    return False, splits.resolve_num_splits(num_splits, problem, padded_m_blocks(problem, device), device, policy)


def launch_plan(problem: Problem, device: torch.device, num_splits: int | None = None) -> tuple:
    """What a bind of ``problem`` on ``device`` decides before it allocates, from the shape, the device and
    this module's switches: ``(num_splits, slabs, items, config)``, the split count (the balanced split's
    shares), the balanced workspace's slabs (None: padded-Sk splits) and items a slab, the compile key.
    ``num_splits`` overrides the rule (sweeps, tests); ``common.attention`` keeps it with a plan."""
    slabs, items = None, problem.batch * problem.kv_heads
    packed_splits = None if num_splits is not None else packed_prefill_splits(problem, device)
    if packed_splits is not None:
        return packed_splits, None, items, packed_prefill_config(problem, key_splits=packed_splits > 1)
    balanced, num_splits = seqlen_k_decisions(problem, device, num_splits)
    if balanced:  # slabs: target_shares + B · Hkv, of all items
        slabs, items = num_splits + items, 1
    split = slabs is not None or num_splits > 1
    m_tile_major = slabs is not None and splits.balanced_m_tile_major(slabs, M_TILE_MAJOR)
    stages = None if slabs is None else balanced_ring_stages(problem, device, slabs)
    runs = 1 if slabs is None else balanced_merge_runs(problem, device)
    two_warpgroups = slabs is None and two_warpgroup_tile(problem, device)
    wgmma = wgmma_tile(problem, device)
    config = decode_config(problem, split, slabs is not None, m_tile_major, stages, runs, wgmma, two_warpgroups)
    return num_splits, slabs, items, config


def plan_launch(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, *, cache_seqlens: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None, num_splits: int | None = None, planned: tuple | None = None,
) -> Launch:  # fmt: skip
    """Allocate O, the LSE and the split workspace for validated q, k, v; ``run()`` launches the split
    kernel and, with more than one split, the merge, and carries the ``num_splits`` it chose.
    Paged (``block_table``): k and v are (num_pages, page_size, Hkv, D) pools, passed as their
    (num_pages, Hkv, page_size, D) view. ``planned``: :func:`launch_plan` of this problem and device."""
    num_splits, slabs, items, config = planned or launch_plan(problem, q.device, num_splits)
    if isinstance(config, HopperAttentionConfig):
        return packed_prefill_launch(q, k, v, problem, config, cache_seqlens, num_splits)
    batch_kv_heads, rows, head_dim = problem.batch * problem.kv_heads, problem.kv_group * problem.seqlen_q, q.shape[3]
    # empty_like: a third of the host time of torch.empty with a shape, dtype and device to parse.
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = None
    if problem.return_lse:
        lse = torch.empty((problem.batch, problem.heads, problem.seqlen_q), dtype=torch.float32, device=q.device)
    partials = (None, None)
    if config.split:
        partials = (
            torch.empty((slabs or num_splits, items, rows, head_dim), dtype=torch.float32, device=q.device),
            torch.empty((slabs or num_splits, items, rows), dtype=torch.float32, device=q.device),
        )
    # The merge's item slabs (MERGE_SLABS_FROM_SPLIT), written by the split kernel at every launch.
    item_slabs = q.new_empty((batch_kv_heads, 2), dtype=torch.int32) if config.merge_slabs_from_split else None
    packed = (out.view(batch_kv_heads, rows, head_dim), None if lse is None else lse.view(batch_kv_heads, rows))
    kv = [pool.permute(0, 2, 1, 3) for pool in (k, v)] if problem.paged else [k, v]  # pools (pages, Hkv, slots, D)
    lengths = None if cache_seqlens is None else cache_seqlens_tensor(cache_seqlens)
    table = None if block_table is None else block_table_tensor(block_table)
    arguments = (q, *kv, *packed, *partials, item_slabs, lengths, table, problem.scale)
    result = (out, lse) if problem.return_lse else out
    chosen = {"num_splits": num_splits, "balanced": slabs is not None}
    return Launch(config, arguments, result, chosen)


def decode_limits(problem: Problem) -> tuple[bool, str]:
    """This rung's own limits beyond the shared ``mma.sync`` checks: Sq <= MAX_SEQLEN_Q, scale > 0."""
    if problem.seqlen_q > MAX_SEQLEN_Q:
        return (
            False,
            f"cute/decode takes 1 to {MAX_SEQLEN_Q} query tokens, got Sq={problem.seqlen_q}: use a prefill rung",
        )
    return positive_scale(problem)


# ----------------------------------------------------------------------------------------------
# Capability check and sm_90a compile path.
# ----------------------------------------------------------------------------------------------
def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    """A CUDA device of sm_80+ (``mma.sync`` bf16, cp.async), fp16/bf16, D in :data:`HEAD_DIMS`,
    1 <= Sq <= :data:`MAX_SEQLEN_Q`, softmax_scale > 0; GQA, both causal alignments,
    ``cache_seqlens``, the LSE and a paged KV cache (every page size of the contract) are implemented."""
    ok, reason = mma_sync_supports("cute/decode", problem, device, head_dims=HEAD_DIMS, features=DECODE_FEATURES)
    if not ok:
        return ok, reason
    return decode_limits(problem)


def fake_arguments(config: DecodeConfig | HopperAttentionConfig) -> tuple[Any, ...]:
    """:meth:`DecodeKernel.__call__`'s arguments without data, as ``bind`` passes them (cute/hopper's own for
    :func:`packed_prefill_splits`' configuration): q, k, v (B, H or Hkv, S, D) (paged: k and v (num_pages, Hkv,
    page_size, D)), the packed O (B·Hkv, rows, D) and LSE (or None), the split partials (or None), the merge's
    item slabs (or None), the key lengths (or None), the block table (or None), the softmax scale (its value does
    not enter the code) and the stream."""
    if isinstance(config, HopperAttentionConfig) and config.key_splits:
        from cute_impl import _decode_packed_splits

        return _decode_packed_splits.fake_arguments(config)
    if isinstance(config, HopperAttentionConfig):
        return hopper_fake_arguments(config)
    element = CUTE_DTYPES[config.dtype]
    operands = [fake_tensor(element, 4) for _ in range(3)]
    packed = [fake_tensor(element, 3), fake_tensor(cutlass.Float32, 2) if config.return_lse else None]
    partials = [fake_tensor(cutlass.Float32, 4), fake_tensor(cutlass.Float32, 3)] if config.split else [None, None]
    item_slabs = fake_tensor(cutlass.Int32, 2) if config.merge_slabs_from_split else None
    lengths = fake_cache_seqlens() if config.has_cache_seqlens else None
    table = fake_block_table() if config.paged else None
    return (*operands, *packed, *partials, item_slabs, lengths, table, cutlass.Float32(1.0), fake_stream())


def compile_plan(problem: Problem, split: bool = True) -> DecodeConfig:
    """What ``compile_sm90`` compiles: the split form (the split kernel writing partials, and the
    merge; ``split=False``: the split kernel writing O directly) at ``problem``'s head dim, dtype, mask
    and features (one query token when ``problem`` is prefill-sized, as the canonical problem is). Balanced where
    the launch plan makes balanced slabs: a problem the packed prefill takes has none, whatever ``balanced_split``
    says, and compiles the padded split's kernels."""
    decode_sized = problem if problem.seqlen_q <= MAX_SEQLEN_Q else problem.with_(seqlen_q=1)
    cpu = torch.device("cpu")
    slabs = launch_plan(decode_sized, cpu)[1]
    balanced = split and slabs is not None
    stages = balanced_ring_stages(decode_sized, cpu, slabs) if balanced else None
    runs = balanced_merge_runs(decode_sized, cpu) if balanced else 1
    return decode_config(
        decode_sized, split=split, balanced=balanced, m_tile_major=M_TILE_MAJOR, stages=stages, merge_runs=runs,
        wgmma=wgmma_tile(decode_sized, cpu), two_warpgroups=not balanced and two_warpgroup_tile(decode_sized, cpu),
    )  # fmt: skip


def decode_kernel(config: DecodeConfig | HopperAttentionConfig) -> Any:
    """The launcher of ``config``: :class:`DecodeKernel`, or with ``config.wgmma`` its WGMMA tile's
    (``_decode_wgmma.py``, which imports this module), or cute/hopper's for :func:`packed_prefill_splits`'
    configuration."""
    if isinstance(config, HopperAttentionConfig) and config.key_splits:
        from cute_impl._decode_packed_splits import PackedSplitsKernel

        return PackedSplitsKernel(config)
    if isinstance(config, HopperAttentionConfig):
        return hopper_rung.HopperAttention(config)
    if config.wgmma:
        from cute_impl._decode_wgmma import WgmmaDecodeKernel

        return WgmmaDecodeKernel(config)
    return DecodeKernel(config)


# The host entry points: validate (head dims, every feature, Sq <= 16, a positive scale) → plan (the
# split count and the DecodeConfig, the compile key of both forms; GPU launches and CPU compiles alike
# compile from ``fake_arguments``) → bind (O, the LSE, the split workspace). ``decode_attention`` takes
# ``num_splits=n`` to force a split count (sweeps, tests; not part of the public API).
HOST = RungHost(
    "cute/decode",
    CompiledKernels(decode_kernel, fake_arguments),
    plan=compile_plan,
    plan_launch=plan_launch,
    launch_plan=launch_plan,
    seqlen_k_decisions=seqlen_k_decisions,
    head_dims=HEAD_DIMS,
    features=DECODE_FEATURES,
    problem_check=decode_limits,
)
decode_attention, bind, compile_sm90 = HOST.prepare, HOST.bind, HOST.compile_sm90


IMPLEMENTATION = HOST.implementation(
    supports=supports, required_ptx=("mma.sync", "ldmatrix", "cp.async"), source_file=__file__,
    check_reads_seqlen_k=False,
)  # fmt: skip
