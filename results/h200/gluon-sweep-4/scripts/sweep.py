"""Gluon config sweep (issue #20, fourth stop; scratch). `python .gpu/g4/sweep.py smoke I N` judges candidates I::N
(ragged shapes: B=1 H=16 Sq=1008 Sk=1232, the timed binary's specialisation, and B=2 H=3 Sq=77 Sk=1000; poisoned
output, fp64 reference, SDPA yardstick / FP8 emulation rule) and fills the Triton cache; `python .gpu/g4/sweep.py
bench ROUNDS FILTER` times the candidates whose label contains FILTER, interleaved rounds, median TFLOP/s."""

import json
import statistics
import sys

import torch
import triton

sys.path.insert(0, ".gpu/g4")
from cands import CANDS

from common.contract.check import run_poisoned, sdpa_error
from common.contract.fp8 import KernelOrder
from common.contract.fp8 import emulate as emulate_quantised
from common.contract.inputs import make_inputs
from common.contract.metrics import FP8_RULE, emulation_stats, error_stats
from common.contract.problem import Problem
from common.contract.reference import reference_attention
from common.contract.registry import get
from common.measure.timing import tflops, time_cuda
from triton_impl.gluon import fp8 as gf
from triton_impl.gluon import hopper as gh


def runner(rung, q, k, v, p, cfg):
    if rung == "fp8":
        return gf.GluonFp8Attention(gf._quantised(q, k, v, gf.DEFAULT_QUANTISATION), p, cfg)
    return gh.GluonAttention(q, k, v, p, cfg)


def judge(rung, out, q, k, v, p, cfg):
    ref = reference_attention(q, k, v, p)
    yard = sdpa_error(q, k, v, p, ref)
    err = error_stats(out, ref)
    if rung == "fp8":
        ops = gf._quantised(q, k, v, gf.DEFAULT_QUANTISATION)
        em = emulate_quantised(ops, p, KernelOrder(block_n=cfg.block_n, reverse=False))
        return FP8_RULE.judge(err, yard, emulation_stats(out, em.out, em.bound, ref))
    return get("gluon/hopper").error_rule.judge(err, yard, None)


def smoke(index, count):
    ok = True
    for label, rung, (_b, _h, _s, d, causal), cfg in CANDS[index::count]:
        for b, h, sq, sk in ((1, 16, 1008, 1232), (2, 3, 77, 1000)):
            p = Problem(b, h, sq, sk, d, dtype=torch.bfloat16, causal=causal)
            q, k, v = make_inputs(p, seed=sq + sk)
            out = run_poisoned(runner(rung, q, k, v, p, cfg))
            passed, reason = judge(rung, out, q, k, v, p, cfg)
            print(
                json.dumps(
                    {
                        "triton": triton.__version__,
                        "smoke": label,
                        "shape": p.describe(),
                        "ok": bool(passed),
                        "reason": reason,
                    }
                ),
                flush=True,
            )
            ok &= bool(passed)
    return ok


def bench(rounds, wanted):
    groups = {}
    for label, rung, shape, cfg in CANDS:
        if wanted in label:
            groups.setdefault(shape, []).append((label, rung, cfg))
    for (b, h, s, d, causal), variants in groups.items():
        p = Problem(b, h, s, s, d, dtype=torch.bfloat16, causal=causal)
        q, k, v = make_inputs(p, seed=0)
        runs = [(label, runner(rung, q, k, v, p, cfg)) for label, rung, cfg in variants]
        for _, run in runs:
            run()
        samples = {label: [] for label, _ in runs}
        for r in range(rounds):
            order = runs[r % len(runs) :] + runs[: r % len(runs)]
            for label, run in order:
                samples[label].append(tflops(p.flops, time_cuda(run, warmup_ms=25, rep_ms=200).ms))
        for label, _ in runs:
            xs = samples[label]
            print(
                json.dumps(
                    {
                        "triton": triton.__version__,
                        "label": label,
                        "median": round(statistics.median(xs), 1),
                        "rounds": [round(x, 1) for x in xs],
                    }
                ),
                flush=True,
            )
        del runs, q, k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    if sys.argv[1] == "smoke":
        sys.exit(0 if smoke(int(sys.argv[2]), int(sys.argv[3])) else 1)
    bench(int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "")
