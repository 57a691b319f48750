"""The checks every rung's capability function starts with: device, architecture, dtype, head dim.

Each returns ``(ok, reason)`` with a reason that names the rung, what it needs and what it got, so a
rung's ``supports`` reads as this shared check followed by its own limits.
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from common.contract.problem import Problem, dtype_name

DEVICE_NAMES = {"cuda": "CUDA", "cpu": "CPU"}


def _architecture(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def check_common(
    name: str,
    problem: Problem,
    device: torch.device,
    *,
    dtypes: Collection[torch.dtype],
    head_dims: Collection[int],
    min_capability: tuple[int, int],
    device_types: Collection[str] = ("cuda",),
) -> tuple[bool, str]:
    """Device type, minimum SM architecture (CUDA only), dtype and head dim, in that order."""
    if device.type not in device_types:
        wanted = " or ".join(DEVICE_NAMES.get(kind, kind) for kind in sorted(device_types))
        return False, f"{name} needs a {wanted} device, got {device}"
    if device.type == "cuda":
        major, minor = _architecture(device)
        if (major, minor) < min_capability:
            wanted = f"sm_{min_capability[0]}{min_capability[1]}"
            return False, f"{name} needs {wanted} or newer, got sm_{major}{minor}"
    if problem.dtype not in dtypes:
        names = ", ".join(sorted(dtype_name(d) for d in dtypes))
        return False, f"{name} supports dtypes [{names}], got {problem.dtype_name}"
    if problem.head_dim not in head_dims:
        return False, f"{name} supports head_dim in {sorted(head_dims)}, got {problem.head_dim}"
    return True, ""
