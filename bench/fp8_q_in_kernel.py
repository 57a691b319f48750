"""cute/fp8 with Q quantised in its kernel (``cute_impl.fp8.QUANTISE_Q_IN_KERNEL``) against the default (the fused
quantiser writes Q too), issue #37: at P1 (B=2 H=16 S=8192 D=128 bf16, FA3 inputs; ``--head-dim 64 --batch 4``: the
issue's D=64 shape, B=4 H=32, with the knob at D=64, which the default leaves off), non-causal and causal, in one
process, ``--rounds`` interleaved rounds (medians; every timing ``common.measure.timing.time_cuda``: L2 flushed,
median): cute/hopper (bf16, the issue's denominator), then per setting (``SETTINGS``: off, on, on with the
rotation ahead, on with ping-pong) cute/fp8 kernel only, end to end (quantiser + kernel per call) and the fused
quantiser alone (Q, K, V; or K and V only with the knob). Each setting's output is checked equal to the knob-off
one (the in-kernel Q is the quantiser's bit for bit where the rotation's sums agree; ahead and ping-pong change
only when GEMMs run). Writes ``fp8_q_in_kernel.csv`` and ``.md`` to ``--out``.

usage (project root, GPU):  python -m bench.fp8_q_in_kernel [--out DIR] [--rounds 3]
"""

from __future__ import annotations

import argparse
import functools
import statistics
from collections.abc import Callable
from pathlib import Path

import torch

from bench import interleaved, require_gpu
from bench.fp8_quantiser import _time
from common.contract import fp8 as contract
from common.contract.problem import Problem
from common.measure.results import write_rows
from common.measure.timing import tflops

# Each setting: the knob, and knobs of ``fp8_config`` on top of the default configuration. "on+ahead" issues the
# next tile's rotation under a tile's normalisation and O store (``rotate_ahead``); "on+pingpong" staggers the two
# consumer warpgroups (``WarpgroupTurns``), so that one's quantisation at a tile's start can overlap the other's
# GEMMs instead of both leaving the tensor cores idle at once (FP8 runs without ping-pong by default).
SETTINGS: dict[str, tuple[bool, dict]] = {
    "off": (False, {}),
    "on": (True, {}),
    "on+ahead": (True, {"rotate_ahead": True}),
    "on+pingpong": (True, {"pingpong": True}),
}


def _runs(problem: Problem, inputs, cute_fp8, in_kernel: bool, knobs: dict) -> dict:
    """kernel / e2e / quantiser runs of cute/fp8 with the knob set to ``in_kernel`` (at the problem's head dim, which
    ``QUANTISE_Q_HEAD_DIMS`` and ``QUANTISE_Q_CAUSAL_HEAD_DIMS`` may not hold: causal D=64's is timed here) and
    ``knobs`` added to its configuration (all read when each launch is built)."""
    default_config = cute_fp8.fp8_config
    head_dims = cute_fp8.QUANTISE_Q_HEAD_DIMS, cute_fp8.QUANTISE_Q_CAUSAL_HEAD_DIMS
    cute_fp8.QUANTISE_Q_IN_KERNEL = in_kernel
    cute_fp8.QUANTISE_Q_HEAD_DIMS = cute_fp8.QUANTISE_Q_CAUSAL_HEAD_DIMS = (problem.head_dim,)
    cute_fp8.fp8_config = functools.partial(default_config, **knobs)
    try:
        kernel = cute_fp8.prepare(*inputs, problem)
        end_to_end = cute_fp8.prepare_end_to_end(*inputs, problem)
    finally:
        cute_fp8.QUANTISE_Q_IN_KERNEL = False
        cute_fp8.QUANTISE_Q_HEAD_DIMS, cute_fp8.QUANTISE_Q_CAUSAL_HEAD_DIMS = head_dims
        cute_fp8.fp8_config = default_config
    # The kernel-only launch's own quantiser (Q, K, V; K and V only with the knob), timed alone: once per knob
    # value (the other knobs leave it as it is).
    runs = {"kernel": kernel, "e2e": end_to_end}
    if not knobs:
        runs["quantiser"] = lambda: kernel.quantise(*inputs)
    return runs


