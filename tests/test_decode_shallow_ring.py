"""The balanced grid past one wave: ``BALANCED_SHALLOW_RING`` in gluon/decode (``_decode_balanced.py``) and
cute/decode, {64: 4} in both since its H200 A/B, cute's {128: 2} since seed 131's (``common/contract/splits.py``'s
"The balanced grid past one wave").

CPU: the timed defaults; ``splits.balanced_grid_spills`` at its bounds; on the sweep rows, the shallow ring where the
balanced grid spills past one wave of the rung's default CTA slots (seed 73's 392-CTA and seed 71's 520-CTA rows on
264 slots; cute's two D=128 stages on seed 131's 392-CTA paged(32) row) and not where it fits one (seed 73's paged B=4
row: 264 CTAs on 264 slots), takes many (seed 43's 1552) or the split is padded, the plan (target, shares) the same as
off; a planted off-by-one in the rule moves seed 73's paged row and fails that check. Static (sm_90a): the shallow
builds without spills, in the registers and shared memory of three CTAs an SM where the default's six stages (D=128:
three) hold two. GPU (``gpu``; ``bench/decode_shallow_ring_ab.sh``): both rungs with {64: 4} against fp64 on a
poisoned output on seed 73's row's kind (64 packed rows, ragged) and seed 71's (Sq=1 group 2 in pages of 128), cute
with {128: 2} on seed 131's D=128 row, the shallow ring checked to be the one launched.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from common.contract import splits
from common.contract.problem import Problem
from common.measure.decode_sweep import random_cases
from tests._helpers import json_from_child
from tests.test_decode_wide import _problem, check_on_gpu
from triton_impl.gluon import _decode_balanced
from triton_impl.gluon import decode as gluon_decode

CPU = torch.device("cpu")
HAS_CUTE = importlib.util.find_spec("cutlass") is not None
needs_cute = pytest.mark.skipif(not HAS_CUTE, reason="the CuTe DSL (nvidia-cutlass-dsl) is not installed")
SHALLOW, CUTE_SHALLOW = {64: 4}, {64: 4, 128: 2}
# An SM's shared memory (sm_90), the 1 KB the driver reserves a CTA, and the registers a thread that let three
# 128-thread CTAs share an SM (65536 / 384, in the allocator's units of 8).
SM_SHARED_BYTES, CTA_RESERVED_BYTES, REGISTERS_FOR_THREE_CTAS = 233472, 1024, 168


def _cute():
    from cute_impl import decode as cute_decode

    return cute_decode


def _set_knob(monkeypatch: pytest.MonkeyPatch, gluon: dict[int, int], cute: dict[int, int] | None = None) -> None:
    """gluon/decode's ring table ``gluon``, cute/decode's ``cute`` (the same when None)."""
    monkeypatch.setattr(_decode_balanced, "BALANCED_SHALLOW_RING", gluon)
    if HAS_CUTE:
        monkeypatch.setattr(_cute(), "BALANCED_SHALLOW_RING", gluon if cute is None else cute)


def test_the_timed_ring_is_the_default():
    assert _decode_balanced.BALANCED_SHALLOW_RING == SHALLOW, "gluon's default is the ring timed on the H200"
    if HAS_CUTE:
        assert _cute().BALANCED_SHALLOW_RING == CUTE_SHALLOW, "cute's default is the ring timed on the H200"


def test_grid_spills_past_one_wave_and_at_most_two():
    slots = 264
    assert [splits.balanced_grid_spills(grid, slots) for grid in (1, 264, 265, 392, 520, 528, 529, 1552)] == [
        False, False, True, True, True, True, False, False,
    ]  # fmt: skip


# ----------------------------------------------------------------------------------------------------
# Which rows the knob changes, and nothing of their plan
# ----------------------------------------------------------------------------------------------------
def _gluon_stages(problem: Problem) -> int | None:
    """gluon/decode's ring depth for ``problem``'s balanced launch on 132 SMs (None: the padded split)."""
    if not gluon_decode.balanced_split(problem, CPU):
        return None
    policy, block_n = gluon_decode.split_policy(problem), gluon_decode.decode_config(problem).block_n
    slots = (policy.ctas_per_sm, gluon_decode.BALANCED_SHARES_BY_SLOTS)
    target = _decode_balanced.balanced_sizes(problem, CPU, None, gluon_decode.m_blocks_for(problem), block_n, *slots)[1]
    return gluon_decode.balanced_stages(problem, CPU, target)


def _cute_stages(problem: Problem) -> int | None:
    """cute/decode's ring depth for ``problem``'s balanced launch on 132 SMs (None: the padded split)."""
    cute_decode = _cute()
    _, slabs, _, config = cute_decode.launch_plan(problem, CPU)
    return None if slabs is None else config.shape.stages


# Sweep rows -> (gluon's, cute's) ring depth with the knob on: seed 73's 392-CTA row and seed 71's 520-CTA row spill
# past one wave of 264 slots; seed 73's paged B=4 row fills exactly one (256 + 8 and 256 + 8 CTAs); seed 43's and 53's
# 1552-CTA rows are many waves; seed 61's B=32 MQA row is padded in both (in cute since its short-cache one split,
# 2026-12-06; 1552 CTAs before); seed 73's full D=64
# row is padded in both. D=128: seed 131's paged(32) row (392 CTAs) spills in both, gluon keeping its three stages
# (no 128 entry), cute taking two; seed 131's B=1 H=512 row is padded in both.
SHALLOW_ROWS = {
    (73, 2): (4, 4), (71, 0): (4, 4), (73, 0): (6, 6), (43, 2): (6, 6), (53, 4): (6, 6), (61, 7): (None, None),
    (73, 3): (None, None), (131, 4): (3, 2), (131, 3): (None, None),
}  # fmt: skip


def _ring_depths() -> dict[tuple[int, int], tuple[int | None, int | None]]:
    depths = {}
    for seed, index in SHALLOW_ROWS:
        problem = random_cases(8, seed)[index].problem
        depths[seed, index] = (_gluon_stages(problem), _cute_stages(problem) if HAS_CUTE else None)
    return depths


def _expected() -> dict[tuple[int, int], tuple[int | None, int | None]]:
    return {row: (gluon, cute if HAS_CUTE else None) for row, (gluon, cute) in SHALLOW_ROWS.items()}


def test_shallow_ring_where_the_grid_spills_past_one_wave(monkeypatch: pytest.MonkeyPatch):
    _set_knob(monkeypatch, SHALLOW, CUTE_SHALLOW)
    assert _ring_depths() == _expected()


def test_knob_leaves_the_plan(monkeypatch: pytest.MonkeyPatch):
    from bench.decode_ragged_ab import plan_of

    rungs = ["gluon/decode", "cute/decode"] if HAS_CUTE else ["gluon/decode"]
    for seed, index in ((73, 2), (71, 0), (131, 4)):
        case = random_cases(8, seed)[index]
        for rung in rungs:
            _set_knob(monkeypatch, {})
            off = plan_of(rung, case.problem, case.lengths, CPU)
            _set_knob(monkeypatch, SHALLOW, CUTE_SHALLOW)
            assert plan_of(rung, case.problem, case.lengths, CPU) == off, f"{rung} {seed}/{index}"


def _off_by_one(grid_ctas: int, slots: int) -> bool:
    """Planted: a grid of exactly one wave counted as spilling."""
    return slots <= grid_ctas <= splits.SHALLOW_RING_MAX_WAVES * slots


def test_planted_off_by_one_rule_fails_the_rows(monkeypatch: pytest.MonkeyPatch):
    _set_knob(monkeypatch, SHALLOW, CUTE_SHALLOW)
    monkeypatch.setattr(splits, "balanced_grid_spills", _off_by_one)
    depths = _ring_depths()
    assert depths != _expected()
    assert depths[73, 0][0] == 4, "seed 73's paged row (264 CTAs on 264 slots) should move under the planted rule"


# ----------------------------------------------------------------------------------------------------
# sm_90a: three CTAs an SM, no spills
# ----------------------------------------------------------------------------------------------------
_GLUON_SCRIPT = r"""
import json, sys
from common.measure.decode_sweep import random_cases
from common.reporting.static import cubin_resources
from triton_impl.gluon import _decode_balanced, decode

