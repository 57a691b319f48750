"""One gluon rung on one small ragged shape (B=1 H=2 Sq=77 Sk=200 D=128 bf16), for compute-sanitizer.

Prints the kernel's shared-memory size, so hazard addresses can be placed (the warp-specialisation
state and capture bytes sit at the top of the allocation)::

    compute-sanitizer --tool racecheck --racecheck-report hazard python -m bench.gluon_race_target fp8

Produced results/h200/gluon-20/sanitizer/{racecheck_fp8,racecheck_hopper,memcheck_fp8}.log.
"""

import argparse

import torch

from bench import require_gpu
from common.contract.check import run_poisoned
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from triton_impl.gluon import fp8, hopper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rung", choices=["fp8", "hopper"])
    args = parser.parse_args()
    require_gpu("bench.gluon_race_target")
    module = fp8 if args.rung == "fp8" else hopper
    p = Problem(1, 2, 77, 200, 128, dtype=torch.bfloat16, causal=False)
    q, k, v = make_inputs(p, seed=1)
    out = run_poisoned(module.prepare(q, k, v, p))
    torch.cuda.synchronize()
    print(args.rung, p.describe(), "non-finite:", int((~torch.isfinite(out.float())).sum()))
    print("shared bytes:", module.compile_sm90(p)[0].shared_bytes)


if __name__ == "__main__":
    main()
