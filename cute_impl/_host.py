"""Host-side glue shared by the CuTe rungs: dtypes, operands, streams; for the FA2 rungs (tiled,
pipelined) also fake operands and the compile cache.

None of this is kernel code. It turns torch tensors into CuTe tensors with dynamic shape and
strides, so one compilation serves every shape; builds the matching fake tensors for compiling on a
machine without a GPU; and compiles once per key, returning a ``run()`` that only launches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import from_dlpack, make_fake_tensor

from common.problem import Problem
from common.registry import Runner
from common.validation import OPERAND_ALIGNMENT_BYTES

CUTE_DTYPES = {torch.float16: cutlass.Float16, torch.bfloat16: cutlass.BFloat16}


def to_cute_tensor(tensor: torch.Tensor, element_type: type | None = None) -> cute.Tensor:
    """A tensor with dynamic shape and strides (one compile serves all sizes); its last dimension is
    contiguous and 16-byte aligned. ``element_type`` overrides the dlpack one: torch has no e4m3
    dlpack type, so FP8 travels as uint8."""
    converted = from_dlpack(tensor, assumed_align=OPERAND_ALIGNMENT_BYTES)
    if element_type is not None:
        converted.element_type = element_type
    return converted.mark_layout_dynamic(leading_dim=tensor.dim() - 1)


def current_stream(device: torch.device | None = None) -> cuda.CUstream:
    """torch's current stream (on ``device``), read at every launch so CUDA-graph capture records it."""
    return cuda.CUstream(torch.cuda.current_stream(device).cuda_stream)


def fake_bhsd_tensor(dtype: type[cutlass.Numeric]) -> Any:
    """A (B, H, S, D) stand-in with the dynamic layout of ``to_cute_tensor`` (every dimension and
    stride symbolic, strides 64-element divisible), for CPU compiles of the naive and online rungs."""
    sym = cute.sym_int
    return make_fake_tensor(
        dtype, (sym(), sym(), sym(), sym()), (sym(64), sym(64), sym(64), 1), assumed_align=OPERAND_ALIGNMENT_BYTES
    )


def fake_operands(problem: Problem) -> list[Any]:
    """Fake q, k, v, o with dynamic B, H, S and strides, for compiling without a GPU."""
    dtype = CUTE_DTYPES[problem.dtype]
    batch, heads = cute.sym_int(), cute.sym_int()
    fakes = []
    for seqlen in (cute.sym_int(), cute.sym_int()):
        stride = (cute.sym_int64(), cute.sym_int64(), cute.sym_int64(), 1)
        shape = (batch, heads, seqlen, problem.head_dim)
        fakes.append(make_fake_tensor(dtype, shape, stride, assumed_align=OPERAND_ALIGNMENT_BYTES))
    fake_q, fake_k = fakes
    return [fake_q, fake_k, fake_k, fake_q]


def compiled_runner(
    cache: dict[Any, Any],
    key: Any,
    make_kernel: Callable[[], Any],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float,
) -> Runner:
    """Allocate O, compile ``make_kernel()`` once per ``key``; the returned ``run()`` only launches."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    operands = [to_cute_tensor(t) for t in (q, k, v, out)]
    scale = cutlass.Float32(softmax_scale)
    if key not in cache:
        cache[key] = cute.compile(make_kernel(), *operands, scale, current_stream())
    compiled = cache[key]

    def run() -> torch.Tensor:
        compiled(*operands, scale, current_stream())
        return out

    return run
