"""gluon/decode's ``ITEMS_CTAS_PER_SM`` (issue #38; off, untimed until bench/gluon_decode_items_occupancy_ab.sh): the
items kernel's ring made shallow enough for more CTAs an SM, so that more consumers' fixed costs a tile run under one
another's copies.

Why: seed 6007's row 4 (B=32 H=512 Hkv=32 Sq=8 Sk=4608 D=64, ragged 16..4292) reads 44 % of an H100's read bandwidth on
the items kernel (264 CTAs, two an SM, walking 2048 tiles of ~650 keys on average), where triton/decode's 64-row CTAs
of 4 warps read 54 %.

CPU: off by default (6007/4 on 264 CTAs, 6 stages, 128 registers at launch); ``{64: 3}`` gives 6007/4 a 3-stage ring,
three CTAs an SM, 80 registers at launch and 396 CTAs; over the committed sweep it moves exactly the rows the items
kernel takes at D=64 and nothing else; the A/B script's rows are such rows, its control not; under a release of
``ITEMS_CTAS_PER_SM_SPILLS`` it moves nothing. Planted: an ``items_config`` that ignores the knob fails the plan check.

Static (sm_90a, child process, the running Triton release): the class's builds under ``{64: 3}`` (6007/4 in bf16,
fp16 non-causal with the LSE, pages of 64 and of 32 in chunks, seed 151's row 1) without spills or local memory, three
CTAs an SM by their shared memory and registers (two, the knob not applied, under a release of
``ITEMS_CTAS_PER_SM_SPILLS``); 6007/4 off keeps its two-CTA build.

GPU (``gpu``; the A/B script runs them first): four shapes of the class against fp64 on a poisoned output under
``{64: 3}`` (applied whatever the release: a spill costs time, not correctness), the three-CTA items launch checked to
be the one bound.
"""

from __future__ import annotations

import json

import pytest
import torch

from bench.decode_knob_ab import parse_row
from common.contract.problem import Problem
from common.measure.decode_sweep import random_cases
from common.toolchain.releases import triton_release
from tests._helpers import json_from_child, knob_ab_words
from tests.test_decode_wide import check_on_gpu
from triton_impl.gluon import decode as gluon_decode

CPU = torch.device("cpu")
KNOB = "ITEMS_CTAS_PER_SM"
SPILLS = "ITEMS_CTAS_PER_SM_SPILLS"
# The releases the module leaves the knob off under, read before the autouse fixture below empties them in-process.
RELEASES_THAT_SPILL = gluon_decode.ITEMS_CTAS_PER_SM_SPILLS
ON = {64: 3}
TARGET = "6007/4"
SCRIPT = "gluon_decode_items_occupancy_ab.sh"
# The committed sweep: seeds 1-239 (the tests' sweep) and the seeds named in results/.
NAMED_SEEDS = (1206, 2026, 3001, 3010, 3048, 4711, 5309, 6007, 6841)
SM_SHARED_BYTES, CTA_RESERVED_BYTES = 233472, 1024


def _problem(row: str) -> Problem:
    return parse_row(row)[1].problem


@pytest.fixture(autouse=True)
def _knob_applied_in_this_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests in this process read the plans with the knob applied, as the GPU machine's release builds them (the
    child process of the static tests keeps the module's list)."""
    monkeypatch.setattr(gluon_decode, SPILLS, ())


def _items_launch(problem: Problem, monkeypatch: pytest.MonkeyPatch, knob: dict[int, int]) -> dict | None:
    """The items launch a plan of ``problem`` binds under ``knob`` (None: not the items kernel)."""
    monkeypatch.setattr(gluon_decode, KNOB, knob)
    plan = gluon_decode.GluonDecodePlan(problem, CPU)
    if plan.packed_prefill or not plan.items_in_flight:
        return None
    options = plan.items_options
    ring = (options["BLOCK_N"], options["NUM_STAGES"])
    return {"grid": plan.items_grid, "ring": ring, "maxnreg": options["maxnreg"], "tiles": plan.num_tiles}


