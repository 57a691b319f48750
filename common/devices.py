"""Where the Triton rungs may run: CUDA always, CPU tensors only under the Triton interpreter."""

from __future__ import annotations

import os

import torch


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