def case_rows(causal: bool, inputs, args: argparse.Namespace) -> list[dict]:
    from cute_impl import fp8 as cute_fp8
    from cute_impl import hopper

    problem = problem_of(args, causal)
    bf16 = hopper.prepare(*inputs, problem)
    runs = {name: _runs(problem, inputs, cute_fp8, on, knobs) for name, (on, knobs) in SETTINGS.items()}
    reference = runs["off"]["kernel"]().clone()
    same = {name: torch.equal(kinds["kernel"](), reference) for name, kinds in runs.items()}
    samples: dict[tuple[str, str], list[float]] = {("bf16", "kernel"): []}
    for _ in range(args.rounds):
        samples[("bf16", "kernel")].append(_time(bf16, args))
        for name, kinds in runs.items():
            for kind, run in kinds.items():
                samples.setdefault((name, kind), []).append(_time(run, args))
    bf16_tflops = tflops(problem.flops, statistics.median(samples[("bf16", "kernel")]))
    rows = []
    for (name, kind), values in samples.items():
        ms = statistics.median(values)
        row = {"causal": causal, "rung": "cute/hopper" if name == "bf16" else "cute/fp8", "q_in_kernel": name,
               "what": kind, "us": ms * 1e3, "tflops": tflops(problem.flops, ms) if kind != "quantiser" else "",
               "vs_bf16": tflops(problem.flops, ms) / bf16_tflops if kind != "quantiser" else "",
               "spread_us": (max(values) - min(values)) * 1e3, "same_output_as_off": same.get(name, "")}  # fmt: skip
        rows.append(row)
        rate = f"{row['tflops']:.0f} TFLOP/s, {row['vs_bf16']:.3f}x bf16" if kind != "quantiser" else ""
        print(f"causal={causal!s:5s} {row['rung']:11s} q_in_kernel={name:11s} {kind:9s} {row['us']:8.1f} us {rate} "
              f"(spread {row['spread_us']:.1f} us)", flush=True)  # fmt: skip
    return rows


def arguments(doc: str = __doc__, out: str = "runs/fp8_q_in_kernel") -> argparse.Namespace:
    """The command line of this tool (or of the one whose docstring is ``doc``, writing under ``out``)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(out))
    parser.add_argument("--seqlen", type=int, default=8192)
    parser.add_argument("--head-dim", type=int, choices=(64, 128), default=128)
    parser.add_argument("--batch", type=int, help="default: the canonical B·S = 16384")
    parser.add_argument("--heads", type=int, help="default: the canonical H·D = 2048")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup-ms", type=float, default=25)
    parser.add_argument("--rep-ms", type=float, default=150)
    return parser.parse_args()


def problem_of(args: argparse.Namespace, causal: bool = False) -> Problem:
    """The command line's problem: P1 by default, D=64's issue shape with ``--head-dim 64 --batch 4``."""
    return Problem.canonical(args.seqlen, head_dim=args.head_dim, batch=args.batch, heads=args.heads, causal=causal)


def both_masks(
    args: argparse.Namespace, case_rows: Callable[[bool, object, argparse.Namespace], list[dict]]
) -> list[dict]:
    """``case_rows`` causal (the issue's target, should the device call's time run out), then non-causal, on one
    draw of the FA3 inputs (at P1 it takes seconds on the host)."""
    inputs = contract.fa3_inputs(problem_of(args), seed=0, device="cuda")
    return case_rows(True, inputs, args) + case_rows(False, inputs, args)


def interleaved_samples(runs: dict, rounds: int, args: argparse.Namespace) -> dict:
    """key -> each round's time (ms) of ``runs``' run, in ``bench.interleaved``'s order (reversed every other
    round)."""
    return interleaved(runs, rounds, lambda run: _time(run, args))


def cell(value: object, digits: int) -> str:
    """A table cell: a float to ``digits`` places, anything else (an empty cell, a name) as it is."""
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def write(out: Path, stem: str, rows: list[dict], lines: list[str]) -> None:
    """``rows`` to ``stem.csv`` and the table ``lines`` to ``stem.md`` under ``out``; the table printed."""
    out.mkdir(parents=True, exist_ok=True)
    write_rows(out / f"{stem}.csv", rows)
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    args = arguments()
    require_gpu("bench.fp8_q_in_kernel")
    rows = both_masks(args, case_rows)
    lines = [f"# cute/fp8, Q quantised in the kernel, {torch.cuda.get_device_name()} ({problem_of(args).describe()}, "
             f"{args.rounds} rounds)", "",
             "| causal | rung | Q in kernel | what | µs | TFLOP/s | ÷ cute/hopper | spread µs | O = knob off |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in rows:
        tf = f"{row['tflops']:.0f}" if row["tflops"] != "" else ""
        ratio = f"{row['vs_bf16']:.3f}" if row["vs_bf16"] != "" else ""
        lines.append(f"| {row['causal']} | {row['rung']} | {row['q_in_kernel']} | {row['what']} | {row['us']:.1f} | "
                     f"{tf} | {ratio} | {row['spread_us']:.1f} | {row['same_output_as_off']} |")  # fmt: skip
    write(args.out, "fp8_q_in_kernel", rows, lines)


if __name__ == "__main__":
    main()
