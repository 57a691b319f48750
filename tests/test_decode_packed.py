"""Issue #38's short prefill: ``PACKED_OCCUPANCY`` in triton/decode and gluon/decode (off in both), more CTAs an SM
where many packed rows (group · Sq) make each key block's softmax the long part of the step.

CPU: off, both rungs plan as before; on, triton/decode's wide tile at D=64 takes 32-key blocks, two CTAs an SM and
a 128-register cap, gluon/decode's full 64-row tiles take the shallow rings (D=64 and 128), and no other shape
changes; triton/decode with it on against fp64 under the interpreter (a full cache with Sq ≠ Sk and a causal tail,
a paged ragged one, a ragged one on the balanced split); a planted grid that covers only the first 64 of 128 rows
fails the check. Static: both rungs' knob kernels compile for sm_90a without a spill in their key loops (triton's
128-register cap leaves 8 bytes in the LSE's epilogue), each within the registers and shared memory its CTA count
needs. GPU (``gpu`` marker; ``bench/decode_packed_ab.sh``): both rungs with it on against fp64 on a poisoned
output, on seed 41's low row's kind and on 64 packed rows at D=128.
"""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest
import torch

from common.contract.check import check_on_inputs
from common.contract.inputs import make_inputs, make_paged_kv
from common.contract.problem import Problem
from common.toolchain.releases import triton_release
from tests._helpers import json_from_child

# The same shapes' builder, rung modules and CPU-only mark as WIDE_M_TILE's tests.
from tests.test_decode_wide import MODULES, _problem, check_on_gpu, interpreter_only
from triton_impl import decode
from triton_impl.gluon import decode as gluon_decode


def _plan(module, problem: Problem) -> tuple:
    """What the knob may change: (rows a CTA takes, M tiles, key block, ring depth, CTA slots the split rule counts)."""
    config = decode.tile_config(problem) if module is decode else gluon_decode.decode_config(problem)
    return (
        module.block_m_for(problem), module.m_blocks_for(problem), config.block_n, config.num_stages,
        module.split_policy(problem).ctas_per_sm,
    )  # fmt: skip


