"""Gluon A/B (issue #20, third stop): the working tree's kernel (fence after mbarrier.init, FP8 O
update folded into one FFMA) against the kernel of 83d0751 (.gpu/g20/gluon_nofence.py), same
runner arguments, interleaved rounds, median TFLOP/s. Smoke first: every timed variant judged on
ragged shapes (FP8_RULE against its own emulation / the bf16 rule)."""

import statistics
import sys

import torch

sys.path.insert(0, ".gpu/g20")
import gluon_nofence as old

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
from triton_impl.gluon.hopper import GluonConfig as C

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5


def fp8_runner(q, k, v, p, config, kernel=None):
    r = gf.GluonFp8Attention(gf._quantised(q, k, v, gf.DEFAULT_QUANTISATION), p, config)
    if kernel is None:
        return r, r

    def run():
        kernel[r._grid](*r._args, **r._options)
        return r.out

    return run, r


def bf16_runner(q, k, v, p, config, kernel=None):
    r = gh.GluonAttention(q, k, v, p, config)
    if kernel is None:
        return r, r

    def run():
        kernel[r._grid](*r._args, **r._options)
        return r.out

    return run, r


# (label, problem, [(variant name, runner factory, config, kernel)])
P1 = Problem(2, 16, 8192, 8192, 128)
P1C = Problem(2, 16, 8192, 8192, 128, causal=True)
D64 = Problem(4, 32, 8192, 8192, 64)
D64C = Problem(4, 32, 8192, 8192, 64, causal=True)
fp8_d128 = gf.default_config(P1)
fp8_d128c = gf.default_config(P1C)
CASES = [
    (
        "P1 fp8",
        P1,
        [
            ("fp8 default new", fp8_runner, fp8_d128, None),
            ("fp8 default OLD", fp8_runner, fp8_d128, old.attention_kernel),
            ("fp8 128,2 pingpong new", fp8_runner, C(128, 2, pingpong=True), None),
            ("fp8 128,2 new", fp8_runner, C(128, 2), None),
        ],
    ),
    (
        "P1c fp8",
        P1C,
        [
            ("fp8 causal default new", fp8_runner, fp8_d128c, None),
            ("fp8 causal default OLD", fp8_runner, fp8_d128c, old.attention_kernel),
            ("fp8 causal 128,2 new", fp8_runner, C(128, 2), None),
            ("fp8 causal 128,3 new", fp8_runner, C(128, 3), None),
        ],
    ),
    (
        "D64 bf16",
        D64,
        [
            ("hopper D64 default new", bf16_runner, gh.DEFAULT_CONFIGS[64], None),
            ("hopper D64 default OLD", bf16_runner, gh.DEFAULT_CONFIGS[64], old.attention_kernel),
        ],
    ),
    (
        "P1 bf16",
        P1,
        [
            ("hopper default new", bf16_runner, gh.DEFAULT_CONFIGS[128], None),
            ("hopper default OLD", bf16_runner, gh.DEFAULT_CONFIGS[128], old.attention_kernel),
        ],
    ),
]


def judge(out, q, k, v, p, config, is_fp8):
    ref = reference_attention(q, k, v, p)
    yard = sdpa_error(q, k, v, p, ref)
    err = error_stats(out, ref)
    if is_fp8:
        ops = gf._quantised(q, k, v, gf.DEFAULT_QUANTISATION)
        em = emulate_quantised(ops, p, KernelOrder(block_n=config.block_n, reverse=False))
        return FP8_RULE.judge(err, yard, emulation_stats(out, em.out, em.bound, ref))
    return get("gluon/hopper").error_rule.judge(err, yard, None)


def smoke():
    ok = True
    shapes = [(1, 1), (77, 1000), (1000, 77), (555, 1037)]
    for _label, problem, variants in CASES:
        for name, factory, config, kernel in variants:
            for sq, sk in shapes:
                p = Problem(2, 3, sq, sk, problem.head_dim, dtype=torch.bfloat16, causal=problem.causal)
                q, k, v = make_inputs(p, seed=sq + sk, offset=0.5)
                run, _ = factory(q, k, v, p, config, kernel)
                out = run_poisoned(run)
                passed, reason = judge(out, q, k, v, p, config, factory is fp8_runner)
                if not passed:
                    print(f"smoke FAIL {name} {p.describe()}: {reason}", flush=True)
                ok &= passed
    print("smoke ok" if ok else "SMOKE FAILED", flush=True)
    return ok


def bench():
    for label, problem, variants in CASES:
        q, k, v = make_inputs(problem, seed=0)
        runs = [(name, factory(q, k, v, problem, config, kernel)[0]) for name, factory, config, kernel in variants]
        for _, run in runs:
            run()
        samples = {name: [] for name, _ in runs}
        for _ in range(ROUNDS):
            for name, run in runs:
                samples[name].append(tflops(problem.flops, time_cuda(run, warmup_ms=25, rep_ms=200).ms))
        for name, _ in runs:
            s = samples[name]
            print(
                f"{label:9s} {name:28s} median {statistics.median(s):7.1f}  rounds " + " ".join(f"{x:.1f}" for x in s),
                flush=True,
            )
        del runs, q, k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    ok = smoke()
    bench()
    sys.exit(0 if ok else 1)
