"""Issue #38's compute-bound class on gluon/hopper's kernel: ``decode.PACKED_PREFILL_MIN_ROWS`` (128 by default and in
these tests) runs a contiguous cache of many packed rows (group · Sq a KV head) on gluon/hopper's warp-specialised
forward, q packed as (B, Hkv, group · Sq, D) by the launch (``PackedPrefill``) and O and the LSE written in place
(``attention_kernel``'s ``PACKED_GROUP``: each row's causal diagonal and bottom-right offset are its token's).
The counterpart of tests/test_cute_decode_packed_prefill.py (cute/decode's route, whose rule this one shares:
``splits.packed_prefill_splits``), without key splits.

CPU: on by default at 128; every sweep row of seeds 1-239 it takes is contiguous with 128+ packed rows, uneven work only
with 256+ rows and three waves of tiles, and (where the CuTe DSL is installed) exactly the rows cute/decode's unsplit
rule takes; seed 233 row 5's plan is gluon/hopper's configuration (two consumers, 256 tiles, one split, kept by a
longer cache), D=64 choosing the consumers that pad least, and paged caches, too few rows, D=256, a grid short of a
wave, uneven work below the guard and a forced split count keeping the split kernels (planted: without the guard the
uneven rows move); the launch's packing and the in-place outputs inverting each other (planted: token-major packing
fails); the packed rows with each row's token's diagonal against the float64 reference (planted: the diagonal at
row // group fails); bench/gluon_packed_prefill_ab.sh's rows parse and the switch moves the rows cute's unsplit route
moved. Static (sm_90a, child process): the packed builds (D=64 and 128, groups 8 and 16, causal bottom-right with cache
lengths) compile through gluon/decode's compile path without local memory. GPU (``gpu``): on, against fp64 on a
poisoned output with the packed plan checked to be the one launched; planted, the kernel launched without the packing
(``packed_group`` 1: each row's diagonal at its packed row, the offset Sk - group · Sq) fails the check.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from common import clear_plan_cache
from common.contract import splits
from common.contract.problem import Problem
from common.measure.decode_sweep import random_cases
from tests._helpers import (
    PACKED_STAND_IN_CASES,
    json_from_child,
    knob_ab_problems,
    packed_rows_by_rule,
    packed_rows_match,
    packed_stand_in_matches,
)
from tests.test_decode_wide import check_on_gpu
from triton_impl.gluon import decode as gluon_decode
from triton_impl.gluon import hopper as gluon_hopper

CPU = torch.device("cpu")
SWITCH = ("PACKED_PREFILL_MIN_ROWS", 128)
SEED233_ROW5 = random_cases(8, 233)[5].problem  # B=4 H=512 Hkv=32 Sq=16 Sk=22016 D=128: 256 packed rows, 256 tiles
RAGGED = (1, 1000, 77, 517)


def _problem(batch: int, kv_heads: int, group: int, seqlen_q: int, seqlen_k: int, head_dim: int, **changes) -> Problem:
    """A bf16 decode step, causal bottom-right, returning the LSE (``changes`` override)."""
    fields = {"dtype": torch.bfloat16, "causal": True, "causal_alignment": "bottom_right", "return_lse": True}
    return Problem(batch, kv_heads * group, seqlen_q, seqlen_k, head_dim, kv_heads=kv_heads, **{**fields, **changes})


@pytest.fixture
def switched(monkeypatch: pytest.MonkeyPatch) -> None:
    """The route on, at cute/decode's default (128 packed rows)."""
    monkeypatch.setattr(gluon_decode, *SWITCH)


def _sweep() -> list[tuple[str, Problem]]:
    return [
        (f"{seed}/{index}", case.problem) for seed in range(1, 240) for index, case in enumerate(random_cases(8, seed))
    ]


def test_on_by_default_at_cute_decodes_rows_and_off_at_none(monkeypatch: pytest.MonkeyPatch):
    assert gluon_decode.PACKED_PREFILL_MIN_ROWS == 128
    assert gluon_decode.packed_prefill(SEED233_ROW5)
    monkeypatch.setattr(gluon_decode, "PACKED_PREFILL_MIN_ROWS", None)
    assert not gluon_decode.packed_prefill(SEED233_ROW5)
    plan = gluon_decode.GluonDecodePlan(SEED233_ROW5, CPU)
    assert not plan.packed_prefill and not isinstance(plan.decisions[1], gluon_hopper.GluonConfig)


