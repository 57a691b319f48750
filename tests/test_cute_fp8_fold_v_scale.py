"""cute/fp8 with each key block's P V folded into O in one FMA a value (``fp8.FOLD_V_SCALE``, issue #37; on by default
at D=128 since 2026-12-06, results/h100/fp8-fold-v-2026-12-06/): O held in its last V block's frame and owing the last
softmax update's row factors, as gluon/fp8 accumulates, instead of an FMA with the block's V scale and a warp-uniform
conditional multiply by the row factors.

CPU: on by default, and the module constant reaches the configuration at D=128 only (``FOLD_V_SCALE_HEAD_DIMS``).
Static (sm_90a): the key step at least 40 instructions shorter at D=128 and 20 at D=64, causal and not, with no more
registers, spills or stack; the every-feature build (GQA, cache lengths, the LSE, bottom-right) no more spilled at
D=128, and at D=64 spilled (why D=64 is left out); planted, a fold that adds and rescales apart (the old arithmetic)
fails the rule. GPU (``gpu``; bench/fp8_fold_v_ab.sh): FP8_RULE against the emulation on ragged GQA shapes with cache
lengths and the LSE, every mask, at D=128 and (the knob forced) D=64, and on FA3's outlier inputs; planted, the fold
without the V-scale ratio fails it.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("cutlass")

import cutlass
import cutlass.cute as cute

from common.contract.check import check_on_inputs
from common.contract.fp8 import fa3_inputs
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from cute_impl import _hopper_device, fp8, hopper
from tests._helpers import MASKS, edge_cache_seqlens, feature_problem
from tests.test_cute_fp8_scale_index import key_step_build

MIN_CUT = {128: 40, 64: 20}  # key-step instructions the fold must save (the census counts the rescale as taken)


def test_on_by_default_and_the_constant_reaches_the_config_at_d128_only(monkeypatch: pytest.MonkeyPatch):
    problem = Problem(2, 16, 8192, 8192, 128, dtype=torch.bfloat16)
    assert fp8.FOLD_V_SCALE is True and fp8.FOLD_V_SCALE_HEAD_DIMS == (128,)
    assert fp8.fp8_config(problem, fp8.DEFAULT_QUANTISATION).fold_v_scale
    assert not fp8.fp8_config(problem.with_(head_dim=64), fp8.DEFAULT_QUANTISATION).fold_v_scale
    monkeypatch.setattr(fp8, "FOLD_V_SCALE", False)
    assert not fp8.fp8_config(problem, fp8.DEFAULT_QUANTISATION).fold_v_scale


def _build(problem: Problem, on: bool) -> tuple[int, int, int]:
    return key_step_build(problem, fold_v_scale=on)


def assert_shorter_step(head_dim: int, causal: bool) -> None:
    batch, heads = (2, 16) if head_dim == 128 else (4, 32)
    problem = Problem(batch, heads, 8192, 8192, head_dim, dtype=torch.bfloat16, causal=causal)
    (off, off_registers, off_spilled), (on, on_registers, on_spilled) = _build(problem, False), _build(problem, True)
    assert on <= off - MIN_CUT[head_dim], f"D={head_dim} causal={causal}: key step {off} -> {on} instructions"
    assert on_registers <= off_registers and on_spilled <= off_spilled, (off_registers, on_registers, on_spilled)


@pytest.mark.cute_compile
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [128, 64])
def test_on_shortens_the_key_step(head_dim: int, causal: bool):
    assert_shorter_step(head_dim, causal)


def assert_no_more_spilled_with_every_feature(head_dim: int) -> None:
    problem = feature_problem((1000, 777), head_dim, 2, "causal_bottom_right", True)
    assert _build(problem, True)[2] <= _build(problem, False)[2], head_dim


@pytest.mark.cute_compile
def test_on_spills_no_more_with_every_feature_where_it_applies():
    """D=128 (``FOLD_V_SCALE_HEAD_DIMS``); D=64, left out, spills 88 bytes so (the rule must fail there)."""
    assert_no_more_spilled_with_every_feature(128)
    with pytest.raises(AssertionError):
        assert_no_more_spilled_with_every_feature(64)


def _apart(acc_O: cute.Tensor, acc_PV: cute.Tensor, o_scale: cute.Tensor, v_scale: cute.Tensor, pv_scale):
    """Planted: the old arithmetic under the new name, ``OnlineSoftmax.rescale``'s P V added with its V scale, then O
    multiplied by the row factors when any row of the warp moved (the method reads nothing of its softmax)."""
    _hopper_device.OnlineSoftmax.rescale(None, acc_O, o_scale, acc_PV, pv_scale)


@pytest.mark.cute_compile
def test_planted_fold_apart_fails_the_rule(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(hopper, "fold_block_product", _apart)
    with pytest.raises(AssertionError):
        assert_shorter_step(128, False)


def check_folded(head_dim: int, mask: str, monkeypatch: pytest.MonkeyPatch, folded: bool = True) -> None:
    """cute/fp8 folded (or, ``folded`` False, apart) on a ragged GQA shape with cache lengths and the LSE, offset
    inputs, judged by FP8_RULE against the emulation of its quantisation on poisoned outputs."""
    monkeypatch.setattr(fp8, "FOLD_V_SCALE", folded)
    monkeypatch.setattr(fp8, "FOLD_V_SCALE_HEAD_DIMS", (64, 128))
    problem = feature_problem((1000, 777), head_dim, 2, mask, True)
    q, k, v = make_inputs(problem, seed=23, offset=0.5)
    cache_seqlens = edge_cache_seqlens(problem.batch, problem.seqlen_k, "cuda")
    result = check_on_inputs(fp8.IMPLEMENTATION, q, k, v, problem, cache_seqlens=cache_seqlens)
    assert result.ok, f"folded={folded} {problem.describe()}: {result.summary()}"


@pytest.mark.gpu
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_folded_meets_the_rule(head_dim: int, mask: str, monkeypatch: pytest.MonkeyPatch):
    check_folded(head_dim, mask, monkeypatch)


@pytest.mark.gpu
def test_gpu_apart_still_meets_the_rule(monkeypatch: pytest.MonkeyPatch):
    """The switch turned off (the arithmetic before the fold) at D=128, causal: what the A/B timed against."""
    check_folded(128, "causal", monkeypatch, folded=False)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_folded_meets_the_rule_on_fa3_outliers(causal: bool, monkeypatch: pytest.MonkeyPatch):
    """A long shape (32 key blocks a row, each its own V scale) on FA3's outlier inputs."""
    monkeypatch.setattr(fp8, "FOLD_V_SCALE", True)
    problem = Problem(1, 8, 4096, 4096, 128, dtype=torch.bfloat16, causal=causal)
    q, k, v = fa3_inputs(problem, seed=5, device="cuda")
    result = check_on_inputs(fp8.IMPLEMENTATION, q, k, v, problem)
    assert result.ok, f"folded {problem.describe()}: {result.summary()}"


@cute.jit
def _without_ratio(acc_O: cute.Tensor, acc_PV: cute.Tensor, o_scale: cute.Tensor, v_scale: cute.Tensor, pv_scale):
    """Planted: the fold without s_v(last) / s_v(this), so every block's P V is taken in the last block's frame."""
    rO, rPV = _hopper_device.rows_by_cols(acc_O), _hopper_device.rows_by_cols(acc_PV)
    if cutlass.const_expr(pv_scale is not None):
        v_scale[0] = pv_scale
    for r in cutlass.range_constexpr(cute.size(rO, mode=[0])):
        for c in cutlass.range_constexpr(cute.size(rO, mode=[1])):
            rO[r, c] = rO[r, c] * o_scale[r] + rPV[r, c]


@pytest.mark.gpu
def test_gpu_planted_fold_without_the_ratio_fails(monkeypatch: pytest.MonkeyPatch):
    check_folded(128, "causal", monkeypatch)
    monkeypatch.setattr(hopper.KERNELS, "compiled", {})  # the planted build must not be the cached one
    monkeypatch.setattr(hopper, "fold_block_product", _without_ratio)
    with pytest.raises(AssertionError):
        check_folded(128, "causal", monkeypatch)
