"""Measured ceilings, once per run: bf16 and fp8 GEMM (burst and sustained), device-to-device copy,
and HBM read bandwidth (a read-only reduction; the ceiling of ``compare.py --decode``); and, per decode case, the
time a read of the case's own bytes takes (``same_size_read_us``).

A GPU runs faster for a moment than it can hold. On the H200 (``results/h200/gemm-burst.log``) an
8192^3 bf16 GEMM runs at ~807 TFLOP/s for its first ~15 calls after a light spin-up (device copies:
boost clock without the GEMM's power draw), then settles near ~710 as the power limit pulls the
clock down; spinning up with GEMMs themselves already costs the burst (~730). So the burst is timed
as a handful of GEMMs, each with its own events, right after a copy spin-up, and the sustained figure
as a second of back-to-back GEMMs after a long warm-up. An attention kernel measured for a fraction
of a second sees clocks between the two; "% peak" divides by the burst figure.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from common.measure.timing import time_cuda

GEMM_SIZE = 8192
COPY_BYTES = 4 * 2**30
# An idle GPU sits at a low clock; this much copying brings it to its boost clock.
SPIN_UP_MS = 300
# The burst: this many GEMMs right after spin-up, before the power limit pulls the clock down.
BURST_CALLS = 12
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
    # HBM read bandwidth (a read-only reduction), the ceiling of a memory-bound decode step.
    read_gbps: float | None = None

    def as_dict(self) -> dict[str, float | None]:
        """The env.json record, with the meaning of each figure in its key."""
        return {
            "bf16_tflops": self.bf16_tflops,
            "fp8_tflops": self.fp8_tflops,
            "bf16_sustained_tflops": self.bf16_sustained_tflops,
            "fp8_sustained_tflops": self.fp8_sustained_tflops,
            "copy_gbps": self.copy_gbps,
            "read_gbps": self.read_gbps,
            "percent_peak_uses": "burst (bf16_tflops / fp8_tflops)",
            "burst": f"median of {BURST_CALLS} {GEMM_SIZE}^3 GEMMs after {SPIN_UP_MS} ms of device copies",
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


def _bf16_operands(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, Matmul]:
    a, b = (torch.randn(GEMM_SIZE, GEMM_SIZE, device=device, dtype=torch.bfloat16) for _ in range(2))
    return a, b, torch.matmul


def measure_bf16_sustained_tflops(device: torch.device) -> float | None:
    """The sustained bf16 GEMM rate alone (``measure_peaks``' figure, about 2.5 s): the compute side of a
    decode step's roofline (``common.measure.decode_sweep.roofline_us``) for tools that need no other peak."""
    if device.type != "cuda":
        return None
    rate = _gemm_or_none(partial(_gemm_tflops, *_bf16_operands(device), SUSTAINED_WARMUP_MS, SUSTAINED_MS))
    torch.cuda.empty_cache()
    return rate


def _burst_tflops(a: torch.Tensor, b: torch.Tensor, matmul: Matmul) -> float:
    """Median of ``BURST_CALLS`` GEMMs, each timed by its own events, right after a copy spin-up."""
    matmul(a, b)
    source = torch.empty(COPY_BYTES // 8, device=a.device)
    target = torch.empty_like(source)
    torch.cuda.synchronize(a.device)
    deadline = time.perf_counter() + SPIN_UP_MS / 1e3
    while time.perf_counter() < deadline:
        target.copy_(source)
        torch.cuda.synchronize(a.device)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(BURST_CALLS)]
    for start, end in events:
        start.record()
        matmul(a, b)
        end.record()
    torch.cuda.synchronize(a.device)
    return 2 * GEMM_SIZE**3 / (statistics.median(s.elapsed_time(e) for s, e in events) * 1e-3) / 1e12


def _gemm_or_none(measure: Callable[[], float]) -> float | None:
    try:
        return measure()
    except RuntimeError:
        # torch._scaled_mm refuses some GPU/torch combinations: no fp8 ceiling, not a crash.
        return None


def measure_peaks(device: torch.device) -> Peaks:
    """Both bursts first (a cool GPU), then both sustained runs. Random data: zeros run faster."""
    if device.type != "cuda":
        return Peaks(None, None, None)
    bf16 = _bf16_operands(device)
    fp8 = _fp8_operands(device)
    bursts = [_gemm_or_none(partial(_burst_tflops, *ops)) if ops else None for ops in (bf16, fp8)]
    sustained = [
        _gemm_or_none(partial(_gemm_tflops, *ops, SUSTAINED_WARMUP_MS, SUSTAINED_MS)) if ops else None
        for ops in (bf16, fp8)
    ]
    del bf16, fp8
    copy = _copy_gbps(device)
    read = measure_read_gbps(device)
    torch.cuda.empty_cache()
    return Peaks(bursts[0], bursts[1], copy, sustained[0], sustained[1], read)


def _copy_gbps(device: torch.device) -> float:
    source = torch.randn(COPY_BYTES // 4, device=device)
    target = torch.empty_like(source)
    copy_ms = time_cuda(lambda: target.copy_(source)).ms
    # A copy reads and writes every byte.
    return 2 * COPY_BYTES / (copy_ms * 1e-3) / 1e9


def same_size_read_us(
    nbytes: int, device: torch.device, *, warmup_ms: float = 100, rep_ms: float = 500, cuda_graph: bool = False
) -> float | None:
    """The time in µs a plain read of ``nbytes`` takes here: ``measure_read_gbps``'s sum over that many bytes of
    fp32 (rounded up to a whole element), timed as a decode row is (``time_cuda`` with the row's warm-up, repetitions
    and graph mode, the L2 flushed before each run); None without a GPU. A read of a few hundred MB pays a fixed cost
    (launch, first bytes, the last wave's tail) that ``COPY_BYTES`` hides: the floor a decode step of that size has."""
    if device.type != "cuda":
        return None
    source = torch.randn(-(-nbytes // 4), device=device)
    timing = time_cuda(lambda: source.sum(), warmup_ms=warmup_ms, rep_ms=rep_ms, cuda_graph=cuda_graph)
    return timing.ms * 1e3


def measure_read_gbps(device: torch.device) -> float | None:
    """HBM read bandwidth: a sum over ``COPY_BYTES`` of fp32, which reads every byte once and writes
    one number, timed like the copy (``time_cuda``); None without a GPU."""
    if device.type != "cuda":
        return None
    source = torch.randn(COPY_BYTES // 4, device=device)
    read_ms = time_cuda(lambda: source.sum()).ms
    return COPY_BYTES / (read_ms * 1e-3) / 1e9
