"""gluon/fp8 A/B bench: every candidate configuration judged by ``FP8_RULE`` against its emulation on
small ragged shapes, then TFLOP/s (kernel only, quantisation in prepare) of the candidates against
triton/fp8, cute/fp8 (where the CuTe DSL imports) and gluon/hopper in one process. Usage, from the
project root on the GPU machine: ``PYTHONPATH=. python3 results/h200/gluon-ab/bench_fp8.py [quick]``."""

import sys

import torch

from common.check import judge_output, run_poisoned, sdpa_error
from common.inputs import make_inputs
from common.metrics import error_stats
from common.problem import Problem
from common.reference import reference_attention
from common.registry import discover
from common.timing import tflops, time_cuda
from triton_impl.gluon import fp8 as gf
from triton_impl.gluon.hopper import GluonConfig as C

# The defaults first; C(128, 3) spills at D=128 (264 B on Triton 3.9, 40 B causal on 3.6).
CANDIDATES = {
    128: [C(64, 3), C(64, 2), C(64, 4), C(64, 3, 2, True), C(128, 3)],
    64: [C(64, 3, 3, True), C(64, 2, 3, True), C(128, 3, 2, True), C(128, 3), C(64, 3)],
}


def _config_runner(q, k, v, problem, config):
    return gf.GluonFp8Attention(gf._quantised(q, k, v, gf.DEFAULT_QUANTISATION), problem, config)


def smoke(candidates) -> bool:
    ok = True
    for sq, sk, d, causal in [(1, 1, 128, False), (77, 1000, 128, True), (1000, 77, 64, False), (300, 4100, 64, True)]:
        problem = Problem(2, 3, sq, sk, d, dtype=torch.bfloat16, causal=causal)
        q, k, v = make_inputs(problem, seed=sq + sk)
        ref = reference_attention(q, k, v, problem)
        yardstick = sdpa_error(q, k, v, problem, ref)
        for config in candidates[d]:
            out = run_poisoned(_config_runner(q, k, v, problem, config))
            err = error_stats(out, ref)
            passed, reason, _ = judge_output(gf.IMPLEMENTATION, out, err, (q, k, v), problem, ref, yardstick)
            print(f"smoke {problem.describe()} {config}: {'ok' if passed else 'FAIL ' + reason}", flush=True)
            ok &= passed
    return ok


def bench(candidates) -> None:
    available, _ = discover(include_baselines=False)
    impls = {impl.name: impl for impl in available}
    names = [n for n in ("triton/fp8", "gluon/fp8", "cute/fp8", "gluon/hopper") if n in impls]
    for label, problem in [
        ("P1", Problem(2, 16, 8192, 8192, 128)),
        ("P1c", Problem(2, 16, 8192, 8192, 128, causal=True)),
        ("D64", Problem(4, 32, 8192, 8192, 64)),
        ("D64c", Problem(4, 32, 8192, 8192, 64, causal=True)),
    ]:
        inputs = make_inputs(problem, seed=0)
        runs = [(name, impls[name]) for name in names]
        runs += [(f"gluon/fp8 {c}", c) for c in candidates[problem.head_dim]]
        for name, what in runs:
            try:
                run = _config_runner(*inputs, problem, what) if isinstance(what, C) else what.prepare(*inputs, problem)
                run()
                ms = time_cuda(run).ms
                print(f"{label:5s} {name:60s} {tflops(problem.flops, ms):7.1f} TFLOP/s", flush=True)
            except Exception as error:  # noqa: BLE001 - a failed candidate is reported, the rest still run
                print(f"{label:5s} {name:60s} FAILED {type(error).__name__}: {str(error)[:300]}", flush=True)


if __name__ == "__main__":
    candidates = {d: configs[:2] for d, configs in CANDIDATES.items()} if sys.argv[1:] == ["quick"] else CANDIDATES
    if not smoke(candidates):
        print("SMOKE FAILED")
        sys.exit(1)
    bench(candidates)
