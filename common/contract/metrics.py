"""Error metrics against the float64 reference, and the rules that turn them into ok / wrong.

Two yardsticks. 16-bit and fp32 rungs are judged against SDPA's error in the same dtype on the same
inputs (``SDPA_RELATIVE_RULE``). FP8 rungs are judged against an fp64 emulation of their own
quantisation (``FP8_RULE``, ``common.contract.fp8.emulate``): their error against fp64 may exceed the
emulation's only by a small margin, and every output element must lie within the emulation's
elementwise bound of the emulated output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Absolute slack added to SDPA-relative bounds: covers fp32 runs where SDPA's error is ~1e-7.
DEFAULT_ATOL = 1e-4
SDPA_ERROR_FACTOR = 2.0


@dataclass(frozen=True)
class ErrorStats:
    max_abs_err: float
    rmse: float
    rel_l2_err: float
    nonfinite: int

    def summary(self) -> str:
        return (
            f"max_abs={self.max_abs_err:.3e} rmse={self.rmse:.3e} "
            f"rel_l2={self.rel_l2_err:.3e} nonfinite={self.nonfinite}"
        )


def error_stats(out: torch.Tensor, ref: torch.Tensor) -> ErrorStats:
    """Compare ``out`` with the float64 ``ref`` of the same shape; NaN/Inf are counted, not hidden."""
    if out.shape != ref.shape:
        raise ValueError(f"output shape {tuple(out.shape)} differs from reference {tuple(ref.shape)}")
    out64 = out.detach().to(torch.float64)
    ref64 = ref.detach().to(device=out64.device, dtype=torch.float64)
    finite = torch.isfinite(out64)
    nonfinite = int((~finite).sum().item())
    diff = torch.where(finite, out64 - ref64, torch.zeros_like(out64))
    ref_norm = torch.linalg.vector_norm(ref64).item()
    diff_norm = torch.linalg.vector_norm(diff).item()
    if nonfinite:
        return ErrorStats(math.inf, math.inf, math.inf, nonfinite)
    return ErrorStats(
        max_abs_err=diff.abs().max().item(),
        rmse=diff_norm / math.sqrt(diff.numel()),
        rel_l2_err=diff_norm / ref_norm if ref_norm > 0 else diff_norm,
        nonfinite=0,
    )


@dataclass(frozen=True)
class EmulationStats:
    """How an output compares with the fp64 emulation of its kernel's quantisation."""

    error: ErrorStats  # the emulation's own error against the fp64 reference
    max_abs_diff: float  # max |out - emulated|
    max_bound_ratio: float  # max |out - emulated| / bound, elementwise (<= 1 inside the bound)

    def summary(self) -> str:
        return (
            f"emulation rel_l2={self.error.rel_l2_err:.3e}, max|out-emu|={self.max_abs_diff:.3e} "
            f"({self.max_bound_ratio:.2f}x its bound)"
        )


def emulation_stats(
    out: torch.Tensor, emulated: torch.Tensor, bound: torch.Tensor, ref: torch.Tensor
) -> EmulationStats:
    """Compare ``out`` with the emulated output and its elementwise ``bound`` (all float64-able)."""
    out64 = out.detach().to(torch.float64)
    diff = (out64 - emulated.to(out64.device)).abs()
    diff = torch.where(torch.isfinite(diff), diff, torch.full_like(diff, math.inf))
    # An exact match passes even where the bound is 0 (0 / 0 would be NaN).
    ratio = torch.where(diff == 0, torch.zeros_like(diff), diff / bound.to(out64.device))
    return EmulationStats(error_stats(emulated, ref), diff.max().item(), ratio.max().item())


