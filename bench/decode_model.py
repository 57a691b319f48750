"""A timing model of the decode rungs: where a shape's time goes when it misses the read bandwidth.

No GPU. For each shape it lays out the CTAs a rung launches (grid (num_splits, m_blocks, B·Hkv), the
split rule of ``common/contract/splits.py``, each split's keys cut from the sequence's own length as
``split_key_range`` cuts them) and replays them through a fluid model of an H200:

1. each SM holds ``occupancy`` CTAs of the rung (its ring's shared memory); the block scheduler hands a
   freed slot the next CTA of the grid in launch order (split fastest, then M tile, then batch · Hkv);
2. a CTA first pays a fixed latency, ``FIXED_US`` (its launch, the cache length, Q and the first K/V
   block's round trips, the epilogue's stores; ``EMPTY_US`` for a split with no key), then streams its
   K/V bytes (gluon's TMA reads whole blocks past a sequence's end);
3. a streaming CTA draws at most ``in_flight / LATENCY_US`` (its ring's blocks in flight, Little's law)
   and all of them together at most the read bandwidth, shared evenly;
4. the split kernel adds ``LAUNCH_US``; the merge (more than one split) ``MERGE_GAP_US`` plus one
   ``MERGE_STEP_US`` L2 round trip per dependent load step over the splits (:func:`merge_steps`).

The percentage is the bytes a step must read (each key of each sequence's own length once per KV head,
``DecodeCase.kv_bytes_read``, as ``compare.py --decode`` counts them; never the padded cache) over the
modelled time. The constants were fitted by hand (grid search) to the committed H200 random sweep
(``results/h200/decode-random-split-rule/``: 24 rung × shape points, RMS error 3.6 points); the model
ranks causes and variants, it does not replace a measurement. Its known miss: a CTA alone on the GPU sees
the unloaded latency, not ``LATENCY_US``, so a grid of a few long CTAs (the paged row under the old
rule, 23 % measured) comes out lower than measured.

    python -m bench.decode_model            # the seed-1 sweep's shapes, every stack, before and after
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import torch

from common.contract import splits
from common.measure.decode_sweep import DecodeCase, random_cases

SM_COUNT = 132
READ_GBPS = 4419.0
LATENCY_US = 1.75
FIXED_US = 4.0
EMPTY_US = 3.0
LAUNCH_US = 4.0
MERGE_GAP_US = 2.5
MERGE_STEP_US = 0.7
STEP_US = 0.25
# The random sweep the model is read against: ``compare.py --decode --decode-random 10 --decode-seed 1``.
SEED, COUNT = 1, 10
# bench/decode_floor.py's ``after+tile`` candidates, (rung, head dim) -> (key block, blocks in flight,
# CTAs per SM): gluon's 64-key rings (112 / 104 KB, two CTAs per SM), triton's 128-key blocks at D=64
# (72 KB, three CTAs per SM, 64 KB in flight instead of 32).
TILE_CANDIDATES = {("gluon", 64): (64, 5, 2), ("gluon", 128): (64, 2, 2), ("triton", 64): (128, 2, 3)}
# Issue #38's fifth stop (bench/decode_floor.py's fifth-stop settings): CTAs of a rung's split kernel an SM
# holds per head dim (``SPLIT_CTAS_PER_SM`` asks for at most that many), triton/decode's ``DEEP_RING``
# blocks in flight (its DEEP_RING_STAGES - 1), and the ``SHORT_CACHE_TILE`` rings at D=128 as (key block,
# blocks in flight, CTAs per SM).
FIFTH_FIT = {"triton": {64: 4, 128: 3, 256: 2}, "gluon": {64: 2, 128: 1, 256: 1}, "cute": {64: 2, 128: 2, 256: 1}}
DEEP_RING_IN_FLIGHT = {64: 5, 128: 4, 256: 4}
SHORT_TILES = {"triton": (32, 2, 5), "gluon": (64, 2, 2)}


@dataclass(frozen=True)
class StackModel:
    """What the model needs of one rung at one head dim."""

    name: str
    block_n: int
    in_flight_blocks: int
    occupancy: int
    max_block_m: int
    pads_blocks: bool  # TMA reads a whole block past a sequence's end (gluon)
    merge_splits_per_step: int = 1  # the rung's MERGE_SPLITS_PER_STEP (cute: 0, the compiler's unrolling)


def stack_models(head_dim: int, merge_splits_per_step: int | None = None) -> list[StackModel]:
    """triton, gluon and cute decode at ``head_dim``: key blocks, ring depths and occupancies from their
    tile tables and docstrings (triton: 3 cp.async stages; gluon: one 200-224 KB CTA per SM; cute: 6
    stages at D=64, 3 above). ``merge_splits_per_step`` None: the merges before issue #38's floor."""
    triton_block = {64: 64, 128: 64, 256: 32}[head_dim]
    triton_occupancy = {64: 4, 128: 3, 256: 2}[head_dim]
    gluon_block = {64: 128, 128: 128, 256: 64}[head_dim]
    deep_ring = {64: 5, 128: 2, 256: 2}[head_dim]
    step = merge_splits_per_step
    cute_occupancy = {64: 2, 128: 2, 256: 1}[head_dim]
    return [
        StackModel("triton", triton_block, 2, triton_occupancy, 64 if head_dim < 256 else 32, False, step or 1),
        StackModel("gluon", gluon_block, deep_ring, 1, 64, True, step or 1),
        StackModel("cute", 64, deep_ring, cute_occupancy, 4096 // head_dim, False, step or 0),
    ]


def m_blocks(case: DecodeCase, stack: StackModel) -> int:
    packed = case.problem.kv_group * case.problem.seqlen_q
    block_m = 64 if stack.name == "gluon" else min(stack.max_block_m, max(16, 1 << (packed - 1).bit_length()))
    return -(-packed // block_m)


def split_keys(length: int, split: int, num_splits: int, block_n: int) -> int:
    """Keys of split ``split`` of a sequence of ``length`` keys (``split_key_range``)."""
    n_blocks = -(-length // block_n)
    per_split = -(-n_blocks // num_splits)
    begin = min(split * per_split * block_n, length)
    return min(begin + per_split * block_n, length) - begin


def cta_bytes(case: DecodeCase, stack: StackModel, num_splits: int) -> list[int]:
    """K/V bytes each CTA of the grid reads, in launch order."""
    p = case.problem
    lengths = case.lengths or (p.seqlen_k,) * p.batch
    bytes_per_key = 2 * p.head_dim * p.dtype.itemsize
    work = []
    for batch_kv_head in range(p.batch * p.kv_heads):
        length = lengths[batch_kv_head // p.kv_heads]
        for _ in range(m_blocks(case, stack)):
            for split in range(num_splits):
                keys = split_keys(length, split, num_splits, stack.block_n)
                if stack.pads_blocks:
                    keys = -(-keys // stack.block_n) * stack.block_n
                work.append(keys * bytes_per_key)
    return work


def balanced_share_keys(case: DecodeCase, block_n: int, target: int, min_keys: int) -> list[tuple[int, int]]:
    """(work item, keys) of each CTA of one M tile of triton/decode's balanced grid, in launch order
    (``balanced_share``: a share is cdiv(total blocks, target) blocks, at least ``min_keys`` keys; an item
    of b blocks takes max(1, cdiv(b, share)) splits, cut as ``split_key_range`` cuts them); the CTAs past
    the last share are (-1, 0)."""
    p = case.problem
    lengths = case.lengths or (p.seqlen_k,) * p.batch
    blocks = [-(-length // block_n) for length in lengths]
    chunk = max(-(-p.kv_heads * sum(blocks) // target), max(1, -(-min_keys // block_n)))
    shares = []
    for batch_kv_head in range(p.batch * p.kv_heads):
        length = lengths[batch_kv_head // p.kv_heads]
        item_shares = max(1, -(-blocks[batch_kv_head // p.kv_heads] // chunk))
        shares += [(batch_kv_head, split_keys(length, split, item_shares, block_n)) for split in range(item_shares)]
    return shares + [(-1, 0)] * (target + p.batch * p.kv_heads - len(shares))


def predict_balanced(case: DecodeCase, stack: StackModel, shares_per_sm: int, min_keys: int) -> Prediction:
    """:func:`predict` for triton/decode's balanced split (``BALANCED_SHARES_PER_SM`` = ``shares_per_sm``):
    every M tile's shares in launch order; the merge of the item with the most shares."""
    m_tiles = m_blocks(case, stack)
    target = max(1, -(-SM_COUNT * shares_per_sm // m_tiles))
    shares = balanced_share_keys(case, stack.block_n, target, min_keys)
    bytes_per_key = 2 * case.problem.head_dim * case.problem.dtype.itemsize
    work = [keys * bytes_per_key for keys in (keys for _ in range(m_tiles) for _, keys in shares)]
    most = max(sum(1 for other, _ in shares if other == item) for item, _ in shares if item >= 0)
    head_dim = case.problem.head_dim
    span = makespan_us(work, stack, head_dim, FIXED_US, EMPTY_US)
    busy = sorted(w for w in work if w)
    return Prediction(
        num_splits=most, ctas=len(work), busy_ctas=len(busy), waves=len(work) / (SM_COUNT * stack.occupancy),
        max_cta_mb=max(work) / 1e6, median_busy_kb=busy[len(busy) // 2] / 1e3 if busy else 0.0,
        ideal_us=case.kv_bytes_read / (READ_GBPS * 1e3),
        fixed_us=span - makespan_us(work, stack, head_dim, 0.0, 0.0), merge_us=merge_us(stack, most),
        us=LAUNCH_US + span + merge_us(stack, most),
    )  # fmt: skip


def fluid_run(
    ctas: Iterable[tuple[float, float, object]],
    slots: int,
    cap: float,
    on_end: Callable[[object, float], None],
    step_us: float = STEP_US,
    read_gbps: float | None = None,
) -> float:
    """Steps 1-3 of the module docstring on ``ctas`` (fixed µs, MB, tag) in launch order, in steps of
    ``step_us``: µs from the first CTA's start to the last one's end, ``on_end(tag, now)`` called as each
    CTA ends. ``read_gbps``: the read bandwidth shared (default ``READ_GBPS``, the H200's)."""
    bandwidth = (read_gbps or READ_GBPS) / 1e3  # MB per µs
    pending = iter(ctas)
    active: list[list] = []  # per CTA: [fixed µs left, MB left, tag]
    now = 0.0
    while True:
        while len(active) < slots and (nxt := next(pending, None)) is not None:
            active.append(list(nxt))
        if not active:
            return now
        streaming = sum(1 for cta in active if cta[0] <= 0.0)
        rate = min(cap, bandwidth / streaming) if streaming else 0.0
        for cta in active:
            if cta[0] > 0.0:
                cta[0] -= step_us
            else:
                cta[1] -= rate * step_us
        for cta in active:
            if cta[0] <= 0.0 and cta[1] <= 0.0:
                on_end(cta[2], now)
        active = [cta for cta in active if cta[0] > 0.0 or cta[1] > 0.0]
        now += step_us


def stream_cap(in_flight_blocks: int, block_n: int, head_dim: int) -> float:
    """Step 3's cap on one streaming CTA, MB per µs: its ring's blocks in flight over ``LATENCY_US``."""
    return in_flight_blocks * block_n * 4 * head_dim / 1e6 / LATENCY_US


def makespan_us(work: list[int], stack: StackModel, head_dim: int, fixed_us: float, empty_us: float) -> float:
    """Steps 1-3 of the module docstring: µs from the first CTA's start to the last one's end."""
    ctas = ((fixed_us if nxt else empty_us, nxt / 1e6, None) for nxt in work)
    cap = stream_cap(stack.in_flight_blocks, stack.block_n, head_dim)
    return fluid_run(ctas, SM_COUNT * stack.occupancy, cap, lambda tag, now: None)


def merge_steps(stack: StackModel, num_splits: int) -> int:
    """Dependent L2 round trips of the merge: triton's reads the LSEs as one vector, then its loop reads
    ``merge_splits_per_step`` splits a step; cute's two loops (LSEs, then O) are unrolled that many
    times, or with 0 as the compiler chose (sm_90a SASS of the committed merge: the LSE loop 16 times,
    the O loop twice)."""
    per_step = stack.merge_splits_per_step
    if stack.name != "cute":
        return 1 + -(-num_splits // per_step)
    if per_step == 0:
        return -(-num_splits // 16) + -(-num_splits // 2)
    return 2 * -(-num_splits // per_step)


def merge_us(stack: StackModel, num_splits: int) -> float:
    """Step 4 of the module docstring (0 with one split: the split kernel writes O)."""
    if num_splits == 1:
        return 0.0
    return MERGE_GAP_US + MERGE_STEP_US * merge_steps(stack, num_splits)


@dataclass(frozen=True)
class Prediction:
    """Modelled time of one rung at one split count, and where it goes."""

    num_splits: int
    ctas: int
    busy_ctas: int
    waves: float  # CTAs over the SMs' CTA slots
    max_cta_mb: float
    median_busy_kb: float
    ideal_us: float  # the bytes a step needs at the read bandwidth
    fixed_us: float  # what the CTAs' fixed latencies add
    merge_us: float
    us: float

    @property
    def pct(self) -> float:
        return 100 * self.ideal_us / self.us

    @property
    def tail_us(self) -> float:
        """The rest: uneven CTAs, the last wave, bytes in flight per CTA."""
        return self.us - self.ideal_us - self.fixed_us - self.merge_us - LAUNCH_US


def predict(case: DecodeCase, stack: StackModel, num_splits: int) -> Prediction:
    work = cta_bytes(case, stack, num_splits)
    head_dim = case.problem.head_dim
    span = makespan_us(work, stack, head_dim, FIXED_US, EMPTY_US)
    without_fixed = makespan_us(work, stack, head_dim, 0.0, 0.0)
    merge = merge_us(stack, num_splits)
    busy = sorted(w for w in work if w)
    return Prediction(
        num_splits=num_splits,
        ctas=len(work),
        busy_ctas=len(busy),
        waves=len(work) / (SM_COUNT * stack.occupancy),
        max_cta_mb=max(work) / 1e6,
        median_busy_kb=busy[len(busy) // 2] / 1e3 if busy else 0.0,
        ideal_us=case.kv_bytes_read / (READ_GBPS * 1e3),
        fixed_us=span - without_fixed,
        merge_us=merge,
        us=LAUNCH_US + span + merge,
    )


def rule_splits(case: DecodeCase, stack: StackModel) -> int:
    """The split count the shared rule gives this rung (``splits.planned_num_splits`` on 132 SMs)."""
    p = case.problem
    ctas_per_split = p.batch * p.kv_heads * m_blocks(case, stack)
    return splits.choose_num_splits(ctas_per_split, p.seqlen_k, SM_COUNT, splits.uneven_work(p), p.batch)


def with_tile_candidate(stack: StackModel, head_dim: int) -> StackModel | None:
    """``stack`` with its ``after+tile`` candidate, or None where it has none."""
    candidate = TILE_CANDIDATES.get((stack.name, head_dim))
    if candidate is None:
        return None
    block_n, in_flight_blocks, occupancy = candidate
    return replace(stack, block_n=block_n, in_flight_blocks=in_flight_blocks, occupancy=occupancy)


def table(merge_splits_per_step: int) -> str:
    """A markdown row per (shape, rung): the grid, where the time goes before (µs: the ideal, the CTAs'
    fixed latencies, the merge, the rest), and % before → after (``merge_splits_per_step`` splits a
    merge step) → after with the rung's tile candidate, as bench/decode_floor.py times them."""
    lines = [
        "| shape | rung | splits | CTAs (busy) | waves | largest CTA | median busy CTA | ideal | fixed | "
        "merge | tail | before | after | after+tile |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case in random_cases(COUNT, SEED):
        for stack in stack_models(case.problem.head_dim):
            num_splits = rule_splits(case, stack)
            before = predict(case, stack, num_splits)
            after_stack = replace(stack, merge_splits_per_step=merge_splits_per_step)
            after = predict(case, after_stack, num_splits)
            tile_stack = with_tile_candidate(after_stack, case.problem.head_dim)
            tile = f"{predict(case, tile_stack, num_splits).pct:.0f} %" if tile_stack else "—"
            lines.append(
                f"| {case.describe()} | {stack.name} | {num_splits} | {before.ctas} ({before.busy_ctas}) | "
                f"{before.waves:.1f} | {before.max_cta_mb:.2f} MB | {before.median_busy_kb:.0f} KB | "
                f"{before.ideal_us:.0f} µs | {before.fixed_us:.0f} | {before.merge_us:.0f} | {before.tail_us:.0f} | "
                f"{before.us:.0f} µs ({before.pct:.0f} %) | {after.us:.0f} µs ({after.pct:.0f} %) | {tile} |"
            )
    return "\n".join(lines) + "\n"


def balanced_table(cases: list[DecodeCase], min_keys: int = splits.MIN_KEYS_PER_SPLIT) -> str:
    """A markdown row per shape: triton/decode after (the rule's splits) against the balanced split at 2
    and 4 shares per SM (the most shares of one item, CTAs per M tile, modelled µs and %)."""
    lines = ["| shape | after | balanced, 2 / SM | balanced, 4 / SM |", "|---|---|---|---|"]
    for case in cases:
        stack = stack_models(case.problem.head_dim, 8)[0]
        after = predict(case, stack, rule_splits(case, stack))
        cells = [f"{after.num_splits} splits: {after.us:.0f} µs ({after.pct:.0f} %)"]
        for per_sm in (2, 4):
            balanced = predict_balanced(case, stack, per_sm, min_keys)
            cells.append(f"≤ {balanced.num_splits} shares: {balanced.us:.0f} µs ({balanced.pct:.0f} %)")
        lines.append(f"| {case.describe()} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def fifth_variants(case: DecodeCase, stack: StackModel) -> dict[str, tuple[StackModel, int] | None]:
    """The (stack, split count) each fifth-stop setting gives ``stack`` on ``case`` (``after``: the
    committed rule; None where the setting leaves the plan as it is or the rung has no such switch)."""
    p = case.problem
    m_tiles = m_blocks(case, stack)
    rule = rule_splits(case, stack)
    cpu = torch.device("cpu")
    fit = min(2, FIFTH_FIT[stack.name][p.head_dim])
    slots = splits.planned_num_splits(p, m_tiles, cpu, splits.SplitPolicy(ctas_per_sm=fit))
    one = splits.planned_num_splits(p, m_tiles, cpu, splits.SplitPolicy(short_one_split=True))
    deep = stack.name == "triton" and rule * m_tiles * p.batch * p.kv_heads <= SM_COUNT
    short = p.head_dim == 128 and p.seqlen_k <= splits.SHORT_CACHE_KEYS and stack.name in SHORT_TILES
    short_stack = stack
    if short:
        block_n, in_flight, occupancy = SHORT_TILES[stack.name]
        short_stack = replace(stack, block_n=block_n, in_flight_blocks=in_flight, occupancy=occupancy)
    variants = {
        "after": (stack, rule),
        "slots-2": (stack, slots) if slots != rule else None,
        "one-split": (stack, one) if one != rule else None,
        "deep-ring": (replace(stack, in_flight_blocks=DEEP_RING_IN_FLIGHT[p.head_dim]), rule) if deep else None,
        "short-tile": (short_stack, rule) if short else None,
    }
    # fifth: every switch on; the deep ring only where the grid stays one CTA per SM.
    fifth_splits = one if one != rule else slots
    fifth_stack = short_stack if short else stack
    if stack.name == "triton" and fifth_splits * m_tiles * p.batch * p.kv_heads <= SM_COUNT:
        fifth_stack = replace(fifth_stack, in_flight_blocks=DEEP_RING_IN_FLIGHT[p.head_dim])
    fifth = (fifth_stack, fifth_splits)
    variants["fifth"] = fifth if fifth not in variants.values() else None
    return variants


def fifth_table(cases: list[DecodeCase]) -> str:
    """A markdown row per (shape, rung): modelled % of the read bandwidth (split count) of each fifth-stop
    setting, with the merge after (8 splits a step); — where a setting leaves the plan as it is. For
    triton/decode on ragged shapes also its committed balanced split (2 shares per SM; most shares of one
    item), alone and on the short tile."""
    names = ("after", "slots-2", "one-split", "deep-ring", "short-tile", "fifth", "committed", "balanced+short-tile")
    lines = ["| shape | rung | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for case in cases:
        for stack in stack_models(case.problem.head_dim, 8):
            variants = fifth_variants(case, stack)
            cells = ["—" if v is None else _pct_cell(predict(case, *v)) for v in variants.values()]
            balanced = [None, None]
            if stack.name == "triton" and case.problem.has_cache_seqlens:
                short = variants["short-tile"]
                balanced = [stack, short[0] if short else None]
            min_keys = splits.MIN_KEYS_PER_SPLIT
            cells += ["—" if b is None else _pct_cell(predict_balanced(case, b, 2, min_keys)) for b in balanced]
            lines.append(f"| {case.describe()} | {stack.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _pct_cell(prediction: Prediction) -> str:
    return f"{prediction.pct:.0f} % ({prediction.num_splits})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--merge-splits-per-step", type=int, default=8, help="the merge after (default 8)")
    parser.add_argument(
        "--balanced", action="store_true", help="triton/decode after vs its balanced split (seeds 1 and 29)"
    )
    parser.add_argument(
        "--fifth", action="store_true", help="the fifth stop's settings on bench/decode_floor5.sh's shapes"
    )
    args = parser.parse_args(argv)
    if args.fifth:
        seed29, seed1 = random_cases(8, 29), random_cases(COUNT, SEED)
        print(fifth_table([seed29[i] for i in (6, 7, 2, 5)] + [seed1[i] for i in (4, 9, 0, 2)]), end="")
        return 0
    if args.balanced:
        print(balanced_table(random_cases(COUNT, SEED) + random_cases(8, 29)), end="")
        return 0
    print(table(args.merge_splits_per_step), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
