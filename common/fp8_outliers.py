"""FP8 error with and without incoherent processing, on inputs with injected outliers (a GPU tool).

python -m common.fp8_outliers --out results/h200/fp8-outliers.md

For each input kind (standard-normal Q, K, V; the same with ``common.fp8.with_outliers`` applied to
Q and K) and mask, it reports the rel L2 error of ``cute/fp8`` with plain and with Hadamard-rotated
Q, K, next to the floor that e4m3 rounding of the inputs alone sets (``input_rounding_error``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from common.check import run_poisoned
from common.fp8 import OUTLIER_FRACTION, OUTLIER_MAGNITUDE, input_rounding_error, random_hadamard, with_outliers
from common.inputs import make_inputs
from common.metrics import error_stats
from common.problem import Problem
from common.reference import reference_attention

ROTATION_SEED = 0


def inputs(problem: Problem, outliers: bool, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v = make_inputs(problem, seed=seed, device="cuda")
    if outliers:
        q, k = with_outliers(q, seed + 1), with_outliers(k, seed + 2)
    return q, k, v


def error_row(problem: Problem, outliers: bool, seed: int) -> str:
    from cute_impl import fp8

    q, k, v = inputs(problem, outliers, seed)
    ref = reference_attention(q, k, v, problem)
    rotation = random_hadamard(problem.head_dim, ROTATION_SEED, q.device)
    plain = error_stats(run_poisoned(fp8.prepare(q, k, v, problem)), ref).rel_l2_err
    rotated = error_stats(run_poisoned(fp8.prepare_incoherent(q, k, v, problem, ROTATION_SEED)), ref).rel_l2_err
    floor_plain = input_rounding_error(q, k, v, problem)
    floor_rotated = input_rounding_error(q, k, v, problem, rotation=rotation)
    kind = f"outliers ({OUTLIER_FRACTION:g} of Q, K x {OUTLIER_MAGNITUDE:g})" if outliers else "standard normal"
    mask = "causal" if problem.causal else "full"
    cells = (plain, rotated, floor_plain, floor_rotated)
    return f"| {kind} | {mask} | " + " | ".join(f"{value:.2e}" for value in cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seqlen", type=int, default=2048)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    lines = [
        "# cute/fp8: incoherent processing on inputs with outliers",
        "",
        f"B=2 H=4 S={args.seqlen} D=128, bf16 inputs, rel L2 against the fp64 reference of the unquantised",
        "inputs. Floor: exact attention on the e4m3-rounded (per-tensor) Q, K, V.",
        "",
        "| inputs | mask | cute/fp8 | cute/fp8 + Hadamard | floor | floor + Hadamard |",
        "|---|---|---|---|---|---|",
    ]
    for outliers in (False, True):
        for causal in (False, True):
            problem = Problem(2, 4, args.seqlen, args.seqlen, 128, dtype=torch.bfloat16, causal=causal)
            lines.append(error_row(problem, outliers, seed=11))
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out is not None:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
