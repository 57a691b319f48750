"""The machinery of the cute/hopper backward candidates' A/B (``bench.cute_bwd_short_ab``): per shape, each cute
row's gradients checked against a base row's first (dK and dV bit for bit, dQ finite and within fp32 reduce-add
reordering), then ``--rounds`` interleaved rounds (the order reversed every other round; each measurement
``time_cuda``'s L2-flushed median) of the cute rows and FA4's backward, the table giving each row's median over rounds
and its speed against FA4 and against the base (their time ÷ the row's). The cute rows run on cute/hopper's O and LSE
(``bench.backward_kernels.variant_backward``), FA4 through autograd as ``bench.backward_interleaved`` times it. Not a
tool of its own: the A/B names its shapes and rows and calls :func:`main`."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path

import torch

from bench import interleaved, require_gpu
from bench.backward import problem_of, shape_inputs
from bench.backward_kernels import variant_backward
from common.measure.backward import backward_flops, contender, gradients_of
from common.measure.results import write_rows
from common.measure.timing import time_cuda

# A shape: (name, batch, heads, seqlen, head_dim, causal), as bench.backward names its anchors.
Shape = tuple[str, int, int, int, int, bool]
FA4 = "fa4/sm90"
DQ_TOLERANCE = 1e-2  # |dQ − the base's dQ| / max |the base's dQ|: reduce-adds in another order, not a bug


def check(calls: dict[str, Callable], base: str) -> dict[str, str]:
    """{row: verdict}: each cute row's (dq, dk, dv) against ``base``'s, dK and dV bit for bit and dQ finite and within
    ``DQ_TOLERANCE`` ("ok"), or what differs (the row is still timed; the GPU tests judge the gradients)."""
    expected = calls[base]()
    verdicts = {}
    for name, call in calls.items():
        if name in (base, FA4):
            continue
        dq, dk, dv = call()
        error = ((dq.float() - expected[0].float()).abs().max() / expected[0].float().abs().max()).item()
        same = torch.equal(dk, expected[1]) and torch.equal(dv, expected[2])
        finite = bool(torch.isfinite(dq).all())
        ok = same and finite and error < DQ_TOLERANCE
        verdicts[name] = "ok" if ok else f"DIFFERS (dK, dV equal: {same}; dQ finite: {finite}, {error:.1e})"
    torch.cuda.synchronize()
    return verdicts


def shape_rows(shape: Shape, cute_rows: dict[str, str], base: str, args: argparse.Namespace) -> list[dict]:
    """One shape's rows: the cute rows ({row name: candidate label}) and FA4, checked, then timed in rounds."""
    problem = problem_of(shape)
    calls = {name: variant_backward(shape, label) for name, label in cute_rows.items()}
    calls[FA4] = gradients_of(contender(FA4, problem), shape_inputs(shape))[1]
    verdicts = check(calls, base)
    print(shape[0], verdicts, flush=True)
    samples = interleaved(calls, args.rounds, lambda run: time_cuda(run, warmup_ms=20, rep_ms=args.rep_ms).ms)
    fa4, base_ms = statistics.median(samples[FA4]), statistics.median(samples[base])
    rows = []
    for name, values in samples.items():
        ms = statistics.median(values)
        rows.append({"shape": shape[0], "row": name, "us": round(ms * 1e3, 1),
                     "tflops": round(backward_flops(problem) / ms / 1e9, 1), "vs_fa4": round(fa4 / ms, 4),
                     f"vs_{base}": round(base_ms / ms, 4), "spread_us": round((max(values) - min(values)) * 1e3, 1),
                     "check": verdicts.get(name, "-"),
                     "rounds_us": " ".join(f"{value * 1e3:.1f}" for value in values)})  # fmt: skip
        print(rows[-1], flush=True)
    del calls
    torch.cuda.empty_cache()
    return rows


def main(
    tool: str, shapes: tuple[Shape, ...], rows_of: Callable[[Shape], dict[str, str]], base: str, title: str,
    description: str,
) -> None:  # fmt: skip
    """The A/B ``tool`` (``bench.NAME``: its default ``--out`` runs/NAME, its files NAME.csv and NAME.md): each shape's
    rows (``rows_of(shape)``, ``base`` among them) checked and timed, the table under ``title``."""
    name = tool.removeprefix("bench.").removesuffix("_ab")
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=f"runs/{name}")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--rep-ms", type=float, default=100)
    args = parser.parse_args()
    require_gpu(tool)
    rows = [row for shape in shapes for row in shape_rows(shape, rows_of(shape), base, args)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_rows(out / f"{name}.csv", rows)
    lines = [f"# {title}, {torch.cuda.get_device_name()}", "",
             f"| shape | row | µs | TFLOP/s | speed vs FA4 | speed vs {base} | spread µs | check |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    lines += [f"| {r['shape']} | {r['row']} | {r['us']} | {r['tflops']} | {r['vs_fa4']} | {r[f'vs_{base}']} | "
              f"{r['spread_us']} | {r['check']} |" for r in rows]  # fmt: skip
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
