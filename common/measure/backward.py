"""The backward pass measured: one row per (problem, implementation), forward + backward and backward alone.

An implementation here is anything that differentiates attention: a ladder rung with a backward
(through ``common.attention``'s autograd), an SDPA backend (``sdpa/cudnn``, ``sdpa/flash``,
``sdpa/efficient``, ``sdpa/math``) or FlashAttention-4 (``fa4/sm90``: ``flash_attn.cute``'s
``flash_attn_func``, whose backward is FA4's own SM90 kernel). :func:`contender` gives each the same
shape: leaves (q, k, v requiring grad, laid out as the implementation reads them) and a forward.

:func:`gradients_of` runs the forward once with inputs that require grad (plans, compiles, warm-up
outside the timing) and takes the gradients of ⟨O, dO⟩; the rows then time ``torch.autograd.grad`` of that
same graph alone (``retain_graph``) and forward + backward together (:func:`backward_rows`). TFLOP/s of the
backward = 2.5 × the forward's FLOPs (4·B·H·Sq·Sk·D, halved when causal) / time, as issue #40 counts them
(five products of the forward's size, of which the recomputation of S is one: 5/2 of the forward's two).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
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
        return attention(
            q, k, v, causal=problem.causal, causal_alignment=problem.causal_alignment,
            softmax_scale=problem.softmax_scale, impl=name,
        )  # fmt: skip

    return Contender(name, _plain_leaf, ladder)


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


def relative_distance(mine: torch.Tensor, theirs: torch.Tensor) -> float:
    """‖mine − theirs‖ / ‖theirs‖ in fp32 (NaN anywhere gives NaN)."""
    mine, theirs = mine.float(), theirs.float()
    return ((mine - theirs).norm() / theirs.norm()).item()


# ----------------------------------------------------------------------------------------------
# The sweep's rows (compare.py --backward): every implementation with a backward, judged against fp64
# ----------------------------------------------------------------------------------------------
COLUMNS = (
    "impl", "backward", "stack", "rung", "status", "batch", "heads", "kv_heads", "seqlen_q", "seqlen_k",
    "head_dim", "dtype", "causal", "bwd_ms", "fwd_bwd_ms", "bwd_tflops", "fwd_bwd_tflops",
    "dq_err", "dk_err", "dv_err", "dq_bound", "dk_bound", "dv_bound", "reason",
)  # fmt: skip


def differentiable(implementation) -> bool:
    """Whether the sweep can differentiate ``implementation``: a rung with a backward, an SDPA backend
    or FA4 (FlashInfer's kernels are forward-only)."""
    return implementation.backward is not None or implementation.stack == "sdpa" or implementation.name == FA4_NAME


def capability(implementation, problem: Problem, device: torch.device) -> tuple[bool, str]:
    """The forward's capability check, then the backward rung's (a ladder rung's)."""
    ok, reason = implementation.supports(problem, device)
    if ok and implementation.backward is not None:
        ok, reason = implementation.backward.check(problem, device)
    return ok, reason


def reference_gradients_by_head(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, d_out: torch.Tensor,
                                problem: Problem) -> Gradients:  # fmt: skip
    """float64 (dq, dk, dv) through the fp64 reference, one (batch, KV head) at a time, so that the
    scores of only one KV head's query heads are ever in memory (P1: 4 GiB instead of 128)."""
    from common.contract.gradients import reference_gradients

    group = problem.kv_group
    grads = [torch.empty(t.shape, dtype=torch.float64, device=t.device) for t in (q, k, v)]
    part = problem.with_(batch=1, heads=group, kv_heads=1)
    for b in range(problem.batch):
        for kv_head in range(problem.kv_heads):
            heads = slice(kv_head * group, (kv_head + 1) * group)
            kv = slice(kv_head, kv_head + 1)
            dq, dk, dv = reference_gradients(
                q[b : b + 1, heads], k[b : b + 1, kv], v[b : b + 1, kv], d_out[b : b + 1, heads], part
            )
            grads[0][b : b + 1, heads], grads[1][b : b + 1, kv], grads[2][b : b + 1, kv] = dq, dk, dv
    return grads[0], grads[1], grads[2]


def shape_columns(problem: Problem) -> dict:
    return {
        "batch": problem.batch, "heads": problem.heads, "kv_heads": problem.kv_heads, "seqlen_q": problem.seqlen_q,
        "seqlen_k": problem.seqlen_k, "head_dim": problem.head_dim, "dtype": str(problem.dtype).removeprefix("torch."),
        "causal": problem.causal,
    }  # fmt: skip


def checked_row(
    implementation, problem: Problem, inputs: tuple[torch.Tensor, ...], judged_against: tuple[Gradients, Gradients]
) -> tuple[dict, dict[str, Callable[[], object]]]:
    """One row before its timing, and its calls to time by column: skipped (with the capability check's
    reason) or failed (with the error), untimed; or the gradients judged per gradient against fp64 by the
    yardstick rule (``wrong`` if one fails, still timed: what a fix may cost) with the backward alone
    (``bwd_ms``) and forward + backward (``fwd_bwd_ms``) to time. ``judged_against`` = (the fp64
    reference's gradients, SDPA's in the problem's dtype)."""
    from common.contract.gradients import judge_gradients

    # A ladder rung names its backward rung (several forwards share one); a baseline is its own.
    backward = implementation.backward.name if implementation.backward is not None else implementation.name
    row = {"impl": implementation.name, "backward": backward, "stack": implementation.stack,
           "rung": implementation.rung, **shape_columns(problem), "status": "ok", "reason": ""}  # fmt: skip
    ok, reason = capability(implementation, problem, inputs[0].device)
    if not ok:
        return row | {"status": "skipped", "reason": reason}, {}
    try:
        grads, backward, forward_backward = gradients_of(contender(implementation.name, problem), inputs)
        checks = judge_gradients(grads, *judged_against, rule=implementation.error_rule)
    except Exception as error:  # noqa: BLE001 - a failed row is recorded and the sweep goes on
        return row | {"status": "failed", "reason": f"{type(error).__name__}: {error}"[:400]}, {}
    for check in checks:
        row[f"{check.name}_err"] = check.error.rel_l2_err
        row[f"{check.name}_bound"] = implementation.error_rule.rel_l2_limit(check.sdpa_error.rel_l2_err)
    wrong = [f"{check.name} {check.reason}" for check in checks if not check.ok]
    if wrong:
        row |= {"status": "wrong", "reason": "; ".join(wrong)}
    return row, {"bwd_ms": backward, "fwd_bwd_ms": forward_backward}


def backward_rows(
    implementations: Sequence,
    problem: Problem,
    inputs: tuple[torch.Tensor, ...],
    judged_against: tuple[Gradients, Gradients],
    timer: Timer,
    rounds: int = 1,
) -> Iterator[dict]:
    """The rows of one problem, in ``implementations``' order, each as it is finished (:func:`checked_row`,
    then timed with its TFLOP/s). With one round each row is checked and timed before the next is checked,
    so that one implementation's graph is in memory at a time; with more, every row is checked first, then
    all are timed in interleaved rounds (``common.measure.rounds``), so that none keeps the last, hottest
    place, and the rows come out together."""
    from common.measure.rounds import time_rows

    groups = [[implementation] for implementation in implementations] if rounds == 1 else [implementations]
    flops = backward_flops(problem)
    for group in groups:
        checked = [checked_row(implementation, problem, inputs, judged_against) for implementation in group]
        time_rows(checked, rounds, timer)
        rows = [row for row, _calls in checked]
        del checked  # the group's graphs go before the next group's are built
        for row in rows:
            if "bwd_ms" in row:
                row |= {"bwd_tflops": flops / row["bwd_ms"] / 1e9,
                        "fwd_bwd_tflops": (flops + forward_flops(problem)) / row["fwd_bwd_ms"] / 1e9}  # fmt: skip
            yield row
