"""The split rule of the decode rungs (flash decoding): how many CTAs share one sequence's keys.

One rule for every stack (``triton_impl/decode.py``, ``cute_impl/decode.py``), pure Python, chosen per
bound call. A decode rung launches ``ctas_per_split = B · Hkv · m_blocks`` CTAs per split (its own
``m_blocks``: how many packed M tiles one KV group takes). Among the counts from 1 to
:data:`MAX_SPLITS` that leave each split at least :data:`MIN_KEYS_PER_SPLIT` keys of the padded
cache, each is scored by how well its ``ctas_per_split · splits`` CTAs fill whole waves of ``SM
count`` CTAs (busy fraction ``ctas / (waves · SMs)``); the rule takes the fewest splits whose busy
fraction is at least ``1 - WAVE_TOLERANCE`` of the best one's (fewer splits: less merge work and
partial traffic). E.g. on 132 SMs: B=1, Hkv=8 at 128k keys gets 16 splits (128 CTAs, 97% of a wave);
B=64, Hkv=32 gets 1 (2048 CTAs already fill 16 waves to 97%).

The padded Sk is used, never the values of ``cache_seqlens``: they are an input read at launch, and
a plan may not depend on them (nor may a decode step synchronise to read them). Inside the kernels
each sequence's splits follow its own length, so a short sequence gets short (or empty) splits.

**Uneven work.** With cache lengths and more than one sequence, the CTAs' work is unknown and may be
very uneven: a wave-filling count leaves the SMs that ran short sequences idle while the longest one's
splits finish. There the rule only considers counts that give at least :data:`UNEVEN_MIN_WAVES` waves of
CTAs, so that the block scheduler hands a freed SM the next CTA, and that let one sequence's splits alone
fill a wave (``sm_count / (ctas_per_split / batch)`` splits), since a single long sequence may hold most
of the keys; the second floor stops at :data:`UNEVEN_MAX_WAVES` waves of CTAs, as the CTAs of short
sequences are mostly empty and each still costs a scheduling slot. Measured (H100, B=8, Hkv=8, 32k
padded, lengths spread over 0..32k; ``results/h100/decode/splits/``): 2 splits (one wave) took 240 /
203 / 198 µs in triton / gluon / cute, 8 splits (four waves) 183 / 177 / 180, 16 splits 179 / 177 /
179, the fastest or within 1 % of it in each stack; the rule now picks 18. The H200 random sweep
(``results/h200/decode-random/``) found ragged batches with one long sequence at 23-80 % of the read
bandwidth under the wave floor alone, which the per-sequence floor is for.

**A rung's policy** (:class:`SplitPolicy`, issue #38's fifth stop; each rung builds it from its own
module switches, set by the H200 A/B of ``bench/decode_floor5.sh``: triton/decode two CTA slots, gluon/decode
every switch, cute/decode none yet, ``results/h200/decode-floor5/``):

* ``ctas_per_sm``: even work counts ``ctas_per_sm`` CTA slots per SM, not one, where the rung's shared
  memory fits that many. With few (batch, KV head) items on a long cache the rule's one CTA per SM
  leaves each SM one CTA's bytes in flight and one CTA's per-block compute in series with its loads
  (H200: B=4 Hkv=2 D=64 276k, triton/decode 62 % of the read bandwidth at 16 splits, 128 CTAs);
  two CTAs an SM overlap one's compute with the other's copies.
* ``short_one_split``: a padded cache of at most :data:`SHORT_CACHE_KEYS` keys whose items alone fill a
  wave takes one split: its splits would be a block or two of keys each (or empty), every CTA paying
  its fixed cost (launch, Q, the first block's round trip, the partials, the merge) for little streaming
  (H200: B=32 H=32 MHA Sq=8 1k ragged, 2 splits, 2048 CTAs: 34-52 % of the read bandwidth). Not a ragged batch
  whose items fit one wave of the rung's CTA slots: there one CTA an item runs as long as the longest sequence
  while the slots of the short ones idle, where the rule's splits hand the batch to the balanced split (H200,
  seed 59's B=64 Hkv=4 6.9k paged ragged row: gluon/decode's one split 33 % of the read bandwidth, the other
  rungs' balanced split 48-51 %). With more items than slots the GPU's scheduler evens them out.
* ``past_wave_ctas_per_sm`` (issue #38, 2026-12-01 sixth stop; 0: off): even work whose items alone pass a wave
  of ``ctas_per_sm`` slots counts this many slots an SM instead, the CTAs the rung's tile really fits. There the
  GPU places that many CTAs on an SM whatever the rule counts, so a count of fewer slots misreads the waves: B=64
  Hkv=8 D=128 is 512 CTAs, 1.9 waves of two an SM (97 % busy by the count, one split) but 1.3 of the three that
  fit, whose last wave leaves a third of the SMs idle; counting three takes three splits (3.9 waves). triton/decode
  (``MANY_ITEMS_FULL_FIT``; H200, ``results/h200/decode-flashinfer-gap/``, ``decode-full-fit/``): 268.5 -> 250.5 us
  at 4k, 2135.7 -> 1883.2 at 32k, level with FlashInfer's; where the items fit a wave (B=1 128k, B=16 Hkv=4) the
  full fit counted everywhere cost 4-5 %, so only past a wave; and only at a tile whose fit the rung knows (a
  32-row tile counted at the 16-row tile's three: 1.15x the time).
* ``fewer_waves`` (issue #38's seventh stop, off in every rung until ``bench/decode_fewpairs_ab.sh`` times it):
  even work whose rule count takes more than one wave of CTA slots takes the fewest waves that are still
  at least :data:`FEWER_WAVES_MIN_BUSY` busy (:func:`fewer_waves_splits`). The busy fraction alone cannot
  tell one wave at 91 % from two at 100 %, but each wave boundary costs every SM a CTA's ramp (Q, the
  ring's first blocks) with nothing else in flight. E.g. B=3 Hkv=8 13k: 11 splits (264 CTAs, two waves
  of 132 one-slot CTAs) become 5 (120 CTAs, one wave).

**The balanced split** (``BALANCED_SPLIT`` of triton/decode and cute/decode, planned on the device from the
lengths): the host part both rungs share is here, the switch's meaning (:func:`balanced_split_applies`) and
the grid's target shares (:func:`balanced_target_shares`, :func:`resolve_balanced_shares`), which follow
from the shape and the device only; :func:`balanced_item_shares` is the device plan's share counts in Python.

**The item-share cap** (``BALANCED_MAX_ITEM_SHARES`` of each rung: triton/decode, gluon/decode's
``_decode_balanced.py``, cute/decode; 0, 32, 48 since ``results/h200/decode-ragged-cap/``): at most that
many shares for one (batch, KV head) item, whose blocks are then cut into fewer, larger shares. Where one item
holds most of the keys (seed 43's B=8 MQA D=256 paged row: one sequence of 108724 keys among 38..51476, 155
shares of 704 keys in triton/decode), the share that arrives last merges all of that item's partials alone,
a chain of L2 round trips as long as the share count over the merge's splits a step (1-2 at D=256, its O tiles'
registers), tens of µs after every key was read. The cap trades that chain for longer shares: a share is the
item's blocks over the cap, streamed by one CTA. Capping only lowers counts, so the grid still holds every
share, and the split and the merge read the same capped plan. The two-level merge shortens the chain instead of the
shares, 8 shares a run in every stack by its H200 A/Bs: gluon/decode's and triton/decode's ``BALANCED_MERGE_GROUP``
(runs of G shares merged by each run's last share, then the runs by the item's last run) and cute/decode's
``BALANCED_MERGE_RUNS`` (its merge kernel's threads split into runs, merged in run order through shared memory), the
cap counting a run's shares (seed 73's B=4 Hkv=2 paged row: 32 shares of 81 key blocks under gluon's cap, 78 of 33
with runs; triton caps nothing and merges its 81 in runs).

**The target rule** (``BALANCED_TARGET`` of each rung: triton/decode, gluon/decode's ``_decode_balanced.py``,
cute/decode; "per-slot" in gluon and cute, "per-slot-many" in triton, by the H200 A/B of
``bench/decode_target_ab.sh``, results/h200/decode-target/): "per-sm" is
``shares_per_sm`` shares an SM over the M tiles; "per-slot" (:func:`per_slot_target`) counts the balanced kernel's
CTA slots (SMs × the CTAs an SM holds, over the M tiles) and the B · Hkv items, whose shares each round up, so the
grid holds up to target + items CTAs. Where the items are few (at most a third of the slots), it reserves their
rounding: target = slots - items, one wave of shares (seed 43's B=2 Hkv=32 D=64 paged row: 264 + 64 = 328 CTAs on
264 slots left 24 shares and 40 empty CTAs to a second wave; 200 + 64 fit one). Where the items alone fill a wave,
it takes :data:`SLOT_SHARES` shares a slot: a share of cdiv(Hkv · Σ blocks, 264) is longer than most sequences of
seed 43's B=64 Hkv=16 row (1024 items), so almost no item splits and the longest make the tail. In between it keeps
"per-sm": there one wave's share grows past 1.5 slots' work (without bound as the items near the slots), and two
shares a slot add a wave of CTAs to a grid the items fill about once (``bench/decode_ragged_model.py``, 2.5 µs
latency: one wave 254 µs against the per-SM 192 in triton on seed 47's B=64 MQA D=256 row, 64 items on 132 slots;
two shares a slot 4-6 µs slower in cute on seed 43's B=32 MHA row, 256 items on 264 slots). Measured, "per-slot"
against "per-sm": seed 43's B=2 row 88.4 -> 67.4 µs in gluon, 91.1 -> 72.8 in cute; its B=64 Hkv=16 row 172.4 ->
156.2 in gluon, 219.8 -> 204.0 in cute, 218.3 -> 166.9 in triton; no row of ten more than 2 % slower in gluon or
cute. In triton the one-wave branch lost (its CTAS_PER_SM_FIT slots make larger one-wave targets: the B=2 row
90.5 -> 99.3, a full D=64 cache 150.5 -> 162.3) and the two-shares branch won (218.3 -> 166.9, seed 37's B=16 Hkv=32
row 221.7 -> 211.2): "per-slot-many" is "per-slot" without the one-wave branch. On each of the A/B's ten rows its plan
is one of the two timed (the two-shares rows per-slot's, the others per-sm's), so its times are the measured ones.
Like every plan it follows from the shape and the device only.

**The balanced grid's axes** (``M_TILE_MAJOR`` of each decode rung, on since ``bench/decode_mtile_major_ab.sh``):
:func:`balanced_m_tile_major` and :func:`balanced_grid`. The grid has target_shares + B · Hkv share CTAs per M tile;
with the share on x (fastest) the block scheduler hands out every share of M tile 0, then every share of M tile 1,
and so on, so each M tile's pass streams the whole cache again, and L2 (50 MB on an H200) does not keep it between
passes (ncu, cute/decode on seed 47's B=64 MQA D=256 paged row, 4 M tiles of 32 rows: 249 µs for ~870 MB from DRAM,
four times its 213 MB cache). With the M tile on x the M tiles of one share are dispatched together and read its K/V
blocks at about the same time: the first from DRAM, the others mostly from L2. Only the axes change: the plan, the
partials' slabs, the merge and the arrival counters are indexed by (share, M tile) as before. Measured on an H200
(results/h200/decode-mtile-major/): seed 47's B=64 MQA D=256 paged row 165.5 -> 127.3 µs in gluon (2 M tiles), 304.0
-> 258.7 in cute (4); B=16 Hkv=2 Sq=4 D=256 paged(64) (2 M tiles) 285.2 -> 262.5 in triton, 164.7 -> 135.8 in cute;
rows of one M tile level. Past :data:`MAX_GRID_Y` share CTAs (grid y's cap) the share stays on x: a plan decision,
so that no shape the share-major grid took is refused.

**The balanced grid past one wave** (``BALANCED_SHALLOW_RING`` of gluon/decode and cute/decode): the grid holds
target_shares + B · Hkv CTAs per M tile, so with "per-sm" shares on two CTA slots an SM (D=64's rings) it always takes
more than one wave of them, and the shares past the first wave start only as first-wave CTAs
end: a tail of one share streamed by a lone CTA. Seed 73's B=4 Hkv=32 64-row D=64 ragged row: 392 CTAs (320 with
keys) on gluon's and cute's 264 slots, 80.7 / 89.6 µs, where triton/decode's kernel (155 registers, 57 KB: three an
SM) holds all 392 at once, 58.4 µs; seed 71's B=8 Hkv=32 paged row, 520 CTAs, 264 slots against triton's 528. Where
:func:`balanced_grid_spills` (more than one wave of the default ring's slots, at most
:data:`SHALLOW_RING_MAX_WAVES`), those rungs take a shallower ring that lets more CTAs share an SM; the plan (target,
shares) stays. Grids of many waves keep the deep ring: the scheduler backfills them, and each CTA's blocks in flight
count there (``bench/decode_ragged_model.py``: +1-8 % on seed 43's and 53's 1552-CTA rows with three shallow slots).
On an H200 (``results/h200/decode-shallow-ring/``, {64: 4}: four stages, three CTAs an SM) the rows that spill took
0.74-0.86x the time in gluon and 0.77-0.90x in cute (seed 71's row 360.6 -> 267.8 / 357.2 -> 274.7 µs, 61 -> 82 %
and 62 -> 80 %; seed 73's 80.9 -> 69.8 / 90.6 -> 73.9), a one-wave and a many-wave row 1.00x. cute/decode's D=128
ring takes two stages there ({128: 2}: 70 KB, three CTAs an SM at 16 rows where three stages hold two): seed 131's
B=32 Hkv=4 paged(32) ragged row, 392 CTAs on 264 slots, 93.3 -> 84.5 µs (66 -> 73 %), 0.95-0.99x on three more
(``results/h200/decode-seed131-rings/``); gluon/decode has no D=128 entry (untimed).

**The packed prefill** (issue #38's compute-bound class: cute/decode's ``PACKED_PREFILL_MIN_ROWS``, on; gluon/decode's,
off and untimed): a contiguous cache of many packed rows a KV head (group · Sq, head-major) runs on the rung's prefill
kernel (cute/hopper, gluon/hopper) with q packed as (B, Hkv, group · Sq, D), each row's causal diagonal its token's.
The rule both rungs ask is :func:`packed_prefill_splits` under a :class:`PackedPrefillPolicy` of the rung's module
constants: at least ``min_rows`` packed rows, uneven work (:func:`uneven_work`) only from ``uneven_min_rows`` rows and
:data:`UNEVEN_MIN_WAVES` waves of tiles (a tile's work is its sequence's length, unknown to the plan: a freed SM must
find the next tile), and the fewest key splits (up to ``most``; 1 for a rung that cannot split the keys) whose tiles
fill ``min_wave_share`` of the grid's waves. Tiles are :data:`WARPGROUP_ROWS` rows a consumer warpgroup, two or three
warpgroups, whichever pads the rows least (:func:`packed_prefill_warpgroups`). The rung checks its own head dims,
dtypes and device first. H100 (cute/decode, 2026-12-05, results/h100/decode-packed-prefill-2026-12-05/): seed 233 row
5, 256 rows, 860.3 -> 561.7 µs (54 -> 83 % of the read bandwidth).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

from common.contract.problem import Problem

MAX_SPLITS = 128
MIN_KEYS_PER_SPLIT = 512
WAVE_TOLERANCE = 0.05
UNEVEN_MIN_WAVES = 3
UNEVEN_MAX_WAVES = 16
# The longest padded cache :attr:`SplitPolicy.short_one_split` keeps in one split.
SHORT_CACHE_KEYS = 8192
# Whether :attr:`SplitPolicy.short_one_split` passes over a ragged batch whose items fit one wave of the rung's CTA
# slots (module docstring, ``short_one_split``; ``bench/decode_knob_ab.py`` times both).
SHORT_ONE_SPLIT_SKIPS_RAGGED_WAVE = True
# The least busy fraction :attr:`SplitPolicy.fewer_waves` accepts for a count of fewer waves.
FEWER_WAVES_MIN_BUSY = 0.85
# The SM count the rule assumes where there is no GPU (the interpreter, the sm_90a compile): an H100.
DEFAULT_SM_COUNT = 132
# CUDA's largest grid y (and z); x takes up to 2**31 - 1.
MAX_GRID_Y = 65535


def longest_first_order(lengths: Sequence[int]) -> list[int]:
    """The batch indices longest ``cache_seqlens`` entry first, ties by index: the order in which gluon/decode's
    ``ITEMS_LONGEST_FIRST`` claims and triton/decode's ``LONGEST_FIRST`` dispatches a ragged batch's items (the
    kernels rank each entry by the count of entries before it; this is the host's statement of the same order)."""
    return sorted(range(len(lengths)), key=lambda batch: (-lengths[batch], batch))


def longest_first_block(problem: Problem, switch: bool, max_batch: int, min_block: int) -> int:
    """The batch rows a kernel ranks for :func:`longest_first_order` (its ORDER_BLOCK_B): 0 (its own order) unless
    ``switch`` is on and ``problem`` has ``cache_seqlens`` and at most ``max_batch`` sequences, else the batch as a
    power of two, at least ``min_block``."""
    if not (switch and problem.has_cache_seqlens and problem.batch <= max_batch):
        return 0
    return max(min_block, 1 << (problem.batch - 1).bit_length())


def wave_efficiency(ctas: int, sm_count: int) -> float:
    """Busy fraction of the waves ``ctas`` CTAs take on ``sm_count`` SMs (1 = the last wave is full)."""
    waves = -(-ctas // sm_count)
    return ctas / (waves * sm_count)


def uneven_work(problem: Problem) -> bool:
    """Whether ``problem``'s CTAs carry uneven work (module docstring): cache lengths over more than one sequence."""
    return problem.has_cache_seqlens and problem.batch > 1


def uneven_fewest_splits(ctas_per_split: int, batch: int, most: int, sm_count: int) -> int:
    """The fewest splits of uneven work (module docstring): :data:`UNEVEN_MIN_WAVES` waves of CTAs, and
    one sequence's splits alone filling a wave up to :data:`UNEVEN_MAX_WAVES` waves; at most ``most``."""
    waves_floor = -(-UNEVEN_MIN_WAVES * sm_count // ctas_per_split)
    sequence_ctas = max(1, ctas_per_split // batch)
    one_sequence_fills = min(-(-sm_count // sequence_ctas), max(1, UNEVEN_MAX_WAVES * sm_count // ctas_per_split))
    return min(most, max(waves_floor, one_sequence_fills))


def choose_num_splits(ctas_per_split: int, seqlen_k: int, sm_count: int, uneven: bool = False, batch: int = 1) -> int:
    """The split rule of the module docstring: the fewest splits among those (each keeping
    ``MIN_KEYS_PER_SPLIT`` keys; with ``uneven`` work over ``batch`` sequences, at least
    :func:`uneven_fewest_splits` where the keys allow) whose busy fraction is at least
    ``1 - WAVE_TOLERANCE`` of the best one's (relative, so that a tiny grid still takes every split it can)."""
    most = max(1, min(MAX_SPLITS, seqlen_k // MIN_KEYS_PER_SPLIT))
    return _fewest_good_splits(ctas_per_split, most, sm_count, uneven, batch)


# Keyed on the most splits the keys allow, not on Sk: a cache one key longer at every decode step
# (transformers' DynamicCache) finds the answer cached for 512 steps in a row.
@lru_cache(maxsize=1024)
def _fewest_good_splits(ctas_per_split: int, most: int, sm_count: int, uneven: bool, batch: int) -> int:
    fewest = uneven_fewest_splits(ctas_per_split, batch, most, sm_count) if uneven else 1
    efficiency = {splits: wave_efficiency(ctas_per_split * splits, sm_count) for splits in range(fewest, most + 1)}
    best = max(efficiency.values())
    return min(splits for splits, value in efficiency.items() if value >= best * (1 - WAVE_TOLERANCE))


def fewer_waves_splits(ctas_per_split: int, chosen: int, slots: int) -> int:
    """``chosen`` splits, or, where their CTAs take more than one wave of ``slots``, the most splits that
    fit the fewest waves with a busy fraction of at least :data:`FEWER_WAVES_MIN_BUSY` (module docstring,
    ``fewer_waves``)."""
    waves = -(-ctas_per_split * chosen // slots)
    for fewer in range(1, waves):
        fitting = [n for n in range(1, chosen) if ctas_per_split * n <= fewer * slots]
        busy = [n for n in fitting if wave_efficiency(ctas_per_split * n, slots) >= FEWER_WAVES_MIN_BUSY]
        if busy:
            return max(busy)
    return chosen


def sm_count(device: torch.device) -> int:
    """The device's SM count, or :data:`DEFAULT_SM_COUNT` off a GPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return DEFAULT_SM_COUNT


@dataclass(frozen=True)
class SplitPolicy:
    """How a rung asks the rule (module docstring, "A rung's policy"): the default is the rule as it
    was, one CTA slot per SM, no short-cache exception, no preference for fewer waves."""

    ctas_per_sm: int = 1
    short_one_split: bool = False
    fewer_waves: bool = False
    past_wave_ctas_per_sm: int = 0

    def __post_init__(self) -> None:
        if self.ctas_per_sm < 1:
            raise ValueError(f"SplitPolicy.ctas_per_sm must be >= 1, got {self.ctas_per_sm}")
        if self.past_wave_ctas_per_sm < 0:
            raise ValueError(
                f"SplitPolicy.past_wave_ctas_per_sm must be >= 0 (0: off), got {self.past_wave_ctas_per_sm}"
            )

    def slots_per_sm(self, ctas_per_split: int, sms: int) -> int:
        """The CTA slots an SM the rule counts for even work: ``past_wave_ctas_per_sm`` where one split's CTAs
        alone pass a wave of ``ctas_per_sm`` (module docstring), else ``ctas_per_sm``."""
        if self.past_wave_ctas_per_sm and ctas_per_split > sms * self.ctas_per_sm:
            return self.past_wave_ctas_per_sm
        return self.ctas_per_sm


DEFAULT_POLICY = SplitPolicy()


def seqlen_k_class(seqlen_k: int) -> tuple[int, bool]:
    """All that :func:`planned_num_splits` reads of Sk: the most splits its keys allow and whether the cache is
    short (at most :data:`SHORT_CACHE_KEYS`, the bound of the decode rungs' short-cache tiles too). Two lengths of
    one class get one split count for a problem otherwise the same, so a growing cache re-asks the rule only where
    its class changes (every ``MIN_KEYS_PER_SPLIT`` keys up to ``MAX_SPLITS`` of them, and at the short bound)."""
    return min(MAX_SPLITS, seqlen_k // MIN_KEYS_PER_SPLIT), seqlen_k <= SHORT_CACHE_KEYS


def same_padded_split(balanced: bool, longer: Problem, earlier: Problem) -> bool:
    """Whether a rung's padded split (not ``balanced``: whose target shares read Sk more finely) of ``earlier``
    stays as it is for ``longer``, the same problem at another Sk: both lengths of one :func:`seqlen_k_class`.
    The rule then answers alike, the balanced split's applicability (which asks it) too."""
    return not balanced and seqlen_k_class(longer.seqlen_k) == seqlen_k_class(earlier.seqlen_k)


def planned_num_splits(
    problem: Problem, m_blocks: int, device: torch.device, policy: SplitPolicy = DEFAULT_POLICY
) -> int:
    """The split count of one call of ``problem`` by a rung that packs one KV group into ``m_blocks``
    M tiles: B · Hkv · m_blocks CTAs per split, the padded Sk, ``device``'s SMs; uneven work where
    several sequences have their own lengths; ``policy`` as the module docstring says."""
    ctas_per_split = problem.batch * problem.kv_heads * m_blocks
    uneven = uneven_work(problem)
    sms = sm_count(device)
    one_wave_ragged = SHORT_ONE_SPLIT_SKIPS_RAGGED_WAVE and uneven and ctas_per_split <= sms * policy.ctas_per_sm
    short = problem.seqlen_k <= SHORT_CACHE_KEYS and ctas_per_split >= sms
    if policy.short_one_split and short and not one_wave_ragged:
        return 1
    slots = sms if uneven else sms * policy.slots_per_sm(ctas_per_split, sms)
    chosen = choose_num_splits(ctas_per_split, problem.seqlen_k, slots, uneven, problem.batch)
    if policy.fewer_waves and not uneven:
        return fewer_waves_splits(ctas_per_split, chosen, slots)
    return chosen


def balanced_min_share_blocks(block_n: int, min_keys: int = MIN_KEYS_PER_SPLIT) -> int:
    """The balanced split's smallest share, in ``block_n``-key blocks: ``min_keys`` keys rounded up."""
    return -(-min_keys // block_n)


BALANCED_TARGETS = ("per-sm", "per-slot", "per-slot-many")
# The per-slot rule (module docstring, "The target rule"): shares a CTA slot where the items alone fill a wave, and
# the most items, as a fraction of the slots, for which one wave of shares (target = slots - items) is taken: its
# longest share is then at most 1.5 times a slot's work.
SLOT_SHARES = 2
ONE_WAVE_ITEMS_FRACTION = 1 / 3


def per_tile(device: torch.device, per_sm: int, m_blocks: int) -> int:
    """``per_sm`` an SM of ``device`` (CTA slots, target shares) shared by ``m_blocks`` M tiles, rounded up."""
    return -(-sm_count(device) * per_sm // m_blocks)


def per_slot_one_wave(slots: int, items: int) -> bool:
    """Whether "per-slot" takes its one-wave branch for ``items`` (batch, KV head) items on ``slots`` CTA slots of one
    M tile (module docstring, "The target rule"): the items at most :data:`ONE_WAVE_ITEMS_FRACTION` of the slots, so
    that target = slots - items puts the whole grid in one wave."""
    return items <= slots * ONE_WAVE_ITEMS_FRACTION


def per_slot_target(slots: int, items: int, per_sm: int, one_wave: bool = True) -> int:
    """The "per-slot" target shares of one M tile (module docstring, "The target rule") with ``slots`` CTA slots
    for the tile and ``items`` (batch, KV head) items; ``per_sm``: the "per-sm" target, kept in between and, without
    ``one_wave`` ("per-slot-many"), where the items are few.
    E.g. on 132 SMs at D=64 (seed 43): B=2 Hkv=32 on 2 slots an SM, 264 slots, 64 items -> 200 (one wave of
    264 CTAs, not 328); B=64 Hkv=16 on 4 slots an SM, 528 slots, 1024 items -> 1056 (not 264); B=32 MHA on 2
    slots an SM, 256 items -> the per-sm 264."""
    if one_wave and per_slot_one_wave(slots, items):
        return slots - items
    if items >= slots:
        return SLOT_SHARES * slots
    return per_sm


def balanced_target_shares(
    problem: Problem, device: torch.device, m_blocks: int, block_n: int, shares_per_sm: int,
    min_keys: int = MIN_KEYS_PER_SPLIT, *, target: str = "per-sm", ctas_per_sm: int = 1,
) -> int:  # fmt: skip
    """The balanced split's shares per M tile (``triton_impl/decode.py``'s "The balanced split"): by the
    ``target`` rule (module docstring, "The target rule"; one of :data:`BALANCED_TARGETS`, else ValueError),
    "per-sm" ``shares_per_sm`` per SM over the ``m_blocks`` M tiles, "per-slot" and "per-slot-many"
    :func:`per_slot_target` on ``ctas_per_sm`` CTA slots an SM; at most what full sequences fill with
    ``min_keys``-key shares (more CTAs would only start and stop: 264 on a 300-key cache took 7 s a call under the
    interpreter). The shape and the device fix it, never the lengths, so a CUDA graph replays the grid with new
    ``cache_seqlens``."""
    if target not in BALANCED_TARGETS:
        raise ValueError(f"BALANCED_TARGET must be one of {BALANCED_TARGETS}, got {target!r}")
    if ctas_per_sm < 1:
        raise ValueError(f"the balanced kernel's CTAs an SM must be >= 1, got {ctas_per_sm}")
    items = problem.batch * problem.kv_heads
    chosen = per_sm = per_tile(device, shares_per_sm, m_blocks)
    if target != "per-sm":
        slots = per_tile(device, ctas_per_sm, m_blocks)
        chosen = per_slot_target(slots, items, per_sm, one_wave=target == "per-slot")
    sequence_blocks = -(-problem.seqlen_k // block_n)
    shares_per_sequence = -(-sequence_blocks // balanced_min_share_blocks(block_n, min_keys))
    return max(1, min(chosen, items * shares_per_sequence))


BALANCED_SWITCHES = ("ragged", "ragged-split", "ragged-split-long", "always", "never")
# Above this many splits an item, the padded split's merge chain costs more than the balanced shares' extra CTAs:
# the last CTA of a tile merges its splits in ``2 · ceil(splits / splits a step)`` dependent L2 round trips after the
# last key was read, where the balanced plan merges runs of 8 shares (H200, results/h200/decode-long-few-heads/: one
# 133k-367k sequence over 1-2 KV heads at 63-122 splits 0.60-0.91x the time; 32 splits level at 152/0, one
# 128k sequence over 8 KV heads at 16 slower, results/h200/decode-balanced-gluon-cute/).
LONG_CHAIN_SPLITS = 32


def balanced_split_applies(switch: str, problem: Problem, rule_splits: Callable[[], int] | None = None) -> bool:
    """Whether a rung's ``BALANCED_SPLIT`` switch gives ``problem``'s calls the balanced split: "always",
    "ragged" (calls with ``cache_seqlens``), "ragged-split" (calls with ``cache_seqlens`` over more than one
    sequence whose split rule, ``rule_splits()``, splits them: where the items alone fill the GPU or one
    sequence is all the work, the shares only add CTAs; H200, results/h200/decode-balanced-gluon-cute/),
    "ragged-split-long" ("ragged-split"'s calls and every call, with ``cache_seqlens`` or not, whose rule splits
    an item more than :data:`LONG_CHAIN_SPLITS` times: a long merge chain) or "never"; anything else is a
    ValueError."""
    if switch not in BALANCED_SWITCHES:
        raise ValueError(f"BALANCED_SPLIT must be one of {BALANCED_SWITCHES}, got {switch!r}")
    if switch.startswith("ragged-split"):
        if rule_splits is None:
            raise ValueError(f"BALANCED_SPLIT {switch!r} needs the rung's split rule (rule_splits)")
        count = rule_splits()
        ragged_split = uneven_work(problem) and count > 1
        return ragged_split or (switch == "ragged-split-long" and count > LONG_CHAIN_SPLITS)
    return switch == "always" or (switch == "ragged" and problem.has_cache_seqlens)


def balanced_item_shares(
    blocks: Sequence[int], kv_heads: int, target_shares: int, min_share_blocks: int, max_item_shares: int = 0
) -> list[int]:
    """The shares of each sequence's KV heads under the device plan (``balanced_plan`` of
    ``triton_impl/_device.py``, ``BalancedPlan`` of ``cute_impl/_decode_plan.py``), ``blocks[b]`` the key
    blocks sequence b's rows see: a share of cdiv(Hkv · Σ blocks, target_shares) blocks (at least
    ``min_share_blocks``), cdiv(its blocks, share) shares an item (at least 1; at most ``max_item_shares``
    where that is not 0, the item-share cap of the module docstring). The grid holds them all:
    Hkv · Σ shares <= target_shares + B · Hkv."""
    if max_item_shares < 0:
        raise ValueError(f"BALANCED_MAX_ITEM_SHARES must be >= 0 (0: no cap), got {max_item_shares}")
    chunk = max(-(-kv_heads * sum(blocks) // target_shares), min_share_blocks)
    shares = [max(-(-count // chunk), 1) for count in blocks]
    return [min(count, max_item_shares) for count in shares] if max_item_shares else shares


# What the Triton-side kernels take for "no item-share cap": more shares than any grid holds.
NO_ITEM_SHARE_CAP = 2**31 - 1


def balanced_plan_sizes(block_n: int, min_keys: int, max_item_shares: int) -> tuple[int, int]:
    """The device plan's (fewest key blocks a share takes, most shares an item takes) as the Triton-side
    kernels take them: ``min_keys`` in ``block_n``-key blocks, and the item-share cap (module docstring), 0
    for none passed as :data:`NO_ITEM_SHARE_CAP`; a negative cap is a ValueError."""
    if max_item_shares < 0:
        raise ValueError(f"BALANCED_MAX_ITEM_SHARES must be >= 0 (0: no cap), got {max_item_shares}")
    return balanced_min_share_blocks(block_n, min_keys), max_item_shares or NO_ITEM_SHARE_CAP


def balanced_m_tile_major(slabs: int, m_tile_major: bool) -> bool:
    """Whether the balanced grid of ``slabs`` share CTAs puts the M tile on x: a rung's ``M_TILE_MAJOR``, except past
    :data:`MAX_GRID_Y` share CTAs, which grid y cannot hold (there each M tile's pass reads the cache again)."""
    return m_tile_major and slabs <= MAX_GRID_Y


# The most waves of a rung's default CTA slots a balanced grid may take for its shallower ring (module docstring).
SHALLOW_RING_MAX_WAVES = 2


def balanced_grid_spills(grid_ctas: int, slots: int) -> bool:
    """Whether a balanced grid of ``grid_ctas`` CTAs (target_shares + B · Hkv per M tile, all M tiles) takes more than
    one wave of ``slots`` CTA slots (SMs × the CTAs an SM holds of the rung's default ring) and at most
    :data:`SHALLOW_RING_MAX_WAVES`: the rung's ``BALANCED_SHALLOW_RING`` applies (module docstring, "The balanced grid
    past one wave"). E.g. on 132 SMs at two slots: seed 73's 392-CTA row spills, a 264-CTA grid fits, 1552 CTAs are
    many waves."""
    return slots < grid_ctas <= SHALLOW_RING_MAX_WAVES * slots


def shallow_ring_depth(shallow: dict[int, int], head_dim: int, grid_ctas: int, slots: int) -> int | None:
    """A rung's ``BALANCED_SHALLOW_RING`` (``shallow``: head dim -> ring stages) depth for a balanced grid of
    ``grid_ctas`` CTAs where it spills past one wave of ``slots`` CTA slots (:func:`balanced_grid_spills`), else None:
    the rung's own ring. Each rung then takes the shallower of this and its ring, never a deeper one."""
    depth = shallow.get(head_dim)
    return depth if depth and balanced_grid_spills(grid_ctas, slots) else None


def balanced_grid(slabs: int, m_blocks: int, m_tile_major: bool) -> tuple[int, int]:
    """The balanced split kernel's grid (x, y) over ``slabs`` share CTAs (target_shares + B · Hkv) and ``m_blocks``
    M tiles: (slabs, m_blocks), the share fastest; ``m_tile_major`` (a rung's ``M_TILE_MAJOR``): (m_blocks, slabs),
    the M tiles of one share together (module docstring). The shares then lie on y, which CUDA caps at
    :data:`MAX_GRID_Y`: more is a ValueError, not a launch error (the rungs ask :func:`balanced_m_tile_major`)."""
    if not m_tile_major:
        return slabs, m_blocks
    if slabs > MAX_GRID_Y:
        raise ValueError(
            f"M_TILE_MAJOR puts the balanced split's {slabs} share CTAs (target shares + B · Hkv) on grid y, "
            f"which CUDA caps at {MAX_GRID_Y}: turn M_TILE_MAJOR off for this shape"
        )
    return m_blocks, slabs


def resolve_balanced_shares(
    shares: int | None, problem: Problem, device: torch.device, m_blocks: int, block_n: int, shares_per_sm: int,
    min_keys: int = MIN_KEYS_PER_SPLIT, *, target: str = "per-sm", ctas_per_sm: int = 1,
) -> int:  # fmt: skip
    """The balanced split's target shares of one bound call: ``shares`` where a caller forces them (tests,
    sweeps; at least 1, else ValueError), otherwise :func:`balanced_target_shares` by the ``target`` rule."""
    if shares is not None and shares < 1:
        raise ValueError(f"num_splits (the balanced split's shares) must be >= 1, got {shares}")
    rule = {"target": target, "ctas_per_sm": ctas_per_sm}
    return shares or balanced_target_shares(problem, device, m_blocks, block_n, shares_per_sm, min_keys, **rule)


def resolve_num_splits(
    num_splits: int | None, problem: Problem, m_blocks: int, device: torch.device, policy: SplitPolicy = DEFAULT_POLICY
) -> int:
    """The split count of one bound call: ``num_splits`` where a caller forces one (sweeps, tests; at
    least 1, else ValueError), otherwise :func:`planned_num_splits` under ``policy``."""
    if num_splits is None:
        return planned_num_splits(problem, m_blocks, device, policy)
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    return num_splits


# The query rows of one consumer warpgroup of the prefill kernels (one m64 wgmma), the packed prefill's tile unit.
WARPGROUP_ROWS = 64


@dataclass(frozen=True)
class PackedPrefillPolicy:
    """A rung's packed-prefill constants (module docstring, "The packed prefill"): ``min_rows`` packed rows at least
    (None: off), ``uneven_min_rows`` for uneven work, ``min_wave_share`` the least busy fraction of the grid's waves."""

    min_rows: int | None
    uneven_min_rows: int
    min_wave_share: float


def packed_rows(problem: Problem) -> int:
    """The packed rows of one (batch, KV head): its group's query heads times Sq."""
    return problem.kv_group * problem.seqlen_q


def packed_prefill_warpgroups(problem: Problem) -> int:
    """The packed prefill's consumer warpgroups a tile, those that pad ``problem``'s packed rows least: two (128-row
    tiles), three at D=64 (the prefill kernels' three-warpgroup head dim) where 192-row tiles pad no more."""
    rows = packed_rows(problem)
    if problem.head_dim == 64 and -(-rows // (3 * WARPGROUP_ROWS)) * 3 <= -(-rows // (2 * WARPGROUP_ROWS)) * 2:
        return 3
    return 2


def packed_prefill_tiles(problem: Problem) -> int:
    """The packed prefill's tiles: each (batch, KV head)'s packed rows in tiles of :func:`packed_prefill_warpgroups`."""
    tile_m = WARPGROUP_ROWS * packed_prefill_warpgroups(problem)
    return problem.batch * problem.kv_heads * -(-packed_rows(problem) // tile_m)


def packed_prefill_splits(
    problem: Problem, device: torch.device, policy: PackedPrefillPolicy, most: int = 1
) -> int | None:  # fmt: skip
    """Whether ``policy`` runs ``problem`` on the packed prefill on ``device`` (module docstring, "The packed
    prefill"; the rung has checked its head dim, dtype and device), and with how many key splits: None where it does
    not (off, fewer packed rows than ``min_rows``, a paged cache, uneven work below ``uneven_min_rows`` rows or
    :data:`UNEVEN_MIN_WAVES` waves of tiles, no count up to ``most`` whose tiles fill ``min_wave_share`` of the
    waves), else the fewest such count. E.g. on 132 SMs at 128 rows: seed 233 row 5 (B=4 Hkv=32, 256 rows: 256 tiles,
    97 % of two waves) 1; B=1 of it (64 tiles, half a wave) None unsplit."""
    rows = packed_rows(problem)
    if policy.min_rows is None or rows < policy.min_rows or problem.paged:
        return None
    uneven = uneven_work(problem)
    if uneven and rows < policy.uneven_min_rows:
        return None
    tiles, sms = packed_prefill_tiles(problem), sm_count(device)
    least_tiles = UNEVEN_MIN_WAVES * sms if uneven else 0
    fills = (
        n
        for n in range(1, max(most, 1) + 1)
        if tiles * n >= least_tiles and wave_efficiency(tiles * n, sms) >= policy.min_wave_share
    )
    return next(fills, None)
