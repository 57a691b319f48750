"""gluon/hopper's persistent CTAs (``triton_impl.gluon.hopper.PERSISTENT``, shared by gluon/fp8) against one CTA per
tile, issue #37: kernel only, gluon/hopper (bf16) and gluon/fp8 (the quantiser outside the timing), at P1 (B=2 H=16
S=8192 D=128) and at D=64 (B=4 H=32 S=8192), causal first, then non-causal, FA3 inputs, in one process,
``--rounds`` interleaved rounds (``fp8_q_in_kernel.interleaved_samples``: the order reversed every other round;
medians; every timing ``common.measure.timing.time_cuda``: L2 flushed). Before any timing each persistent launch's
O is checked equal bit for bit to the switch-off launch's, on NaN-poisoned buffers (the per-tile arithmetic is the
same); one that differs is still timed, its largest difference noted, and the run exits 1. A persistent build the
installed Triton refuses (``_host.PERSISTENT_REFUSED``) is listed as refused, not timed. Writes
``gluon_persistent.csv`` and ``.md`` to ``--out``.

usage (project root, GPU):  python -m bench.gluon_persistent_ab [--out DIR] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from bench import fp8_q_in_kernel, require_gpu
from bench.fp8_q_in_kernel import cell
from common.contract import fp8 as contract
from common.contract.check import run_poisoned
from common.contract.problem import Problem
from common.measure.timing import tflops
from triton_impl.gluon import fp8, hopper

SETTINGS = {"off": False, "persistent": True}
RUNGS = {"gluon/hopper": hopper, "gluon/fp8": fp8}
# (batch, heads, head_dim) at S = --seqlen: P1, and D=64 with B·H four times P1's (three consumers, 192-row tiles).
SHAPES = {"P1 D=128": (2, 16, 128), "D=64": (4, 32, 64)}


def prepared(module, inputs, problem: Problem, persistent: bool):
    """``module``'s kernel-only launch with the switch at ``persistent`` (read when the launch is built)."""
    hopper.PERSISTENT = persistent
    try:
        return module.prepare(*inputs, problem)
    finally:
        hopper.PERSISTENT = False


def case_rows(shape: str, causal: bool, inputs, args: argparse.Namespace) -> list[dict]:
    batch, heads, head_dim = SHAPES[shape]
    problem = Problem(batch, heads, args.seqlen, args.seqlen, head_dim, dtype=torch.bfloat16, causal=causal)
    runs, notes = {}, {}
    for rung, module in RUNGS.items():
        for name, persistent in SETTINGS.items():
            try:
                runs[(rung, name)] = prepared(module, inputs, problem, persistent)
            except ValueError as error:
                notes[(rung, name)] = f"refused: {error}"
        reference = run_poisoned(runs[(rung, "off")]).float()
        if (rung, "persistent") in runs:
            out = run_poisoned(runs[(rung, "persistent")]).float()
            if not torch.equal(out, reference):
                # Still timed (the call is not wasted), but the run fails: the per-tile arithmetic should be the same.
                largest = (out - reference).abs().max().item()
                notes[(rung, "persistent")] = f"O differs from off: max |diff| {largest:.3g}"
    samples = fp8_q_in_kernel.interleaved_samples(runs, args.rounds, args)
    rows = []
    for (rung, name), values in samples.items():
        us = statistics.median(values) * 1e3
        off_us = statistics.median(samples[(rung, "off")]) * 1e3
        row = {"shape": shape, "causal": causal, "rung": rung, "setting": name, "us": us,
               "tflops": tflops(problem.flops, us * 1e-3), "vs_off": off_us / us,
               "spread_us": (max(values) - min(values)) * 1e3, "note": notes.pop((rung, name), "")}  # fmt: skip
        print(f"{shape:8s} causal={causal!s:5s} {rung:12s} {name:10s} {us:8.1f} us {row['tflops']:5.0f} TFLOP/s "
              f"{row['vs_off']:.3f}x off (spread {row['spread_us']:.1f} us)", flush=True)  # fmt: skip
        rows.append(row)
    for (rung, name), note in notes.items():
        print(f"{shape:8s} causal={causal!s:5s} {rung:12s} {name:10s} {note}", flush=True)
        rows.append({"shape": shape, "causal": causal, "rung": rung, "setting": name, "us": "", "tflops": "",
                     "vs_off": "", "spread_us": "", "note": note})  # fmt: skip
    return rows


def main() -> None:
    args = fp8_q_in_kernel.arguments(__doc__, "runs/gluon_persistent")
    require_gpu("bench.gluon_persistent_ab")
    rows = []
    for shape, (batch, heads, head_dim) in SHAPES.items():
        # One draw of the FA3 inputs a shape, for both masks (at these sizes it takes seconds on the host).
        problem = Problem(batch, heads, args.seqlen, args.seqlen, head_dim, dtype=torch.bfloat16)
        inputs = contract.fa3_inputs(problem, seed=0, device="cuda")
        rows += [row for causal in (True, False) for row in case_rows(shape, causal, inputs, args)]
    lines = [f"# gluon persistent CTAs, kernel only, {torch.cuda.get_device_name()} ({args.rounds} rounds)", "",
             "| shape | causal | rung | setting | µs | TFLOP/s | ÷ off | spread µs | note |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in rows:
        cells = [row["shape"], row["causal"], row["rung"], row["setting"], cell(row["us"], 1), cell(row["tflops"], 0),
                 cell(row["vs_off"], 3), cell(row["spread_us"], 1), row["note"]]  # fmt: skip
        lines.append("| " + " | ".join(str(text) for text in cells) + " |")
    fp8_q_in_kernel.write(args.out, "gluon_persistent", rows, lines)
    # A persistent launch whose O differs from the off one's fails the run, so the A/B cannot be read as a result.
    if any(row["note"].startswith("O differs") for row in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
