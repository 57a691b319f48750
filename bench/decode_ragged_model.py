"""The balanced split's critical path on seed 43's ragged rows, per rung and per ``bench/decode_ragged_ab.py`` setting.

No GPU. ``bench/decode_model.py``'s fluid model (its constants: an H200's SMs and read bandwidth, a CTA's fixed
latency and Little's-law cap on its streaming rate, a merge step's L2 round trip), fed with each rung's own
balanced plan as committed or under a setting's switches: the target shares, each item's share count
(``splits.balanced_item_shares``, with the rung's key block, least share and item-share cap), the M tiles, the
CTAs an SM holds and the blocks a CTA keeps in flight. CTAs start in grid order (shares of M tile 0 first,
items in (batch, KV head) order) as slots free; an item's merge starts when its last share ends and is a chain
of dependent L2 round trips: in triton/decode and gluon/decode the last share's (the LSE pass, then the O pass,
``merge_splits_per_step`` splits a step; gluon per 16 packed rows), in cute/decode a second kernel after the
first (its own launch, ``MERGE_SPLITS_PER_STEP`` a step; with ``BALANCED_MERGE_RUNS``, the longest of its runs,
the runs' merge in shared memory taken as free). The step is the later of the last CTA and the last merge.

It ranks limiters, it does not replace the A/B: it misses the harness's fixed cost (``do_bench``'s dirty L2,
16-28 µs at these sizes, ``results/h200/decode-fewpairs/``) and the B=64 D=64 row's measured time (the model has
it at 82-87 % where the rungs read 53-69 %). A merge step of 0.45 µs (``--merge-step-us``, not decode_model's
0.7) puts the D=256 rows' defaults near their measured times (triton 121 / gluon 125 / cute 81 µs against 133 /
140 / 97 on the paged MQA row, 117 / 120 / 131 against 105 / 136 / 137 on the B=3 row); ``--latency-us``
moves the per-CTA streaming cap, on which the best cap depends (a CTA of a capped item streams more keys).

    python -m bench.decode_ragged_model --merge-step-us 0.45     # from the project root; no GPU
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass

import torch

from bench import decode_model
from bench.decode_ragged_ab import RUNG_MODULES, cases, settings, switched
from common.contract import splits

CPU = torch.device("cpu")
STEP_US = 0.1


@dataclass(frozen=True)
class RungPlan:
    """What the model needs of one rung's balanced launch of one shape."""

    block_n: int
    in_flight_blocks: int
    slots: int  # CTAs an SM holds
    m_blocks: int
    target: int
    shares: tuple[int, ...]  # per sequence, each of its KV heads
    merge_per_step: int
    merge_chunks: int  # gluon merges 16 packed rows at a time
    merge_kernel: bool  # cute: a second kernel
    merge_group: int = 0  # gluon's BALANCED_MERGE_GROUP: an item's shares merge in runs of that many, then the runs
    merge_runs: int = 1  # cute's BALANCED_MERGE_RUNS: an item's shares merge in that many runs at once, then the runs


