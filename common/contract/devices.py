"""Where the Triton rungs may run: CUDA always, CPU tensors only under the Triton interpreter."""

from __future__ import annotations

import os

import torch

from common.contract.problem import dtype_name


def triton_interpreting() -> bool:
    """True when ``TRITON_INTERPRET=1``: kernels then run in NumPy on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_device_types() -> tuple[str, ...]:
    """Device types a Triton rung accepts in this process."""
    return ("cuda", "cpu") if triton_interpreting() else ("cuda",)


def triton_device_supported(device: torch.device) -> tuple[bool, str]:
    """Capability check shared by the Triton rungs: a GPU, or CPU tensors under the interpreter."""
    if device.type in triton_device_types():
        return True, ""
    return False, f"Triton needs a CUDA device, or TRITON_INTERPRET=1 for CPU tensors; got {device}"


def triton_dtypes() -> tuple[torch.dtype, ...]:
    """Dtypes a Triton rung accepts here: fp16 and bf16, plus fp32 under the interpreter (a CPU-test dtype)."""
    if triton_interpreting():
        return (torch.float16, torch.bfloat16, torch.float32)
    return (torch.float16, torch.bfloat16)


def triton_dtype_supported(dtype: torch.dtype) -> tuple[bool, str]:
    """The ladder rungs' dtype check. bf16 is refused under the interpreter, which computes it wrongly."""
    if dtype not in triton_dtypes():
        return False, f"dtype {dtype_name(dtype)} not supported (fp16, bf16; fp32 only under the interpreter)"
    if triton_interpreting() and dtype == torch.bfloat16:
        return (
            False,
            "bf16 is not exact under the Triton interpreter (about 2x SDPA's error); bf16 is tested on the GPU",
        )
    return True, ""
