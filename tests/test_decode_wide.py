"""Issue #38's packed rows: ``WIDE_M_TILE`` in triton/decode (on by default at D=128, ``WIDE_M_TILE_HEAD_DIMS``)
and gluon/decode (off), one CTA for up to 128 packed rows (group · Sq) at D <= 128 instead of one per 64.

CPU: off, every rung plans with 64-row tiles; on (triton's at every head dim it has a tile for), the tile, warps and
M tiles of the shapes it is for (and none of the others); triton's default takes it at D=128 only (planted, a default
that takes it at D=64 fails); triton/decode with it on against fp64 under the interpreter, contiguous and paged; a
planted wide plan whose grid still counts 64-row tiles fails the check. Static: both rungs' wide kernels
compile for sm_90a without spills, in the shared memory a CTA may take (gluon's D=128 ring and 128-row Q
tile: 224 KB). GPU (``gpu`` marker; run for ``results/h200/decode-packed-ab/``): both rungs with it on against
fp64 on a poisoned output, on the worst row's kind (group 16 × Sq 8, D=64, paged, ragged) and 256 rows at D=128
(two wide tiles, split and merged).
"""

from __future__ import annotations

import json

import pytest
import torch

from common.contract.check import check_on_inputs
from common.contract.inputs import make_inputs, make_paged_kv
from common.contract.problem import Problem
from common.contract.registry import Implementation, discover
from tests._helpers import json_from_child, triton_wide_tile_at_every_head_dim
from triton_impl import decode
from triton_impl.gluon import decode as gluon_decode

interpreter_only = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter tests run on CPU-only machines")
DECODE_IMPLS = {impl.name: impl for impl in discover(include_baselines=False)[0]}
MODULES = {"triton/decode": decode, "gluon/decode": gluon_decode}


def _problem(batch: int, kv_heads: int, group: int, seqlen_q: int, seqlen_k: int, head_dim: int, **changes) -> Problem:
    return Problem(
        batch, kv_heads * group, seqlen_q, seqlen_k, head_dim, dtype=changes.pop("dtype", torch.bfloat16),
        causal=True, kv_heads=kv_heads, causal_alignment="bottom_right", return_lse=True, **changes,
    )  # fmt: skip


def _rows_per_tile(module, problem: Problem) -> tuple[int, int, int]:
    """(packed rows a CTA takes, its warps, M tiles per (batch, KV head)) of ``module``'s plan."""
    if module is decode:
        return decode.block_m_for(problem), decode.tile_config(problem).num_warps, decode.m_blocks_for(problem)
    return gluon_decode.block_m_for(problem), gluon_decode.num_warps_for(problem), gluon_decode.m_blocks_for(problem)


# (group, Sq, D) -> (rows, warps, M tiles) with the switch on: 128 rows at D=64 and 128 in one tile, 80 rows
# padded to a 128-row tile, 256 rows in two; D=256 and 64 rows or fewer keep their tiles.
WIDE_PLANS = {
    (16, 8, 64): (128, 8, 1), (16, 8, 128): (128, 8, 1), (5, 16, 64): (128, 8, 1), (16, 16, 128): (128, 8, 2),
    (16, 8, 256): None, (8, 8, 64): None, (4, 4, 128): None,
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(MODULES))
def test_wide_tile_takes_the_shapes_of_more_than_64_rows_at_d_up_to_128(name: str, monkeypatch: pytest.MonkeyPatch):
    module = MODULES[name]
    # triton/decode's D=256 tiles of more than 64 rows are WIDE_D256's (tests/test_decode_d256.py), not this knob's.
    monkeypatch.setattr(module, "WIDE_D256", False, raising=False)
    if module is decode:
        monkeypatch.setattr(decode, "WIDE_M_TILE_HEAD_DIMS", tuple(decode.WIDE_CONFIGS))
    for (group, seqlen_q, head_dim), wide in WIDE_PLANS.items():
        problem = _problem(2, 4, group, seqlen_q, 4096, head_dim)
        monkeypatch.setattr(module, "WIDE_M_TILE", False)
        default = _rows_per_tile(module, problem)
        assert default[:2] != (128, 8), f"{name}: the default takes 128-row tiles at {problem.describe()}"
        monkeypatch.setattr(module, "WIDE_M_TILE", True)
        assert _rows_per_tile(module, problem) == (wide or default), f"{name} {problem.describe()}"


