"""gluon/fp8 at D=128 with its consumers' ping-pong off and on (``GluonConfig.pingpong`` replaced in the rung's
configuration), issue #37: the causal default runs without ping-pong, and a diagnostic run on the H200 found it faster
with it (690.6 against 729.4 us at P1, results/h200/gluon-persistent/diag/). At P1 (B=2 H=16 S=8192 D=128 bf16, FA3
inputs), causal first, then non-causal (whose default has ping-pong), in one process, ``--rounds`` interleaved rounds
(``fp8_q_in_kernel.interleaved_samples``: the order reversed every other round; medians, every timing
``common.measure.timing.time_cuda``: L2 flushed): kernel only and end to end (the fused quantiser, then the kernel).
Before any timing each setting's O is checked bit-equal to ping-pong off's on NaN-poisoned buffers (ping-pong moves
only when each consumer issues its wgmmas); one that differs is not timed and the run exits 1. Writes
``gluon_fp8_pingpong.csv`` and ``.md`` to ``--out``.

usage (project root, GPU):  python -m bench.gluon_fp8_pingpong [--out DIR] [--rounds 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics
import sys

import torch

from bench import fp8_q_in_kernel, require_gpu
from bench.fp8_q_in_kernel import cell
from common.contract.check import run_poisoned
from common.contract.problem import Problem
from common.measure.timing import tflops

SETTINGS = {"off": False, "on": True}


def _fp8_runs(problem: Problem, inputs) -> dict[tuple[str, str], object]:
    """(setting, kernel / e2e) -> gluon/fp8's run with ping-pong at that setting (read when the launch is built)."""
    from triton_impl.gluon import fp8

    default_config = fp8.default_config
    runs = {}
    for name, pingpong in SETTINGS.items():
        fp8.default_config = lambda p, pingpong=pingpong: dataclasses.replace(default_config(p), pingpong=pingpong)
        try:
            runs[(name, "kernel")] = fp8.prepare(*inputs, problem)
            runs[(name, "e2e")] = fp8.prepare_end_to_end(*inputs, problem)
        finally:
            fp8.default_config = default_config
    return runs


def _hopper_runs(problem: Problem, inputs) -> dict[tuple[str, str], object]:
    """(setting, kernel) -> gluon/hopper's run with ping-pong at that setting (its table is read when it binds)."""
    from triton_impl.gluon import hopper

    table = hopper.DEFAULT_CONFIGS
    dim = problem.head_dim
    runs = {}
    for name, pingpong in SETTINGS.items():
        hopper.DEFAULT_CONFIGS = {**table, dim: dataclasses.replace(table[dim], pingpong=pingpong)}
        try:
            runs[(name, "kernel")] = hopper.prepare(*inputs, problem)
        finally:
            hopper.DEFAULT_CONFIGS = table
    return runs


# rung -> its runs per setting: gluon/fp8 kernel only and end to end, gluon/hopper (bf16) its kernel.
RUNS = {"gluon/fp8": _fp8_runs, "gluon/hopper": _hopper_runs}


def case_rows(causal: bool, inputs, args: argparse.Namespace, rung: str = "gluon/fp8") -> list[dict]:
    problem = Problem.canonical(args.seqlen, heads=args.heads, causal=causal)
    runs = RUNS[rung](problem, inputs)
    reference = run_poisoned(runs[("off", "kernel")]).clone()
    differing = [key for key, run in runs.items() if not torch.equal(run_poisoned(run), reference)]
    for key in differing:
        print(f"causal={causal!s:5s} {rung} pingpong {key[0]} {key[1]}: O differs from off's, not timed")
        del runs[key]
    samples = fp8_q_in_kernel.interleaved_samples(runs, args.rounds, args)
    rows = []
    for (name, kind), values in samples.items():
        us = statistics.median(values) * 1e3
        off_us = statistics.median(samples[("off", kind)]) * 1e3 if ("off", kind) in samples else float("nan")
        row = {"causal": causal, "pingpong": name, "what": kind, "us": us, "tflops": tflops(problem.flops, us * 1e-3),
               "vs_off": off_us / us, "spread_us": (max(values) - min(values)) * 1e3}  # fmt: skip
        print(f"causal={causal!s:5s} pingpong={name:3s} {kind:6s} {us:8.1f} us {row['tflops']:6.1f} TFLOP/s "
              f"{row['vs_off']:.3f}x off's speed (spread {row['spread_us']:.1f} us)", flush=True)  # fmt: skip
        rows.append(row)
    return rows + [{"causal": causal, "pingpong": name, "what": f"{kind}: O differs", "us": "", "tflops": "",
                    "vs_off": "", "spread_us": ""} for name, kind in differing]  # fmt: skip


def main(rung: str = "gluon/fp8", doc: str = __doc__) -> None:
    stem = rung.replace("/", "_") + "_pingpong"
    args = fp8_q_in_kernel.arguments(doc, f"runs/{stem}")
    require_gpu(f"bench.{stem}")
    rows = fp8_q_in_kernel.both_masks(args, functools.partial(case_rows, rung=rung))
    lines = [f"# {rung} D=128, ping-pong off and on, {torch.cuda.get_device_name()} (P1, {args.rounds} rounds)", "",
             "| causal | ping-pong | what | µs | TFLOP/s | speed ÷ off's | spread µs |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in rows:
        cells = [row["causal"], row["pingpong"], row["what"], cell(row["us"], 1), cell(row["tflops"], 0),
                 cell(row["vs_off"], 3), cell(row["spread_us"], 1)]  # fmt: skip
        lines.append("| " + " | ".join(str(text) for text in cells) + " |")
    fp8_q_in_kernel.write(args.out, stem, rows, lines)
    if any(row["us"] == "" for row in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
