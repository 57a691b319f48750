"""cute/decode's two-level merge of the balanced split (``BALANCED_MERGE_RUNS`` in ``cute_impl/decode.py``, gluon's
``BALANCED_MERGE_GROUP`` in cute's separate merge kernel): 8 by default (the ragged model's gain; the H200 A/B is
``bench/decode_merge_group_cute_ab.sh``), 0 the one-chain merge.

CPU: on by default; the knob's checks; the item-share cap it implies (``BALANCED_MAX_ITEM_SHARES`` slabs a run) and
the runs halved where the merge grid passes a wave of threads; the plan it changes (seed 73's paged B=4 row: 48
capped shares of 54 key blocks -> 78 of 33) and the ones it leaves (the padded split, seed 43's B=64 Hkv=16 row); the
merge CTA's threads; the runs' slabs (``_decode_merge.merge_run``) tile every item in slab order, and a thread's place
(``_decode_merge.merge_thread``) covers every (chunk, run, row) once, which a planted run past the item's end and a
planted place without its run modulo fail; the ragged model's merge shorter with runs, no A/B row predicted slower.
Static (``cute_compile``, sm_90a): both kernels with and without runs have no spills and at most 255 registers, the
merge kernel meets at a barrier through shared memory only with runs, and divides nothing at runtime (it still reads
the item slabs). GPU (``gpu``): against fp64 on a poisoned output and 20 launches bit for bit, on one long sequence
among short ones (79 shares: runs of 10, the last of 9, and one chain; GQA D=64 contiguous and in pages of 32, MQA
D=256 at 8 tokens, two M tiles at D=128) and on seed 73's row 0 itself; a planted run that drops a slab fails.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

pytest.importorskip("cutlass")

import cutlass

from bench.decode_ragged_ab import plan_of, switched
from common.contract.check import check_on_inputs
from common.contract.inputs import make_inputs, make_paged_kv
from common.contract.problem import Problem
from common.measure.decode_sweep import random_cases
from common.reporting.static import cubin_resources
from cute_impl import _decode_merge, decode
from tests.test_cute_merge_plan import merge_plans_afresh
from tests.test_decode import LONG_AMONG_SHORT, assert_launches_repeat
from tests.test_decode_merge_group import GPU_CASES, long_among_short
from tests.test_decode_wide import DECODE_IMPLS

CPU = torch.device("cpu")
RUNS = 8
ON = {"cute_impl.decode": {"BALANCED_MERGE_RUNS": RUNS}}
OFF = {"cute_impl.decode": {"BALANCED_MERGE_RUNS": 0}}
# The A/B script's rows (bench/decode_merge_group_cute_ab.sh), SEED/INDEX of random_cases(8, SEED).
AB_ROWS = ((73, 0), (43, 1), (43, 4), (73, 2), (59, 1), (43, 2))


def _config(case, setting: dict) -> decode.DecodeConfig:
    with switched(setting):
        return decode.launch_plan(case.problem, CPU)[3]


# ----------------------------------------------------------------------------------------------------
# The knob, the cap and the runs a shape takes
# ----------------------------------------------------------------------------------------------------
def test_on_by_default_and_off_caps_shares_not_runs():
    assert decode.BALANCED_MERGE_RUNS == RUNS, "the ragged model's gain took 8 runs (decode.py)"
    case = random_cases(8, 73)[0]
    on, off = _config(case, ON), _config(case, OFF)
    assert (on.merge_runs, on.balanced_max_shares) == (RUNS, decode.BALANCED_MAX_ITEM_SHARES * RUNS)
    assert (off.merge_runs, off.balanced_max_shares) == (1, decode.BALANCED_MAX_ITEM_SHARES)


@pytest.mark.parametrize("runs", [-1, 3, 12, 2 * decode.MAX_MERGE_RUNS])
def test_a_runs_value_that_is_not_a_power_of_two_up_to_the_cta_is_refused(runs: int):
    with pytest.raises(ValueError, match="BALANCED_MERGE_RUNS must be 0"):
        decode.checked_merge_runs(runs)


def test_zero_and_one_are_one_chain_and_no_cap_stays_no_cap(monkeypatch: pytest.MonkeyPatch):
    assert [decode.checked_merge_runs(runs) for runs in (0, 1, 2, decode.MAX_MERGE_RUNS)] == [1, 1, 2, 16]
    monkeypatch.setattr(decode, "BALANCED_MAX_ITEM_SHARES", 0)
    assert _config(random_cases(8, 73)[0], ON).balanced_max_shares == 0


def test_runs_halve_where_the_merge_grid_passes_a_wave_of_threads():
    """73/0 (8 items of 2 rows at D=64) keeps 8 runs; 73/2's 128 items of 64 rows (131072 threads a run) 2 in
    132 · 2048 threads; 43/2's 1024 items of 32 rows (two waves already) one."""
    runs = {(seed, index): _config(random_cases(8, seed)[index], ON).merge_runs for seed, index in AB_ROWS}
    assert runs == {(73, 0): 8, (43, 1): 8, (43, 4): 8, (73, 2): 2, (59, 1): 8, (43, 2): 1}


