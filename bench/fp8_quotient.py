"""cute/fp8 with one Markstein correction of each Q value's quotient by its block scale
(``cute_impl.fp8.Q_QUOTIENT_CORRECTIONS`` = 1, the default since this A/B) against 2 (the fused quantiser's), issue
#37: at P1 (B=2 H=16 S=8192 D=128 bf16, FA3 inputs), causal first, then non-causal, in one process, ``--rounds``
interleaved rounds, the order reversed every other round (``fp8_q_in_kernel.interleaved_samples``) (medians; every
timing ``common.measure.timing.time_cuda``: L2 flushed, median): cute/hopper (bf16, the issue's denominator), then
per setting cute/fp8 kernel only and end to end (the K/V quantiser + the kernel per call), and the quantiser alone
once per round. Before any timing, each setting's kernel-only and end-to-end O is checked equal to 2's kernel only
bit for bit (``common/tools/fp8_quotient.py`` proves the quotient the same); one that differs is not timed and the
run exits 1. Writes ``fp8_quotient.csv`` and ``.md`` to ``--out``.

usage (project root, GPU):  python -m bench.fp8_quotient [--out DIR] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from bench import fp8_q_in_kernel, require_gpu
from bench.fp8_q_in_kernel import cell
from common.contract.problem import Problem
from common.measure.timing import tflops

# Setting name -> Q_QUOTIENT_CORRECTIONS; the first is the reference every O is compared with.
SETTINGS = {"2 corrections": 2, "1 correction": 1}
REFERENCE = next(iter(SETTINGS))


def _runs(problem: Problem, inputs) -> dict[tuple[str, str], object]:
    """What one case times, keyed (setting, kind): cute/hopper, the quantiser alone, and per setting cute/fp8's
    kernel only and end to end with the knob set (read when each launch is built)."""
    from cute_impl import fp8, hopper

    runs: dict[tuple[str, str], object] = {("bf16", "kernel"): hopper.prepare(*inputs, problem)}
    default = fp8.Q_QUOTIENT_CORRECTIONS
    for name, corrections in SETTINGS.items():
        fp8.Q_QUOTIENT_CORRECTIONS = corrections
        try:
            runs[(name, "kernel")] = fp8.prepare(*inputs, problem)
            runs[(name, "e2e")] = fp8.prepare_end_to_end(*inputs, problem)
        finally:
            fp8.Q_QUOTIENT_CORRECTIONS = default
        assert runs[(name, "kernel")].config.q_quotient_corrections == corrections
    kernel = runs[(REFERENCE, "kernel")]
    runs[(REFERENCE, "quantiser")] = lambda: kernel.quantise(*inputs)
    return runs


def _differing(runs: dict[tuple[str, str], object]) -> list[tuple[str, str]]:
    """The cute/fp8 runs whose O differs from the reference setting's kernel only (each launched once more after
    NaN-poisoning its O, so an unwritten tile cannot pass)."""
    from common.contract.check import run_poisoned

    reference = runs[(REFERENCE, "kernel")]().clone()
    checked = [key for key in runs if key[0] != "bf16" and key[1] != "quantiser"]
    return [key for key in checked if not torch.equal(run_poisoned(runs[key]), reference)]


def case_rows(causal: bool, inputs, args: argparse.Namespace) -> list[dict]:
    problem = Problem.canonical(args.seqlen, heads=args.heads, causal=causal)
    runs = _runs(problem, inputs)
    differing = _differing(runs)
    for name, kind in differing:
        print(f"causal={causal!s:5s} cute/fp8 {name} {kind}: O differs from 2 corrections', not timed", flush=True)
        del runs[(name, kind)]
    samples = fp8_q_in_kernel.interleaved_samples(runs, args.rounds, args)
    us = {key: statistics.median(values) * 1e3 for key, values in samples.items()}
    rows = []
    for (name, kind), values in samples.items():
        attention = kind != "quantiser"
        row = {"causal": causal, "rung": "cute/hopper" if name == "bf16" else "cute/fp8", "setting": name,
               "what": kind, "us": us[(name, kind)],
               "tflops": tflops(problem.flops, us[(name, kind)] * 1e-3) if attention else "",
               "vs_bf16": us[("bf16", "kernel")] / us[(name, kind)] if attention else "",
               "spread_us": (max(values) - min(values)) * 1e3}  # fmt: skip
        rows.append(row)
        rate = f" {row['tflops']:.0f} TFLOP/s, {row['vs_bf16']:.3f}x bf16" if attention else ""
        print(f"causal={causal!s:5s} {row['rung']:11s} {name:13s} {kind:9s} {row['us']:8.1f} us{rate} "
              f"(spread {row['spread_us']:.1f} us)", flush=True)  # fmt: skip
    return rows + [{"causal": causal, "rung": "cute/fp8", "setting": name, "what": f"{kind}: O differs", "us": "",
                    "tflops": "", "vs_bf16": "", "spread_us": ""} for name, kind in differing]  # fmt: skip


def main() -> None:
    args = fp8_q_in_kernel.arguments(__doc__, "runs/fp8_quotient")
    require_gpu("bench.fp8_quotient")
    rows = fp8_q_in_kernel.both_masks(args, case_rows)
    lines = [f"# cute/fp8, Q quotient corrections, {torch.cuda.get_device_name()} (P1, {args.rounds} rounds)", "",
             "| causal | rung | setting | what | µs | TFLOP/s | ÷ cute/hopper | spread µs |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in rows:
        cells = [row["causal"], row["rung"], row["setting"], row["what"], cell(row["us"], 1),
                 cell(row["tflops"], 0), cell(row["vs_bf16"], 3), cell(row["spread_us"], 1)]  # fmt: skip
        lines.append("| " + " | ".join(str(text) for text in cells) + " |")
    fp8_q_in_kernel.write(args.out, "fp8_quotient", rows, lines)
    # A setting whose O differs was not timed: the run fails, so the A/B cannot be read as a result.
    if any(row["us"] == "" for row in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