def assert_triton_default_wide_at_d128_only() -> None:
    """triton/decode's default: 128 packed rows take the wide tile at D=128, two 64-row tiles at D=64 (where they
    ran 0.71-1.00x its time on the tree of 2026-12-06, results/h100/triton-decode-wide-d64-2026-12-06/)."""
    for head_dim, wide in ((64, False), (128, True)):
        problem = _problem(2, 4, 16, 8, 4096, head_dim)
        expected = (128, 8, 1) if wide else (64, 4, 2)
        assert _rows_per_tile(decode, problem) == expected, f"default at {problem.describe()}"


def test_triton_default_takes_the_wide_tile_at_d128_only():
    assert decode.WIDE_M_TILE and decode.WIDE_M_TILE_HEAD_DIMS == (128,)
    assert_triton_default_wide_at_d128_only()


def test_planted_default_wide_at_d64_fails(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(decode, "WIDE_M_TILE_HEAD_DIMS", (64, 128))
    with pytest.raises(AssertionError):
        assert_triton_default_wide_at_d128_only()


# ----------------------------------------------------------------------------------------------------
# triton/decode with the wide tile against fp64 under the interpreter
# ----------------------------------------------------------------------------------------------------
def _interpreter_check(problem: Problem, lengths: tuple[int, ...]) -> tuple[bool, str]:
    q, k, v = make_inputs(problem, seed=3, device="cpu", offset=0.5)
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32)
    block_table = None
    if problem.paged:
        k, v, block_table = make_paged_kv(problem, k, v, seed=3)
    result = check_on_inputs(
        decode.IMPLEMENTATION, q, k, v, problem, cache_seqlens=cache_seqlens, block_table=block_table
    )
    return result.ok, result.summary()


# 16 heads of a group × Sq 8 = 128 packed rows at D=64, a sequence of 1 and one of 3 blocks and a tail.
WIDE_LENGTHS = (1, 150, 64)


@interpreter_only
@pytest.mark.parametrize("page_size", [0, 32])
def test_triton_wide_tile_against_fp64(page_size: int, monkeypatch: pytest.MonkeyPatch):
    triton_wide_tile_at_every_head_dim(monkeypatch)
    problem = _problem(3, 1, 16, 8, 192, 64, dtype=torch.float32, has_cache_seqlens=True, page_size=page_size)
    assert _rows_per_tile(decode, problem) == (128, 8, 1)
    ok, summary = _interpreter_check(problem, WIDE_LENGTHS)
    assert ok, f"{problem.describe()}: {summary}"


@interpreter_only
def test_planted_wide_grid_of_64_row_tiles_fails_the_check(monkeypatch: pytest.MonkeyPatch):
    """A planted plan: the wide tile, but only the first 64-row tile's worth of rows in the grid (M tiles
    counted as 128 rows in two 64-row tiles would cover them; one 64-row tile does not)."""
    triton_wide_tile_at_every_head_dim(monkeypatch)
    monkeypatch.setattr(decode, "WIDE_CONFIGS", {64: decode.TileConfig(64, 8, 3, max_block_m=64)})
    monkeypatch.setattr(decode, "m_blocks_for", lambda problem: 1)
    problem = _problem(3, 1, 16, 8, 192, 64, dtype=torch.float32, has_cache_seqlens=True)
    ok, summary = _interpreter_check(problem, WIDE_LENGTHS)
    assert not ok, f"the planted grid passed: {summary}"


