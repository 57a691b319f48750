"""The fused FP8 quantiser: Q, K and V from bf16/fp16 to the e4m3 operands and scales that the three
FP8 rungs read, in one Triton kernel launch, the same values as ``common.contract.fp8.quantise``.
It is a kernel, so it lives with the Triton rungs; ``triton_impl/fp8.py``, ``triton_impl/gluon/fp8.py``
and ``cute_impl/fp8.py`` each run it before their attention kernel.

Why: ``quantise`` is the reference, written as torch code (a rotation GEMM, abs, amax, pad, repeat,
divide, clamp, cast, then V transposed and permuted by indexing), which reads and writes each tensor
many times and launches dozens of kernels per call. Here each tile is read once and written once, in
the layout its kernel reads. The work is memory-bound (Q, K, V read in 16 bits, written in 8), so the
kernel is built to keep bytes in flight and to spend few instructions per element.

Launch (``_quantise_kernel``, ``FusedQuantiser``): one grid for all three tensors; programs
[0, q_programs) take Q's tiles, the next k_programs K's, the rest V's (``single_launch=False``
launches the same kernel once per tensor). A tile is 128 rows (``TILE_ROWS``: the larger block; Q's
64-row blocks go two to a tile) of one (batch, head), so every tensor's tile has the same shape and one
warp count (64 fp32 values a thread: 8 warps at D=128) serves the launch. A program loops over
``tiles_per_program`` tiles of its tensor, strided by the tensor's program count.

Per program (``_quantise_tiles``): the rotation operand is loaded once (the tensor-core sign matrix
stays in shared memory across the loop); then per tile:
  1. Load the tile's rows in bf16/fp16 (16-byte loads; rows past S as zeros). V for a kernel that
     reads it permuted (``ValueLayout.permuted``) is loaded in slot order (row r of the tile is key
     ``PERMUTED_KEY_ORDER``-mapped r), so that its store in step 5 is a plain transposed tile. With
     ``prefetch`` the next tile's load is issued before this tile is computed (registers); with
     ``num_stages`` > 1 Triton's pipeliner does it by cp.async into shared memory.
  2. Q and K with ``rotation``: multiply by ``random_hadamard(D, seed)`` = sign matrix x c, the same
     matrix as the reference, one of two ways (``ROTATION_METHODS``):
     * ``tensor_core``: the tile times the ±1 sign matrix on wgmma, both operands in the input's own
       type (bf16 or fp16: x · ±1 is exact) with fp32 accumulation, then x c, c = the matrix's fp32
       entry magnitude 1/sqrt(D). Only the order of the fp32 sums differs from torch's fp32 GEMM.
     * ``butterfly``: log2(D) radix-2 stages of sums and differences in fp32 (the Hadamard transform
       in constant geometry: y[i] = x[2i] + x[2i+1], y[i + D/2] = x[2i] - x[2i+1] each stage), then
       x the matrix's first row (its column signs times c), + 0 (a column whose sums cancel would be
       -0 where its sign is negative). Up to D = 128 (more spills registers).
     Either way a rotated zero is +0 (the tensor cores' cancelled sums are +0, times c > 0), so its
     division cannot depend on how the division carries a zero's sign (step 4).
  3. amax per row, then per block (per-tensor: the tensor's, below); scale = amax / 448 by IEEE
     division (1 for an all-zero group), as ``block_scales``, stored per block.
  4. x / scale, correctly rounded, then e4m3 with round-to-nearest-even by one ``cvt.rn.satfinite``,
     which saturates exactly as the reference's clamp to ±448 does (a quotient can round a hair past
     448) and keeps NaN, so no clamp is needed. The division (``division``):
     * ``reciprocal``: per block r = 1/d rounded (``_divisor_of``, d = the scale), per element
       q = x · r, then q -= (d·q - x) · r, the residual d·q - x formed exactly by an fma (taken in this
       sign so that x = -0 gives -0 under an IEEE negation; Triton 3.6 writes -y as 0 - y, +0 for
       y = +0, so there x = -0 gives +0: ``_quotient``). Markstein's theorem: with r within half an
       ulp of 1/d, q within an ulp of x/d and the residual exact, one such step gives the correctly
       rounded quotient; the first step brings any q there, the second is exact
       (``ROTATED_CORRECTIONS`` = 2, for rotated values, which are any fp32 number). For bf16/fp16
       values one step is already exact, checked for every pair of such a value and a scale of such an
       amax (``UNROTATED_CORRECTIONS`` = 1).
       Residuals are exact while d >= 2^-60 (``RECIPROCAL_MIN_SCALE``); a block of tiny values moves
       up by 2^89 (d and x both: exact), and an infinite scale (an infinity in the block) becomes
       d = r = 0, which gives x / inf's signed zero. 1 multiply and 2 or 4 fmas an element.
     * ``ieee``: ``div.rn`` per element (a reciprocal approximation, refinement, a range check and a
       slow-path branch: about 10 instructions an element, more than everything else a tile does).
  5. Store: Q and K as (B, H, S, D) rows; V transposed as (B, Hkv, D, Sk') with keys padded to the
     layout's multiple (the padding slots are zeros); 16-byte stores after a shared-memory exchange.

Per-tensor scales need the tensor's amax before any cast: an amax pass (each tile's amax), the
reduction (``_tensor_amax_kernel``, three maxima in one launch), then the cast pass: three launches
(seven with a launch per tensor). Block scales need one pass: one launch.

Knobs (``QuantiserConfig``, timed by ``python -m bench.fp8_quantiser --sweep``; none changes a byte):
``single_launch`` (one launch: no gaps or tails between tensors), ``tiles_per_program`` (the sign
matrix loaded once for several tiles, fewer programs to schedule; more leave a longer tail),
``prefetch`` / ``num_stages`` (the next tile's bytes in flight while this one is computed: the first
costs 32 registers a thread, the second 32 KB of shared memory a stage in each tensor's branch, which
Triton does not overlap, so both lower the programs an SM holds), ``num_warps``, ``maxnreg`` (8 warps
at 128 registers keep two programs an SM; a lower cap spills, and at 80 ptxas cannot place the wgmma
accumulators) and ``division``. ``DEFAULT_CONFIG`` is what the rungs run.

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
tests), where three operations differ from the compiled kernel and are replaced (``INTERPRETED``):
the interpreter's e4m3 cast does not round to nearest even (the kernel clamps and rounds onto e4m3's
grid in fp32 first, so the cast is exact), its bf16 dot multiplies raw bits (the rotation's dot takes
fp32 operands there, products exact either way), and its fma rounds twice (computed in fp64: the
product of two fp32 values is exact there). ``quantise_for_kernel`` on CPU tensors outside the
interpreter uses the torch reference: the FP8 rungs never run on a CPU, so that path only feeds the
CPU tests of the emulation.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from common.contract.capability import check_shared_memory
from common.contract.devices import triton_interpreting
from common.contract.fp8 import (
    E4M3_MAX,
    KEY_GROUP,
    KernelOperands,
    Quantisation,
    ValueLayout,
    kernel_operands,
    quantise,
    random_hadamard,
)
from common.contract.problem import Problem
from common.contract.registry import Runner
from common.toolchain.compile import KernelBinary

ROTATION_METHODS = ("tensor_core", "butterfly")
# The butterflies' reshapes spill at D = 256 (16 warps, 128 registers a thread): refused there.
BUTTERFLY_MAX_HEAD_DIM = 128
# Measured on the GPU by bench/fp8_quantiser.py; until then the tensor-core product, the reference's own form.
DEFAULT_ROTATION_METHOD = "tensor_core"
# How each element is divided by its scale (module docstring, step 4).
DIVISIONS = ("reciprocal", "ieee")
INPUT_DTYPES = (torch.float16, torch.bfloat16)
# Device constants (a kernel reads module globals only as constexprs).
SATURATION = tl.constexpr(E4M3_MAX)
# e4m3's smallest normal is 2^-6; below it the grid is uniform with step 2^-9.
E4M3_MIN_NORMAL = tl.constexpr(2.0**-6)
E4M3_SUBNORMAL_STEP = tl.constexpr(2.0**-9)
# The reciprocal division's residuals d·q - x are exact for divisors d in [RECIPROCAL_MIN_SCALE, FP32_MAX]
# (module docstring, step 4): there every residual of a quotient that can round to a nonzero e4m3 value is a
# normal fp32 number. A smaller scale (down to fp32's 2^-149) and its block's x move up by TINY_SCALE_FACTOR
# into [2^-60, 2^29), where x stays finite (|x| <= 448 · scale).
RECIPROCAL_MIN_SCALE = tl.constexpr(2.0**-60)
TINY_SCALE_FACTOR = tl.constexpr(2.0**89)
FP32_MAX = tl.constexpr(torch.finfo(torch.float32).max)
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
# What one launch of _quantise_kernel does (STEP): a block-scaled pass, or per-tensor's amax or cast pass.
STEP_BLOCK, STEP_AMAX, STEP_CAST = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
ROTATE_NONE, ROTATE_TENSOR_CORE, ROTATE_BUTTERFLY = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
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
      quotient, a zero's sign included (a rotated zero is +0; an unrotated -0 is kept by a select).
    """

    single_launch: bool = True
    tiles_per_program: int = 1
    num_stages: int = 1
    prefetch: bool = False
    num_warps: int | None = None
    maxnreg: int | None = None
    division: str = "reciprocal"

    def __post_init__(self) -> None:
        if self.tiles_per_program < 1 or self.num_stages < 1:
            raise ValueError(
                f"tiles_per_program and num_stages must be >= 1, got {self.tiles_per_program} and {self.num_stages}"
            )
        if self.prefetch and self.num_stages > 1:
            raise ValueError("prefetch (registers) and num_stages > 1 (shared memory) both overlap loads: choose one")
        if self.num_warps is not None and self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be a power of two from 1 to 16 or None, got {self.num_warps}")
        if self.maxnreg is not None and not 24 <= self.maxnreg <= 255:
            raise ValueError(f"maxnreg must lie in [24, 255] or be None, got {self.maxnreg}")
        if self.division not in DIVISIONS:
            raise ValueError(f"division must be one of {DIVISIONS}, got {self.division!r}")

    def describe(self) -> str:
        """One compact line for tables: launches, tiles/program, stages, warps, registers, division."""
        overlap = "prefetch" if self.prefetch else f"stages={self.num_stages}"
        return (
            f"{'1 launch' if self.single_launch else '3 launches'} tiles/prog={self.tiles_per_program} {overlap} "
            f"warps={self.num_warps or 'auto'} maxnreg={self.maxnreg or '-'} {self.division}"
        )