@pytest.mark.usefixtures("switched")
def test_on_takes_contiguous_rows_of_128_and_uneven_work_from_256_rows_and_three_waves():
    """Every sweep row of seeds 1-239 it takes: 128+ packed rows, contiguous, D 64 or 128, its tiles filling 90 % of
    the waves, and uneven (lengths over more than one sequence) only with 256+ rows and ``UNEVEN_MIN_WAVES`` waves."""
    taken = [problem for _, problem in _sweep() if gluon_decode.packed_prefill(problem)]
    assert len(taken) >= 10
    sms = splits.sm_count(CPU)
    for problem in taken:
        rows, tiles = splits.packed_rows(problem), gluon_decode.packed_prefill_tiles(problem)
        assert rows >= 128 and not problem.paged and problem.head_dim in (64, 128), problem.describe()
        assert splits.wave_efficiency(tiles, sms) >= gluon_decode.PACKED_PREFILL_MIN_WAVE_SHARE, problem.describe()
        if splits.uneven_work(problem):
            assert rows >= 256 and tiles >= splits.UNEVEN_MIN_WAVES * sms, problem.describe()


@pytest.mark.parametrize("min_rows", [128, 256])
def test_the_rule_is_cute_decodes_unsplit_rule(min_rows: int, monkeypatch: pytest.MonkeyPatch):
    """On every sweep row of seeds 1-239 gluon/decode takes the route exactly where cute/decode's rule, its key
    splits off, runs one split (the shared ``splits.packed_prefill_splits``); with them on, gluon keeps the rows
    cute splits."""
    pytest.importorskip("cutlass")
    from cute_impl import decode as cute_decode

    monkeypatch.setattr(gluon_decode, "PACKED_PREFILL_MIN_ROWS", min_rows)
    monkeypatch.setattr(cute_decode, "PACKED_PREFILL_MIN_ROWS", min_rows)
    monkeypatch.setattr(cute_decode, "PACKED_PREFILL_SPLITS", False)
    sweep = _sweep()
    gluon = {name: gluon_decode.packed_prefill(problem) for name, problem in sweep}
    cute = {name: cute_decode.packed_prefill_splits(problem) == 1 for name, problem in sweep}
    assert gluon == cute and any(gluon.values())
    monkeypatch.setattr(cute_decode, "PACKED_PREFILL_SPLITS", True)
    split_by_cute = [name for name, problem in sweep if (cute_decode.packed_prefill_splits(problem) or 1) > 1]
    assert split_by_cute and not any(gluon[name] for name in split_by_cute)


@pytest.mark.usefixtures("switched")
def test_seed233_row5_is_gluon_hoppers_kernel_on_packed_rows():
    plan = gluon_decode.GluonDecodePlan(SEED233_ROW5, CPU)
    expected = replace(gluon_hopper.DEFAULT_CONFIGS[128], consumers=2)
    assert plan.packed_prefill and plan.decisions == (False, expected, 1), plan.decisions
    assert (plan.balanced, plan.num_splits, plan.consumers, plan.items_in_flight) == (False, 1, 2, False)
    assert gluon_decode.packed_prefill_tiles(SEED233_ROW5) == 256
    longer = plan.grown(SEED233_ROW5.with_seqlen_k(500_000), CPU)  # the growing binder keeps the route
    assert longer.packed_prefill and longer.problem.seqlen_k == 500_000 and longer.sizes[3] == 500_000


def test_the_ab_plan_column_names_the_packed_route(monkeypatch: pytest.MonkeyPatch):
    """Planted: the column as it was, cute/decode's route only, says "padded" for a row the switch moved."""
    from bench.decode_ragged_ab import describe_plan, plan_of

    monkeypatch.setattr(gluon_decode, "PACKED_PREFILL_MIN_ROWS", None)
    assert plan_of("gluon/decode", SEED233_ROW5, None, CPU)[0] == "padded"
    monkeypatch.setattr(gluon_decode, *SWITCH)
    plan = plan_of("gluon/decode", SEED233_ROW5, None, CPU)
    assert plan == ("packed-prefill", 256), plan
    assert "prefill kernel" in describe_plan(plan)