@dataclass(frozen=True)
class ErrorRule:
    """How an implementation is judged: relative to SDPA's error, an absolute rel-L2 cap, or (FP8)
    relative to the emulation of its own quantisation (``emulation_margin`` set)."""

    name: str
    sdpa_factor: float | None = SDPA_ERROR_FACTOR
    atol: float = DEFAULT_ATOL
    max_rel_l2: float | None = None
    # Emulation rule: rel_l2 <= (1 + margin) x the emulation's + atol, and |out - emulated| <= bound.
    emulation_margin: float | None = None

    @property
    def needs_emulation(self) -> bool:
        return self.emulation_margin is not None

    def rel_l2_limit(self, sdpa_rel_l2: float | None, emulation_rel_l2: float | None = None) -> float:
        """The largest rel-L2 error this rule passes, given its yardstick's own error (SDPA's, or the
        emulation's for an emulation rule); NaN when that yardstick is missing."""
        if self.needs_emulation:
            return math.nan if emulation_rel_l2 is None else (1 + self.emulation_margin) * emulation_rel_l2 + self.atol
        limits = [self.max_rel_l2] if self.max_rel_l2 is not None else []
        if self.sdpa_factor is not None:
            limits.append(math.nan if sdpa_rel_l2 is None else self.sdpa_factor * sdpa_rel_l2 + self.atol)
        return min(limits, default=math.nan)

    def judge(
        self, err: ErrorStats, sdpa_err: ErrorStats | None, emulation: EmulationStats | None = None
    ) -> tuple[bool, str]:
        """(ok, reason). NaN/Inf never pass."""
        if err.nonfinite:
            return False, f"{err.nonfinite} non-finite output elements"
        if self.max_rel_l2 is not None and err.rel_l2_err > self.max_rel_l2:
            return False, f"rel_l2 {err.rel_l2_err:.3e} > {self.max_rel_l2:.1e}"
        if self.needs_emulation:
            return self._judge_against_emulation(err, emulation)
        if self.sdpa_factor is None:
            return True, ""
        if sdpa_err is None:
            return False, "no SDPA error to compare against"
        checks = (
            ("max_abs", err.max_abs_err, sdpa_err.max_abs_err),
            ("rel_l2", err.rel_l2_err, sdpa_err.rel_l2_err),
        )
        for label, mine, theirs in checks:
            bound = self.sdpa_factor * theirs + self.atol
            if mine > bound:
                return False, f"{label} {mine:.3e} > {self.sdpa_factor:g}x SDPA {theirs:.3e} + {self.atol:g}"
        return True, ""

    def _judge_against_emulation(self, err: ErrorStats, emulation: EmulationStats | None) -> tuple[bool, str]:
        if emulation is None:
            return False, "no emulation of the quantisation to compare against"
        if err.rel_l2_err > self.rel_l2_limit(None, emulation.error.rel_l2_err):
            return False, (
                f"rel_l2 {err.rel_l2_err:.3e} > (1 + {self.emulation_margin:g}) x emulation "
                f"{emulation.error.rel_l2_err:.3e} + {self.atol:g}"
            )
        if not emulation.max_bound_ratio <= 1.0:
            return False, (
                f"max|out - emulated| {emulation.max_abs_diff:.3e} exceeds the elementwise bound "
                f"({emulation.max_bound_ratio:.2f}x)"
            )
        return True, ""


SDPA_RELATIVE_RULE = ErrorRule(name=f"<= {SDPA_ERROR_FACTOR:g}x sdpa + {DEFAULT_ATOL:g}")
# The kernel's error against fp64 may exceed its emulation's by this share: P values that land
# within the scores' accumulation error of an e4m3 rounding boundary round the other way.
FP8_EMULATION_MARGIN = 0.05
FP8_EMULATION_ATOL = 1e-4
FP8_RULE = ErrorRule(
    name=f"<= (1+{FP8_EMULATION_MARGIN:g})x fp8 emulation + {FP8_EMULATION_ATOL:g}, |out-emu| <= bound",
    sdpa_factor=None,
    atol=FP8_EMULATION_ATOL,
    emulation_margin=FP8_EMULATION_MARGIN,
)


def ratio_vs_sdpa(err: ErrorStats, sdpa_err: ErrorStats | None) -> float:
    """Relative-L2 error over SDPA's; NaN when SDPA's error is unknown or zero."""
    if sdpa_err is None or sdpa_err.rel_l2_err == 0:
        return math.nan
    return err.rel_l2_err / sdpa_err.rel_l2_err


