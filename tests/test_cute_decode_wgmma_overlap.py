"""Issue #38, the WGMMA tile's next step in cute/decode: ``decode.WGMMA_OVERLAP_MIN_STAGES`` (4: D=64's rings, not
D=128's of 3 stages; 3: every WGMMA ring, as its A/B timed it; 0: never), each key block's S = Q Kᵀ issued with the
previous block's O += P V and its softmax run while that P V is on the tensor cores (cute/hopper's ``next_block``;
``cute_impl/_decode_wgmma.py``, ``attend_overlapped_block``).

CPU: by default D=64's rows overlap and D=128's do not; with every ring overlapped, the compile key of the rows the
WGMMA tile runs (seed 107 row 0, 103 row 0, the D=64 rows 41/1 and 31/6) gains ``wgmma_overlap`` and nothing else of the
plan moves, while the mma.sync tile's rows keep theirs; a ring of 2 stages is refused;
bench/cute_decode_wgmma_overlap_ab.sh's rows parse and the switch moves the five it should. Static (sm_90a): on, the
balanced split (paged, ragged) and the padded split (contiguous) compile without spills for the two CTAs an SM the split
rule counts, the key loop (two blocks an iteration: P's buffer by step parity) runs on HGMMA only, with no serialised
wgmma (5 waits a loop) and at least half of its exp2 issued with a wgmma in flight. GPU (``gpu`` marker; 8 passed on an
H200, 2026-12-02): every ring overlapped, against fp64 on a poisoned output over 128 to 256 packed rows at D=128 and
D=64, Sq 5, ragged, paged, forced splits and the balanced split, splits with and without a step left over after the
loop; a planted bug, the last block's P V dropped, must fail the check.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

pytest.importorskip("cutlass")

import cutlass.cute as cute

from common.measure.decode_sweep import random_cases
from common.reporting.static import _SASS_INSTRUCTION, cubin_sass, loop_census, sass_loops
from cute_impl import _decode_wgmma, decode
from tests._helpers import knob_ab_words
from tests.test_cute_decode_rows import RAGGED, _problem
from tests.test_cute_decode_wgmma import GPU_CASES as WGMMA_GPU_CASES
from tests.test_cute_decode_wgmma import assert_planted_bug_fails, check_gpu_case
from tests.test_cute_decode_wide_tile import assert_kernels_fit

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _split_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """This switch acts on the split kernels; the packed prefill (on by default since 2026-12-05) takes the contiguous
    rows of 128+ packed rows, so it is off here and every row keeps the plan the switch was measured on."""
    monkeypatch.setattr(decode, "PACKED_PREFILL_MIN_ROWS", None)


EVERY_RING = 3  # the shallowest ring the overlapped loop takes: every WGMMA tile overlapped
# The rows bench/cute_decode_wgmma_overlap_ab.sh times: the WGMMA tile's five, then two of the mma.sync tile's. That A/B
# ran with the WGMMA tile from 128 packed rows, where 59/2's 64 rows were on mma.sync: its plans here are taken there.
MOVED_ROWS = ["107/0", "103/0", "41/1", "31/6", "107/0:page_size=64"]
CONTROL_ROWS = ["59/2", "107/0:seqlen_q=1"]
AB_WGMMA_MIN_ROWS = 128


def _plan(problem, overlap: bool) -> tuple:
    """The launch plan with every WGMMA ring overlapped (``overlap``) or none, the WGMMA tile as the A/B had it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decode, "WGMMA_MIN_ROWS", AB_WGMMA_MIN_ROWS)
        patch.setattr(decode, "WGMMA_OVERLAP_MIN_STAGES", EVERY_RING if overlap else 0)
        num_splits, slabs, items, config = decode.launch_plan(problem, CPU)
        return num_splits, slabs, items, config, decode.m_blocks_for(problem)


def _row_problem(text: str):
    from bench.decode_knob_ab import parse_row

    return parse_row(text)[1].problem


@pytest.mark.parametrize(("row", "overlapped"), [("41/1", True), ("31/6", True), ("107/0", False), ("103/0", False)])
def test_by_default_the_rings_of_four_stages_or_more(row: str, overlapped: bool):
    """Taken where the ring keeps two blocks in flight besides the one P V holds: D=64's 6 stages (0.93-0.95× in its
    A/B), not D=128's 3 (1.00-1.08×)."""
    assert decode.WGMMA_OVERLAP_MIN_STAGES == 4
    config = decode.launch_plan(_row_problem(row), CPU)[3]
    assert config.wgmma and config.wgmma_overlap is overlapped, config
    assert (config.shape.stages >= 4) is overlapped