# (group, Sq, D, Sk) -> the plan with the knob on, per rung (None: as with it off). Seed 41's low row (8 × 16 rows
# at D=64 on 1k keys) and its D=128 twin, 64 rows at D=64 and 128, 256 rows at D=64 on a long cache, a D=256 and
# a 16-row shape.
PACKED_PLANS = {
    (8, 16, 64, 1024): {"triton/decode": (128, 1, 32, 5, 2), "gluon/decode": (64, 2, 64, 2, 4)},
    (8, 16, 128, 1024): {"triton/decode": None, "gluon/decode": (64, 2, 32, 3, 3)},
    (4, 16, 64, 2048): {"triton/decode": None, "gluon/decode": (64, 1, 64, 2, 4)},
    (8, 8, 128, 4096): {"triton/decode": None, "gluon/decode": (64, 1, 32, 3, 3)},
    (16, 16, 64, 16384): {"triton/decode": (128, 2, 32, 5, 2), "gluon/decode": (64, 4, 64, 2, 4)},
    (16, 8, 256, 4096): {"triton/decode": None, "gluon/decode": None},
    (4, 4, 64, 4096): {"triton/decode": None, "gluon/decode": None},
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_packed_occupancy_changes_only_the_shapes_of_many_packed_rows(name: str, monkeypatch: pytest.MonkeyPatch):
    module = MODULES[name]
    assert module.PACKED_OCCUPANCY is False, f"{name}: PACKED_OCCUPANCY is on by default before its GPU A/B"
    for (group, seqlen_q, head_dim, seqlen_k), plans in PACKED_PLANS.items():
        problem = _problem(2, 4, group, seqlen_q, seqlen_k, head_dim)
        default = _plan(module, problem)
        monkeypatch.setattr(module, "PACKED_OCCUPANCY", True)
        assert _plan(module, problem) == (plans[name] or default), f"{name} {problem.describe()}"
        monkeypatch.setattr(module, "PACKED_OCCUPANCY", False)
        assert _plan(module, problem) == default


def test_packed_occupancy_leaves_gluon_wide_tile_alone(monkeypatch: pytest.MonkeyPatch):
    """gluon/decode's WIDE_M_TILE (two warpgroups on one ring) keeps its own ring under the knob."""
    problem = _problem(2, 4, 8, 16, 1024, 64)
    monkeypatch.setattr(gluon_decode, "WIDE_M_TILE", True)
    wide = _plan(gluon_decode, problem)
    monkeypatch.setattr(gluon_decode, "PACKED_OCCUPANCY", True)
    assert _plan(gluon_decode, problem) == wide


def test_packed_occupancy_caps_triton_registers_in_every_launch(monkeypatch: pytest.MonkeyPatch):
    problem = _problem(2, 4, 8, 16, 1024, 64)
    assert decode.launch_options(problem)["maxnreg"] is None
    monkeypatch.setattr(decode, "PACKED_OCCUPANCY", True)
    assert decode.launch_options(problem) == {"num_warps": 8, "num_stages": 5, "maxnreg": 128}
    paged = _problem(2, 4, 8, 16, 1024, 64, has_cache_seqlens=True, page_size=64)
    assert decode.launch_options(paged)["num_stages"] == 5 + decode.PAGED_EXTRA_STAGES


# ----------------------------------------------------------------------------------------------------
# triton/decode with the knob against fp64 under the interpreter
# ----------------------------------------------------------------------------------------------------
def _interpreter_check(problem: Problem, lengths: tuple[int, ...] | None, num_splits: int | None = None):
    q, k, v = make_inputs(problem, seed=5, device="cpu", offset=0.5)
    cache_seqlens = None if lengths is None else torch.tensor(lengths, dtype=torch.int32)
    block_table = None
    if problem.paged:
        k, v, block_table = make_paged_kv(problem, k, v, seed=5)
    impl = decode.IMPLEMENTATION
    if num_splits is not None:  # the prepare keyword the public API lacks
        impl = dataclasses.replace(impl, prepare=functools.partial(impl.prepare, num_splits=num_splits))
    return check_on_inputs(impl, q, k, v, problem, cache_seqlens=cache_seqlens, block_table=block_table)


# 8 heads of a group × Sq 16 = 128 packed rows at D=64 (seed 41's low row's kind): a full cache of 77 keys (two
# 32-key blocks and a tail under the causal diagonal), forced into 2 splits (the fused merge of 128-row tiles);
# pages of 16 keys over a ragged batch (a sequence of 1, one of 3 blocks and a tail, one ending on a block); a
# ragged 1k cache the rule splits, so the balanced split's kernel (seed 31's paged row takes it).
INTERPRETER_CASES = {
    "balanced-ragged": (_problem(3, 1, 8, 16, 1024, 64, dtype=torch.float32, has_cache_seqlens=True),
                        (1, 1000, 517), None),
    "full-split": (_problem(1, 1, 8, 16, 77, 64, dtype=torch.float32), None, 2),
    "paged-ragged": (_problem(3, 1, 8, 16, 128, 64, dtype=torch.float32, has_cache_seqlens=True, page_size=16),
                     (1, 105, 64), None),
}  # fmt: skip


@interpreter_only
@pytest.mark.parametrize("case", sorted(INTERPRETER_CASES))
def test_triton_packed_occupancy_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(decode, "PACKED_OCCUPANCY", True)
    problem, lengths, num_splits = INTERPRETER_CASES[case]
    assert _plan(decode, problem)[:3] == (128, 1, 32)
    assert decode.balanced_split(problem, torch.device("cpu")) == (case == "balanced-ragged")
    result = _interpreter_check(problem, lengths, num_splits)
    assert result.ok, f"{problem.describe()}: {result.summary()}"


@interpreter_only
def test_planted_packed_grid_of_one_64_row_tile_fails_the_check(monkeypatch: pytest.MonkeyPatch):
    """A planted plan: the knob's 32-key tile cut at 64 rows, but a grid of one M tile (rows 64..127 never
    written); the check on a poisoned output must catch it."""
    monkeypatch.setattr(decode, "PACKED_OCCUPANCY", True)
    monkeypatch.setattr(decode, "PACKED_CONFIGS", {64: decode.TileConfig(32, 8, 5, 64, 2, 128)})
    monkeypatch.setattr(decode, "m_blocks_for", lambda problem: 1)
    problem, lengths, num_splits = INTERPRETER_CASES["full-split"]
    result = _interpreter_check(problem, lengths, num_splits)
    assert not result.ok, f"the planted grid passed: {result.summary()}"


# ----------------------------------------------------------------------------------------------------
# sm_90a: the knob's kernels without spills in the key loops, at the registers and shared memory their CTA count needs
# ----------------------------------------------------------------------------------------------------
_COMPILE_SCRIPT = r"""
import json, sys
import torch
from common.contract.problem import Problem
from common.reporting import static
from triton_impl import decode
from triton_impl.gluon import decode as gluon_decode

def key_loop_spills(cubin):
    # Local loads and stores inside a loop holding a wgmma (a key-block loop).
    loops = static.sass_loops(static.cubin_sass(cubin))
    wgmma_loops = [body for _, body in loops if any(op.startswith("HGMMA") for op in body)]
    return sum(op.startswith(("LDL", "STL")) for body in wgmma_loops for op in body)

results = []
for rung, head_dim, group, seqlen_k, page_size in json.loads(sys.argv[1]):
    problem = Problem(16, 32 * group, 16, seqlen_k, head_dim, dtype=torch.bfloat16, causal=True, kv_heads=32,
                      causal_alignment="bottom_right", has_cache_seqlens=page_size > 0, return_lse=True,
                      page_size=page_size)
    module = decode if rung == "triton" else gluon_decode
    module.PACKED_OCCUPANCY = True
    gluon_decode.PACKED_PREFILL_MIN_ROWS = None  # the split kernels': 128 packed rows would take the packed prefill
    binary = module.compile_sm90(problem)[0]
    (resources,) = static.cubin_resources(binary.cubin).values()
    results.append({"spill_bytes": resources["local_bytes"] + resources["stack_bytes"],
                    "key_loop_spills": key_loop_spills(binary.cubin), "registers": resources["registers"],
                    "shared_bytes": binary.shared_bytes, "threads": binary.threads_per_cta})
print(json.dumps(results))
"""
# (rung, D, group, Sk, page size) -> CTAs an SM the knob is for: triton's 128-row tile at D=64, contiguous and
# in pages of 64; gluon's 64-row tiles at D=64 (four) and D=128 (three), one paged.
COMPILES = {
    ("triton", 64, 8, 1024, 0): 2, ("triton", 64, 8, 4352, 64): 2,
    ("gluon", 64, 8, 1024, 0): 4, ("gluon", 128, 8, 1024, 0): 3, ("gluon", 64, 4, 4352, 16): 4,
}  # fmt: skip
SM_REGISTERS, SM_SHARED_BYTES, CTA_RESERVED_SHARED_BYTES = 65536, 233472, 1024
# Under triton's 128-register cap the LSE's epilogue keeps 8 bytes on the stack under Triton 3.8, 16 under 3.6
# and 3.9 (stores and loads after the key loops; sm_90a): allowed there, never a local access inside a key-block
# loop.
EPILOGUE_SPILL_BYTES = {"triton": 16, "gluon": 0}
# Compiles that miss the CTAs an SM the knob tells the split rule, by release: under Triton 3.9 gluon's paged D=64
# tile takes 136 registers (three CTAs an SM, not four). The knob is off (it lost its A/B,
# results/h200/decode-packed-occupancy-ab/); the test holds the miss so that a change either way shows.
CTAS_MISSED = {"3.9": {("gluon", 64, 4, 4352, 16)}}


@pytest.mark.static
def test_packed_kernels_compile_for_sm90_within_their_ctas_an_sm():
    compiled = json_from_child(["-c", _COMPILE_SCRIPT, json.dumps(list(COMPILES))], timeout=1200)
    for (key, ctas), result in zip(COMPILES.items(), compiled, strict=True):
        where = f"{key} PACKED_OCCUPANCY, {ctas} CTAs an SM: {result}"
        assert result["key_loop_spills"] == 0 and result["spill_bytes"] <= EPILOGUE_SPILL_BYTES[key[0]], where
        fits = result["registers"] * result["threads"] * ctas <= SM_REGISTERS
        assert fits != (key in CTAS_MISSED.get(triton_release(), set())), where
        assert ctas * (result["shared_bytes"] + CTA_RESERVED_SHARED_BYTES) <= SM_SHARED_BYTES, where


# ----------------------------------------------------------------------------------------------------
# GPU: both rungs with the knob against fp64
# ----------------------------------------------------------------------------------------------------
# Seed 41's low row's kind at B=2 Hkv=2 (group 8 × Sq 16, D=64, a full 1k cache), its paged ragged twin (pages of
# 64), and 64 rows at D=128 on a ragged 3000-key cache (gluon's 32-key ring).
GPU_CASES = {
    "packed-128-d64": (_problem(2, 2, 8, 16, 1024, 64), None),
    "packed-128-d64-paged": (_problem(4, 2, 8, 16, 4352, 64, has_cache_seqlens=True, page_size=64),
                             (8, 4186, 1000, 77)),
    "packed-64-d128": (_problem(3, 2, 4, 16, 3000, 128, has_cache_seqlens=True), (3000, 17, 1999)),
}  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
@pytest.mark.parametrize("impl_name", sorted(MODULES))
def test_gpu_packed_occupancy_against_fp64(impl_name: str, case: str, monkeypatch: pytest.MonkeyPatch):
    problem, lengths = GPU_CASES[case]
    module = MODULES[impl_name]
    default = _plan(module, problem)
    monkeypatch.setattr(module, "PACKED_OCCUPANCY", True)
    if _plan(module, problem) == default:
        pytest.skip(f"{impl_name}: PACKED_OCCUPANCY does not change {problem.describe()}")
    result = check_on_gpu(impl_name, problem, lengths, seed=len(case))
    assert result.ok, f"{impl_name} PACKED_OCCUPANCY {problem.describe()}: {result.summary()}"


# ----------------------------------------------------------------------------------------------------
# bench/decode_packed.py without a GPU: its shapes, which settings it times, its table
# ----------------------------------------------------------------------------------------------------
def test_packed_bench_times_seed_41s_row_first_and_each_setting_where_it_changes_the_plan():
    from bench.decode_packed import packed_cases, settings_to_time
    from common.measure.decode_sweep import RANDOM_MIN_CACHE_BYTES

    cases = dict(packed_cases())
    first = next(iter(cases.values()))
    assert first.describe() == "B=16 H=256 Hkv=32 Sq=16 Sk=1024 D=64 bf16 causal(bottom_right)"
    timed = {label: [settings_to_time(name, case.problem) for name in sorted(MODULES)] for label, case in cases.items()}
    # (gluon/decode's, triton/decode's): triton's knob is for more than 64 rows at D=64, gluon's for 64 or more.
    assert timed["seed41-1"] == [["default", "packed", "wide"], ["default", "packed"]]
    assert timed["64rows-d64-2k"] == [["default", "packed"], ["default"]]
    assert timed["long-256rows-d128-16k"] == [["default", "packed", "wide"], ["default"]]
    assert all(case.kv_bytes_read >= RANDOM_MIN_CACHE_BYTES for case in cases.values())
    assert sum(case.problem.seqlen_k >= 16384 for case in cases.values()) == 2


def test_packed_bench_restores_the_rung_constants():
    from bench.decode_packed import applied

    with applied("packed", "triton/decode"):
        assert decode.PACKED_OCCUPANCY and decode.WIDE_M_TILE
    with applied("wide", "gluon/decode"):
        assert gluon_decode.WIDE_M_TILE and not gluon_decode.PACKED_OCCUPANCY
    assert (decode.PACKED_OCCUPANCY, decode.WIDE_M_TILE) == (False, True)
    assert (gluon_decode.PACKED_OCCUPANCY, gluon_decode.WIDE_M_TILE) == (False, False)


def test_packed_bench_table_compares_each_setting_with_the_default():
    from bench.decode_packed import markdown

    row = {"label": "seed41-1", "impl": "gluon/decode", "shape": "S", "status": "ok", "reason": ""}
    rows = [
        {**row, "setting": "default", "plan": "64x2 n64x6 w4", "us": 72.5, "pct_read_bw": 42.6, "pct_roofline": 42.6},
        {**row, "setting": "packed", "plan": "64x2 n64x2 w4", "us": 58.0, "pct_read_bw": 53.3, "pct_roofline": 53.3},
        {**row, "setting": "wide", "status": "wrong", "plan": "128x1 n64x6 w8", "us": 1.0, "pct_read_bw": 1.0,
         "pct_roofline": 1.0},
        {**row, "label": "x", "setting": "default", "plan": "64x1 n64x6 w4", "us": 50.0, "pct_read_bw": 60.0,
         "pct_roofline": 61.0},
    ]  # fmt: skip
    table = markdown(rows, 4340.0, 672.0)
    assert (
        "| seed41-1: S | gluon/decode | 72.5 µs (43 %; 64x2 n64x6 w4) | 58.0 µs (53 %; 64x2 n64x2 w4) | wrong "
        "| 0.80 | — |" in table
    )
    # A shape the settings do not change: the default only; a roofline apart from the bandwidth is shown.
    assert "| x: S | gluon/decode | 50.0 µs (60 %; 61 % roofline; 64x1 n64x6 w4) | — | — | — | — |" in table
