"""cute/decode's two-warpgroup CTA on the balanced split (issue #38; built, off and untimed): with
``decode.BALANCED_TWO_WARPGROUPS`` the balanced split's shares of 65-127 packed rows at D=128 (80 rows with cache
lengths: 86/4 at 54 % of the read bandwidth on an H100) take the padded split's CTA of two warpgroups, the share's two
M tiles in one CTA, on the 6-stage overlapped ring.

CPU: off by default; on, of the sweep's rows (seeds 1-239) exactly the twelve balanced 80-row rows move, each to one
128-row CTA of 8 warps on the overlapped 6-stage ring with the same shares and slabs, the share rule fed one CTA along
M, one CTA an SM and half the shares an SM; planted, a rule fed both M tiles fails. Static (sm_90a): 86/4 and a paged
row compile without spills, 256 threads of one CTA an SM, a key loop of HGMMA and no mma.sync. GPU (``gpu``;
bench/cute_decode_two_wg_balanced_ab.sh): on, 80 rows ragged (the rule's shares and forced ones), paged 16 and 64,
against fp64 on a poisoned output; planted, the CTA's rows taken in 64-row tiles (256 rows, two CTAs along M) fails.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("cutlass")

from common.contract import splits
from common.measure.decode_sweep import random_cases
from common.reporting.static import cubin_sass
from cute_impl import decode
from tests._helpers import knob_ab_problems
from tests.test_cute_decode_rows import RAGGED, _problem
from tests.test_cute_decode_two_wg import assert_planted_one_tile_rows_fail, assert_two_warpgroup_key_loop
from tests.test_cute_decode_wgmma import check_gpu_case, compile_with_shared_bytes
from tests.test_cute_decode_wide_tile import _ring_and_q_bytes, assert_kernels_fit

CPU = torch.device("cpu")
SEED86_ROW4 = random_cases(8, 86)[4].problem  # B=8 H=40 Hkv=8 Sq=16 Sk=26368 D=128 ragged: 80 rows, balanced
MOVED = [(86, 4), (38, 1), (55, 1), (93, 6), (169, 0), (13, 0), (23, 6), (66, 0), (76, 5), (201, 4), (208, 5), (226, 2)]


def _plan(problem, on: bool) -> tuple:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decode, "BALANCED_TWO_WARPGROUPS", on)
        return decode.launch_plan(problem, CPU)


def test_off_by_default():
    assert decode.BALANCED_TWO_WARPGROUPS is False
    assert not _plan(SEED86_ROW4, decode.BALANCED_TWO_WARPGROUPS)[3].two_warpgroups


def assert_one_cta_same_shares(problem, key) -> None:
    off, on = _plan(problem, False), _plan(problem, True)
    config = on[3]
    assert off[1] is not None and config.balanced_min_blocks, (key, "balanced")
    assert config.two_warpgroups and config.wgmma_overlap, (key, config)
    assert (config.tile_m, config.shape.num_warps, config.row_warps, config.shape.stages) == (128, 8, 8, 6), key
    assert on[:3] == off[:3], (key, off[:3], on[:3])  # shares, slabs, items


def test_on_moves_the_twelve_balanced_80_row_rows_keeping_their_shares():
    rows = {(seed, i): case.problem for seed in range(1, 240) for i, case in enumerate(random_cases(8, seed))}
    moved = {key for key, p in rows.items() if _plan(p, True) != _plan(p, False)}
    assert moved == set(MOVED), sorted(moved)
    for key in MOVED:
        assert rows[key].kv_group * rows[key].seqlen_q == 80 and rows[key].head_dim == 128, key
        assert_one_cta_same_shares(rows[key], key)


def test_the_share_rule_is_fed_one_cta_along_m_and_one_an_sm(monkeypatch: pytest.MonkeyPatch):
    calls = []
    real = splits.resolve_balanced_shares
    monkeypatch.setattr(splits, "resolve_balanced_shares", lambda *a, **k: calls.append((a, k)) or real(*a, **k))
    monkeypatch.setattr(decode, "BALANCED_TWO_WARPGROUPS", True)
    decode.launch_plan(SEED86_ROW4, CPU)
    (args, rule), *_ = calls
    m_blocks, shares_per_sm = args[3], args[5]
    assert (m_blocks, shares_per_sm, rule["ctas_per_sm"]) == (1, 1, 1), calls


def _both_m_tiles(problem, two_warpgroups: bool) -> int:
    """Planted: the share rule fed the one-warpgroup tiles whatever the CTA, so 86/4's shares halve."""
    return decode.m_blocks_for(problem)


