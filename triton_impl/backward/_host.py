"""Host glue shared by the Triton backward rungs: running and compiling a rung's list of launches, and
the checks every backward rung makes. The kernels and the launch lists stay in the rung files."""

from __future__ import annotations

from collections.abc import Callable

import torch

from common.contract.capability import BOTTOM_RIGHT, GQA, LSE, check_features
from common.contract.devices import triton_device_supported, triton_dtype_supported
from common.contract.problem import Problem
from common.contract.registry import Launch, meta_operands
from common.toolchain.compile import KernelBinary, compile_triton_sm90_launch

# Each backward rung's launches for a problem: (the launches, the (dq, dk, dv) they write).
LaunchBuilder = Callable[..., tuple[list[Launch], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]


def run_launches(
    build: LaunchBuilder,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    d_out: torch.Tensor,
    problem: Problem,
    d_lse: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch every kernel ``build`` lists, in order; the (dq, dk, dv) they write."""
    launches, gradients = build(q, k, v, out, lse, d_out, problem, d_lse)
    for kernel, grid, args, options in launches:
        kernel[grid](*args, **options)
    return gradients


def compile_launches(build: LaunchBuilder, problem: Problem) -> list[KernelBinary]:
    """The kernels ``build`` lists compiled for sm_90a as they would launch (meta tensors: no GPU)."""
    launches, _ = build(*meta_operands(problem), problem, None)
    return [compile_triton_sm90_launch(kernel, *args, **options) for kernel, _, args, options in launches]


def backward_supported(name: str, problem: Problem, device: torch.device, head_dims: tuple[int, ...]):
    """Device, dtype (bf16 refused under the interpreter), head dim and the features every backward rung
    has (GQA, both causal alignments, a differentiable LSE; no ``cache_seqlens``, no paged cache)."""
    for ok, reason in (triton_device_supported(device), triton_dtype_supported(problem.dtype)):
        if not ok:
            return False, reason
    if problem.head_dim not in head_dims:
        return False, f"head_dim {problem.head_dim} not supported (supported: {list(head_dims)})"
    return check_features(name, problem, (GQA, BOTTOM_RIGHT, LSE))
