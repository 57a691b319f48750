"""Where a compiled ``generate()`` decode step and its prefill spend the GPU's time: kernels by name.

With a StaticCache compiled in "reduce-overhead" mode a decode step is CUDA-graph replays, so the host's
Python is no longer the step: what is left is the GPU's kernels and the gaps between them. This tool runs
the ``bench.generate`` model (4-layer Llama, 32 / 8 heads, D=128, random bf16 weights) for each
implementation, warms the compiled step up (graphs captured), then records two ``generate()`` calls under
``torch.profiler`` with CPU and CUDA activity: one of ``steps + 1`` new tokens and one of 1. The difference,
divided by ``steps``, is one decode step: its kernel count, its summed kernel time, and its kernels by
name; beside them the step's wall time from CUDA events (the same difference). A step whose wall time
exceeds its kernel time by much waits on the host; one whose kernels differ between implementations
says which kernels cost what. The prompt's prefill (one forward into a fresh cache, as ``bench.generate``
times it) is recorded the same way, after a warm-up forward.

    python -m bench.generate_trace --prompt 8192 --batches 1,8 --impls sdpa,ladder:auto --out $OUT/trace

Writes kernels.csv (impl, batch, phase, kernel, calls and µs per step) and steps.csv (impl, batch, phase, wall µs
per step, kernel µs per step, kernels per step, and the host's graph launches, kernel launches and attention
operator calls per step: an operator replayed from a graph makes none) under ``--out`` and prints both,
heaviest kernels first. Without a CUDA GPU it prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import require_gpu
from bench.generate import GPU_MODEL, Case, build_model, generate_kwargs, prefill
from common.measure.results import write_rows

KERNEL_ROWS = 12  # kernels printed per (impl, batch); kernels.csv keeps every one
# Host-side events counted per step: a graph replay is one cudaGraphLaunch; an attention operator that runs
# its Python at every step (not replayed from a graph) shows as calls of its own name.
HOST_EVENTS = ("cudaGraphLaunch", "ladder::attention", "aten::scaled_dot_product_attention", "cudaLaunchKernel")


def kernel_times(run: Callable[[], Any]) -> tuple[collections.Counter, collections.Counter, collections.Counter]:
    """(µs, calls) per CUDA kernel name of one ``run()`` under torch.profiler, and its HOST_EVENTS' calls."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    micros: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()
    host: collections.Counter = collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            micros[event.name] += event.device_time
            calls[event.name] += 1
        elif event.name in HOST_EVENTS:
            host[event.name] += 1
    return micros, calls, host


def wall_micros(run: Callable[[], Any]) -> float:
    import torch

    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) * 1e3


def per_step(long: collections.Counter, short: collections.Counter, steps: int) -> dict[str, float]:
    return {name: (long[name] - short[name]) / steps for name in long | short if long[name] != short[name]}


def summary(
    label: dict[str, Any], wall: float, micros: dict[str, float], calls: dict[str, float], host: dict[str, float]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The steps.csv row (wall and kernel µs, kernel count, HOST_EVENTS) and the kernels.csv rows of one phase."""
    head = {**label, "wall_us": wall, "kernel_us": sum(micros.values()), "kernels": sum(calls.values())}
    head |= {name: host.get(name, 0.0) for name in HOST_EVENTS}
    kernels = [
        {**label, "kernel": name, "calls": calls.get(name, 0.0), "us": us}
        for name, us in sorted(micros.items(), key=lambda item: -item[1])
    ]
    return head, kernels


def trace_case(model: Any, impl: str, case: Case, steps: int) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """One (impl, batch): the summary of a decode step and of the prompt's prefill."""
    import torch

    ids = torch.randint(3, GPU_MODEL.vocab, (case.batch, case.prompt), device="cuda")
    kwargs = generate_kwargs(case, ids)
    model.set_attn_implementation(impl)

    def generate(tokens: int) -> Callable[[], Any]:
        return lambda: model.generate(ids, **{**kwargs, "max_new_tokens": tokens, "min_new_tokens": tokens})

    generate(steps + 1)()  # compiles and captures the step's graphs
    wall = (wall_micros(generate(steps + 1)) - wall_micros(generate(1))) / steps
    long_us, long_calls, long_host = kernel_times(generate(steps + 1))
    short_us, short_calls, short_host = kernel_times(generate(1))
    step = summary(
        {"impl": impl, "batch": case.batch, "phase": "decode step"}, wall, per_step(long_us, short_us, steps),
        per_step(long_calls, short_calls, steps), per_step(long_host, short_host, steps),
    )  # fmt: skip

    def prompt() -> Any:
        return prefill(model, ids, case)

    prompt()
    wall = wall_micros(prompt)
    return [step, summary({"impl": impl, "batch": case.batch, "phase": "prefill"}, wall, *kernel_times(prompt))]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", type=int, default=8192, help="prompt length (default 8192)")
    parser.add_argument("--batches", default="1,8", help="comma-separated batch sizes (default 1,8)")
    parser.add_argument("--impls", default="sdpa,ladder:auto", help="comma-separated attn_implementation names")
    parser.add_argument("--cache", default="static-compiled", choices=("dynamic", "static", "static-compiled"))
    parser.add_argument("--steps", type=int, default=16, help="decode steps traced (default 16)")
    parser.add_argument(
        "--torch-logs", default="",
        help="comma-separated torch._logging.set_logs switches to turn on (e.g. recompiles,perf_hints,cudagraphs):"
        " why a step is not a graph replay",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("runs/generate-trace"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    require_gpu("bench.generate_trace")
    import torch

    from common.integrations.transformers import register_attention_implementations

    if args.torch_logs:
        torch._logging.set_logs(**dict.fromkeys(args.torch_logs.split(","), True))
    register_attention_implementations()
    model = build_model(GPU_MODEL, torch.bfloat16, torch.device("cuda"))
    steps, kernels = [], []
    for batch in (int(text) for text in args.batches.split(",")):
        case = Case(args.cache, batch, args.prompt, args.steps + 1)
        for impl in args.impls.split(","):
            for head, rows in trace_case(model, impl, case, args.steps):
                steps.append(head)
                kernels += rows
                print(f"{impl:14s} B={batch:<2d} {head['phase']:11s} wall {head['wall_us']:9.1f} µs, kernels "
                      f"{head['kernel_us']:9.1f} µs in {head['kernels']:.0f}; host calls: "
                      + ", ".join(f"{name} {head[name]:.1f}" for name in HOST_EVENTS))  # fmt: skip
                for row in rows[:KERNEL_ROWS]:
                    print(f"    {row['us']:9.1f} µs {row['calls']:5.1f}×  {row['kernel'][:110]}")
    args.out.mkdir(parents=True, exist_ok=True)
    write_rows(args.out / "steps.csv", steps)
    write_rows(args.out / "kernels.csv", kernels)
    return 0


if __name__ == "__main__":
    sys.exit(main())