def test_planted_rule_fed_both_m_tiles_fails(monkeypatch: pytest.MonkeyPatch):
    assert_one_cta_same_shares(SEED86_ROW4, (86, 4))
    monkeypatch.setattr(decode, "cta_m_blocks", _both_m_tiles)
    with pytest.raises(AssertionError):
        assert_one_cta_same_shares(SEED86_ROW4, (86, 4))


def test_ab_script_rows_parse_and_the_switch_moves_all_but_the_controls():
    head, rows = knob_ab_problems("cute_decode_two_wg_balanced_ab.sh", "two_wg_balanced")
    assert head[1:] == ["cute_impl.decode:BALANCED_TWO_WARPGROUPS", "False,True", "cute/decode"], head
    assert rows[0] == SEED86_ROW4
    moved = [_plan(p, True) != _plan(p, False) for p in rows]
    assert moved == [True] * (len(rows) - 2) + [False] * 2, moved


@pytest.mark.cute_compile
@pytest.mark.parametrize("key", [(86, 4), (66, 0)], ids=["86-4-contiguous", "66-0-paged64"])
def test_on_compiles_spill_free_on_hgmma(key: tuple, monkeypatch: pytest.MonkeyPatch):
    problem = random_cases(8, key[0])[key[1]].problem
    monkeypatch.setattr(decode, "BALANCED_TWO_WARPGROUPS", True)
    config = decode.compile_plan(problem, split=True)
    assert config.two_warpgroups and config.balanced_min_blocks and config.shape.stages == 6, config
    binary, shared = compile_with_shared_bytes(problem, monkeypatch)
    label = f"balanced two warpgroups {problem.describe()}"
    assert shared == _ring_and_q_bytes(config), (label, shared)
    assert_kernels_fit(binary, decode.TWO_WARPGROUP_CTAS_PER_SM, label, shared)
    assert_two_warpgroup_key_loop(binary, cubin_sass(binary.cubin), config, label)


# name -> (problem, lengths, forced shares, BALANCED_SPLIT): 80 packed rows (group 5 x Sq 16) at D=128, balanced.
GPU_CASES = {
    "80rows-ragged-rule": (_problem(4, 2, 5, 16, 1024, 128, has_cache_seqlens=True), RAGGED, None, "always"),
    "80rows-ragged-shares5": (_problem(4, 2, 5, 16, 1024, 128, has_cache_seqlens=True), RAGGED, 5, "always"),
    "80rows-paged16-ragged-rule": (_problem(4, 2, 5, 16, 1024, 128, has_cache_seqlens=True, page_size=16), RAGGED,
                                   None, "always"),
    "80rows-paged64-ragged-shares3": (_problem(4, 2, 5, 16, 1024, 128, has_cache_seqlens=True, page_size=64), RAGGED,
                                      3, "always"),
}  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gpu_balanced_two_warpgroups_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("WGMMA needs sm_90")
    check_gpu_case(case, GPU_CASES[case], monkeypatch, ("BALANCED_TWO_WARPGROUPS", True), "two_warpgroups")


@pytest.mark.gpu
def test_gpu_planted_one_tile_rows_fail_the_check(monkeypatch: pytest.MonkeyPatch):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("WGMMA needs sm_90")
    case = (_problem(4, 2, 16, 16, 1024, 128, has_cache_seqlens=True), RAGGED, None, "always")  # 256 rows, 2 CTAs
    switch = ("BALANCED_TWO_WARPGROUPS", True)
    assert_planted_one_tile_rows_fail(case, monkeypatch, switch, "the one-tile rows on the balanced split")
