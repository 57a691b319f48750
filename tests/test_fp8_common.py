"""The FP8 helpers both stacks share: V's permuted operand layout and the e4m3 input-rounding floor."""

from __future__ import annotations

import pytest
import torch

from common import fp8
from common.inputs import make_inputs
from common.metrics import FP8_RULE
from common.problem import Problem


def test_key_order_is_a_permutation_of_each_group():
    assert sorted(fp8.PERMUTED_KEY_ORDER) == list(range(fp8.KEY_GROUP))


def test_value_operand_is_transposed_padded_and_permuted():
    seqlen_k, head_dim = 37, 64
    v8 = torch.randn(2, 3, seqlen_k, head_dim).to(torch.float8_e4m3fn)
    vt = fp8.value_operand(v8).view(torch.uint8)
    padded = 48
    assert vt.shape == (2, 3, head_dim, padded) and vt.stride(-1) == 1
    source = v8.view(torch.uint8)
    for slot in range(padded):
        key = (slot // fp8.KEY_GROUP) * fp8.KEY_GROUP + fp8.PERMUTED_KEY_ORDER[slot % fp8.KEY_GROUP]
        expected = source[:, :, key] if key < seqlen_k else torch.zeros_like(source[:, :, 0])
        assert torch.equal(vt[:, :, :, slot], expected), f"slot {slot} should hold key {key}"


@pytest.mark.parametrize("per_head", [False, True], ids=["per-tensor", "per-head"])
def test_round_to_e4m3_keeps_about_three_mantissa_bits(per_head: bool):
    x = torch.randn(2, 3, 500, 64, dtype=torch.float64)
    x[1] *= 100.0
    rounded = fp8.round_to_e4m3(x, per_head)
    err = ((rounded - x).norm() / x.norm()).item()
    assert 1e-2 < err < 3e-2, f"e4m3 round trip rel error {err:.3e}"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_input_rounding_alone_misses_the_fp8_target_on_standard_normal_inputs(causal: bool):
    """Exact attention on e4m3-rounded Q, K, V already exceeds 3e-2: the issue's target is out of reach."""
    problem = Problem(1, 2, 1024, 1024, 128, dtype=torch.float32, causal=causal)
    q, k, v = make_inputs(problem, seed=3, device="cpu")
    floor = fp8.input_rounding_error(q, k, v, problem)
    assert 4e-2 < floor < 6e-2 and floor > FP8_RULE.max_rel_l2, f"input-rounding floor {floor:.3e}"


def test_input_rounding_floor_is_small_when_values_have_a_mean():
    """With the harness's V offset the same rounding stays well inside the target, so it can be judged."""
    problem = Problem(1, 2, 1024, 1024, 128, dtype=torch.float32)
    q, k, v = make_inputs(problem, seed=3, device="cpu", offset=0.5)
    assert fp8.input_rounding_error(q, k, v, problem) < FP8_RULE.max_rel_l2 / 2


@pytest.mark.parametrize("head_dim", [64, 128])
def test_random_hadamard_is_orthogonal(head_dim: int):
    rotation = fp8.random_hadamard(head_dim, seed=3).double()
    assert torch.allclose(rotation @ rotation.T, torch.eye(head_dim, dtype=torch.float64), atol=1e-6)
    assert not torch.equal(rotation, fp8.random_hadamard(head_dim, seed=4))


def test_random_hadamard_refuses_other_sizes():
    with pytest.raises(ValueError, match="power-of-two head_dim, got 96"):
        fp8.random_hadamard(96, seed=0)


def test_with_outliers_scales_a_small_share_of_entries():
    x = torch.randn(4, 8, 256, 128)
    hit = fp8.with_outliers(x, seed=1) != x
    assert 0.5 * fp8.OUTLIER_FRACTION < hit.float().mean().item() < 2 * fp8.OUTLIER_FRACTION


def test_rotation_lowers_the_rounding_floor_on_outlier_inputs():
    problem = Problem(1, 2, 1024, 1024, 128, dtype=torch.float32)
    q, k, v = make_inputs(problem, seed=5, device="cpu", offset=0.5)
    q, k = fp8.with_outliers(q, seed=6), fp8.with_outliers(k, seed=7)
    rotation = fp8.random_hadamard(problem.head_dim, seed=0)
    plain = fp8.input_rounding_error(q, k, v, problem)
    rotated = fp8.input_rounding_error(q, k, v, problem, rotation=rotation)
    print(f"e4m3 input-rounding floor with outliers: plain {plain:.3e}, rotated {rotated:.3e}")
    assert rotated < 0.8 * plain
