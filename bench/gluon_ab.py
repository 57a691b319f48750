"""Gluon kernel A/B: this tree's ``attention_kernel`` against an older one, same runner arguments, one process.

The older kernel is a copy of an earlier ``triton_impl/gluon/_device.py``, for example::

    git show 83d0751:triton_impl/gluon/_device.py > /tmp/old_device.py

Both kernels are launched with the descriptors and constexprs the current host code builds
(``GluonAttention`` / ``GluonFp8Attention``), so the copy must take the same arguments. Case sets
(``--cases``):

- ``fence``: issue #20's third stop, the fenced kernel with the FP8 FFMA fold against 83d0751, plus
  the FP8 configurations then considered (``results/h200/gluon-20/bench_triton3{6,9}.log``);
- ``row-tree``: the fourth stop's tree row reductions against the kernel before them, at each rung's
  default configuration (``results/h200/gluon-fourth-stop/row-tree-ab-*.log``).

Usage (project root; ``bash bench/smoke_then_bench.sh bench.gluon_ab ROUNDS --old-kernel ... --cases ...``
runs both steps in one device call):

    python -m bench.gluon_ab smoke I N --old-kernel /tmp/old_device.py [--cases row-tree]
    python -m bench.gluon_ab bench ROUNDS --old-kernel /tmp/old_device.py [--cases row-tree]

``smoke`` judges cases I::N of both kernels on ragged shapes (poisoned output, fp64 reference, the
rung's rule); ``bench`` times every variant in ROUNDS interleaved rounds in rotated order (median TFLOP/s).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys

import torch
import triton

from bench import require_gpu
from bench.gluon_sweep import SHAPES, judge, runner
from common.contract.problem import Problem
from triton_impl.gluon import fp8 as gf
from triton_impl.gluon import hopper as gh
from triton_impl.gluon.hopper import GluonConfig as C

SMOKE_SHAPES = ((1, 16, 1008, 1232), (2, 3, 77, 1000), (1, 2, 1, 1))


def default_config(rung: str, shape: str) -> C:
    b, h, s, d, causal = SHAPES[shape]
    problem = Problem(b, h, s, s, d, causal=causal)
    return gf.default_config(problem) if rung == "fp8" else gh.DEFAULT_CONFIGS[d]


def _cases_row_tree() -> list[tuple]:
    """(label, rung, shape, config, kernel) with kernel "new" or "old"."""
    pairs = [("fp8", "P1"), ("fp8", "P1c"), ("hopper", "P1"), ("hopper", "P1c"), ("hopper", "D64"), ("hopper", "D64c")]
    return [
        (f"{rung} {shape} {kernel}", rung, shape, default_config(rung, shape), kernel)
        for rung, shape in pairs
        for kernel in ("new", "old")
    ]


def _cases_fence() -> list[tuple]:
    fp8_p1, fp8_p1c = default_config("fp8", "P1"), default_config("fp8", "P1c")
    return [
        ("fp8 P1 default new", "fp8", "P1", fp8_p1, "new"),
        ("fp8 P1 default old", "fp8", "P1", fp8_p1, "old"),
        ("fp8 P1 128,2 pingpong new", "fp8", "P1", C(128, 2, pingpong=True), "new"),
        ("fp8 P1 128,2 new", "fp8", "P1", C(128, 2), "new"),
        ("fp8 P1c default new", "fp8", "P1c", fp8_p1c, "new"),
        ("fp8 P1c default old", "fp8", "P1c", fp8_p1c, "old"),
        ("fp8 P1c 128,2 new", "fp8", "P1c", C(128, 2), "new"),
        ("fp8 P1c 128,3 new", "fp8", "P1c", C(128, 3), "new"),
        ("hopper D64 default new", "hopper", "D64", default_config("hopper", "D64"), "new"),
        ("hopper D64 default old", "hopper", "D64", default_config("hopper", "D64"), "old"),
        ("hopper P1 default new", "hopper", "P1", default_config("hopper", "P1"), "new"),
        ("hopper P1 default old", "hopper", "P1", default_config("hopper", "P1"), "old"),
    ]


CASE_SETS = {"row-tree": _cases_row_tree, "fence": _cases_fence}


def load_kernel(path: str):
    """``attention_kernel`` of a Gluon device module copied to ``path``."""
    spec = importlib.util.spec_from_file_location("old_gluon_device", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.attention_kernel


def launcher(rung: str, q, k, v, p: Problem, cfg: C, kernel):
    """run() launching ``kernel`` (None: the current one) with the current host code's arguments."""
    prepared = runner(rung, q, k, v, p, cfg)
    if kernel is None:
        return prepared

    def run():
        kernel[prepared._grid](*prepared._args, **prepared._options)
        return prepared.out

    return run


