"""Autograd for ``common.attention``: the forward rung saves O and the LSE, its backward rung differentiates.

``common.attention`` comes here when q, k or v requires grad under grad mode. The plan (``api.py``) is
then made for a problem with ``return_lse=True`` whatever the caller asked, because the backward
recomputes P = exp(S − LSE) from the saved LSE instead of storing P; the forward rung runs as usual,
and :class:`AttentionFunction` keeps q, k, v, O and the LSE for the backward rung the forward names
(``Implementation.backward``, ``common.contract.registry``). Nothing else is kept between the passes.

When the caller asked for the LSE too (``return_lse=True``), both outputs are differentiable: the LSE's
gradient enters the backward as ``d_lse`` (dS = P ∘ (dP − D + dLSE)); otherwise the LSE is saved but
not returned. The gradients come back in the inputs' dtype; dK and dV have the KV heads' shape
(B, Hkv, Sk, D), summed over each KV head's query heads by the backward rung.
"""

from __future__ import annotations

from typing import Any

import torch

from common.contract.problem import Problem
from common.contract.registry import Backward, Runner


class AttentionFunction(torch.autograd.Function):
    """Forward: the prepared forward launch ``run`` (returning O and the LSE); backward: ``backward``'s
    gradients of q, k and v. ``run`` must have been bound to these q, k, v (detached)."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        run: Runner,
        backward: Backward,
        problem: Problem,
        return_lse: bool,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        out, lse = run()
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.backward_rung = backward
        ctx.problem = problem
        ctx.return_lse = return_lse
        return (out, lse) if return_lse else out

    @staticmethod
    def backward(ctx: Any, d_out: torch.Tensor, d_lse: torch.Tensor | None = None) -> tuple[Any, ...]:
        # The rungs read plain tensors: a saved leaf still requires grad, which DLPack (the CuTe DSL's
        # way in) refuses to export.
        q, k, v, out, lse = (t.detach() for t in ctx.saved_tensors)
        dq, dk, dv = ctx.backward_rung.gradients(
            q, k, v, out, lse, d_out, ctx.problem, d_lse=d_lse if ctx.return_lse else None
        )
        # No gradients for run, backward, problem and return_lse.
        return dq, dk, dv, None, None, None, None


def requires_grad(q: object, k: object, v: object) -> bool:
    """True when autograd must see the call: grad mode on and q, k or v a tensor that requires grad."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v))


def detached(*tensors: object) -> tuple[object, ...]:
    """The tensors detached (same storage), so that the forward rung binds plain tensors; others as given."""
    return tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in tensors)
