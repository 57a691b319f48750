"""gluon/fp8 at Sk = 1: which variant writes non-finite output? Shared memory is dirtied with 0xFF
bytes (NaN in e4m3 and bf16) before every other launch, so a read of stale shared memory shows.

usage: python .gpu/sk1_probe.py {new,old,old_kpad,hnew,hold} [reps]"""

import sys
import time

import torch

sys.path.insert(0, ".gpu/g20")
import gluon_nofence as old
from dirty import dirty

from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from triton_impl.gluon import _device as new
from triton_impl.gluon import fp8, hopper


def main():
    variant = sys.argv[1]
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    kernel = old.attention_kernel if variant in ("old", "old_kpad", "hold") else new.attention_kernel
    cases = [
        (d, c, sq, sk)
        for d in (64, 128)
        for c in (False, True)
        for sq, sk in ((1, 1), (300, 1), (1, 2), (300, 2), (77, 1))
    ]
    t0 = time.time()
    total_bad = 0
    for d, causal, sq, sk in cases:
        p = Problem(2, 3, sq, sk, d, dtype=torch.bfloat16, causal=causal)
        q, k, v = make_inputs(p, seed=sq * 7 + sk, offset=0.5)
        if variant.startswith("h"):
            runner = hopper.GluonAttention(q, k, v, p, hopper.DEFAULT_CONFIGS[d])
        else:
            cfg = fp8.default_config(p)
            ops = fp8._quantised(q, k, v, fp8.DEFAULT_QUANTISATION)
            runner = fp8.GluonFp8Attention(ops, p, cfg)
            if variant == "old_kpad":
                rows = -(-sk // cfg.block_n) * cfg.block_n
                kpad = torch.zeros((2, 3, rows, d), dtype=torch.uint8, device="cuda")
                kpad[:, :, :sk] = ops.k8.view(torch.uint8)
                runner.kpad = kpad.view(torch.float8_e4m3fn)
                args = list(runner._args)
                args[1] = hopper._descriptor(runner.kpad, cfg.block_n, fp8.FP8_DTYPE)
                runner._args = tuple(args)
        bad_runs = 0
        sample = ""
        for rep in range(reps):
            if rep % 2:
                dirty()
            runner.out.fill_(float("nan"))
            kernel[runner._grid](*runner._args, **runner._options)
            torch.cuda.synchronize()
            nonfinite = ~torch.isfinite(runner.out.float())
            if nonfinite.any():
                bad_runs += 1
                if not sample:
                    per_head = nonfinite.flatten(2).sum(-1).tolist()
                    rows = int(nonfinite.any(-1).sum())
                    cols = int(nonfinite.any(-2).sum())
                    sample = f" rep {rep} dirty={rep % 2} per (b,h) {per_head} rows {rows} (b,h,d) cols {cols}"
        total_bad += bad_runs
        print(f"{variant} D={d} causal={causal} Sq={sq} Sk={sk}: {bad_runs}/{reps} runs non-finite{sample}", flush=True)
    print(f"{variant}: {total_bad} bad runs, {time.time() - t0:.1f}s", flush=True)


main()
