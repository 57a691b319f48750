"""gluon/backward/hopper's causal knobs against the same tiles without them, in one process on one GPU (issue #40):
``consumer_ranges`` (each consumer warpgroup its own block range: the steps its half of the diagonal sees
nothing in are skipped) and ``limit_mask`` (the masked steps compare each value once against its row's
limit; the dQ pass masks P after the exp), alone and together (``triton_impl/gluon/backward_ranges.py``).

Per shape (P1 causal, B=8 S=2048 causal, P1 non-causal as the control): q, k, v and dO seeded, O and the LSE
from gluon/hopper; each variant's dQ, dK and dV first compared with the knob-less tiles' (the largest relative L2
distance of the three: the knobs change no product, only the rounding of S · scale − LSE₂ in the dQ steps no
longer masked before the exp, so far below cuDNN's 3e-3 from the knob-less tiles); then ``--rounds`` rounds, each
timing FA4's backward (through autograd, as ``bench.backward``) and every variant in turn (device events, L2
flushed, median): a drift of the GPU's speed over the run reaches every variant alike. Backward TFLOP/s count
2.5 × the forward's FLOPs, halved causal. Writes ``ab.csv`` (one row per shape, variant and round) and prints
a table last: the median over rounds, × FA4 and × the knob-less tiles (D=128's default before the knobs were measured).

    python -m bench.gluon_bwd_causal --out $OUT/ab [--rounds 3] [--budget-s 100] [--shape "P1 causal" ...]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

from bench.backward import FA4, SHAPES, autograd_row, problem_of, shape_inputs

# The labels of ``triton_impl/gluon/backward.py``'s ALL_CANDIDATES[128] under A/B, the knob-less tiles first;
# both knobs together are D=128's default.
VARIANTS = (
    "dkdv 128x32 s3, dq 128x64 s3 overlap tma_rows heaviest_first",
    "dkdv 128x32 s3, dq 128x64 s3 overlap tma_rows heaviest_first consumer_ranges limit_mask",
    "dkdv 128x32 s3, dq 128x64 s3 overlap tma_rows heaviest_first consumer_ranges",
    "dkdv 128x32 s3, dq 128x64 s3 overlap tma_rows heaviest_first limit_mask",
)
AB_SHAPES = ("P1 causal", "B8 S2048 causal", "P1")
# Shorter than time_cuda's defaults: the rounds, not one long timing, even out drift.
WARMUP_MS, REP_MS = 50, 300


def _variants(head_dim: int) -> dict[str, object]:
    from triton_impl.gluon import backward as gluon_backward

    pool = gluon_backward.ALL_CANDIDATES[head_dim]
    return {label: next(tiles for tiles in pool if tiles.label == label) for label in VARIANTS}


def run_shape(shape: tuple, rounds: int, writer: csv.DictWriter, deadline: float) -> list[dict]:
    """Check each variant's gradients against the knob-less tiles', then time FA4 and the variants ``rounds`` times
    (after the first, only while ``time.monotonic()`` is before ``deadline``)."""
    import torch

    from common.contract.api import attention
    from common.measure.backward import backward_flops, relative_distance
    from common.measure.timing import time_cuda
    from triton_impl.gluon.backward import hopper_gradients

    problem = problem_of(shape)
    inputs = shape_inputs(shape)
    q, k, v, d_out = inputs
    with torch.no_grad():
        out, lse = attention(q, k, v, causal=problem.causal, impl="gluon/hopper", return_lse=True)
    variants = _variants(problem.head_dim)

    def backward(tiles):
        return lambda: hopper_gradients(q, k, v, out, lse, d_out, problem, tiles=tiles)

    reference = backward(variants[VARIANTS[0]])()
    differences = {}
    for label, tiles in variants.items():
        grads = backward(tiles)()
        differences[label] = max(map(relative_distance, grads, reference))
    rows = []
    for round_ in range(rounds):
        if round_ and time.monotonic() > deadline:
            print(f"{shape[0]}: round {round_ + 1} left out, past --budget-s", flush=True)
            break
        try:
            fa4 = autograd_row(shape, FA4, inputs, None, {})()["bwd_tflops"]
        except Exception as error:  # noqa: BLE001 - FA4 absent: its ratio is left out
            print(f"{shape[0]}: FA4 not timed ({type(error).__name__}: {error})"[:160], flush=True)
            fa4 = float("nan")
        for label, tiles in variants.items():
            ms = time_cuda(backward(tiles), warmup_ms=WARMUP_MS, rep_ms=REP_MS).ms
            row = {"shape": shape[0], "variant": label, "round": round_, "bwd_ms": ms,
                   "bwd_tflops": backward_flops(problem) / ms / 1e9, "fa4_tflops": fa4,
                   "distance_vs_no_knobs": differences[label]}  # fmt: skip
            writer.writerow(row)
            rows.append(row)
            print(" | ".join(f"{value:.4g}" if isinstance(value, float) else str(value) for value in row.values()),
                  flush=True)  # fmt: skip
        torch.cuda.empty_cache()
    return rows


def print_table(rows: list[dict]) -> None:
    """Median TFLOP/s over rounds per (shape, variant), × FA4 and × the knob-less tiles, and the gradients' distance."""
    print(f"\n{'shape':16s} {'variant':28s} {'TFLOP/s':>8s} {'x FA4':>6s} {'x none':>7s} {'dist none':>11s}")
    for shape in dict.fromkeys(row["shape"] for row in rows):
        mine = [row for row in rows if row["shape"] == shape]
        fa4 = statistics.median(row["fa4_tflops"] for row in mine)
        medians = {}
        for label in dict.fromkeys(row["variant"] for row in mine):
            chosen = [row for row in mine if row["variant"] == label]
            medians[label] = (statistics.median(row["bwd_tflops"] for row in chosen), chosen[0])
        print(f"{shape:16s} {'FA4 sm90':28s} {fa4:8.1f}")
        for label, (tflops, row) in medians.items():
            name = "no knobs" if label == VARIANTS[0] else label.split("heaviest_first ")[-1]
            print(f"{shape:16s} {name:28s} {tflops:8.1f} {tflops / fa4:6.3f} {tflops / medians[VARIANTS[0]][0]:7.3f} "
                  f"{row['distance_vs_no_knobs']:11.3g}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/gluon_bwd_causal"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=100.0, help="rounds after the first stop past this")
    parser.add_argument("--shape", action="append", help=f"anchor shapes by name (default {AB_SHAPES})")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench.gluon_bwd_causal needs a CUDA GPU (Hopper); none is visible", file=sys.stderr)
        return 2
    names = args.shape or list(AB_SHAPES)
    args.out.mkdir(parents=True, exist_ok=True)
    rows, deadline = [], time.monotonic() + args.budget_s
    with (args.out / "ab.csv").open("w", newline="") as handle:
        fields = ("shape", "variant", "round", "bwd_ms", "bwd_tflops", "fa4_tflops", "distance_vs_no_knobs")
        writer = csv.DictWriter(handle, fields)
        writer.writeheader()
        for name in names:
            rows += run_shape(next(shape for shape in SHAPES if shape[0] == name), args.rounds, writer, deadline)
            handle.flush()
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
