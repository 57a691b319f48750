"""Timing: device-event medians with the L2 flushed between runs; host timers on the CPU."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

# Quantiles reported next to the median.
LOW_QUANTILE, HIGH_QUANTILE = 0.2, 0.8


@dataclass(frozen=True)
class Timing:
    ms: float
    ms_p20: float
    ms_p80: float
    cuda_graph: bool = False


def _quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def capture(fn: Callable[[], object]) -> tuple[torch.cuda.CUDAGraph, object]:
    """``fn`` captured in a CUDA graph once, after a warm-up on a side stream: the graph and what the
    captured call returned (its buffers are the ones every replay writes)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fn()
    return graph, captured


def _graphed(fn: Callable[[], object]) -> Callable[[], object]:
    """Capture ``fn`` in a CUDA graph once and replay it."""
    return capture(fn)[0].replay


def time_cuda(
    fn: Callable[[], object], *, warmup_ms: float = 100, rep_ms: float = 500, cuda_graph: bool = False
) -> Timing:
    """Median and p20/p80 of device-event timings; ``do_bench`` flushes L2 before every run."""
    import triton.testing

    target = _graphed(fn) if cuda_graph else fn
    samples = triton.testing.do_bench(target, warmup=warmup_ms, rep=rep_ms, return_mode="all")
    return Timing(
        statistics.median(samples), _quantile(samples, LOW_QUANTILE), _quantile(samples, HIGH_QUANTILE), cuda_graph
    )


def time_host(fn: Callable[[], object], *, warmup: int = 1, rep: int = 3) -> Timing:
    """Wall-clock timing for CPU runs (the Triton interpreter); only useful for relative teaching."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(rep):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return Timing(statistics.median(samples), _quantile(samples, LOW_QUANTILE), _quantile(samples, HIGH_QUANTILE))


def tflops(flops: int, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12
