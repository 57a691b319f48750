"""ws_min.py with the gluon kernels' partition shape: default 4 warps, workers of 4 and 1 warps
(12 warps after padding), worker register budgets 240 / 24 and maxnreg 168 at launch. The
partitions only write global memory: no user shared memory at all."""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def _wide(out, BASE: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    offs = gl.arange(0, 128, layout)
    gl.store(out + BASE + offs, offs + BASE)


@gluon.jit
def _narrow(out, BASE: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    offs = gl.arange(0, 32, layout)
    gl.store(out + BASE + offs, offs + BASE)


@gluon.jit
def ws_min2_kernel(out):
    gl.warp_specialize([(_wide, (out, 0)), (_wide, (out, 128)), (_narrow, (out, 256))], [4, 1], [240, 24])


if __name__ == "__main__":
    out = torch.zeros(288, dtype=torch.int32, device="cuda")
    ws_min2_kernel[(2,)](out, num_warps=4, maxnreg=168)
    torch.cuda.synchronize()
    print("ws_min2 output correct:", bool((out == torch.arange(288).to(out)).all()))
