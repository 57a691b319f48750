"""What ``common.attention`` costs over the prepared launch, per implementation (a GPU tool).

python -m common.measure.api_overhead --out results/h200/api-overhead     (writes results.csv and report.md)

For each implementation that can run a shape (non-causal), on one set of inputs:
  1. ``prepare`` once (untimed) and keep its ``run()``: the harness's prepared launch;
  2. call ``attention(q, k, v, impl=...)`` twice: the first call plans (a plan-cache miss), the second
     binds and launches (a hit); its output must equal the prepared launch's, bit for bit;
  3. time loops of back-to-back calls of each, alternating, ``ROUNDS`` times: CUDA events around a
     loop give the time per call a user's loop sees (host-bound when launches cost more than the
     kernel), and a host timer around the enqueueing gives the host time per call.
The overhead is the median time per call of ``attention`` over the prepared launch's, minus one;
at a small shape, where both are host-bound, the host microseconds are the honest figure.
"""

from __future__ import annotations

import argparse
import fnmatch
import gc
import json
import statistics
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from common.contract.api import attention, clear_plan_cache, plan_cache_info
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from common.contract.registry import Implementation, discover
from common.measure.environment import manifest
from common.measure.fa4 import fa4_version_info
from common.measure.results import write_rows

SHAPES = {
    "P1": Problem.canonical(8192),
    "small": Problem(batch=1, heads=8, seqlen_q=512, seqlen_k=512, head_dim=64),
    # One eager decode step of an 8k-token Llama-shaped cache (results/h200/generate-profile/): host-bound.
    "decode": Problem(batch=1, heads=32, seqlen_q=1, seqlen_k=8192, head_dim=128, kv_heads=8),
}
# Alternating rounds of (prepared loop, attention loop); medians over rounds.
ROUNDS = 5
# Each loop enqueues calls for about this long, and between these many calls.
LOOP_MS = 25.0
MIN_CALLS, MAX_CALLS = 3, 400


@dataclass
class OverheadRow:
    impl: str
    shape: str
    problem: str
    status: str
    reason: str = ""
    calls_per_loop: int = 0
    prepared_us: float = float("nan")
    attention_us: float = float("nan")
    overhead_pct: float = float("nan")
    host_prepared_us: float = float("nan")
    host_attention_us: float = float("nan")
    host_overhead_us: float = float("nan")
    prepared_tflops: float = float("nan")
    attention_tflops: float = float("nan")
    same_output: bool | None = None


