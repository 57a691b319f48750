"""cute/decode's two-warpgroup CTA as the default takes it (issue #38): ``WGMMA_TWO_WARPGROUPS`` on for 65-127 packed
rows at D=128 on the padded split (``TWO_WARPGROUP_MIN_ROWS`` 65, ``TWO_WARPGROUP_MAX_ROWS`` 127), with the packed
prefill on as by default. H100, 2026-12-06: the eight 80-row sweep rows it takes 0.58-0.90x; of the two rows of two
tiles or more the packed prefill leaves, 69/4 (128 rows, ragged, short split) lost 2.20x, so the bound.

CPU: the defaults; of the sweep's rows (seeds 1-239), exactly the nine 80-row rows on the padded split (the eight timed
and 55/1, there since 2026-12-06) move, each to one CTA of two warpgroups with its split count, and 7/3 and 69/4 keep
one warpgroup; planted, a rule without the upper bound fails. GPU: an 80-row case through the default plan, nothing
patched, against fp64 on a poisoned output. The mechanism (every row class, the planted kernel bug) is
``tests/test_cute_decode_two_wg.py``'s.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("cutlass")

from common.measure.decode_sweep import random_cases
from cute_impl import decode
from tests.test_cute_decode_rows import RAGGED, _problem
from tests.test_cute_decode_wgmma import check_gpu_case

CPU = torch.device("cpu")
# The eight full-cache rows timed, and 55/1 (ragged, short: on the padded split since cute's one split for short caches,
# 2026-12-06; not timed with two warpgroups).
MOVED_80_ROWS = {(85, 1), (97, 7), (95, 4), (56, 0), (186, 2), (138, 1), (117, 7), (132, 7), (55, 1)}
# (seed, row) -> packed rows: paged or ragged, the packed prefill's leavings.
LEFT_TWO_TILES = {(7, 3): 256, (69, 4): 128}


def _plan(problem, on: bool = True) -> tuple:
    """The launch plan and the padded split's CTAs along M, the defaults as they are but ``WGMMA_TWO_WARPGROUPS``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decode, "WGMMA_TWO_WARPGROUPS", on)
        return (*decode.launch_plan(problem, CPU), decode.padded_m_blocks(problem, CPU))


def _sweep() -> dict:
    return {(seed, i): case.problem for seed in range(1, 240) for i, case in enumerate(random_cases(8, seed))}


def _moved(rows: dict) -> set:
    return {key for key, problem in rows.items() if _plan(problem)[:4] != _plan(problem, on=False)[:4]}


def test_defaults_are_65_to_127_rows():
    assert decode.WGMMA_TWO_WARPGROUPS is True
    assert (decode.TWO_WARPGROUP_MIN_ROWS, decode.TWO_WARPGROUP_MAX_ROWS) == (65, 127)
    assert decode.PACKED_PREFILL_MIN_ROWS is not None  # the plans below are the packed prefill's leavings


def test_the_sweep_moves_the_80_row_rows_of_the_padded_split_each_to_one_cta():
    rows = _sweep()
    assert _moved(rows) == MOVED_80_ROWS
    for key in MOVED_80_ROWS:
        off, on = _plan(rows[key], on=False), _plan(rows[key])
        config = on[3]
        assert config.two_warpgroups and (config.tile_m, config.shape.num_warps) == (128, 8), (key, config)
        assert (off[4], on[4]) == (2, 1) and on[:3] == off[:3], (key, off, on)
    for key, packed_rows in LEFT_TWO_TILES.items():
        problem = rows[key]
        assert problem.kv_group * problem.seqlen_q == packed_rows
        assert not _plan(problem)[3].two_warpgroups, key


def _no_upper_bound(problem, device) -> bool:
    """Planted: the rule before its bound, so 69/4's 128 rows take the CTA that lost 2.20x."""
    rows = problem.kv_group * problem.seqlen_q
    return (
        decode.WGMMA_TWO_WARPGROUPS
        and rows >= decode.TWO_WARPGROUP_MIN_ROWS
        and rows > decode.WARPGROUP_ROWS
        and decode.wgmma_tile(problem, device)
    )


def test_planted_rule_without_the_bound_fails(monkeypatch: pytest.MonkeyPatch):
    problem = random_cases(8, 69)[4].problem
    assert not _plan(problem)[3].two_warpgroups
    monkeypatch.setattr(decode, "two_warpgroup_tile", _no_upper_bound)
    assert _plan(problem)[3].two_warpgroups


@pytest.mark.gpu
@pytest.mark.parametrize(
    "case",
    [(_problem(2, 2, 5, 16, 2048, 128), None, None, "never"),
     (_problem(4, 2, 5, 16, 1024, 128, has_cache_seqlens=True), RAGGED, 2, "never")],
    ids=["80rows-full-rule", "80rows-ragged-split"],
)  # fmt: skip
def test_gpu_default_80_rows_against_fp64(case: tuple, monkeypatch: pytest.MonkeyPatch):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("WGMMA needs sm_90")
    check_gpu_case("default-80rows", case, monkeypatch, ("WGMMA_TWO_WARPGROUPS", True), "two_warpgroups")
