"""ncu target (issue #20, fourth stop; scratch): one rung's prepared runner at one shape; only the
launch between cudaProfilerStart/Stop is profiled (inputs, quantisation and compile happen before)."""

import sys

import torch

from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from common.contract.registry import get

impl, b, h, s, d, causal = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6] == "1"
problem = Problem(b, h, s, s, d, dtype=torch.bfloat16, causal=causal)
q, k, v = make_inputs(problem, seed=0)
runner = get(impl).prepare(q, k, v, problem)
for _ in range(3):
    runner()
torch.cuda.synchronize()
torch.cuda.profiler.start()
runner()
torch.cuda.synchronize()
torch.cuda.profiler.stop()
print(impl, problem.describe(), "profiled", flush=True)
