"""Issue #38's compute-bound class in cute/decode: ``decode.WGMMA_MIN_ROWS`` (64; 0: off), a 64-row tile of at least
that many packed rows on one warpgroup's WGMMA (``cute_impl/_decode_wgmma.py``) instead of 4 warps' mma.sync.

CPU: on by default (128 taken on its A/B, then 64 on its own, whose rows the switch moves); at 128, the compile key
of seed 107 row 0 (256 packed rows, D=128) and seed 103 row 0 (128 rows) gains ``wgmma`` and nothing else of the plan
changes (tile, M tiles, split count, balanced slabs), while 64 packed rows, D=256 and a tile under 64 rows keep theirs;
bench/cute_decode_wgmma_ab.sh's rows parse and the switch moves the five it should. Static (sm_90a): on, the balanced
split (paged, ragged) and the padded split (contiguous, causal, cache lengths) compile without spills in registers and
shared memory for the CTAs an SM the split rule counts, and the key loop runs on HGMMA, with no HMMA and no ldmatrix.
GPU (``gpu`` marker; passed on an H200, 2026-12-02): on, against fp64 on a poisoned output over 64 to 256 packed rows
at D=128 and D=64, Sq 5 and 6 (rows of different tokens), ragged, paged, forced splits and the balanced split; the
causal mask taking the packed row as the token (no ``row % Sq``) must fail the check, at 160 and at 80 rows.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter

import pytest
import torch

pytest.importorskip("cutlass")

from common.measure.decode_sweep import random_cases
from common.reporting.static import cubin_sass, loop_census, sass_loops
from cute_impl import _decode_wgmma, decode
from tests._helpers import knob_ab_problems, knob_ab_words
from tests.test_cute_decode_rows import RAGGED, _problem, check_forced_splits
from tests.test_cute_decode_wide_tile import _ring_and_q_bytes, assert_kernels_fit

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _split_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """This switch acts on the split kernels; the packed prefill (on by default since 2026-12-05) takes the contiguous
    rows of 128+ packed rows, so it is off here and every row keeps the plan the switch was measured on."""
    monkeypatch.setattr(decode, "PACKED_PREFILL_MIN_ROWS", None)


ON = 128  # the setting the first A/B timed: the rows of the compute-bound class
FROM_64 = 64  # the default since the second (bench/cute_decode_wgmma64_ab.sh): the tiles of 64-127 packed rows too
# (seed, row) of the sweeps' rows that motivate the switch: 256 and 128 packed rows at D=128.
SEED_ROWS = [(107, 0), (103, 0)]


def _plan(problem, min_rows: int) -> tuple:
    """The launch plan with ``WGMMA_MIN_ROWS`` at ``min_rows`` (0: the mma.sync tile everywhere)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decode, "WGMMA_MIN_ROWS", min_rows)
        num_splits, slabs, items, config = decode.launch_plan(problem, CPU)
        return num_splits, slabs, items, config, decode.m_blocks_for(problem)


def test_on_by_default_from_64_rows():
    """128 taken on its A/B (results/h200/cute-decode-wgmma/), then 64 on bench/cute_decode_wgmma64_ab.sh's
    (results/h200/cute-decode-wgmma-64/): seed 137 row 1's 80 packed rows take the WGMMA tile, 16 rows do not."""
    assert decode.WGMMA_MIN_ROWS == FROM_64
    for problem in (random_cases(8, 107)[0].problem, random_cases(8, 137)[1].problem):
        assert decode.launch_plan(problem, CPU)[3].wgmma is True, problem.describe()
        assert type(decode.decode_kernel(decode.compile_plan(problem))) is _decode_wgmma.WgmmaDecodeKernel
    assert decode.launch_plan(random_cases(8, 137)[7].problem, CPU)[3].wgmma is False


def test_ab_64_script_rows_parse_and_the_switch_moves_the_first_nine():
    """bench/cute_decode_wgmma64_ab.sh's knob rows: each parses, and 64 against 128 changes the compile key of exactly
    the first nine (64-127 packed rows); the Sq=1 and 256-row controls keep theirs."""
    head, rows = knob_ab_problems("cute_decode_wgmma64_ab.sh", "wgmma64")
    assert head[1:] == ["cute_impl.decode:WGMMA_MIN_ROWS", f"{ON},{FROM_64}", "cute/decode"], head
    assert [_plan(problem, FROM_64) != _plan(problem, ON) for problem in rows] == [True] * 9 + [False] * 2


