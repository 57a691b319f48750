"""Host helpers shared by the Triton rungs: input validation, the common capability checks, and the
argument list of the kernels that take Q, K, V and O as strided pointers (``online`` to ``pipelined``).

Those kernels share one calling convention: ``Q, K, V, Out``, then (batch, head, row) strides of each,
then ``heads, seqlen_q, seqlen_k, softmax_scale_log2``. Building it here keeps the launch, the
compile-only warm-up and the static sm_90a signature of every rung in agreement.
"""

from __future__ import annotations

import torch

from common.contract.devices import triton_device_supported, triton_device_types, triton_dtype_supported, triton_dtypes
from common.contract.problem import Problem
from common.contract.validation import validate_attention_inputs
from triton_impl._device import LOG2_E

# (batch, head, row) stride arguments of Q, K, V and O, in kernel-argument order.
POINTER_STRIDES = tuple(f"stride_{t}{dim}" for t, last in zip("qkvo", "mnnm", strict=True) for dim in ("b", "h", last))
# Pointer and stride arguments a real launch passes 16-divisible, so the static compile assumes it too.
POINTER_ALIGNED = ("Q", "K", "V", "Out", *POINTER_STRIDES)


def validate_triton_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: Problem,
    head_dims: tuple[int, ...],
    dtypes: tuple[torch.dtype, ...] | None = None,
) -> Problem:
    """``validate_attention_inputs`` with the Triton dtypes (or ``dtypes``) and device types."""
    return validate_attention_inputs(
        q,
        k,
        v,
        causal=problem.causal,
        softmax_scale=problem.softmax_scale,
        dtypes=dtypes or triton_dtypes(),
        head_dims=head_dims,
        device_types=triton_device_types(),
    )


def ladder_supported(problem: Problem, device: torch.device, head_dims: tuple[int, ...]) -> tuple[bool, str]:
    """Device, dtype and head-dim checks of the rungs ``naive`` to ``pipelined``."""
    ok, reason = triton_device_supported(device)
    if not ok:
        return False, reason
    ok, reason = triton_dtype_supported(problem.dtype)
    if not ok:
        return False, reason
    if problem.head_dim not in head_dims:
        return False, f"head_dim {problem.head_dim} not supported (supported: {list(head_dims)})"
    return True, ""


def pointer_arguments(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, problem: Problem
) -> tuple[torch.Tensor | int | float, ...]:
    """The positional arguments of a strided-pointer kernel, built once per prepared launch."""
    strides = tuple(stride for t in (q, k, v, out) for stride in t.stride()[:3])
    return (q, k, v, out, *strides, problem.heads, problem.seqlen_q, problem.seqlen_k, problem.scale * LOG2_E)


def pointer_signature(dtype: torch.dtype) -> dict[str, str]:
    """The sm_90a compile signature matching ``pointer_arguments`` for fp16 or bf16 operands."""
    element = "*fp16" if dtype == torch.float16 else "*bf16"
    return {
        **{name: element for name in ("Q", "K", "V", "Out")},
        **{name: "i32" for name in POINTER_STRIDES},
        "heads": "i32",
        "seqlen_q": "i32",
        "seqlen_k": "i32",
        "softmax_scale_log2": "fp32",
    }
