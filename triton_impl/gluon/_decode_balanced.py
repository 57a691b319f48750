"""gluon/decode's balanced split (``BALANCED_SPLIT``), triton/decode's (its module docstring; the share
plan is the Triton stack's ``balanced_plan``, run here through ``gluon/_device.py``'s ``balanced_share``).

In a ragged batch the split rule cuts every sequence into as many splits as the longest needs, so a
short sequence's splits end at once (or have no key at all: 1143 of 2048 CTAs on seed 31's B=16 MQA row)
while the long one's carry its keys. The balanced grid instead has target_shares + B · Hkv CTAs per M
tile, each an equal share of the valid keys (at least ``BALANCED_MIN_KEYS``): a (batch, KV head) item of
n key blocks takes cdiv(n, share) consecutive CTAs, whose partials are consecutive slabs of group · Sq
packed rows; the item's last share to arrive merges them (``_merge_tile`` on packed rows), and an item of
one share writes O and the LSE itself. The shape fixes the grid and the workspace, so a CUDA graph
replays it with new lengths (``M_TILE_MAJOR``: the grid's axes swapped, the M tile on x). Here: the kernel's
stores (:func:`_store_balanced`) and the host's sizes (:func:`balanced_sizes`, :func:`balanced_constexprs`); the
split kernel (``decode.py``, ``BALANCED``) is the rule's otherwise. ``BALANCED_MAX_ITEM_SHARES`` (32 since
``results/h200/decode-ragged-cap/``) caps the shares of one item, ``common/contract/splits.py``'s "item-share cap";
``BALANCED_TARGET`` picks its "target rule"; ``BALANCED_SHALLOW_RING`` a shallower ring where the grid spills past
one wave of the default ring's CTA slots (:func:`balanced_ring_stages`; splits.py's "The balanced grid past one wave").

``BALANCED_MERGE_GROUP`` (8 since its H200 A/B, ``bench/decode_merge_group_ab.sh``; 0: one level) merges an item of
more than G shares in two levels (:func:`_merge_in_groups`): each run of G consecutive shares has its own arrival
counter, and its last share to arrive merges the run into the run's first slab (a partial like any other); the last
run to arrive merges the runs' slabs, G slabs apart. One CTA's merge chain is then cdiv(G, step) + cdiv(runs, step)
load steps of each pass, not cdiv(shares, step), so the item-share cap, which trades that chain for longer shares,
counts runs: an item takes at most ``BALANCED_MAX_ITEM_SHARES`` · G shares (:func:`item_share_cap`). Seed 73's B=4
Hkv=2 paged row: under the cap of 32 its 164677-key sequence takes 32 shares of 81 key blocks, 2.5 times the others'
33, and its CTAs are the tail; with G = 8 it takes 78 even shares, merged in 2 + 4 steps where one CTA's 78 would
take 20.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from common.contract import splits
from common.contract.problem import Problem
from triton_impl import decode as triton_decode
from triton_impl.gluon._decode_merge import _last_to_arrive, _merge_tile, _store_output, _store_partials

# gluon/decode's item-share cap (splits.py's "item-share cap"; 0: none). 32 (H200, results/h200/decode-ragged-cap/):
# seed 43's two ragged D=256 rows 140.3 -> 94.7 and 137.0 -> 96.7 us, a full 180k row 177.4 -> 165.0; 48 lost on one.
BALANCED_MAX_ITEM_SHARES = 32
# gluon/decode's target rule (splits.BALANCED_TARGETS; splits.py's "The target rule"): "per-slot" counts its ring's
# CTA slots (split_policy) and the items. Against "per-sm" (H200, results/h200/decode-target/): seed 43's B=2 paged
# row 88.4 -> 67.4 us, its B=64 Hkv=16 row 172.4 -> 156.2, a full D=64 cache 163.2 -> 146.0; no row 2 % slower.
BALANCED_TARGET = "per-slot"
# Head dim -> the ring's stages where the balanced grid spills past one wave of the default ring's CTA slots
# (``splits.balanced_grid_spills``; splits.py's "The balanced grid past one wave"). {64: 4}: 64 KB of K/V + the
# 8 KB Q tile, three CTAs an SM (sm_90a: 127 registers, 73.8 KB), not D=64's six stages (two), so seed 73's 392-CTA
# 64-row row runs every share at once. The plan stays. H200 (results/h200/decode-shallow-ring/): 0.74-0.86x on the four
# rows that spill (seed 73's 80.9 -> 69.8 us, seed 71's paged 360.6 -> 267.8), one-wave and many-wave rows 1.00x.
BALANCED_SHALLOW_RING: dict[int, int] = {64: 4}
# Shares a run of the two-level merge takes (module docstring; 0: one level, the item's last share merges them all).
# 8 against 0 (H200, results/h200/decode-merge-group/): seed 73's paged row 72.7 -> 56.7 us (43 -> 55 % of the read
# bandwidth), seed 43's MQA D=256 paged row 94.4 -> 71.0, its ragged D=256 row 97.9 -> 86.4; controls 1.00x; one
# loss, seed 59's B=32 paged(16) row 135.0 -> 143.4 (1.06x: 45 shorter shares of its long item where the cap held 32).
BALANCED_MERGE_GROUP = 8


def item_share_cap() -> int:
    """The most shares an item takes (0: no cap): ``BALANCED_MAX_ITEM_SHARES``, times ``BALANCED_MERGE_GROUP`` where
    the item's shares merge in runs of that many (module docstring)."""
    if BALANCED_MERGE_GROUP < 0:
        raise ValueError(f"BALANCED_MERGE_GROUP must be >= 0 (0: one-level merge), got {BALANCED_MERGE_GROUP}")
    return BALANCED_MAX_ITEM_SHARES * max(BALANCED_MERGE_GROUP, 1)