def test_padded_split_has_one_chain_and_runs_without_the_balanced_split_are_refused():
    case = random_cases(8, 73)[3]  # a full D=64 cache: the padded split
    assert not decode.balanced_split(case.problem, CPU)
    assert _config(case, ON).merge_runs == 1
    config = decode.decode_config(case.problem, split=True)
    with pytest.raises(ValueError, match="merge runs only under the balanced split"):
        decode.DecodeKernel(dataclasses.replace(config, merge_runs=RUNS))


@pytest.mark.parametrize(("head_dim", "runs", "threads", "rows"), [
    (64, 1, 128, 8), (128, 1, 128, 4), (256, 1, 128, 2), (64, 8, 128, 1), (128, 8, 256, 1), (256, 8, 512, 1),
    (256, 16, 1024, 1), (64, 2, 128, 4),
])  # fmt: skip
def test_merge_cta_holds_whole_rows_of_every_run(head_dim: int, runs: int, threads: int, rows: int):
    problem = Problem(2, 8, 1, 4096, head_dim, dtype=torch.bfloat16, kv_heads=2, has_cache_seqlens=True)
    config = decode.decode_config(problem, split=True, balanced=True, merge_runs=runs)
    kernel = decode.DecodeKernel(config)
    assert (kernel.merge_threads, kernel.merge_rows_per_cta) == (threads, rows)


# ----------------------------------------------------------------------------------------------------
# The plan: which rows the knob changes
# ----------------------------------------------------------------------------------------------------
def test_seed73_row0_takes_even_shares_and_a_many_item_row_keeps_its_plan():
    plans = {}
    for name, setting in (("off", OFF), ("on", ON)):
        with switched(setting):
            plans[name] = {row: plan_of("cute/decode", *_case(row), CPU) for row in ((73, 0), (43, 2))}
    assert plans["off"][73, 0] == ("balanced", 256, (9, 48, 38, 2))
    assert plans["on"][73, 0] == ("balanced", 256, (9, 78, 38, 2))
    assert plans["on"][43, 2] == plans["off"][43, 2]


def _case(row: tuple[int, int]) -> tuple:
    case = random_cases(8, row[0])[row[1]]
    return case.problem, case.lengths


