"""Where a backward's time goes, kernel by kernel (issue #40), on one GPU:

    python -m bench.backward_kernels --shape 'B8 S2048 causal' --shape 'P1 causal' --out $OUT/kernels

Per (anchor shape, implementation): the forward once with inputs that require grad (as ``bench.backward``
does, through ``common.measure.backward``), three untimed backwards, then ``--calls`` backwards back to back
under ``torch.profiler`` (each kernel's device time and launches, per backward) and the same calls between
two device events (the backward's wall time, gaps between kernels included). Why: the anchors' TFLOP/s say
how far a rung is from FlashAttention-4, not in which kernel; a backward is three to five launches
(preprocess, zeroing a dQ accumulator, dK/dV, dQ pass or postprocess) whose bytes grow with S and whose
main kernel's work grows with S², so at B=8 S=2048 the small kernels weigh four times what they weigh at
P1 (the same B·S). Back-to-back calls with warm L2, not the L2-flushed medians of ``bench.backward``.

``--flush``: each backward after ``common.measure.timing``'s clean L2 flush, the wall the median of each call's own
events, as ``bench.backward`` times it (the flush's kernels left out): whether the flushed medians' gap to the kernels'
sum (cute/hopper against FA4, 2026-12-04: 771 against 745 µs at B8 S2048 causal where the back-to-back kernels are
level) is in the kernels or between them.

``--cute-variant LABEL`` (repeatable) adds rows ``cute/hopper[LABEL]``: that candidate of
``cute_impl/backward/hopper.py`` called directly on cute/hopper's O and LSE (outside autograd), to see which
kernel a knob moves (``bench/cute_bwd_zero_ab.sh``); a label the shape's head dim lacks is left out there.

Writes kernels.csv (shape, impl, kernel, launches and µs per backward) and summary.csv (shape, impl, wall
µs, the kernels' sum, launches), and prints each (shape, implementation)'s kernels, longest first.
"""

from __future__ import annotations

import argparse
import csv
import functools
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.backward import BASELINES, chosen_shapes, problem_of, shape_inputs
from bench.generate_trace import kernel_times, wall_micros
from common.measure.timing import clean_flush

EXIT_MISSING = 2
IMPLS = ("gluon/hopper", "cute/hopper", *BASELINES)
WARMUP_CALLS = 3
NAME_WIDTH = 90


def autograd_backward(shape: tuple, impl: str) -> Callable[[], object]:
    """``impl``'s backward at ``shape`` through autograd, replayable."""
    from common.measure.backward import contender, gradients_of

    return gradients_of(contender(impl, problem_of(shape)), shape_inputs(shape))[1]


def variant_backward(shape: tuple, label: str) -> Callable[[], object] | None:
    """cute/backward/hopper's candidate ``label`` at ``shape`` on cute/hopper's O and LSE (None where the
    shape's head dim has no such candidate)."""
    import torch

    from common.contract.api import attention
    from cute_impl.backward import hopper

    problem = problem_of(shape)
    tiles = next((tiles for tiles in hopper.CANDIDATES[problem.head_dim] if tiles.label == label), None)
    if tiles is None:
        return None
    q, k, v, d_out = shape_inputs(shape)
    with torch.no_grad():
        out, lse = attention(q, k, v, causal=problem.causal, impl="cute/hopper", return_lse=True)
    return lambda: hopper.hopper_gradients(q, k, v, out, lse, d_out, problem, tiles=tiles)


def profile_backward(
    shape: tuple, impl: str, calls: int, backward: Callable[[], object], flush: Callable[[], None] | None = None
) -> tuple[dict, list[dict]]:
    """The summary row and the kernel rows of ``impl``'s ``backward`` at ``shape``; with ``flush``, each call after
    it (the wall the median of each call's own events, the flush's kernels left out by profiling it alone)."""
    for _ in range(WARMUP_CALLS):
        backward()

    def run() -> None:
        for _ in range(calls):
            if flush is not None:
                flush()
            backward()

    wall = wall_micros(run) / calls if flush is None else statistics.median(flushed_walls(backward, flush, calls))
    micros, launches, _host = kernel_times(run)
    if flush is not None:
        flush_micros, flush_launches, _ = kernel_times(lambda: [flush() for _ in range(calls)])
        micros, launches = micros - flush_micros, launches - flush_launches
    label = {"shape": shape[0], "impl": impl}
    kernels = [
        {**label, "kernel": name[:NAME_WIDTH], "launches": launches[name] / calls, "us": us / calls}
        for name, us in sorted(micros.items(), key=lambda item: -item[1])
    ]
    head = {**label, "wall_us": wall, "kernel_us": sum(row["us"] for row in kernels)}
    return head | {"launches": sum(row["launches"] for row in kernels)}, kernels


def flushed_walls(backward: Callable[[], object], flush: Callable[[], None], calls: int) -> list[float]:
    """µs of each of ``calls`` backwards between its own events, each after ``flush``, all queued before one sync
    (as ``common.measure.timing.time_cuda`` times them)."""
    import torch

    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
    for start, stop in events:
        flush()
        start.record()
        backward()
        stop.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(stop) * 1e3 for start, stop in events]


def write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def show(head: dict, kernels: list[dict]) -> None:
    print(
        f"\n{head['shape']} {head['impl']}: wall {head['wall_us']:.1f} µs, kernels {head['kernel_us']:.1f} µs "
        f"in {head['launches']:.0f} launches"
    )
    for row in kernels:
        print(f"  {row['us']:9.1f} µs  x{row['launches']:.0f}  {row['kernel']}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.backward_kernels", description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", help="anchor shapes by name (repeatable; default all)")
    parser.add_argument(
        "--impl",
        action="append",
        help=f"implementations (repeatable; default {', '.join(IMPLS)}, none with --cute-variant)",
    )
    parser.add_argument("--cute-variant", action="append", default=[], help="cute/hopper candidates too (labels)")
    parser.add_argument("--calls", type=int, default=5, help="backwards profiled per row (default 5)")
    parser.add_argument(
        "--flush", action="store_true", help="each backward after time_cuda's clean L2 flush, as bench.backward times"
    )
    parser.add_argument("--out", type=Path, default=Path("runs/backward-kernels"), help="output folder")
    args = parser.parse_args(argv)
    shapes = chosen_shapes(args.shape)
    import torch

    if not torch.cuda.is_available():
        print("bench.backward_kernels: needs a CUDA GPU (the anchors are H200 shapes); none found", file=sys.stderr)
        return EXIT_MISSING
    args.out.mkdir(parents=True, exist_ok=True)
    heads, kernels = [], []
    for shape in shapes:
        impls = args.impl or (() if args.cute_variant else IMPLS)
        rows_of = {impl: functools.partial(autograd_backward, shape, impl) for impl in impls}
        rows_of |= {
            f"cute/hopper[{label}]": functools.partial(variant_backward, shape, label) for label in args.cute_variant
        }
        for impl, make in rows_of.items():
            backward = make()
            if backward is None:
                continue
            flush = clean_flush() if args.flush else None
            head, rows = profile_backward(shape, impl, args.calls, backward, flush)
            show(head, rows)
            heads.append(head)
            kernels.extend(rows)
            torch.cuda.empty_cache()
    write_csv(args.out / "summary.csv", heads)
    write_csv(args.out / "kernels.csv", kernels)
    return 0


if __name__ == "__main__":
    sys.exit(main())
