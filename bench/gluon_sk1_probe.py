"""gluon/fp8 at seqlen_k = 1: which kernel writes non-finite output?

Shared memory is dirtied with 0xFF bytes (NaN in e4m3 and bf16) before every other launch, so a read
of stale shared memory shows. 20 cases: D 64/128, causal or not, Sq/Sk = 1/1, 300/1, 1/2, 300/2, 77/1.
Variants: ``new`` (this tree's kernel, gluon/fp8), ``old`` (the kernel of ``--old-kernel``, a copy of
an earlier ``triton_impl/gluon/_device.py``), ``old_kpad`` (old, K zero-padded to whole key blocks),
``hnew`` / ``hold`` (gluon/hopper, new and old kernel)::

    git show 83d0751:triton_impl/gluon/_device.py > /tmp/old_device.py
    python -m bench.gluon_sk1_probe old --old-kernel /tmp/old_device.py --reps 16

Produced results/h200/gluon-20/sk1/*.log (docs/perf-log.md, "Gluon: seqlen_k = 1, racecheck and the floors").
"""

import argparse
import time

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from bench import require_gpu
from bench.gluon_ab import load_kernel
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from triton_impl.gluon import _device, fp8, hopper

DIRTY_CHUNK = 1024
DIRTY_CHUNKS = 48  # 48 x 4 KiB = 192 KiB per CTA: one CTA per SM
VARIANTS = ("new", "old", "old_kpad", "hnew", "hold")


@gluon.jit
def dirty_kernel(out, CHUNK: gl.constexpr, CHUNKS: gl.constexpr):
    """Fill this CTA's shared memory with -1 words (0xFF bytes)."""
    layout: gl.constexpr = gl.BlockedLayout([CHUNK // 128], [32], [4], [0])
    smem = gl.allocate_shared_memory(gl.int32, [CHUNKS, CHUNK], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    ones = gl.full([CHUNK], -1, gl.int32, layout)
    for i in gl.static_range(CHUNKS):
        smem.index(i).store(ones)
    total = gl.sum(smem.index(CHUNKS - 1).load(layout), 0)
    gl.store(out + gl.program_id(0), total)


def dirty(sink: torch.Tensor) -> None:
    """Dirty the shared memory of every SM: four waves of one 192 KiB CTA per SM."""
    dirty_kernel[(sink.numel(),)](sink, DIRTY_CHUNK, DIRTY_CHUNKS, num_warps=4)


def prepared(variant: str, q, k, v, p: Problem):
    """The runner of the variant (descriptors, constexprs) at the rung's default configuration."""
    if variant.startswith("h"):
        return hopper.GluonAttention(q, k, v, p, hopper.DEFAULT_CONFIGS[p.head_dim])
    cfg = fp8.default_config(p)
    ops = fp8._quantised(q, k, v, fp8.DEFAULT_QUANTISATION)
    runner = fp8.GluonFp8Attention(ops, p, cfg)
    if variant == "old_kpad":
        rows = -(-p.seqlen_k // cfg.block_n) * cfg.block_n
        kpad = torch.zeros((p.batch, p.heads, rows, p.head_dim), dtype=torch.uint8, device="cuda")
        kpad[:, :, : p.seqlen_k] = ops.k8.view(torch.uint8)
        runner.kpad = kpad.view(torch.float8_e4m3fn)
        args = list(runner._args)
        args[1] = hopper._descriptor(runner.kpad, cfg.block_n, fp8.FP8_DTYPE)
        runner._args = tuple(args)
    return runner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variant", choices=VARIANTS)
    parser.add_argument("--reps", type=int, default=40, help="launches per case (every other one after dirtying)")
    parser.add_argument("--old-kernel", help="a copy of an earlier triton_impl/gluon/_device.py (old variants)")
    args = parser.parse_args()
    if args.variant in ("old", "old_kpad", "hold") and not args.old_kernel:
        parser.error(f"variant {args.variant} needs --old-kernel")
    require_gpu("bench.gluon_sk1_probe")
    kernel = load_kernel(args.old_kernel) if args.old_kernel and "old" in args.variant else _device.attention_kernel
    sink = torch.empty(torch.cuda.get_device_properties(0).multi_processor_count * 4, device="cuda", dtype=torch.int32)
    cases = [
        (d, c, sq, sk)
        for d in (64, 128)
        for c in (False, True)
        for sq, sk in ((1, 1), (300, 1), (1, 2), (300, 2), (77, 1))
    ]
    start = time.time()
    total_bad = 0
    for d, causal, sq, sk in cases:
        p = Problem(2, 3, sq, sk, d, dtype=torch.bfloat16, causal=causal)
        q, k, v = make_inputs(p, seed=sq * 7 + sk, offset=0.5)
        runner = prepared(args.variant, q, k, v, p)
        bad_runs, sample = 0, ""
        for rep in range(args.reps):
            if rep % 2:
                dirty(sink)
            runner.out.fill_(float("nan"))
            kernel[runner._grid](*runner._args, **runner._options)
            torch.cuda.synchronize()
            nonfinite = ~torch.isfinite(runner.out.float())
            if nonfinite.any():
                bad_runs += 1
                if not sample:
                    per_head = nonfinite.flatten(2).sum(-1).tolist()
                    rows, cols = int(nonfinite.any(-1).sum()), int(nonfinite.any(-2).sum())
                    sample = f" rep {rep} dirty={rep % 2} per (b,h) {per_head} rows {rows} (b,h,d) cols {cols}"
        total_bad += bad_runs
        print(f"{args.variant} D={d} causal={causal} Sq={sq} Sk={sk}: {bad_runs}/{args.reps} runs non-finite{sample}")
    print(f"{args.variant}: {total_bad} bad runs, {time.time() - start:.1f}s", flush=True)


if __name__ == "__main__":
    main()