# ----------------------------------------------------------------------------------------------------
# The LSE rule: judged against the fp64 LSE by a bound from the dtype and Sk
# ----------------------------------------------------------------------------------------------------
# Units of roundoff of the problem's dtype allowed per unit of (|lse| + ln Sk); see LseRule.
LSE_ULPS = 4.0


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the distance from 1 to the next number of ``dtype`` (2^-11 for fp16, 2^-8 for bf16)."""
    return torch.finfo(dtype).eps / 2


def lse_bound(
    dtype: torch.dtype,
    seqlen_k: int,
    ref_lse: torch.Tensor,
    ulps: float = LSE_ULPS,
    score_magnitude: torch.Tensor | None = None,
) -> torch.Tensor:
    """Elementwise bound on |lse - ref_lse|: ``ulps · (u(dtype) · (|ref_lse| + ln Sk) + u(fp32) · M)``,
    M = ``score_magnitude`` (0 when not given).

    Why this shape: lse = m + ln Σ exp(s_j - m) lies within ln Sk above the largest score m, so
    |m| <= |lse| + ln Sk; a kernel's lse is as good as its scores plus the log of its row sum (a
    relative error, so an absolute one in lse). Allowing a few units of roundoff of the problem's dtype
    on that magnitude asks for an LSE as accurate as an output stored in that dtype. But a score is a
    dot product accumulated in fp32, whose error is relative to Σ|q_i k_i|, not to |s| (a score near 0
    may come from large terms that cancel): M = softmax_scale · ‖q_row‖ · max_j ‖k_j‖ bounds that sum
    (Cauchy-Schwarz), and matters only for fp32 problems, where u(dtype) is fp32's too (the fuzzer found
    an fp32 row with one key, lse 0.044, off by 12x the bound without it). Rows with no visible key
    (ref -inf) must be -inf exactly (bound 0 there).
    """
    finite = torch.isfinite(ref_lse)
    magnitude = torch.where(finite, ref_lse.abs(), torch.zeros_like(ref_lse)) + math.log(max(seqlen_k, 1))
    bound = unit_roundoff(dtype) * magnitude
    if score_magnitude is not None:
        bound = bound + unit_roundoff(torch.float32) * score_magnitude.to(bound.dtype)
    return torch.where(finite, ulps * bound, torch.zeros_like(ref_lse))


def score_magnitude(q: torch.Tensor, k: torch.Tensor, softmax_scale: float) -> torch.Tensor:
    """(B, H, Sq): softmax_scale · ‖q_row‖ · max_j ‖k_j‖ over the row's KV head's keys (k (B, Hkv, Sk, D),
    H a multiple of Hkv), the size of the terms of every score of the row (``lse_bound``)."""
    key_norm = k.double().norm(dim=-1).amax(dim=-1)
    key_norm = key_norm.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    return softmax_scale * q.double().norm(dim=-1) * key_norm[..., None]


@dataclass(frozen=True)
class LseStats:
    """How a returned LSE compares with the fp64 one."""

    max_abs_err: float  # over rows where both are finite
    max_bound_ratio: float  # max |lse - ref| / bound over those rows (<= 1 passes)
    wrong_infinities: int  # rows where exactly one is -inf, or lse is NaN or +inf
    shape_ok: bool = True

    def summary(self) -> str:
        return (
            f"lse max_abs={self.max_abs_err:.3e} ({self.max_bound_ratio:.2f}x its bound), "
            f"wrong -inf/NaN rows={self.wrong_infinities}"
        )


def lse_stats(lse: torch.Tensor, ref_lse: torch.Tensor, bound: torch.Tensor) -> LseStats:
    """Compare ``lse`` (B, H, Sq) with the fp64 ``ref_lse`` and its elementwise ``bound``."""
    if lse.shape != ref_lse.shape or lse.dtype != torch.float32:
        return LseStats(math.inf, math.inf, 0, shape_ok=False)
    lse64 = lse.detach().to(torch.float64)
    ref64 = ref_lse.detach().to(device=lse64.device, dtype=torch.float64)
    bound = bound.to(lse64.device)
    ref_empty = ref64 == -math.inf
    lse_empty = lse64 == -math.inf
    both_finite = torch.isfinite(lse64) & torch.isfinite(ref64)
    wrong = (ref_empty != lse_empty) | torch.isnan(lse64) | (lse64 == math.inf)
    diff = torch.where(both_finite, (lse64 - ref64).abs(), torch.zeros_like(lse64))
    ratio = torch.where(diff == 0, torch.zeros_like(diff), diff / bound)
    return LseStats(diff.max().item(), ratio.max().item(), int(wrong.sum().item()))


def judge_lse(stats: LseStats) -> tuple[bool, str]:
    """(ok, reason) of the LSE rule (:func:`lse_bound`)."""
    if not stats.shape_ok:
        return False, "lse must be fp32 of shape (B, H, Sq)"
    if stats.wrong_infinities:
        return False, (
            f"{stats.wrong_infinities} LSE rows are NaN or +inf, or -inf exactly where the reference is not "
            "(a row sees no key) or not"
        )
    if not stats.max_bound_ratio <= 1.0:
        return False, (
            f"lse max_abs {stats.max_abs_err:.3e} exceeds {LSE_ULPS:g} u(dtype) (|lse| + ln Sk) "
            f"({stats.max_bound_ratio:.2f}x)"
        )
    return True, ""