def rung_plan(rung: str, problem, lengths: tuple[int, ...]) -> RungPlan:
    """``rung``'s balanced plan of ``problem`` under its module's current constants."""
    module = importlib.import_module(RUNG_MODULES[rung])
    rows = problem.kv_group * problem.seqlen_q
    merge_group, merge_runs = 0, 1
    if rung == "triton/decode":
        config = module.tile_config(problem)
        block_n, stages = config.block_n, config.num_stages
        slots = config.ctas_per_sm or module.CTAS_PER_SM_FIT[problem.head_dim]
        target, cap, min_keys = (
            module.balanced_target_shares(problem, CPU),
            module.BALANCED_MAX_ITEM_SHARES,
            module.BALANCED_MIN_KEYS,
        )
        per_step, chunks, merge_kernel = module._merge_step(problem), 1, False
    elif rung == "gluon/decode":
        from triton_impl.gluon import _decode_balanced, _decode_merge

        config = module.balanced_config(problem, CPU)
        block_n, stages, slots = config.block_n, config.num_stages, module.split_policy(problem, config).ctas_per_sm
        _, target, _, _ = _decode_balanced.balanced_sizes(
            problem, CPU, None, module.m_blocks_for(problem), block_n, slots, module.BALANCED_SHARES_BY_SLOTS
        )
        triton_decode = importlib.import_module("triton_impl.decode")
        cap, min_keys = _decode_balanced.item_share_cap(), triton_decode.BALANCED_MIN_KEYS
        merge_group = _decode_balanced.BALANCED_MERGE_GROUP
        merge_rows = _decode_merge.MERGE_ROWS.value
        per_step = triton_decode.merge_splits_per_step(merge_rows, problem.head_dim, module.num_warps_for(problem))
        chunks, merge_kernel = -(-min(rows, module.block_m_for(problem)) // merge_rows), False
    else:
        shape = module.TILE_CONFIGS[problem.head_dim]
        block_n, stages, slots = shape.tile_n, shape.stages, module.CTAS_PER_SM_FIT[problem.head_dim]
        target, _, _, config = module.launch_plan(problem, CPU)
        cap, min_keys = config.balanced_max_shares, module.BALANCED_MIN_KEYS
        per_step, chunks, merge_kernel = module.MERGE_SPLITS_PER_STEP, 1, True
        merge_runs = config.merge_runs
    blocks = [-(-length // block_n) for length in lengths]
    min_blocks = splits.balanced_min_share_blocks(block_n, min_keys)
    shares = splits.balanced_item_shares(blocks, problem.kv_heads, target, min_blocks, cap)
    m_blocks = module.m_blocks_for(problem)
    merged = (per_step, chunks, merge_kernel, merge_group)
    return RungPlan(block_n, stages - 1, slots, m_blocks, target, tuple(shares), *merged, merge_runs)


def merge_us(plan: RungPlan, shares: int) -> float:
    """An item's merge of ``shares`` partials after its last share ends: its L2 round trips (0 for one share: the
    share writes O); with ``merge_group``, the last run's merge and then the runs' (the last share's run is the
    last to arrive); with ``merge_runs``, the longest run's (the runs' merge reads shared memory, not L2)."""
    if shares == 1:
        return 0.0
    levels = [-(-shares // plan.merge_runs)]
    if plan.merge_group and shares > plan.merge_group:
        levels = [min(shares, plan.merge_group), -(-shares // plan.merge_group)]
    steps = sum(2 * -(-count // plan.merge_per_step) * plan.merge_chunks for count in levels)
    return (decode_model.MERGE_GAP_US if plan.merge_kernel else 0.0) + decode_model.MERGE_STEP_US * steps


def ctas(plan: RungPlan, problem, lengths: tuple[int, ...]) -> list[tuple[tuple[int, int, int] | None, int, float]]:
    """(item, its shares, MB) of each CTA in launch order; the CTAs past the last share carry nothing."""
    mb_per_key = 4 * problem.head_dim / 1e6
    work = []
    for m_block in range(plan.m_blocks):
        first = len(work)
        for batch, length in enumerate(lengths):
            count, blocks = plan.shares[batch], -(-length // plan.block_n)
            per_share = -(-blocks // count)
            for kv_head in range(problem.kv_heads):
                for split in range(count):
                    begin = min(split * per_share * plan.block_n, length)
                    keys = min(begin + per_share * plan.block_n, length) - begin
                    work.append(((batch, kv_head, m_block), count, keys * mb_per_key))
        work += [(None, 1, 0.0)] * (plan.target + len(lengths) * problem.kv_heads - (len(work) - first))
    return work


def step_us(plan: RungPlan, problem, lengths: tuple[int, ...]) -> tuple[float, float]:
    """(modelled µs of the step, µs of the longest merge)."""
    cap = decode_model.stream_cap(plan.in_flight_blocks, plan.block_n, problem.head_dim)
    arrived: dict[tuple, int] = {}
    merged = 0.0

    def share_ends(item: tuple[tuple, int] | None, now: float) -> None:
        nonlocal merged
        if item is None:
            return
        key, count = item
        arrived[key] = arrived.get(key, 0) + 1
        if arrived[key] == count:  # the item's last share: its merge follows
            merged = max(merged, now + merge_us(plan, count))

    work = (
        (decode_model.FIXED_US if mb else decode_model.EMPTY_US, mb, None if key is None else (key, count))
        for key, count, mb in ctas(plan, problem, lengths)
    )
    now = decode_model.fluid_run(work, decode_model.SM_COUNT * plan.slots, cap, share_ends, STEP_US)
    longest = merge_us(plan, max(plan.shares))
    if plan.merge_kernel:
        return decode_model.LAUNCH_US * 2 + now + longest, longest
    return decode_model.LAUNCH_US + max(now, merged), longest


def table() -> str:
    """A markdown row per (shape, rung): the default plan and the modelled µs (% of the read bandwidth) of
    each setting, the longest merge in brackets."""
    lines = ["| shape | rung | default plan | setting µs (% of the read bandwidth) [longest merge µs] |"]
    lines.append("|---|---|---|---|")
    for case in cases():
        problem, lengths = case.problem, case.lengths
        ideal = case.kv_bytes_read / (decode_model.READ_GBPS * 1e3)
        for rung in RUNG_MODULES:
            cells, described = [], ""
            for name, setting, switches in settings():
                if name != rung:
                    continue
                with switched(switches):
                    plan = rung_plan(rung, problem, lengths)
                us, longest = step_us(plan, problem, lengths)
                if setting == "default":
                    described = f"{plan.target} target, {max(plan.shares)} shares of one item, {plan.slots}/SM"
                cells.append(f"{setting} {us:.0f} ({100 * ideal / us:.0f} %) [{longest:.0f}]")
            lines.append(f"| {case.describe()} | {rung} | {described} | " + "; ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--merge-step-us", type=float, default=decode_model.MERGE_STEP_US, help="a merge step's µs")
    parser.add_argument("--latency-us", type=float, default=decode_model.LATENCY_US, help="a CTA's load latency, µs")
    args = parser.parse_args(argv)
    decode_model.MERGE_STEP_US, decode_model.LATENCY_US = args.merge_step_us, args.latency_us
    print(table(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
