"""Rung-specific checks of the Triton ladder up to ``pipelined``: input errors, capability reasons,
the pipelined rung's configuration choice, and its peeled mainloop on small tiles."""

from __future__ import annotations

import pytest
import torch

from common.contract.check import check_implementation
from common.contract.devices import triton_interpreting
from common.contract.problem import Problem
from triton_impl import _host as triton_host
from triton_impl import naive, online, pipelined, tiled

RUNGS = {"naive": naive, "online": online, "tiled": tiled, "pipelined": pipelined}
PREPARES = {
    "naive": naive.prepare,
    "online": online.prepare,
    "tiled": tiled.prepare,
    "pipelined": pipelined.prepare,
}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton_device = pytest.mark.skipif(
    DEVICE == "cpu" and not triton_interpreting(), reason="needs a GPU or TRITON_INTERPRET=1"
)


def _tensors(shape: tuple[int, ...], dtype: torch.dtype = torch.float16) -> list[torch.Tensor]:
    return [torch.randn(shape, dtype=dtype, device=DEVICE) for _ in range(3)]


@needs_triton_device
@pytest.mark.parametrize("rung", list(RUNGS))
def test_unsupported_head_dim_names_expected_and_given(rung: str):
    q, k, v = _tensors((1, 1, 8, 48))
    with pytest.raises(ValueError, match=r"head_dim must be one of \[.*\], got 48"):
        PREPARES[rung](q, k, v, Problem(1, 1, 8, 8, 48, dtype=torch.float16))


@needs_triton_device
@pytest.mark.parametrize("rung", list(RUNGS))
def test_integer_tensors_are_refused_with_a_type_error(rung: str):
    q, k, v = (torch.ones((1, 1, 8, 64), dtype=torch.int32, device=DEVICE) for _ in range(3))
    with pytest.raises(TypeError, match=r"dtype must be one of \[.*\], got int32"):
        PREPARES[rung](q, k, v, Problem(1, 1, 8, 8, 64, dtype=torch.float16))


@needs_triton_device
@pytest.mark.parametrize("rung", list(RUNGS))
def test_mismatched_key_value_shapes_are_refused(rung: str):
    q, k, _ = _tensors((1, 2, 8, 64))
    v = torch.randn((1, 2, 9, 64), dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match="k and v must have the same shape"):
        PREPARES[rung](q, k, v, Problem(1, 2, 8, 8, 64, dtype=torch.float16))


@pytest.mark.parametrize("rung", list(RUNGS))
def test_unsupported_head_dim_is_skipped_with_a_reason(rung: str):
    ok, reason = RUNGS[rung].supports(Problem(1, 1, 8, 8, 96, dtype=torch.float16), torch.device(DEVICE))
    assert not ok
    assert "head_dim 96" in reason or "Triton needs a CUDA device" in reason


def test_naive_refuses_a_score_buffer_larger_than_free_memory(monkeypatch: pytest.MonkeyPatch):
    problem = Problem(4, 32, 65536, 65536, 128, dtype=torch.float16)
    free_bytes = 80 * 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free_bytes, 2 * free_bytes))
    monkeypatch.setattr(triton_host, "triton_device_supported", lambda device: (True, ""))
    ok, reason = naive.supports(problem, torch.device("cuda"))
    assert not ok
    assert f"{problem.score_buffer_bytes:,} bytes" in reason
    assert f"{free_bytes:,} bytes" in reason


@pytest.mark.skipif(not triton_interpreting(), reason="bf16 is refused only under the interpreter")
@pytest.mark.parametrize("rung", ["tiled", "pipelined"])
def test_interpreter_refuses_bf16_dot(rung: str):
    ok, reason = RUNGS[rung].supports(Problem(1, 1, 8, 8, 64, dtype=torch.bfloat16), torch.device("cpu"))
    assert not ok
    assert "bf16" in reason


def test_canonical_problems_use_the_fixed_configuration():
    assert pipelined._is_canonical(Problem.canonical(8192, causal=True))
    assert pipelined._is_canonical(Problem.canonical(2048, head_dim=64))
    assert not pipelined._is_canonical(Problem(1, 2, 8191, 8191, 128))
    assert not pipelined._is_canonical(Problem.canonical(8192).with_(seqlen_k=4096))


def test_tuning_candidates_include_every_default_tile_shape():
    shapes = {(c.block_m, c.block_n, c.num_warps) for c in pipelined.CANDIDATES}
    defaults = {(c.block_m, c.block_n, c.num_warps) for (d, _), c in pipelined.DEFAULT_CONFIGS.items() if d != 256}
    assert defaults <= shapes


# Small tiles make the peeled mainloop take every path (unmasked blocks, diagonal, tail) on short
# sequences: causal with Sq < Sk, Sq > Sk, and lengths just off a tile multiple.
SMALL_TILE_SEQLENS = [(16, 16), (17, 33), (47, 31), (64, 100), (100, 64), (1, 40)]


@pytest.mark.skipif(DEVICE != "cpu" or not triton_interpreting(), reason="interpreter test on CPU-only machines")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlens", SMALL_TILE_SEQLENS, ids=[f"sq{q}-sk{k}" for q, k in SMALL_TILE_SEQLENS])
def test_pipelined_small_tiles_match_reference(seqlens: tuple[int, int], causal: bool, monkeypatch: pytest.MonkeyPatch):
    seqlen_q, seqlen_k = seqlens
    monkeypatch.setitem(pipelined.DEFAULT_CONFIGS, (32, causal), pipelined.TileConfig(16, 16, 4, 2))
    problem = Problem(1, 2, seqlen_q, seqlen_k, 32, dtype=torch.float32, causal=causal)
    result = check_implementation(pipelined.IMPLEMENTATION, problem, device="cpu", seed=seqlen_q + seqlen_k)
    assert result.ok, f"{problem.describe()}: {result.summary()}"


@pytest.mark.skipif(DEVICE != "cpu" or not triton_interpreting(), reason="interpreter test on CPU-only machines")
@pytest.mark.parametrize("rung", ["naive", "online", "tiled"])
def test_other_head_dims_match_reference(rung: str):
    for head_dim in (32, 128):
        problem = Problem(1, 1, 40, 70, head_dim, dtype=torch.float16, causal=True)
        result = check_implementation(RUNGS[rung].IMPLEMENTATION, problem, device="cpu", seed=head_dim)
        assert result.ok, f"{rung} {problem.describe()}: {result.summary()}"
