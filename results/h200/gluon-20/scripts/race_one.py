"""One gluon rung on one small ragged shape, for compute-sanitizer racecheck; prints the kernel's
shared-memory size, so hazard addresses can be placed (the warp-specialisation state and capture
bytes sit at the top of the allocation)."""

import sys

import torch

from common.contract.check import run_poisoned
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from triton_impl.gluon import fp8, hopper

rung = sys.argv[1]
mod = fp8 if rung == "fp8" else hopper
p = Problem(1, 2, 77, 200, 128, dtype=torch.bfloat16, causal=False)
q, k, v = make_inputs(p, seed=1)
out = run_poisoned(mod.prepare(q, k, v, p))
torch.cuda.synchronize()
print(rung, p.describe(), "non-finite:", int((~torch.isfinite(out.float())).sum()))
print("shared bytes:", mod.compile_sm90(p)[0].shared_bytes)
