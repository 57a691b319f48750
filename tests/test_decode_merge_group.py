"""gluon/decode's two-level merge of the balanced split (``BALANCED_MERGE_GROUP`` in ``_decode_balanced.py``), 8
since its H200 A/B (``bench/decode_merge_group_ab.sh``), 0 the one-level merge.

CPU: on by default; the item-share cap it implies (``BALANCED_MAX_ITEM_SHARES`` runs of G shares) and the arrival
counters it needs; the plan it changes (seed 73's paged B=4 row: 32 capped shares of 81 key blocks -> 78 of 33) and
the ones it leaves (triton's and cute's plans, the padded split); the runs' slabs and counters (a mirror of
``_merge_in_groups``'s index arithmetic) tile every item and stay inside the counters the host allocates, which a
planted run that forgets its stride fails; the ragged model's merge shorter with runs. Static (sm_90a): the kernel with
runs has no spills and two more acq_rel atomics than one level's one (the run's arrival and the item's). GPU
(``gpu``), for gluon/decode and triton/decode (whose runs are the same, ``test_decode_merge_group_triton.py``):
against fp64 on a poisoned output on seed 73's row itself and on one long sequence among short ones (runs of 8 with a
partial last run, and one level; GQA D=64 contiguous and in pages of 32, MQA D=256 at 8 tokens, two M tiles at
D=128), 20 launches bit for bit (the run counters put back to 0).
"""

from __future__ import annotations

import dataclasses
import importlib
import json

import pytest
import torch

from bench.decode_ragged_ab import plan_of, switched
from common.contract.check import check_on_inputs
from common.contract.inputs import make_inputs, make_paged_kv
from common.contract.problem import Problem
from common.measure.decode_sweep import random_cases
from common.toolchain.releases import triton_release
from tests._helpers import json_from_child
from tests.test_decode import LONG_AMONG_SHORT, assert_launches_repeat
from tests.test_decode_wide import check_on_gpu
from triton_impl.gluon import _decode_balanced
from triton_impl.gluon import decode as gluon_decode

CPU = torch.device("cpu")
GROUP = 8
ON = {"triton_impl.gluon._decode_balanced": {"BALANCED_MERGE_GROUP": GROUP}}
OFF = {"triton_impl.gluon._decode_balanced": {"BALANCED_MERGE_GROUP": 0}}


def test_on_by_default_and_off_caps_shares_not_runs(monkeypatch: pytest.MonkeyPatch):
    assert _decode_balanced.BALANCED_MERGE_GROUP == GROUP, "the H200 A/B took runs of 8 (_decode_balanced.py)"
    monkeypatch.setattr(_decode_balanced, "BALANCED_MERGE_GROUP", 0)
    assert _decode_balanced.item_share_cap() == _decode_balanced.BALANCED_MAX_ITEM_SHARES


