"""Bare warp_specialize kernels shaped like the gluon rungs (default 4 warps, workers of 4 and 1 warps,
register budgets 240 / 24, maxnreg 168), adding one at a time what the gluon kernel has before (and
around) the fork, so one racecheck run per variant shows which construct makes racecheck report the
warp-specialisation state bytes (``bench/racecheck_ws.sh`` runs them all under compute-sanitizer).

    python -m bench.ws_bare VARIANT            # launch on the GPU, check the output
    python -m bench.ws_bare --static VARIANT   # sm_90a PTX barriers, no GPU (prints them)

Variants (flags of one kernel; see VARIANTS):
  min       the smallest warp_specialize: default 4 warps and one 1-warp worker, 24 registers
            (its own kernel, ``ws_min_kernel``; was ws_min.py)
  base      no shared memory of its own, no barrier (was ws_min2.py)
  pre1      + gl.thread_barrier() in the default warps before the fork (bar.sync 0, 128)
  pre2      + two of them (the count of the 3.6 gluon kernel)
  mbar1     + one mbarrier allocated, initialised, fence_async_shared (no bar.sync expected)
  mbar2     + an mbarrier array [2, 1], both initialised, fence (3.6 membar: bar.sync 0, 128 between)
  mbar2s    + the same two mbarriers as two allocations (no bar.sync expected)
  defbar    + gl.thread_barrier() inside the default partition (bar.sync 0, 128 after the fork)
  wrkbar    + gl.thread_barrier() inside the 4-warp worker (bar.sync 2, 128)
  smem      + 128 KB of shared memory written by the default warps before the fork (state bytes high)
  all       pre2 + mbar2 + defbar + wrkbar + smem
"""

import argparse
import re

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

VARIANTS = {
    # name: (PRE_BARRIERS, MBARRIERS, SPLIT_MBARRIERS, DEFAULT_BARRIER, WORKER_BARRIER, SMEM)
    "base": (0, 0, False, False, False, False),
    "pre1": (1, 0, False, False, False, False),
    "pre2": (2, 0, False, False, False, False),
    "mbar1": (0, 1, False, False, False, False),
    "mbar2": (0, 2, False, False, False, False),
    "mbar2s": (0, 2, True, False, False, False),
    "defbar": (0, 0, False, True, False, False),
    "wrkbar": (0, 0, False, False, True, False),
    "smem": (0, 0, False, False, False, True),
    "all": (2, 2, False, True, True, True),
}
# Triton 3.6's gl.thread_barrier is gl.barrier from 3.8 on (as in triton_impl/gluon/_device.py).
_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier
NAMES = ("PRE_BARRIERS", "MBARRIERS", "SPLIT_MBARRIERS", "DEFAULT_BARRIER", "WORKER_BARRIER", "SMEM")
SMEM_ROWS = gl.constexpr(512)  # 512 x 128 fp16 = 128 KB


@gluon.jit
def _wide(out, BASE: gl.constexpr, BARRIER: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    offs = gl.arange(0, 128, layout)
    gl.store(out + BASE + offs, offs + BASE)
    if BARRIER:
        _barrier()
    gl.store(out + BASE + offs, offs + BASE)


@gluon.jit
def _narrow(out, BASE: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    offs = gl.arange(0, 32, layout)
    gl.store(out + BASE + offs, offs + BASE)


@gluon.jit
def ws_bare_kernel(
    out,
    PRE_BARRIERS: gl.constexpr,
    MBARRIERS: gl.constexpr,
    SPLIT_MBARRIERS: gl.constexpr,
    DEFAULT_BARRIER: gl.constexpr,
    WORKER_BARRIER: gl.constexpr,
    SMEM: gl.constexpr,
):
    if SMEM:
        tile_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([SMEM_ROWS, 128], gl.float16)
        tile = gl.allocate_shared_memory(gl.float16, [SMEM_ROWS, 128], tile_layout)
        fill_layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
        tile.store(gl.full([SMEM_ROWS, 128], 1.0, gl.float16, fill_layout))
    if MBARRIERS == 1:
        bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        mbarrier.init(bar.index(0), count=1)
        fence_async_shared()
    if MBARRIERS == 2:
        if SPLIT_MBARRIERS:
            bar_a = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
            bar_b = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
            mbarrier.init(bar_a.index(0), count=1)
            mbarrier.init(bar_b.index(0), count=1)
        else:
            bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
            mbarrier.init(bars.index(0), count=1)
            mbarrier.init(bars.index(1), count=1)
        fence_async_shared()
    for _ in gl.static_range(PRE_BARRIERS):
        _barrier()
    gl.warp_specialize(
        [(_wide, (out, 0, DEFAULT_BARRIER)), (_wide, (out, 128, WORKER_BARRIER)), (_narrow, (out, 256))],
        [4, 1],
        [240, 24],
    )


@gluon.jit
def _min_default(out):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    offs = gl.arange(0, 128, layout)
    gl.store(out + offs, offs)


@gluon.jit
def _min_worker(out):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    offs = gl.arange(0, 32, layout)
    gl.store(out + 128 + offs, offs + 1000)


@gluon.jit
def ws_min_kernel(out):
    gl.warp_specialize([(_min_default, (out,)), (_min_worker, (out,))], [1], [24])


def launch(variant: str) -> bool:
    if variant == "min":
        out = torch.zeros(160, dtype=torch.int32, device="cuda")
        ws_min_kernel[(2,)](out, num_warps=4)
        expected = torch.cat([torch.arange(128), torch.arange(32) + 1000])
    else:
        out = torch.zeros(288, dtype=torch.int32, device="cuda")
        ws_bare_kernel[(2,)](out, *VARIANTS[variant], num_warps=4, maxnreg=168)
        expected = torch.arange(288)
    torch.cuda.synchronize()
    return bool((out == expected.to(out)).all())


def static_ptx(variant: str) -> str:
    from triton.experimental.gluon._runtime import GluonASTSource

    from common.reporting.static import compile_triton_sm90

    if variant == "min":
        kernel, constexprs, options = ws_min_kernel, {}, {"num_warps": 4}
    else:
        kernel, options = ws_bare_kernel, {"num_warps": 4, "maxnreg": 168}
        constexprs = dict(zip(NAMES, VARIANTS[variant], strict=True))
    binary = compile_triton_sm90(kernel, {"out": "*i32"}, constexprs, options=options, source_type=GluonASTSource)
    return binary.ptx


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variant", choices=["min", *VARIANTS])
    parser.add_argument("--static", action="store_true", help="print the sm_90a PTX barriers (no GPU)")
    args = parser.parse_args()
    if args.static:
        keep = re.compile(r"bar\.sync|barrier\.sync|bar\.warp|mbarrier\.init|fence\.proxy|st\.shared|setmaxnreg|bra")
        print("\n".join(line.strip() for line in static_ptx(args.variant).splitlines() if keep.search(line)))
        return
    from bench import require_gpu

    require_gpu("bench.ws_bare")
    print(args.variant, "output correct:", launch(args.variant))


if __name__ == "__main__":
    main()