@pytest.mark.parametrize("row", MOVED_ROWS)
def test_on_changes_only_the_key_of_the_wgmma_tile(row: str):
    problem = _row_problem(row)
    off, on = _plan(problem, False), _plan(problem, True)
    assert on[3].wgmma and on[3].wgmma_overlap, problem.describe()
    assert on[:3] + on[4:] == off[:3] + off[4:] and dataclasses.replace(on[3], wgmma_overlap=False) == off[3]
    assert isinstance(decode.decode_kernel(on[3]), _decode_wgmma.WgmmaDecodeKernel)


@pytest.mark.parametrize("row", CONTROL_ROWS)
def test_on_leaves_the_mma_sync_tile(row: str):
    problem = _row_problem(row)
    assert _plan(problem, True) == _plan(problem, False)
    assert not _plan(problem, True)[3].wgmma


def test_a_ring_of_two_stages_is_refused():
    """The previous block's V is held one step: a ring of 2 would keep no block in flight."""
    config = _plan(random_cases(8, 107)[0].problem, True)[3]
    shallow = dataclasses.replace(config, shape=config.shape._replace(stages=2))
    with pytest.raises(ValueError, match="3 stages"):
        _decode_wgmma.WgmmaDecodeKernel(shallow)
    _decode_wgmma.WgmmaDecodeKernel(dataclasses.replace(shallow, wgmma_overlap=False))


def test_ab_script_rows_parse_and_the_switch_moves_the_first_five():
    """bench/cute_decode_wgmma_overlap_ab.sh's knob rows: each parses, and the switch changes the compile key of
    exactly the first five (the last two are the controls): a typo costs a device call."""
    from pathlib import Path

    from bench.decode_knob_ab import parse_row

    script = (Path(__file__).parents[1] / "bench" / "cute_decode_wgmma_overlap_ab.sh").read_text()
    assert "gpu_tests 80 -n 4 tests/test_cute_decode_wgmma_overlap.py" in script
    words = knob_ab_words("cute_decode_wgmma_overlap_ab.sh", "overlap")
    assert words[1:4] == ["cute_impl.decode:WGMMA_OVERLAP_MIN_STAGES", f"0,{EVERY_RING}", "cute/decode"], words
    assert words[4:] == MOVED_ROWS + CONTROL_ROWS, words
    moved = [_plan(parse_row(text)[1].problem, True) != _plan(parse_row(text)[1].problem, False) for text in words[4:]]
    assert moved == [True] * 5 + [False] * 2


# ----------------------------------------------------------------------------------------------------
# sm_90a: on, no spills at two CTAs an SM, a key loop of HGMMA, the softmax under the tensor cores
# ----------------------------------------------------------------------------------------------------
def exp2_under_wgmma(sass: str) -> tuple[int, int, int]:
    """(MUFU.EX2 issued while a warpgroup GEMM group is in flight, all MUFU.EX2, ``WARPGROUP.DEPBAR`` waits) in the
    smallest loop holding HGMMA: a group is in flight from its ``WARPGROUP.ARRIVE`` until a ``WARPGROUP.DEPBAR.LE gsb0,
    n`` leaves n or fewer."""
    loops = [(start, body) for start, body in sass_loops(sass) if any(op.startswith("HGMMA") for op in body)]
    start, body = min(loops, key=lambda loop: len(loop[1]))
    listing = [(int(m.group(1), 16), m.group(2), m.group(3)) for m in _SASS_INSTRUCTION.finditer(sass)]
    loop = [(op, operands) for at, op, operands in listing if at >= start][: len(body)]
    assert [op for op, _ in loop] == body
    pending = under = total = waits = 0
    for op, operands in loop:
        if op.startswith("WARPGROUP.ARRIVE"):
            pending += 1
        elif op.startswith("WARPGROUP.DEPBAR"):
            waits += 1
            pending = min(pending, int(re.search(r"0x([0-9a-f]+)", operands).group(1), 16))
        elif op.startswith("MUFU.EX2"):
            total += 1
            under += pending > 0
    return under, total, waits


# (head dim, page size, BALANCED_SPLIT): the balanced split paged and ragged, the padded split contiguous.
COMPILES = [(128, 32, "always"), (128, 0, "never"), (64, 0, "never")]


