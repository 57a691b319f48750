"""Gluon A/B bench (the script behind the logs in this folder): a correctness smoke of every
gluon/hopper variant on small ragged shapes against the fp64 reference, then TFLOP/s of the variants
against triton/hopper and cute/hopper in one process (cute rows need the CuTe DSL pack, which these
runs could not carry next to Triton 3.9). Usage, from the project root on the GPU machine:
``PYTHONPATH=. python3 results/h200/gluon-ab/bench.py [quick]``."""

import sys

import torch

from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from common.contract.reference import reference_attention
from common.contract.registry import get
from common.measure.timing import tflops, time_cuda
from triton_impl.gluon import hopper as gh


def smoke(configs=()):
    ok = True
    for sq, sk, d, causal, dt in [
        (1, 1, 128, False, torch.bfloat16),
        (77, 1000, 128, True, torch.bfloat16),
        (1000, 77, 64, False, torch.float16),
        (300, 4100, 64, True, torch.bfloat16),
        (1000, 1000, 128, True, torch.float16),
    ]:
        p = Problem(2, 3, sq, sk, d, dtype=dt, causal=causal)
        q, k, v = make_inputs(p, seed=sq + sk)
        ref = reference_attention(q, k, v, p)
        for cfg in (None, *configs):
            if cfg is not None and cfg.consumers * 64 * d * 2 + cfg.num_stages * 2 * 128 * d * 2 > 230000:
                continue
            run = gh.prepare(q, k, v, p) if cfg is None else gh.GluonAttention(q, k, v, p, cfg)
            run.out.fill_(float("nan"))
            out = run()
            err = (out.double() - ref).abs().max().item()
            print(f"smoke {p.describe()} {cfg}: max err {err:.3g}", flush=True)
            ok &= err < 2e-2
    return ok


def bench(variants):
    shapes = [
        ("P1", Problem(2, 16, 8192, 8192, 128, causal=False)),
        ("P1c", Problem(2, 16, 8192, 8192, 128, causal=True)),
        ("D64", Problem(4, 32, 8192, 8192, 64, causal=False)),
        ("D64c", Problem(4, 32, 8192, 8192, 64, causal=True)),
    ]
    rows = []
    for label, p in shapes:
        q, k, v = make_inputs(p, seed=0)
        ref = None
        cands = [(n, None) for n in ("triton/hopper", "cute/hopper", "gluon/hopper")]
        for cfg in variants.get(p.head_dim, []):
            cands.append((f"gluon {cfg}", cfg))
        for name, cfg in cands:
            try:
                if cfg is None:
                    run = get(name).prepare(q, k, v, p)
                else:
                    run = gh.GluonAttention(q, k, v, p, cfg)
                    run()
                out = run()
                if ref is None:
                    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=p.causal)
                err = (out.float() - ref.float()).abs().max().item()
                t = time_cuda(run)
                rows.append((label, name, tflops(p.flops, t.ms), err))
                print(f"{label:5s} {name:55s} {rows[-1][2]:7.1f} TFLOP/s  maxdiff vs sdpa {err:.2e}", flush=True)
            except Exception as e:  # noqa: BLE001 - a failed candidate is reported, the rest still run
                print(f"{label:5s} {name:55s} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
    return rows


if __name__ == "__main__":
    C = gh.GluonConfig
    variants = {
        128: [C(128, 2, 2, False), C(128, 3, 2, False), C(128, 3, 2, True)],
        64: [C(128, 3, 2, False), C(128, 2, 2, True), C(128, 4, 2, True), C(128, 3, 3, False), C(128, 2, 3, True)],
    }
    if len(sys.argv) > 1 and sys.argv[1] == "quick":
        variants = {128: [C(128, 2, 2, False)], 64: [C(128, 3, 2, False)]}
    if not smoke([C(128, 2, 2, False), C(128, 3, 2, True), C(128, 2, 3, True), C(128, 3, 3, False)]):
        print("SMOKE FAILED")
        sys.exit(1)
    bench(variants)
