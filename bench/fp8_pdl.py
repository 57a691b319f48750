"""cute/fp8 end to end with programmatic dependent launch (``cute_impl.fp8.PROGRAMMATIC_LAUNCH``) against without,
issue #37: at P1 (B=2 H=16 S=8192 D=128 bf16, FA3 inputs), causal first, then non-causal, in one process,
``--rounds`` interleaved rounds (medians; every timing ``common.measure.timing.time_cuda``: L2 flushed, median):
cute/hopper (bf16, the issue's denominator), cute/fp8 kernel only (never PDL: any kernel may precede it), its fused
quantiser alone (K and V where the kernel quantises Q), and end to end (quantiser + kernel per call) with the knob
off and on. ``gap`` = end to end - kernel - quantiser: what a call pays beyond its two launches, which PDL should
shrink (the kernel's launch, barrier set-up, Q's load and quantisation under the quantiser's last wave). The two
end-to-end outputs are checked equal (PDL changes when the kernel starts, not what it computes). Writes
``fp8_pdl.csv`` and ``.md`` to ``--out``.

usage (project root, GPU):  python -m bench.fp8_pdl [--out DIR] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from bench import fp8_q_in_kernel, require_gpu
from bench.fp8_q_in_kernel import cell
from bench.fp8_quantiser import _time
from common.contract.problem import Problem
from common.measure.timing import tflops

KNOB = {"e2e off": False, "e2e on": True}


def _runs(problem: Problem, inputs) -> dict:
    """What one case times, by name: cute/hopper, cute/fp8 kernel only, its quantiser alone, end to end with the
    knob off and on (read when each launch is built)."""
    from cute_impl import fp8, hopper

    kernel = fp8.prepare(*inputs, problem)
    runs = {"bf16": hopper.prepare(*inputs, problem), "kernel": kernel, "quantiser": lambda: kernel.quantise(*inputs)}
    for name, on in KNOB.items():
        fp8.PROGRAMMATIC_LAUNCH = on
        try:
            runs[name] = fp8.prepare_end_to_end(*inputs, problem)
        finally:
            fp8.PROGRAMMATIC_LAUNCH = False
    return runs


def case_rows(causal: bool, inputs, args: argparse.Namespace) -> list[dict]:
    problem = fp8_q_in_kernel.problem_of(args, causal)
    runs = _runs(problem, inputs)
    same = torch.equal(runs["e2e off"]().clone(), runs["e2e on"]())
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            samples[name].append(_time(run, args))
    us = {name: statistics.median(values) * 1e3 for name, values in samples.items()}
    rows = []
    for name, values in samples.items():
        timed_attention = name != "quantiser"
        row = {"causal": causal, "what": name, "us": us[name],
               "tflops": tflops(problem.flops, us[name] * 1e-3) if timed_attention else "",
               "vs_bf16": us["bf16"] / us[name] if timed_attention else "",
               "gap_us": us[name] - us["kernel"] - us["quantiser"] if name in KNOB else "",
               "spread_us": (max(values) - min(values)) * 1e3, "same_output": same if name in KNOB else ""}  # fmt: skip
        rows.append(row)
        ratio = f" {row['vs_bf16']:.3f}x bf16" if timed_attention else ""
        gap = f" gap {row['gap_us']:.1f} us" if name in KNOB else ""
        print(f"causal={causal!s:5s} {name:9s} {row['us']:8.1f} us{ratio}{gap} (spread {row['spread_us']:.1f} us)",
              flush=True)  # fmt: skip
    return rows


def main() -> None:
    args = fp8_q_in_kernel.arguments(__doc__, "runs/fp8_pdl")
    require_gpu("bench.fp8_pdl")
    rows = fp8_q_in_kernel.both_masks(args, case_rows)
    lines = [f"# cute/fp8 end to end with PDL, {torch.cuda.get_device_name()} (P1, {args.rounds} rounds)", "",
             "| causal | what | µs | TFLOP/s | ÷ cute/hopper | gap µs | spread µs | O off = on |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in rows:
        lines.append(f"| {row['causal']} | {row['what']} | {row['us']:.1f} | {cell(row['tflops'], 0)} | "
                     f"{cell(row['vs_bf16'], 3)} | {cell(row['gap_us'], 1)} | {row['spread_us']:.1f} | "
                     f"{row['same_output']} |")  # fmt: skip
    fp8_q_in_kernel.write(args.out, "fp8_pdl", rows, lines)


if __name__ == "__main__":
    main()
