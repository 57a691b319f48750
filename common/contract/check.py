"""One correctness check of one implementation on fresh inputs: shared by tests, compare and fuzz."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from common.contract.inputs import make_inputs, poison_
from common.contract.metrics import EmulationStats, ErrorStats, emulation_stats, error_stats
from common.contract.problem import Problem
from common.contract.reference import reference_attention
from common.contract.registry import Implementation, Runner
from common.measure.sdpa import sdpa


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    reason: str
    error: ErrorStats
    sdpa_error: ErrorStats | None
    emulation: EmulationStats | None = None

    def summary(self) -> str:
        sdpa_text = self.sdpa_error.summary() if self.sdpa_error else "n/a"
        verdict = "ok" if self.ok else f"WRONG ({self.reason})"
        emulation_text = f" | {self.emulation.summary()}" if self.emulation else ""
        return f"{verdict}: {self.error.summary()} | sdpa: {sdpa_text}{emulation_text}"


def run_poisoned(run: Runner) -> torch.Tensor:
    """Run once, poison the returned buffer with NaN, run again: unwritten elements stay NaN."""
    first = run()
    poison_(first)
    return run()


def sdpa_error(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, ref: torch.Tensor) -> ErrorStats:
    """SDPA's own error in the problem's dtype on the same inputs (the tolerance's yardstick)."""
    return error_stats(sdpa(q, k, v, problem), ref)


def judge_output(
    impl: Implementation,
    out: torch.Tensor,
    err: ErrorStats,
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    problem: Problem,
    ref: torch.Tensor,
    sdpa_err: ErrorStats | None,
) -> tuple[bool, str, EmulationStats | None]:
    """(ok, reason, emulation stats) of ``out`` by ``impl``'s rule. An FP8 rule's yardstick is the
    rung's fp64 emulation of its own quantisation of ``inputs`` (``impl.emulate``), computed here."""
    emulation = None
    if impl.error_rule.needs_emulation and impl.emulate is not None:
        emulated = impl.emulate(*inputs, problem)
        emulation = emulation_stats(out, emulated.out, emulated.bound, ref)
    ok, reason = impl.error_rule.judge(err, sdpa_err, emulation)
    return ok, reason, emulation


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
    ok, reason, emulation = judge_output(impl, out, err, (q, k, v), problem, ref, yardstick)
    return CheckResult(ok, reason, err, yardstick, emulation)
