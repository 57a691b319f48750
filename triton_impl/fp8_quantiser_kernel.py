"""The device code of the fused FP8 quantiser that the three stacks' FP8 rungs share (Triton, Gluon
and CuTe run it before their attention kernels; its host side, ``FusedQuantiser``, is
``triton_impl/fp8_quantiser.py``): ``quantise_kernel`` turns Q, K and V from bf16/fp16 into the e4m3
operands and scales those kernels read, the values of ``common.contract.fp8.quantise``, and
``tensor_amax_kernel`` reduces per-tensor amaxes. The work is memory-bound (Q, K, V read in 16 bits,
written in 8), so the kernel is built to keep bytes in flight and to spend few instructions per element.

Launch (``quantise_kernel``; ``FusedQuantiser`` plans it): one grid for all three tensors; programs [0, q_programs)
take Q's tiles, the next k_programs K's, the rest V's (``single_launch=False`` launches the same kernel once per
tensor; with ``QuantiserConfig.value_config`` V runs in a launch of its own), or (``INTERLEAVED``) Q's (if any), K's
and V's programs alternating in program order, so that an SM holds rotated tiles (instruction-bound) and V's
(memory-bound) at once (``_interleaved_program``); or a persistent grid (``PERSISTENT``) whose every program takes
its share of Q's tiles, then of K's, then of V's. A tile is 128 rows (``TILE_ROWS``: the larger block; Q's 64-row
blocks go two to a tile) of one (batch, head), so every tensor's tile has the same shape and one warp count (64 fp32
values a thread: 8 warps at D=128) serves the launch. A program loops over ``tiles_per_program`` tiles of its
tensor, strided by the tensor's program count. ``HOLDS_Q``, ``HOLDS_K`` and ``HOLDS_V`` say whose code a
binary of program ranges holds: all three by default (a branch without programs is never taken), only the launched
tensors' where K and V run in launches of their own (``value_config``), so that a launch's registers and shared
memory are its own tensor's alone (Triton gives each branch its own buffers and the register count is the largest
branch's). With ``LAUNCH_DEPENDENTS`` every program first executes ``griddepcontrol.launch_dependents``
(programmatic dependent launch: an attention kernel launched next with PDL starts its prologue under this launch's
last wave and waits before reading its operands).

Per program (``_quantise_tiles``): the rotation operand is loaded once (the tensor-core sign matrix
stays in shared memory across the loop); then per tile:
  1. Load the tile's rows in bf16/fp16 (16-byte loads; rows past S as zeros). V for a kernel that
     reads it permuted (``ValueLayout.permuted``) is loaded in slot order (row r of the tile is key
     ``PERMUTED_KEY_ORDER``-mapped r), so that its store in step 5 is a plain transposed tile. With
     ``prefetch`` the next tile's load is issued before this tile is computed (registers), and with
     ``L2_PREFETCH`` the L2 is asked for the tile after it where tiles lie back to back (one
     ``cp.async.bulk.prefetch.L2`` a tile: bytes in flight that hold no register, so that the register load of that
     tile an iteration later finds it in the L2); with
     ``num_stages`` > 1 Triton's pipeliner does it by cp.async into shared memory. With ``TMA`` a
     tensor whose tile is a block of rows in order (Q, K, and V in key order) is a tensor descriptor
     (B, H, S, D) and each tile one TMA copy of a (1, 1, TILE_ROWS, D) box into shared memory (rows
     past S filled with zeros by the copy); Triton's pipeliner keeps ``num_stages`` - 1 such copies in
     flight on mbarriers, and the rotation's wgmma reads the tile where it landed, so a rotated tile
     never passes through registers before its product (no address arithmetic, no repacking, no
     store to shared memory).
  2. Q and K with ``rotation``: multiply by ``random_hadamard(D, seed)`` = sign matrix x c, the same
     matrix as the reference, one of three ways (``ROTATION_METHODS``):
     * ``tensor_core``: the tile times the ±1 sign matrix on wgmma, both operands in the input's own
       type (bf16 or fp16: x · ±1 is exact) with fp32 accumulation, then x c, c = the matrix's fp32
       entry magnitude 1/sqrt(D). Only the order of the fp32 sums differs from torch's fp32 GEMM.
       Triton stores a loaded or prefetched tile to shared memory for the wgmma (then a proxy fence, a
       ``MEMBAR`` in SASS, and a barrier each tile); with ``REGISTER_OPERAND`` the wgmma takes x from
       registers instead (``_in_registers``): from a cp.async ring (``num_stages``) each thread reads its
       operand fragment by ``ldmatrix`` straight from the ring's slot, with no store, fence or extra tile of
       shared memory. The same products and sums (the operand's source is all that differs).
     * ``butterfly``: log2(D) radix-2 stages of sums and differences in fp32 (the Hadamard transform
       in constant geometry: y[i] = x[2i] + x[2i+1], y[i + D/2] = x[2i] - x[2i+1] each stage), then
       x the matrix's first row (its column signs times c), + 0 (a column whose sums cancel would be
       -0 where its sign is negative). Up to D = 128 (more spills registers).
     * ``kronecker``: Sylvester's H_D is H_{D/16} ⊗ H_16, so column block a of x H_D is the sum over j of
       H_{D/16}[j, a] (x_j H_16), x_j the tile's 16-column block j: each block is loaded on its own, multiplied
       by H_16 on the tensor cores (one m64n16k16 wgmma a warpgroup, exact products, fp32 sums), and the
       log2(D/16) butterfly stages run across the blocks (elementwise adds of whole tensors: no data moves
       between threads), then x the column signs times c, + 0 as above. 1/8 of the tensor-core work of
       ``tensor_core`` at D=128 (whose 128 x 128 x 128 product a tile is about 0.56 µs of an SM's tensor cores,
       8.7 µs of P1's K launch where it does not overlap the loads), 3 fp32 adds an element. The tile stays a
       tuple of 16-column blocks through steps 3-5 (row amax over the blocks, each block divided and stored
       on its own). Up to D = 128 (at 256 its sixteen blocks spill registers); loads by pointers (a TMA box is
       whole rows). Slower, measured: P1's K 81.9-96.5 µs against ``tensor_core``'s 44.6 on an H100 (2026-12-06,
       results/h100/fp8-kronecker-rotation-2026-12-06/): the eight 32-byte-a-row loads and their layout
       conversions cost more than the product saved, so the default's time over its stream is not its tensor work.
     Every way a rotated zero is +0 (the tensor cores' cancelled sums are +0, times c > 0), so its
     division cannot depend on how the division carries a zero's sign (step 4).
  3. amax per row, then per block (per-tensor: the tensor's, below); scale = amax / 448 by IEEE
     division (1 for an all-zero group), as ``block_scales``, stored per block.
  4. x / scale, correctly rounded, then e4m3 with round-to-nearest-even by one ``cvt.rn.satfinite``,
     which saturates exactly as the reference's clamp to ±448 does (a quotient can round a hair past
     448) and keeps NaN, so no clamp is needed. The division (``division``):
     * ``reciprocal``: per block r = 1/d rounded (``_divisor_of``, d = the scale), per element
       q = x · r, then q -= (d·q - x) · r as two fmas, the residual d·q - x formed exactly and its
       product with -r subtracted (``_quotient``: the negations are products with -1, exact for zeros,
       which keep their sign with no select). Markstein's theorem: with r within half an
       ulp of 1/d, q within an ulp of x/d and the residual exact, one such step gives the correctly
       rounded quotient; the first step brings any q there, the second is exact
       (``ROTATED_CORRECTIONS`` = 2, for rotated values, which are any fp32 number). For bf16/fp16
       values one step is already exact, checked for every pair of such a value and a scale of such an
       amax (``UNROTATED_CORRECTIONS`` = 1).
       Residuals are exact while d >= 2^-60 (``RECIPROCAL_MIN_SCALE``); a block of tiny values moves
       up by 2^89 (d and x both: exact), and an infinite scale (an infinity in the block) becomes
       d = r = 0, which gives x / inf's signed zero. 1 multiply and 2 or 4 fmas an element (the
       negation of x rides in the fmas' operands).
     * ``ieee``: ``div.rn`` per element (a reciprocal approximation, refinement, a range check and a
       slow-path branch: about 10 instructions an element, more than everything else a tile does).
  5. Store: Q and K as (B, H, S, D) rows; V transposed as (B, Hkv, D, Sk') with keys padded to the
     layout's multiple (the padding slots are zeros); 16-byte stores after a shared-memory exchange.

Per-tensor scales need the tensor's amax before any cast: an amax pass (each tile's amax), the
reduction (``tensor_amax_kernel``, three maxima in one launch), then the cast pass: three launches
(seven with a launch per tensor). Block scales need one pass: one launch.

Interpreter (``INTERPRETED``, the CPU tests under ``TRITON_INTERPRET=1``): three operations differ
from the compiled kernel and are replaced. The interpreter's e4m3 cast does not round to nearest even
(the kernel clamps and rounds onto e4m3's grid in fp32 first, so the cast is exact), its bf16 dot
multiplies raw bits (the rotation's dot takes fp32 operands there, products exact either way), and
its fma rounds twice (computed in fp64: the product of two fp32 values is exact there).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from common.contract.fp8 import E4M3_MAX

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
# What one launch of quantise_kernel does (STEP): a block-scaled pass, or per-tensor's amax or cast pass.
STEP_BLOCK, STEP_AMAX, STEP_CAST = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
ROTATE_NONE, ROTATE_TENSOR_CORE, ROTATE_BUTTERFLY = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
ROTATE_KRONECKER = tl.constexpr(3)
# The Kronecker rotation's column block: Sylvester's H_16 on the tensor cores (one wgmma k-step of 16). Its blocks
# travel as tuples grown by concatenation (noqa RUF005): Triton's compiler takes no starred tuple display.
KRONECKER_COLUMNS = tl.constexpr(16)


class TensorArgs(NamedTuple):
    """One tensor's runtime arguments (a tuple argument of ``quantise_kernel``): its input with
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
    """Constexprs shared by the three tensors of a launch. ``LAUNCH_DEPENDENTS``: ``QuantiserConfig``'s
    ``launch_dependents`` (never under the interpreter). ``INTERPRETED``: the CPU interpreter's replacements
    (module docstring, "Interpreter"). ``HOLDS_Q``, ``HOLDS_K``, ``HOLDS_V``: whether a binary of program ranges
    holds that tensor's code (module docstring, "Launch"). ``L2_PREFETCH``: ``QuantiserConfig``'s ``l2_prefetch``
    (never under the interpreter; module docstring, step 1). ``REGISTER_OPERAND``: ``QuantiserConfig``'s
    ``register_operand`` (module docstring, step 2)."""

    HEAD_DIM: int
    LOG2_HEAD_DIM: int
    TILE_ROWS: int
    STEP: int
    NUM_STAGES: int
    PREFETCH: bool
    RECIPROCAL_DIVISION: bool
    PERSISTENT: bool
    TMA: bool
    INTERLEAVED: bool
    LAUNCH_DEPENDENTS: bool
    INTERPRETED: bool
    HOLDS_Q: bool = True
    HOLDS_K: bool = True
    HOLDS_V: bool = True
    L2_PREFETCH: bool = False
    REGISTER_OPERAND: bool = False


