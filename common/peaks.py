"""Measured ceilings, once per run: bf16 GEMM, fp8 GEMM (where supported), device-to-device copy."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from common.timing import time_cuda

GEMM_SIZE = 8192
COPY_BYTES = 4 * 2**30
# An idle GPU sits at a low clock; this much GEMM work first brings it to its working clock.
SPIN_UP_MS = 1500
PEAK_REP_MS = 1000


@dataclass(frozen=True)
class Peaks:
    bf16_tflops: float | None
    fp8_tflops: float | None
    copy_gbps: float | None


def _gemm_tflops(a: torch.Tensor, b: torch.Tensor, matmul) -> float:
    timing = time_cuda(lambda: matmul(a, b), warmup_ms=SPIN_UP_MS, rep_ms=PEAK_REP_MS)
    return 2 * GEMM_SIZE**3 / (timing.ms * 1e-3) / 1e12


def _fp8_tflops(device: torch.device) -> float | None:
    if torch.cuda.get_device_capability(device) < (8, 9) or not hasattr(torch, "_scaled_mm"):
        return None
    a = torch.randn(GEMM_SIZE, GEMM_SIZE, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(GEMM_SIZE, GEMM_SIZE, device=device).to(torch.float8_e4m3fn).t()
    one = torch.ones((), device=device)
    try:
        return _gemm_tflops(a, b, lambda x, y: torch._scaled_mm(x, y, one, one, out_dtype=torch.bfloat16))
    except RuntimeError:
        return None


def measure_peaks(device: torch.device) -> Peaks:
    """Random data (never zeros: they run faster than real data)."""
    if device.type != "cuda":
        return Peaks(None, None, None)
    a = torch.randn(GEMM_SIZE, GEMM_SIZE, device=device, dtype=torch.bfloat16)
    b = torch.randn(GEMM_SIZE, GEMM_SIZE, device=device, dtype=torch.bfloat16)
    bf16 = _gemm_tflops(a, b, torch.matmul)
    fp8 = _fp8_tflops(device)
    del a, b
    copy = _copy_gbps(device)
    torch.cuda.empty_cache()
    return Peaks(bf16, fp8, copy)


def _copy_gbps(device: torch.device) -> float:
    source = torch.randn(COPY_BYTES // 4, device=device)
    target = torch.empty_like(source)
    copy_ms = time_cuda(lambda: target.copy_(source)).ms
    # A copy reads and writes every byte.
    return 2 * COPY_BYTES / (copy_ms * 1e-3) / 1e9
