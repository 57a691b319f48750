"""PyTorch SDPA backends as baselines, each behind the same interface as the rungs."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from common.contract.problem import Problem
from common.contract.registry import Implementation, Runner, warmed_up

BACKENDS: dict[str, SDPBackend] = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
# The probe that decides availability uses this many rows: enough to exercise the kernel, cheap.
PROBE_SEQLEN = 64


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem) -> torch.Tensor:
    """SDPA with PyTorch's own backend choice: the same-dtype error baseline."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=problem.causal, scale=problem.scale)


def _run_backend(backend: SDPBackend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem):
    with sdpa_kernel(backend):
        return sdpa(q, k, v, problem)


def _supports(backend_name: str, problem: Problem, device: torch.device) -> tuple[bool, str]:
    if device.type == "cpu" and backend_name != "math":
        return False, f"sdpa/{backend_name} needs a CUDA GPU"
    shape_q = (1, 1, min(problem.seqlen_q, PROBE_SEQLEN), problem.head_dim)
    shape_k = (1, 1, min(problem.seqlen_k, PROBE_SEQLEN), problem.head_dim)
    q = torch.randn(shape_q, device=device, dtype=problem.dtype)
    k = torch.randn(shape_k, device=device, dtype=problem.dtype)
    try:
        _run_backend(BACKENDS[backend_name], q, k, k, problem)
    except RuntimeError as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return False, f"sdpa/{backend_name} refuses this problem: {first_line}"
    return True, ""


def _bind(backend_name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem) -> Runner:
    return partial(_run_backend, BACKENDS[backend_name], q, k, v, problem)


def _prepare(backend_name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem) -> Runner:
    # SDPA validates its own inputs at every call; prepare only warms the backend up.
    return warmed_up(_bind(backend_name, q, k, v, problem), q.device)


IMPLEMENTATIONS = [
    Implementation(
        name=f"sdpa/{backend_name}",
        stack="sdpa",
        rung=backend_name,
        prepare=partial(_prepare, backend_name),
        bind=partial(_bind, backend_name),
        supports=partial(_supports, backend_name),
        runs_on_cpu=backend_name == "math",
    )
    for backend_name in BACKENDS
]
