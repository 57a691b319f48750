"""cute/backward/hopper's dQ finished in its dK/dV kernel (``BackwardTiles.dq_finish_in_kernel``, issue #40: no
postprocess launch, each query block's last key block converts its dQ) against the defaults it changes and FA4's
backward. Rows per shape: the head dim's default (causal D=128: ``hopper.CHAINED_CAUSAL[-1]``; D=64:
``DEFAULTS[64, False]``), its finished candidate (``hopper.FINISHED_CAUSAL``, ``hopper.FINISHED_D64``) and FA4. Per
shape: the finished row's gradients checked against the default's first (dK and dV bit for bit, dQ within fp32
reduce-add reordering), then ``--rounds`` interleaved rounds (the order reversed every other round; each measurement
``time_cuda``'s L2-flushed median), the table giving each row's median over rounds and its speed against FA4 and
against the default (their time ÷ the row's). The cute rows run on cute/hopper's O and LSE
(``bench.backward_kernels.variant_backward``), FA4 through autograd as ``bench.backward_interleaved`` times it.
Writes ``cute_bwd_finish.csv`` and ``.md`` to ``--out``.

usage (project root, GPU, the CuTe DSL and FA4 activated):
    python -m bench.cute_bwd_finish_ab [--out DIR] [--rounds 4]
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
    ("D64 B4 H32", 4, 32, 8192, 64, False),
)
FA4 = "fa4/sm90"
DQ_TOLERANCE = 1e-2  # |dQ − the default's dQ| / max |the default's dQ|: reduce-adds in another order, not a bug


def cute_rows(head_dim: int) -> dict[str, str]:
    """{row name: candidate label} at ``head_dim``: the default the switch changes, then the finished candidate."""
    from cute_impl.backward import hopper

    if head_dim == 64:
        return {"default": hopper.DEFAULTS[64, False].label, "finish": hopper.FINISHED_D64.label}
    return {"default": hopper.CHAINED_CAUSAL[-1].label, "finish": hopper.FINISHED_CAUSAL.label}


def check(calls: dict[str, object]) -> dict[str, str]:
    """{row: verdict}: the finished row's (dq, dk, dv) against the default's, dK and dV bit for bit and dQ within
    ``DQ_TOLERANCE`` ("ok"), or what differs (the row is still timed; the GPU tests judge the gradients)."""
    expected = calls["default"]()
    dq, dk, dv = calls["finish"]()
    error = ((dq.float() - expected[0].float()).abs().max() / expected[0].float().abs().max()).item()
    same = torch.equal(dk, expected[1]) and torch.equal(dv, expected[2])
    finite = bool(torch.isfinite(dq).all())
    verdict = "ok" if same and finite and error < DQ_TOLERANCE else f"DIFFERS (dK, dV equal: {same}; dQ {error:.1e})"
    torch.cuda.synchronize()
    return {"finish": verdict}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/cute_bwd_finish")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--rep-ms", type=float, default=100)
    args = parser.parse_args()
    require_gpu("bench.cute_bwd_finish_ab")
    rows = []
    for shape in SHAPES:
        problem = problem_of(shape)
        calls = {name: variant_backward(shape, label) for name, label in cute_rows(shape[4]).items()}
        calls[FA4] = gradients_of(contender(FA4, problem), shape_inputs(shape))[1]
        verdicts = check(calls)
        print(shape[0], verdicts, flush=True)
        samples = interleaved(calls, args.rounds, lambda run: time_cuda(run, warmup_ms=20, rep_ms=args.rep_ms).ms)
        fa4, default = statistics.median(samples[FA4]), statistics.median(samples["default"])
        for name, values in samples.items():
            ms = statistics.median(values)
            rows.append({"shape": shape[0], "row": name, "us": round(ms * 1e3, 1),
                         "tflops": round(backward_flops(problem) / ms / 1e9, 1), "vs_fa4": round(fa4 / ms, 4),
                         "vs_default": round(default / ms, 4),
                         "spread_us": round((max(values) - min(values)) * 1e3, 1),
                         "check": verdicts.get(name, "-"),
                         "rounds_us": " ".join(f"{value * 1e3:.1f}" for value in values)})  # fmt: skip
            print(rows[-1], flush=True)
        del calls
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_rows(out / "cute_bwd_finish.csv", rows)
    lines = [f"# cute/hopper's backward, dQ finished in the dK/dV kernel against the default and FA4, "
             f"{torch.cuda.get_device_name()}", "",
             "| shape | row | µs | TFLOP/s | speed vs FA4 | speed vs default | spread µs | check |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    lines += [f"| {r['shape']} | {r['row']} | {r['us']} | {r['tflops']} | {r['vs_fa4']} | {r['vs_default']} | "
              f"{r['spread_us']} | {r['check']} |" for r in rows]  # fmt: skip
    (out / "cute_bwd_finish.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