# What the rungs run (their quantisers read it when built, so bench/fp8_quantiser.py can swap it), chosen by
# the GPU sweep (bench/fp8_quantiser.py --sweep, H100, P1 Q+K+V with block scales and rotation, 2026-11-26;
# docs/perf-log.md): one launch, 8 tiles a program, 2 tiles in flight through shared memory: 149.3 µs against
# 217.3 for 4 tiles without overlap and 197.6 for the three launches before the knobs. The fastest row, the
# next tile prefetched in registers under a 128-register cap (133.5 µs), spills at D=64 under Triton 3.8
# (8 bytes) and at D=128 under 3.9 (88 bytes), so it is not the default of every head dim and release.
DEFAULT_CONFIG = QuantiserConfig(tiles_per_program=8, num_stages=2)


# ----------------------------------------------------------------------------------------------------
# Device code
# ----------------------------------------------------------------------------------------------------
class TensorArgs(NamedTuple):
    """One tensor's runtime arguments (a tuple argument of ``_quantise_kernel``): its input with
    strides, its geometry in tiles, where its e4m3 values and scales go, and (per-tensor scales)
    its tiles' amaxes and its amax."""

    X: torch.Tensor
    stride_b: int
    stride_h: int
    stride_s: int
    stride_d: int
    heads: int
    seqlen: int
    tiles_per_head: int
    tiles: int
    OUT: torch.Tensor
    out_rows: int
    SCALES: torch.Tensor
    scale_blocks: int
    TILE_AMAX: torch.Tensor
    TENSOR_AMAX: torch.Tensor


