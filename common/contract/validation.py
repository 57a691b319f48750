"""Input checks shared by every entry point: a clear error naming what was expected and given.

Every rung's host function calls :func:`validate_attention_inputs` before touching a kernel, so a
bad call never reaches device code. Tensors a kernel cannot address directly (inner dimension not
contiguous, misaligned strides) are copied explicitly by :func:`kernel_operand`, never read wrongly.
"""

from __future__ import annotations

import math
from collections.abc import Collection

import torch

from common.contract.problem import Problem, dtype_name

# TMA and 16-byte vector loads need every outer stride and the base address 16-byte aligned.
OPERAND_ALIGNMENT_BYTES = 16


def _names(dtypes: Collection[torch.dtype]) -> str:
    return ", ".join(sorted(dtype_name(d) for d in dtypes))


def _check_tensor(name: str, tensor: object) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() != 4:
        raise ValueError(f"{name} must have rank 4 (batch, heads, seqlen, head_dim), got shape {tuple(tensor.shape)}")
    if tensor.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(tensor.shape)}")
    return tensor


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if q.shape[:2] != k.shape[:2]:
        raise ValueError(f"q and k must agree on (batch, heads), got q {tuple(q.shape[:2])} and k {tuple(k.shape[:2])}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must have the same head_dim, got q {q.shape[3]} and k {k.shape[3]}")


def _check_dtype_and_device(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dtypes: Collection[torch.dtype],
    device_types: Collection[str],
) -> None:
    given = {dtype_name(t.dtype) for t in (q, k, v)}
    if len(given) != 1:
        raise TypeError(f"q, k and v must share one dtype, got {sorted(given)}")
    if q.dtype not in dtypes:
        raise TypeError(f"dtype must be one of [{_names(dtypes)}], got {dtype_name(q.dtype)}")
    devices = {str(t.device) for t in (q, k, v)}
    if len(devices) != 1:
        raise ValueError(f"q, k and v must be on one device, got {sorted(devices)}")
    if q.device.type not in device_types:
        raise ValueError(f"tensors must be on a {' or '.join(sorted(device_types))} device, got {q.device}")


def _check_scale(softmax_scale: object) -> float | None:
    if softmax_scale is None:
        return None
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise TypeError(f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
    if not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale must be finite, got {softmax_scale!r}")
    return float(softmax_scale)


def validate_attention_inputs(
    q: object,
    k: object,
    v: object,
    *,
    causal: object = False,
    softmax_scale: object = None,
    dtypes: Collection[torch.dtype] = (torch.float16, torch.bfloat16),
    head_dims: Collection[int] | None = None,
    device_types: Collection[str] = ("cuda",),
) -> Problem:
    """Check q, k, v of shape (B, H, S, D) and return the Problem they describe.

    Raises TypeError for wrong types/dtypes and ValueError for wrong shapes, devices, head dims,
    empty tensors or a non-finite scale; each message names what was expected and what was given.
    """
    q, k, v = (_check_tensor(name, t) for name, t in (("q", q), ("k", k), ("v", v)))
    _check_shapes(q, k, v)
    _check_dtype_and_device(q, k, v, dtypes, device_types)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    scale = _check_scale(softmax_scale)
    batch, heads, seqlen_q, head_dim = q.shape
    if head_dims is not None and head_dim not in head_dims:
        raise ValueError(f"head_dim must be one of {sorted(head_dims)}, got {head_dim}")
    return Problem(
        batch=batch,
        heads=heads,
        seqlen_q=seqlen_q,
        seqlen_k=k.shape[2],
        head_dim=head_dim,
        dtype=q.dtype,
        causal=causal,
        softmax_scale=scale,
    )


def is_kernel_addressable(tensor: torch.Tensor) -> bool:
    """True when the inner dim is contiguous and base and outer strides are 16-byte aligned."""
    element = tensor.element_size()
    if tensor.stride(-1) != 1 or tensor.data_ptr() % OPERAND_ALIGNMENT_BYTES:
        return False
    return all((stride * element) % OPERAND_ALIGNMENT_BYTES == 0 for stride in tensor.stride()[:-1])


def kernel_operand(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor itself if a kernel can address it by strides, else an explicit contiguous copy."""
    return tensor if is_kernel_addressable(tensor) else tensor.contiguous()
