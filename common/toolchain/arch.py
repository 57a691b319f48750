"""The one GPU architecture the Hopper rungs are built for, and the one check that a device is it.

The Hopper rungs (Triton, Gluon and CuTe ``hopper``, ``fp8``, Gluon ``decode``) and FA4's SM90 kernel are
compiled for sm_90a: WGMMA and setmaxnreg are "architecture-specific" features that only compute
capability 9.0 runs (sm_100 has other MMA instructions), and their tiles are sized for sm_90's shared
memory and register file. So the check is "exactly 9.0", not "9.0 or newer".
"""

from __future__ import annotations

import torch

SM90_CAPABILITY = (9, 0)
# Triton's GPUTarget names the architecture by one number; the CuTe DSL by the sm_90a string.
SM90_TARGET = 90
SM90A = "sm_90a"
WARP_SIZE = 32
# Dynamic shared memory one CTA may use on sm_90 (227 KiB, after the opt-in).
SM90_SHARED_MEMORY_BYTES = 232_448


def check_sm90(name: str, device: torch.device, needs: str) -> tuple[bool, str]:
    """(True, "") on a CUDA device of compute capability 9.0, else (False, a reason naming ``name``,
    what it ``needs`` from sm_90 and what the device is)."""
    if device.type != "cuda":
        return False, f"{name} needs a CUDA sm_90 GPU ({needs}), got {device}"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) != SM90_CAPABILITY:
        return False, f"{name} needs sm_90 ({needs}), got sm_{major}{minor}"
    return True, ""
