"""Static filter for the Gluon config sweep: spills and registers of each candidate under the installed Triton."""

import json
import sys

import torch

from common.contract.problem import Problem
from common.reporting.static import cubin_resources
from triton_impl.gluon import fp8 as gf
from triton_impl.gluon import hopper as gh

sys.path.insert(0, ".gpu/g4")
import triton
from cands import CANDS

for label, rung, (b, h, s, d, causal), cfg in CANDS:
    p = Problem(b, h, s, s, d, dtype=torch.bfloat16, causal=causal)
    mod = gf if rung == "fp8" else gh
    try:
        bins = mod.compile_sm90(p, cfg)
        res = cubin_resources(bins[0].cubin)
        spill = max(u["stack_bytes"] + u["local_bytes"] for u in res.values())
        regs = max(u["registers"] for u in res.values())
        print(json.dumps({"triton": triton.__version__, "label": label, "spill": spill, "regs": regs}), flush=True)
    except Exception as e:  # noqa: BLE001
        print(json.dumps({"triton": triton.__version__, "label": label, "error": str(e)[:200]}), flush=True)