@pytest.mark.cute_compile
@pytest.mark.parametrize(("head_dim", "page_size", "balanced"), COMPILES)
def test_on_compiles_spill_free_with_the_softmax_under_the_wgmmas(
    head_dim: int, page_size: int, balanced: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(decode, "WGMMA_OVERLAP_MIN_STAGES", EVERY_RING)
    monkeypatch.setattr(decode, "BALANCED_SPLIT", balanced)
    problem = _problem(2, 4, 16, 16, 4096, head_dim, has_cache_seqlens=True, page_size=page_size)
    config = decode.compile_plan(problem, split=True)
    assert config.wgmma_overlap and bool(config.balanced_min_blocks) == (balanced == "always"), config
    (binary,) = decode.compile_sm90(problem, split=True)
    assert_kernels_fit(binary, decode.CTAS_PER_SM_FIT[head_dim], f"WGMMA overlap {problem.describe()}")
    sass = cubin_sass(binary.cubin)
    census = loop_census(sass)  # two blocks an iteration: 2 x (S: D/16 wgmma; P V: 64/16)
    assert census is not None and census.gmma == 2 * (head_dim // 16 + config.shape.tile_n // 16), census
    assert census.exp2 >= 2 * 32, census
    assert not re.search(r"\bHMMA\.|\bLDSM\b", sass), "the split kernel's tile must not use mma.sync or ldmatrix"
    under, total, waits = exp2_under_wgmma(sass)
    print(f"WGMMA overlap {problem.describe()}: {census}, {under} of {total} exp2 under a wgmma, {waits} waits")
    # Two waits a step and the second step's drain: ptxas serialising the wgmmas (C7514: a wait after each, as a P V
    # in flight across the back edge made it do) shows as more.
    assert waits == 5, f"{waits} wgmma waits in the two-step loop: serialised wgmmas?"
    # sm_90a (docs/perf-log.md, "Helper `cutewg3`"): 52 of 68 at D=128, 34 at D=64 (0 of 34 off).
    assert 2 * under >= total, f"{under} of {total} exp2 with a wgmma in flight: the overlap is gone"


# ----------------------------------------------------------------------------------------------------
# GPU: on, against fp64; a planted bug
# ----------------------------------------------------------------------------------------------------
# name -> (problem, lengths, forced splits, BALANCED_SPLIT): the WGMMA tile's cases, a D=64 tile of Sq 5 split over
# ragged lengths (splits of 0, 1 and 2 blocks: the first, masked and last steps only), and one sequence of 38 blocks in
# 3 splits (13, 13, 12 blocks: 11 and 10 after the two masked ones, a step left over after the loop and none, the last
# P V from either buffer) and in 4 (10, 10, 10, 8: none left over).
GPU_CASES = {
    **WGMMA_GPU_CASES,
    "d64-160rows-sq5-ragged-split": (_problem(4, 2, 32, 5, 1024, 64, has_cache_seqlens=True), RAGGED, 3, "never"),
    "d128-256rows-38blocks-split3": (_problem(1, 2, 16, 16, 2373, 128, has_cache_seqlens=True), (2373,), 3, "never"),
    "d128-256rows-38blocks-split4": (_problem(1, 2, 16, 16, 2373, 128, has_cache_seqlens=True), (2373,), 4, "never"),
}


def _on_hopper():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("WGMMA needs sm_90")


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gpu_overlapped_tile_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    _on_hopper()
    check_gpu_case(case, GPU_CASES[case], monkeypatch, ("WGMMA_OVERLAP_MIN_STAGES", EVERY_RING), "wgmma_overlap")


class _DroppedLastBlock(_decode_wgmma.WgmmaDecodeKernel):
    """Planted: the last block's O += P V (issued alone after the loop) dropped; its rescale kept."""

    @cute.jit
    def last_values_product(self, pv_mma, tOrP, tOrV, acc_O, softmax, o_scale, step):
        softmax.rescale(acc_O, o_scale)


@pytest.mark.gpu
def test_gpu_planted_dropped_last_block_fails_the_check(monkeypatch: pytest.MonkeyPatch):
    _on_hopper()
    planted = (_decode_wgmma, "WgmmaDecodeKernel", _DroppedLastBlock)
    case, switch = GPU_CASES["d128-256rows-38blocks-split3"], ("WGMMA_OVERLAP_MIN_STAGES", EVERY_RING)
    assert_planted_bug_fails(case, monkeypatch, switch, planted, "the dropped last block")
