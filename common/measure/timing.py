"""Timing: device-event medians with the L2 flushed between runs; host timers on the CPU.

Two flushes (``time_cuda``'s ``flush``):

* ``"write"``: ``triton.testing.do_bench``, which zeroes a 256 MB buffer before every run. The L2 is then full of
  the buffer's dirty lines; the timed kernel's first reads evict them, and their write-back (up to the L2's size,
  60 MiB on the H200) shares DRAM with the kernel's reads inside the timed window.
* ``"clean"`` (the default since the H200 A/B of ``bench/flush_ab.sh``, results/h200/flush-ab/): the same
  zeroing, then a read of the buffer's first ``CLEAN_READ_BYTES`` (long evicted, clean in DRAM), which fills the
  L2 with clean lines and writes the dirty ones back before the start event. Only stream order separates the read
  from the start event: no host synchronisation, so the timed call is enqueued while the flush runs and no launch
  latency falls inside the window. Same warm-up and repetition counts as ``do_bench`` (its run-time estimate
  includes the flush).

Why "clean": the write-back is the harness's cost, not the kernel's. A plain ``torch.sum`` read 50 % of the read
bandwidth over 64 MB, 64 % over 136 MB and 85 % over 512 MB under "write", 60 / 77 / 91 % under "clean"; seed 73's
decode rows of 136-143 MB took 0.83-0.95x the time. Over a few hundred MB the two agree within 2 %.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

# Quantiles reported next to the median.
LOW_QUANTILE, HIGH_QUANTILE = 0.2, 0.8
# The "clean" flush reads this much of do_bench's 256 MB zeroed buffer: more than twice the H200's 60 MiB L2.
CLEAN_READ_BYTES = 128 * 2**20
# do_bench estimates a run's time from this many flushed runs.
ESTIMATE_RUNS = 5

Flush = Literal["write", "clean"]


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
    fn: Callable[[], object],
    *,
    warmup_ms: float = 100,
    rep_ms: float = 500,
    cuda_graph: bool = False,
    flush: Flush = "clean",
) -> Timing:
    """Median and p20/p80 of device-event timings, the L2 flushed before every run (module docstring)."""
    import triton.testing

    target = _graphed(fn) if cuda_graph else fn
    if flush == "write":
        samples = triton.testing.do_bench(target, warmup=warmup_ms, rep=rep_ms, return_mode="all")
    elif flush == "clean":
        samples = _bench_clean(target, warmup_ms, rep_ms)
    else:
        raise ValueError(f"flush is 'write' or 'clean', got {flush!r}")
    return Timing(
        statistics.median(samples), _quantile(samples, LOW_QUANTILE), _quantile(samples, HIGH_QUANTILE), cuda_graph
    )


def _read_back(cache: torch.Tensor) -> None:
    """Read the zeroed buffer's first ``CLEAN_READ_BYTES``: the L2 refills with clean lines."""
    cache[: CLEAN_READ_BYTES // cache.element_size()].sum()


def clean_flush() -> Callable[[], None]:
    """The ``"clean"`` flush as a call: do_bench's zeroing of its L2-sized buffer, then ``_read_back``."""
    import triton

    driver = triton.runtime.driver.active
    cache = driver.get_empty_cache_for_benchmark()

    def flush() -> None:
        driver.clear_cache(cache)
        _read_back(cache)

    return flush


def _bench_clean(fn: Callable[[], object], warmup_ms: float, rep_ms: float) -> list[float]:
    """``do_bench(fn, warmup_ms, rep_ms, return_mode="all")`` step for step, with ``_read_back`` after each
    zeroing: the same driver calls, estimate, warm-up and repetition counts."""
    import triton

    driver = triton.runtime.driver.active
    device = driver.get_device_interface()
    fn()
    device.synchronize()
    flush = clean_flush()
    start, end = device.Event(enable_timing=True), device.Event(enable_timing=True)
    start.record()
    for _ in range(ESTIMATE_RUNS):
        flush()
        fn()
    end.record()
    device.synchronize()
    estimate_ms = start.elapsed_time(end) / ESTIMATE_RUNS
    n_repeat = max(1, int(rep_ms / estimate_ms))
    events = [(device.Event(enable_timing=True), device.Event(enable_timing=True)) for _ in range(n_repeat)]
    for _ in range(max(1, int(warmup_ms / estimate_ms))):
        fn()
    for start, end in events:
        flush()
        start.record()
        fn()
        end.record()
    device.synchronize()
    return [start.elapsed_time(end) for start, end in events]


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
