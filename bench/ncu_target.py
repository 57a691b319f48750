"""ncu target: one registry implementation's prepared runner at one shape, only its profiled launch
between ``cudaProfilerStart``/``Stop`` (inputs, quantisation and compile happen before).

    python -m bench.ncu_target IMPL B H S D CAUSAL           a dense prefill shape, bf16
    python -m bench.ncu_target IMPL decode SEED INDEX         the INDEX-th of ``random_cases(.., SEED)``: the decode
                                                              shapes of ``compare.py --decode-random N --decode-seed
                                                              SEED`` (their lengths, paging and cache included)

``bench/ncu.sh`` runs it under ncu.
"""

import argparse
from collections.abc import Callable

import torch

from bench import require_gpu
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from common.contract.registry import get


def prefill_runner(impl: str, shape: list[int]) -> tuple[Callable[[], object], Problem]:
    """The prepared runner of ``impl`` at B H S D CAUSAL (Sq = Sk = S, bf16)."""
    batch, heads, seqlen, head_dim, causal = shape
    problem = Problem(batch, heads, seqlen, seqlen, head_dim, dtype=torch.bfloat16, causal=bool(causal))
    q, k, v = make_inputs(problem, seed=0)
    return get(impl).prepare(q, k, v, problem), problem


def decode_runner(impl: str, seed: int, index: int) -> tuple[Callable[[], object], Problem]:
    """The prepared runner of ``impl`` on seed ``seed``'s ``index``-th random decode case, drawn as the sweep
    draws it (``DecodeCase.gpu_workload``: the cache lengths and the block table are per-call inputs)."""
    from common.measure.decode_sweep import random_cases

    case = random_cases(index + 1, seed)[index]
    workload, extra = case.gpu_workload(torch.device("cuda"))
    return get(impl).prepare(workload.q, workload.k, workload.v, case.problem, **extra), case.problem


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("impl", help="registry name, e.g. gluon/fp8")
    parser.add_argument("shape", nargs="+", help="B H S D CAUSAL, or: decode SEED INDEX")
    args = parser.parse_args()
    decode = args.shape[0] == "decode"
    numbers = [int(word) for word in args.shape[decode:]]
    if len(numbers) != (2 if decode else 5):
        parser.error(f"expected B H S D CAUSAL or decode SEED INDEX, got {' '.join(args.shape)}")
    require_gpu("bench.ncu_target")
    runner, problem = decode_runner(args.impl, *numbers) if decode else prefill_runner(args.impl, numbers)
    for _ in range(3):
        runner()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    runner()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(args.impl, problem.describe(), "profiled", flush=True)


if __name__ == "__main__":
    main()
