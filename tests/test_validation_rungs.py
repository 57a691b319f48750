"""Every rung refuses bad input with a TypeError/ValueError naming what was expected and given."""

from __future__ import annotations

import math

import pytest
import torch

from common.contract.api import attention
from common.contract.problem import Problem
from common.contract.registry import discover

AVAILABLE, _ = discover(include_baselines=False)
BY_NAME = {impl.name: impl for impl in AVAILABLE}
GOOD = Problem(1, 2, 16, 16, 64, dtype=torch.float16)


def _good_tensors() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    shape = (GOOD.batch, GOOD.heads, GOOD.seqlen_q, GOOD.head_dim)
    return tuple(torch.randn(shape, dtype=GOOD.dtype) for _ in range(3))


BAD_INPUTS = {
    "rank 3": lambda q, k, v: (q[0], k, v),
    "k/v shape mismatch": lambda q, k, v: (q, k, v[:, :, :8]),
    "batch mismatch": lambda q, k, v: (q, torch.cat([k, k]), torch.cat([v, v])),
    "head dim mismatch": lambda q, k, v: (q[..., :32], k, v),
    "float64": lambda q, k, v: (q.double(), k.double(), v.double()),
    "mixed dtypes": lambda q, k, v: (q, k.float(), v),
    "empty": lambda q, k, v: (q[:, :, :0], k, v),
    "unsupported head dim": lambda q, k, v: (q[..., :24], k[..., :24], v[..., :24]),
    "not a tensor": lambda q, k, v: (q.tolist(), k, v),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
@pytest.mark.parametrize("impl_name", sorted(BY_NAME))
def test_bad_input_is_refused_clearly(impl_name: str, case: str):
    q, k, v = BAD_INPUTS[case](*_good_tensors())
    with pytest.raises((TypeError, ValueError)) as error:
        BY_NAME[impl_name].prepare(q, k, v, GOOD)
    message = str(error.value)
    assert "got" in message, f"{impl_name} / {case}: message does not say what was given: {message!r}"


@pytest.mark.parametrize("scale", [math.nan, math.inf])
@pytest.mark.parametrize("impl_name", sorted(BY_NAME))
def test_non_finite_softmax_scale_is_refused(impl_name: str, scale: float):
    q, k, v = _good_tensors()
    with pytest.raises(ValueError, match=r"softmax_scale must be finite, got"):
        attention(q, k, v, softmax_scale=scale, impl=impl_name)
