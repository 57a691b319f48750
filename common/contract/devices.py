"""Where the Triton rungs may run: CUDA always, CPU tensors only under the Triton interpreter; and how a
buffer that lives as long as the process is allocated on a GPU."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import torch

from common.contract.problem import dtype_name

T = TypeVar("T")


def lasting(factory: Callable[[], T], device: torch.device | str) -> T:
    """``factory()`` for a buffer a cache keeps for the life of the process, built on a side stream.

    While torch.compile's CUDA graphs warm a graph up or record it, every allocation of the current stream
    goes to the graph's memory pool, and a tensor left alive there (a cache entry made during the first,
    eager run of a compiled step) fails the recording ("tensor(s) in the cudagraph pool not tracked as
    outputs"). The side stream's allocations come from the ordinary pool; the current stream waits for
    the side stream's writes before anything reads them."""
    device = torch.device(device)
    if device.type != "cuda":
        return factory()
    current = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        made = factory()
    current.wait_stream(side)
    return made


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
