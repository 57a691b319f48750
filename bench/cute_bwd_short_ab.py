"""cute/backward/hopper's unchained causal D=128 step (``hopper.UNCHAINED_CAUSAL``) against its chained candidates
(``hopper.CHAINED_CAUSAL``: the three launches chained by programmatic dependent launch, then without the dQaccum
fill, then with the postprocess's items last first) and FA4's backward, on short causal rows (issue #40: B8 S2048
causal at 0.973x FA4 on 2026-12-04). Per shape: each cute row's gradients checked against the unchained step's first
(dK and dV bit for bit, dQ within fp32 reduce-add reordering), then ``--rounds`` interleaved rounds (the order
reversed every other round; each measurement ``time_cuda``'s L2-flushed median), the table giving each row's median
over rounds and its speed against FA4 and against the unchained step (their time ÷ the row's). The cute rows run on
cute/hopper's O and LSE (``bench.backward_kernels.variant_backward``), FA4 through autograd as
``bench.backward_interleaved`` times it. Writes ``cute_bwd_short.csv`` and ``.md`` to ``--out``.

usage (project root, GPU, the CuTe DSL and FA4 activated):
    python -m bench.cute_bwd_short_ab [--out DIR] [--rounds 4]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from bench import interleaved, require_gpu
from bench.backward import problem_of, shape_inputs
from bench.backward_kernels import variant_backward
from common.measure.backward import backward_flops, contender, gradients_of
from common.measure.results import write_rows
from common.measure.timing import time_cuda

# (name, batch, heads, seqlen, head_dim, causal), as bench.backward names its anchors.
SHAPES = (
    ("B8 S2048 causal", 8, 16, 2048, 128, True),
    ("B16 H16 S1024 causal", 16, 16, 1024, 128, True),
    ("P1 causal", 2, 16, 8192, 128, True),
)
FA4 = "fa4/sm90"
DQ_TOLERANCE = 1e-2  # |dQ − the unchained dQ| / max |the unchained dQ|: reduce-adds in another order, not a bug


# The switches a row name lists, in the order the candidates add them.
SWITCHES = {"dependent_launch": "pdl", "zero_in_preprocess": "zeropre", "postprocess_reversed": "postrev"}


def cute_rows() -> dict[str, str]:
    """{row name: candidate label}: the unchained causal D=128 step, then each chained candidate named by its switches
    (the last, every switch, the causal D=128 default since 2026-12-04)."""
    from cute_impl.backward import hopper

    rows = {"unchained": hopper.UNCHAINED_CAUSAL.label}
    for tiles in hopper.CHAINED_CAUSAL:
        rows["+".join(short for switch, short in SWITCHES.items() if getattr(tiles, switch))] = tiles.label
    return rows


def check(calls: dict[str, object]) -> dict[str, str]:
    """{row: verdict}: each cute row's (dq, dk, dv) against the unchained step's, dK and dV bit for bit and dQ within
    ``DQ_TOLERANCE`` ("ok"), or what differs (the row is still timed; the GPU tests judge the gradients)."""
    expected = calls["unchained"]()
    verdicts = {}
    for name, call in calls.items():
        if name in ("unchained", FA4):
            continue
        dq, dk, dv = call()
        error = ((dq.float() - expected[0].float()).abs().max() / expected[0].float().abs().max()).item()
        same = torch.equal(dk, expected[1]) and torch.equal(dv, expected[2])
        verdicts[name] = "ok" if same and error < DQ_TOLERANCE else f"DIFFERS (dK, dV equal: {same}; dQ {error:.1e})"
    torch.cuda.synchronize()
    return verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/cute_bwd_short")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--rep-ms", type=float, default=100)
    args = parser.parse_args()
    require_gpu("bench.cute_bwd_short_ab")
    rows = []
    for shape in SHAPES:
        problem = problem_of(shape)
        calls = {name: variant_backward(shape, label) for name, label in cute_rows().items()}
        calls[FA4] = gradients_of(contender(FA4, problem), shape_inputs(shape))[1]
        verdicts = check(calls)
        print(shape[0], verdicts, flush=True)
        samples = interleaved(calls, args.rounds, lambda run: time_cuda(run, warmup_ms=20, rep_ms=args.rep_ms).ms)
        fa4, unchained = statistics.median(samples[FA4]), statistics.median(samples["unchained"])
        for name, values in samples.items():
            ms = statistics.median(values)
            rows.append({"shape": shape[0], "row": name, "us": round(ms * 1e3, 1),
                         "tflops": round(backward_flops(problem) / ms / 1e9, 1), "vs_fa4": round(fa4 / ms, 4),
                         "vs_unchained": round(unchained / ms, 4),
                         "spread_us": round((max(values) - min(values)) * 1e3, 1),
                         "check": verdicts.get(name, "-"),
                         "rounds_us": " ".join(f"{value * 1e3:.1f}" for value in values)})  # fmt: skip
            print(rows[-1], flush=True)
        del calls
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_rows(out / "cute_bwd_short.csv", rows)
    lines = [f"# cute/hopper's causal backward, chained candidates against FA4, {torch.cuda.get_device_name()}", "",
             "| shape | row | µs | TFLOP/s | speed vs FA4 | speed vs unchained | spread µs | check |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    lines += [f"| {r['shape']} | {r['row']} | {r['us']} | {r['tflops']} | {r['vs_fa4']} | {r['vs_unchained']} | "
              f"{r['spread_us']} | {r['check']} |" for r in rows]  # fmt: skip
    (out / "cute_bwd_short.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
