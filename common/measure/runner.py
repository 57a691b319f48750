"""Measure one implementation on one problem: check, prepare (untimed), time, and never raise.

Whatever a kernel does (raise, run out of memory, return NaN or a wrong answer) becomes a status and
a reason in its :class:`ResultRow`, its memory is released, and the caller moves on.
"""

from __future__ import annotations

import gc
import math
import time
import traceback
from dataclasses import dataclass

import torch

from common.contract.check import judge_output, run_poisoned, sdpa_error
from common.contract.inputs import make_inputs, make_paged_kv
from common.contract.metrics import ErrorStats, error_stats, ratio_vs_sdpa
from common.contract.problem import Problem
from common.contract.reference import reference_attention
from common.contract.registry import Implementation, Runner, per_call_inputs
from common.measure.peaks import Peaks
from common.measure.results import ResultRow
from common.measure.timing import Timing, tflops, time_cuda, time_host

# Calls enqueued back to back to estimate per-call host overhead.
HOST_LAUNCH_CALLS = 20


@dataclass(frozen=True)
class Workload:
    """The inputs of one problem with its fp64 reference and SDPA's same-dtype error."""

    problem: Problem
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    reference: torch.Tensor
    sdpa_error: ErrorStats | None
    # The (B,) int32 key lengths when the problem carries them (a ragged KV cache), else None.
    cache_seqlens: torch.Tensor | None = None
    # The (B, max_pages_per_seq) int32 block table of a paged cache (k and v are then page pools), else None.
    block_table: torch.Tensor | None = None


def make_workload(
    problem: Problem, device: str, cache_seqlens: torch.Tensor | None = None, *, on_device: bool = False
) -> Workload:
    """Inputs (standard normal, seed 0; drawn on the device with ``on_device``, see
    ``common.contract.inputs.make_inputs``), fp64 reference and SDPA's same-dtype error for one problem,
    with its per-sequence key lengths when it has them; a paged problem's k and v go into page pools
    with a shuffled block table (``common.contract.inputs.make_paged_kv``)."""
    q, k, v = make_inputs(problem, seed=0, device=device, on_device=on_device)
    block_table = None
    if problem.paged:
        k, v, block_table = make_paged_kv(problem, k, v, seed=0)
    reference = reference_attention(q, k, v, problem, cache_seqlens=cache_seqlens, block_table=block_table)
    yardstick = sdpa_error(q, k, v, problem, reference, cache_seqlens, block_table)
    return Workload(problem, q, k, v, reference, yardstick, cache_seqlens, block_table)


@dataclass(frozen=True)
class TimingOptions:
    warmup_ms: float = 100.0
    rep_ms: float = 500.0
    cuda_graph: bool = False


def judge_on_workload(impl: Implementation, run: Runner, workload: Workload) -> tuple[bool, str, ErrorStats]:
    """``run`` on a poisoned output, its error against the workload's fp64 reference judged by ``impl``'s rule
    (SDPA's same-dtype error the yardstick): (passed, why not, the error)."""
    out = run_poisoned(run)
    err = error_stats(out, workload.reference)
    inputs = (workload.q, workload.k, workload.v)
    ok, reason, _ = judge_output(impl, out, err, inputs, workload.problem, workload.reference, workload.sdpa_error)
    return ok, reason, err


def blank_row(impl_name: str, stack: str, rung: str, problem: Problem, status: str, reason: str) -> ResultRow:
    return ResultRow(
        impl=impl_name,
        stack=stack,
        rung=rung,
        batch=problem.batch,
        heads=problem.heads,
        seqlen_q=problem.seqlen_q,
        seqlen_k=problem.seqlen_k,
        head_dim=problem.head_dim,
        dtype=problem.dtype_name,
        causal=problem.causal,
        status=status,
        reason=reason,
        kv_heads=problem.kv_heads,
        causal_alignment=problem.causal_alignment,
    )


def freeze_imports() -> None:
    """Leave what exists now (the imported modules: the Triton, CuTe DSL and torch object graphs, about
    half a million objects) out of every later garbage collection. They live as long as the process;
    without this each row's full collection in :func:`measure` scans them (0.3-0.7 s a row)."""
    gc.collect()
    gc.freeze()


def _release() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _time(run, device: torch.device, options: TimingOptions) -> tuple[Timing, str]:
    if device.type == "cuda":
        timing = time_cuda(run, warmup_ms=options.warmup_ms, rep_ms=options.rep_ms, cuda_graph=options.cuda_graph)
        return timing, "cuda-graph" if options.cuda_graph else "cuda-events"
    return time_host(run), "cpu-interpreter"