results = []
for seed, index, shallow in json.loads(sys.argv[1]):
    _decode_balanced.BALANCED_SHALLOW_RING = {64: 4} if shallow else {}
    (binary,) = decode.compile_sm90(random_cases(8, seed)[index].problem)
    (usage,) = cubin_resources(binary.cubin).values()
    results.append({"registers": usage["registers"], "spill_bytes": usage["local_bytes"] + usage["stack_bytes"],
                    "shared_bytes": binary.shared_bytes})
print(json.dumps(results))
"""


def _ctas_by_shared(shared_bytes: int) -> int:
    return SM_SHARED_BYTES // (shared_bytes + CTA_RESERVED_BYTES)


@pytest.mark.static
def test_gluon_shallow_ring_holds_three_ctas_an_sm_without_spills():
    keys = [[seed, index, shallow] for seed, index in ((73, 2), (71, 0)) for shallow in (False, True)]
    compiled = json_from_child(["-c", _GLUON_SCRIPT, json.dumps(keys)], timeout=600)
    for (seed, index, shallow), facts in zip(keys, compiled, strict=True):
        where = f"gluon {seed}/{index} shallow={shallow}: {facts}"
        assert facts["spill_bytes"] == 0, where
        assert _ctas_by_shared(facts["shared_bytes"]) == (3 if shallow else 2), where
        assert facts["registers"] <= REGISTERS_FOR_THREE_CTAS, where


@pytest.mark.cute_compile
@needs_cute
@pytest.mark.parametrize(("seed", "index"), [(73, 2), (71, 0), (131, 4)])
def test_cute_shallow_ring_holds_three_ctas_an_sm_without_spills(
    seed: int, index: int, monkeypatch: pytest.MonkeyPatch
):
    from common.reporting.static import cubin_resources

    cute_decode = _cute()
    monkeypatch.setattr(cute_decode, "BALANCED_SHALLOW_RING", CUTE_SHALLOW)
    problem = random_cases(8, seed)[index].problem
    config, head_dim = cute_decode.compile_plan(problem), problem.head_dim
    assert config.shape.stages == CUTE_SHALLOW[head_dim], config
    # The ring (K and V, stages × tile_n × D) and the Q tile, bf16, each aligned to a KB: three CTAs' worth.
    ring_bytes = 2 * config.shape.stages * config.shape.tile_n * head_dim * 2 + config.tile_m * head_dim * 2 + 2 * 1024
    assert _ctas_by_shared(ring_bytes) == 3, (ring_bytes, config)
    for name, usage in cubin_resources(cute_decode.compile_sm90(problem)[0].cubin).items():
        where = f"cute {seed}/{index} {name}: {usage}"
        assert usage["local_bytes"] + usage["stack_bytes"] == 0, where
        assert usage["registers"] <= REGISTERS_FOR_THREE_CTAS, where


# ----------------------------------------------------------------------------------------------------
# GPU: the shallow ring against fp64
# ----------------------------------------------------------------------------------------------------
# name -> (problem, lengths): seed 73's row's kind (B=4 Hkv=32 group 4 × Sq 16, 392 CTAs on an H200's 264 slots),
# seed 71's (B=8 Hkv=32 group 2 Sq=1 in pages of 128, 520 CTAs) and seed 131's D=128 row itself (B=32 Hkv=4 group 8
# Sq=1 in pages of 32, 392 CTAs); bench/decode_shallow_ring_ab.sh's fp64 checks add seed 73's row in pages of 32.
GPU_CASES = {
    "64rows-ragged": (_problem(4, 32, 4, 16, 12288, 64, has_cache_seqlens=True), (7857, 4311, 58, 6578)),
    "sq1-paged128-ragged": (
        _problem(8, 32, 2, 1, 12288, 64, has_cache_seqlens=True, page_size=128),
        (76, 54, 5870, 577, 9375, 12000, 3709, 124),
    ),
    "d128-sq1-paged32-ragged": (random_cases(8, 131)[4].problem, random_cases(8, 131)[4].lengths),
}
# rung -> its shallow ring table; each rung runs the cases whose head dim has an entry.
TABLES = {"gluon/decode": SHALLOW, "cute/decode": CUTE_SHALLOW}
GPU_RUNS = [
    (rung, case) for rung, table in TABLES.items() for case in sorted(GPU_CASES) if GPU_CASES[case][0].head_dim in table
]


def _launched_stages(rung: str, problem: Problem, device: torch.device) -> int:
    """The ring depth ``rung`` launches ``problem``'s balanced split with on ``device`` under the current switches."""
    if rung == "gluon/decode":
        policy, block_n = gluon_decode.split_policy(problem), gluon_decode.decode_config(problem).block_n
        slots = (policy.ctas_per_sm, gluon_decode.BALANCED_SHARES_BY_SLOTS)
        m_blocks = gluon_decode.m_blocks_for(problem)
        target = _decode_balanced.balanced_sizes(problem, device, None, m_blocks, block_n, *slots)[1]
        return gluon_decode.balanced_stages(problem, device, target)
    return _cute().launch_plan(problem, device)[3].shape.stages


