"""Hard inputs shared by the CPU and GPU rung tests: large magnitudes, constant rows, strided views."""

from __future__ import annotations

from collections.abc import Callable

import torch

from common.contract.inputs import make_inputs
from common.contract.problem import Problem

Tensors = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
# Scores this large overflow exp() without the running max: the online softmax must subtract it.
LARGE_MAGNITUDE = 30.0


def large_magnitude(problem: Problem, device: str) -> Tensors:
    q, k, v = make_inputs(problem, seed=11, device=device)
    return q * LARGE_MAGNITUDE, k * LARGE_MAGNITUDE, v


def constant_keys(problem: Problem, device: str) -> Tensors:
    """Every key identical: each softmax row is exactly uniform over its visible keys."""
    q, k, v = make_inputs(problem, seed=12, device=device, offset=0.5)
    return q, k[:, :, :1].expand_as(k).contiguous(), v


def bshd_views(problem: Problem, device: str) -> Tensors:
    """(B, S, H, D) storage seen as (B, H, S, D): batch/head strides a kernel must honour."""
    q, k, v = make_inputs(problem, seed=13, device=device, offset=0.5)
    return tuple(t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))


HARD_INPUTS: dict[str, Callable[[Problem, str], Tensors]] = {
    "large_magnitude": large_magnitude,
    "constant_keys": constant_keys,
    "bshd_views": bshd_views,
}
