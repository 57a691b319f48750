"""The padded split's merge chain per row of the random decode sweep, on the CPU (issue #38, helper ``longkv``).

The last CTA of a tile to arrive merges its splits' partials (``_decode_merge.merge_splits`` in triton/decode,
``_merge_splits`` in gluon/decode): a pass for the LSE maximum and a pass for the weighted sum, each a runtime loop of
``ceil(splits / splits a step)`` steps whose loads are used in the step that issues them (sm_90a SASS: one step's
``LDG.E.STRONG.GPU`` loads, then their use; no step's loads issued under another's). Each step is a dependent L2 round
trip, paid after every key was read, once per ``MERGE_ROWS`` (gluon) or ``MERGE_CHUNK_ROWS`` (triton's D=256 tiles of
more rows) merged rows: ``chunks · 2 · ceil(splits / step)`` round trips. This prints that count for each row whose
rung takes the padded split with more than one split, under the committed constants and under
``--set MODULE:NAME=VALUE`` (e.g. ``triton_impl.decode:MERGE_STEP_REGISTERS=128``), the rows whose count changes first,
most round trips saved per MB first. Balanced-split rows (two-level merge) and gluon's items kernel are left out.

    python -m bench.decode_merge_chain --set triton_impl.decode:MERGE_STEP_REGISTERS=128 --seeds 41 199
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
from unittest import mock

import torch

DEVICE = torch.device("cpu")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def merge_chain(rung: str, problem) -> tuple[int, int, int] | None:
    """(splits, splits a merge step, dependent round trips) of ``problem``'s padded split in ``rung``, or None where
    it takes one split, the balanced split or gluon's items kernel."""
    from triton_impl import decode as td
    from triton_impl.gluon import _decode_merge as gluon_merge
    from triton_impl.gluon import decode as gd

    rows = problem.kv_group * problem.seqlen_q
    if rung == "triton/decode":
        if td.balanced_split(problem, DEVICE):
            return None
        num_splits, block_m = td.planned_num_splits(problem, DEVICE), td.block_m_for(problem)
        chunked = problem.head_dim >= td.MERGE_CHUNK_HEAD_DIM.value and block_m > td.MERGE_CHUNK_ROWS.value
        chunks = block_m // td.MERGE_CHUNK_ROWS.value if chunked else 1
        step = td._merge_step(problem)
    else:
        if gd.balanced_split(problem, DEVICE) or gd.items_in_flight(problem, DEVICE):
            return None
        num_splits = gd.planned_num_splits(problem, DEVICE)
        merge_rows = gluon_merge.MERGE_ROWS.value
        chunks = cdiv(min(rows, gd.block_m_for(problem)), merge_rows)
        step = td.merge_splits_per_step(merge_rows, problem.head_dim, gd.num_warps_for(problem))
    if num_splits == 1:
        return None
    return num_splits, step, chunks * 2 * cdiv(num_splits, step)


@contextlib.contextmanager
def setting(assignment: str | None):
    if not assignment:
        yield
        return
    target, _, value = assignment.partition("=")
    module, _, name = target.partition(":")
    with mock.patch.object(importlib.import_module(module), name, ast.literal_eval(value)):
        yield


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", default=None, help="MODULE:NAME=VALUE, the setting compared with the committed one")
    parser.add_argument("--seeds", type=int, nargs=2, default=(41, 199), help="first and last seed (default 41 199)")
    parser.add_argument("--top", type=int, default=30, help="rows printed (default 30)")
    args = parser.parse_args(argv)
    from common.measure.decode_sweep import random_cases

    found = []
    for seed in range(args.seeds[0], args.seeds[1] + 1):
        for index, case in enumerate(random_cases(8, seed)):
            problem = case.problem
            keys = sum(case.lengths) if case.lengths else problem.batch * problem.seqlen_k
            megabytes = 4 * problem.head_dim * problem.kv_heads * keys / 1e6
            for rung in ("triton/decode", "gluon/decode"):
                before = merge_chain(rung, problem)
                with setting(args.set):
                    after = merge_chain(rung, problem)
                if before:
                    found.append((f"{seed}/{index}", rung, before, after, megabytes, problem))
    changed = [row for row in found if row[3] != row[2]]
    print(f"{len(found)} (row, rung) pairs merge a padded split; {len(changed)} change under {args.set}")
    ordered = sorted(changed or found, key=lambda row: -((row[2][2] - (row[3] or row[2])[2]) or row[2][2]) / row[4])
    for label, rung, before, after, megabytes, p in ordered[: args.top]:
        shape = f"B={p.batch} H={p.heads} Hkv={p.kv_heads} Sq={p.seqlen_q} Sk={p.seqlen_k} D={p.head_dim}"
        shown = f" -> step {after[1]}, {after[2]}" if after and after != before else ""
        print(
            f"{label:7s} {rung:14s} {before[0]:3d} splits, step {before[1]}, {before[2]:3d} round trips{shown}"
            f" | {megabytes:5.0f} MB {shape} page {p.page_size} {'lengths' if p.has_cache_seqlens else 'full'}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
