"""The balanced split's grid axes: ``M_TILE_MAJOR`` in triton/decode, gluon/decode and cute/decode (on in each since
``bench/decode_mtile_major_ab.sh``, results/h200/decode-mtile-major/), the M tile on grid x and the share on y, so
that a share's M tiles run together.

CPU: on in every rung; ``splits.balanced_grid`` (the share on x off, the M tile on x on, share CTAs past grid y's
limit refused) and ``splits.balanced_m_tile_major`` (the share back on x past grid y's limit, so no shape is refused);
off, each rung launches the grid and constexprs it did before (triton: the launch recorded; gluon: the bound launch;
cute: the compile key, whose field is False), on, the two axes swap on the balanced split only, with the same
workspace and counters, and the padded split is untouched; triton/decode with it on against fp64 under
the interpreter on 48 packed rows at D=256 (two 32-row M tiles) on the balanced split, ragged and paged ragged; a
planted kernel that reads the swapped axes on the unswapped grid fails the check. Static (sm_90a): gluon's and cute's
balanced kernels with it on compile without spills in about the registers of the knob off (ptxas may move one or two),
their PTX differing from it (one shape a rung; triton's default kernels compile in its own static tests).
GPU (``gpu``; ``bench/decode_mtile_major_ab.sh``): each rung with it on against fp64 on a poisoned output, on seed
47's paged ragged row's kind (128 rows at D=256: cute 4 M tiles, gluon 2, triton 1) and 64 rows at D=256 paged(64)
ragged (triton and cute 2 M tiles), on the balanced split.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from common.contract import splits
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from common.toolchain.releases import triton_release
from tests._helpers import json_from_child

# The same interpreter check (seed 5, offset 0.5, poisoned output, forced shares) and shapes' builder, CPU-only mark
# and GPU check as the other packed-row knobs' tests.
from tests.test_decode_packed import _interpreter_check
from tests.test_decode_wide import _problem, check_on_gpu, interpreter_only
from triton_impl import decode
from triton_impl.gluon import decode as gluon_decode

CPU = torch.device("cpu")
HAS_CUTE = importlib.util.find_spec("cutlass") is not None
needs_cute = pytest.mark.skipif(not HAS_CUTE, reason="the CuTe DSL (nvidia-cutlass-dsl) is not installed")


def _rung_modules() -> dict[str, object]:
    modules = {"triton/decode": decode, "gluon/decode": gluon_decode}
    if HAS_CUTE:
        from cute_impl import decode as cute_decode

        modules["cute/decode"] = cute_decode
    return modules


def test_on_by_default_in_every_rung():
    for name, module in _rung_modules().items():
        assert module.M_TILE_MAJOR is True, f"{name}: M_TILE_MAJOR is off though its H200 A/B took it"


def test_balanced_grid_puts_the_m_tile_on_x_and_refuses_shares_past_grid_y():
    assert splits.balanced_grid(130, 4, False) == (130, 4)
    assert splits.balanced_grid(130, 4, True) == (4, 130)
    assert splits.balanced_grid(splits.MAX_GRID_Y, 2, True) == (2, splits.MAX_GRID_Y)
    assert splits.balanced_grid(splits.MAX_GRID_Y + 1, 2, False) == (splits.MAX_GRID_Y + 1, 2)
    with pytest.raises(ValueError, match="on grid y, which CUDA caps at 65535"):
        splits.balanced_grid(splits.MAX_GRID_Y + 1, 2, True)
    assert splits.balanced_m_tile_major(splits.MAX_GRID_Y, True) is True
    assert splits.balanced_m_tile_major(splits.MAX_GRID_Y + 1, True) is False
    assert splits.balanced_m_tile_major(130, False) is False


# ----------------------------------------------------------------------------------------------------
# Each rung's grid, constexprs and workspace, off and on
# ----------------------------------------------------------------------------------------------------
class _Launches:
    """A stand-in for a Triton kernel: ``kernel[grid](*args, **kwargs)`` records (grid, args, kwargs), runs nothing."""

    def __init__(self) -> None:
        self.launches: list[tuple[tuple, tuple, dict]] = []

    def __getitem__(self, grid: tuple):
        return lambda *args, **kwargs: self.launches.append((grid, args, kwargs))


# 4 heads of a group × Sq 12 = 48 packed rows at D=256: two 32-row M tiles in triton/decode (fp32: the interpreter's)
# with its one 64-row wgmma tile (``WGMMA_D256``) off: the tests of two M tiles pin it off (``two_tiles``).
TWO_TILES = _problem(3, 1, 4, 12, 1024, 256, dtype=torch.float32, has_cache_seqlens=True)
TWO_TILES_LENGTHS = (1, 1000, 517)


@pytest.fixture
def two_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decode, "WGMMA_D256", False)


def _triton_launch(problem: Problem, monkeypatch: pytest.MonkeyPatch, shares: int) -> tuple[tuple, tuple, dict]:
    q, k, v = make_inputs(problem, seed=0, device="cpu")
    recorder = _Launches()
    monkeypatch.setattr(decode, "_balanced_split_kernel", recorder)
    lengths = torch.tensor(TWO_TILES_LENGTHS, dtype=torch.int32)
    decode.bind(q, k, v, problem, cache_seqlens=lengths, num_splits=shares)()
    (launch,) = recorder.launches
    return launch


def test_triton_grid_swaps_on_the_balanced_split_only(two_tiles: None, monkeypatch: pytest.MonkeyPatch):
    assert decode.m_blocks_for(TWO_TILES) == 2 and decode.balanced_split(TWO_TILES, CPU)
    monkeypatch.setattr(decode, "M_TILE_MAJOR", False)
    grid, args, options = _triton_launch(TWO_TILES, monkeypatch, shares=6)
    assert grid == (6 + 3, 2) and options["M_TILE_MAJOR"] is False
    monkeypatch.setattr(decode, "M_TILE_MAJOR", True)
    on_grid, on_args, on_options = _triton_launch(TWO_TILES, monkeypatch, shares=6)
    assert on_grid == (2, 6 + 3) and on_options == {**options, "M_TILE_MAJOR": True}
    # The same partials' slabs (OutPartial, LsePartial) and the same counters.
    assert [tuple(t.shape) for t in on_args[6:8]] == [tuple(t.shape) for t in args[6:8]] == [(9, 48, 256), (9, 48)]
    assert on_args[-5] is args[-5] and on_args[-4:] == args[-4:]  # the arrival counters, then the plan's sizes
    # The padded split (BALANCED_SPLIT "never") keeps its kernel and grid: it is not the knob's.
    monkeypatch.setattr(decode, "BALANCED_SPLIT", "never")
    assert not decode.balanced_split(TWO_TILES, CPU)


def test_gluon_grid_swaps_on_the_balanced_split_only(monkeypatch: pytest.MonkeyPatch):
    problem = _problem(3, 2, 16, 8, 65536, 128, has_cache_seqlens=True)  # 128 packed rows: two 64-row M tiles
    q, k, v = make_inputs(problem, seed=0, device="cpu")
    lengths = torch.tensor((65536, 0, 7), dtype=torch.int32)
    monkeypatch.setattr(gluon_decode, "BALANCED_SPLIT", "always")
    # One consumer a CTA in the balanced split: this test's M tiles are the grid's.
    monkeypatch.setattr(gluon_decode, "BALANCED_TWO_CONSUMERS", ())
    monkeypatch.setattr(gluon_decode, "M_TILE_MAJOR", False)
    off = gluon_decode.bind(q, k, v, problem, cache_seqlens=lengths, num_splits=5)
    monkeypatch.setattr(gluon_decode, "M_TILE_MAJOR", True)
    on = gluon_decode.bind(q, k, v, problem, cache_seqlens=lengths, num_splits=5)
    assert off.split_grid == (5 + 6, 2) and on.split_grid == (2, 5 + 6)
    assert off.split_options["M_TILE_MAJOR"] is False
    assert on.split_options == {**off.split_options, "M_TILE_MAJOR": True}
    assert [tuple(t.shape) for t in on.split_args[6:8]] == [tuple(t.shape) for t in off.split_args[6:8]]
    monkeypatch.setattr(gluon_decode, "BALANCED_SPLIT", "never")
    padded = gluon_decode.bind(q, k, v, problem, cache_seqlens=lengths, num_splits=5)
    # The padded split's two M tiles are one CTA's two consumers (TWO_CONSUMERS at D=128).
    assert padded.split_grid == (5, 1, 6) and padded.split_options["M_TILE_MAJOR"] is False
    assert padded.split_options["CONSUMERS"] == 2


@needs_cute
def test_cute_compile_key_changes_on_the_balanced_split_only(monkeypatch: pytest.MonkeyPatch):
    from cute_impl import decode as cute_decode

    problem = _problem(64, 1, 8, 16, 40448, 256, has_cache_seqlens=True, page_size=256)  # seed 47's row's kind
    monkeypatch.setattr(cute_decode, "M_TILE_MAJOR", False)
    num_splits, slabs, items, off = cute_decode.launch_plan(problem, CPU)
    assert cute_decode.m_blocks_for(problem) == 2 and slabs == num_splits + 64 and items == 1  # 64-row tiles
    assert off.m_tile_major is False and off == dataclasses.replace(off, m_tile_major=False)
    monkeypatch.setattr(cute_decode, "M_TILE_MAJOR", True)
    on_plan = cute_decode.launch_plan(problem, CPU)
    assert on_plan[:3] == (num_splits, slabs, items) and on_plan[3] == dataclasses.replace(off, m_tile_major=True)
    # Past grid y's limit the share stays on x (splits.balanced_m_tile_major): the plan takes the shape.
    assert cute_decode.launch_plan(problem, CPU, num_splits=splits.MAX_GRID_Y)[3].m_tile_major is False
    monkeypatch.setattr(cute_decode, "BALANCED_SPLIT", "never")
    padded_on = cute_decode.launch_plan(problem, CPU)[3]
    monkeypatch.setattr(cute_decode, "M_TILE_MAJOR", False)
    assert padded_on == cute_decode.launch_plan(problem, CPU)[3] and padded_on.m_tile_major is False


# ----------------------------------------------------------------------------------------------------
# triton/decode with the knob against fp64 under the interpreter, and a planted bug
# ----------------------------------------------------------------------------------------------------
# Two 32-row M tiles (48 packed rows: the second half padding) on the balanced split, 6 forced shares: a ragged 1k
# cache (a sequence of 1, one of 1000, one of 517) and the same lengths in pages of 64 keys.
INTERPRETER_CASES = {
    "balanced-ragged": (TWO_TILES, TWO_TILES_LENGTHS, 6),
    "balanced-paged": (dataclasses.replace(TWO_TILES, page_size=64), TWO_TILES_LENGTHS, 6),
}


@interpreter_only
@pytest.mark.parametrize("case", sorted(INTERPRETER_CASES))
def test_triton_m_tile_major_against_fp64(case: str, two_tiles: None, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(decode, "M_TILE_MAJOR", True)
    problem, lengths, shares = INTERPRETER_CASES[case]
    assert decode.m_blocks_for(problem) == 2 and decode.balanced_split(problem, CPU)
    result = _interpreter_check(problem, lengths, shares)
    assert result.ok, f"M_TILE_MAJOR {problem.describe()}: {result.summary()}"


@interpreter_only
def test_planted_swapped_kernel_on_the_unswapped_grid_fails_the_check(two_tiles: None, monkeypatch: pytest.MonkeyPatch):
    """The kernel reads the M tile from x and the share from y, the grid keeps the share on x: only shares 0 and 1
    run (as M tiles), and M tiles past the second attend padding rows."""
    monkeypatch.setattr(decode, "M_TILE_MAJOR", True)
    monkeypatch.setattr(splits, "balanced_grid", lambda slabs, m_blocks, m_tile_major: (slabs, m_blocks))
    # Fresh arrival counters: the planted launch leaves some items' counts short of their shares.
    monkeypatch.setattr(decode, "_ARRIVAL_COUNTERS", {})
    result = _interpreter_check(*INTERPRETER_CASES["balanced-ragged"])
    assert not result.ok, f"the planted axes passed: {result.summary()}"


# ----------------------------------------------------------------------------------------------------
# sm_90a: the knob's kernels without spills, in about the knob off's registers
# ----------------------------------------------------------------------------------------------------
_COMPILE_SCRIPT = r"""
import json, sys
import torch
from common.contract.problem import Problem
from common.reporting.static import cubin_resources
from triton_impl.gluon import decode as gluon_decode

