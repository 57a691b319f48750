"""One correctness check of one implementation on fresh inputs: shared by tests, compare and fuzz."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from common.contract.inputs import make_cache_seqlens, make_inputs, poison_all_
from common.contract.metrics import (
    EmulationStats,
    ErrorStats,
    LseStats,
    emulation_stats,
    error_stats,
    judge_lse,
    lse_bound,
    lse_stats,
)
from common.contract.problem import Problem
from common.contract.reference import reference_attention
from common.contract.registry import Implementation, Runner, per_call_inputs
from common.measure.sdpa import sdpa


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    reason: str
    error: ErrorStats
    sdpa_error: ErrorStats | None
    emulation: EmulationStats | None = None
    lse: LseStats | None = None

    def summary(self) -> str:
        sdpa_text = self.sdpa_error.summary() if self.sdpa_error else "n/a"
        verdict = "ok" if self.ok else f"WRONG ({self.reason})"
        emulation_text = f" | {self.emulation.summary()}" if self.emulation else ""
        lse_text = f" | {self.lse.summary()}" if self.lse else ""
        return f"{verdict}: {self.error.summary()} | sdpa: {sdpa_text}{emulation_text}{lse_text}"


def run_poisoned(run: Runner) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Run once, poison the returned buffer(s) (O, and the LSE when returned) with NaN, run again:
    unwritten elements stay NaN."""
    poison_all_(run())
    return run()


def sdpa_error(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: Problem,
    ref: torch.Tensor,
    cache_seqlens: torch.Tensor | None = None,
) -> ErrorStats:
    """SDPA's own error in the problem's dtype on the same inputs (the tolerance's yardstick)."""
    return error_stats(sdpa(q, k, v, problem, cache_seqlens), ref)


def judge_output(
    impl: Implementation,
    out: torch.Tensor,
    err: ErrorStats,
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    problem: Problem,
    ref: torch.Tensor,
    sdpa_err: ErrorStats | None,
    cache_seqlens: torch.Tensor | None = None,
) -> tuple[bool, str, EmulationStats | None]:
    """(ok, reason, emulation stats) of ``out`` by ``impl``'s rule. An FP8 rule's yardstick is the
    rung's fp64 emulation of its own quantisation of ``inputs`` (``impl.emulate``, given the key
    lengths as ``prepare`` is), computed here."""
    emulation = None
    if impl.error_rule.needs_emulation and impl.emulate is not None:
        emulated = impl.emulate(*inputs, problem, **per_call_inputs(problem, cache_seqlens))
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
    """Fresh seeded inputs (and key lengths when the problem carries them), poisoned output, error vs
    fp64 reference, judged by the impl's rule (and the LSE rule when it returns the LSE)."""
    q, k, v = make_inputs(problem, seed=seed, device=device, offset=offset)
    cache_seqlens = make_cache_seqlens(problem, seed=seed, device=device) if problem.has_cache_seqlens else None
    return check_on_inputs(impl, q, k, v, problem, cache_seqlens=cache_seqlens)


def check_on_inputs(
    impl: Implementation,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: Problem,
    *,
    cache_seqlens: torch.Tensor | None = None,
) -> CheckResult:
    """Poisoned run of ``impl`` on the given tensors, judged against the fp64 reference and SDPA; the
    returned LSE, if any, against the fp64 LSE by its own rule (``common.contract.metrics.lse_bound``)."""
    ref, ref_lse = reference_attention(q, k, v, problem, cache_seqlens=cache_seqlens, with_lse=True)
    result = run_poisoned(impl.prepare(q, k, v, problem, **per_call_inputs(problem, cache_seqlens)))
    out, lse = result if problem.return_lse else (result, None)
    err = error_stats(out, ref)
    yardstick = sdpa_error(q, k, v, problem, ref, cache_seqlens)
    ok, reason, emulation = judge_output(impl, out, err, (q, k, v), problem, ref, yardstick, cache_seqlens)
    stats = None
    if lse is not None:
        stats = lse_stats(lse, ref_lse, lse_bound(problem.dtype, problem.seqlen_k, ref_lse))
        lse_ok, lse_reason = judge_lse(stats)
        if ok and not lse_ok:
            ok, reason = False, lse_reason
    return CheckResult(ok, reason, err, yardstick, emulation, stats)