@pytest.mark.usefixtures("switched")
def test_a_forced_split_count_keeps_the_split_kernel():
    plan = gluon_decode.GluonDecodePlan(SEED233_ROW5, CPU, num_splits=3)
    assert not plan.packed_prefill and plan.num_splits == 3 and plan.split_grid[0] == 3


@pytest.mark.parametrize(("group", "seqlen_q", "consumers"), [(16, 16, 2), (12, 16, 3), (24, 16, 3), (8, 16, 2)])
def test_d64_takes_the_consumers_that_pad_least(group: int, seqlen_q: int, consumers: int):
    """256 rows: two 128-row tiles, not two 192-row ones; 192 and 384 rows: 192-row tiles; 128: one 128-row tile."""
    problem = _problem(64, 32, group, seqlen_q, 8192, 64)
    config = gluon_decode.packed_prefill_config(problem)
    assert config.consumers == consumers and config.block_m == 64 * consumers
    assert config.pingpong == gluon_hopper.DEFAULT_CONFIGS[64].pingpong


# Problems the switch (at 128 rows) leaves on the split kernels, and why.
LEFT = {
    "paged": SEED233_ROW5.with_(page_size=64, has_cache_seqlens=True),
    "127-rows": _problem(64, 32, 127, 1, 8192, 128),
    "d256": random_cases(8, 229)[2].problem,
    "half-a-wave": SEED233_ROW5.with_(batch=1),  # 64 tiles on 132 SMs: no key splits here
    "fp8-none": SEED233_ROW5.with_(dtype=torch.float32),  # a dtype gluon/hopper does not take
}


@pytest.mark.usefixtures("switched")
@pytest.mark.parametrize("case", sorted(LEFT))
def test_on_leaves_other_problems(case: str, monkeypatch: pytest.MonkeyPatch):
    problem = LEFT[case]
    assert not gluon_decode.packed_prefill(problem)
    if problem.dtype in gluon_decode.DTYPES:
        on = gluon_decode.seqlen_k_decisions(problem, CPU)
        monkeypatch.setattr(gluon_decode, "PACKED_PREFILL_MIN_ROWS", None)
        assert gluon_decode.seqlen_k_decisions(problem, CPU) == on


def test_the_wave_share_decides_a_grid_short_of_the_sms(monkeypatch: pytest.MonkeyPatch):
    """133 tiles on 132 SMs fill 50 % of two waves: refused at 0.9, taken at 0."""
    monkeypatch.setattr(gluon_decode, *SWITCH)
    problem = _problem(133, 1, 16, 8, 8192, 128)
    assert gluon_decode.packed_prefill_tiles(problem) == 133
    assert not gluon_decode.packed_prefill(problem)
    monkeypatch.setattr(gluon_decode, "PACKED_PREFILL_MIN_WAVE_SHARE", 0.0)
    assert gluon_decode.packed_prefill(problem)


def test_uneven_work_below_256_rows_or_three_waves_keeps_the_split_kernels(monkeypatch: pytest.MonkeyPatch):
    """cute's measured losses (H100, 2026-12-05: 62/1, 214/0, 69/4) stay on the split kernels, 176/6 (256 rows, 3.9
    waves) moves; planted: without the guard the losses move."""
    from bench.decode_knob_ab import parse_row

    monkeypatch.setattr(gluon_decode, *SWITCH)
    row = lambda name: parse_row(name)[1].problem  # noqa: E731
    lost = [row(name) for name in ("62/1", "214/0", "69/4")]
    assert not any(gluon_decode.packed_prefill(problem) for problem in lost)
    assert gluon_decode.packed_prefill(row("176/6"))
    monkeypatch.setattr(gluon_decode, "PACKED_PREFILL_UNEVEN_MIN_ROWS", 128)
    monkeypatch.setattr(splits, "UNEVEN_MIN_WAVES", 0)
    assert all(gluon_decode.packed_prefill(problem) for problem in lost)


# ----------------------------------------------------------------------------------------------------
# The launch's packing and the in-place outputs (CPU tensors, the kernel replaced by a stand-in)
# ----------------------------------------------------------------------------------------------------
def _launch(problem: Problem, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache_seqlens=None):
    config = gluon_decode.packed_prefill_config(problem)
    return gluon_decode.PackedPrefill(q, k, v, problem, config, cache_seqlens)