results = []
for rung, batch, kv_heads, group, seqlen_q, head_dim, page_size, on in json.loads(sys.argv[1]):
    problem = Problem(batch, kv_heads * group, seqlen_q, 16384, head_dim, dtype=torch.bfloat16, causal=True,
                      kv_heads=kv_heads, causal_alignment="bottom_right", has_cache_seqlens=True, return_lse=True,
                      page_size=page_size)
    if rung == "cute":
        from cute_impl import decode as cute_decode
        module, compile_balanced = cute_decode, cute_decode.compile_sm90
    else:
        module, compile_balanced = gluon_decode, gluon_decode.compile_sm90
    module.M_TILE_MAJOR = on
    (binary, *_) = compile_balanced(problem)
    usages = cubin_resources(binary.cubin)
    name = next(name for name in usages if "merge" not in name)
    spills = sum(usage["local_bytes"] + usage["stack_bytes"] for usage in usages.values())
    results.append({"registers": usages[name]["registers"], "spill_bytes": spills,
                    "balanced": module.balanced_split(problem, torch.device("cpu")),
                    "m_blocks": module.m_blocks_for(problem), "ptx": binary.ptx.split(".section\t.debug")[0]})
print(json.dumps(results))
"""
# rung -> (B, Hkv, group, Sq, D, page size): seed 47's row's kind (128 rows at D=256 paged(256): gluon two 64-row tiles,
# cute four of 32). triton/decode's balanced kernels compile with the knob as the module holds it in its own static
# tests (``tests/_helpers.triton_balanced_sm90``), so its off/on pair is left out (CI time).
KNOB_COMPILES = {
    "gluon": [(64, 1, 8, 16, 256, 256)],
    "cute": [(64, 1, 8, 16, 256, 256)],
}


def _compiled_off_and_on(rung: str) -> list[tuple[tuple, dict, dict]]:
    shapes = KNOB_COMPILES[rung]
    keys = [[rung, *shape, on] for shape in shapes for on in (False, True)]
    compiled = json_from_child(["-c", _COMPILE_SCRIPT, json.dumps(keys)], timeout=1200)
    return [(shape, compiled[2 * i], compiled[2 * i + 1]) for i, shape in enumerate(shapes)]


def _assert_same_resources_and_swapped_axes(rung: str) -> None:
    for shape, off, on in _compiled_off_and_on(rung):
        where = f"{rung} {shape}: off {off['registers']} registers, on {on['registers']}"
        if not off["balanced"]:  # gluon's D=256 under a release of BALANCED_SPILLS: the padded split, not the knob's
            assert rung == "gluon" and triton_release() in gluon_decode.BALANCED_SPILLS, where
            continue
        assert off["m_blocks"] >= 2, where
        assert off["spill_bytes"] == on["spill_bytes"] == 0, where
        # Only the indices' source changes: ptxas may move a register or two (Triton 3.7: 241 -> 242), not more.
        assert abs(off["registers"] - on["registers"]) <= 8, where
        # The knob reaches the kernel: both read x and y, and the code differs (the share's index comes from y).
        assert off["ptx"] != on["ptx"], where
        assert all(re.search(r"%ctaid\.[xy]", result["ptx"]) for result in (off, on)), where


@pytest.mark.static
@pytest.mark.parametrize("rung", ["gluon"])
def test_triton_stack_knob_kernels_compile_for_sm90_like_the_default(rung: str):
    _assert_same_resources_and_swapped_axes(rung)


@needs_cute
@pytest.mark.cute_compile
def test_cute_knob_kernel_compiles_for_sm90_like_the_default():
    _assert_same_resources_and_swapped_axes("cute")


# ----------------------------------------------------------------------------------------------------
# GPU: each rung with the knob against fp64
# ----------------------------------------------------------------------------------------------------
# Seed 47's row's kind, smaller: MQA group 8 × Sq 16 = 128 rows at D=256 in pages of 256 over a ragged batch (17 keys,
# a full sequence, a tail, 77); B=16 H=32 Hkv=2 Sq=4's kind: 64 rows at D=256 in pages of 64, ragged (an empty-ish one).
GPU_CASES = {
    "seed47-kind": (_problem(4, 1, 8, 16, 4352, 256, has_cache_seqlens=True, page_size=256), (17, 4352, 1000, 77)),
    "64rows-paged": (_problem(4, 2, 16, 4, 4352, 256, has_cache_seqlens=True, page_size=64), (4352, 5, 3000, 700)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
@pytest.mark.parametrize("impl_name", ["triton/decode", "gluon/decode", "cute/decode"])
def test_gpu_m_tile_major_against_fp64(impl_name: str, case: str, monkeypatch: pytest.MonkeyPatch):
    modules = _rung_modules()
    if impl_name not in modules:
        pytest.skip("the CuTe DSL is not installed")
    module, (problem, lengths) = modules[impl_name], GPU_CASES[case]
    monkeypatch.setattr(module, "BALANCED_SPLIT", "always")
    monkeypatch.setattr(module, "M_TILE_MAJOR", True)
    if not module.balanced_split(problem, torch.device("cuda")):
        pytest.skip(f"{impl_name} takes the padded split here under Triton {triton_release()} (BALANCED_SPILLS)")
    result = check_on_gpu(impl_name, problem, lengths, seed=len(case))
    tiles = module.m_blocks_for(problem)
    assert result.ok, f"{impl_name} M_TILE_MAJOR ({tiles} M tiles) {problem.describe()}: {result.summary()}"


# ----------------------------------------------------------------------------------------------------
# bench/decode_mtile_major_ab.sh and bench/decode_mtile_major.py without a GPU
# ----------------------------------------------------------------------------------------------------
# (label, rung) -> the plan at today's defaults: where the knob changes the dispatch order (balanced, 2+ M tiles).
# cute/decode's D=256 tiles are 64 rows since results/h200/decode-d256-many-rows/ (32 when this A/B ran: x4 and x2).
BENCH_PLANS = {
    ("seed47-4", "triton/decode"): "balanced x1", ("seed47-4", "gluon/decode"): "balanced x2",
    ("seed47-4", "cute/decode"): "balanced x2", ("64rows-paged", "triton/decode"): "balanced x1",
    ("64rows-paged", "gluon/decode"): "balanced x1", ("64rows-paged", "cute/decode"): "balanced x1",
    **{("control-seed43-0", rung): "balanced x1" for rung in ("triton/decode", "gluon/decode", "cute/decode")},
}  # fmt: skip


def test_bench_times_seed_47s_row_first_with_the_plans_it_names(monkeypatch: pytest.MonkeyPatch):
    from bench import decode_mtile_major as bench

    cases = dict(bench.mtile_cases())
    assert list(cases) == ["seed47-4", "64rows-paged", "control-seed43-0"]
    assert cases["seed47-4"].describe().startswith("B=64 H=8 Hkv=1 Sq=16 Sk=40448 D=256")
    assert cases["64rows-paged"].describe().startswith("B=16 H=32 Hkv=2 Sq=4 Sk=16384 D=256")
    if triton_release() in decode.WIDE_D256_SPILLS:  # triton's 128-row D=256 tile stands down: four 32-row tiles
        monkeypatch.setitem(BENCH_PLANS, ("seed47-4", "triton/decode"), "balanced x4")
    if triton_release() in gluon_decode.BALANCED_SPILLS:
        monkeypatch.setitem(BENCH_PLANS, ("seed47-4", "gluon/decode"), "padded x2")
        monkeypatch.setitem(BENCH_PLANS, ("64rows-paged", "gluon/decode"), "padded x1")
    rungs = _rung_modules()
    for (label, rung), plan in BENCH_PLANS.items():
        if rung in rungs:
            assert bench.plan_of(rung, cases[label].problem, CPU) == plan, (label, rung)
    with bench.applied("triton/decode", "off"):
        assert decode.M_TILE_MAJOR is False
    assert decode.M_TILE_MAJOR is True


def test_bench_table_and_script():
    from bench.decode_mtile_major import markdown

    row = {"label": "seed47-4", "shape": "S", "impl": "cute/decode", "plan": "balanced x4", "status": "ok"}
    rows = [{**row, "setting": "off", "us": 249.0, "pct_read_bw": 16.0}, {**row, "setting": "on", "us": 100.0,
            "pct_read_bw": 40.0}]  # fmt: skip
    line = "| seed47-4: S | cute/decode | balanced x4 | 249.0 µs (16 %) | 100.0 µs (40 %) | 0.40 |"
    assert line in markdown(rows, 1.0)
    script = (Path(__file__).parents[1] / "bench" / "decode_mtile_major_ab.sh").read_text()
    assert "tests/test_decode_mtile_major.py" in script and "-m gpu" in script
    assert "source_carried_activations" in script and '".gpu/fa4"' in script
    assert re.search(r"python3 -m bench\.decode_mtile_major\b", script)