# ----------------------------------------------------------------------------------------------------
# The index arithmetic: runs tile each item; every thread has one place
# ----------------------------------------------------------------------------------------------------
def _check_runs(count: int, runs: int, run_of: Callable = _decode_merge.merge_run, first: int = 7) -> None:
    """The runs of an item of ``count`` slabs from ``first`` are consecutive in run order, cover exactly its slabs,
    and none is longer than cdiv(count, runs) (the chain a run's thread walks)."""
    slabs = [run_of(first, count, run, runs) for run in range(runs)]
    begin = first
    for run_first, run_count in slabs:
        assert run_first == begin and 0 <= run_count <= -(-count // runs), (count, runs, slabs)
        begin += run_count
    assert begin == first + count, (count, runs, slabs)


def _run_without_clamp(first: int, count: int, run: int, runs: int) -> tuple[int, int]:
    """Planted: every run cdiv(count, runs) slabs, the last runs past the item's end (into the next item's)."""
    length = -(-count // runs)
    return first + run * length, length


@pytest.mark.parametrize("runs", [2, 4, 8, 16])
def test_runs_tile_every_item_in_slab_order(runs: int):
    for count in range(1, 400):
        _check_runs(count, runs)
    with pytest.raises(AssertionError):
        _check_runs(79, runs, _run_without_clamp)


def _check_places(chunks: int, runs: int, rows: int, place_of: Callable = _decode_merge.merge_thread) -> None:
    """The merge CTA's threads take every (chunk, run, CTA row) once, a row's chunks of one run consecutive."""
    places = [place_of(tidx, chunks, runs) for tidx in range(chunks * runs * rows)]
    assert sorted(places) == sorted(itertools.product(range(chunks), range(runs), range(rows))), (chunks, runs)
    assert all(places[t + 1][0] == places[t][0] + 1 for t in range(len(places) - 1) if (t + 1) % chunks)


def _place_without_modulo(tidx: int, chunks: int, runs: int) -> tuple[int, int, int]:
    """Planted: the run counted over the CTA's rows too (a second row's threads read runs past the last)."""
    return tidx % chunks, tidx // chunks, tidx // (chunks * runs)


@pytest.mark.parametrize("head_dim", decode.HEAD_DIMS)
@pytest.mark.parametrize("runs", [1, 2, 8])
def test_every_merge_thread_has_one_place(head_dim: int, runs: int):
    problem = Problem(2, 8, 1, 4096, head_dim, dtype=torch.bfloat16, kv_heads=2, has_cache_seqlens=True)
    kernel = decode.DecodeKernel(decode.decode_config(problem, split=True, balanced=True, merge_runs=runs))
    chunks = head_dim // decode.MERGE_COLS
    _check_places(chunks, runs, kernel.merge_rows_per_cta)
    if kernel.merge_rows_per_cta > 1 and runs > 1:
        with pytest.raises(AssertionError):
            _check_places(chunks, runs, kernel.merge_rows_per_cta, _place_without_modulo)


# ----------------------------------------------------------------------------------------------------
# The ragged model and the A/B script
# ----------------------------------------------------------------------------------------------------
def test_model_merges_in_runs_and_predicts_no_ab_row_slower():
    from bench import decode_ragged_model as model

    predicted = {}
    for row in AB_ROWS:
        problem, lengths = _case(row)
        for name, setting in (("off", OFF), ("on", ON)):
            with switched(setting):
                plan = model.rung_plan("cute/decode", problem, lengths)
            predicted[row, name] = plan, model.step_us(plan, problem, lengths)[0]
    on, off = predicted[(73, 0), "on"][0], predicted[(73, 0), "off"][0]
    assert on.merge_runs == RUNS and max(on.shares) == 78 and off.merge_runs == 1
    assert model.merge_us(on, 78) < model.merge_us(off, 48)
    assert predicted[(73, 0), "on"][1] < predicted[(73, 0), "off"][1]
    for row in AB_ROWS:
        assert predicted[row, "on"][1] <= predicted[row, "off"][1], (row, predicted[row, "on"], predicted[row, "off"])


def test_ab_script_switches_this_knob_and_runs_these_tests():
    script = (Path(__file__).parents[1] / "bench" / "decode_merge_group_cute_ab.sh").read_text()
    assert "cute_impl.decode:BALANCED_MERGE_RUNS 0,8 cute/decode" in script
    assert " ".join(f"{seed}/{index}" for seed, index in AB_ROWS) in script
    assert "tests/test_decode_merge_group_cute.py" in script and "source_carried_activations" in script


# ----------------------------------------------------------------------------------------------------
# sm_90a: no spills; the runs' barrier only with runs; the merge still reads its slabs
# ----------------------------------------------------------------------------------------------------
def _merge_entry(ptx: str) -> str:
    return next(e for e in ptx.split(".entry ")[1:] if e.startswith("kernel_cutlass_merge_kernel"))


# 73/0 (D=64 GQA paged(64)), 43/1 (D=256 MQA paged(128)), 59/1 (D=128 Hkv=2 Sq=2 paged(16)).
COMPILE_ROWS = [(73, 0), (43, 1), (59, 1)]


@pytest.mark.cute_compile
@pytest.mark.parametrize("row", COMPILE_ROWS, ids=[f"{seed}-{index}" for seed, index in COMPILE_ROWS])
def test_runs_compile_without_spills_and_meet_in_shared_memory(row: tuple[int, int], monkeypatch: pytest.MonkeyPatch):
    problem = random_cases(8, row[0])[row[1]].problem
    for runs in (0, RUNS):
        monkeypatch.setattr(decode, "BALANCED_MERGE_RUNS", runs)
        config = decode.compile_plan(problem)
        assert config.balanced_min_blocks and config.merge_runs == max(runs, 1), config
        (binary,) = decode.compile_sm90(problem)
        kernels = cubin_resources(binary.cubin)
        assert len(kernels) == 2, sorted(kernels)
        for name, usage in kernels.items():
            where = f"{row} runs={runs} {name[:40]}: {usage}"
            print(where)
            assert usage["stack_bytes"] + usage["local_bytes"] == 0, where
            assert usage["registers"] <= 255, where
        merge = _merge_entry(binary.ptx)
        assert bool(re.search(r"\bbar\.sync\b|\bbarrier\.sync\b", merge)) == (runs > 1), f"{row} runs={runs}"
        assert ("st.shared" in merge) == (runs > 1), f"{row} runs={runs}"
        assert not merge_plans_afresh(binary.ptx), f"{row} runs={runs}: the merge kernel plans again"


# ----------------------------------------------------------------------------------------------------
# GPU: against fp64, bit for bit over launches
# ----------------------------------------------------------------------------------------------------
@pytest.fixture
def balanced_gpu(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A CUDA GPU and the balanced split on every call."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    monkeypatch.setattr(decode, "BALANCED_SPLIT", "always")
    return monkeypatch


@pytest.mark.gpu
@pytest.mark.parametrize("runs", [0, RUNS], ids=["one-chain", "runs"])
@pytest.mark.parametrize(("seqlen_q", "heads", "kv_heads", "head_dim", "page_size"), GPU_CASES)
def test_gpu_runs_against_fp64_and_deterministic(
    seqlen_q: int, heads: int, kv_heads: int, head_dim: int, page_size: int, runs: int,
    balanced_gpu: pytest.MonkeyPatch,
):  # fmt: skip
    balanced_gpu.setattr(decode, "BALANCED_MERGE_RUNS", runs)
    problem, (q, k, v), extra = long_among_short(seqlen_q, heads, kv_heads, head_dim, page_size)
    shares = plan_of("cute/decode", problem, LONG_AMONG_SHORT, q.device)[2]
    config = decode.launch_plan(problem, q.device)[3]
    assert config.merge_runs == max(runs, 1)
    assert not runs or max(shares) % -(-max(shares) // runs), f"the long item should end in a shorter run: {shares}"
    impl = DECODE_IMPLS["cute/decode"]
    result = check_on_inputs(impl, q, k, v, problem, **extra)
    assert result.ok, f"cute/decode BALANCED_MERGE_RUNS={runs} {problem.describe()} {shares}: {result.summary()}"
    assert_launches_repeat(impl.prepare(q, k, v, problem, **extra))


@pytest.mark.gpu
def test_gpu_seed73_row0_against_fp64_and_deterministic(monkeypatch: pytest.MonkeyPatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    monkeypatch.setattr(decode, "BALANCED_MERGE_RUNS", RUNS)
    case = random_cases(8, 73)[0]
    device = torch.device("cuda")
    if not decode.balanced_split(case.problem, device):
        pytest.skip("cute/decode does not take the balanced split for seed 73's row 0 on this GPU")
    assert decode.launch_plan(case.problem, device)[3].merge_runs == RUNS
    q, k, v = make_inputs(case.problem, seed=73, device="cuda", offset=0.5)
    extra = {"cache_seqlens": torch.tensor(case.lengths, dtype=torch.int32, device="cuda")}
    k, v, extra["block_table"] = make_paged_kv(case.problem, k, v, seed=73)
    impl = DECODE_IMPLS["cute/decode"]
    result = check_on_inputs(impl, q, k, v, case.problem, **extra)
    assert result.ok, f"cute/decode BALANCED_MERGE_RUNS={RUNS} seed 73 row 0: {result.summary()}"
    assert_launches_repeat(impl.prepare(q, k, v, case.problem, **extra))


def _run_one_slab_short(first, count, run, runs):
    """Planted: the runs cut an item one slab short (its last partial never merged)."""
    return _decode_merge.merge_run(first, cutlass.max(count - 1, 1), run, runs)


@pytest.mark.gpu
def test_gpu_planted_run_that_drops_a_slab_fails_the_check(balanced_gpu: pytest.MonkeyPatch):
    balanced_gpu.setattr(decode, "BALANCED_MERGE_RUNS", RUNS)
    problem, (q, k, v), extra = long_among_short(*GPU_CASES[0])
    impl = DECODE_IMPLS["cute/decode"]
    assert check_on_inputs(impl, q, k, v, problem, **extra).ok, "the unplanted kernel must pass"
    balanced_gpu.setattr(decode.HOST.kernels, "compiled", {})
    balanced_gpu.setattr(decode, "merge_run", _run_one_slab_short)
    result = check_on_inputs(impl, q, k, v, problem, **extra)
    assert not result.ok, f"a run one slab short: the check passed a wrong kernel ({result.summary()})"
