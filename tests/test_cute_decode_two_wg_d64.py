"""cute/decode's two-warpgroup CTA at D=64 (issue #38; built, off: timed 1.02-1.13x slower on an H100, 2026-12-06,
results/h100/cute-decode-two-wg-candidates-2026-12-06/, so it stays a setting of the mechanism, not the default):
``decode.TWO_WARPGROUP_RINGS`` without 64 by default; with ``{64: 10}`` the D=64 rows of 65-127 packed rows on the
padded split (80 rows: 137/1 at 61 % of the read bandwidth on two 64-row CTAs a split) take one CTA of two warpgroups on
a 10-stage ring, as D=128's do on 6.

CPU: off by default; on, of the sweep's D=64 rows (seeds 1-239) exactly the seven 80-row rows on the padded split move,
each to one 128-row CTA of 8 warps on the overlapped 10-stage ring, their split counts staying but 221/7's (1 -> 2: the
rule is fed one CTA along M and one CTA an SM); the balanced rows keep their plans; the A/B script's rows parse and the
candidates move exactly its first seven. Static (sm_90a): 137/1 at 8 and 10 stages compiles without spills, 256 threads
of one CTA an SM in shared memory and registers, a key loop of 16 HGMMA and no mma.sync. GPU (``gpu``; bench/
cute_decode_two_wg_d64_ab.sh): on, 80 rows full (the rule's splits), ragged (2 forced splits) and paged(128) ragged,
against fp64 on a poisoned output; planted, the CTA's rows taken in 64-row tiles (256 rows, two CTAs along M, the
upper bound and the packed prefill off) must fail it.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("cutlass")

from common.measure.decode_sweep import random_cases
from common.reporting.static import cubin_sass
from cute_impl import decode
from tests._helpers import knob_ab_problems
from tests.test_cute_decode_rows import RAGGED, _problem
from tests.test_cute_decode_two_wg import assert_planted_one_tile_rows_fail, assert_two_warpgroup_key_loop
from tests.test_cute_decode_wgmma import check_gpu_case, compile_with_shared_bytes
from tests.test_cute_decode_wide_tile import _ring_and_q_bytes, assert_kernels_fit

CPU = torch.device("cpu")
ON = {128: 6, 64: 10}
SEED137_ROW1 = random_cases(8, 137)[1].problem  # B=16 H=10 Hkv=2 Sq=16 Sk=41472 D=64: 80 packed rows, full cache
MOVED_D64 = {(93, 4): 1, (108, 1): 1, (123, 1): 21, (137, 1): 4, (151, 1): 1, (186, 5): 32, (221, 7): 2}  # -> splits


def _plan(problem, rings: dict) -> tuple:
    """The launch plan and the padded split's CTAs along M with ``TWO_WARPGROUP_RINGS`` at ``rings``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decode, "TWO_WARPGROUP_RINGS", rings)
        return (*decode.launch_plan(problem, CPU), decode.padded_m_blocks(problem, CPU))


def test_off_by_default():
    assert 64 not in decode.TWO_WARPGROUP_RINGS
    assert not _plan(SEED137_ROW1, decode.TWO_WARPGROUP_RINGS)[3].two_warpgroups


def test_on_moves_the_seven_padded_80_row_rows_each_to_one_cta(monkeypatch: pytest.MonkeyPatch):
    # The split counts the candidate was built on: short caches on the balanced rule, as until 2026-12-06.
    monkeypatch.setattr(decode, "SHORT_CACHE_ONE_SPLIT", False)
    rows = {
        (seed, i): case.problem
        for seed in range(1, 240)
        for i, case in enumerate(random_cases(8, seed))
        if case.problem.head_dim == 64
    }
    moved = {key for key, p in rows.items() if _plan(p, ON)[:4] != _plan(p, decode.TWO_WARPGROUP_RINGS)[:4]}
    assert moved == set(MOVED_D64), sorted(moved)
    for key, num_splits in MOVED_D64.items():
        off, on = _plan(rows[key], decode.TWO_WARPGROUP_RINGS), _plan(rows[key], ON)
        config = on[3]
        assert rows[key].kv_group * rows[key].seqlen_q == 80 and on[1] is None, key
        assert config.two_warpgroups and config.wgmma_overlap, (key, config)
        assert (config.tile_m, config.shape.num_warps, config.row_warps, config.shape.stages) == (128, 8, 8, 10), key
        assert (off[4], on[4], on[0]) == (2, 1, num_splits), (key, off, on)


def test_ab_script_rows_parse_and_the_candidates_move_the_first_seven():
    head, rows = knob_ab_problems("cute_decode_two_wg_d64_ab.sh", "two_wg_d64")
    values = "{128: 6},{128: 6, 64: 8},{128: 6, 64: 10}"
    assert head[1:] == ["cute_impl.decode:TWO_WARPGROUP_RINGS", values, "cute/decode"], head
    assert rows[0] == SEED137_ROW1
    moved = [_plan(p, {128: 6, 64: 8})[:4] != _plan(p, {128: 6})[:4] for p in rows]
    assert moved == [True] * 7 + [False] * (len(rows) - 7), moved


@pytest.mark.cute_compile
@pytest.mark.parametrize("stages", [8, 10])
def test_on_compiles_spill_free_on_hgmma(stages: int, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(decode, "TWO_WARPGROUP_RINGS", {128: 6, 64: stages})
    config = decode.compile_plan(SEED137_ROW1, split=True)
    assert config.two_warpgroups and config.wgmma_overlap and config.shape.stages == stages, config
    binary, shared = compile_with_shared_bytes(SEED137_ROW1, monkeypatch)
    label = f"D=64 two warpgroups, {stages} stages"
    assert shared == _ring_and_q_bytes(config), (label, shared)
    assert_kernels_fit(binary, decode.TWO_WARPGROUP_CTAS_PER_SM, label, shared)
    assert_two_warpgroup_key_loop(binary, cubin_sass(binary.cubin), config, label)


# name -> (problem, lengths, forced splits, BALANCED_SPLIT): 80 packed rows (group 5 x Sq 16) at D=64, the padded split.
GPU_CASES = {
    "80rows-full-rule": (_problem(2, 2, 5, 16, 4096, 64), None, None, "never"),
    "80rows-ragged-split": (_problem(4, 2, 5, 16, 1024, 64, has_cache_seqlens=True), RAGGED, 2, "never"),
    "80rows-paged128-ragged-rule": (_problem(4, 2, 5, 16, 1024, 64, has_cache_seqlens=True, page_size=128), RAGGED,
                                    None, "never"),
}  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gpu_d64_two_warpgroups_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("WGMMA needs sm_90")
    check_gpu_case(case, GPU_CASES[case], monkeypatch, ("TWO_WARPGROUP_RINGS", ON), "two_warpgroups")


@pytest.mark.gpu
def test_gpu_planted_one_tile_rows_fail_the_check(monkeypatch: pytest.MonkeyPatch):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("WGMMA needs sm_90")
    case = (_problem(2, 2, 16, 16, 2048, 64), None, 3, "never")  # 256 rows: two CTAs of two warpgroups
    assert_planted_one_tile_rows_fail(case, monkeypatch, ("TWO_WARPGROUP_RINGS", ON), "the one-tile rows at D=64")
