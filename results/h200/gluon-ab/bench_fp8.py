"""gluon/fp8 A/B bench: every candidate configuration judged by ``FP8_RULE`` against its emulation on
small ragged shapes, then TFLOP/s (kernel only, quantisation in prepare) of the candidates against
triton/fp8, cute/fp8 (where the CuTe DSL imports) and gluon/hopper in one process. Usage, from the
project root on the GPU machine: ``PYTHONPATH=. python3 results/h200/gluon-ab/bench_fp8.py [quick]``."""

import sys

import torch

from common.contract.check import run_poisoned, sdpa_error
from common.contract.fp8 import KernelOrder
from common.contract.fp8 import emulate as emulate_quantised
from common.contract.inputs import make_inputs
from common.contract.metrics import FP8_RULE, emulation_stats, error_stats
from common.contract.problem import Problem
from common.contract.reference import reference_attention
from common.contract.registry import discover
from common.measure.timing import tflops, time_cuda
from triton_impl.fp8 import _transposed_values
from triton_impl.gluon import fp8 as gf
from triton_impl.gluon.hopper import GluonConfig as C

# Candidates of the 2026-11-24 A/B (docs/perf-log.md, "Gluon fp8: P in S's registers"); the first of
# each list is the planted-bug configuration.
CANDIDATES = {
    128: [C(64, 3), C(128, 3), C(128, 2), C(64, 3, unroll_pairs=True)],
    64: [C(64, 3, 3, True), C(128, 3)],
}


def _config_runner(q, k, v, problem, config):
    return gf.GluonFp8Attention(gf._quantised(q, k, v, gf.DEFAULT_QUANTISATION), problem, config)


def _judge(out, err, inputs, problem, ref, yardstick, config):
    """FP8_RULE against the emulation of this configuration's own key blocks (first to last)."""
    operands = gf._quantised(*inputs, gf.DEFAULT_QUANTISATION)
    emulated = emulate_quantised(operands, problem, KernelOrder(block_n=config.block_n, reverse=False))
    return FP8_RULE.judge(err, yardstick, emulation_stats(out, emulated.out, emulated.bound, ref))


def smoke(candidates) -> bool:
    ok = True
    for sq, sk, d, causal in [
        (1, 1, 128, False),
        (77, 1000, 128, True),
        (1000, 77, 64, False),
        (300, 4100, 64, True),
        (1000, 1000, 128, False),
        (555, 1037, 128, True),
        (1000, 4100, 128, False),
        (700, 3000, 64, False),
    ]:
        problem = Problem(2, 3, sq, sk, d, dtype=torch.bfloat16, causal=causal)
        q, k, v = make_inputs(problem, seed=sq + sk)
        ref = reference_attention(q, k, v, problem)
        yardstick = sdpa_error(q, k, v, problem, ref)
        for config in candidates[d]:
            out = run_poisoned(_config_runner(q, k, v, problem, config))
            err = error_stats(out, ref)
            passed, reason = _judge(out, err, (q, k, v), problem, ref, yardstick, config)
            print(f"smoke {problem.describe()} {config}: {'ok' if passed else 'FAIL ' + reason}", flush=True)
            ok &= passed
        if sk >= 1000:
            # Planted bug: V in natural key order, while the kernel renames P's registers.
            config = candidates[d][0]
            runner = _config_runner(q, k, v, problem, config)
            runner.vt8.view(torch.uint8).zero_()
            runner.vt8[..., :sk].copy_(_transposed_values(runner.operands.v8))
            out = run_poisoned(runner)
            passed, reason = _judge(out, error_stats(out, ref), (q, k, v), problem, ref, yardstick, config)
            print(f"planted unpermuted V {problem.describe()}: {'PASSED (bad)' if passed else 'fails as it must'}")
            ok &= not passed
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
    smoke_ok = smoke(candidates)
    print("smoke ok" if smoke_ok else "SMOKE FAILED", flush=True)
    bench(candidates)
    sys.exit(0 if smoke_ok else 1)
