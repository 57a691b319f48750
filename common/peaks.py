"""Measured ceilings, once per run: bf16 and fp8 GEMM (burst and sustained), device-to-device copy.

A GPU runs faster for a moment than it can hold: after the clock has spun up, a short burst of GEMMs
runs at the boost clock, while a second of back-to-back GEMMs settles at the clock the power limit
allows. An attention kernel measured for a fraction of a second sees the burst clock, so "% peak"
divides by the burst figure; the sustained figure is reported next to it for what a long job gets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from common.timing import time_cuda

GEMM_SIZE = 8192
COPY_BYTES = 4 * 2**30
# An idle GPU sits at a low clock; this much GEMM work brings it to its working clock.
SPIN_UP_MS = 200
# The burst: a few GEMMs right after spin-up, before the power limit pulls the clock down.
BURST_MS = 50
# Sustained: a long warm-up, then a full second of GEMMs.
SUSTAINED_WARMUP_MS = 1500
SUSTAINED_MS = 1000


@dataclass(frozen=True)
class Peaks:
    """GEMM ceilings in TFLOP/s (``bf16_tflops``/``fp8_tflops`` are the burst figures) and copy GB/s."""

    bf16_tflops: float | None
    fp8_tflops: float | None
    copy_gbps: float | None
    bf16_sustained_tflops: float | None = None
    fp8_sustained_tflops: float | None = None

    def as_dict(self) -> dict[str, float | None]:
        """The env.json record, with the meaning of each figure in its key."""
        return {
            "bf16_tflops": self.bf16_tflops,
            "fp8_tflops": self.fp8_tflops,
            "bf16_sustained_tflops": self.bf16_sustained_tflops,
            "fp8_sustained_tflops": self.fp8_sustained_tflops,
            "copy_gbps": self.copy_gbps,
            "percent_peak_uses": "burst (bf16_tflops / fp8_tflops)",
            "burst": f"{BURST_MS} ms of {GEMM_SIZE}^3 GEMMs after {SPIN_UP_MS} ms spin-up",
            "sustained": f"{SUSTAINED_MS} ms of {GEMM_SIZE}^3 GEMMs after {SUSTAINED_WARMUP_MS} ms warm-up",
        }


Matmul = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _gemm_tflops(a: torch.Tensor, b: torch.Tensor, matmul: Matmul, warmup_ms: float, rep_ms: float) -> float:
    timing = time_cuda(lambda: matmul(a, b), warmup_ms=warmup_ms, rep_ms=rep_ms)
    return 2 * GEMM_SIZE**3 / (timing.ms * 1e-3) / 1e12


def _fp8_operands(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, Matmul] | None:
    """e4m3 operands and a scaled matmul, or None where the GPU or torch has no fp8 GEMM."""
    if torch.cuda.get_device_capability(device) < (8, 9) or not hasattr(torch, "_scaled_mm"):
        return None
    a = torch.randn(GEMM_SIZE, GEMM_SIZE, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(GEMM_SIZE, GEMM_SIZE, device=device).to(torch.float8_e4m3fn).t()
    one = torch.ones((), device=device)
    return a, b, lambda x, y: torch._scaled_mm(x, y, one, one, out_dtype=torch.bfloat16)


def _gemm_or_none(operands, warmup_ms: float, rep_ms: float) -> float | None:
    if operands is None:
        return None
    try:
        return _gemm_tflops(*operands, warmup_ms, rep_ms)
    except RuntimeError:
        # torch._scaled_mm refuses some GPU/torch combinations: no fp8 ceiling, not a crash.
        return None


def measure_peaks(device: torch.device) -> Peaks:
    """Both bursts first (a cool GPU), then both sustained runs. Random data: zeros run faster."""
    if device.type != "cuda":
        return Peaks(None, None, None)
    bf16 = (
        torch.randn(GEMM_SIZE, GEMM_SIZE, device=device, dtype=torch.bfloat16),
        torch.randn(GEMM_SIZE, GEMM_SIZE, device=device, dtype=torch.bfloat16),
        torch.matmul,
    )
    fp8 = _fp8_operands(device)
    bursts = [_gemm_or_none(operands, SPIN_UP_MS, BURST_MS) for operands in (bf16, fp8)]
    sustained = [_gemm_or_none(operands, SUSTAINED_WARMUP_MS, SUSTAINED_MS) for operands in (bf16, fp8)]
    del bf16, fp8
    copy = _copy_gbps(device)
    torch.cuda.empty_cache()
    return Peaks(bursts[0], bursts[1], copy, sustained[0], sustained[1])


def _copy_gbps(device: torch.device) -> float:
    source = torch.randn(COPY_BYTES // 4, device=device)
    target = torch.empty_like(source)
    copy_ms = time_cuda(lambda: target.copy_(source)).ms
    # A copy reads and writes every byte.
    return 2 * COPY_BYTES / (copy_ms * 1e-3) / 1e9
