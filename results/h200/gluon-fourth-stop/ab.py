"""Tree row reductions A/B (issue #20, fourth stop; scratch): the working tree's Gluon kernel against HEAD's
(.gpu/g4/old_device.py), same runner arguments, in one process; smoke on ragged shapes first, then ROUNDS
interleaved rounds in rotated order, median TFLOP/s. Usage: python .gpu/g4/ab.py smoke I N | bench ROUNDS"""

import json
import statistics
import sys

import torch
import triton

sys.path.insert(0, ".gpu/g4")
import old_device
from sweep import judge, runner

from common.contract.check import run_poisoned
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from common.measure.timing import tflops, time_cuda
from triton_impl.gluon import fp8 as gf
from triton_impl.gluon import hopper as gh

ROUNDS = int(sys.argv[2]) if sys.argv[1] == "bench" else 0
SHAPES = {
    "P1": (2, 16, 8192, 128, False),
    "P1c": (2, 16, 8192, 128, True),
    "D64": (4, 32, 8192, 64, False),
    "D64c": (4, 32, 8192, 64, True),
}


def config(rung, p):
    return gf.default_config(p) if rung == "fp8" else gh.DEFAULT_CONFIGS[p.head_dim]


def launcher(rung, q, k, v, p, kernel):
    r = runner(rung, q, k, v, p, config(rung, p))
    if kernel is None:
        return r

    def run():
        kernel[r._grid](*r._args, **r._options)
        return r.out

    return run


VARIANTS = [("new", None), ("old", old_device.attention_kernel)]
CASES = [("fp8", "P1"), ("fp8", "P1c"), ("hopper", "P1"), ("hopper", "P1c"), ("hopper", "D64"), ("hopper", "D64c")]


def smoke(index, count):
    ok = True
    for rung, shape in CASES[index::count]:
        d, causal = SHAPES[shape][3], SHAPES[shape][4]
        for name, kernel in VARIANTS:
            for b, h, sq, sk in ((1, 16, 1008, 1232), (2, 3, 77, 1000), (1, 2, 1, 1)):
                p = Problem(b, h, sq, sk, d, dtype=torch.bfloat16, causal=causal)
                q, k, v = make_inputs(p, seed=sq + sk)
                out = run_poisoned(launcher(rung, q, k, v, p, kernel))
                passed, reason = judge(rung, out, q, k, v, p, config(rung, p))
                if not passed:
                    print(f"smoke FAIL {rung} {name} {p.describe()}: {reason}", flush=True)
                ok &= bool(passed)
    print(f"smoke {'ok' if ok else 'FAILED'} triton {triton.__version__}", flush=True)
    return ok


def bench():
    for rung, shape in CASES:
        b, h, s, d, causal = SHAPES[shape]
        p = Problem(b, h, s, s, d, dtype=torch.bfloat16, causal=causal)
        q, k, v = make_inputs(p, seed=0)
        runs = [(name, launcher(rung, q, k, v, p, kernel)) for name, kernel in VARIANTS]
        for _, run in runs:
            run()
        samples = {name: [] for name, _ in runs}
        for r in range(ROUNDS):
            for name, run in runs[r % 2 :] + runs[: r % 2]:
                samples[name].append(tflops(p.flops, time_cuda(run, warmup_ms=25, rep_ms=200).ms))
        med = {name: statistics.median(xs) for name, xs in samples.items()}
        print(
            json.dumps(
                {
                    "triton": triton.__version__,
                    "rung": rung,
                    "shape": shape,
                    "new": round(med["new"], 1),
                    "old": round(med["old"], 1),
                    "new/old": round(med["new"] / med["old"], 3),
                    "rounds": {n: [round(x, 1) for x in xs] for n, xs in samples.items()},
                }
            ),
            flush=True,
        )
        del runs, q, k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    if sys.argv[1] == "smoke":
        sys.exit(0 if smoke(int(sys.argv[2]), int(sys.argv[3])) else 1)
    bench()
