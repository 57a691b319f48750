"""The smallest Gluon warp_specialize kernel: a default partition (4 warps) and one worker (1 warp)
that only write global memory. No shared memory is allocated by the user: any racecheck hazard
here comes from the warp-specialisation protocol Triton generates (state bytes + named barrier 1)."""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def _default(out):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    offs = gl.arange(0, 128, layout)
    gl.store(out + offs, offs)


@gluon.jit
def _worker(out):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    offs = gl.arange(0, 32, layout)
    gl.store(out + 128 + offs, offs + 1000)


@gluon.jit
def ws_min_kernel(out):
    gl.warp_specialize([(_default, (out,)), (_worker, (out,))], [1], [24])


if __name__ == "__main__":
    out = torch.zeros(160, dtype=torch.int32, device="cuda")
    ws_min_kernel[(2,)](out, num_warps=4)
    torch.cuda.synchronize()
    expected = torch.cat([torch.arange(128), torch.arange(32) + 1000]).to(out)
    print("ws_min output correct:", bool((out == expected).all()))
