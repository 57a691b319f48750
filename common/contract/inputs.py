"""Seeded random inputs in SDPA's (B, H, S, D) layout (K and V with kv_heads heads), per-sequence key
lengths, and output poisoning."""

from __future__ import annotations

import torch

from common.contract.problem import Problem


def make_inputs(
    problem: Problem,
    *,
    seed: int = 0,
    device: str | torch.device = "cuda",
    offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Standard-normal q, k, v; ``offset`` is added to v so the output mean is not near zero."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    q_shape = (problem.batch, problem.heads, problem.seqlen_q, problem.head_dim)
    kv_shape = (problem.batch, problem.kv_heads, problem.seqlen_k, problem.head_dim)

    def draw(shape: tuple[int, ...]) -> torch.Tensor:
        # Drawn in fp32 on the CPU so a seed gives the same numbers on every device.
        return torch.randn(shape, generator=generator, dtype=torch.float32)

    q, k, v = draw(q_shape), draw(kv_shape), draw(kv_shape) + offset
    return tuple(t.to(device=device, dtype=problem.dtype) for t in (q, k, v))


def poison_(out: torch.Tensor) -> torch.Tensor:
    """Fill with NaN so that any element a kernel forgets to write shows up as non-finite."""
    return out.fill_(float("nan"))


def make_cache_seqlens(problem: Problem, *, seed: int = 0, device: str | torch.device = "cuda") -> torch.Tensor:
    """(B,) int32 key lengths, uniform in [0, Sk], with the first sequence full (Sk) and, from B = 3,
    the last one empty (0): the two edge cases are always present."""
    generator = torch.Generator(device="cpu").manual_seed(seed + 1)
    lengths = torch.randint(0, problem.seqlen_k + 1, (problem.batch,), generator=generator, dtype=torch.int32)
    lengths[0] = problem.seqlen_k
    if problem.batch >= 3:
        lengths[-1] = 0
    return lengths.to(device)


def poison_all_(result: torch.Tensor | tuple[torch.Tensor, ...]) -> None:
    """:func:`poison_` on an output, or on every tensor of an ``(out, lse)`` result."""
    for tensor in result if isinstance(result, tuple) else (result,):
        poison_(tensor)
