"""Where the Triton rungs may run: CUDA always, CPU tensors only under the Triton interpreter; and how a
buffer that lives as long as the process is allocated on a GPU (:func:`lasting`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

from common.contract.problem import dtype_name

T = TypeVar("T")


def lasting(factory: Callable[[], T], device: torch.device | str) -> T:
    """``factory()`` for a buffer a cache keeps for the life of the process, built where no CUDA graph
    memory pool can take it: on a thread of its own, on that thread's own stream.

    torch.compile's CUDA graph trees give a graph's memory pool every allocation of the thread that warms
    the graph up (``_cuda_beginAllocateCurrentThreadToPool``: any stream of that thread), and, while it
    records, every allocation of a stream that joins the capture (a side stream made to wait on the
    capturing one joins it). A cache entry made there (a cache first filled inside a compiled step) stays
    alive in the pool and fails the check after warm-up or recording ("tensor(s) in the cudagraph pool not
    tracked as outputs"). Another thread's allocations come from the ordinary pool in both phases, and a
    capture in torch's "thread_local" mode (CUDA graph trees') lets that thread allocate and synchronise.
    The factory's writes are finished when this returns (its stream is synchronised), so no stream of the
    caller waits on it (a capturing stream could not); nor does its stream wait on the caller's, so the
    factory reads only host data and other lasting buffers."""
    device = torch.device(device)
    if device.type != "cuda":
        return factory()
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="lasting") as worker:
        return worker.submit(_build_on_own_stream, factory, device).result()


def _build_on_own_stream(factory: Callable[[], T], device: torch.device) -> T:
    """``factory()`` on a new stream of ``device``, waited for."""
    with torch.cuda.device(device):
        stream = torch.cuda.Stream(device)
        with torch.cuda.stream(stream):
            made = factory()
        stream.synchronize()
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