def _loop(fn, calls: int) -> tuple[float, float]:
    """Microseconds per call between CUDA events around ``calls`` calls, and host microseconds per
    call spent enqueueing them."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    host_start = time.perf_counter()
    for _ in range(calls):
        fn()
    host_s = time.perf_counter() - host_start
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls, host_s * 1e6 / calls


def _calls_per_loop(fn) -> int:
    per_call_us, _ = _loop(fn, MIN_CALLS)
    return max(MIN_CALLS, min(MAX_CALLS, int(LOOP_MS * 1e3 / per_call_us)))


def measure_overhead(impl: Implementation, shape: str, problem: Problem) -> OverheadRow:
    """One row: the prepared launch against ``attention`` on the same inputs (see the module docstring)."""
    device = torch.device("cuda")
    row = OverheadRow(impl.name, shape, problem.describe(), "ok")
    ok, reason = impl.check(problem, device)
    if not ok:
        row.status, row.reason = "skipped", reason
        return row
    q, k, v = make_inputs(problem, seed=0, device="cuda")
    run = impl.prepare(q, k, v, problem)
    expected = run().clone()

    def call() -> torch.Tensor:
        return attention(q, k, v, causal=problem.causal, softmax_scale=problem.softmax_scale, impl=impl.name)

    call()
    row.same_output = bool(torch.equal(call(), expected))
    row.calls_per_loop = calls = _calls_per_loop(run)
    samples = [(_loop(run, calls), _loop(call, calls)) for _ in range(ROUNDS)]
    row.prepared_us = statistics.median(prepared[0] for prepared, _ in samples)
    row.attention_us = statistics.median(through_api[0] for _, through_api in samples)
    row.host_prepared_us = statistics.median(prepared[1] for prepared, _ in samples)
    row.host_attention_us = statistics.median(through_api[1] for _, through_api in samples)
    row.overhead_pct = 100 * (row.attention_us / row.prepared_us - 1)
    row.host_overhead_us = row.host_attention_us - row.host_prepared_us
    row.prepared_tflops = problem.flops / (row.prepared_us * 1e-6) / 1e12
    row.attention_tflops = problem.flops / (row.attention_us * 1e-6) / 1e12
    return row


def _safe_measure(impl: Implementation, shape: str, problem: Problem) -> OverheadRow:
    try:
        return measure_overhead(impl, shape, problem)
    except Exception as error:  # noqa: BLE001 - one failing implementation is a row, not the end of the run
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return OverheadRow(impl.name, shape, problem.describe(), "failed", f"{type(error).__name__}: {first_line}")
    finally:
        gc.collect()
        torch.cuda.empty_cache()


def _cell(value: object, digits: int = 1) -> str:
    if isinstance(value, float):
        return "" if value != value else f"{value:.{digits}f}"
    if value is None:
        return ""
    return str(value)


def markdown(rows: list[OverheadRow], environment: dict) -> str:
    """The committed report: environment, then one table per shape."""
    lines = [
        "# `common.attention()` against the prepared launch",
        "",
        f"GPU {environment.get('gpu')}, torch {environment.get('torch')}, Triton {environment.get('triton')}, "
        f"CuTe DSL {environment.get('nvidia_cutlass_dsl')}, commit {str(environment.get('git_commit'))[:10]}. "
        "Generated by `python -m common.measure.api_overhead`; non-causal, bf16. Times are per call in a loop of "
        "back-to-back calls on the same inputs (CUDA events around the loop; medians of "
        f"{ROUNDS} alternating rounds); host = time to enqueue one call. `same` = attention()'s output equals "
        "the prepared launch's bit for bit.",
        "",
    ]
    for shape, problem in SHAPES.items():
        if not any(row.shape == shape for row in rows):
            continue
        lines += [
            f"## {shape}: {problem.describe()}",
            "",
            "| impl | prepared µs | attention() µs | overhead | host prepared µs | host attention() µs | "
            "host overhead µs | TFLOP/s prepared | TFLOP/s attention() | same |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for row in (row for row in rows if row.shape == shape):
            if row.status != "ok":
                lines.append(f"| {row.impl} | {row.status}: {row.reason} |||||||||")
                continue
            lines.append(
                f"| {row.impl} | {_cell(row.prepared_us)} | {_cell(row.attention_us)} | "
                f"{_cell(row.overhead_pct)} % | {_cell(row.host_prepared_us)} | {_cell(row.host_attention_us)} | "
                f"{_cell(row.host_overhead_us)} | {_cell(row.prepared_tflops)} | {_cell(row.attention_tflops)} | "
                f"{'yes' if row.same_output else 'NO'} |"
            )
        lines.append("")
    return "\n".join(lines)


def _selected(name: str, patterns: list[str]) -> bool:
    return not patterns or any(fnmatch.fnmatch(name, pattern) for pattern in patterns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for results.csv, report.md and env.json")
    parser.add_argument("--only", action="append", default=[], help="glob on implementation names (repeatable)")
    parser.add_argument(
        "--shape", action="append", choices=tuple(SHAPES), help=f"shapes to measure (default: all of {list(SHAPES)})"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.exit(2, "common.measure.api_overhead measures GPU launches: no CUDA device here\n")
    implementations, missing = discover()
    for item in missing:
        print(f"{item.name:18s} unavailable: {item.reason}")
    selected = [impl for impl in implementations if _selected(impl.name, args.only)]
    rows = []
    clear_plan_cache()
    for shape in args.shape or SHAPES:
        for impl in selected:
            row = _safe_measure(impl, shape, SHAPES[shape])
            rows.append(row)
            print(
                f"{row.impl:18s} {shape:5s} {row.status:7s} prepared {_cell(row.prepared_us):>9s} µs  "
                f"attention {_cell(row.attention_us):>9s} µs  overhead {_cell(row.overhead_pct, 2):>6s} %  "
                f"host +{_cell(row.host_overhead_us):>5s} µs  same {row.same_output}  {row.reason}",
                flush=True,
            )
    print(f"plan cache: {plan_cache_info()}")
    args.out.mkdir(parents=True, exist_ok=True)
    write_rows(args.out / "results.csv", rows, [field.name for field in fields(OverheadRow)])
    environment = {**manifest(torch.device("cuda")), "fa4": fa4_version_info(), "plan_cache": asdict(plan_cache_info())}
    (args.out / "env.json").write_text(json.dumps(environment, indent=2, default=str) + "\n")
    (args.out / "report.md").write_text(markdown(rows, environment))


if __name__ == "__main__":
    main()
