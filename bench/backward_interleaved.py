"""The backward of several implementations timed in interleaved rounds (issue #40): ``bench.backward`` times its rows
one after another in a fixed order (SDPA cuDNN, SDPA flash, FA4, then the ladder), so on a long shape the last rows run
on a GPU that earlier rows have heated and whose clock has dropped (2026-12-04: at D64 B4 H32 its medians read
cute/hopper 10.94 ms against FA4's 10.52, while each call's own events after a flush read 9.80 against 10.44 with
cute/hopper first). Here each round times every implementation once (``time_cuda``, L2 flushed, median), the order
reversed every other round, and the table gives each one's median over rounds and its ratio to the first, with the
SM clock and temperature nvidia-smi reads after each measurement.

usage (project root, GPU):
    python -m bench.backward_interleaved --impl fa4/sm90 --impl cute/hopper --shape 'B8 S2048 causal' [--rounds 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from bench import interleaved
from bench.backward import chosen_shapes, problem_of, shape_inputs
from common.measure.backward import backward_flops, contender, gradients_of
from common.measure.environment import gpu_clocks
from common.measure.results import write_rows
from common.measure.timing import time_cuda

EXIT_MISSING = 2
IMPLS = ("fa4/sm90", "cute/hopper", "gluon/hopper", "sdpa/cudnn")


def gpu_state() -> str:
    """The SM clock and temperature right after a measurement (nvidia-smi), ``?`` where unreadable: whether a row's
    time moved with the clock is the question these rounds ask."""
    clocks = gpu_clocks()
    if clocks is None:
        return "?"
    return f"{clocks['clocks.sm'].replace(' MHz', '')}MHz/{clocks['temperature.gpu']}C"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--impl", action="append", help=f"implementations, the first the reference (default {', '.join(IMPLS)})"
    )
    parser.add_argument("--shape", action="append", help="anchor shapes by name (repeatable; default all)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--rep-ms", type=float, default=100)
    parser.add_argument("--out", type=Path, default=Path("runs/backward-interleaved"))
    args = parser.parse_args()
    shapes, impls = chosen_shapes(args.shape), args.impl or list(IMPLS)
    import torch

    if not torch.cuda.is_available():
        print("bench.backward_interleaved: needs a CUDA GPU; none found", file=sys.stderr)
        return EXIT_MISSING
    rows = []
    for shape in shapes:
        problem, inputs = problem_of(shape), shape_inputs(shape)
        calls = {impl: gradients_of(contender(impl, problem), inputs)[1] for impl in impls}
        measured = interleaved(
            calls, args.rounds, lambda run: (time_cuda(run, warmup_ms=20, rep_ms=args.rep_ms).ms, gpu_state())
        )
        samples = {impl: [ms for ms, _ in pairs] for impl, pairs in measured.items()}
        reference = statistics.median(samples[impls[0]])
        for impl, values in samples.items():
            ms = statistics.median(values)
            each = " ".join(f"{value:.4f}" for value in values)
            rows.append({"shape": shape[0], "impl": impl, "ms": round(ms, 4),
                         "tflops": round(backward_flops(problem) / ms / 1e9, 1),
                         "speed_vs_first": round(reference / ms, 4), "rounds_ms": each,
                         "rounds_sm_clock_temp": " ".join(state for _, state in measured[impl])})  # fmt: skip
            print(rows[-1], flush=True)
        del calls
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    write_rows(args.out / "backward_interleaved.csv", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
