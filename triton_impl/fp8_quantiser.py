"""The fused FP8 quantiser, shared by the three stacks' FP8 rungs: ``triton_impl/fp8.py``,
``triton_impl/gluon/fp8.py`` and ``cute_impl/fp8.py`` each run it before their attention kernel. It
turns Q, K and V from bf16/fp16 into the e4m3 operands and scales those kernels read, the same values
as ``common.contract.fp8.quantise``, in one Triton launch with block scales. It is a Triton kernel,
so it lives with the Triton rungs. This module is its host side: the knobs (``QuantiserConfig``), the
plan of a launch (each tensor's geometry, program counts and constexprs), ``FusedQuantiser`` (buffers
allocated once per signature), its sm_90a build and the check of its operands against the
reference. The kernel, with the algorithm step by step, is ``triton_impl/fp8_quantiser_kernel.py``.

Why: ``quantise`` is the reference, written as torch code (a rotation GEMM, abs, amax, pad, repeat,
divide, clamp, cast, then V transposed and permuted by indexing), which reads and writes each tensor
many times and launches dozens of kernels per call. Here each tile is read once and written once, in
the layout its kernel reads. The work is memory-bound (Q, K, V read in 16 bits, written in 8), so the
kernel is built to keep bytes in flight and to spend few instructions per element.

Knobs (``QuantiserConfig``, timed by ``python -m bench.fp8_quantiser --sweep``; none changes a byte):
``single_launch`` (one launch: no gaps or tails between tensors), ``tiles_per_program`` (the sign
matrix loaded once for several tiles, fewer programs to schedule; more leave a longer tail),
``prefetch`` / ``num_stages`` (the next tile's bytes in flight while this one is computed: the first
costs 32 registers a thread, the second 32 KB of shared memory a stage, so both lower the programs an SM
holds; Triton 3.6 issues a 2-stage loop's next load at the end of the body, after this tile's stores, so
that only 3 or more stages keep a load in flight while a tile is computed), ``num_warps``, ``maxnreg``
(8 warps at 128 registers keep two programs an SM; a lower cap spills, and at 80 ptxas cannot place the
wgmma accumulators), ``division``, ``programs_per_sm`` (a persistent grid whose programs walk Q, K and
V in turn), ``tma`` (tiles of rows in order copied by TMA into a ``num_stages``-deep shared-memory ring:
more bytes in flight an SM than registers allow, and Q's and K's tiles reach the rotation's wgmma without
passing registers), ``interleave`` (Q's, K's and V's programs alternate, so that rotated tiles, bound by
instructions, share each SM with V's, bound by memory) and ``value_config`` (V in a launch of its own, whose
binary holds V's code alone: a cp.async ring and twice the warps under a 64-register cap still fit two programs
an SM), ``l2_prefetch`` (the L2 asked for the tile after next: bytes in flight that hold no register) and
``register_operand`` (the rotation's wgmma reads the tile from registers: no store of it to shared memory, no proxy
fence; with a cp.async ring, read by ``ldmatrix`` from the ring's slot).
``default_config(D, quantisation)`` is what the rungs run; ``python -m bench.fp8_quantiser --ab`` times the
candidates against the read bandwidth, ``bench/fp8_kv_quantiser_bw.sh`` the K/V launch's against a torch copy.

Equality with the reference (``operand_differences``): without rotation the arithmetic is the same
operation for operation (exact amax, one correctly rounded division, one rounding), so bytes and
scales are bit-identical. The rotation's sums run in another order than torch's fp32 GEMM (and the
tensor cores accumulate in their own), so a rotated value can differ from the reference's in its last
fp32 bits: an amax, hence a scale, by a few ulps, and the rare element that sits on an e4m3 rounding
midpoint by exactly one e4m3 step. The emulation therefore never assumes the reference's bytes:
every fp8 rung's ``emulate`` quantises with this kernel on CUDA (``quantise_for_kernel``) and judges
the kernel against exactly what it read.

Devices: CUDA tensors always take this kernel (a case it cannot run raises ``ValueError``, never a
silent fallback). CPU tensors run it under the Triton interpreter (``TRITON_INTERPRET=1``, the CPU
tests), with three operations replaced (``fp8_quantiser_kernel``'s docstring). ``quantise_for_kernel``
on CPU tensors outside the interpreter uses the torch reference: the FP8 rungs never run on a CPU,
so that path only feeds the CPU tests of the emulation.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from itertools import product
from typing import NamedTuple

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from common.contract.capability import check_shared_memory
from common.contract.devices import lasting, triton_interpreting
from common.contract.fp8 import (
    KEY_GROUP,
    KernelOperands,
    Quantisation,
    ValueLayout,
    kernel_operands,
    quantise,
    random_hadamard,
)
from common.contract.problem import Problem
from common.contract.splits import DEFAULT_SM_COUNT, sm_count
from common.toolchain.compile import KernelBinary
from common.toolchain.releases import triton_release
from triton_impl.fp8_quantiser_kernel import (
    ROTATE_BUTTERFLY,
    ROTATE_KRONECKER,
    ROTATE_NONE,
    ROTATE_TENSOR_CORE,
    STEP_AMAX,
    STEP_BLOCK,
    STEP_CAST,
    LaunchSetup,
    TensorArgs,
    TensorKind,
    quantise_kernel,
    tensor_amax_kernel,
)
from triton_impl.hopper import descriptor

ROTATION_METHODS = ("tensor_core", "butterfly", "kronecker")
# Each method's rotation in the kernel (``TensorKind.ROTATE``).
ROTATE_OF_METHOD = {"tensor_core": ROTATE_TENSOR_CORE, "butterfly": ROTATE_BUTTERFLY, "kronecker": ROTATE_KRONECKER}
# The largest head dim of each method that has one: the butterflies' reshapes spill at D = 256 (16 warps, 128
# registers a thread), and so do the Kronecker rotation's sixteen 16-column blocks (16 to 40 bytes, sm_90a): refused
# there.
MAX_HEAD_DIM_OF_METHOD = {"butterfly": 128, "kronecker": 128}
# Measured on the GPU by bench/fp8_quantiser.py; until then the tensor-core product, the reference's own form. The
# Kronecker rotation runs P1's K in 1.84-2.16x its time (H100, bench/fp8_kronecker_ab.py, 2026-12-06).
DEFAULT_ROTATION_METHOD = "tensor_core"
# How each element is divided by its scale (``fp8_quantiser_kernel``'s docstring, step 4).
DIVISIONS = ("reciprocal", "ieee")
INPUT_DTYPES = (torch.float16, torch.bfloat16)
# Newton corrections after q = x · (1/s): one where x is a bf16/fp16 value (exact for every such value and
# every scale of such an amax: tests/test_fp8_quantiser.py checks all pairs), Markstein's two where the
# rotation made x any fp32 value.
UNROTATED_CORRECTIONS, ROTATED_CORRECTIONS = 1, 2
# Elements per thread of a tile: 64 fp32 values keep the tile, the rotation and the cast in registers.
ELEMENTS_PER_THREAD = 64
MAX_WARPS = 16
# The per-tensor amax reduction: one program per tensor reads its tile amaxes in chunks.
AMAX_CHUNK = 1024
AMAX_WARPS = 4
# Tolerances of ``operand_differences`` where the rotation's summation order differs (module docstring):
# a scale may move by a few fp32 ulps (measured: up to 7e-7; 2^-12 is 2^-8 of an e4m3 step), and only
# elements within fp32 noise of a rounding midpoint may move, each by one step: at most this fraction of a
# tensor (torch's fp32 rotation against fp64 moves 1e-5 of them at D=128, none at D=64, where
# 1/sqrt(D) is a power of two).
ROTATED_SCALE_RTOL = 2.0**-12
ROTATED_MAX_DIFFERING_FRACTION = 1e-3


@dataclass(frozen=True)
class QuantiserConfig:
    """How the kernel runs, never what it computes: every configuration writes the same bytes and
    scales (the module docstring's "Knobs" says what each one changes on the GPU).

    * ``single_launch``: Q, K and V in one launch (program ranges per tensor), else one launch each.
    * ``tiles_per_program``: tiles each program quantises in a loop (1: one tile per program);
      the rotation operand is loaded once per program.
    * ``num_stages``: tiles in flight per program in that loop (Triton's software pipeline: the
      next tiles' loads go to shared memory by cp.async while this one is computed); 1 = none.
    * ``prefetch``: the same overlap by hand, in registers: each tile's load is issued before the
      previous tile is computed (no shared memory; the tile's registers twice).
    * ``num_warps``: None = ``ELEMENTS_PER_THREAD`` fp32 values per thread of a tile.
    * ``maxnreg``: register cap per thread (None: ptxas's choice), which sets how many programs fit an SM.
    * ``division``: ``reciprocal`` (each block's reciprocal once, then one or two exact Newton
      corrections per element) or ``ieee`` (``div.rn`` per element); both give the correctly rounded
      quotient, a zero's sign included.
    * ``tma``: each tile of a tensor whose rows are in order (Q, K; V in key order, not permuted) is one
      TMA copy from the tensor's descriptor into shared memory, ``num_stages`` - 1 of them in flight
      (Triton's pipeliner, mbarriers); the rotation's wgmma reads the tile there. Needs inputs whose
      strides and base are 16-byte aligned with D contiguous (``tma_descriptor``); not with ``prefetch``.
    * ``programs_per_sm``: 0 = each program works on one tensor (program ranges, above); n > 0 = a
      persistent grid of n programs per SM (the device's SM count), each walking Q's tiles program,
      program + grid, ..., then K's, then V's, so that every program carries the same share of each
      tensor: no tensor's programs finish early and leave their SMs idle (the rotated Q and K tiles
      cost more than V's), and no second wave. Needs one launch and ``tiles_per_program`` = 1.
    * ``interleave``: programs of Q, K and V alternate in launch order (Q, K, V, Q, ... or K, V, K, ... without Q's,
      while each has programs left), not Q's, then K's, then V's. Needs one launch and no persistent grid.
    * ``launch_dependents``: each program first executes ``griddepcontrol.launch_dependents``, so that a kernel
      launched next with programmatic dependent launch (cute/fp8's ``PROGRAMMATIC_LAUNCH``) may start its CTAs
      once every program has started; that kernel waits (``griddepcontrol.wait``) before it reads what this one
      writes. Without such a kernel the instruction does nothing. Not under the interpreter.
    * ``value_config``: V in a launch of its own with this configuration (its warps, register cap, overlap and
      tiles per program), after the launch of Q and K (this configuration's); each launch's binary then holds only
      its own tensors' code (``LaunchSetup.HOLDS_Q``, ...), so that K's rotation (a 32 KB sign matrix in shared memory,
      the wgmma accumulators) and V's transposition get registers and shared memory of their own: 16 warps under a
      64-register cap with a cp.async ring (``num_stages``) fit two programs an SM where a binary holding every
      tensor's branch fits fewer. Needs program ranges in both configurations (no persistent grid, no interleaving).
    * ``l2_prefetch``: each iteration also asks the L2 for the tile after the next (``prefetch.global.L2``, one
      instruction a thread and a tile), so that the next iteration's load of it hits the L2: up to twice the bytes
      in flight from the memory, none of them in registers or shared memory. Not under the interpreter.
    * ``register_operand``: the tensor-core rotation's wgmma takes the tile from registers, not from a copy in
      shared memory: no store of the tile, no ``fence.proxy.async`` (a ``MEMBAR`` in SASS) and one barrier fewer a
      tile; with a cp.async ring (``num_stages`` > 1) each thread reads its operand fragment by ``ldmatrix`` from the
      ring's slot, so the ring needs no extra tile (a 3-stage K-only binary at D=128: 114,688 bytes, two programs an
      SM, against 147,456 and one). No effect without the tensor-core rotation or under the interpreter; not with
      ``tma`` (its wgmma already reads the copy where it landed).
    * ``ptx_options``: extra ptxas flags (Triton's ``ptx_options``), e.g. ``--regAllocOptLevel=4`` where a release's
      own ``--regAllocOptLevel=2`` (Triton 3.7 to 3.9) spills a build that fits its registers without it. Not under
      the interpreter.
    """

    single_launch: bool = True
    tiles_per_program: int = 1
    num_stages: int = 1
    prefetch: bool = False
    num_warps: int | None = None
    maxnreg: int | None = None
    division: str = "reciprocal"
    programs_per_sm: int = 0
    tma: bool = False
    interleave: bool = False
    launch_dependents: bool = False
    value_config: QuantiserConfig | None = None
    l2_prefetch: bool = False
    register_operand: bool = False
    ptx_options: str | None = None

    def __post_init__(self) -> None:
        if self.tiles_per_program < 1 or self.num_stages < 1:
            raise ValueError(
                f"tiles_per_program and num_stages must be >= 1, got {self.tiles_per_program} and {self.num_stages}"
            )
        if self.prefetch and self.num_stages > 1:
            raise ValueError("prefetch (registers) and num_stages > 1 (shared memory) both overlap loads: choose one")
        if self.prefetch and self.tma:
            raise ValueError("prefetch (registers) and tma (shared memory) both overlap loads: choose one")
        if self.register_operand and self.tma:
            raise ValueError("register_operand reads the tile into registers; tma's wgmma reads it in shared memory")
        if self.num_warps is not None and self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be a power of two from 1 to 16 or None, got {self.num_warps}")
        if self.maxnreg is not None and not 24 <= self.maxnreg <= 255:
            raise ValueError(f"maxnreg must lie in [24, 255] or be None, got {self.maxnreg}")
        if self.division not in DIVISIONS:
            raise ValueError(f"division must be one of {DIVISIONS}, got {self.division!r}")
        if self.programs_per_sm < 0:
            raise ValueError(f"programs_per_sm must be >= 0 (0: no persistent grid), got {self.programs_per_sm}")
        if self.programs_per_sm and (not self.single_launch or self.tiles_per_program != 1):
            raise ValueError(
                "a persistent grid (programs_per_sm > 0) walks every tensor in one launch: it needs "
                f"single_launch=True and tiles_per_program=1, got {self.single_launch} and {self.tiles_per_program}"
            )

        if self.interleave and (not self.single_launch or self.programs_per_sm):
            raise ValueError(
                "interleave orders the programs of one launch: it needs single_launch=True and programs_per_sm=0, "
                f"got {self.single_launch} and {self.programs_per_sm}"
            )
        value = self.value_config
        if value is not None and (value.value_config or any(c.programs_per_sm or c.interleave for c in (self, value))):
            raise ValueError(
                "value_config launches V on its own by program ranges: neither configuration may have a persistent "
                f"grid or interleaving, nor V's a value_config of its own; got {self.describe()}"
            )

    def describe(self) -> str:
        """One compact line for tables: launches, tiles/program, stages, warps, registers, division."""
        overlap = "prefetch" if self.prefetch else f"{'tma ' if self.tma else ''}stages={self.num_stages}"
        schedule = (
            f"persistent {self.programs_per_sm}/SM" if self.programs_per_sm else f"tiles/prog={self.tiles_per_program}"
        )
        return (
            f"{'1 launch' if self.single_launch else '3 launches'}{' interleaved' if self.interleave else ''} "
            f"{schedule} {overlap} warps={self.num_warps or 'auto'} maxnreg={self.maxnreg or '-'}"
            f"{f' ptxas {self.ptx_options}' if self.ptx_options else ''} {self.division}"
            f"{' launch-dependents' if self.launch_dependents else ''}{' l2-prefetch' if self.l2_prefetch else ''}"
            f"{' register-operand' if self.register_operand else ''}"
            f"{f' | V apart: {self.value_config.describe()}' if self.value_config else ''}"
        )


# What the rungs run (their quantisers read it when built, so bench/fp8_quantiser.py can swap it), per Triton
# release. The GPU sweep (bench/fp8_quantiser.py --sweep, H100, P1 Q+K+V with block scales and rotation,
# 2026-11-26; docs/perf-log.md) chose one launch, 8 tiles a program, 2 tiles in flight through shared memory:
# 149.3 µs against 217.3 for 4 tiles without overlap and 197.6 for the three launches before the knobs.
PIPELINED_CONFIG = QuantiserConfig(tiles_per_program=8, num_stages=2)
DEFAULT_CONFIG = PIPELINED_CONFIG
# The next tile prefetched in registers under a 128-register cap keeps a load in flight while a tile is
# computed (Triton 3.6 waits for the shared-memory pipeline's next tile at the top of each iteration):
# 113.6 µs against PIPELINED_CONFIG's 137.6 at P1 on an H200 under Triton 3.6 (bench/fp8_quantiser.py --ab,
# 2026-11-29, results/h200/fp8-quantiser-ab/). Under Triton 3.9 it is 78.3 µs against 135.5 for K and V
# (cute/fp8's launch), 118.4 against 192.3 for Q, K and V (H200, 2026-12-01, results/h200/fp8-quantiser-3.9/):
# PIPELINED_CONFIG's 2-stage ring takes 131,072 bytes of shared memory there, one program an SM. It spills at D=64
# (8 bytes under 3.6 to 3.8), for per-tensor scales at D=128 (16 bytes) and with the butterfly rotation (384 bytes),
# so it is the default of block scales with the tensor-core rotation at D=128 (tests/test_fp8_quantiser.py compiles
# every default build spill-free in each release's CI leg).
PREFETCH_CONFIG = QuantiserConfig(tiles_per_program=8, prefetch=True, maxnreg=128)
# Triton release -> ptxas flags PREFETCH_CONFIG's D=128 build takes there: 3.9's own --regAllocOptLevel=2 spills it (88
# bytes a thread, 112 of spill stores; 3.7 and 3.8 pass the same flag without a spill), level 4 assembles it
# spill-free in 128 registers, as triton/hopper's and triton/fp8's release overrides do.
PREFETCH_PTX_OPTIONS = {"3.9": "--regAllocOptLevel=4"}
D128_CONFIG = replace(PREFETCH_CONFIG, ptx_options=PREFETCH_PTX_OPTIONS.get(triton_release()))
# (head dim, quantisation name, rotation method, query) -> its configuration where it is not DEFAULT_CONFIG. query
# False (K and V only, half of the tiles rotated) has its own key: bench/fp8_kv_quantiser_ab.sh times its candidates.
# At D=64 the K/V launch (query False: cute/fp8) runs V apart with the register prefetch (4 warps, 128 registers,
# four programs an SM), where the one launch's 2-stage ring reads V transposed by bank-conflicted 2-byte loads: 119.6
# against 163.8 µs at B=4 H=32 S=8192, cute/fp8 end to end 2525.5 -> 2483.0 µs causal, 3950.8 -> 3912.3 not (H200,
# Triton 3.6, results/h200/fp8-d64-kv-apart/). Under 3.7 and 3.8 V's binary spills 8 bytes (3.9: 184), so 3.6 only.
D64_KV_CONFIG = replace(PIPELINED_CONFIG, value_config=PREFETCH_CONFIG)
KIND_CONFIGS: dict[tuple[int, str, str, bool], QuantiserConfig] = {
    (128, *kind): D128_CONFIG for kind in product(("block+rotation", "block"), ("tensor_core",), (True, False))
} | ({(64, "block+rotation", "tensor_core", False): D64_KV_CONFIG} if triton_release() == "3.6" else {})


def default_config(
    head_dim: int, quantisation: Quantisation, rotation_method: str | None = None, *, query: bool = True
) -> QuantiserConfig:
    """What a quantiser of ``head_dim``, ``quantisation``, ``rotation_method`` (default ``DEFAULT_ROTATION_METHOD``)
    and ``query`` (``FusedQuantiser``'s) runs: its ``KIND_CONFIGS`` entry, else ``DEFAULT_CONFIG``."""
    method = rotation_method or DEFAULT_ROTATION_METHOD
    return KIND_CONFIGS.get((head_dim, quantisation.name, method, query), DEFAULT_CONFIG)


def use_config(config: QuantiserConfig) -> None:
    """Make ``config`` every head dim's default (bench/fp8_quantiser.py times candidates through the rungs)."""
    global DEFAULT_CONFIG, KIND_CONFIGS
    DEFAULT_CONFIG, KIND_CONFIGS = config, {}


@contextlib.contextmanager
def using_config(config: QuantiserConfig) -> Iterator[None]:
    """:func:`use_config` for the block; the defaults as they were after it."""
    global DEFAULT_CONFIG, KIND_CONFIGS
    saved = DEFAULT_CONFIG, KIND_CONFIGS
    use_config(config)
    try:
        yield
    finally:
        DEFAULT_CONFIG, KIND_CONFIGS = saved


# ----------------------------------------------------------------------------------------------------
# Host
# ----------------------------------------------------------------------------------------------------
@functools.cache
def _rotation_operand_tensor(
    head_dim: int, seed: int, method: str, dot_dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, float]:
    """What ``_rotation_operand`` reads for random_hadamard(head_dim, seed): (sign matrix in
    ``dot_dtype``, c) for the tensor cores, (first row, unused 1.0) for the butterflies. Built once per
    key, like the matrix itself (c read here, from the host's matrix). Built on the host and copied by ``lasting``'s
    stream, which waits for no stream of the caller (``tests/test_lasting_buffers.py``)."""
    matrix = random_hadamard(head_dim, seed)
    if method == "tensor_core":
        signs = torch.sign(matrix).to(dot_dtype).contiguous()
        return lasting(lambda: signs.to(device), device), matrix[0, 0].abs().item()
    first_row = matrix[0].contiguous()
    return lasting(lambda: first_row.to(device), device), 1.0


def _check_quantisation(
    quantisation: Quantisation, value_layout: ValueLayout, head_dim: int, rotation_method: str
) -> None:
    for name, value in (("head_dim", head_dim), ("q_block_rows", quantisation.q_block_rows),
                        ("kv_block_rows", quantisation.kv_block_rows)):  # fmt: skip
        if value < 1 or value & (value - 1):  # not a power of two
            raise ValueError(f"the fused fp8 quantiser needs a power-of-two {name}, got {value}")
    if value_layout.permuted and quantisation.kv_block_rows % KEY_GROUP:
        raise ValueError(
            f"a permuted V layout needs kv_block_rows that are whole groups of {KEY_GROUP} keys, "
            f"got {quantisation.kv_block_rows}"
        )
    most = MAX_HEAD_DIM_OF_METHOD.get(rotation_method)
    if quantisation.rotation and most is not None and head_dim > most:
        raise ValueError(
            f"the {rotation_method} rotation runs up to head_dim {most} (at more it spills registers); "
            f"got {head_dim}: use rotation_method='tensor_core'"
        )


def _check_signature(
    q_shape: tuple, kv_shape: tuple, dtype: torch.dtype, device: torch.device, rotation_method: str
) -> None:
    if rotation_method not in ROTATION_METHODS:
        raise ValueError(f"rotation_method must be one of {ROTATION_METHODS}, got {rotation_method!r}")
    if dtype not in INPUT_DTYPES:
        raise TypeError(f"the fused fp8 quantiser reads fp16 or bf16, got {dtype}")
    if device.type != "cuda" and not (device.type == "cpu" and triton_interpreting()):
        raise ValueError(f"the fused fp8 quantiser needs a CUDA device, or CPU under TRITON_INTERPRET=1; got {device}")
    if len(q_shape) != 4 or len(kv_shape) != 4:
        raise ValueError(f"q must be (B, H, Sq, D) and k, v (B, Hkv, Sk, D), got {q_shape} and {kv_shape}")
    if q_shape[0] != kv_shape[0] or q_shape[3] != kv_shape[3]:
        raise ValueError(f"q {q_shape} and k, v {kv_shape} differ in batch or head_dim")


def _tile_rows_of(quantisation: Quantisation) -> int:
    """Rows of a tile: the larger block (Q's 64-row blocks go two to a 128-row tile), so that every
    tensor's tiles are the same size and a launch needs one warp count."""
    return max(quantisation.q_block_rows, quantisation.kv_block_rows)


def _num_warps(tile_rows: int, head_dim: int) -> int:
    """Warps for a (tile_rows, D) tile at ELEMENTS_PER_THREAD fp32 values per thread (4 to MAX_WARPS)."""
    return max(4, min(MAX_WARPS, tile_rows * head_dim // (32 * ELEMENTS_PER_THREAD)))


def shared_bytes(
    head_dim: int,
    dtype: torch.dtype,
    quantisation: Quantisation,
    rotation_method: str | None = None,
    config: QuantiserConfig | None = None,
) -> int:
    """Shared memory one program of ``quantise_kernel`` needs at this configuration (Triton allocates
    it; nothing here is declared). The terms, in the input's element size: the tensor-core rotation's
    D x D sign matrix, kept for the whole program; in each tensor's branch (Q, K, V, whose buffers
    Triton does not share) the ``num_stages - 1`` tiles in flight; one more tile for the rotation's
    wgmma operand and the transposed store's exchange. sm_90a builds under Triton 3.8 use this much at
    D = 256 with block scales and rotation, and less elsewhere (3.6: 294,912 bytes there); the
    capability-matrix test compiles every configuration a check accepts and holds it to the budget.
    With ``tma`` the three branches share one ring of ``num_stages`` boxes, and the e4m3 tile's exchange
    comes on top: 147,480 and 180,256 bytes for 3 and 4 stages at D = 128 with rotation under Triton 3.6
    and 3.8 (persistent grids; 8 tiles a program under 3.8 takes more), this estimate less the barriers."""
    config = config or default_config(head_dim, quantisation, rotation_method)
    rotation_method = rotation_method or DEFAULT_ROTATION_METHOD
    element = dtype.itemsize
    tile_elements = _tile_rows_of(quantisation) * head_dim
    tile = tile_elements * element
    sign_matrix = head_dim * head_dim * element if quantisation.rotation and rotation_method == "tensor_core" else 0
    if config.tma:
        return sign_matrix + config.num_stages * tile + tile_elements
    return sign_matrix + (3 * (config.num_stages - 1) + 1) * tile


def shared_memory_supported(rung: str, problem: Problem, quantisation: Quantisation) -> tuple[bool, str]:
    """The capability check's part for the fused quantiser an FP8 rung runs before its kernel: refused
    where its shared memory (``shared_bytes``, default rotation method and configuration) exceeds sm_90's."""
    needed = shared_bytes(problem.head_dim, problem.dtype, quantisation)
    config = default_config(problem.head_dim, quantisation)
    words = (f"the fused fp8 quantiser at head_dim {problem.head_dim} ({quantisation.name}, "
             f"{_tile_rows_of(quantisation)}-row tiles, {config.num_stages} stages)")  # fmt: skip
    return check_shared_memory(rung, words, needed)


def _tensor_kinds(
    quantisation: Quantisation, value_layout: ValueLayout, rotation_method: str
) -> tuple[TensorKind, ...]:
    """Q and K in rows, rotated if asked; V transposed in its layout, never rotated."""
    rotate = ROTATE_NONE.value
    if quantisation.rotation:
        rotate = ROTATE_OF_METHOD[rotation_method].value
    qk_corrections = UNROTATED_CORRECTIONS if rotate == ROTATE_NONE.value else ROTATED_CORRECTIONS
    q_rows, kv_rows = quantisation.q_block_rows, quantisation.kv_block_rows
    return (
        TensorKind(q_rows, rotate, TRANSPOSED=False, PERMUTED=False, CORRECTIONS=qk_corrections),
        TensorKind(kv_rows, rotate, TRANSPOSED=False, PERMUTED=False, CORRECTIONS=qk_corrections),
        TensorKind(kv_rows, ROTATE_NONE.value, TRANSPOSED=True, PERMUTED=value_layout.permuted,
                   CORRECTIONS=UNROTATED_CORRECTIONS),
    )  # fmt: skip


def _steps(quantisation: Quantisation) -> tuple[int, ...]:
    return (STEP_BLOCK.value,) if quantisation.block else (STEP_AMAX.value, STEP_CAST.value)


@dataclass(frozen=True)
class _TensorGeometry:
    """One tensor's sizes as the kernel sees them: output shape, heads, rows the scales cover (S),
    rows the tiles cover (V: the padded keys), and the counts of tiles and scale blocks."""

    out_shape: tuple[int, ...]
    heads: int
    seqlen: int
    out_rows: int
    tiles_per_head: int
    tiles: int
    scale_shape: tuple[int, int, int]

    def arguments(self, x, out, scales, tile_amax, tensor_amax) -> TensorArgs:
        """The kernel's TensorArgs for input ``x`` (a tensor, or a mock pointer with shape and strides for builds)."""
        return TensorArgs(x, *x.stride(), self.heads, self.seqlen, self.tiles_per_head, self.tiles, out,
                          self.out_rows, scales, self.scale_shape[-1], tile_amax, tensor_amax)  # fmt: skip


def tma_descriptor(x, box_rows: int) -> TensorDescriptor:
    """x (B, H, S, D) as the 4-D descriptor ``QuantiserConfig.tma`` loads (``triton_impl.hopper.descriptor``:
    one (batch, head) box of ``box_rows`` x D a copy); refused unless D is contiguous and the base and the
    other strides are 16-byte aligned, as TMA needs."""
    element = x.dtype.itemsize
    aligned = x.stride()[-1] == 1 and all(stride * element % 16 == 0 for stride in x.stride()[:-1])
    if not aligned or x.data_ptr() % 16:
        raise ValueError(
            f"the fused fp8 quantiser's tma configuration needs inputs with D contiguous and a 16-byte aligned base "
            f"and strides; got strides {tuple(x.stride())} of {element}-byte elements at address {x.data_ptr():#x}"
        )
    return descriptor(x, box_rows)


def _geometries(
    q_shape: tuple[int, ...], kv_shape: tuple[int, ...], quantisation: Quantisation, value_layout: ValueLayout
) -> tuple[_TensorGeometry, ...]:
    batch, heads, seqlen_q, head_dim = q_shape
    _, kv_heads, seqlen_k, _ = kv_shape
    tile_rows = _tile_rows_of(quantisation)
    padded_keys = value_layout.padded_keys(seqlen_k)
    geometries = []
    for out_shape, tensor_heads, seqlen, out_rows, block_rows in (
        (q_shape, heads, seqlen_q, seqlen_q, quantisation.q_block_rows),
        (kv_shape, kv_heads, seqlen_k, seqlen_k, quantisation.kv_block_rows),
        ((batch, kv_heads, head_dim, padded_keys), kv_heads, seqlen_k, padded_keys, quantisation.kv_block_rows),
    ):
        tiles_per_head = -(-out_rows // tile_rows)
        geometries.append(
            _TensorGeometry(tuple(out_shape), tensor_heads, seqlen, out_rows, tiles_per_head,
                            batch * tensor_heads * tiles_per_head, (batch, tensor_heads, -(-seqlen // block_rows)))
        )  # fmt: skip
    return tuple(geometries)


def _programs(
    geometries: tuple[_TensorGeometry, ...], config: QuantiserConfig, sm_count: int, query: bool = True
) -> tuple[int, ...]:
    """Programs per tensor: its tiles, ``tiles_per_program`` to a program (Q none without ``query``); with a persistent
    grid, the grid (``programs_per_sm`` x ``sm_count``, at most the largest tensor's tiles) for every tensor."""
    if config.programs_per_sm:
        grid = min(config.programs_per_sm * sm_count, max(geometry.tiles for geometry in geometries))
        return (grid,) * len(geometries)
    programs = tuple(-(-geometry.tiles // config.tiles_per_program) for geometry in geometries)
    return programs if query else (0, *programs[1:])


# ``_Launch.holds`` of a binary that holds every tensor's code (what a launch without ``value_config`` builds).
ALL_TENSORS = (True, True, True)


class _Launch(NamedTuple):
    """One launch of a pass: its program counts (Q, K, V), its configuration, and whether its binary holds each
    tensor's code (``LaunchSetup``'s ``HOLDS_Q``, ``HOLDS_K``, ``HOLDS_V``)."""

    programs: tuple[int, ...]
    config: QuantiserConfig
    holds: tuple[bool, ...] = ALL_TENSORS


def _launch_plans(
    geometries: tuple[_TensorGeometry, ...], config: QuantiserConfig, sm_count: int, query: bool = True
) -> tuple[_Launch, ...]:
    """The launches of a pass: ``config``'s, each binary holding every tensor's code (the default's binary), or with
    ``config.value_config`` Q's and K's under ``config``, then V's under its own, each binary its own tensors' only."""
    programs = _programs(geometries, config, sm_count, query)
    if config.value_config is None:
        return tuple(_Launch(counts, config) for counts in _launches(programs, config.single_launch))
    value_programs = _programs(geometries, config.value_config, sm_count, query)[2]
    first = _launches((*programs[:2], 0), config.single_launch)
    return (
        *(_Launch(counts, config, tuple(count > 0 for count in counts)) for counts in first),
        _Launch((0, 0, value_programs), config.value_config, (False, False, True)),
    )


def _grid(programs: tuple[int, ...], config: QuantiserConfig) -> int:
    """Programs of one launch: the tensors' ranges back to back, or the persistent grid they share."""
    return max(programs) if config.programs_per_sm else sum(programs)


def _launches(programs: tuple[int, ...], single_launch: bool) -> tuple[tuple[int, ...], ...]:
    """Program counts (Q, K, V) of each launch of a pass: all in one, or one tensor per launch (none for a
    tensor without programs: Q's where the kernel quantises it)."""
    if single_launch:
        return (programs,)
    return tuple(tuple(count if index == tensor else 0 for index, count in enumerate(programs))
                 for tensor in range(len(programs)) if programs[tensor])  # fmt: skip


def _launch_options(
    quantisation: Quantisation,
    value_layout: ValueLayout,
    rotation_method: str,
    config: QuantiserConfig,
    head_dim: int,
    step: int,
    interpreted: bool,
    holds: tuple[bool, ...] = ALL_TENSORS,
) -> dict:
    """``quantise_kernel``'s constexprs and launch options for one pass (``holds``: ``_Launch.holds``)."""
    tile_rows = _tile_rows_of(quantisation)
    q_kind, k_kind, v_kind = _tensor_kinds(quantisation, value_layout, rotation_method)
    setup = LaunchSetup(head_dim, int(math.log2(head_dim)), tile_rows, step, config.num_stages, config.prefetch,
                        config.division == "reciprocal", config.programs_per_sm > 0, config.tma, config.interleave,
                        config.launch_dependents and not interpreted, interpreted, *holds,
                        L2_PREFETCH=config.l2_prefetch and not interpreted,
                        REGISTER_OPERAND=config.register_operand)  # fmt: skip
    options = {"Q_KIND": q_kind, "K_KIND": k_kind, "V_KIND": v_kind, "SETUP": setup,
               "num_warps": config.num_warps or _num_warps(tile_rows, head_dim)}  # fmt: skip
    if config.maxnreg is not None:
        options["maxnreg"] = config.maxnreg
    if config.ptx_options and not interpreted:
        options["ptx_options"] = config.ptx_options
    return options


@dataclass(frozen=True)
class _TensorPlan:
    """One tensor's buffers: its output and scales, its slices of the per-tensor amax buffers; the rows of
    its TMA box (0: loaded by pointers)."""

    geometry: _TensorGeometry
    out: torch.Tensor
    scales: torch.Tensor
    tile_amax: torch.Tensor
    tensor_amax: torch.Tensor
    tma_rows: int

    def arguments(self, x: torch.Tensor) -> TensorArgs:
        return self.geometry.arguments(x, self.out, self.scales, self.tile_amax, self.tensor_amax)

    def descriptor(self, x: torch.Tensor) -> TensorDescriptor | None:
        """x's TMA descriptor where this tensor is loaded by copies, else None."""
        return tma_descriptor(x, self.tma_rows) if self.tma_rows else None


def _tma_rows(config: QuantiserConfig, quantisation: Quantisation, value_layout: ValueLayout) -> tuple[int, ...]:
    """Rows of each tensor's TMA box (Q, K, V): the tile's with ``config.tma`` (V's: its ``value_config``'s, if any)
    for rows in order (V only in key order), else 0 (pointer loads; the kernel makes the same choice from
    ``TensorKind.PERMUTED``)."""
    rows = _tile_rows_of(quantisation) if config.tma else 0
    value_tma = (config.value_config or config).tma
    return (rows, rows, 0 if value_layout.permuted or not value_tma else _tile_rows_of(quantisation))


class FusedQuantiser:
    """The fused quantiser for one signature: outputs and scales allocated once; each call quantises
    new q, k, v of that signature into them and returns them as ``KernelOperands`` (the same buffers
    every call, as the registry's run() returns the same O).

    ``q_shape`` (B, H, Sq, D), ``kv_shape`` (B, Hkv, Sk, D); ``dtype`` fp16 or bf16; ``device`` CUDA,
    or CPU under the Triton interpreter. ``rotation_method``: one of ``ROTATION_METHODS``, by default
    ``DEFAULT_ROTATION_METHOD``; ``config``: a ``QuantiserConfig``, by default ``default_config(D, quantisation)``; both
    defaults as they read when the quantiser is built (the rungs and their emulations take them from
    there, so bench/fp8_quantiser.py can time other choices through them).

    ``query=False``: K and V only (Q's programs are none, the same launch otherwise, so K's and V's bytes do not
    change), for a kernel that quantises Q itself (cute/fp8's ``quantise_q``); ``operands.q8`` is then never
    written and ``operands.q_scale`` is that kernel's to write. Block scales only (per-tensor Q needs Q's amax
    before any cast), and no persistent grid (its programs walk every tensor).
    """

    def __init__(
        self,
        q_shape: tuple[int, ...],
        kv_shape: tuple[int, ...],
        dtype: torch.dtype,
        device: torch.device | str,
        quantisation: Quantisation,
        value_layout: ValueLayout,
        rotation_method: str | None = None,
        config: QuantiserConfig | None = None,
        *,
        query: bool = True,
    ):
        rotation_method = rotation_method or DEFAULT_ROTATION_METHOD
        self.config = config or default_config(q_shape[3], quantisation, rotation_method, query=query)
        if not query and (not quantisation.block or self.config.programs_per_sm):
            raise ValueError(
                "a quantiser of K and V only (query=False) needs block scales and no persistent grid, got "
                f"{quantisation.name} and programs_per_sm={self.config.programs_per_sm}"
            )
        self.query = query
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.q_shape, self.kv_shape, self.dtype, self.device = tuple(q_shape), tuple(kv_shape), dtype, device
        self.quantisation, self.rotation_method = quantisation, rotation_method
        _check_signature(self.q_shape, self.kv_shape, dtype, device, rotation_method)
        head_dim = self.q_shape[3]
        _check_quantisation(quantisation, value_layout, head_dim, rotation_method)
        # No shared-memory check here: ``shared_bytes`` is exact only for the rungs' default configurations and
        # over-counts other knobs; a knob that does not fit is refused by Triton at launch (OutOfResources).
        interpreted = device.type == "cpu"
        geometries = _geometries(self.q_shape, self.kv_shape, quantisation, value_layout)
        self._tile_counts = tuple(geometry.tiles for geometry in geometries)
        # Per-tensor scales: every tile's amax (Q's, K's, V's back to back), then each tensor's.
        self._tile_amax = torch.empty(sum(self._tile_counts), dtype=torch.float32, device=device)
        self._tensor_amax = torch.empty(len(geometries), dtype=torch.float32, device=device)
        self._plans = tuple(
            _TensorPlan(
                geometry,
                out=torch.empty(geometry.out_shape, dtype=torch.float8_e4m3fn, device=device),
                scales=torch.empty(geometry.scale_shape, dtype=torch.float32, device=device),
                tile_amax=self._tile_amax[sum(self._tile_counts[:index]) :],
                tensor_amax=self._tensor_amax[index:],
                tma_rows=tma_rows,
            )
            for index, (geometry, tma_rows) in enumerate(
                zip(geometries, _tma_rows(self.config, quantisation, value_layout), strict=True)
            )
        )
        self._launch_plans = _launch_plans(geometries, self.config, sm_count(device), query)
        self._options = tuple(
            {
                step: _launch_options(
                    quantisation,
                    value_layout,
                    rotation_method,
                    launch.config,
                    head_dim,
                    step,
                    interpreted,
                    launch.holds,
                )
                for step in _steps(quantisation)
            }
            for launch in self._launch_plans
        )
        self._rotation = (
            _rotation_operand_tensor(
                head_dim, quantisation.seed, rotation_method, torch.float32 if interpreted else dtype, device
            )
            if quantisation.rotation
            else (self._tensor_amax, 1.0)  # a placeholder pointer, never read
        )
        self.operands = KernelOperands(
            *(plan.out for plan in self._plans), *(plan.scales for plan in self._plans), quantisation, value_layout
        )
        # What each (pass, launch) last launched (Triton's compiled kernel: registers, spills), for reports.
        self.compiled: dict[tuple[int, int], object] = {}

    def _check_inputs(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        for name, tensor, shape in (("q", q, self.q_shape), ("k", k, self.kv_shape), ("v", v, self.kv_shape)):
            if tuple(tensor.shape) != shape or tensor.dtype != self.dtype or tensor.device != self.device:
                raise ValueError(
                    f"{name}: expected {shape} {self.dtype} on {self.device} (this quantiser's signature), "
                    f"got {tuple(tensor.shape)} {tensor.dtype} on {tensor.device}"
                )

    @property
    def launches(self) -> int:
        """Kernel launches per call: one or three per pass; per-tensor scales take two passes and the reduction."""
        per_pass = len(self._launch_plans)
        return per_pass if self.quantisation.block else 2 * per_pass + 1

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, only: str | None = None) -> KernelOperands:
        """Quantise q, k, v into this quantiser's buffers. ``only`` ("q", "k" or "v"): that tensor's programs alone,
        its binaries unchanged (the A/B's per-tensor times; the other tensors' buffers keep what they held). Block
        scales and program ranges only (a persistent or interleaved grid maps programs to every tensor)."""
        self._check_inputs(q, k, v)
        if only is not None:
            self._check_only(only)
        inputs = (q, k, v)
        tensors = tuple(plan.arguments(x) for plan, x in zip(self._plans, inputs, strict=True))
        descriptors = tuple(plan.descriptor(x) for plan, x in zip(self._plans, inputs, strict=True))
        if self.quantisation.block:
            self._launch(tensors, descriptors, STEP_BLOCK.value, only)
            return self.operands
        self._launch(tensors, descriptors, STEP_AMAX.value)
        tensor_amax_kernel[(len(tensors),)](
            self._tile_amax, self._tensor_amax, *self._tile_counts, CHUNK=AMAX_CHUNK, num_warps=AMAX_WARPS
        )
        self._launch(tensors, descriptors, STEP_CAST.value)
        return self.operands

    def _check_only(self, only: str) -> None:
        names = ("q", "k", "v") if self.query else ("k", "v")
        configs = (self.config, *filter(None, (self.config.value_config,)))
        if only not in names or not self.quantisation.block or any(c.programs_per_sm or c.interleave for c in configs):
            raise ValueError(
                f"only= takes one of {names} with block scales and program ranges, got {only!r} with "
                f"{self.quantisation.name} and {self.config.describe()}"
            )

    def _launch(
        self,
        tensors: tuple[TensorArgs, ...],
        descriptors: tuple[TensorDescriptor | None, ...],
        step: int,
        only: str | None = None,
    ) -> None:
        rotation, rotation_scale = self._rotation
        for index, (launch, options) in enumerate(zip(self._launch_plans, self._options, strict=True)):
            programs = launch.programs
            if only is not None:
                programs = tuple(count if name == only else 0 for name, count in zip("qkv", programs, strict=True))
            if not any(programs):
                continue
            self.compiled[step, index] = quantise_kernel[(_grid(programs, launch.config),)](
                *tensors, *descriptors, *programs, rotation, rotation_scale, **options[step]
            )


def compile_sm90(
    head_dim: int,
    dtype: torch.dtype,
    quantisation: Quantisation,
    value_layout: ValueLayout,
    rotation_method: str = DEFAULT_ROTATION_METHOD,
    config: QuantiserConfig | None = None,
    seqlens: tuple[int, int] = (8192, 8192),
    heads: tuple[int, int] = (16, 16),
    batch: int = 2,
    query: bool = True,
) -> list[KernelBinary]:
    """Every distinct kernel a ``FusedQuantiser`` of this kind (``query``: its own) launches, compiled for sm_90a
    (no GPU needed) with the specialisation its launches get at that shape (by default P1, contiguous inputs):
    ``quantise_kernel`` once per pass (block scales: one; per-tensor: amax and cast) and binary of the pass (two
    with ``value_config``: Q's and K's, then V's), then the per-tensor amax reduction."""
    from triton.runtime.jit import MockTensor

    from common.toolchain.compile import compile_triton_sm90_launch

    config = config or default_config(head_dim, quantisation, rotation_method, query=query)
    _check_quantisation(quantisation, value_layout, head_dim, rotation_method)
    q_shape = (batch, heads[0], seqlens[0], head_dim)
    kv_shape = (batch, heads[1], seqlens[1], head_dim)
    geometries = _geometries(q_shape, kv_shape, quantisation, value_layout)

    class _Input(MockTensor):
        """A contiguous input of ``shape`` as a launch sees it: a 16-byte aligned pointer and strides."""

        def __init__(self, shape: tuple[int, ...]):
            super().__init__(dtype)
            self.shape = shape
            self._strides = tuple(math.prod(shape[index + 1 :]) for index in range(len(shape)))

        def stride(self) -> tuple[int, ...]:
            return self._strides

    inputs = tuple(_Input(shape) for shape in (q_shape, kv_shape, kv_shape))
    tensors = tuple(
        geometry.arguments(x, MockTensor(torch.float8_e4m3fn), MockTensor(torch.float32), MockTensor(torch.float32),
                           MockTensor(torch.float32))
        for geometry, x in zip(geometries, inputs, strict=True)
    )  # fmt: skip
    descriptors = tuple(
        tma_descriptor(x, rows) if rows else None
        for x, rows in zip(inputs, _tma_rows(config, quantisation, value_layout), strict=True)
    )
    tc = quantisation.rotation and rotation_method == "tensor_core"
    rotation = MockTensor(dtype if tc else torch.float32)
    # One build per binary: launches that differ only in their program counts (one per tensor) share the first's.
    launches: dict[tuple, _Launch] = {}
    for launch in _launch_plans(geometries, config, DEFAULT_SM_COUNT, query):
        launches.setdefault((launch.config, launch.holds), launch)
    binaries = [
        compile_triton_sm90_launch(
            quantise_kernel,
            *tensors,
            *descriptors,
            *launch.programs,
            rotation,
            1.0,
            **_launch_options(
                quantisation,
                value_layout,
                rotation_method,
                launch.config,
                head_dim,
                step,
                interpreted=False,
                holds=launch.holds,
            ),
        )
        for step in _steps(quantisation)
        for launch in launches.values()
    ]
    if not quantisation.block:
        binaries.append(
            compile_triton_sm90_launch(
                tensor_amax_kernel,
                MockTensor(torch.float32),
                MockTensor(torch.float32),
                *(geometry.tiles for geometry in geometries),
                CHUNK=AMAX_CHUNK,
                num_warps=AMAX_WARPS,
            )
        )
    return binaries


def compile_sm90_for(
    problem: Problem, quantisation: Quantisation, value_layout: ValueLayout, query: bool = True
) -> list[KernelBinary]:
    """:func:`compile_sm90` at ``problem``'s head dim, dtype and shape: what an FP8 rung launches before
    its kernel (``Implementation.compile_input_transform_sm90``; ``query`` False: K and V only)."""
    return compile_sm90(problem.head_dim, problem.dtype, quantisation, value_layout,
                        seqlens=(problem.seqlen_q, problem.seqlen_k), heads=(problem.heads, problem.kv_heads),
                        batch=problem.batch, query=query)  # fmt: skip


def quantise_fused(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    quantisation: Quantisation,
    value_layout: ValueLayout,
    rotation_method: str | None = None,
    config: QuantiserConfig | None = None,
) -> KernelOperands:
    """One fused quantisation of q, k, v into fresh buffers (a ``FusedQuantiser`` used once)."""
    quantiser = FusedQuantiser(q.shape, k.shape, q.dtype, q.device, quantisation, value_layout, rotation_method, config)
    return quantiser(q, k, v)


def quantise_for_kernel(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, quantisation: Quantisation, value_layout: ValueLayout
) -> KernelOperands:
    """The operands an fp8 rung reads: the fused quantiser on CUDA (and on CPU under the interpreter),
    the torch reference on CPU otherwise (module docstring, "Devices")."""
    if q.is_cuda or triton_interpreting():
        return quantise_fused(q, k, v, quantisation, value_layout)
    return kernel_operands(quantise(q, k, v, quantisation), value_layout)


# ----------------------------------------------------------------------------------------------------
# Equality with the reference
# ----------------------------------------------------------------------------------------------------
def e4m3_steps(a8: torch.Tensor, b8: torch.Tensor) -> torch.Tensor:
    """|a - b| in e4m3 steps, elementwise: the distance of the two codes on e4m3's ordered grid
    (sign and magnitude; +0 and -0 are the same point)."""

    def ordinal(x8: torch.Tensor) -> torch.Tensor:
        code = x8.view(torch.uint8).to(torch.int16)
        magnitude = code & 0x7F
        return torch.where(code >= 0x80, -magnitude, magnitude)

    return (ordinal(a8) - ordinal(b8)).abs()


@dataclass(frozen=True)
class TensorDifference:
    """How one tensor of the fused quantiser differs from the reference's."""

    name: str
    elements: int
    differing: int
    max_steps: int
    scale_max_rel_diff: float
    rotated: bool

    @property
    def ok(self) -> bool:
        if not self.rotated:
            return self.differing == 0 and self.scale_max_rel_diff == 0.0
        return (
            self.max_steps <= 1
            and self.differing <= ROTATED_MAX_DIFFERING_FRACTION * self.elements
            and self.scale_max_rel_diff <= ROTATED_SCALE_RTOL
        )

    def summary(self) -> str:
        rule = (
            f"<= 1 step on <= {ROTATED_MAX_DIFFERING_FRACTION:g} of elements, scales within {ROTATED_SCALE_RTOL:g}"
            if self.rotated
            else "bit-identical"
        )
        return (
            f"{self.name}: {self.differing}/{self.elements} elements differ (max {self.max_steps} e4m3 steps), "
            f"scales max rel diff {self.scale_max_rel_diff:.3g} [{rule}: {'ok' if self.ok else 'FAILED'}]"
        )


@dataclass(frozen=True)
class OperandDifferences:
    tensors: tuple[TensorDifference, ...]

    @property
    def ok(self) -> bool:
        return all(tensor.ok for tensor in self.tensors)

    @property
    def differing(self) -> int:
        return sum(tensor.differing for tensor in self.tensors)

    def summary(self) -> str:
        return "; ".join(tensor.summary() for tensor in self.tensors)


def operand_differences(fused: KernelOperands, reference: KernelOperands) -> OperandDifferences:
    """Compare the fused quantiser's operands with the reference's in the kernel layout (Vᵀ with its
    padding): bit-identical where the arithmetic is the same (V always; Q and K without rotation),
    else every differing element exactly one e4m3 step, few of them, scales within a few ulps."""
    if fused.value_layout != reference.value_layout or fused.quantisation != reference.quantisation:
        raise ValueError(
            f"compare operands of one quantisation and layout, got {fused.quantisation} / {fused.value_layout} "
            f"and {reference.quantisation} / {reference.value_layout}"
        )
    rotated = fused.quantisation.rotation
    tensors = []
    for name, x8, ref8, scale, ref_scale, is_rotated in (
        ("q", fused.q8, reference.q8, fused.q_scale, reference.q_scale, rotated),
        ("k", fused.k8, reference.k8, fused.k_scale, reference.k_scale, rotated),
        ("v", fused.vt8, reference.vt8, fused.v_scale, reference.v_scale, False),
    ):
        if x8.shape != ref8.shape or scale.shape != ref_scale.shape:
            raise ValueError(f"{name}: shapes differ, {tuple(x8.shape)} / {tuple(scale.shape)} against "
                             f"{tuple(ref8.shape)} / {tuple(ref_scale.shape)}")  # fmt: skip
        steps = e4m3_steps(x8, ref8)
        scale_diff = ((scale.double() - ref_scale.double()).abs() / ref_scale.double()).max().item()
        tensors.append(
            TensorDifference(
                name, steps.numel(), int((steps > 0).sum().item()), int(steps.max().item()), scale_diff, is_rotated
            )
        )
    return OperandDifferences(tuple(tensors))
