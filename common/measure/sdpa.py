"""PyTorch SDPA backends as baselines, each behind the same interface as the rungs.

GQA goes to SDPA as ``enable_gqa=True`` (K and V keep their kv_heads heads). The bottom-right causal
alignment is ``torch.nn.attention.bias.causal_lower_right``; per-sequence key lengths
(``cache_seqlens``) become an explicit boolean mask (B, 1, Sq, Sk), which carries the causal mask
too. A row that sees no key is set to 0 (the suite's convention; SDPA's backends differ there).
Whether a backend takes a problem is decided by running it on a small probe of the same kind.
``F.scaled_dot_product_attention`` returns no LSE, so ``return_lse`` is refused, and it reads K and V as
dense (B, Hkv, Sk, D) tensors, so a paged KV cache (a block table) is refused too: gathering the pages
first would time a copy of the cache, not attention. The masks and the zero rows are
``common.contract.reference.sdpa``'s, the same function that, as the error yardstick, runs on the gathered
cache (``common.contract.check.sdpa_error``).
"""

from __future__ import annotations

from functools import partial

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from common.contract.problem import Problem
from common.contract.reference import sdpa
from common.contract.registry import Implementation, Runner, warmed_up

BACKENDS: dict[str, SDPBackend] = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
# The probe that decides availability uses this many rows: enough to exercise the kernel, cheap.
PROBE_SEQLEN = 64


def _run_backend(
    backend: SDPBackend,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: Problem,
    cache_seqlens: torch.Tensor | None = None,
):
    with sdpa_kernel(backend):
        return sdpa(q, k, v, problem, cache_seqlens)


def _supports(backend_name: str, problem: Problem, device: torch.device) -> tuple[bool, str]:
    if device.type == "cpu" and backend_name != "math":
        return False, f"sdpa/{backend_name} needs a CUDA GPU"
    if problem.return_lse:
        return False, f"sdpa/{backend_name}: torch.nn.functional.scaled_dot_product_attention returns no LSE"
    if problem.paged:
        return False, (
            f"sdpa/{backend_name}: torch.nn.functional.scaled_dot_product_attention reads a dense (B, Hkv, Sk, D) "
            f"cache, not a paged one (block_table, pages of {problem.page_size} keys)"
        )
    # A probe of the same kind: one KV head with its group of query heads, lengths cut to PROBE_SEQLEN.
    probe = problem.with_(
        batch=1,
        heads=problem.kv_group,
        kv_heads=1,
        seqlen_q=min(problem.seqlen_q, PROBE_SEQLEN),
        seqlen_k=min(problem.seqlen_k, PROBE_SEQLEN),
    )
    q = torch.randn((1, probe.heads, probe.seqlen_q, probe.head_dim), device=device, dtype=problem.dtype)
    k = torch.randn((1, 1, probe.seqlen_k, probe.head_dim), device=device, dtype=problem.dtype)
    lengths = torch.full((1,), probe.seqlen_k, dtype=torch.int32, device=device) if probe.has_cache_seqlens else None
    try:
        _run_backend(BACKENDS[backend_name], q, k, k, probe, lengths)
    except RuntimeError as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return False, f"sdpa/{backend_name} refuses this problem: {first_line}"
    return True, ""


def _bind(
    backend_name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem,
    cache_seqlens: torch.Tensor | None = None,
) -> Runner:  # fmt: skip
    return partial(_run_backend, BACKENDS[backend_name], q, k, v, problem, cache_seqlens)


def _prepare(
    backend_name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem,
    cache_seqlens: torch.Tensor | None = None,
) -> Runner:  # fmt: skip
    # SDPA validates its own inputs at every call; prepare only warms the backend up.
    return warmed_up(_bind(backend_name, q, k, v, problem, cache_seqlens), q.device)


IMPLEMENTATIONS = [
    Implementation.named(
        f"sdpa/{backend_name}",
        prepare=partial(_prepare, backend_name),
        bind=partial(_bind, backend_name),
        supports=partial(_supports, backend_name),
        runs_on_cpu=backend_name == "math",
    )
    for backend_name in BACKENDS
]