@triton.jit
def _hadamard_butterflies(x, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, LOG2_HEAD_DIM: tl.constexpr):
    """x (ROWS, D) fp32 times Sylvester's Hadamard matrix H (entries ±1): log2(D) stages, each
    y[i] = x[2i] + x[2i+1], y[i + D/2] = x[2i] - x[2i+1] (constant geometry: the same reshape every stage)."""
    for _ in tl.static_range(LOG2_HEAD_DIM):
        even, odd = tl.split(tl.reshape(x, (ROWS, HEAD_DIM // 2, 2)))
        x = tl.reshape(tl.permute(tl.join(even + odd, even - odd), (0, 2, 1)), (ROWS, HEAD_DIM))
    return x


@triton.jit
def _hadamard_16(dtype: tl.constexpr):
    """Sylvester's 16 x 16 Hadamard matrix in ``dtype``: entry (i, j) is (-1)^popcount(i & j)."""
    offs = tl.arange(0, KRONECKER_COLUMNS)
    both = offs[:, None] & offs[None, :]
    parity = (both ^ (both >> 1) ^ (both >> 2) ^ (both >> 3)) & 1
    return (1 - 2 * parity).to(dtype)


@triton.jit
def _rotation_operand(ROTATION, ROTATE: tl.constexpr, HEAD_DIM: tl.constexpr, DOT_DTYPE: tl.constexpr,
                      FP32_DOT: tl.constexpr):  # fmt: skip
    """What ``_rotated`` multiplies by, loaded once per program: the (D, D) ±1 sign matrix (tensor
    cores; Triton keeps it in shared memory across the tile loop), the matrix's first row (butterflies), or
    Sylvester's H_16 in ``DOT_DTYPE`` (fp32 for the interpreter's ``FP32_DOT``) and the first row's column blocks
    (Kronecker)."""
    offs_d = tl.arange(0, HEAD_DIM)
    if ROTATE == ROTATE_TENSOR_CORE:
        rotation = tl.load(ROTATION + offs_d[:, None] * HEAD_DIM + offs_d[None, :])
    elif ROTATE == ROTATE_KRONECKER:
        offs_c = tl.arange(0, KRONECKER_COLUMNS)
        signs = ()
        for block in tl.static_range(HEAD_DIM // KRONECKER_COLUMNS):
            signs = signs + (tl.load(ROTATION + block * KRONECKER_COLUMNS + offs_c),)  # noqa: RUF005
        rotation = (_hadamard_16(tl.float32 if FP32_DOT else DOT_DTYPE), signs)
    else:
        rotation = tl.load(ROTATION + offs_d)
    return rotation


@triton.jit
def _in_registers(x):
    """x unchanged, through an operation Triton cannot see through (one ``mov.b32`` per two elements, which ptxas
    removes): Triton keeps a dot's A operand in shared memory where it comes straight from a load or from the loop's
    carried values, and reads it into registers otherwise (``REGISTER_OPERAND``, module docstring step 2)."""
    return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=x.dtype, is_pure=True, pack=2)


@triton.jit
def _rotated(x, rotation, rotation_scale, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, LOG2_HEAD_DIM: tl.constexpr,
             ROTATE: tl.constexpr, FP32_DOT: tl.constexpr, REGISTER_OPERAND: tl.constexpr):  # fmt: skip
    """x (ROWS, D) times random_hadamard(D, seed) in fp32 (module docstring, step 2); ``REGISTER_OPERAND``: the
    tensor cores read x from registers (not under the interpreter's fp32 dot)."""
    if ROTATE == ROTATE_TENSOR_CORE:
        if REGISTER_OPERAND and not FP32_DOT:
            x = _in_registers(x)
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
def _butterflies_across(blocks):
    """Sylvester's Hadamard matrix over a tuple of 2^k same-shape tensors: block a of the result is the sum over j of
    H[j, a] x blocks[j], in k stages of y[i] = x[2i] + x[2i+1], y[i + n/2] = x[2i] - x[2i+1] (the constant geometry of
    ``_hadamard_butterflies``, here across whole tensors: elementwise adds, no data moves between threads)."""
    for _ in tl.static_range(len(blocks).bit_length() - 1):
        sums = ()
        differences = ()
        for pair in tl.static_range(len(blocks) // 2):
            sums = sums + (blocks[2 * pair] + blocks[2 * pair + 1],)  # noqa: RUF005
            differences = differences + (blocks[2 * pair] - blocks[2 * pair + 1],)  # noqa: RUF005
        blocks = sums + differences
    return blocks


@triton.jit
def _kronecker_rotated(blocks, rotation, FP32_DOT: tl.constexpr, REGISTER_OPERAND: tl.constexpr):
    """The tile's 16-column blocks (a tuple, in the input's type) times random_hadamard(D, seed), as 16-column blocks
    in fp32 (module docstring, step 2, ``kronecker``): H_D = H_{D/16} ⊗ H_16, so block a of x H_D is the sum over j of
    H_{D/16}[j, a] (x_j H_16): one (rows, 16) x (16, 16) product a block on the tensor cores (exact products, fp32
    sums), then the butterflies across the blocks in fp32, then x the column signs times c (+ 0: ``_rotated``)."""
    hadamard_16, signs = rotation
    products = ()
    for block in tl.static_range(len(blocks)):
        x = blocks[block]
        if FP32_DOT:
            product = tl.dot(x.to(tl.float32), hadamard_16, input_precision="ieee")
        else:
            product = tl.dot(_in_registers(x) if REGISTER_OPERAND else x, hadamard_16)
        products = products + (product,)  # noqa: RUF005
    products = _butterflies_across(products)
    rotated = ()
    for block in tl.static_range(len(blocks)):
        rotated = rotated + (products[block] * signs[block][None, :] + 0.0,)  # noqa: RUF005
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
    CORRECTIONS times q += (x - d·q) · r, written as q = fma(fma(d, q, -x), -r, q) so that each
    correction is two fmas: the residual d·q - x, formed exactly, and its product with -r subtracted
    (the same exact values as (x - d·q) · r added, so the same rounding). The negations are products
    with -1, exact for zeros too (Triton 3.6 writes the unary minus as 0 - y, +0 for y = +0), and
    ptxas folds them into the fmas' operands: -x once per element, -r once per row. A zero keeps its
    sign through every correction (q = ±0 gives the residual +0, and -0 + q = q), so x = -0 divides
    to -0 without a select, rotated or not."""
    if RECIPROCAL_DIVISION:
        if prescaled:
            x = x * factor
        quotient = x * reciprocal
        minus_x = x * -1.0
        minus_reciprocal = reciprocal * -1.0
        for _ in tl.static_range(CORRECTIONS):
            residual = _fma(divisor, quotient, minus_x, INTERPRETED)
            quotient = _fma(residual, minus_reciprocal, quotient, INTERPRETED)
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
def _load_tile(T, X_DESC, tile, TILE_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, PERMUTED: tl.constexpr,
               TMA: tl.constexpr):  # fmt: skip
    """Tile ``tile`` of tensor T in its dtype (V for a permuted layout in slot order); rows past S, and
    every row of a tile past the last, as zeros. ``TMA`` (rows in order only): one copy of X_DESC's box
    (the tensor's descriptor; the caller never asks for a tile past the last)."""
    if TMA and not PERMUTED:
        batch_head_32 = tile // T.tiles_per_head
        box = X_DESC.load([batch_head_32 // T.heads, batch_head_32 % T.heads, (tile % T.tiles_per_head) * TILE_ROWS, 0])
        x = box.reshape(TILE_ROWS, HEAD_DIM)
    else:
        x = _load_columns(T, tile, 0, TILE_ROWS, HEAD_DIM, PERMUTED)
    return x


@triton.jit
def _load_columns(T, tile, FIRST_COLUMN: tl.constexpr, TILE_ROWS: tl.constexpr, COLUMNS: tl.constexpr,
                  PERMUTED: tl.constexpr):  # fmt: skip
    """Columns [FIRST_COLUMN, FIRST_COLUMN + COLUMNS) of tile ``tile`` of tensor T by pointers (``_load_tile``'s rows
    and zeros)."""
    batch_head = (tile // T.tiles_per_head).to(tl.int64)
    rows = _tile_rows(tile % T.tiles_per_head, TILE_ROWS, PERMUTED)
    offs_d = FIRST_COLUMN + tl.arange(0, COLUMNS)
    x_ptrs = (T.X + (batch_head // T.heads) * T.stride_b + (batch_head % T.heads) * T.stride_h
              + rows[:, None] * T.stride_s + offs_d[None, :] * T.stride_d)  # fmt: skip
    # A tile past the last reads no row (its valid length is 0): one comparison per row, a mask Triton
    # 3.9's interpreter also takes (it refuses a tensor mask combined with a scalar one).
    valid_rows = tl.where(tile < T.tiles, T.seqlen, 0)
    return tl.load(x_ptrs, mask=rows[:, None] < valid_rows, other=0.0)


@triton.jit
def _load_blocks(T, X_DESC, tile, TILE_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCKS: tl.constexpr,
                 PERMUTED: tl.constexpr, TMA: tl.constexpr):  # fmt: skip
    """Tile ``tile`` of tensor T as a tuple of BLOCKS column blocks: the whole tile (``_load_tile``) where BLOCKS is
    1, else each block of D / BLOCKS columns by a load of its own (the Kronecker rotation's 16-column blocks, by
    pointers: a TMA box is whole rows)."""
    if BLOCKS == 1:
        blocks = (_load_tile(T, X_DESC, tile, TILE_ROWS, HEAD_DIM, PERMUTED, TMA),)
    else:
        blocks = ()
        for block in tl.static_range(BLOCKS):
            columns = _load_columns(T, tile, block * (HEAD_DIM // BLOCKS), TILE_ROWS, HEAD_DIM // BLOCKS, PERMUTED)
            blocks = blocks + (columns,)  # noqa: RUF005
    return blocks


@triton.jit
def _tiles_back_to_back(T, TILE_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Whether tile t of tensor T starts t x TILE_ROWS x D elements into it: a contiguous (B, H, S, D) input, S a
    multiple of the tile and no padded output rows (V's keys), so that ``_prefetch_tile_to_l2`` needs no division."""
    rows_contiguous = (T.stride_d == 1) & (T.stride_s == HEAD_DIM) & (T.seqlen % TILE_ROWS == 0)
    rows_contiguous = rows_contiguous & (T.out_rows == T.seqlen)
    return rows_contiguous & (T.stride_h == T.seqlen * HEAD_DIM) & (T.stride_b == T.heads * T.seqlen * HEAD_DIM)


@triton.jit
def _prefetch_tile_to_l2(T, tile, TILE_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Ask the L2 for tile ``tile`` of tensor T, whose tiles lie back to back (``_tiles_back_to_back``): one
    ``cp.async.bulk.prefetch.L2`` of its bytes, issued by the program's first thread. No register or shared memory
    holds the data and nothing waits for it."""
    TILE_ELEMENTS: tl.constexpr = TILE_ROWS * HEAD_DIM
    start = T.X + tile.to(tl.int64) * TILE_ELEMENTS
    nbytes = tl.full([1], TILE_ELEMENTS * T.X.dtype.element_ty.primitive_bitwidth // 8, tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred leader; .reg .b32 thread; mov.u32 thread, %tid.x; setp.eq.u32 leader, thread, 0; "
        "@leader cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r",
        [start + tl.zeros([1], tl.int64), nbytes],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _quantise_tiles(T, X_DESC, program, programs, ROTATION, rotation_scale, KIND: tl.constexpr,
                    SETUP: tl.constexpr):  # fmt: skip
    """Tiles program, program + programs, ... of one tensor (T: its ``TensorArgs``; X_DESC: its TMA
    descriptor or None; KIND: its ``TensorKind``): the module docstring's steps 1-5 for each. A tile is a tuple of
    column blocks: one of D columns, or D / 16 of 16 under the Kronecker rotation, which rotates blocks."""
    HEAD_DIM: tl.constexpr = SETUP.HEAD_DIM
    TILE_ROWS: tl.constexpr = SETUP.TILE_ROWS
    BLOCKS: tl.constexpr = HEAD_DIM // KRONECKER_COLUMNS if KIND.ROTATE == ROTATE_KRONECKER else 1
    COLUMNS: tl.constexpr = HEAD_DIM // BLOCKS
    offs_c = tl.arange(0, COLUMNS)
    if KIND.ROTATE != ROTATE_NONE:
        rotation = _rotation_operand(ROTATION, KIND.ROTATE, HEAD_DIM, T.X.dtype.element_ty, SETUP.INTERPRETED)
    if SETUP.PREFETCH:
        x_next = _load_blocks(T, X_DESC, program, TILE_ROWS, HEAD_DIM, BLOCKS, KIND.PERMUTED, SETUP.TMA)
    if SETUP.L2_PREFETCH:
        back_to_back = _tiles_back_to_back(T, TILE_ROWS, HEAD_DIM)
    for tile in tl.range(program, T.tiles, programs, num_stages=SETUP.NUM_STAGES):
        batch_head = (tile // T.tiles_per_head).to(tl.int64)
        m_tile = tile % T.tiles_per_head

        # ---- 1. load (PREFETCH: this tile came with the previous one; ask for the next before computing)
        if SETUP.PREFETCH:
            x = x_next
            x_next = _load_blocks(T, X_DESC, tile + programs, TILE_ROWS, HEAD_DIM, BLOCKS, KIND.PERMUTED, SETUP.TMA)
        else:
            x = _load_blocks(T, X_DESC, tile, TILE_ROWS, HEAD_DIM, BLOCKS, KIND.PERMUTED, SETUP.TMA)
        if SETUP.L2_PREFETCH and (tile + 2 * programs < T.tiles) & back_to_back:
            _prefetch_tile_to_l2(T, tile + 2 * programs, TILE_ROWS, HEAD_DIM)

        # ---- 2. rotation
        if KIND.ROTATE == ROTATE_KRONECKER:
            x = _kronecker_rotated(x, rotation, SETUP.INTERPRETED, SETUP.REGISTER_OPERAND)
        elif KIND.ROTATE != ROTATE_NONE:
            x = (_rotated(x[0], rotation, rotation_scale, TILE_ROWS, HEAD_DIM, SETUP.LOG2_HEAD_DIM, KIND.ROTATE,
                          SETUP.INTERPRETED, SETUP.REGISTER_OPERAND),)  # fmt: skip

        # ---- 3. amax (per row, then per block) and scales
        row_amax = tl.max(tl.abs(x[0].to(tl.float32)), axis=1)
        for block in tl.static_range(1, BLOCKS):
            row_amax = tl.maximum(row_amax, tl.max(tl.abs(x[block]), axis=1))
        if SETUP.STEP == STEP_AMAX:
            tl.store(T.TILE_AMAX + tile, tl.max(row_amax, axis=0))
        else:
            scale, divisor, reciprocal, factor, prescaled = _row_scales(row_amax, T, batch_head, m_tile, KIND, SETUP)
            for block in tl.static_range(BLOCKS):
                # ---- 4. divide by the scale, round to e4m3 (saturating)
                y = _quotient(x[block].to(tl.float32), scale[:, None], divisor[:, None], reciprocal[:, None],
                              factor[:, None], prescaled, SETUP.RECIPROCAL_DIVISION, KIND.CORRECTIONS,
                              SETUP.INTERPRETED)  # fmt: skip
                y8 = _to_e4m3(y, SETUP.INTERPRETED)

                # ---- 5. store: rows, or Vᵀ with its keys (slots) contiguous. The slots are computed here, not once
                # before the loop: hoisted, the default build's 128 registers spill 16 bytes under Triton 3.7.
                slots = m_tile * TILE_ROWS + tl.arange(0, TILE_ROWS)
                offs_d = block * COLUMNS + offs_c
                if KIND.TRANSPOSED:
                    out_ptrs = T.OUT + (batch_head * HEAD_DIM + offs_d[:, None]) * T.out_rows + slots[None, :]
                    tl.store(out_ptrs, tl.trans(y8), mask=slots[None, :] < T.out_rows)
                else:
                    out_ptrs = T.OUT + (batch_head * T.out_rows + slots[:, None]) * HEAD_DIM + offs_d[None, :]
                    tl.store(out_ptrs, y8, mask=slots[:, None] < T.out_rows)


@triton.jit
def _interleaved_program(program, q_programs, k_programs, v_programs):
    """(tensor, index) of ``program`` in the interleaved order: while every tensor with programs has programs left
    they take turns, Q, K, V, Q, K, V, ... (program 3 i + t is tensor t's program i), or K, V, K, V, ... in a launch
    of K and V only (Q's programs none: program 2 i + t is tensor 1 + t's), then the tensors' remaining programs
    follow in order (Q's, K's, V's). Tensor 0 is Q, 1 K, 2 V; K and V always have programs."""
    skip_q = tl.where(q_programs == 0, 1, 0)
    turns = 3 - skip_q
    shared = tl.where(v_programs < k_programs, v_programs, k_programs)
    shared = tl.where((skip_q == 0) & (q_programs < shared), q_programs, shared)
    rest = program - turns * shared
    q_rest = q_programs - shared * (1 - skip_q)
    k_rest = k_programs - shared
    tensor = tl.where(rest < 0, program % turns + skip_q,
                      tl.where(rest < q_rest, 0, tl.where(rest < q_rest + k_rest, 1, 2)))  # fmt: skip
    before = tl.where(tensor == 0, 0, tl.where(tensor == 1, q_rest, q_rest + k_rest))
    index = tl.where(rest < 0, program // turns, shared + rest - before)
    return tensor, index


@triton.jit
def quantise_kernel(Q, K, V, Q_DESC, K_DESC, V_DESC, q_programs, k_programs, v_programs, ROTATION, rotation_scale,
                    Q_KIND: tl.constexpr, K_KIND: tl.constexpr, V_KIND: tl.constexpr, SETUP: tl.constexpr):  # fmt: skip
    """Programs [0, q_programs) quantise Q's tiles, the next k_programs K's, the rest V's (a launch
    for one tensor passes 0 programs for the others), or in the interleaved order (``SETUP.INTERLEAVED``,
    ``_interleaved_program``); a persistent grid (``SETUP.PERSISTENT``, all three
    counts the grid) has every program quantise its share of Q's tiles, then K's, then V's. Program ranges run
    only the code of the tensors ``SETUP`` holds (the others' programs are none in such a launch). Q_DESC,
    K_DESC, V_DESC: each tensor's TMA descriptor where ``SETUP.TMA`` loads it by copies, else None
    (top-level arguments: Triton's launcher expands a descriptor only there, not inside a tuple)."""
    if SETUP.LAUNCH_DEPENDENTS:
        # Programmatic dependent launch: the next kernel, launched with PDL, may start once every program got here.
        gdc_launch_dependents()
    program = tl.program_id(0)
    if SETUP.PERSISTENT:
        _quantise_tiles(Q, Q_DESC, program, q_programs, ROTATION, rotation_scale, Q_KIND, SETUP)
        _quantise_tiles(K, K_DESC, program, k_programs, ROTATION, rotation_scale, K_KIND, SETUP)
        _quantise_tiles(V, V_DESC, program, v_programs, ROTATION, rotation_scale, V_KIND, SETUP)
    elif SETUP.INTERLEAVED:
        tensor, index = _interleaved_program(program, q_programs, k_programs, v_programs)
        if tensor == 0:
            _quantise_tiles(Q, Q_DESC, index, q_programs, ROTATION, rotation_scale, Q_KIND, SETUP)
        elif tensor == 1:
            _quantise_tiles(K, K_DESC, index, k_programs, ROTATION, rotation_scale, K_KIND, SETUP)
        else:
            _quantise_tiles(V, V_DESC, index, v_programs, ROTATION, rotation_scale, V_KIND, SETUP)
    elif program < q_programs:
        if SETUP.HOLDS_Q:
            _quantise_tiles(Q, Q_DESC, program, q_programs, ROTATION, rotation_scale, Q_KIND, SETUP)
    elif program < q_programs + k_programs:
        if SETUP.HOLDS_K:
            _quantise_tiles(K, K_DESC, program - q_programs, k_programs, ROTATION, rotation_scale, K_KIND, SETUP)
    elif SETUP.HOLDS_V:
        _quantise_tiles(V, V_DESC, program - q_programs - k_programs, v_programs, ROTATION, rotation_scale, V_KIND,
                        SETUP)  # fmt: skip


@triton.jit
def tensor_amax_kernel(TILE_AMAX, TENSOR_AMAX, q_tiles, k_tiles, v_tiles, CHUNK: tl.constexpr):
    """Per-tensor scales: program t reduces tensor t's tile amaxes (stored back to back) to one."""
    tensor = tl.program_id(0)
    start = tl.where(tensor == 0, 0, tl.where(tensor == 1, q_tiles, q_tiles + k_tiles))
    count = tl.where(tensor == 0, q_tiles, tl.where(tensor == 1, k_tiles, v_tiles))
    running = tl.zeros((CHUNK,), dtype=tl.float32)
    for first in range(0, count, CHUNK):
        offs = first + tl.arange(0, CHUNK)
        running = tl.maximum(running, tl.load(TILE_AMAX + start + offs, mask=offs < count, other=0.0))
    tl.store(TENSOR_AMAX + tensor, tl.max(running, axis=0))