# ----------------------------------------------------------------------------------------------------
# sm_90a: the wide kernels without spills, in a CTA's shared memory
# ----------------------------------------------------------------------------------------------------
_COMPILE_SCRIPT = r"""
import json, sys
import torch
from common.contract.problem import Problem
from common.reporting.static import cubin_resources
from triton_impl import decode
from triton_impl.gluon import decode as gluon_decode
results = []
for rung, head_dim, seqlen_k, page_size in json.loads(sys.argv[1]):
    problem = Problem(8, 32 * 16, 8, seqlen_k, head_dim, dtype=torch.bfloat16, causal=True, kv_heads=32,
                      causal_alignment="bottom_right", has_cache_seqlens=True, return_lse=True, page_size=page_size)
    module = decode if rung == "triton" else gluon_decode
    module.WIDE_M_TILE = True
    decode.WIDE_M_TILE_HEAD_DIMS = tuple(decode.WIDE_CONFIGS)
    binary = module.compile_sm90(problem)[0]
    (resources,) = cubin_resources(binary.cubin).values()
    results.append({"spill_bytes": resources["local_bytes"] + resources["stack_bytes"],
                    "registers": resources["registers"], "shared_bytes": binary.shared_bytes,
                    "threads": binary.threads_per_cta})
print(json.dumps(results))
"""
# (rung, D, Sk, page size): D=64 paged (the worst row's kind) and D=128 on a long cache (gluon's 128-key ring).
COMPILES = [("triton", 64, 4352, 64), ("triton", 128, 32768, 0), ("gluon", 64, 4352, 64), ("gluon", 128, 32768, 0)]
# The most a CTA may ask for on sm_90 (227 KB).
CTA_SHARED_LIMIT = 232448


@pytest.mark.static
def test_wide_tiles_compile_for_sm90_without_spills():
    compiled = json_from_child(["-c", _COMPILE_SCRIPT, json.dumps(COMPILES)], timeout=1200)
    for (rung, head_dim, _, page_size), result in zip(COMPILES, compiled, strict=True):
        where = f"{rung} WIDE_M_TILE D={head_dim} page={page_size}: {result}"
        assert result["spill_bytes"] == 0 and result["threads"] == 256, where
        assert 0 < result["shared_bytes"] <= CTA_SHARED_LIMIT, where


# ----------------------------------------------------------------------------------------------------
# GPU: both rungs with the wide tile against fp64
# ----------------------------------------------------------------------------------------------------
# The worst row's kind at B=4 Hkv=2 (group 16 × Sq 8, D=64, pages of 64, ragged: an empty-ish sequence, a
# tail); 256 rows (group 16 × Sq 16) at D=128 on a full contiguous cache: two wide tiles.
GPU_CASES = {
    "packed-paged-d64": (_problem(4, 2, 16, 8, 4352, 64, has_cache_seqlens=True, page_size=64), (8, 4186, 1000, 77)),
    "packed-256-d128": (_problem(2, 2, 16, 16, 3000, 128), None),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
@pytest.mark.parametrize("impl_name", sorted(MODULES))
def test_gpu_wide_tile_against_fp64(impl_name: str, case: str, monkeypatch: pytest.MonkeyPatch):
    problem, lengths = GPU_CASES[case]
    module = MODULES[impl_name]
    monkeypatch.setattr(module, "WIDE_M_TILE", True)
    monkeypatch.setattr(decode, "WIDE_M_TILE_HEAD_DIMS", tuple(decode.WIDE_CONFIGS))
    assert _rows_per_tile(module, problem)[:2] == (128, 8)
    result = check_on_gpu(impl_name, problem, lengths, seed=len(case))
    assert result.ok, f"{impl_name} WIDE_M_TILE {problem.describe()}: {result.summary()}"


def check_on_gpu(impl: str | Implementation, problem: Problem, lengths: tuple[int, ...] | None, seed: int):
    """``impl`` (a decode rung's name, or an Implementation) against fp64 on fresh CUDA inputs of ``problem``
    (offset 0.5), with ``lengths`` as its ``cache_seqlens`` (None: full) and a paged cache where it is paged."""
    q, k, v = make_inputs(problem, seed=seed, device="cuda", offset=0.5)
    cache_seqlens = None if lengths is None else torch.tensor(lengths, dtype=torch.int32, device="cuda")
    block_table = None
    if problem.paged:
        k, v, block_table = make_paged_kv(problem, k, v, seed=seed)
    implementation = DECODE_IMPLS[impl] if isinstance(impl, str) else impl
    return check_on_inputs(implementation, q, k, v, problem, cache_seqlens=cache_seqlens, block_table=block_table)
