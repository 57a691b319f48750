"""Error metrics against the float64 reference, and the rules that turn them into ok / wrong."""

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
class ErrorRule:
    """How an implementation is judged. Either relative to SDPA's error, or an absolute rel-L2 cap."""

    name: str
    sdpa_factor: float | None = SDPA_ERROR_FACTOR
    atol: float = DEFAULT_ATOL
    max_rel_l2: float | None = None

    def judge(self, err: ErrorStats, sdpa_err: ErrorStats | None) -> tuple[bool, str]:
        """(ok, reason). NaN/Inf never pass."""
        if err.nonfinite:
            return False, f"{err.nonfinite} non-finite output elements"
        if self.max_rel_l2 is not None and err.rel_l2_err > self.max_rel_l2:
            return False, f"rel_l2 {err.rel_l2_err:.3e} > {self.max_rel_l2:.1e}"
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


SDPA_RELATIVE_RULE = ErrorRule(name=f"<= {SDPA_ERROR_FACTOR:g}x sdpa + {DEFAULT_ATOL:g}")
FP8_RULE = ErrorRule(name="rel_l2 <= 3e-2", sdpa_factor=None, max_rel_l2=3e-2)


def ratio_vs_sdpa(err: ErrorStats, sdpa_err: ErrorStats | None) -> float:
    """Relative-L2 error over SDPA's; NaN when SDPA's error is unknown or zero."""
    if sdpa_err is None or sdpa_err.rel_l2_err == 0:
        return math.nan
    return err.rel_l2_err / sdpa_err.rel_l2_err