def arrival_counter_count(items: int, slabs: int, m_blocks: int, balanced: bool) -> int:
    """The fused merge's arrival counters: one per (item, M tile), and with the two-level merge of a balanced launch
    one more per (share slab, M tile) past the grid's slabs · M tiles (a run's counter, at its first slab)."""
    grouped = balanced and BALANCED_MERGE_GROUP > 0
    return m_blocks * (2 * slabs if grouped else items)


@gluon.jit
def _merge_in_groups(
    workspace, outputs, tile, work, rows, item_counter, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr,
    SPLITS_PER_STEP: gl.constexpr, RETURN_LSE: gl.constexpr, M_TILE_MAJOR: gl.constexpr, MERGE_GROUP: gl.constexpr,
    num_warps: gl.constexpr, CONSUMERS: gl.constexpr = 1,
):  # fmt: skip
    """The two-level merge (module docstring) after CTA ``share`` stored its partials: an item of at most
    ``MERGE_GROUP`` shares merges in its last share to arrive, as with one level; else the share's run of
    ``MERGE_GROUP`` (its run counter past the grid's slabs · M tiles, at the run's first slab) merges into the run's
    first slab in the run's last share to arrive, and the item's last run to arrive merges the runs' slabs."""
    OutPartial, LsePartial, Counters = workspace
    share, split, item_shares, _ = work
    m_block = tile[5]
    first = share - split
    runs = (item_shares + MERGE_GROUP - 1) // MERGE_GROUP
    if runs == 1:
        if _last_to_arrive(item_counter, item_shares):
            partials = (OutPartial + first * rows * HEAD_DIM, LsePartial + first * rows, rows, item_shares)
            _merge_tile(partials, outputs, tile, BLOCK_M, HEAD_DIM, SPLITS_PER_STEP, RETURN_LSE, num_warps, PACKED=True)
    else:
        run_first = first + split // MERGE_GROUP * MERGE_GROUP
        run_shares = gl.minimum(item_shares - (run_first - first), MERGE_GROUP)
        m_tiles = gl.num_programs(0 if M_TILE_MAJOR else 1) * CONSUMERS
        slabs = gl.num_programs(1 if M_TILE_MAJOR else 0)
        run_counter = Counters + (slabs + run_first) * m_tiles + m_block
        if _last_to_arrive(run_counter, run_shares):
            run = (OutPartial + run_first * rows * HEAD_DIM, LsePartial + run_first * rows, rows, run_shares)
            _merge_tile(
                run, outputs, tile, BLOCK_M, HEAD_DIM, SPLITS_PER_STEP, RETURN_LSE, num_warps, PACKED=True,
                INTO_PARTIALS=True,
            )  # fmt: skip
            if _last_to_arrive(item_counter, runs):
                stride = rows * MERGE_GROUP
                partials = (OutPartial + first * rows * HEAD_DIM, LsePartial + first * rows, stride, runs)
                _merge_tile(
                    partials, outputs, tile, BLOCK_M, HEAD_DIM, SPLITS_PER_STEP, RETURN_LSE, num_warps, PACKED=True
                )