def _say(**fields) -> None:
    print(json.dumps({"triton": triton.__version__, **fields}), flush=True)


def smoke(cases: list[tuple], kernels: dict, index: int, count: int) -> bool:
    from common.contract.check import run_poisoned
    from common.contract.inputs import make_inputs

    ok = True
    for label, rung, shape, cfg, kernel in cases[index::count]:
        d, causal = SHAPES[shape][3], SHAPES[shape][4]
        for b, h, sq, sk in SMOKE_SHAPES:
            p = Problem(b, h, sq, sk, d, dtype=torch.bfloat16, causal=causal)
            q, k, v = make_inputs(p, seed=sq + sk, offset=0.5)
            out = run_poisoned(launcher(rung, q, k, v, p, cfg, kernels[kernel]))
            passed, reason = judge(rung, out, q, k, v, p, cfg)
            _say(smoke=label, shape=p.describe(), ok=bool(passed), reason=reason)
            ok &= bool(passed)
    return ok


def bench(cases: list[tuple], kernels: dict, rounds: int) -> None:
    from common.contract.inputs import make_inputs
    from common.measure.timing import tflops, time_cuda

    groups: dict[str, list] = {}
    for label, rung, shape, cfg, kernel in cases:
        groups.setdefault(shape, []).append((label, rung, cfg, kernel))
    for shape, variants in groups.items():
        b, h, s, d, causal = SHAPES[shape]
        p = Problem(b, h, s, s, d, dtype=torch.bfloat16, causal=causal)
        q, k, v = make_inputs(p, seed=0)
        runs = [(label, launcher(rung, q, k, v, p, cfg, kernels[kernel])) for label, rung, cfg, kernel in variants]
        for _, run in runs:
            run()
        samples = {label: [] for label, _ in runs}
        for r in range(rounds):
            for label, run in runs[r % len(runs) :] + runs[: r % len(runs)]:
                samples[label].append(tflops(p.flops, time_cuda(run, warmup_ms=25, rep_ms=200).ms))
        for label, xs in samples.items():
            _say(label=label, median=round(statistics.median(xs), 1), rounds=[round(x, 1) for x in xs])
        del runs, q, k, v
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--old-kernel", required=True, help="a copy of an earlier triton_impl/gluon/_device.py")
    common.add_argument("--cases", choices=sorted(CASE_SETS), default="row-tree")
    sub = parser.add_subparsers(dest="command", required=True)
    smoke_args = sub.add_parser("smoke", parents=[common], help="judge cases I::N of both kernels")
    smoke_args.add_argument("index", type=int)
    smoke_args.add_argument("count", type=int)
    bench_args = sub.add_parser("bench", parents=[common], help="time both kernels in interleaved rounds")
    bench_args.add_argument("rounds", type=int)
    args = parser.parse_args()
    require_gpu("bench.gluon_ab")
    kernels = {"new": None, "old": load_kernel(args.old_kernel)}
    cases = CASE_SETS[args.cases]()
    if args.command == "smoke":
        sys.exit(0 if smoke(cases, kernels, args.index, args.count) else 1)
    bench(cases, kernels, args.rounds)


if __name__ == "__main__":
    main()
