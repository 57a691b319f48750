"""Quick GPU check-and-time of a few implementations (a developer tool; compare.py is the product).

python -m common.measure.quickbench --impl 'triton/*' --seqlen 8192 --head-dim 128 --causal both
"""

from __future__ import annotations

import argparse
import fnmatch
import time

import torch

from common.contract.check import check_implementation
from common.contract.inputs import make_inputs
from common.contract.problem import DTYPE_NAMES, Problem
from common.contract.registry import discover
from common.measure.timing import tflops, time_cuda


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--impl", default="*")
    parser.add_argument("--seqlen", type=int, default=8192)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    parser.add_argument("--causal", default="both", choices=["true", "false", "both"])
    args = parser.parse_args()
    causal_modes = {"true": [True], "false": [False], "both": [False, True]}[args.causal]
    available, missing = discover()
    for item in missing:
        print(f"{item.name:18s} unavailable: {item.reason}")
    for causal in causal_modes:
        problem = Problem.canonical(args.seqlen, head_dim=args.head_dim, dtype=DTYPE_NAMES[args.dtype], causal=causal)
        q, k, v = make_inputs(problem, seed=1)
        for impl in available:
            if not fnmatch.fnmatch(impl.name, args.impl):
                continue
            ok, reason = impl.check(problem, q.device)
            if not ok:
                print(f"{impl.name:18s} {problem.describe()}: skipped ({reason})")
                continue
            check = check_implementation(impl, problem.with_(batch=1, heads=2, seqlen_q=1000, seqlen_k=1000))
            start = time.perf_counter()
            run = impl.prepare(q, k, v, problem)
            prepare_s = time.perf_counter() - start
            timing = time_cuda(run)
            speed = tflops(problem.flops, timing.ms)
            print(
                f"{impl.name:18s} {problem.describe()}: {timing.ms:8.3f} ms {speed:7.1f} TFLOP/s "
                f"prepare {prepare_s:6.2f} s | check S=1000: {check.summary()}"
            )
            del run
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