def _stand_in(launch: gluon_decode.PackedPrefill, kernel) -> None:
    """``launch`` with gluon/hopper's kernel replaced by ``kernel(packed_q, out, lse)`` on its packed buffers."""
    attention = launch.attention
    launch.attention = lambda: kernel(launch.packed_q, attention.out, attention.lse)


def _token_major(launch: gluon_decode.PackedPrefill, q: torch.Tensor, problem: Problem) -> None:
    """Planted: the launch packs row token · group + head in group instead of (head in group) · Sq + token."""
    by_token = q.unflatten(1, (problem.kv_heads, problem.kv_group)).transpose(2, 3)  # (B, Hkv, Sq, group, D)
    launch.pack_q = lambda: launch.packed_q.view(by_token.shape).copy_(by_token)


def _simulated_round_trip(problem: Problem, token_major: bool = False) -> tuple[torch.Tensor, ...]:
    """q through the launch, a stand-in kernel writing each packed row's O = 2 q and LSE = its row's first value, and
    the launch's result: (q, O, LSE) as the caller sees them."""
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(problem.batch, problem.seqlen_q, problem.heads, problem.head_dim, generator=generator)
    q = q.to(problem.dtype).transpose(1, 2)  # (B, H, Sq, D), strided as bind may pass it
    k = torch.zeros(problem.batch, problem.kv_heads, problem.seqlen_k, problem.head_dim, dtype=problem.dtype)
    launch = _launch(problem, q, k, k)

    def kernel(packed_q, out, lse):
        out.copy_(2 * packed_q)
        lse.copy_(packed_q[..., 0].float())

    _stand_in(launch, kernel)
    if token_major:
        _token_major(launch, q, problem)
    out, lse = launch()
    return q, out, lse


def test_the_packing_and_the_in_place_outputs_invert_each_other():
    q, out, lse = _simulated_round_trip(_problem(2, 3, 8, 5, 64, 128))
    assert out.shape == q.shape and torch.equal(out, 2 * q)
    assert torch.equal(lse, q[..., 0].float())


def test_planted_token_major_packing_fails_the_round_trip():
    q, out, _ = _simulated_round_trip(_problem(2, 3, 8, 5, 64, 128), token_major=True)
    assert not torch.equal(out, 2 * q)


def _packed_kernel_stand_in(problem: Problem, lengths: tuple[int, ...], token_of_row) -> tuple[tuple, tuple]:
    """gluon/decode's packed route on CPU tensors with the kernel replaced by its rule in float64: packed row r of a KV
    head sees key j < its sequence's length and, causal, j <= token_of_row(r) + causal offset (length - Sq
    bottom-right, 0 top-left), as ``PACKED_GROUP`` asks of the kernel; returns the launch's (O, LSE) and the float64
    reference's."""
    from common.contract.inputs import make_inputs
    from common.contract.reference import reference_attention

    q, k, v = make_inputs(problem, seed=3, device="cpu", offset=0.5)  # (B, H, Sq, D), (B, Hkv, Sk, D)
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32)
    launch = _launch(problem, q, k, v, cache_seqlens)

    def kernel(packed_q, out, lse):
        packed_rows_by_rule(problem, lengths, token_of_row, k, v, packed_q, out, lse)

    _stand_in(launch, kernel)
    reference = reference_attention(q, k, v, problem, cache_seqlens=cache_seqlens, with_lse=True)
    return launch(), reference


@pytest.mark.parametrize("case", sorted(PACKED_STAND_IN_CASES))
def test_the_packed_rows_with_their_tokens_diagonal_are_the_gqa_problem(case: str):
    """The launch's packing, the kernel's masking rule (each row's token is row % Sq) and the in-place outputs give
    the original problem's O and LSE (float64 against the reference, O rounded once to the output dtype)."""
    assert packed_stand_in_matches(_packed_kernel_stand_in, case)


