"""The backward pass measured: one row per (problem, implementation), forward + backward and backward alone.

An implementation here is anything that differentiates attention: a ladder rung with a backward
(through ``common.attention``'s autograd), an SDPA backend (``sdpa/cudnn``, ``sdpa/flash``,
``sdpa/efficient``, ``sdpa/math``) or FlashAttention-4 (``fa4/sm90``: ``flash_attn.cute``'s
``flash_attn_func``, whose backward is FA4's own SM90 kernel). :func:`contender` gives each the same
shape: leaves (q, k, v requiring grad, laid out as the implementation reads them) and a forward.

:func:`measure_backward` runs the forward once with inputs that require grad (plans, compiles, warm-up
outside the timing), takes the gradients of ⟨O, dO⟩, then times ``torch.autograd.grad`` of that same
graph alone (``retain_graph``) and forward + backward together. TFLOP/s of the backward = 2.5 × the
forward's FLOPs (4·B·H·Sq·Sk·D, halved when causal) / time, as issue #40 counts them (five products of
the forward's size, of which the recomputation of S is one: 5/2 of the forward's two).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from common.contract.gradients import Gradients
from common.contract.problem import Problem

# Backward FLOPs per forward FLOP (issue #40's count).
BACKWARD_FLOP_RATIO = 2.5
SDPA_BACKENDS = ("cudnn", "flash", "efficient", "math")
FA4_NAME = "fa4/sm90"
Timer = Callable[[Callable[[], object]], float]


def forward_flops(problem: Problem) -> float:
    """The forward's FLOPs as the forward tables count them: 4·D per unmasked score (``Problem.flops``;
    causal at Sq = Sk is half of 4·B·H·S²·D, plus the diagonal)."""
    return float(problem.flops)


def backward_flops(problem: Problem) -> float:
    return BACKWARD_FLOP_RATIO * forward_flops(problem)


@dataclass(frozen=True)
class Contender:
    """How one implementation is differentiated: ``leaf`` turns an input (B, H, S, D) into a leaf that
    requires grad, in the memory layout the implementation reads; ``forward(q, k, v) -> O``."""

    name: str
    leaf: Callable[[torch.Tensor], torch.Tensor]
    forward: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _plain_leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_()


def _bshd_leaf(t: torch.Tensor) -> torch.Tensor:
    """A (B, H, S, D) leaf whose memory is (B, S, H, D), FA4's layout, so its transpose is contiguous."""
    return t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()


def _fa4_forward(problem: Problem) -> Callable[..., torch.Tensor]:
    from flash_attn.cute.interface import flash_attn_func

    if problem.causal and not problem.bottom_right and problem.seqlen_q != problem.seqlen_k:
        raise ValueError(f"{FA4_NAME} aligns the causal mask bottom-right; {problem.describe()} is top-left with Sq≠Sk")

    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = flash_attn_func(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=problem.scale, causal=problem.causal
        )
        out = out[0] if isinstance(out, tuple) else out
        return out.transpose(1, 2)

    return forward


def contender(name: str, problem: Problem) -> Contender:
    """The :class:`Contender` for ``name``: a ladder implementation, ``sdpa/<backend>`` or ``fa4/sm90``.
    FA4 failing to import raises here (the row records why)."""
    if name.startswith("sdpa/"):
        from torch.nn.attention import sdpa_kernel

        from common.contract.reference import sdpa
        from common.measure.sdpa import BACKENDS

        backend = BACKENDS[name.removeprefix("sdpa/")]

        def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            with sdpa_kernel(backend):
                return sdpa(q, k, v, problem)

        return Contender(name, _plain_leaf, forward)
    if name == FA4_NAME:
        return Contender(name, _bshd_leaf, _fa4_forward(problem))
    from common.contract.api import attention

    def ladder(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attention(q, k, v, causal=problem.causal, causal_alignment=problem.causal_alignment, impl=name)

    return Contender(name, _plain_leaf, ladder)


@dataclass(frozen=True)
class BackwardTiming:
    bwd_ms: float
    fwd_bwd_ms: float
    bwd_tflops: float
    fwd_bwd_tflops: float


def gradients_of(entry: Contender, inputs: tuple[torch.Tensor, ...]) -> tuple[Gradients, Callable, Callable]:
    """(dq, dk, dv) of ⟨O, dO⟩ by ``entry``, and two callables: the backward of that graph alone
    (replayable) and forward + backward."""
    q, k, v, d_out = inputs
    leaves = [entry.leaf(t) for t in (q, k, v)]
    with torch.enable_grad():
        out = entry.forward(*leaves)
        grads = torch.autograd.grad(out, leaves, d_out, retain_graph=True)

    def backward() -> object:
        return torch.autograd.grad(out, leaves, d_out, retain_graph=True)

    def forward_backward() -> object:
        with torch.enable_grad():
            return torch.autograd.grad(entry.forward(*leaves), leaves, d_out)

    return grads, backward, forward_backward


def time_backward(problem: Problem, backward: Callable, forward_backward: Callable, timer: Timer) -> BackwardTiming:
    """Both timings (``timer`` returns milliseconds) and their TFLOP/s."""
    bwd_ms, both_ms = timer(backward), timer(forward_backward)
    flops = backward_flops(problem)
    return BackwardTiming(bwd_ms, both_ms, flops / bwd_ms / 1e9, (flops + forward_flops(problem)) / both_ms / 1e9)


def relative_distance(mine: torch.Tensor, theirs: torch.Tensor) -> float:
    """‖mine − theirs‖ / ‖theirs‖ in fp32 (NaN anywhere gives NaN)."""
    mine, theirs = mine.float(), theirs.float()
    return ((mine - theirs).norm() / theirs.norm()).item()
