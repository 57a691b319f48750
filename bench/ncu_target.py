"""ncu target: one registry implementation's prepared runner at one shape, only its profiled launch
between ``cudaProfilerStart``/``Stop`` (inputs, quantisation and compile happen before).

    python -m bench.ncu_target IMPL B H S D CAUSAL      (``bench/ncu.sh`` runs it under ncu)
"""

import argparse

import torch

from bench import require_gpu
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from common.contract.registry import get


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("impl", help="registry name, e.g. gluon/fp8")
    for name in ("batch", "heads", "seqlen", "head_dim", "causal"):
        parser.add_argument(name, type=int)
    args = parser.parse_args()
    require_gpu("bench.ncu_target")
    s = args.seqlen
    problem = Problem(args.batch, args.heads, s, s, args.head_dim, dtype=torch.bfloat16, causal=bool(args.causal))
    q, k, v = make_inputs(problem, seed=0)
    runner = get(args.impl).prepare(q, k, v, problem)
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
