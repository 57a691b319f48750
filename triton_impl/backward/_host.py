"""Host glue shared by the Triton backward rungs: a rung's ``gradients`` and sm_90a compile path from its
list of launches, the strides its kernels take, and the checks every backward rung makes. The kernels
and the launch lists stay in the rung files."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from common.contract.capability import BOTTOM_RIGHT, GQA, LSE, check_features
from common.contract.devices import triton_device_supported, triton_dtype_supported
from common.contract.problem import Problem
from common.contract.registry import Launch, meta_operands
from common.toolchain.compile import KernelBinary, compile_triton_sm90_launch

# Each backward rung's launches for a problem: (the launches, the (dq, dk, dv) they write).
LaunchBuilder = Callable[..., tuple[list[Launch], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]


def head_strides(t: torch.Tensor) -> tuple[int, int, int]:
    """(batch, head, row) strides of a (B, H, S, D) tensor whose last dim is contiguous."""
    return t.stride(0), t.stride(1), t.stride(2)


def run_launches(
    build: LaunchBuilder, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    d_out: torch.Tensor, problem: Problem, d_lse: torch.Tensor | None, **options: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """The body of every backward rung's ``gradients``: launch each kernel ``build`` lists, in order, and
    return the (dq, dk, dv) they write. ``options`` go to ``build`` (tiled: ``config``, gluon: ``tiles``)."""
    launches, written = build(q, k, v, out, lse, d_out, problem, d_lse, **options)
    for kernel, grid, args, launch_options in launches:
        kernel[grid](*args, **launch_options)
    return written


def compile_launches(build: LaunchBuilder, problem: Problem, **options: Any) -> list[KernelBinary]:
    """The kernels ``build`` lists compiled for sm_90a as they would launch (meta tensors: no GPU)."""
    launches, _ = build(*meta_operands(problem), problem, None, **options)
    return [compile_triton_sm90_launch(kernel, *args, **launch_options) for kernel, _, args, launch_options in launches]


def backward_supported(name: str, problem: Problem, device: torch.device, head_dims: tuple[int, ...]):
    """Device, dtype (bf16 refused under the interpreter), head dim and the features every backward rung
    has (GQA, both causal alignments, a differentiable LSE; no ``cache_seqlens``, no paged cache)."""
    for ok, reason in (triton_device_supported(device), triton_dtype_supported(problem.dtype)):
        if not ok:
            return False, reason
    if problem.head_dim not in head_dims:
        return False, f"head_dim {problem.head_dim} not supported (supported: {list(head_dims)})"
    return check_features(name, problem, (GQA, BOTTOM_RIGHT, LSE))