def _moved(problems: dict[str, Problem], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    return [
        row
        for row, problem in problems.items()
        if _items_launch(problem, monkeypatch, {}) != _items_launch(problem, monkeypatch, ON)
    ]


def _target_plan_is_three_ctas(monkeypatch: pytest.MonkeyPatch) -> bool:
    launch = _items_launch(_problem(TARGET), monkeypatch, ON)
    return launch == {"grid": (396,), "ring": (64, 3), "maxnreg": 80, "tiles": 2048}


def test_default_is_off_and_6007_4_keeps_two_ctas_an_sm(monkeypatch: pytest.MonkeyPatch):
    assert getattr(gluon_decode, KNOB) == {}
    launch = _items_launch(_problem(TARGET), monkeypatch, {})
    assert launch == {"grid": (264,), "ring": (64, 6), "maxnreg": 128, "tiles": 2048}


def test_on_6007_4_takes_three_ctas_an_sm(monkeypatch: pytest.MonkeyPatch):
    """Three stages of 64 keys and two Q tiles (64 KB) fit three CTAs an SM, 80 registers a thread at launch."""
    assert _target_plan_is_three_ctas(monkeypatch)
    assert gluon_decode.items_ctas_per_sm(_problem(TARGET)) == 3


def test_planted_knob_that_does_nothing_fails(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(gluon_decode, "items_config", gluon_decode.decode_config)
    assert not _target_plan_is_three_ctas(monkeypatch)


def test_a_release_that_spills_moves_nothing(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(gluon_decode, SPILLS, (triton_release(),))
    assert _moved({TARGET: _problem(TARGET)}, monkeypatch) == []


def test_knob_moves_exactly_the_items_rows_at_d64(monkeypatch: pytest.MonkeyPatch):
    """Over the committed sweep the knob moves a row exactly where the items kernel takes it at D=64: the sweep's
    eight items-kernel rows; every other row, D=128's items rows among them, keeps its launch."""
    seeds = (*range(1, 240), *NAMED_SEEDS)
    sweep = {f"{seed}/{index}": case.problem for seed in seeds for index, case in enumerate(random_cases(8, seed))}
    condition = [
        row
        for row, problem in sweep.items()
        if problem.head_dim == 64 and _items_launch(problem, monkeypatch, {}) is not None
    ]
    moved = _moved(sweep, monkeypatch)
    assert moved == condition and len(moved) == 8, moved


def test_ab_rows_are_moved_and_its_control_not(monkeypatch: pytest.MonkeyPatch):
    words = knob_ab_words(SCRIPT, "items_occupancy")
    assert words[1:4] == [f"triton_impl.gluon.decode:{KNOB}", "{},{64: 3}", "gluon/decode"], words
    *rows, control = words[4:]
    assert TARGET in rows
    for row in rows:
        assert _moved({row: _problem(row)}, monkeypatch) == [row], row
    assert _moved({control: _problem(control)}, monkeypatch) == [], control


# ----------------------------------------------------------------------------------------------------
# sm_90a: the three-CTA builds fit without spills
# ----------------------------------------------------------------------------------------------------
_SCRIPT = r"""
import json, re, sys
import torch
from bench.decode_knob_ab import parse_row
from common.reporting.static import cubin_resources, cubin_sass
from triton_impl.gluon import decode

target = parse_row("6007/4")[1].problem
rows = {
    "6007/4": target,
    "6007/4 fp16 non-causal lse": target.with_(dtype=torch.float16, causal=False, return_lse=True),
    "6007/4 paged64": target.with_(page_size=64),
    "6007/4 paged32": target.with_(page_size=32),
    "151/1": parse_row("151/1")[1].problem,
}
results = {}
for name, knob in json.loads(sys.argv[1]):
    decode.ITEMS_CTAS_PER_SM = {int(key): value for key, value in knob.items()}
    problem = rows[name]
    (binary,) = decode.compile_sm90(problem)
    (kernel, usage), = cubin_resources(binary.cubin).items()
    sass = cubin_sass(binary.cubin)
    results[f"{name}|{json.dumps(knob)}"] = {
        "kernel": kernel, "registers": usage["registers"], "spill_bytes": usage["local_bytes"] + usage["stack_bytes"],
        "local_ops": len(re.findall(r"\b(?:LDL|STL)\b", sass)), "shared_bytes": binary.shared_bytes,
        "ctas_per_sm": decode.items_ctas_per_sm(problem),
    }
print(json.dumps(results))
"""
BUILDS = ("6007/4", "6007/4 fp16 non-causal lse", "6007/4 paged64", "6007/4 paged32", "151/1")


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict]:
    keys = [[name, ON] for name in BUILDS] + [[TARGET, {}]]
    return json_from_child(["-c", _SCRIPT, json.dumps(keys)], timeout=1500)


@pytest.mark.static
def test_three_cta_builds_fit_without_spills(compiled: dict[str, dict]):
    """Three CTAs an SM, spill-free; under a release of ``ITEMS_CTAS_PER_SM_SPILLS`` the knob is not applied (two)."""
    ctas = 2 if triton_release() in RELEASES_THAT_SPILL else 3
    for name in BUILDS:
        facts = compiled[f"{name}|{json.dumps({str(key): value for key, value in ON.items()})}"]
        print(name, facts)
        assert facts["kernel"] == "_items_kernel" and facts["ctas_per_sm"] == ctas, (name, facts)
        assert facts["spill_bytes"] == 0 and facts["local_ops"] == 0, (name, facts)
        assert SM_SHARED_BYTES // (facts["shared_bytes"] + CTA_RESERVED_BYTES) >= ctas, (name, facts)
        assert facts["registers"] * 256 * ctas <= 65536, (name, facts)


@pytest.mark.static
def test_off_keeps_the_two_cta_build(compiled: dict[str, dict]):
    facts = compiled[f"{TARGET}|{{}}"]
    assert facts["kernel"] == "_items_kernel" and facts["ctas_per_sm"] == 2 and facts["registers"] == 128, facts


# ----------------------------------------------------------------------------------------------------
# GPU: the three-CTA items kernel against fp64
# ----------------------------------------------------------------------------------------------------
def _lengths(batch: int, low: int, high: int, seed: int) -> tuple[int, ...]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(low, high + 1, (batch,), generator=generator).tolist())


def _step(batch: int, kv_heads: int, group: int, seqlen_q: int, seqlen_k: int, **changes) -> Problem:
    return Problem(
        batch, kv_heads * group, seqlen_q, seqlen_k, 64, dtype=changes.pop("dtype", torch.bfloat16),
        causal=changes.pop("causal", True), kv_heads=kv_heads, causal_alignment="bottom_right",
        has_cache_seqlens=changes.pop("has_cache_seqlens", True), **changes,
    )  # fmt: skip


# name -> (problem, lengths or None for full): each has more tiles than 3 x 132 CTA slots.
GPU_CASES = {
    "6007/4 class, ragged with an empty sequence": (
        _step(32, 16, 16, 8, 4608),
        (0, *_lengths(31, 16, 4292, 1)),
    ),
    "pages of 32 in chunks, fp16, the LSE": (
        _step(64, 8, 5, 16, 2048, page_size=32, dtype=torch.float16, return_lse=True),
        _lengths(64, 1, 2048, 2),
    ),
    "pages of 64, group 16": (_step(32, 16, 16, 8, 4352, page_size=64), _lengths(32, 16, 4352, 3)),
    "full, non-causal": (_step(64, 8, 5, 16, 768, causal=False, has_cache_seqlens=False), None),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gpu_three_ctas_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    problem, lengths = GPU_CASES[case]
    monkeypatch.setattr(gluon_decode, KNOB, ON)
    plan = gluon_decode.GluonDecodePlan(problem, torch.device("cuda"))
    assert plan.items_in_flight and plan.items_options["NUM_STAGES"] == 3, problem.describe()
    assert gluon_decode.items_ctas_per_sm(problem) == 3, problem.describe()
    result = check_on_gpu("gluon/decode", problem, lengths, seed=len(case))
    assert result.ok, f"gluon/decode {KNOB}={ON} {problem.describe()}: {result.summary()}"