def _synced_ms(run, device: torch.device) -> float:
    """Wall time of one call including device completion (the warm first call after prepare)."""
    start = time.perf_counter()
    run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) * 1e3


def _host_launch_us(run, device: torch.device) -> float:
    """Host time per call when calls are only enqueued: the launch overhead a user pays per call."""
    if device.type != "cuda":
        return math.nan
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(HOST_LAUNCH_CALLS):
        run()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize(device)
    return elapsed / HOST_LAUNCH_CALLS * 1e6


def _peak_for(impl: Implementation, peaks: Peaks) -> float | None:
    return peaks.fp8_tflops if impl.rung == "fp8" else peaks.bf16_tflops


def _fill_errors(row: ResultRow, err: ErrorStats, workload: Workload, impl: Implementation) -> None:
    row.max_abs_err, row.rel_l2_err, row.rmse = err.max_abs_err, err.rel_l2_err, err.rmse
    row.nonfinite = err.nonfinite
    row.err_ratio_vs_sdpa = ratio_vs_sdpa(err, workload.sdpa_error)
    row.error_rule = impl.error_rule.name
    if workload.sdpa_error is not None:
        row.sdpa_max_abs_err = workload.sdpa_error.max_abs_err
        row.sdpa_rel_l2_err = workload.sdpa_error.rel_l2_err


def _measure(
    impl: Implementation, workload: Workload, device: torch.device, options: TimingOptions, peaks: Peaks
) -> ResultRow:
    problem = workload.problem
    row = blank_row(impl.name, impl.stack, impl.rung, problem, "ok", "")
    row.device = str(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    baseline = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    start = time.perf_counter()
    extra = per_call_inputs(problem, workload.cache_seqlens, workload.block_table)
    run = impl.prepare(workload.q, workload.k, workload.v, problem, **extra)
    row.prepare_s = time.perf_counter() - start
    row.first_call_ms = _synced_ms(run, device)
    out = run_poisoned(run)
    if device.type == "cuda":
        # Read before the fp64 error computation below, whose temporaries are the harness's, not the rung's.
        torch.cuda.synchronize(device)
        row.extra_mem_bytes = torch.cuda.max_memory_allocated(device) - baseline - out.numel() * out.element_size()
    err = error_stats(out, workload.reference)
    _fill_errors(row, err, workload, impl)
    inputs = (workload.q, workload.k, workload.v)
    ok, reason, emulation = judge_output(impl, out, err, inputs, problem, workload.reference, workload.sdpa_error)
    if emulation is not None:
        row.emulation_rel_l2_err = emulation.error.rel_l2_err
    # FP8 runners name the quantisation they ran (common.contract.fp8.Quantisation.name).
    row.variant = getattr(run, "variant", "")
    if not ok:
        row.status, row.reason = "wrong", reason
    del out
    row.host_launch_us = _host_launch_us(run, device)
    timing, row.timing = _time(run, device, options)
    row.ms, row.ms_p20, row.ms_p80 = timing.ms, timing.ms_p20, timing.ms_p80
    row.tflops = tflops(problem.flops, timing.ms)
    row.gbps = problem.min_bytes / (timing.ms * 1e-3) / 1e9
    peak = _peak_for(impl, peaks)
    row.pct_peak = 100 * row.tflops / peak if peak else math.nan
    return row


def measure(
    impl: Implementation, workload: Workload, device: torch.device, options: TimingOptions, peaks: Peaks
) -> ResultRow:
    """One row for ``impl`` on ``workload``: ok / wrong / failed / oom / skipped, never an exception."""
    problem = workload.problem
    try:
        ok, reason = impl.check(problem, device)
    except Exception as error:  # noqa: BLE001 - a broken capability check is a result too
        ok, reason = False, f"capability check raised {type(error).__name__}: {error}"
    if not ok:
        return blank_row(impl.name, impl.stack, impl.rung, problem, "skipped", reason)
    try:
        return _measure(impl, workload, device, options, peaks)
    except torch.cuda.OutOfMemoryError as error:
        return blank_row(impl.name, impl.stack, impl.rung, problem, "oom", str(error).splitlines()[0])
    except Exception as error:  # noqa: BLE001 - record the failure and keep going
        last = traceback.extract_tb(error.__traceback__)[-1]
        where = f"{last.filename.rsplit('/', 1)[-1]}:{last.lineno}"
        return blank_row(
            impl.name, impl.stack, impl.rung, problem, "failed", f"{type(error).__name__} at {where}: {error}"
        )
    finally:
        _release()