@pytest.mark.parametrize(("seed", "row"), SEED_ROWS)
def test_on_changes_only_the_tile_mma_of_the_seed_rows(seed: int, row: int, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(decode, "WGMMA_SPLIT_CTAS_PER_SM", 1)  # the split rule's ask apart (the test below)
    problem = random_cases(8, seed)[row].problem
    assert problem.kv_group * problem.seqlen_q >= ON and problem.head_dim == 128, problem.describe()
    off, on = _plan(problem, 0), _plan(problem, ON)
    assert on[3].wgmma and on[3].tile_m == 64 and on[3].row_warps == 4
    assert on[:3] + on[4:] == off[:3] + off[4:] and dataclasses.replace(on[3], wgmma=False) == off[3]
    assert isinstance(decode.decode_kernel(on[3]), _decode_wgmma.WgmmaDecodeKernel)


@pytest.mark.parametrize(("seed", "row", "splits_off", "splits_on"), [(107, 0, 1, 2), (103, 0, 1, 1)])
def test_the_wgmma_tile_asks_two_ctas_an_sm(seed: int, row: int, splits_off: int, splits_on: int):
    """``WGMMA_SPLIT_CTAS_PER_SM``: 107/0's 128 CTAs (one an SM) become 2 splits; 103/0's 2048 CTAs keep one."""
    problem = random_cases(8, seed)[row].problem
    assert decode.split_policy(problem).ctas_per_sm == decode.WGMMA_SPLIT_CTAS_PER_SM == 2
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decode, "WGMMA_SPLIT_CTAS_PER_SM", 1)
        assert decode.launch_plan(problem, CPU)[0] == splits_off
    assert decode.launch_plan(problem, CPU)[0] == splits_on


def test_the_mma_sync_tile_keeps_its_ask():
    """107/0 at Sq=1 (16 packed rows, the mma.sync tile) keeps ``SPLIT_CTAS_PER_SM``'s one CTA an SM: 4 splits."""
    problem = dataclasses.replace(random_cases(8, 107)[0].problem, seqlen_q=1)
    assert decode.split_policy(problem).ctas_per_sm == decode.SPLIT_CTAS_PER_SM == 1
    assert decode.launch_plan(problem, CPU)[0] == 4


# Problems the setting leaves: 64 packed rows (under the threshold), D=256 with its own switch off (WGMMA_D256 None;
# tests/test_cute_decode_wgmma_d256.py has it on), 32 rows at D=128 (a 32-row tile), and 128 rows on a CUDA device of
# another generation is not checked here (no GPU).
LEFT = {
    "d128-64rows": _problem(2, 8, 4, 16, 32768, 128),
    "d256-256rows": _problem(2, 4, 16, 16, 32768, 256),
    "d128-32rows": _problem(2, 8, 2, 16, 32768, 128),
}