@gluon.jit
def _store_balanced(
    workspace, outputs, tile, work, rows_of, out, lse, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr,
    SPLITS_PER_STEP: gl.constexpr, RETURN_LSE: gl.constexpr, M_TILE_MAJOR: gl.constexpr, num_warps: gl.constexpr,
    MERGE_GROUP: gl.constexpr = 0, CONSUMERS: gl.constexpr = 1,
):  # fmt: skip
    """Store CTA ``share``'s result (``work``: share, split, item shares, has_work): O itself for an item
    of one share; else the partials in slab ``share`` and, in the item's last share to arrive, the merge
    of its slabs from share - split on (with ``MERGE_GROUP``, :func:`_merge_in_groups`). A CTA past the last share
    stores nothing. ``CONSUMERS``: M tiles a CTA (the grid's M tiles are its M extent times this)."""
    OutPartial, LsePartial, Counters = workspace
    batch, kv_head, group, heads, seqlen_q, m_block = tile
    share, split, item_shares, has_work = work
    head, token, row, row_ok, offs_d = rows_of
    if has_work:
        if item_shares == 1:
            _store_output(outputs, batch, head, token, row, row_ok, offs_d, out, lse, RETURN_LSE)
        else:
            rows = gl.to_tensor(group * seqlen_q).to(gl.int64)
            packed_row = (head - kv_head * group) * seqlen_q + token
            _store_partials(OutPartial, LsePartial, share * rows + packed_row, out, lse, row_ok, offs_d)
            # The item's arrival counter: (batch, KV head, M tile), heads // group = Hkv; M tiles on the grid's y
            # (x under M_TILE_MAJOR), CONSUMERS a CTA.
            m_tiles = gl.num_programs(0 if M_TILE_MAJOR else 1) * CONSUMERS
            work_item = (batch * (heads // group) + kv_head) * m_tiles + m_block
            if MERGE_GROUP > 0:
                _merge_in_groups(
                    workspace, outputs, tile, work, rows, Counters + work_item, BLOCK_M, HEAD_DIM, SPLITS_PER_STEP,
                    RETURN_LSE, M_TILE_MAJOR, MERGE_GROUP, num_warps, CONSUMERS,
                )  # fmt: skip
            elif _last_to_arrive(Counters + work_item, item_shares):
                first = (share - split) * rows
                partials = (OutPartial + first * HEAD_DIM, LsePartial + first, rows, item_shares)
                _merge_tile(
                    partials, outputs, tile, BLOCK_M, HEAD_DIM, SPLITS_PER_STEP, RETURN_LSE, num_warps, PACKED=True
                )


def balanced_sizes(
    problem: Problem, device: torch.device, shares: int | None, m_blocks: int, block_n: int, ctas_per_sm: int,
    by_slots: bool = False,
) -> tuple[int, int, int, int]:  # fmt: skip
    """The balanced kernel's (batch size, target shares, fewest key blocks a share takes, most shares an item
    takes: :func:`item_share_cap` as ``splits.balanced_plan_sizes`` passes it): ``BALANCED_TARGET``'s rule
    on ``ctas_per_sm`` CTA slots an SM, triton/decode's ``BALANCED_SHARES_PER_SM`` (at most ``ctas_per_sm`` with
    ``by_slots``, gluon/decode's ``BALANCED_SHARES_BY_SLOTS``) and ``BALANCED_MIN_KEYS`` on ``m_blocks`` tiles of
    ``block_n``-key blocks (``splits.resolve_balanced_shares``); ``shares`` forces the target."""
    per_sm, min_keys = triton_decode.BALANCED_SHARES_PER_SM, triton_decode.BALANCED_MIN_KEYS
    per_sm = min(per_sm, ctas_per_sm) if by_slots else per_sm
    rule = {"target": BALANCED_TARGET, "ctas_per_sm": ctas_per_sm}
    target = splits.resolve_balanced_shares(shares, problem, device, m_blocks, block_n, per_sm, min_keys, **rule)
    return problem.batch, target, *splits.balanced_plan_sizes(block_n, min_keys, item_share_cap())


def balanced_ring_stages(
    problem: Problem, device: torch.device, target: int, m_blocks: int, ctas_per_sm: int, stages: int
) -> int:
    """The balanced kernel's ring depth: ``stages`` (the default ring's, of ``ctas_per_sm`` CTA slots an SM), or
    ``BALANCED_SHALLOW_RING``'s where the grid of (``target`` + B · Hkv) · ``m_blocks`` CTAs spills past one wave of
    those slots on ``device`` (``splits.balanced_grid_spills``), never deeper than ``stages`` (a ring already
    shallower, e.g. ``PACKED_OCCUPANCY``'s for more CTAs an SM, stays)."""
    grid = (target + problem.batch * problem.kv_heads) * m_blocks
    shallow = splits.shallow_ring_depth(
        BALANCED_SHALLOW_RING, problem.head_dim, grid, splits.sm_count(device) * ctas_per_sm
    )
    return min(shallow, stages) if shallow else stages


def balanced_constexprs(problem: Problem, balanced: bool, m_tile_major: bool) -> dict[str, int | bool | None]:
    """The split kernel's constexprs of the balanced plan: the lengths' vector, BLOCK_B >= batch (at least
    triton/decode's ``MIN_BLOCK_B``; None in the padded split's kernel), the grid's axes (``M_TILE_MAJOR``,
    ``m_tile_major``; False in the padded split's kernel) and the merge's runs (``BALANCED_MERGE_GROUP``; 0 there)."""
    if not balanced:
        return {"BLOCK_B": None, "M_TILE_MAJOR": False, "MERGE_GROUP": 0}
    block_b = triton_decode.next_power_of_2(max(problem.batch, triton_decode.MIN_BLOCK_B))
    return {"BLOCK_B": block_b, "M_TILE_MAJOR": m_tile_major, "MERGE_GROUP": BALANCED_MERGE_GROUP}