class TensorKind(NamedTuple):
    """One tensor's constexprs: Q and K in rows, rotated if asked; V transposed in its layout.
    ``CORRECTIONS``: Newton corrections of the reciprocal division (module docstring, step 4)."""

    BLOCK_ROWS: int
    ROTATE: int
    TRANSPOSED: bool
    PERMUTED: bool
    CORRECTIONS: int


class LaunchSetup(NamedTuple):
    """Constexprs shared by the three tensors of a launch. ``INTERPRETED``: the CPU interpreter's
    replacements (module docstring, "Devices")."""

    HEAD_DIM: int
    LOG2_HEAD_DIM: int
    TILE_ROWS: int
    STEP: int
    NUM_STAGES: int
    PREFETCH: bool
    RECIPROCAL_DIVISION: bool
    INTERPRETED: bool


@triton.jit
def _hadamard_butterflies(x, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, LOG2_HEAD_DIM: tl.constexpr):
    """x (ROWS, D) fp32 times Sylvester's Hadamard matrix H (entries ±1): log2(D) stages, each
    y[i] = x[2i] + x[2i+1], y[i + D/2] = x[2i] - x[2i+1] (constant geometry: the same reshape every stage)."""
    for _ in tl.static_range(LOG2_HEAD_DIM):
        even, odd = tl.split(tl.reshape(x, (ROWS, HEAD_DIM // 2, 2)))
        x = tl.reshape(tl.permute(tl.join(even + odd, even - odd), (0, 2, 1)), (ROWS, HEAD_DIM))
    return x


@triton.jit
def _rotation_operand(ROTATION, ROTATE: tl.constexpr, HEAD_DIM: tl.constexpr):
    """What ``_rotated`` multiplies by, loaded once per program: the (D, D) ±1 sign matrix (tensor
    cores; Triton keeps it in shared memory across the tile loop) or the matrix's first row (butterflies)."""
    offs_d = tl.arange(0, HEAD_DIM)
    if ROTATE == ROTATE_TENSOR_CORE:
        rotation = tl.load(ROTATION + offs_d[:, None] * HEAD_DIM + offs_d[None, :])
    else:
        rotation = tl.load(ROTATION + offs_d)
    return rotation


@triton.jit
def _rotated(x, rotation, rotation_scale, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, LOG2_HEAD_DIM: tl.constexpr,
             ROTATE: tl.constexpr, FP32_DOT: tl.constexpr):  # fmt: skip
    """x (ROWS, D) times random_hadamard(D, seed) in fp32 (module docstring, step 2)."""
    if ROTATE == ROTATE_TENSOR_CORE:
        # rotation: the ±1 sign matrix in x's type (fp32 for FP32_DOT); x · ±1 is exact, sums in fp32.
        product = tl.dot(x.to(tl.float32), rotation, input_precision="ieee") if FP32_DOT else tl.dot(x, rotation)
        rotated = product * rotation_scale
    else:
        # rotation: the matrix's first row (the Hadamard's first row is all ones: column sign x c). The sign
        # comes after the sums, so a column whose sums cancel exactly (+0) would be -0 where its sign is
        # negative; + 0.0 makes it +0 (IEEE: -0 + +0 = +0), as the tensor-core product gives (module
        # docstring, steps 2 and 4). Compiled, the multiply and the add are one fma with a zero addend.
        rotated = _hadamard_butterflies(x.to(tl.float32), ROWS, HEAD_DIM, LOG2_HEAD_DIM) * rotation[None, :] + 0.0
    return rotated


@triton.jit
def _round_to_e4m3_grid(y):
    """fp32 y, |y| <= 448, rounded to the nearest e4m3 value (ties to even), still in fp32, sign kept
    (-0 too): the interpreter's cast truncates, so it gets values it can convert exactly."""
    bits = y.to(tl.int32, bitcast=True)
    sign = bits & -0x80000000
    magnitude = tl.abs(y)
    # Normal e4m3: keep 3 of fp32's 23 mantissa bits, ties to even; a carry moves into the exponent.
    magnitude_bits = magnitude.to(tl.int32, bitcast=True)
    kept_lsb = (magnitude_bits >> 20) & 1
    normal = ((magnitude_bits + 0x7FFFF + kept_lsb) & -0x100000).to(tl.float32, bitcast=True)
    # Subnormal e4m3: multiples of 2^-9; magnitude · 2^9 < 8 is exact, round it to an integer, ties to even.
    steps = magnitude * (1.0 / E4M3_SUBNORMAL_STEP)
    whole = steps.to(tl.int32)
    fraction = steps - whole.to(tl.float32)
    up = (fraction > 0.5) | ((fraction == 0.5) & ((whole & 1) == 1))
    subnormal = (whole + up.to(tl.int32)).to(tl.float32) * E4M3_SUBNORMAL_STEP
    rounded = tl.where(magnitude < E4M3_MIN_NORMAL, subnormal, normal)
    return (rounded.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def _to_e4m3(y, INTERPRETED: tl.constexpr):
    """fp32 -> e4m3, round to nearest even, saturating at ±448 as the reference's clamp does: on the GPU
    one ``cvt.rn.satfinite`` (it saturates what rounds past 448, keeps NaN); the interpreter clamps
    and rounds onto the grid first."""
    if INTERPRETED:
        y = _round_to_e4m3_grid(tl.clamp(y, -SATURATION, SATURATION, propagate_nan=tl.PropagateNan.ALL))
    return y.to(tl.float8e4nv)


@triton.jit
def _fma(a, b, c, INTERPRETED: tl.constexpr):
    """a · b + c rounded once: ``fma.rn.f32``; the interpreter's fma rounds twice, so it computes in
    fp64 (the product of two fp32 values is exact there) and rounds to fp32."""
    if INTERPRETED:
        return (a.to(tl.float64) * b.to(tl.float64) + c.to(tl.float64)).to(tl.float32)
    return tl.fma(a, b, c)


@triton.jit
def _divisor_of(scale):
    """What the reciprocal division of one block divides by (module docstring, step 4): (divisor,
    reciprocal = 1 / divisor rounded, factor) with x / scale = (x · factor) / divisor exactly. A scale
    below RECIPROCAL_MIN_SCALE (an all-tiny block) moves up by TINY_SCALE_FACTOR, a power of two, into
    the range where every residual is exact; an infinite scale (an infinity in the block) becomes divisor
    and reciprocal 0, which give x / inf's signed zero (NaN for an infinite x)."""
    infinite = scale > FP32_MAX
    factor = tl.where(scale < RECIPROCAL_MIN_SCALE, TINY_SCALE_FACTOR, 1.0)
    divisor = tl.where(infinite, 0.0, scale * factor)
    reciprocal = tl.where(infinite, 0.0, tl.math.div_rn(tl.full((), 1.0, tl.float32), divisor))
    return divisor, reciprocal, factor


@triton.jit
def _quotient(x, scale, divisor, reciprocal, factor, prescaled, RECIPROCAL_DIVISION: tl.constexpr,
              CORRECTIONS: tl.constexpr, INTERPRETED: tl.constexpr):  # fmt: skip
    """x / scale correctly rounded (the reference's IEEE division); the per-row operands broadcast
    against x. ``div.rn`` per element, or the reciprocal division (module docstring, step 4):
    x · factor (only where a block of the tile was moved up: ``prescaled``), q = x · r, then
    CORRECTIONS times q -= (d·q - x) · r, the residual d·q - x formed exactly by an fma; with one
    correction (x a bf16/fp16 value, which may be -0), x = ±0 itself where x is zero: Triton 3.6 writes
    the unary minus as 0 - y (``sub.f32`` from 0f00000000; 3.8 emits a negation), so -(d·q - x) of
    x = -0 is +0 and q ends +0 where IEEE division gives -0, one e4m3 byte (0x00 for 0x80) of the same
    value. A rotated zero is +0 (``_rotated``), and x = +0 gives +0 under either negation, so the
    rotated path needs no select (one made Triton 3.7 spill the butterfly's cast: 16 bytes)."""
    if RECIPROCAL_DIVISION:
        if prescaled:
            x = x * factor
        quotient = x * reciprocal
        for _ in tl.static_range(CORRECTIONS):
            quotient = _fma(-_fma(divisor, quotient, -x, INTERPRETED), reciprocal, quotient, INTERPRETED)
        if CORRECTIONS == 1:
            quotient = tl.where(x == 0, x, quotient)
    else:
        quotient = tl.math.div_rn(x, tl.broadcast_to(scale, x.shape))
    return quotient


@triton.jit
def _scale_of(amax):
    """amax / 448 (IEEE division), 1 for an all-zero group: ``block_scales``."""
    return tl.where(amax > 0, tl.math.div_rn(amax, tl.full((), SATURATION, tl.float32)), 1.0)


@triton.jit
def _row_scales(row_amax, T, batch_head, m_tile, KIND: tl.constexpr, SETUP: tl.constexpr):
    """Stores the tile's block scales (its blocks', or the tensor's) and returns what ``_quotient``
    divides each row by: its scale, divisor, reciprocal and factor, and whether any block was moved up."""
    BLOCKS: tl.constexpr = SETUP.TILE_ROWS // KIND.BLOCK_ROWS
    row_block = tl.arange(0, SETUP.TILE_ROWS) // KIND.BLOCK_ROWS
    if SETUP.STEP == STEP_CAST:
        tensor_scale = _scale_of(tl.load(T.TENSOR_AMAX))
    row_scale = tl.zeros_like(row_amax)
    row_divisor = tl.zeros_like(row_amax)
    row_reciprocal = tl.zeros_like(row_amax)
    row_factor = tl.zeros_like(row_amax)
    prescaled = False
    for block in tl.static_range(BLOCKS):
        if SETUP.STEP == STEP_CAST:
            scale = tensor_scale
        else:
            scale = _scale_of(tl.max(tl.where(row_block == block, row_amax, 0.0), axis=0))
        m_block = m_tile * BLOCKS + block
        tl.store(T.SCALES + batch_head * T.scale_blocks + m_block, scale, mask=m_block < T.scale_blocks)
        in_block = row_block == block
        row_scale = tl.where(in_block, scale, row_scale)
        if SETUP.RECIPROCAL_DIVISION:
            divisor, reciprocal, factor = _divisor_of(scale)
            row_divisor = tl.where(in_block, divisor, row_divisor)
            row_reciprocal = tl.where(in_block, reciprocal, row_reciprocal)
            row_factor = tl.where(in_block, factor, row_factor)
            prescaled = prescaled | (factor != 1.0)
    return row_scale, row_divisor, row_reciprocal, row_factor, prescaled


@triton.jit
def _tile_rows(m_tile, TILE_ROWS: tl.constexpr, PERMUTED: tl.constexpr):
    """Row index of each tile row: the tile's rows in order, or (PERMUTED) slot r holding key
    PERMUTED_KEY_ORDER[r % 16] of its group of 16 (a closed form of the table, checked by the tests)."""
    slots = tl.arange(0, TILE_ROWS)
    if PERMUTED:
        within = slots % 16
        slots = slots - within + 8 * ((within % 4) // 2) + 2 * (within // 4) + within % 2
    return m_tile * TILE_ROWS + slots


@triton.jit
def _load_tile(T, tile, TILE_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, PERMUTED: tl.constexpr):
    """Tile ``tile`` of tensor T in its dtype (V for a permuted layout in slot order); rows past S, and
    every row of a tile past the last, as zeros."""
    batch_head = (tile // T.tiles_per_head).to(tl.int64)
    rows = _tile_rows(tile % T.tiles_per_head, TILE_ROWS, PERMUTED)
    offs_d = tl.arange(0, HEAD_DIM)
    x_ptrs = (T.X + (batch_head // T.heads) * T.stride_b + (batch_head % T.heads) * T.stride_h
              + rows[:, None] * T.stride_s + offs_d[None, :] * T.stride_d)  # fmt: skip
    # A tile past the last reads no row (its valid length is 0): one comparison per row, a mask Triton
    # 3.9's interpreter also takes (it refuses a tensor mask combined with a scalar one).
    valid_rows = tl.where(tile < T.tiles, T.seqlen, 0)
    return tl.load(x_ptrs, mask=rows[:, None] < valid_rows, other=0.0)


@triton.jit
def _quantise_tiles(T, program, programs, ROTATION, rotation_scale, KIND: tl.constexpr, SETUP: tl.constexpr):
    """Tiles program, program + programs, ... of one tensor (T: its ``TensorArgs``; KIND: its
    ``TensorKind``): the module docstring's steps 1-5 for each."""
    HEAD_DIM: tl.constexpr = SETUP.HEAD_DIM
    TILE_ROWS: tl.constexpr = SETUP.TILE_ROWS
    offs_d = tl.arange(0, HEAD_DIM)
    if KIND.ROTATE != ROTATE_NONE:
        rotation = _rotation_operand(ROTATION, KIND.ROTATE, HEAD_DIM)
    if SETUP.PREFETCH:
        x_next = _load_tile(T, program, TILE_ROWS, HEAD_DIM, KIND.PERMUTED)
    for tile in tl.range(program, T.tiles, programs, num_stages=SETUP.NUM_STAGES):
        batch_head = (tile // T.tiles_per_head).to(tl.int64)
        m_tile = tile % T.tiles_per_head

        # ---- 1. load (PREFETCH: this tile came with the previous one; ask for the next before computing)
        if SETUP.PREFETCH:
            x = x_next
            x_next = _load_tile(T, tile + programs, TILE_ROWS, HEAD_DIM, KIND.PERMUTED)
        else:
            x = _load_tile(T, tile, TILE_ROWS, HEAD_DIM, KIND.PERMUTED)

        # ---- 2. rotation
        if KIND.ROTATE != ROTATE_NONE:
            x = _rotated(x, rotation, rotation_scale, TILE_ROWS, HEAD_DIM, SETUP.LOG2_HEAD_DIM, KIND.ROTATE,
                         SETUP.INTERPRETED)  # fmt: skip
        x = x.to(tl.float32)

        # ---- 3. amax (per row, then per block) and scales
        row_amax = tl.max(tl.abs(x), axis=1)
        if SETUP.STEP == STEP_AMAX:
            tl.store(T.TILE_AMAX + tile, tl.max(row_amax, axis=0))
        else:
            scale, divisor, reciprocal, factor, prescaled = _row_scales(row_amax, T, batch_head, m_tile, KIND, SETUP)

            # ---- 4. divide by the scale, round to e4m3 (saturating)
            y = _quotient(x, scale[:, None], divisor[:, None], reciprocal[:, None], factor[:, None], prescaled,
                          SETUP.RECIPROCAL_DIVISION, KIND.CORRECTIONS, SETUP.INTERPRETED)  # fmt: skip
            y8 = _to_e4m3(y, SETUP.INTERPRETED)

            # ---- 5. store: rows, or Vᵀ with its keys (slots) contiguous
            slots = m_tile * TILE_ROWS + tl.arange(0, TILE_ROWS)
            if KIND.TRANSPOSED:
                out_ptrs = T.OUT + (batch_head * HEAD_DIM + offs_d[:, None]) * T.out_rows + slots[None, :]
                tl.store(out_ptrs, tl.trans(y8), mask=slots[None, :] < T.out_rows)
            else:
                out_ptrs = T.OUT + (batch_head * T.out_rows + slots[:, None]) * HEAD_DIM + offs_d[None, :]
                tl.store(out_ptrs, y8, mask=slots[:, None] < T.out_rows)


@triton.jit
def _quantise_kernel(Q, K, V, q_programs, k_programs, v_programs, ROTATION, rotation_scale, Q_KIND: tl.constexpr,
                     K_KIND: tl.constexpr, V_KIND: tl.constexpr, SETUP: tl.constexpr):  # fmt: skip
    """Programs [0, q_programs) quantise Q's tiles, the next k_programs K's, the rest V's (a launch
    for one tensor passes 0 programs for the others)."""
    program = tl.program_id(0)
    if program < q_programs:
        _quantise_tiles(Q, program, q_programs, ROTATION, rotation_scale, Q_KIND, SETUP)
    elif program < q_programs + k_programs:
        _quantise_tiles(K, program - q_programs, k_programs, ROTATION, rotation_scale, K_KIND, SETUP)
    else:
        _quantise_tiles(V, program - q_programs - k_programs, v_programs, ROTATION, rotation_scale, V_KIND, SETUP)


@triton.jit
def _tensor_amax_kernel(TILE_AMAX, TENSOR_AMAX, q_tiles, k_tiles, v_tiles, CHUNK: tl.constexpr):
    """Per-tensor scales: program t reduces tensor t's tile amaxes (stored back to back) to one."""
    tensor = tl.program_id(0)
    start = tl.where(tensor == 0, 0, tl.where(tensor == 1, q_tiles, q_tiles + k_tiles))
    count = tl.where(tensor == 0, q_tiles, tl.where(tensor == 1, k_tiles, v_tiles))
    running = tl.zeros((CHUNK,), dtype=tl.float32)
    for first in range(0, count, CHUNK):
        offs = first + tl.arange(0, CHUNK)
        running = tl.maximum(running, tl.load(TILE_AMAX + start + offs, mask=offs < count, other=0.0))
    tl.store(TENSOR_AMAX + tensor, tl.max(running, axis=0))


# ----------------------------------------------------------------------------------------------------
# Host
# ----------------------------------------------------------------------------------------------------
@functools.cache
def _rotation_operand_tensor(
    head_dim: int, seed: int, method: str, dot_dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, float]:
    """What ``_rotation_operand`` reads for random_hadamard(head_dim, seed): (sign matrix in
    ``dot_dtype``, c) for the tensor cores, (first row, unused 1.0) for the butterflies. Built once per
    key, like the matrix itself (the host reads c once, here)."""
    matrix = random_hadamard(head_dim, seed, device)
    if method == "tensor_core":
        magnitude = matrix[0, 0].abs().item()
        return torch.sign(matrix).to(dot_dtype).contiguous(), magnitude
    return matrix[0].contiguous(), 1.0


def _is_power_of_two(value: int) -> bool:
    return value >= 1 and not value & (value - 1)


def _check_quantisation(
    quantisation: Quantisation, value_layout: ValueLayout, head_dim: int, rotation_method: str
) -> None:
    for name, value in (("head_dim", head_dim), ("q_block_rows", quantisation.q_block_rows),
                        ("kv_block_rows", quantisation.kv_block_rows)):  # fmt: skip
        if not _is_power_of_two(value):
            raise ValueError(f"the fused fp8 quantiser needs a power-of-two {name}, got {value}")
    if value_layout.permuted and quantisation.kv_block_rows % KEY_GROUP:
        raise ValueError(
            f"a permuted V layout needs kv_block_rows that are whole groups of {KEY_GROUP} keys, "
            f"got {quantisation.kv_block_rows}"
        )
    if quantisation.rotation and rotation_method == "butterfly" and head_dim > BUTTERFLY_MAX_HEAD_DIM:
        raise ValueError(
            f"the butterfly rotation runs up to head_dim {BUTTERFLY_MAX_HEAD_DIM} (at more it spills registers); "
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
    """Shared memory one program of ``_quantise_kernel`` needs at this configuration (Triton allocates
    it; nothing here is declared). The terms, in the input's element size: the tensor-core rotation's
    D x D sign matrix, kept for the whole program; in each tensor's branch (Q, K, V, whose buffers
    Triton does not share) the ``num_stages - 1`` tiles in flight; one more tile for the rotation's
    wgmma operand and the transposed store's exchange. sm_90a builds under Triton 3.8 use this much at
    D = 256 with block scales and rotation, and less elsewhere (3.6: 294,912 bytes there); the
    capability-matrix test compiles every configuration a check accepts and holds it to the budget."""
    config = config or DEFAULT_CONFIG
    rotation_method = rotation_method or DEFAULT_ROTATION_METHOD
    element = dtype.itemsize
    tile = _tile_rows_of(quantisation) * head_dim * element
    sign_matrix = head_dim * head_dim * element if quantisation.rotation and rotation_method == "tensor_core" else 0
    return sign_matrix + (3 * (config.num_stages - 1) + 1) * tile


def shared_memory_supported(rung: str, problem: Problem, quantisation: Quantisation) -> tuple[bool, str]:
    """The capability check's part for the fused quantiser an FP8 rung runs before its kernel: refused
    where its shared memory (``shared_bytes``, default rotation method and configuration) exceeds sm_90's."""
    needed = shared_bytes(problem.head_dim, problem.dtype, quantisation)
    return check_shared_memory(rung, _quantiser_words(problem.head_dim, quantisation, DEFAULT_CONFIG), needed)


def _quantiser_words(head_dim: int, quantisation: Quantisation, config: QuantiserConfig) -> str:
    tile_rows = _tile_rows_of(quantisation)
    return (
        f"the fused fp8 quantiser at head_dim {head_dim} ({quantisation.name}, {tile_rows}-row tiles, "
        f"{config.num_stages} stages)"
    )


def _tensor_kinds(
    quantisation: Quantisation, value_layout: ValueLayout, rotation_method: str
) -> tuple[TensorKind, ...]:
    """Q and K in rows, rotated if asked; V transposed in its layout, never rotated."""
    rotate = ROTATE_NONE.value
    if quantisation.rotation:
        rotate = (ROTATE_TENSOR_CORE if rotation_method == "tensor_core" else ROTATE_BUTTERFLY).value
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
        """The kernel's TensorArgs for input ``x`` (a tensor, or a mock pointer with strides for builds)."""
        return TensorArgs(x, *x.stride(), self.heads, self.seqlen, self.tiles_per_head, self.tiles, out,
                          self.out_rows, scales, self.scale_shape[-1], tile_amax, tensor_amax)  # fmt: skip


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


def _programs(geometries: tuple[_TensorGeometry, ...], config: QuantiserConfig) -> tuple[int, ...]:
    """Programs per tensor: its tiles, ``tiles_per_program`` to a program."""
    return tuple(-(-geometry.tiles // config.tiles_per_program) for geometry in geometries)


def _launches(programs: tuple[int, ...], single_launch: bool) -> tuple[tuple[int, ...], ...]:
    """Program counts (Q, K, V) of each launch of a pass: all in one, or one tensor per launch."""
    if single_launch:
        return (programs,)
    return tuple(tuple(count if index == tensor else 0 for index, count in enumerate(programs))
                 for tensor in range(len(programs)))  # fmt: skip


def _launch_options(
    quantisation: Quantisation,
    value_layout: ValueLayout,
    rotation_method: str,
    config: QuantiserConfig,
    head_dim: int,
    step: int,
    interpreted: bool,
) -> dict:
    """``_quantise_kernel``'s constexprs and launch options for one pass."""
    tile_rows = _tile_rows_of(quantisation)
    q_kind, k_kind, v_kind = _tensor_kinds(quantisation, value_layout, rotation_method)
    setup = LaunchSetup(head_dim, int(math.log2(head_dim)), tile_rows, step, config.num_stages, config.prefetch,
                        config.division == "reciprocal", interpreted)  # fmt: skip
    options = {"Q_KIND": q_kind, "K_KIND": k_kind, "V_KIND": v_kind, "SETUP": setup,
               "num_warps": config.num_warps or _num_warps(tile_rows, head_dim)}  # fmt: skip
    if config.maxnreg is not None:
        options["maxnreg"] = config.maxnreg
    return options


@dataclass(frozen=True)
class _TensorPlan:
    """One tensor's buffers: its output and scales, its slices of the per-tensor amax buffers."""

    geometry: _TensorGeometry
    out: torch.Tensor
    scales: torch.Tensor
    tile_amax: torch.Tensor
    tensor_amax: torch.Tensor

    def arguments(self, x: torch.Tensor) -> TensorArgs:
        return self.geometry.arguments(x, self.out, self.scales, self.tile_amax, self.tensor_amax)


class FusedQuantiser:
    """The fused quantiser for one signature: outputs and scales allocated once; each call quantises
    new q, k, v of that signature into them and returns them as ``KernelOperands`` (the same buffers
    every call, as the registry's run() returns the same O).

    ``q_shape`` (B, H, Sq, D), ``kv_shape`` (B, Hkv, Sk, D); ``dtype`` fp16 or bf16; ``device`` CUDA,
    or CPU under the Triton interpreter. ``rotation_method``: one of ``ROTATION_METHODS``, by default
    ``DEFAULT_ROTATION_METHOD``; ``config``: a ``QuantiserConfig``, by default ``DEFAULT_CONFIG``; both
    defaults as they read when the quantiser is built (the rungs and their emulations take them from
    there, so bench/fp8_quantiser.py can time other choices through them).
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
    ):
        rotation_method = rotation_method or DEFAULT_ROTATION_METHOD
        self.config = config or DEFAULT_CONFIG
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.q_shape, self.kv_shape, self.dtype, self.device = tuple(q_shape), tuple(kv_shape), dtype, device
        self.quantisation, self.rotation_method = quantisation, rotation_method
        _check_signature(self.q_shape, self.kv_shape, dtype, device, rotation_method)
        head_dim = self.q_shape[3]
        _check_quantisation(quantisation, value_layout, head_dim, rotation_method)
        # No shared-memory check here: ``shared_bytes`` is exact only where the rungs' capability checks
        # need it (the default configuration at D=256) and over-counts other knobs (3 stages at D=128: a
        # 262,144-byte estimate for a build that runs, seen on an H200 on 2026-11-28); a knob that does
        # not fit is refused by Triton at launch (OutOfResources).
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
            )
            for index, geometry in enumerate(geometries)
        )
        self._launch_programs = _launches(_programs(geometries, self.config), self.config.single_launch)
        self._options = {
            step: _launch_options(quantisation, value_layout, rotation_method, self.config, head_dim, step, interpreted)
            for step in _steps(quantisation)
        }
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
        # What each pass last launched (Triton's compiled kernel: registers, spills), for reports.
        self.compiled: dict[int, object] = {}

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
        per_pass = len(self._launch_programs)
        return per_pass if self.quantisation.block else 2 * per_pass + 1

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> KernelOperands:
        """Quantise q, k, v into this quantiser's buffers."""
        self._check_inputs(q, k, v)
        tensors = tuple(plan.arguments(x) for plan, x in zip(self._plans, (q, k, v), strict=True))
        if self.quantisation.block:
            self._launch(tensors, STEP_BLOCK.value)
            return self.operands
        self._launch(tensors, STEP_AMAX.value)
        _tensor_amax_kernel[(len(tensors),)](
            self._tile_amax, self._tensor_amax, *self._tile_counts, CHUNK=AMAX_CHUNK, num_warps=AMAX_WARPS
        )
        self._launch(tensors, STEP_CAST.value)
        return self.operands

    def _launch(self, tensors: tuple[TensorArgs, ...], step: int) -> None:
        rotation, rotation_scale = self._rotation
        for programs in self._launch_programs:
            self.compiled[step] = _quantise_kernel[(sum(programs),)](
                *tensors, *programs, rotation, rotation_scale, **self._options[step]
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
) -> list[KernelBinary]:
    """Every distinct kernel a ``FusedQuantiser`` of this kind launches, compiled for sm_90a (no GPU
    needed) with the specialisation its launches get at that shape (by default P1, contiguous inputs):
    ``_quantise_kernel`` once per pass (block scales: one; per-tensor: amax and cast), then the
    per-tensor amax reduction."""
    from triton.runtime.jit import MockTensor

    from common.toolchain.compile import compile_triton_sm90_launch

    config = config or DEFAULT_CONFIG
    _check_quantisation(quantisation, value_layout, head_dim, rotation_method)
    q_shape = (batch, heads[0], seqlens[0], head_dim)
    kv_shape = (batch, heads[1], seqlens[1], head_dim)
    geometries = _geometries(q_shape, kv_shape, quantisation, value_layout)

    class _Input(MockTensor):
        """A contiguous input of ``shape`` as a launch sees it: a 16-byte aligned pointer and strides."""

        def __init__(self, shape: tuple[int, ...]):
            super().__init__(dtype)
            self._strides = tuple(math.prod(shape[index + 1 :]) for index in range(len(shape)))

        def stride(self) -> tuple[int, ...]:
            return self._strides

    tensors = tuple(
        geometry.arguments(
            _Input(shape),
            MockTensor(torch.float8_e4m3fn),
            MockTensor(torch.float32),
            MockTensor(torch.float32),
            MockTensor(torch.float32),
        )
        for geometry, shape in zip(geometries, (q_shape, kv_shape, kv_shape), strict=True)
    )
    tc = quantisation.rotation and rotation_method == "tensor_core"
    rotation = MockTensor(dtype if tc else torch.float32)
    programs = _launches(_programs(geometries, config), config.single_launch)[0]
    binaries = [
        compile_triton_sm90_launch(
            _quantise_kernel,
            *tensors,
            *programs,
            rotation,
            1.0,
            **_launch_options(quantisation, value_layout, rotation_method, config, head_dim, step, interpreted=False),
        )
        for step in _steps(quantisation)
    ]
    if not quantisation.block:
        binaries.append(
            compile_triton_sm90_launch(
                _tensor_amax_kernel,
                MockTensor(torch.float32),
                MockTensor(torch.float32),
                *(geometry.tiles for geometry in geometries),
                CHUNK=AMAX_CHUNK,
                num_warps=AMAX_WARPS,
            )
        )
    return binaries


def compile_sm90_for(problem: Problem, quantisation: Quantisation, value_layout: ValueLayout) -> list[KernelBinary]:
    """:func:`compile_sm90` at ``problem``'s head dim, dtype and shape: what an FP8 rung launches before
    its kernel (``Implementation.compile_input_transform_sm90``)."""
    return compile_sm90(
        problem.head_dim,
        problem.dtype,
        quantisation,
        value_layout,
        seqlens=(problem.seqlen_q, problem.seqlen_k),
        heads=(problem.heads, problem.kv_heads),
        batch=problem.batch,
    )


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
# An fp8 rung's launch over the quantiser's buffers
# ----------------------------------------------------------------------------------------------------
class QuantisedLaunch:
    """An fp8 rung's prepared kernel over a ``FusedQuantiser``'s buffers: ``quantise(q, k, v)`` writes
    new operands into them (the fused launches), calling it launches the kernel over them and returns
    O (or (O, lse)). Attributes other than these (``config``, ``lse``, ``out``, ``operands``) are the
    kernel's, so a rung's tests read its launch as they read its kernel."""

    def __init__(self, quantiser: FusedQuantiser, kernel: Runner):
        self.quantiser = quantiser
        self.kernel = kernel
        self.variant = quantiser.quantisation.name

    def quantise(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> KernelOperands:
        return self.quantiser(q, k, v)

    def __call__(self) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return self.kernel()

    def __getattr__(self, name: str) -> object:
        # Only reached for names this class lacks; "kernel" itself is excluded so that a half-built
        # object cannot recurse.
        if name == "kernel":
            raise AttributeError(name)
        return getattr(self.kernel, name)


def end_to_end_runner(launch: QuantisedLaunch, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Runner:
    """The run() that a user of bf16 activations pays per call (compare.py's end-to-end column): the
    fused quantisation of q, k, v into ``launch``'s buffers, then the kernel; no allocation, no torch
    op between the launches. Launched once here on a GPU, so the first timed call finds both compiled."""

    def run() -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        launch.quantise(q, k, v)
        return launch()

    if q.is_cuda:
        run()
    run.variant = launch.variant
    return run


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
