"""bench/cute_balanced_ab.py's plan on the CPU: the rows it names, and that its settings turn cute/decode's
balanced split off and on (the compile key and the grid of shares) and restore the committed switch."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("cutlass")

from bench import cute_balanced_ab
from bench.decode_fewpairs import switched
from common.contract import splits
from cute_impl import decode

CPU = torch.device("cpu")


def test_cases_are_the_ragged_rows_and_two_full_caches_given_as_lengths():
    cases = cute_balanced_ab.cases()
    assert [case.describe().split(" bf16")[0] for case in cases] == [
        "B=16 H=1 Sq=8 Sk=147456 D=256", "B=32 H=10 Hkv=2 Sq=1 Sk=410368 D=64", "B=16 H=256 Hkv=32 Sq=2 Sk=19712 D=128",
        "B=8 H=32 Hkv=8 Sq=1 Sk=8192 D=128", "B=1 H=32 Hkv=8 Sq=1 Sk=131072 D=128",
    ]  # fmt: skip
    assert [(min(case.lengths), max(case.lengths)) for case in cases[:3]] == [(23, 138969), (21, 288703), (16, 14082)]
    assert all(case.problem.has_cache_seqlens for case in cases)
    assert all(case.lengths == (case.problem.seqlen_k,) * case.problem.batch for case in cases[3:])


def test_settings_switch_the_balanced_split_and_restore_it():
    committed = decode.BALANCED_SPLIT
    problem = cute_balanced_ab.cases()[0].problem
    balanced = {}
    for name, setting, switches in cute_balanced_ab.SETTINGS:
        if name == "cute/decode":
            with switched(decode, switches):
                balanced[setting] = decode.compile_plan(problem).balanced_min_blocks
    assert balanced == {"never": 0, "always": splits.MIN_KEYS_PER_SPLIT // decode.TILE_CONFIGS[256].tile_n}
    assert committed == decode.BALANCED_SPLIT
    # The ragged MQA row: 264 shares (2 per SM of 132) + 16 items, where the padded split launches 2048 CTAs.
    tile_n = decode.TILE_CONFIGS[256].tile_n
    assert splits.balanced_target_shares(problem, CPU, 1, tile_n, decode.BALANCED_SHARES_PER_SM) == 264


def test_triton_settings_switch_its_balanced_split_only_where_the_rule_splits():
    """bench/triton_balanced_ab.py: "ragged" balances every row given lengths, "ragged-split" not B=1 (one
    sequence is all the work), and the committed switch comes back. Seed 31's B=32 Hkv=32 row (128 packed rows at
    D=64) is one split in triton's rule since its 128 rows take two 64-row tiles (``WIDE_M_TILE_HEAD_DIMS``,
    2026-12-06; two splits on the wide tile before), as in gluon's, so "ragged-split" leaves it padded too."""
    from bench import triton_balanced_ab
    from triton_impl import decode as triton_decode

    committed = triton_decode.BALANCED_SPLIT
    rows = cute_balanced_ab.cases(triton_balanced_ab.CASES)
    assert rows[1].describe().startswith("B=32 H=512 Hkv=32 Sq=8")
    taken = {}
    for name, setting, switches in triton_balanced_ab.SETTINGS:
        if name == "triton/decode":
            with switched(triton_decode, switches):
                taken[setting] = [triton_decode.balanced_split(row.problem, CPU) for row in rows]
    assert taken == {"ragged": [True] * 6, "ragged-split": [True, False, True, True, True, False], "never": [False] * 6}
    assert committed == triton_decode.BALANCED_SPLIT
