"""Host helpers shared by the Triton rungs: the entry every rung's ``prepare`` comes from
(:class:`TritonEntry`: validate (:class:`TritonInputs`), plan, bind, warm up; its registry entry too), input validation,
the common capability checks, and the argument list of the kernels that take Q, K, V and O as strided
pointers (``online`` to ``pipelined``).

Those kernels share one calling convention: ``Q, K, V, Out, Lse, CacheSeqlens``, then (batch, head,
row) strides of Q, K, V and O, then ``heads, kv_heads, seqlen_q, seqlen_k, softmax_scale_log2``, and
the feature constexprs of :func:`feature_constexprs`. ``Lse`` is the (B, H, Sq) fp32 output of
``return_lse`` and ``CacheSeqlens`` the (B,) int32 key lengths; when the problem has neither, a
one-element placeholder is passed that the kernel never touches (its constexpr is False). Building
it here keeps the launch, the compile-only warm-up and the static sm_90a signature of every rung in
agreement.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar

import torch
import triton

from common.contract.capability import FEATURES, check_features
from common.contract.devices import (
    lasting,
    triton_device_supported,
    triton_device_types,
    triton_dtype_supported,
    triton_dtypes,
)
from common.contract.problem import Problem
from common.contract.registry import Implementation, Runner, per_call_inputs, warmed_up
from common.contract.validation import kernel_operand, validate_for_problem
from common.toolchain.compile import KernelBinary, compile_triton_sm90
from triton_impl._device import LOG2_E

# (batch, head, row) stride arguments of Q, K, V and O, in kernel-argument order.
POINTER_STRIDES = tuple(f"stride_{t}{dim}" for t, last in zip("qkvo", "mnnm", strict=True) for dim in ("b", "h", last))
# The types of ``size_arguments``, by kernel argument name.
SIZE_SIGNATURE = {"heads": "i32", "kv_heads": "i32", "seqlen_q": "i32", "seqlen_k": "i32", "softmax_scale_log2": "fp32"}
# Pointer and stride arguments a real launch passes 16-divisible, so the static compile assumes it too.
POINTER_ALIGNED = ("Q", "K", "V", "Out", "Lse", *POINTER_STRIDES)


Check = Callable[[Problem, torch.device], tuple[bool, str]]


@dataclass(frozen=True)
class TritonInputs:
    """What one Triton rung accepts: ``validate`` checks q, k, v against the problem with the rung's
    head dims and dtypes (the Triton dtypes by default), on the Triton device types, with every problem
    feature (GQA, both causal alignments, ``cache_seqlens``, the LSE), then the rung's own
    ``check(problem, device)`` on the validated problem (``(ok, reason)``; refused with
    ``ValueError(reason)``). ``paged``: the rung reads a paged KV cache (``block_table``)."""

    rung: str
    head_dims: tuple[int, ...]
    dtypes: tuple[torch.dtype, ...] | None = None
    check: Check | None = None
    paged: bool = False

    def validate(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem,
        cache_seqlens: torch.Tensor | None = None, block_table: torch.Tensor | None = None,
    ) -> Problem:  # fmt: skip
        if block_table is not None and not self.paged:
            raise ValueError(f"{self.rung} does not read a paged KV cache (block_table given)")
        checked = validate_for_problem(
            q, k, v, problem, cache_seqlens=cache_seqlens, block_table=block_table,
            dtypes=self.dtypes or triton_dtypes(), head_dims=self.head_dims, device_types=triton_device_types(),
        )  # fmt: skip
        if self.check is not None:
            ok, reason = self.check(checked, q.device)
            if not ok:
                raise ValueError(reason)
        return checked


@dataclass(frozen=True)
class TritonEntry:
    """The host entry of one Triton rung: ``prepare`` = validate (``inputs``) → plan → bind → warm up.

    ``bind(q, k, v, checked, *, cache_seqlens, [block_table], **options)`` is the rung's own: buffers
    and launch arguments for validated inputs, no launch. ``plan(q, k, v, problem, cache_seqlens)`` is
    work done once before binding (``pipelined``: autotuning)."""

    inputs: TritonInputs
    bind: Callable[..., Runner]
    plan: Callable[..., None] | None = None

    def prepare(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, *,
        cache_seqlens: torch.Tensor | None = None, block_table: torch.Tensor | None = None, **options: Any,
    ) -> Runner:  # fmt: skip
        """Validate q (B, H, Sq, D) and k, v (B, Hkv, Sk, D) (or page pools with ``block_table``), plan,
        bind (``options``: the rung's own, e.g. a configuration), and compile by one warm-up launch on a GPU."""
        checked = self.inputs.validate(q, k, v, problem, cache_seqlens, block_table)
        if self.plan is not None:
            self.plan(q, k, v, checked, cache_seqlens)
        bound = self.bind(q, k, v, checked, **per_call_inputs(checked, cache_seqlens, block_table), **options)
        return warmed_up(bound, q.device)

    def implementation(
        self, supports: Check, compile_sm90: Callable[[Problem], list[KernelBinary]], **fields: Any
    ) -> Implementation:
        """The registry entry of this rung: its name, ``prepare`` and ``bind``, its capability check and
        sm_90a compile path, and ``fields``; it runs on CPU tensors under the Triton interpreter."""
        return Implementation.named(
            self.inputs.rung, prepare=self.prepare, bind=self.bind, supports=supports, compile_sm90=compile_sm90,
            runs_on_cpu=True, **fields,
        )  # fmt: skip


def ladder_supported(problem: Problem, device: torch.device, head_dims: tuple[int, ...]) -> tuple[bool, str]:
    """Device, dtype and head-dim checks of the rungs ``naive`` to ``pipelined``, which implement every
    problem feature (GQA, both causal alignments, ``cache_seqlens``, the LSE)."""
    ok, reason = triton_device_supported(device)
    if not ok:
        return False, reason
    ok, reason = triton_dtype_supported(problem.dtype)
    if not ok:
        return False, reason
    if problem.head_dim not in head_dims:
        return False, f"head_dim {problem.head_dim} not supported (supported: {list(head_dims)})"
    return check_features("triton ladder rung", problem, FEATURES)


def tile_rung_supported(rung: str, problem: Problem, head_dims: tuple[int, ...]) -> tuple[bool, str]:
    """The problem checks of the Hopper and FP8 rungs of Triton and Gluon (``gluon/_host.gluon_supported``
    makes them too): every problem feature (GQA, both causal alignments, ``cache_seqlens``, the LSE),
    a head dim in ``head_dims``, and softmax_scale >= 0 (their softmax scales the row maximum once)."""
    ok, reason = check_features(rung, problem, FEATURES)
    if not ok:
        return ok, reason
    if problem.head_dim not in head_dims:
        return False, f"{rung} needs head_dim in {list(head_dims)}, got {problem.head_dim}"
    if problem.scale < 0:
        return False, f"{rung} needs softmax_scale >= 0, got {problem.scale}"
    return True, ""


def feature_constexprs(problem: Problem) -> dict[str, bool]:
    """The constexprs of the problem features: the mask (causal, aligned bottom-right where that
    differs from top-left), per-sequence lengths, and whether the epilogue stores the LSE."""
    return {
        "CAUSAL": problem.causal,
        "BOTTOM_RIGHT": problem.bottom_right,
        "HAS_CACHE_SEQLENS": problem.has_cache_seqlens,
        "RETURN_LSE": problem.return_lse,
    }


@cache
def placeholder(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Passed for Lse / CacheSeqlens when the problem has none: the kernel never reads or writes it."""
    return lasting(lambda: torch.zeros(1, dtype=dtype, device=device), device)


def allocate_lse(problem: Problem, device: torch.device) -> torch.Tensor | None:
    """The (B, H, Sq) fp32 LSE output when the problem returns it, else None."""
    if not problem.return_lse:
        return None
    return torch.empty((problem.batch, problem.heads, problem.seqlen_q), dtype=torch.float32, device=device)


def feature_buffers(
    lse: torch.Tensor | None, cache_seqlens: torch.Tensor | None, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``Lse`` and ``CacheSeqlens`` kernel arguments: the tensors, or :func:`placeholder`s where
    the problem has none (the kernel's RETURN_LSE / HAS_CACHE_SEQLENS constexpr is then False)."""
    lse_arg = lse if lse is not None else placeholder(torch.float32, device)
    lengths_arg = cache_seqlens if cache_seqlens is not None else placeholder(torch.int32, device)
    return lse_arg, lengths_arg


def rung_result(out: torch.Tensor, lse: torch.Tensor | None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """What ``run()`` returns: O, or (O, lse) when the problem returns the LSE."""
    return out if lse is None else (out, lse)


def pointer_arguments(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    problem: Problem,
    lse: torch.Tensor | None = None,
    cache_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor | int | float, ...]:
    """The positional arguments of a strided-pointer kernel, built once per prepared launch."""
    strides = tuple(stride for t in (q, k, v, out) for stride in t.stride()[:3])
    return (q, k, v, out, *feature_buffers(lse, cache_seqlens, q.device), *strides, *size_arguments(problem))


def pointer_runner(
    kernel: triton.JITFunction, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem,
    cache_seqlens: torch.Tensor | None, block_m: int, launch_options: dict[str, Any],
) -> Runner:  # fmt: skip
    """The ``bind`` of a strided-pointer rung (``online`` to ``pipelined``): O (and the LSE) allocated
    once for validated q, k, v; ``run()`` launches ``kernel`` over the ``block_m``-row query tiles of
    every (batch, head) with ``launch_options`` (constexprs, warps, stages) and returns O, or (O, lse)."""
    q, k, v = (kernel_operand(t) for t in (q, k, v))
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = allocate_lse(problem, q.device)
    args = pointer_arguments(q, k, v, out, problem, lse, cache_seqlens)
    grid = (triton.cdiv(problem.seqlen_q, block_m), problem.batch * problem.heads)

    def run() -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        kernel[grid](*args, **launch_options)
        return rung_result(out, lse)

    return run


def size_arguments(problem: Problem) -> tuple[int | float, ...]:
    """The scalar arguments every Triton attention kernel takes after its buffers (``SIZE_SIGNATURE``):
    head counts, lengths and the softmax scale in log2 units."""
    return (problem.heads, problem.kv_heads, problem.seqlen_q, problem.seqlen_k, problem.scale * LOG2_E)


Sized = TypeVar("Sized")


def resized(binder: Sized, problem: Problem) -> Sized:
    """A shallow copy of ``binder`` (triton/decode's binder, gluon/decode's plan: objects holding a ``problem`` and
    its :func:`size_arguments` as ``sizes``) for ``problem``, a longer cache of its family, with both replaced
    (``copy.copy`` costs three times this)."""
    longer = object.__new__(type(binder))
    longer.__dict__.update(binder.__dict__)
    longer.problem, longer.sizes = problem, size_arguments(problem)
    return longer


def compile_pointer_kernel(
    kernel: triton.JITFunction, problem: Problem, constexprs: dict[str, Any], *, num_warps: int, num_stages: int
) -> KernelBinary:
    """A strided-pointer kernel for sm_90a at ``problem``'s dtype (``pointer_signature``), with the
    pointers and strides 16-divisible as a real launch passes them."""
    return compile_triton_sm90(
        kernel,
        pointer_signature(problem.dtype),
        constexprs,
        num_warps=num_warps,
        num_stages=num_stages,
        aligned=POINTER_ALIGNED,
    )


def pointer_signature(dtype: torch.dtype) -> dict[str, str]:
    """The sm_90a compile signature matching ``pointer_arguments`` for fp16 or bf16 operands."""
    element = "*fp16" if dtype == torch.float16 else "*bf16"
    return {
        **{name: element for name in ("Q", "K", "V", "Out")},
        "Lse": "*fp32",
        "CacheSeqlens": "*i32",
        **{name: "i32" for name in POINTER_STRIDES},
        **SIZE_SIGNATURE,
    }


# ----------------------------------------------------------------------------------------------
# Decode (triton/decode and gluon/decode): the paged cache's strides and table, the split workspace
# ----------------------------------------------------------------------------------------------
def kv_row_strides(t: torch.Tensor, paged: bool) -> tuple[int, int, int]:
    """The (batch, head, row) strides the split kernel takes for K or V: those of a (B, Hkv, Sk, D)
    cache, or for a page pool (num_pages, page_size, Hkv, D) its (page, head, slot) strides, the page
    stride standing where the batch stride does."""
    return (t.stride(0), t.stride(2), t.stride(1)) if paged else t.stride()[:3]


def paging_arguments(block_table: torch.Tensor | None) -> tuple[torch.Tensor | None, int | None]:
    """``BlockTable, stride_btb`` of the split kernel: the table (its entries of a row made adjacent)
    and its row stride; ``(None, None)`` for a contiguous cache, which Triton specialises away as
    constexprs, so that build has exactly the parameters and code it had before paging."""
    if block_table is None:
        return None, None
    table = block_table if block_table.stride(1) == 1 else block_table.contiguous()
    return table, table.stride(0)


def split_workspace(problem: Problem, num_splits: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The splits' fp32 partial O (num_splits, B, H, Sq, D) and LSE (num_splits, B, H, Sq); one split
    writes O and the LSE directly and needs none (one-element placeholders). Shared with gluon/decode."""
    partial_shape = (num_splits, problem.batch, problem.heads, problem.seqlen_q)
    partial_shapes = ((*partial_shape, problem.head_dim), partial_shape) if num_splits > 1 else ((1,), (1,))
    out_partial, lse_partial = (torch.empty(shape, dtype=torch.float32, device=device) for shape in partial_shapes)
    return out_partial, lse_partial


def balanced_workspace(problem: Problem, slabs: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The balanced split's fp32 partial O and LSE: ``slabs`` (one per CTA of an M tile's grid) of
    group · Sq packed rows each, (slabs, rows, D) and (slabs, rows)."""
    shape = (slabs, problem.kv_group * problem.seqlen_q)
    return torch.empty((*shape, problem.head_dim), dtype=torch.float32, device=device), torch.empty(
        shape, dtype=torch.float32, device=device
    )
