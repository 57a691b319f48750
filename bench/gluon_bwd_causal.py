"""gluon/backward/hopper's variants against a baseline, in one process on one GPU (issue #40). ``--set causal``
(the default): the causal knobs against the same tiles without them, ``consumer_ranges`` (each consumer
warpgroup its own block range: the steps its half of the diagonal sees nothing in are skipped) and
``limit_mask`` (the masked steps compare each value once against its row's limit; the dQ pass masks P after
the exp), alone and together (``triton_impl/gluon/backward_ranges.py``). ``--set d64``: D=64's default against
its 128-query-row dK/dV step (``late_dv``, ``triton_impl/gluon/backward_late_dv.py``), its 128-key dQ pass,
and both, at the D=64 anchor causal and not.

Per shape (P1 causal, B=8 S=2048 causal, P1 non-causal as the control): q, k, v and dO seeded, O and the LSE
from gluon/hopper; each variant's dQ, dK and dV first compared with the knob-less tiles' (the largest relative L2
distance of the three: the causal knobs change no product, only the rounding of S · scale − LSE₂ in the dQ steps
no longer masked before the exp; D=64's change the products' shapes and dPᵀ − D's summation order; all far below
cuDNN's 3e-3 from the baseline); then ``--rounds`` rounds, each
timing FA4's backward (through autograd, as ``bench.backward``) and every variant in turn (device events, L2
flushed, median): a drift of the GPU's speed over the run reaches every variant alike. Backward TFLOP/s count
2.5 × the forward's FLOPs, halved causal. Writes ``ab.csv`` (one row per shape, variant and round) and prints
a table last: the median over rounds, × FA4 and × the baseline (the set's first variant: for ``causal`` the
knob-less tiles, D=128's default before the knobs were measured; for ``d64`` D=64's default).

    python -m bench.gluon_bwd_causal --out $OUT/ab [--set causal|d64] [--rounds 3] [--budget-s 100] [--shape NAME ...]
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
# ALL_CANDIDATES[64]'s labels: D=64's default first, then the 128-row dK/dV step, the 128-key dQ pass, both.
D64_VARIANTS = (
    "dkdv 128x64 s2, dq 128x64 s2 tma_rows",
    "dkdv 128x128 s2, dq 128x64 s2 tma_rows late_dv",
    "dkdv 128x64 s2, dq 128x128 s2 tma_rows",
    "dkdv 128x128 s2, dq 128x128 s2 tma_rows late_dv",
)
D64_CAUSAL = ("D64 B4 H32 causal", 4, 32, 8192, 64, True)
# --set: (head dim, labels with the baseline first, shapes by name).
AB_SETS = {
    "causal": (128, VARIANTS, AB_SHAPES),
    "d64": (64, D64_VARIANTS, ("D64 B4 H32", D64_CAUSAL[0])),
}
# Shorter than time_cuda's defaults: the rounds, not one long timing, even out drift.
WARMUP_MS, REP_MS = 50, 300


def _variants(head_dim: int, labels: tuple[str, ...] = VARIANTS) -> dict[str, object]:
    from triton_impl.gluon import backward as gluon_backward

    pool = gluon_backward.ALL_CANDIDATES[head_dim]
    return {label: next(tiles for tiles in pool if tiles.label == label) for label in labels}


def run_shape(
    shape: tuple, rounds: int, writer: csv.DictWriter, deadline: float, labels: tuple[str, ...] = VARIANTS
) -> list[dict]:
    """Check each variant's gradients against the baseline's (``labels``' first), then time FA4 and the variants
    ``rounds`` times (after the first, only while ``time.monotonic()`` is before ``deadline``)."""
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
    variants = _variants(problem.head_dim, labels)

    def backward(tiles):
        return lambda: hopper_gradients(q, k, v, out, lse, d_out, problem, tiles=tiles)

    reference = backward(variants[labels[0]])()
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
                   "distance_vs_baseline": differences[label]}  # fmt: skip
            writer.writerow(row)
            rows.append(row)
            print(" | ".join(f"{value:.4g}" if isinstance(value, float) else str(value) for value in row.values()),
                  flush=True)  # fmt: skip
        torch.cuda.empty_cache()
    return rows


def print_table(rows: list[dict], baseline: str = VARIANTS[0]) -> None:
    """Median TFLOP/s over rounds per (shape, variant), × FA4 and × the baseline, and the gradients' distance."""
    print(f"\n{'shape':18s} {'variant':48s} {'TFLOP/s':>8s} {'x FA4':>6s} {'x base':>7s} {'dist base':>11s}")
    for shape in dict.fromkeys(row["shape"] for row in rows):
        mine = [row for row in rows if row["shape"] == shape]
        fa4 = statistics.median(row["fa4_tflops"] for row in mine)
        medians = {}
        for label in dict.fromkeys(row["variant"] for row in mine):
            chosen = [row for row in mine if row["variant"] == label]
            medians[label] = (statistics.median(row["bwd_tflops"] for row in chosen), chosen[0])
        print(f"{shape:18s} {'FA4 sm90':48s} {fa4:8.1f}")
        for label, (tflops, row) in medians.items():
            name = "baseline" if label == baseline else label.split("heaviest_first ")[-1]
            print(f"{shape:18s} {name:48s} {tflops:8.1f} {tflops / fa4:6.3f} {tflops / medians[baseline][0]:7.3f} "
                  f"{row['distance_vs_baseline']:11.3g}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/gluon_bwd_causal"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=100.0, help="rounds after the first stop past this")
    parser.add_argument("--set", choices=tuple(AB_SETS), default="causal", help="which variants and shapes")
    parser.add_argument("--shape", action="append", help="anchor shapes by name (default: the set's)")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench.gluon_bwd_causal needs a CUDA GPU (Hopper); none is visible", file=sys.stderr)
        return 2
    head_dim, labels, set_shapes = AB_SETS[args.set]
    names = args.shape or list(set_shapes)
    known = (*SHAPES, D64_CAUSAL)
    args.out.mkdir(parents=True, exist_ok=True)
    rows, deadline = [], time.monotonic() + args.budget_s
    with (args.out / "ab.csv").open("w", newline="") as handle:
        fields = ("shape", "variant", "round", "bwd_ms", "bwd_tflops", "fa4_tflops", "distance_vs_baseline")
        writer = csv.DictWriter(handle, fields)
        writer.writeheader()
        for name in names:
            shape = next(shape for shape in known if shape[0] == name)
            assert shape[4] == head_dim, f"--set {args.set} times D={head_dim}, {name} is D={shape[4]}"
            rows += run_shape(shape, args.rounds, writer, deadline, labels)
            handle.flush()
    print_table(rows, labels[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