@pytest.mark.parametrize("token_of_row", ["row // group", "row"])
def test_planted_wrong_token_of_row_fails_the_gqa_problem(token_of_row: str):
    """The diagonal at row // group (a token-major packing's token) or at the packed row itself: O differs."""
    problem, lengths = PACKED_STAND_IN_CASES["bottom-right-ragged"]
    wrong = (lambda r: r // problem.kv_group) if token_of_row == "row // group" else (lambda r: r)
    (out, lse), reference = _packed_kernel_stand_in(problem, lengths, wrong)
    assert not packed_rows_match(out, lse, reference, check_lse=False)


def test_ab_script_rows_parse_and_the_switch_moves_the_rows_cutes_unsplit_route_moved(
    monkeypatch: pytest.MonkeyPatch,
):
    script = (Path(__file__).parents[1] / "bench" / "gluon_packed_prefill_ab.sh").read_text()
    assert "gpu_tests 150 -n 8 tests/test_gluon_decode_packed_prefill.py" in script
    head, rows = knob_ab_problems("gluon_packed_prefill_ab.sh", "packed_prefill")
    assert head == ["240", "triton_impl.gluon.decode:PACKED_PREFILL_MIN_ROWS", "None,128", "gluon/decode"], head
    _, cute_rows = knob_ab_problems("cute_decode_packed_prefill_ab.sh", "packed_prefill")
    assert rows == cute_rows and rows[0] == SEED233_ROW5
    monkeypatch.setattr(gluon_decode, *SWITCH)
    moved = [gluon_decode.packed_prefill(problem) for problem in rows]
    # 62/1 (128 tiles), 214/0 (128 tiles) and 69/4 (128 rows) are uneven work the guard keeps on the split kernels;
    # 139/1 and 107/0 fill too little of a wave without key splits.
    assert moved == [True] * 5 + [False, True, False, True, False, True, False, False], moved


# ----------------------------------------------------------------------------------------------------
# sm_90a: the packed builds through gluon/decode's compile path
# ----------------------------------------------------------------------------------------------------
def _small_grids_take_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The route on, and the test grids (small, their lengths few) let in past the wave share and the uneven guard."""
    monkeypatch.setattr(gluon_decode, *SWITCH)
    monkeypatch.setattr(gluon_decode, "PACKED_PREFILL_MIN_WAVE_SHARE", 0.0)
    monkeypatch.setattr(gluon_decode, "PACKED_PREFILL_UNEVEN_MIN_ROWS", 128)
    monkeypatch.setattr(splits, "UNEVEN_MIN_WAVES", 0)


_SCRIPT = r"""
import json, sys
import torch
from common.contract import splits
from common.contract.problem import Problem
from common.reporting.static import cubin_resources
from triton_impl.gluon import decode, hopper

decode.PACKED_PREFILL_MIN_ROWS, decode.PACKED_PREFILL_MIN_WAVE_SHARE = 128, 0.0
decode.PACKED_PREFILL_UNEVEN_MIN_ROWS, splits.UNEVEN_MIN_WAVES = 128, 0
results = {}
for head_dim, group in json.loads(sys.argv[1]):
    problem = Problem(8, 4 * group, 16, 8192, head_dim, torch.bfloat16, causal=True, kv_heads=4,
                      causal_alignment="bottom_right", has_cache_seqlens=True, return_lse=True)
    (binary,) = decode.compile_sm90(problem)
    (unpacked,) = hopper.compile_sm90(problem, decode.packed_prefill_config(problem))
    results[f"{head_dim}/{group}"] = {
        "taken": decode.packed_prefill(problem), "name": binary.name,
        "wgmma": "wgmma.mma_async" in binary.ptx, "setmaxnreg": "setmaxnreg" in binary.ptx,
        "rem": binary.ptx.count("rem.s32"), "unpacked_rem": unpacked.ptx.count("rem.s32"),
        "resources": list(cubin_resources(binary.cubin).values()),
    }
print(json.dumps(results))
"""
COMPILED = [(64, 8), (64, 16), (128, 8), (128, 16)]


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict]:
    """The packed builds, each beside the same configuration unpacked, compiled in a child process (this session
    interprets Triton), the route on and the small grids let in (as ``_small_grids_take_it``)."""
    return json_from_child(["-c", _SCRIPT, json.dumps(COMPILED)], timeout=900)


@pytest.mark.xdist_group("gluon-decode-packed-prefill-compile")
@pytest.mark.static
@pytest.mark.parametrize(("head_dim", "group"), COMPILED)
def test_packed_builds_compile_without_local_memory(head_dim: int, group: int, compiled: dict[str, dict]):
    """Causal bottom-right with cache lengths, Sq 16, through gluon/decode's compile path: gluon/hopper's kernel with
    ``PACKED_GROUP`` = group (its rows' tokens by a remainder: more ``rem`` than the same configuration unpacked), no
    local memory."""
    facts = compiled[f"{head_dim}/{group}"]
    print(head_dim, group, facts)
    assert facts["taken"] and facts["name"] == "attention_kernel" and facts["wgmma"] and facts["setmaxnreg"], facts
    assert facts["rem"] > facts["unpacked_rem"], f"PACKED_GROUP left no trace in the build: {facts}"
    for resources in facts["resources"]:
        assert resources["local_bytes"] == 0 and resources["stack_bytes"] == 0, (head_dim, group, resources)


# ----------------------------------------------------------------------------------------------------
# GPU: on, against fp64; the kernel without the packing fails
# ----------------------------------------------------------------------------------------------------
# name -> (problem, lengths or None for full); the LSE returned.
GPU_CASES = {
    "256rows-g16-sq16-d128-full": (_problem(2, 2, 16, 16, 2048, 128), None),
    "256rows-g16-sq16-d128-ragged": (_problem(4, 2, 16, 16, 1024, 128, has_cache_seqlens=True), RAGGED),
    "256rows-d128-lengths-below-sq": (_problem(4, 2, 16, 16, 700, 128, has_cache_seqlens=True), (0, 700, 5, 16)),
    "128rows-g8-sq16-d64-ragged": (_problem(4, 2, 8, 16, 1024, 64, has_cache_seqlens=True), RAGGED),
    "256rows-g16-sq16-d64-fp16-ragged": (
        _problem(4, 2, 16, 16, 1024, 64, has_cache_seqlens=True, dtype=torch.float16), RAGGED
    ),
    "192rows-g12-sq16-d64-three-consumers": (_problem(2, 2, 12, 16, 1000, 64), None),
    "128rows-g16-sq8-top-left": (_problem(2, 2, 16, 8, 1000, 128, causal_alignment="top_left"), None),
    "128rows-g8-sq16-rows-as-many-as-keys": (_problem(2, 2, 8, 16, 128, 128), None),
    "128rows-mqa-sq1": (_problem(2, 1, 128, 1, 3000, 128), None),
    "160rows-g32-sq5-half-tile": (_problem(2, 2, 32, 5, 777, 128), None),
    "256rows-d128-non-causal": (_problem(2, 2, 16, 16, 1500, 128, causal=False), None),
}  # fmt: skip


def _require_sm90() -> torch.device:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("gluon/hopper's kernel needs an sm_90 GPU")
    return torch.device("cuda")


def _check(case: str, problem: Problem, lengths: tuple[int, ...] | None):
    clear_plan_cache()  # the switch is read when a plan is made
    result = check_on_gpu("gluon/decode", problem, lengths, seed=len(case))
    clear_plan_cache()
    return result


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gpu_packed_prefill_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    device = _require_sm90()
    _small_grids_take_it(monkeypatch)
    problem, lengths = GPU_CASES[case]
    assert gluon_decode.GluonDecodePlan(problem, device).packed_prefill, problem.describe()
    result = _check(case, problem, lengths)
    assert result.ok, f"gluon/decode PACKED_PREFILL_MIN_ROWS=128 {problem.describe()}: {result.summary()}"


class _Unpacked(gluon_hopper.GluonAttention):
    """Planted: gluon/hopper's kernel launched without the packing (``packed_group`` 1), so each row is taken for a
    token: its diagonal at the packed row, the bottom-right offset Sk - group · Sq."""

    def __init__(self, *args, packed_group: int = 1, **kwargs):
        super().__init__(*args, **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["256rows-g16-sq16-d128-ragged", "128rows-g16-sq8-top-left"])
def test_gpu_planted_kernel_without_the_packing_fails_the_check(case: str, monkeypatch: pytest.MonkeyPatch):
    device = _require_sm90()
    _small_grids_take_it(monkeypatch)
    problem, lengths = GPU_CASES[case]
    assert gluon_decode.GluonDecodePlan(problem, device).packed_prefill, problem.describe()
    assert _check(case, problem, lengths).ok, "the unplanted kernel must pass"
    monkeypatch.setattr(gluon_hopper, "GluonAttention", _Unpacked)
    result = _check(case, problem, lengths)
    assert not result.ok, f"the kernel without the packing passed the check ({result.summary()})"
