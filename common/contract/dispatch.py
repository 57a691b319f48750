"""Per-stack dispatch: one name per stack that serves both prefill and decode.

``common.attention(..., impl="triton" | "gluon" | "cute" | "auto")`` chooses a rung per problem, as
FlashAttention's ``flash_attn_with_kvcache`` or FlashInfer serve both phases from one entry:

* **Decode** (:func:`is_decode`: at most :data:`DECODE_MAX_SEQLEN_Q` query tokens against a longer
  cache, Sk > Sq): the stack's ``decode`` rung (flash decoding, split over the keys), then its prefill
  rungs as a fallback where the decode rung refuses (a head dim or feature it lacks).
* **Prefill** (everything else): the stack's prefill rungs, fastest first (:data:`PREFILL_ORDER`).
  FP8 is never chosen implicitly: it changes the numerics (quantised Q, K, V), so only its own name
  (``triton/fp8``, ...) runs it.

Each rung's capability check decides (dtype, head dim, device, features): the first candidate that
accepts the problem runs it. ``"auto"`` tries the stacks in :data:`AUTO_ORDER` (the fastest first),
phase by phase: every stack's decode rung before any prefill rung, so a decode step never runs a
prefill kernel while some stack's decode rung can take it. A stack that cannot be imported (the CuTe
DSL not installed) refuses with its import error. When no candidate accepts, :func:`resolve` raises a
ValueError listing each candidate and its refusal.

The choice is made when ``attention`` plans a signature (``common/contract/api.py``): the plan key
holds the shapes, so a hit reuses the chosen rung at no per-call cost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from common.contract import registry
from common.contract.problem import Problem
from common.contract.registry import Implementation, Unavailable

STACK_NAMES = ("triton", "gluon", "cute")
AUTO = "auto"
DISPATCH_NAMES = (*STACK_NAMES, AUTO)
# The stacks "auto" tries, fastest first: on the H200 (results/h200/canonical, P1 bf16 D=128) the
# Hopper rungs take 1.62 / 1.78 / 2.11 ms non-causal and 0.88 / 0.96 / 1.16 ms causal in CuTe, Gluon and
# Triton, and cute/decode reads K and V at the highest share of HBM bandwidth (issue #39: 88 %).
AUTO_ORDER = ("cute", "gluon", "triton")
# Each stack's prefill rungs, fastest first (the canonical run's order); fp8 is opt-in by name only.
PREFILL_ORDER = {
    "triton": ("hopper", "pipelined", "tiled", "online", "naive"),
    "gluon": ("hopper",),
    "cute": ("hopper", "pipelined", "tiled", "online", "naive"),
}
DECODE_RUNG = "decode"
# The decode rungs take 1 to 16 query tokens (MAX_SEQLEN_Q of triton_impl/decode.py and its twins).
DECODE_MAX_SEQLEN_Q = 16

Lookup = Callable[[str], Implementation | Unavailable | None]


def is_decode(problem: Problem) -> bool:
    """A decode step: a few new query tokens (speculative or chunked decode included) against a longer cache."""
    return problem.seqlen_q <= DECODE_MAX_SEQLEN_Q and problem.seqlen_k > problem.seqlen_q


def routes(name: str, problem: Problem) -> tuple[str, ...]:
    """The implementation names ``name`` tries for ``problem``, in order (see the module docstring)."""
    if name not in DISPATCH_NAMES:
        raise ValueError(f"dispatch name must be one of {DISPATCH_NAMES}, got {name!r}")
    stacks = AUTO_ORDER if name == AUTO else (name,)
    prefill = tuple(f"{stack}/{rung}" for stack in stacks for rung in PREFILL_ORDER[stack])
    if not is_decode(problem):
        return prefill
    return (*(f"{stack}/{DECODE_RUNG}" for stack in stacks), *prefill)


def lookup(name: str) -> Implementation | Unavailable | None:
    """The registry's rung called ``name``, the reason its module did not import, or None (the
    registry's lookup, built once per process: a growing-cache decode step plans, so dispatches, anew
    at every step)."""
    return registry.lookup(name)


@dataclass(frozen=True)
class Choice:
    """What a dispatch name resolves to for one problem: the chosen implementation (None when every
    candidate refused) and ``(candidate, reason)`` for each candidate tried before it."""

    name: str
    implementation: Implementation | None
    refusals: tuple[tuple[str, str], ...]

    @property
    def same_for_every_seqlen_k(self) -> bool:
        """True when every candidate tried (the refused ones and the chosen one) answers alike for every
        Sk > Sq (``Implementation.check_reads_seqlen_k`` False, or a module that did not import): the
        choice then holds for the whole growing cache it was made for (``common/contract/api.py``)."""
        tried = (*(lookup(candidate) for candidate, _ in self.refusals), self.implementation)
        return all(not isinstance(item, Implementation) or not item.check_reads_seqlen_k for item in tried)

    def refusal_lines(self) -> tuple[str, ...]:
        """Each refusal as 'candidate: reason', the name said once: many capability checks already open their
        reason with the rung's name ("cute/tiled needs a CUDA GPU ...")."""
        return tuple(
            reason if reason.split(" ", 1)[0].rstrip(":") == candidate else f"{candidate}: {reason}"
            for candidate, reason in self.refusals
        )

    def describe(self) -> str:
        """'triton -> triton/decode' and the refusals that led there, for listings and errors."""
        chosen = self.implementation.name if self.implementation else "nothing"
        skipped = "; ".join(self.refusal_lines())
        return f"{self.name} -> {chosen}" + (f" (skipped {skipped})" if skipped else "")


def _refusal(item: Implementation | Unavailable | None, problem: Problem, device: torch.device) -> str:
    """Why ``item`` cannot run ``problem`` on ``device`` ('' when it can)."""
    if item is None:
        return "not in the registry"
    if isinstance(item, Unavailable):
        return f"unavailable: {item.reason}"
    try:
        ok, reason = item.check(problem, device)
    except Exception as error:  # noqa: BLE001 - a broken capability check refuses, with its error
        return f"capability check raised {type(error).__name__}: {error}"
    return "" if ok else reason


def choose(name: str, problem: Problem, device: torch.device) -> Choice:
    """The first candidate of :func:`routes` whose capability check accepts ``problem`` on ``device``."""
    refusals = []
    for candidate in routes(name, problem):
        item = lookup(candidate)
        reason = _refusal(item, problem, device)
        if not reason:
            return Choice(name, item, tuple(refusals))
        refusals.append((candidate, reason))
    return Choice(name, None, tuple(refusals))


def resolve_choice(name: str, problem: Problem, device: torch.device) -> Choice:
    """:func:`choose`, with a ValueError listing every candidate's refusal where none accepts."""
    choice = choose(name, problem, device)
    if choice.implementation is None:
        reasons = "\n".join(f"  {line}" for line in choice.refusal_lines())
        raise ValueError(f"no rung of {name!r} can run {problem.describe()} on {device}:\n{reasons}")
    return choice


def resolve(name: str, problem: Problem, device: torch.device) -> Implementation:
    """The implementation ``name`` runs ``problem`` with; a ValueError lists every candidate's refusal."""
    return resolve_choice(name, problem, device).implementation
