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


def _kv_cache(kv_heads: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q = torch.randn(2, 4, 3, 64, dtype=torch.float16)
    k = torch.randn(2, kv_heads, 16, 64, dtype=torch.float16)
    return q, k, k.clone()


FEATURE_ERRORS = {
    "heads not divisible": (lambda: _kv_cache(3), {}, r"must divide q's heads.*got q 4 heads and k 3"),
    "lengths shape": (_kv_cache, {"cache_seqlens": torch.tensor([3], dtype=torch.int32)}, r"shape \(batch,\)"),
    "lengths dtype": (_kv_cache, {"cache_seqlens": torch.tensor([3, 4])}, r"cache_seqlens must be int32, got int64"),
    "lengths type": (_kv_cache, {"cache_seqlens": [3, 4]}, r"cache_seqlens must be a torch.Tensor or None, got list"),
    "length above Sk": (
        _kv_cache,
        {"cache_seqlens": torch.tensor([3, 17], dtype=torch.int32)},
        r"\[0, 16\].*\[3, 17\]",
    ),
    "negative length": (_kv_cache, {"cache_seqlens": torch.tensor([-1, 4], dtype=torch.int32)}, r"\[-1, 4\]"),
    "alignment": (_kv_cache, {"causal_alignment": "bottom-right"}, r"one of \('top_left', 'bottom_right'\), got"),
    "return_lse": (_kv_cache, {"return_lse": 1}, r"return_lse must be a bool, got int"),
}


@pytest.mark.parametrize("case", sorted(FEATURE_ERRORS))
def test_bad_feature_input_is_refused_clearly(case: str):
    make, options, message = FEATURE_ERRORS[case]
    with pytest.raises((TypeError, ValueError), match=message):
        attention(*make(), impl="triton/online", causal=True, **options)


def test_lengths_on_another_device_are_refused():
    q, k, v = _kv_cache()
    lengths = torch.tensor([3, 4], dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match=r"on the inputs' device cpu, got meta"):
        attention(q, k, v, impl="triton/online", cache_seqlens=lengths)


@pytest.mark.parametrize("impl_name", ["sdpa/math"])
def test_rungs_without_a_feature_refuse_it_by_name(impl_name: str):
    q, k, v = _kv_cache(2)
    with pytest.raises(ValueError, match=r"(GQA|LSE)"):
        attention(q, k, v, impl=impl_name, return_lse=True)
