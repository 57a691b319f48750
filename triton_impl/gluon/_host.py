"""Host code shared by the Gluon rungs: no kernel here, only what their launchers have in common.

* ``GluonConfig`` and the register budgets of the warp-specialised ``gluon/hopper`` kernel, which
  ``gluon/fp8`` launches too (its constants are ``gl.constexpr``: the kernel reads them as well).
* TMA descriptors over (B, H, S, D) tensors (``descriptor``) and their signature types for a
  static compile (``descriptor_type``); ``gluon/decode`` builds its K and V descriptors the same way.
* The registry entry of every Gluon rung (``gluon_implementation``).
* Validation and the capability check of the two prefill rungs (``validate_gluon_inputs``,
  ``gluon_supported``), the hopper kernel's constexprs and launch options, and the sm_90a compile
  of any Gluon kernel without a GPU (``compile_gluon_sm90``).

It is the Gluon twin of ``triton_impl/_host.py``; the device vocabulary is in ``_device.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime.jit import mangle_type

from common.contract.problem import Problem
from common.contract.registry import Implementation, Supports
from common.contract.validation import validate_for_problem
from common.toolchain.arch import check_sm90
from common.toolchain.compile import KernelBinary, compile_triton_sm90
from triton_impl._host import tile_rung_supported

# What the PTX of every Gluon rung holds: TMA loads, wgmma and mbarriers (tiles never come by cp.async).
GLUON_PTX = ("wgmma.mma_async", "cp.async.bulk.tensor", "mbarrier")
GLUON_NOTE = "Gluon has no interpreter path: it runs only on an sm_90 GPU"
# Head dims of the two prefill rungs (gluon/hopper, gluon/fp8).
HEAD_DIMS = (64, 128)
GLUON_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16, torch.float8_e4m3fn: gl.float8e4nv}
# The register file one CTA may use (one CTA per SM).
CTA_REGISTERS = 65536
WARPGROUP_THREADS = 128
# setmaxnreg's ceiling, and the query rows of one consumer warpgroup (one m64 wgmma).
MAX_REGISTERS = 240
CONSUMER_ROWS = 64
# The load partition's register budget per thread (setmaxnreg): it holds only scalars.
LOAD_REGISTERS = gl.constexpr(24)
LOAD_WARPS = gl.constexpr(1)
# Consumer warpgroups: the default partition and one or two workers, each with its own query rows.
CONSUMER_WARPS = gl.constexpr(4)


@dataclass(frozen=True)
class GluonConfig:
    """Tile sizes, ring depth and consumer warpgroups; every field changes the generated code.

    The CTA's query tile is ``consumers`` × ``CONSUMER_ROWS`` rows, one slice per consumer."""

    block_n: int
    num_stages: int
    consumers: int = 2
    # The consumer warpgroups take turns issuing their wgmmas (FA3's ping-pong).
    pingpong: bool = False
    # Row max and row sum as trees of independent instructions (``_device._row_tree``), not as the chain
    # Triton 3.6 makes of ``gl.max`` / ``gl.sum`` over a thread's columns.
    row_tree: bool = False

    @property
    def block_m(self) -> int:
        return self.consumers * CONSUMER_ROWS

    @property
    def num_warps(self) -> int:
        """The default partition's warps: one consumer warpgroup (the other partitions add theirs)."""
        return CONSUMER_WARPS.value

    @property
    def maxnreg(self) -> int:
        """Registers per thread at launch: the register file over every partition's warps, each
        partition padded to whole warpgroups (the load warp's included)."""
        return CTA_REGISTERS // (self._warpgroups * WARPGROUP_THREADS) // 8 * 8

    @property
    def consumer_registers(self) -> int:
        """setmaxnreg of each consumer: what the load warpgroup's budget leaves, in steps of 8."""
        left = CTA_REGISTERS - LOAD_REGISTERS.value * WARPGROUP_THREADS
        return min(MAX_REGISTERS, left // (self.consumers * WARPGROUP_THREADS) // 8 * 8)

    @property
    def _warpgroups(self) -> int:
        return self.consumers + (LOAD_WARPS.value + 3) // 4


def launch_constexprs(config: GluonConfig, problem: Problem, quant_blocks: tuple[int, int] | None = None) -> dict:
    """The hopper kernel's constexprs but num_warps; ``quant_blocks`` (FP8): the Q and K/V quantisation
    block rows. The problem features are flags, so a problem without them compiles the plain kernel."""
    q_rows, kv_rows = quant_blocks or (1, 1)
    return {
        "NUM_STAGES": config.num_stages,
        "CAUSAL": problem.causal,
        "GQA": problem.kv_heads != problem.heads,
        "BOTTOM_RIGHT": problem.bottom_right,
        "HAS_CACHE_SEQLENS": problem.has_cache_seqlens,
        "PINGPONG": config.pingpong,
        "NUM_CONSUMERS": config.consumers,
        "CONSUMER_REGS": config.consumer_registers,
        "FP8": quant_blocks is not None,
        "Q_QUANT_BLOCK": q_rows,
        "KV_QUANT_BLOCK": kv_rows,
        "ROW_TREE": config.row_tree,
    }


def launch_options(config: GluonConfig, problem: Problem, quant_blocks: tuple[int, int] | None = None) -> dict:
    """Everything a launch of the hopper kernel passes by keyword: its constexprs, warps and ``maxnreg``."""
    return {
        **launch_constexprs(config, problem, quant_blocks),
        "num_warps": config.num_warps,
        "maxnreg": config.maxnreg,
    }


def descriptor(tensor: torch.Tensor, box_rows: int, dtype: gl.dtype, box_cols: int | None = None) -> TensorDescriptor:
    """A 4-D TMA descriptor over (B, H, rows, cols): one (batch, head) box of box_rows × box_cols
    (default: all cols, D) per copy."""
    box = (1, 1, box_rows, box_cols or tensor.shape[-1])
    return TensorDescriptor(tensor, list(tensor.shape), list(tensor.stride()), list(box), shared_layout(box, dtype))


@cache
def shared_layout(box: tuple[int, ...], dtype: gl.dtype) -> gl.NVMMASharedLayout:
    """The default NVMMA shared layout of a TMA box of ``dtype``, made once per box and dtype: a frozen
    value that only the box and the dtype decide, and making it costs about 9 µs of host time, twice at
    every bind of gluon/decode (a decode step against a growing cache binds at every step)."""
    return gl.NVMMASharedLayout.get_default_for(list(box), dtype)


def descriptor_type(dtype: torch.dtype, box_rows: int, head_dim: int, box_cols: int | None = None) -> str:
    """The signature type of a 4-D descriptor, as the JIT would derive it from a real one."""
    cols = box_cols or head_dim
    sample = torch.empty((1, 1, box_rows, cols), dtype=dtype)
    return mangle_type(descriptor(sample, box_rows, GLUON_DTYPES[dtype]))


def validate_gluon_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: Problem,
    dtypes: tuple[torch.dtype, ...],
    rung: str,
    cache_seqlens: torch.Tensor | None = None,
) -> Problem:
    """Inputs of both prefill rungs, with every problem feature (GQA, both alignments, cache_seqlens, lse)."""
    if problem.has_cache_seqlens != (cache_seqlens is not None):
        raise ValueError(
            f"{rung}: cache_seqlens must be given exactly when the problem has per-sequence lengths: "
            f"has_cache_seqlens={problem.has_cache_seqlens}, got cache_seqlens={cache_seqlens!r}"
        )
    checked = validate_for_problem(q, k, v, problem, cache_seqlens=cache_seqlens, dtypes=dtypes, head_dims=HEAD_DIMS)
    if checked.scale < 0:
        raise ValueError(f"softmax_scale must be >= 0 for {rung}, got {checked.scale}")
    return checked


