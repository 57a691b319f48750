"""One correctness check of one implementation on fresh inputs: shared by tests, compare and fuzz."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from common.contract.fp8 import Emulation
from common.contract.inputs import make_cache_seqlens, make_inputs, make_paged_kv, poison_all_
from common.contract.metrics import (
    EmulationStats,
    ErrorStats,
    LseStats,
    emulation_stats,
    error_stats,
    judge_lse,
    lse_bound,
    lse_stats,
    score_magnitude,
)
from common.contract.problem import Problem
from common.contract.reference import contiguous_kv, reference_attention, sdpa
from common.contract.registry import Implementation, Runner, per_call_inputs


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


def check_heads(q: torch.Tensor, k: torch.Tensor, problem: Problem) -> None:
    """The tensors' query and KV heads are the problem's: the reference and the emulation map query head h to
    KV head ``problem.kv_head(h)``, while a rung takes its heads from the tensors, so inputs drawn for other
    heads (K with H heads for a GQA problem) would judge two different problems against each other."""
    kv_heads = k.shape[2] if problem.page_size else k.shape[1]
    if (q.shape[1], kv_heads) != (problem.heads, problem.kv_heads):
        raise ValueError(
            f"{problem.describe()} needs q with {problem.heads} heads and k with {problem.kv_heads} KV heads, "
            f"got {q.shape[1]} and {kv_heads}"
        )


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
    block_table: torch.Tensor | None = None,
) -> ErrorStats:
    """SDPA's own error in the problem's dtype on the same inputs (the tolerance's yardstick); a paged
    cache's pages are gathered into the contiguous cache first (SDPA reads no block table)."""
    k, v = contiguous_kv(k, v, problem, cache_seqlens, block_table)
    return error_stats(sdpa(q, k, v, problem, cache_seqlens), ref)


def emulate_for(
    impl: Implementation,
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    problem: Problem,
    cache_seqlens: torch.Tensor | None = None,
) -> Emulation | None:
    """The rung's fp64 emulation of its quantisation (FP8 rules), given the per-sequence key lengths
    when the problem carries them; None for rules without one."""
    if not impl.error_rule.needs_emulation or impl.emulate is None:
        return None
    return impl.emulate(*inputs, problem, **per_call_inputs(problem, cache_seqlens))


def judge_output(
    impl: Implementation,
    out: torch.Tensor,
    err: ErrorStats,
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    problem: Problem,
    ref: torch.Tensor,
    sdpa_err: ErrorStats | None,
    *,
    emulated: Emulation | None = None,
) -> tuple[bool, str, EmulationStats | None]:
    """(ok, reason, emulation stats) of ``out`` by ``impl``'s rule. An FP8 rule's yardstick is the
    rung's fp64 emulation of its own quantisation of ``inputs`` (``impl.emulate``), computed here
    unless given (``emulated``: :func:`emulate_for` with the problem's cache lengths)."""
    emulation = None
    if impl.error_rule.needs_emulation and impl.emulate is not None:
        emulated = emulated or impl.emulate(*inputs, problem)
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
    """Fresh seeded inputs (:func:`seeded_inputs`), poisoned output, error vs fp64 reference, judged by the impl's
    rule (and the LSE rule when it returns the LSE)."""
    q, k, v, cache_seqlens, block_table = seeded_inputs(problem, seed=seed, device=device, offset=offset)
    return check_on_inputs(impl, q, k, v, problem, cache_seqlens=cache_seqlens, block_table=block_table)


def seeded_inputs(
    problem: Problem, *, seed: int = 0, device: str | torch.device = "cuda", offset: float = 0.5
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``(q, k, v, cache_seqlens, block_table)`` of ``seed``: key lengths when the problem carries them (the first
    sequence full, from B = 3 the last one empty), page pools and a shuffled block table when it is paged (k and v
    are then the pools), None where it has neither."""
    q, k, v = make_inputs(problem, seed=seed, device=device, offset=offset)
    cache_seqlens = make_cache_seqlens(problem, seed=seed, device=device) if problem.has_cache_seqlens else None
    block_table = None
    if problem.paged:
        k, v, block_table = make_paged_kv(problem, k, v, seed=seed)
    return q, k, v, cache_seqlens, block_table


def check_on_inputs(
    impl: Implementation, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, *,
    cache_seqlens: torch.Tensor | None = None, block_table: torch.Tensor | None = None,
) -> CheckResult:  # fmt: skip
    """Poisoned run of ``impl`` on the given tensors, judged against the fp64 reference and SDPA; the
    returned LSE, if any, against the fp64 LSE by its own rule (``common.contract.metrics.lse_bound``),
    or for an FP8 rule against its emulation's LSE, within that bound plus the emulation's. k and v are
    page pools read through ``block_table`` when the problem is paged."""
    check_heads(q, k, problem)
    ref, ref_lse = reference_attention(
        q, k, v, problem, cache_seqlens=cache_seqlens, block_table=block_table, with_lse=True
    )
    result = run_poisoned(impl.prepare(q, k, v, problem, **per_call_inputs(problem, cache_seqlens, block_table)))
    out, lse = result if problem.return_lse else (result, None)
    err = error_stats(out, ref)
    yardstick = sdpa_error(q, k, v, problem, ref, cache_seqlens, block_table)
    emulated = emulate_for(impl, (q, k, v), problem, cache_seqlens)
    ok, reason, emulation = judge_output(impl, out, err, (q, k, v), problem, ref, yardstick, emulated=emulated)
    stats = None
    if lse is not None:
        if emulated is not None and emulated.lse is not None:
            # FP8: the LSE of the quantised scores, within the emulation's bound and the dtype's.
            bound = lse_bound(problem.dtype, problem.seqlen_k, emulated.lse) + emulated.lse_bound
            stats = lse_stats(lse, emulated.lse, bound)
        else:
            keys, _ = contiguous_kv(k, v, problem, cache_seqlens, block_table)
            magnitude = score_magnitude(q, keys, problem.scale).to(ref_lse.device)
            stats = lse_stats(
                lse, ref_lse, lse_bound(problem.dtype, problem.seqlen_k, ref_lse, score_magnitude=magnitude)
            )
        lse_ok, lse_reason = judge_lse(stats)
        if ok and not lse_ok:
            ok, reason = False, lse_reason
    return CheckResult(ok, reason, err, yardstick, emulation, stats)