@pytest.mark.gpu
@pytest.mark.parametrize(("rung", "case"), GPU_RUNS)
def test_gpu_shallow_ring_against_fp64(rung: str, case: str, monkeypatch: pytest.MonkeyPatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if rung == "cute/decode" and not HAS_CUTE:
        pytest.skip("the CuTe DSL (nvidia-cutlass-dsl) is not installed")
    problem, lengths = GPU_CASES[case]
    _set_knob(monkeypatch, SHALLOW, CUTE_SHALLOW)
    module, device = (gluon_decode if rung == "gluon/decode" else _cute()), torch.device("cuda")
    if not module.balanced_split(problem, device):
        pytest.skip(f"{rung} does not take the balanced split for {case} on this GPU's SM count")
    stages = _launched_stages(rung, problem, device)
    if stages != TABLES[rung][problem.head_dim]:
        pytest.skip(f"{rung}'s balanced grid for {case} does not spill past one wave on this GPU ({stages} stages)")
    result = check_on_gpu(rung, problem, lengths, seed=len(case))
    assert result.ok, f"{rung} BALANCED_SHALLOW_RING {problem.describe()}: {result.summary()}"


def test_the_shallow_ring_never_deepens_a_shallower_one():
    """A ring already shallower than the knob's (``PACKED_OCCUPANCY``'s three stages for four CTAs an SM) stays:
    on seed 73's spilling row the knob gives 4 stages against six, and 3 against three."""
    problem = random_cases(8, 73)[2].problem
    ring = [_decode_balanced.balanced_ring_stages(problem, CPU, 264, 1, 2, stages) for stages in (6, 3)]
    assert ring == [SHALLOW[64], 3]


def test_one_depth_rule_for_both_rungs():
    """``splits.shallow_ring_depth``, which gluon/decode and cute/decode both ask: the table's depth only where the grid
    spills past one wave (132 SMs, two slots: seed 73's 392 CTAs spill, 264 fit, 1552 are many waves) and the head dim
    has an entry."""
    shallow = {64: 4}
    assert splits.shallow_ring_depth(shallow, 64, 392, 264) == 4
    assert splits.shallow_ring_depth(shallow, 64, 264, 264) is None
    assert splits.shallow_ring_depth(shallow, 64, 1552, 264) is None
    assert splits.shallow_ring_depth(shallow, 128, 392, 264) is None