def gluon_implementation(
    rung: str, supports: Supports, compile_sm90: Callable[[Problem], list[KernelBinary]], *,
    required_ptx: tuple[str, ...] = (), notes: str = "", **fields: Any,
) -> Implementation:  # fmt: skip
    """The registry entry of ``gluon/<rung>``: an sm_90 GPU only, its PTX holding ``GLUON_PTX`` and
    ``required_ptx`` and no ``cp.async``, ``notes`` followed by ``GLUON_NOTE``; ``fields`` are the rest
    (``prepare``, ``bind``, ...). Written once, so the three rungs state these facts alike."""
    return Implementation.named(
        f"gluon/{rung}", supports=supports, compile_sm90=compile_sm90, runs_on_cpu=False,
        required_ptx=(*GLUON_PTX, *required_ptx), forbidden_ptx=("cp.async",),
        notes="; ".join(filter(None, (notes, GLUON_NOTE))), **fields,
    )  # fmt: skip


def gluon_supported(problem: Problem, device: torch.device, rung: str) -> tuple[bool, str]:
    """Device, head-dim, feature and scale checks of both prefill rungs (after their own dtype check).
    Both implement every problem feature (GQA, both causal alignments, cache_seqlens, the LSE)."""
    ok, reason = tile_rung_supported(rung, problem, HEAD_DIMS)
    if not ok:
        return ok, reason
    return gluon_device_supported(rung, device, "warpgroup_mma is Hopper's")


def gluon_device_supported(rung: str, device: torch.device, why: str) -> tuple[bool, str]:
    """Every Gluon rung needs an sm_90 GPU: there is no interpreter path (``why``: the Hopper feature)."""
    if device.type != "cuda":
        return False, f"{rung} needs a CUDA GPU: Gluon has no interpreter path, got {device}"
    return check_sm90(rung, device, why)


def feature_arguments(problem: Problem) -> tuple[dict[str, str], dict[str, object]]:
    """Signature types and constexpr values of the feature arguments for a static compile, as a
    launch passes them: ``CacheSeqlens`` an int32 pointer, or None without per-sequence lengths."""
    if problem.has_cache_seqlens:
        return {"CacheSeqlens": "*i32", "kv_heads": "i32"}, {}
    return {"CacheSeqlens": "constexpr", "kv_heads": "i32"}, {"CacheSeqlens": None}


def compile_gluon_sm90(
    kernel: object,
    signature: dict[str, str],
    constexprs: dict[str, object],
    options: dict[str, int],
    aligned: tuple[str, ...],
) -> KernelBinary:
    """Compile a Gluon kernel for sm_90a without a GPU, through ``common.reporting.static``'s Triton
    path; ``aligned``: the pointer and stride arguments a launch passes 16-divisible."""
    from triton.experimental.gluon._runtime import GluonASTSource

    return compile_triton_sm90(
        kernel, signature, constexprs, aligned=aligned, options=options, source_type=GluonASTSource
    )
