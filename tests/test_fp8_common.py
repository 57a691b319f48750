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