def test_cap_counts_runs_and_a_negative_group_is_refused(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(_decode_balanced, "BALANCED_MERGE_GROUP", GROUP)
    assert _decode_balanced.item_share_cap() == 32 * GROUP
    monkeypatch.setattr(_decode_balanced, "BALANCED_MAX_ITEM_SHARES", 0)
    assert _decode_balanced.item_share_cap() == 0, "no cap stays no cap"
    monkeypatch.setattr(_decode_balanced, "BALANCED_MERGE_GROUP", -1)
    with pytest.raises(ValueError, match="BALANCED_MERGE_GROUP must be >= 0"):
        _decode_balanced.item_share_cap()


def test_counters_one_per_item_or_two_per_slab_with_runs(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(_decode_balanced, "BALANCED_MERGE_GROUP", 0)
    assert _decode_balanced.arrival_counter_count(8, 264, 2, balanced=True) == 16
    monkeypatch.setattr(_decode_balanced, "BALANCED_MERGE_GROUP", GROUP)
    assert _decode_balanced.arrival_counter_count(8, 264, 2, balanced=True) == 2 * 264 * 2
    assert _decode_balanced.arrival_counter_count(8, 16, 2, balanced=False) == 16, "the padded split has no runs"


# ----------------------------------------------------------------------------------------------------
# The plan: which rows the knob changes
# ----------------------------------------------------------------------------------------------------
def test_seed73_row0_takes_even_shares_and_other_rungs_keep_their_plans():
    case = random_cases(8, 73)[0]
    plans = {}
    for on, setting in ((False, OFF), (True, ON)):
        with switched(setting):
            plans[on] = {
                rung: plan_of(rung, case.problem, case.lengths, CPU)
                for rung in ("triton/decode", "gluon/decode")
            }  # fmt: skip
    assert plans[False]["gluon/decode"] == ("balanced", 256, (9, 32, 32, 2))
    assert plans[True]["gluon/decode"] == ("balanced", 256, (9, 78, 38, 2))
    assert plans[True]["triton/decode"] == plans[False]["triton/decode"]


def test_padded_split_is_left():
    case = random_cases(8, 73)[3]  # a full D=64 cache: gluon's padded split
    with switched(ON):
        assert plan_of("gluon/decode", case.problem, case.lengths, CPU)[0] == "padded"


def _runs(first: int, item_shares: int, group: int) -> list[tuple[int, int, int]]:
    """``_merge_in_groups``'s index arithmetic per share of an item whose slabs start at ``first``: (share, its run's
    first slab, the run's shares)."""
    result = []
    for split in range(item_shares):
        run_first = first + split // group * group
        result.append((first + split, run_first, min(item_shares - (run_first - first), group)))
    return result


def _check_runs(shares: tuple[int, ...], kv_heads: int, slabs: int, m_tiles: int, runs_of=_runs) -> None:
    """Each item's runs tile its slabs; the final merge's slabs (first + r · G) are the runs' first slabs; every run
    counter (slabs + run_first) · m_tiles + m_block is distinct, past the item counters and inside the allocation."""
    counters, first = set(), 0
    allocated = _decode_balanced.arrival_counter_count(len(shares) * kv_heads, slabs, m_tiles, balanced=True)
    for count in (count for count in shares for _ in range(kv_heads)):
        if count > GROUP:
            rows = runs_of(first, count, GROUP)
            run_firsts = sorted({run_first for _, run_first, _ in rows})
            assert run_firsts == [first + r * GROUP for r in range(-(-count // GROUP))]
            for run_first in run_firsts:
                members = [share for share, mine, _ in rows if mine == run_first]
                sizes = {size for _, mine, size in rows if mine == run_first}
                assert sizes == {len(members)} and members == list(range(run_first, run_first + len(members)))
                for m_block in range(m_tiles):
                    counter = (slabs + run_first) * m_tiles + m_block
                    assert counter not in counters and len(shares) * kv_heads * m_tiles <= counter < allocated
                    counters.add(counter)
        first += count
    assert first <= slabs


def _planted_no_stride(first: int, item_shares: int, group: int) -> list[tuple[int, int, int]]:
    """Planted: a run's first slab without the run's stride (first + split // G)."""
    return [
        (first + split, first + split // group, min(item_shares - split // group, group))
        for split in range(item_shares)
    ]


def test_runs_tile_each_item_and_their_counters_fit(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(_decode_balanced, "BALANCED_MERGE_GROUP", GROUP)
    case = random_cases(8, 73)[0]
    _, target, shares = plan_of("gluon/decode", case.problem, case.lengths, CPU)
    slabs = target + case.problem.batch * case.problem.kv_heads
    _check_runs(shares, case.problem.kv_heads, slabs, m_tiles=2)
    with pytest.raises(AssertionError):
        _check_runs(shares, case.problem.kv_heads, slabs, m_tiles=2, runs_of=_planted_no_stride)


def test_model_merges_seed73s_long_item_in_fewer_steps():
    from bench import decode_ragged_model as model

    case = random_cases(8, 73)[0]
    with switched(OFF):
        off = model.rung_plan("gluon/decode", case.problem, case.lengths)
    with switched(ON):
        on = model.rung_plan("gluon/decode", case.problem, case.lengths)
    assert on.merge_group == GROUP and max(on.shares) == 78
    assert model.merge_us(on, 78) < model.merge_us(dataclasses.replace(on, merge_group=0), 78)
    assert model.step_us(on, case.problem, case.lengths)[0] < model.step_us(off, case.problem, case.lengths)[0]


# ----------------------------------------------------------------------------------------------------
# sm_90a: no spills, the run's atomics present only with runs
# ----------------------------------------------------------------------------------------------------
_GLUON_SCRIPT = r"""
import json, sys
from common.measure.decode_sweep import random_cases
from common.toolchain.releases import triton_release
from common.reporting.static import cubin_resources
from triton_impl.gluon import _decode_balanced, decode

results = []
for seed, index, group in json.loads(sys.argv[1]):
    _decode_balanced.BALANCED_MERGE_GROUP = group
    (binary,) = decode.compile_sm90(random_cases(8, seed)[index].problem)
    (usage,) = cubin_resources(binary.cubin).values()
    results.append({"registers": usage["registers"], "spill_bytes": usage["local_bytes"] + usage["stack_bytes"],
                    "atomics": binary.ptx.count("atom.global.gpu.acq_rel")})
print(json.dumps(results))
"""


@pytest.mark.static
def test_runs_compile_without_spills_and_add_the_runs_atomics():
    """73/0 (D=64) and 43/1 (D=256 MQA), each with and without runs; a release whose balanced kernel spills at a head
    dim (``BALANCED_SPILLS``: 3.9 at D=256) never runs it there (the padded split does), so that row is not built."""
    spilling = gluon_decode.BALANCED_SPILLS.get(triton_release(), ())
    rows = [(seed, index) for seed, index in ((73, 0), (43, 1)) if random_cases(8, seed)[index].problem.head_dim
            not in spilling]  # fmt: skip
    keys = [[seed, index, group] for seed, index in rows for group in (0, GROUP)]
    compiled = json_from_child(["-c", _GLUON_SCRIPT, json.dumps(keys)], timeout=600)
    for (seed, index, group), facts in zip(keys, compiled, strict=True):
        where = f"gluon {seed}/{index} group={group}: {facts}"
        assert facts["spill_bytes"] == 0, where
        assert facts["atomics"] == (3 if group else 1), where
        assert facts["registers"] <= 255, where


# ----------------------------------------------------------------------------------------------------
# GPU: against fp64, bit for bit over launches
# ----------------------------------------------------------------------------------------------------
# (Sq, heads, kv_heads, D, page size): GQA at one token contiguous and in pages of 32, MQA at 8 tokens D=256, and
# 128 packed rows at D=128 (two M tiles). The three stacks' merge tests share them (test_decode_merge_group_triton.py,
# test_decode_merge_group_cute.py).
GPU_CASES = [(1, 8, 2, 64, 0), (1, 8, 2, 64, 32), (8, 1, 1, 256, 0), (8, 16, 1, 128, 0)]


def long_among_short(seqlen_q: int, heads: int, kv_heads: int, head_dim: int, page_size: int) -> tuple:
    """(problem, inputs q k v, extra) of one long sequence among short ones (``LONG_AMONG_SHORT``) on the GPU."""
    problem = Problem(
        len(LONG_AMONG_SHORT), heads, seqlen_q, 40960, head_dim, dtype=torch.bfloat16, causal=True,
        kv_heads=kv_heads, causal_alignment="bottom_right", has_cache_seqlens=True, page_size=page_size,
    )  # fmt: skip
    q, k, v = make_inputs(problem, seed=head_dim + page_size, device="cuda", offset=0.5)
    extra = {"cache_seqlens": torch.tensor(LONG_AMONG_SHORT, dtype=torch.int32, device="cuda")}
    if page_size:
        k, v, extra["block_table"] = make_paged_kv(problem, k, v, seed=page_size)
    return problem, (q, k, v), extra


# The rungs whose split kernel merges in runs (``BALANCED_MERGE_GROUP``): the module of the knob, the rung's module.
FUSED_RUNS = {
    "gluon/decode": ("triton_impl.gluon._decode_balanced", "triton_impl.gluon.decode"),
    "triton/decode": ("triton_impl.decode", "triton_impl.decode"),
}


def _runs_on_gpu(rung: str, group: int, monkeypatch: pytest.MonkeyPatch):
    """``rung``'s module with runs of ``group`` (0: one level), on a CUDA GPU."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    knob_module, rung_module = (importlib.import_module(name) for name in FUSED_RUNS[rung])
    monkeypatch.setattr(knob_module, "BALANCED_MERGE_GROUP", group)
    return rung_module


@pytest.mark.gpu
@pytest.mark.parametrize("group", [0, GROUP], ids=["one-level", "runs"])
@pytest.mark.parametrize(("seqlen_q", "heads", "kv_heads", "head_dim", "page_size"), GPU_CASES)
@pytest.mark.parametrize("rung", sorted(FUSED_RUNS))
def test_gpu_runs_against_fp64_and_deterministic(
    rung: str, seqlen_q: int, heads: int, kv_heads: int, head_dim: int, page_size: int, group: int,
    monkeypatch: pytest.MonkeyPatch,
):  # fmt: skip
    module = _runs_on_gpu(rung, group, monkeypatch)
    monkeypatch.setattr(module, "BALANCED_SPLIT", "always")
    problem, (q, k, v), extra = long_among_short(seqlen_q, heads, kv_heads, head_dim, page_size)
    shares = plan_of(rung, problem, LONG_AMONG_SHORT, q.device)[2]
    assert not group or (max(shares) > group and max(shares) % group), (
        f"the long item should end in a partial run: {shares}"
    )
    impl = module.IMPLEMENTATION
    result = check_on_inputs(impl, q, k, v, problem, **extra)
    assert result.ok, f"{rung} BALANCED_MERGE_GROUP={group} {problem.describe()} {shares}: {result.summary()}"
    assert_launches_repeat(impl.prepare(q, k, v, problem, **extra))


@pytest.mark.gpu
@pytest.mark.parametrize("rung", sorted(FUSED_RUNS))
def test_gpu_seed73_row0_against_fp64(rung: str, monkeypatch: pytest.MonkeyPatch):
    module = _runs_on_gpu(rung, GROUP, monkeypatch)
    case = random_cases(8, 73)[0]
    if not module.balanced_split(case.problem, torch.device("cuda")):
        pytest.skip(f"{rung} does not take the balanced split for seed 73's row 0 on this GPU")
    result = check_on_gpu(rung, case.problem, case.lengths, seed=73)
    assert result.ok, f"{rung} BALANCED_MERGE_GROUP={GROUP} seed 73 row 0: {result.summary()}"
