"""One correctness check of one implementation on fresh inputs: shared by tests, compare and fuzz."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from common.inputs import make_inputs, poison_
from common.metrics import ErrorStats, error_stats
from common.problem import Problem
from common.reference import reference_attention
from common.registry import Implementation, Runner
from common.sdpa import sdpa


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    reason: str
    error: ErrorStats
    sdpa_error: ErrorStats | None

    def summary(self) -> str:
        sdpa_text = self.sdpa_error.summary() if self.sdpa_error else "n/a"
        verdict = "ok" if self.ok else f"WRONG ({self.reason})"
        return f"{verdict}: {self.error.summary()} | sdpa: {sdpa_text}"


def run_poisoned(run: Runner) -> torch.Tensor:
    """Run once, poison the returned buffer with NaN, run again: unwritten elements stay NaN."""
    first = run()
    poison_(first)
    return run()


def sdpa_error(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, ref: torch.Tensor) -> ErrorStats:
    """SDPA's own error in the problem's dtype on the same inputs (the tolerance's yardstick)."""
    return error_stats(sdpa(q, k, v, problem), ref)


def check_implementation(
    impl: Implementation,
    problem: Problem,
    *,
    device: str | torch.device = "cuda",
    seed: int = 0,
    offset: float = 0.5,
) -> CheckResult:
    """Fresh seeded inputs, poisoned output, error vs fp64 reference, judged by the impl's rule."""
    q, k, v = make_inputs(problem, seed=seed, device=device, offset=offset)
    return check_on_inputs(impl, q, k, v, problem)


def check_on_inputs(
    impl: Implementation, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem
) -> CheckResult:
    """Poisoned run of ``impl`` on the given tensors, judged against the fp64 reference and SDPA."""
    ref = reference_attention(q, k, v, problem)
    out = run_poisoned(impl.prepare(q, k, v, problem))
    err = error_stats(out, ref)
    yardstick = sdpa_error(q, k, v, problem, ref)
    ok, reason = impl.error_rule.judge(err, yardstick)
    return CheckResult(ok, reason, err, yardstick)