@pytest.mark.parametrize("case", sorted(LEFT))
def test_on_leaves_other_plans(case: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(decode, "WGMMA_D256", None)
    assert _plan(LEFT[case], ON) == _plan(LEFT[case], 0)


def test_ab_script_rows_parse_and_the_switch_moves_the_first_five():
    """bench/cute_decode_wgmma_ab.sh's knob rows: each parses, the two rows of the class come first, and the switch
    changes the compile key of exactly the first five (the last two are the controls): a typo costs a device call."""
    from pathlib import Path

    from bench.decode_knob_ab import parse_row

    script = (Path(__file__).parents[1] / "bench" / "cute_decode_wgmma_ab.sh").read_text()
    assert "gpu_tests 150 tests/test_cute_decode_wgmma.py" in script
    words = knob_ab_words("cute_decode_wgmma_ab.sh", "wgmma")
    assert words[:3] == ["330", "cute_impl.decode:WGMMA_MIN_ROWS", f"0,{ON}"] and words[3] == "cute/decode", words
    rows = [parse_row(text)[1] for text in words[4:]]
    assert [case.problem for case in rows[:2]] == [random_cases(8, seed)[row].problem for seed, row in SEED_ROWS]
    moved = [_plan(case.problem, ON) != _plan(case.problem, 0) for case in rows]
    assert moved == [True] * 5 + [False] * 2


# ----------------------------------------------------------------------------------------------------
# sm_90a: on, no spills, the CTAs an SM the rule counts, a key loop of HGMMA
# ----------------------------------------------------------------------------------------------------
# (head dim, page size, BALANCED_SPLIT): the balanced split paged and ragged, the padded split contiguous.
COMPILES = [(128, 32, "always"), (128, 0, "never"), (64, 0, "never")]


def compile_with_shared_bytes(problem, monkeypatch: pytest.MonkeyPatch) -> tuple:
    """The split build of ``problem`` for sm_90a and the bytes of the SharedStorage its split kernel allocates, as the
    launcher builds it (``_decode_wgmma.qkv_shared_storage`` wrapped for the one compile)."""
    storages = []
    real_storage = _decode_wgmma.qkv_shared_storage
    monkeypatch.setattr(
        _decode_wgmma, "qkv_shared_storage", lambda *args: storages.append(real_storage(*args)) or storages[-1]
    )
    (binary,) = decode.compile_sm90(problem, split=True)
    (shared,) = {storage.size_in_bytes() for storage in storages}
    return binary, shared


@pytest.mark.cute_compile
@pytest.mark.parametrize(("head_dim", "page_size", "balanced"), COMPILES)
def test_on_compiles_spill_free_on_hgmma(head_dim: int, page_size: int, balanced: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(decode, "WGMMA_MIN_ROWS", ON)
    monkeypatch.setattr(decode, "WGMMA_OVERLAP_MIN_STAGES", 0)  # the one chain a block; the overlap's own file
    monkeypatch.setattr(decode, "BALANCED_SPLIT", balanced)
    problem = _problem(2, 4, 16, 16, 4096, head_dim, has_cache_seqlens=True, page_size=page_size)
    config = decode.compile_plan(problem, split=True)
    assert config.wgmma and bool(config.balanced_min_blocks) == (balanced == "always"), config
    binary, shared = compile_with_shared_bytes(problem, monkeypatch)
    assert shared == _ring_and_q_bytes(config), (problem.describe(), shared)  # WGMMA's layouts: the same bytes
    assert_kernels_fit(binary, decode.CTAS_PER_SM_FIT[head_dim], f"WGMMA_MIN_ROWS {problem.describe()}", shared)
    sass = cubin_sass(binary.cubin)
    census = loop_census(sass)  # S: D/16 wgmma of 64 x 64 x 16; P V: 64/16 of 64 x D x 16
    assert census is not None and census.gmma == head_dim // 16 + config.shape.tile_n // 16, census
    loop = min((body for _, body in sass_loops(sass) if any(op.startswith("HGMMA") for op in body)), key=len)
    print(f"WGMMA_MIN_ROWS {problem.describe()}: {census}, {dict(Counter(op.split('.')[0] for op in loop))}")
    assert not re.search(r"\bHMMA\.|\bLDSM\b", sass), "the split kernel's tile must not use mma.sync or ldmatrix"


# ----------------------------------------------------------------------------------------------------
# GPU: on, against fp64; a planted mask bug
# ----------------------------------------------------------------------------------------------------
# name -> (problem, lengths, forced splits, BALANCED_SPLIT).
GPU_CASES = {
    "d128-256rows-ragged-split": (_problem(4, 2, 16, 16, 1024, 128, has_cache_seqlens=True), RAGGED, 2, "never"),
    "d128-128rows-paged-balanced": (_problem(4, 2, 8, 16, 1024, 128, has_cache_seqlens=True, page_size=64), RAGGED,
                                    None, "always"),
    "d128-160rows-sq5-paged16-split": (_problem(4, 2, 32, 5, 1024, 128, has_cache_seqlens=True, page_size=16),
                                       RAGGED, 3, "never"),
    "d64-128rows-full": (_problem(2, 4, 8, 16, 1000, 64), None, None, "never"),
}  # fmt: skip


# The tiles of 64-127 packed rows (seed 137 row 1: 80 rows, 36 % of the bandwidth on mma.sync, 61 % on WGMMA) with the
# switch at 64, the default since bench/cute_decode_wgmma64_ab.sh: a full M tile and a partial one, Sq 5 and 6, paged
# and ragged.
GPU_CASES_FROM_64 = {
    "d64-80rows-full": (_problem(2, 2, 5, 16, 1000, 64), None, None, "never"),
    "d128-64rows-ragged-split": (_problem(4, 2, 4, 16, 1024, 128, has_cache_seqlens=True), RAGGED, 2, "never"),
    "d128-96rows-sq6-paged16-balanced": (_problem(4, 2, 16, 6, 1024, 128, has_cache_seqlens=True, page_size=16),
                                         RAGGED, None, "always"),
    "d64-80rows-sq5-paged32-split": (_problem(4, 2, 16, 5, 1024, 64, has_cache_seqlens=True, page_size=32), RAGGED,
                                     3, "never"),
}  # fmt: skip
# name -> (case, the WGMMA_MIN_ROWS it runs under).
SWITCHED_CASES = {name: (case, ON) for name, case in GPU_CASES.items()} | {
    name: (case, FROM_64) for name, case in GPU_CASES_FROM_64.items()
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(SWITCHED_CASES))
def test_gpu_wgmma_tile_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("WGMMA needs sm_90")
    problem_case, min_rows = SWITCHED_CASES[case]
    check_gpu_case(case, problem_case, monkeypatch, ("WGMMA_MIN_ROWS", min_rows), "wgmma")


def check_gpu_case(
    name: str, case: tuple, monkeypatch: pytest.MonkeyPatch, switch: tuple[str, int], engaged: str
) -> None:  # fmt: skip
    """``case`` (problem, lengths, forced splits, BALANCED_SPLIT) with decode's ``switch`` (name, value) set: its plan
    engages the ``engaged`` field of the compile key, and its output matches fp64 on a poisoned output."""
    problem, lengths, num_splits, balanced = case
    monkeypatch.setattr(decode, *switch)
    monkeypatch.setattr(decode, "BALANCED_SPLIT", balanced)
    assert getattr(decode.launch_plan(problem, torch.device("cuda"))[3], engaged), problem.describe()
    result = check_forced_splits(problem, lengths, num_splits, seed=len(name))
    assert result.ok, f"{switch[0]} {problem.describe()}: {result.summary()}"


class _UnpackedMask(_decode_wgmma.AttentionMask):
    """Planted: the causal diagonal at the packed row, not at its token (``row % Sq`` dropped)."""

    def __init__(self, *args, packed_seqlen_q=None, **kwargs):
        super().__init__(*args, **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["d128-160rows-sq5-paged16-split", "d64-80rows-sq5-paged32-split"])
def test_gpu_planted_unpacked_mask_fails_the_check(case: str, monkeypatch: pytest.MonkeyPatch):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("WGMMA needs sm_90")
    planted = (_decode_wgmma, "AttentionMask", _UnpackedMask)
    problem_case, min_rows = SWITCHED_CASES[case]
    assert_planted_bug_fails(problem_case, monkeypatch, ("WGMMA_MIN_ROWS", min_rows), planted, "the unpacked mask")


def assert_planted_bug_fails(
    case: tuple, monkeypatch: pytest.MonkeyPatch, switch: tuple[str, int], planted: tuple, bug: str
) -> None:  # fmt: skip
    """``case`` (as :func:`check_gpu_case`'s) with decode's ``switch`` set passes the fp64 check, then fails it once
    ``planted`` (an object, the name of one of its attributes, the planted replacement) is compiled in."""
    problem, lengths, num_splits, balanced = case
    monkeypatch.setattr(decode, *switch)
    monkeypatch.setattr(decode, "BALANCED_SPLIT", balanced)
    assert check_forced_splits(problem, lengths, num_splits, seed=1).ok, "the unplanted kernel must pass"
    monkeypatch.setattr(decode.HOST.kernels, "compiled", {})
    monkeypatch.setattr(*planted)
    result = check_forced_splits(problem, lengths, num_splits, seed=1)
    assert not result.ok, f"{bug} passed the check ({result.summary()})"
