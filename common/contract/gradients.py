"""Gradients against float64: the reference's, SDPA's (the yardstick), and a verdict per gradient.

A backward rung is judged like a forward one, by the same rule (``common.contract.metrics``), once for
each of dQ, dK and dV: its error against float64 autograd through the fp64 reference
(``common.contract.reference.reference_attention``) may be at most 2 × SDPA's own error on that
gradient in the same dtype, on the same inputs and the same dO, plus the rule's small absolute slack.
A gradient that is wrong in one place only (dQ lost across key blocks, dK of one query head of a
group) fails its own check while the others pass, so the three are judged apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from common.contract.inputs import make_inputs
from common.contract.metrics import SDPA_RELATIVE_RULE, ErrorRule, ErrorStats, error_stats
from common.contract.problem import Problem
from common.contract.reference import reference_attention, sdpa

GRADIENT_NAMES = ("dq", "dk", "dv")
Gradients = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
# dO's generator is seeded this far past the inputs' seed: dO is not q's numbers again.
D_OUT_SEED_OFFSET = 7


def backward_inputs(
    problem: Problem, *, seed: int = 0, device: str | torch.device = "cuda", offset: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v as a forward check makes them (``offset`` added to v) and a seeded standard-normal dO."""
    q, k, v = make_inputs(problem, seed=seed, device=device, offset=offset)
    generator = torch.Generator(device=device).manual_seed(seed + D_OUT_SEED_OFFSET)
    d_out = torch.randn(q.shape, generator=generator, device=device, dtype=torch.float32).to(problem.dtype)
    return q, k, v, d_out


def _gradients(
    attend: Callable[..., torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    d_out: torch.Tensor,
    dtype: torch.dtype,
) -> Gradients:
    """(dq, dk, dv) of ⟨attend(q, k, v), d_out⟩ by torch.autograd, on copies of q, k, v in ``dtype``."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    with torch.enable_grad():
        out = attend(*leaves)
        q_grad, k_grad, v_grad = torch.autograd.grad(out, leaves, d_out.to(dtype))
    return q_grad, k_grad, v_grad


def reference_gradients(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, d_out: torch.Tensor, problem: Problem
) -> Gradients:
    """float64 (dq, dk, dv): torch.autograd through the fp64 reference, dO = ``d_out``."""
    return _gradients(lambda *t: reference_attention(*t, problem), q, k, v, d_out, torch.float64)


def sdpa_gradients(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, d_out: torch.Tensor, problem: Problem
) -> Gradients:
    """(dq, dk, dv) of PyTorch's SDPA in the problem's dtype, with its own backend choice: the yardstick."""
    return _gradients(lambda *t: sdpa(*t, problem), q, k, v, d_out, problem.dtype)


@dataclass(frozen=True)
class GradientCheck:
    """The verdict on one gradient."""

    name: str
    ok: bool
    reason: str
    error: ErrorStats
    sdpa_error: ErrorStats

    def summary(self) -> str:
        verdict = "ok" if self.ok else f"WRONG ({self.reason})"
        return f"{self.name} {verdict}: {self.error.summary()} | sdpa: {self.sdpa_error.summary()}"


def judge_gradients(
    grads: Gradients, reference: Gradients, sdpa_grads: Gradients, rule: ErrorRule = SDPA_RELATIVE_RULE
) -> list[GradientCheck]:
    """One :class:`GradientCheck` per gradient (dq, dk, dv), each by ``rule`` against SDPA's error on it."""
    checks = []
    for name, grad, ref, yardstick in zip(GRADIENT_NAMES, grads, reference, sdpa_grads, strict=True):
        err, sdpa_err = error_stats(grad, ref), error_stats(yardstick, ref)
        ok, reason = rule.judge(err, sdpa_err)
        checks.append(GradientCheck(name, ok, reason, err, sdpa_err))
    return checks
