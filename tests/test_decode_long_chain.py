"""The balanced split for long merge chains (``BALANCED_SPLIT = "ragged-split-long"`` of the three decode rungs,
issue #38; ``splits.LONG_CHAIN_SPLITS``).

Where the split rule cuts few (batch, KV head) items into many splits (one long sequence over one or two KV heads),
the padded split's last CTA merges them in a chain of dependent L2 round trips after every key was read; the balanced
plan merges runs of shares instead (H200, results/h200/decode-long-few-heads/, decode-long-chain/). CPU: the committed
switch gives these rows, with and without ``cache_seqlens``, the balanced split, and keeps the padded split where the
rule splits less (a planted "ragged-split" fails). GPU: each row against fp64 on a poisoned output, with the plan the
CPU predicted.
"""

from __future__ import annotations

import importlib
from typing import NamedTuple

import pytest
import torch

from common.contract import splits
from common.contract.check import check_on_inputs
from common.contract.problem import Problem
from common.contract.registry import discover
from tests._helpers import decode_call_inputs

CPU = torch.device("cpu")
RUNGS = {
    "triton/decode": "triton_impl.decode", "gluon/decode": "triton_impl.gluon.decode", "cute/decode": "cute_impl.decode"
}  # fmt: skip


class Row(NamedTuple):
    name: str
    problem: Problem
    lengths: tuple[int, ...] | None  # cache_seqlens, or None for full caches


def _problem(batch: int, heads: int, kv_heads: int, seqlen_q: int, seqlen_k: int, head_dim: int, **changes) -> Problem:
    fields = dict(causal=True, causal_alignment="bottom_right", return_lse=True) | changes
    return Problem(batch, heads, seqlen_q, seqlen_k, head_dim, kv_heads=kv_heads, **fields)


# Seed 193's row 6 full and with a shorter length, seed 93's row 0 (D=256, pages of 128) scaled down, fp16 top-left,
# and two full sequences over one KV head (B > 1 without cache_seqlens), non-causal.
LONG_ROWS = [
    Row("193-6-full", _problem(1, 8, 2, 1, 132608, 128), None),
    Row("one-length-d128", _problem(1, 8, 2, 1, 132608, 128, has_cache_seqlens=True), (100003,)),
    Row("paged128-d256-sq4", _problem(1, 32, 2, 4, 65536, 256, has_cache_seqlens=True, page_size=128), (50001,)),
    Row("fp16-top-left", _problem(1, 4, 1, 2, 98304, 64, dtype=torch.float16, causal_alignment="top_left"), None),
    Row("two-full-mqa", _problem(2, 8, 1, 1, 81920, 128, causal=False), None),
]
# The rule splits these at most LONG_CHAIN_SPLITS times: the padded split stays.
SHORT_ROWS = [
    Row("one-128k-hkv8", _problem(1, 32, 8, 1, 131072, 128), None),
    Row("one-16k-hkv2", _problem(1, 8, 2, 1, 16384, 128, has_cache_seqlens=True), (16384,)),
]


def _module(rung: str):
    if rung == "cute/decode":
        pytest.importorskip("cutlass")
    return importlib.import_module(RUNGS[rung])


@pytest.mark.parametrize("rung", sorted(RUNGS))
def test_long_chains_take_the_balanced_split_and_short_ones_keep_the_padded(rung: str):
    module = _module(rung)
    assert module.BALANCED_SPLIT == "ragged-split-long"
    for row in LONG_ROWS:
        assert module.planned_num_splits(row.problem, CPU) > splits.LONG_CHAIN_SPLITS, row.name
        assert module.balanced_split(row.problem, CPU), row.name
    for row in SHORT_ROWS:
        assert 1 < module.planned_num_splits(row.problem, CPU) <= splits.LONG_CHAIN_SPLITS, row.name
        assert not module.balanced_split(row.problem, CPU), row.name


@pytest.mark.parametrize("rung", sorted(RUNGS))
def test_planted_ragged_split_keeps_the_long_chains(rung: str, monkeypatch: pytest.MonkeyPatch):
    """The switch before this stop: one sequence, or no cache_seqlens, keeps the padded split's long chain."""
    monkeypatch.setattr(_module(rung), "BALANCED_SPLIT", "ragged-split")
    assert not any(_module(rung).balanced_split(row.problem, CPU) for row in LONG_ROWS)


@pytest.mark.gpu
@pytest.mark.parametrize("row", LONG_ROWS + SHORT_ROWS, ids=[row.name for row in LONG_ROWS + SHORT_ROWS])
@pytest.mark.parametrize("rung", sorted(RUNGS))
def test_gpu_long_chain_rows_against_fp64(rung: str, row: Row):
    _module(rung)
    impl = {impl.name: impl for impl in discover(include_baselines=False)[0]}[rung]
    inputs, extra = decode_call_inputs(row.problem, row.lengths, seed=len(row.name))
    result = check_on_inputs(impl, *inputs, row.problem, **extra)
    assert result.ok, f"{rung} {row.problem.describe()}: {result.summary()}"
    run = impl.prepare(*inputs, row.problem, **extra)
    assert getattr(run, "balanced", False) == (row in LONG_ROWS), f"{rung} {row.name}: the plan the CPU predicted"
