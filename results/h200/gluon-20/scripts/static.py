"""Static A/B of the Gluon kernel (sm_90a, no GPU): spills and SASS counts of the hottest loop.
usage: python .gpu/g20/static.py {fp8,hopper} D causal block_n stages [consumers pingpong unroll] [--old]"""

import collections
import re
import subprocess
import sys
import tempfile

import torch
import triton

sys.path.insert(0, ".gpu/g20")
from common.contract.problem import Problem
from common.reporting.static import cubin_resources
from triton_impl.gluon import fp8, hopper
from triton_impl.gluon.hopper import GluonConfig

args = [a for a in sys.argv[1:] if not a.startswith("--")]
use_old = "--old" in sys.argv
rung, d, causal, block_n, stages = args[0], int(args[1]), args[2] == "1", int(args[3]), int(args[4])
consumers = int(args[5]) if len(args) > 5 else 2
pingpong = len(args) > 6 and args[6] == "1"
unroll = len(args) > 7 and args[7] == "1"
config = GluonConfig(block_n, stages, consumers, pingpong, unroll)
p = Problem(batch=1, heads=1, seqlen_q=1024, seqlen_k=1024, head_dim=d, dtype=torch.bfloat16, causal=causal)
if use_old:
    import gluon_nofence as old

    original = hopper.compile_kernel_sm90
    hopper.compile_kernel_sm90 = lambda sig, cx, cfg, kernel=None: original(sig, cx, cfg, kernel=old.attention_kernel)
b = (fp8 if rung == "fp8" else hopper).compile_sm90(p, config)[0]
res = next(iter(cubin_resources(b.cubin).values()))
tool = triton.__file__.rsplit("/", 1)[0] + "/backends/nvidia/bin/cuobjdump"
with tempfile.NamedTemporaryFile(suffix=".cubin") as h:
    h.write(b.cubin)
    h.flush()
    sass = subprocess.run([tool, "-sass", h.name], capture_output=True, text=True).stdout
instrs = []
for line in sass.splitlines():
    m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_.]+)?([^;]*)", line)
    if m:
        instrs.append((int(m.group(1), 16), m.group(2), m.group(4)))
OPS = ["QGMMA", "FFMA", "FMUL", "FADD", "FMNMX", "MUFU", "HGMMA", "F2FP", "PRMT", "LDG", "STL", "LDL", "BAR", "SYNCS"]
loops = []
for addr, op, rest in instrs:
    if op == "BRA":
        t = re.search(r"0x([0-9a-f]+)", rest)
        if t and int(t.group(1), 16) < addr:
            lo = int(t.group(1), 16)
            body = collections.Counter(o for a, o, _ in instrs if lo <= a <= addr)
            if body["HGMMA"] or body["QGMMA"]:
                loops.append(body)

tag = f"{triton.__version__} {rung} D={d} causal={int(causal)} {config} {'OLD' if use_old else 'new'}"
print(f"{tag}: regs={res['registers']} spill={res['local_bytes']} stack={res['stack_bytes']} sass={len(instrs)}")
for lp in loops:
    print(f"    loop n={sum(lp.values())} " + " ".join(f"{o}={lp[o]}" for o in OPS if lp[o]))
