"""The fused FP8 quantiser: Q, K and V from bf16/fp16 to the e4m3 operands and scales that the three
FP8 rungs read, one Triton kernel launch per tensor, the same values as ``common.contract.fp8.quantise``.

Why: ``quantise`` is the reference, written as torch code (a rotation GEMM, abs, amax, pad, repeat,
divide, clamp, cast, then V transposed and permuted by indexing), which reads and writes each tensor
many times and launches dozens of kernels per call. Here each program reads one quantisation block of
one (batch, head) once and writes it once, in the layout its kernel reads.

Per program (``_quantise_kernel``; grid: blocks x (batch · heads)):
  1. Load the block's rows (Q: ``q_block_rows``, K and V: ``kv_block_rows``) in bf16/fp16, rows past
     S as zeros. V for a kernel that reads it permuted (``ValueLayout.permuted``) is loaded in slot
     order (row r of the tile is key ``PERMUTED_KEY_ORDER``-mapped r), so that its store in step 5 is
     a plain transposed tile.
  2. Q and K with ``rotation``: multiply by ``random_hadamard(D, seed)`` = sign matrix x c, the same
     matrix as the reference, one of two ways (``ROTATION_METHODS``):
     * ``tensor_core``: the tile times the ±1 sign matrix (exact in bf16/fp16) on tensor cores with
       fp32 accumulation, then x c, c = the matrix's fp32 entry magnitude 1/sqrt(D).
     * ``butterfly``: log2(D) radix-2 stages of sums and differences in fp32 (the Hadamard transform
       in constant geometry: y[i] = x[2i] + x[2i+1], y[i + D/2] = x[2i] - x[2i+1] each stage), then
       x the matrix's first row (its column signs times c).
  3. amax of the block (per-tensor: of the whole tensor, see below), scale = amax / 448 (1 for an
     all-zero group), as ``block_scales``.
  4. x / scale (IEEE division, ``div_rn``: Triton's ``/`` is approximate), clamped to ±448, cast to
     e4m3 with round-to-nearest-even (``cvt.rn.satfinite``), as ``quantise_with``.
  5. Store: Q and K as (B, H, S, D) rows; V transposed as (B, Hkv, D, Sk') with keys padded to the
     layout's multiple (the padding slots are zeros) and the block's scale into (B, H, blocks).

Per-tensor scales need the tensor's amax before any cast: three passes, seven launches for Q, K, V
(each tensor's block amax, ``_tensor_amax_kernel`` for the three maxima in one launch, then each
tensor's cast). Block scales need one pass: three launches.

Equality with the reference (``operand_differences``): without rotation the arithmetic is the same
operation for operation (exact amax, one IEEE division, one rounding), so bytes and scales are
bit-identical. The rotation's sums run in another order than torch's fp32 GEMM (and the tensor cores
accumulate in their own), so a rotated value can differ from the reference's in its last fp32 bits:
an amax, hence a scale, by a few ulps, and the rare element that sits on an e4m3 rounding midpoint by
exactly one e4m3 step. The emulation therefore never assumes the reference's bytes: every fp8 rung's
``emulate`` quantises with this kernel on CUDA (``quantise_for_kernel``) and judges the kernel
against exactly what it read.

Devices: CUDA tensors always take this kernel (a case it cannot run raises ``ValueError``, never a
silent fallback). CPU tensors run it under the Triton interpreter (``TRITON_INTERPRET=1``, the CPU
tests), where two operations differ from the compiled kernel and are replaced, as constexprs: the
interpreter's e4m3 cast does not round to nearest even (``SOFTWARE_ROUNDING``: the kernel rounds onto
e4m3's grid in fp32 first, so the cast is exact), and its bf16 dot multiplies raw bits (the
rotation's dot takes fp32 operands there, products exact either way). ``quantise_for_kernel`` on CPU
tensors outside the interpreter uses the torch reference: the FP8 rungs never run on a CPU, so that
path only feeds the CPU tests of the emulation.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

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
from common.contract.registry import KernelBinary, Runner

ROTATION_METHODS = ("tensor_core", "butterfly")
# Measured on the GPU by bench/fp8_quantiser.py; until then the tensor-core product, the reference's own form.
DEFAULT_ROTATION_METHOD = "tensor_core"
INPUT_DTYPES = (torch.float16, torch.bfloat16)
# Device constants (a kernel reads module globals only as constexprs).
SATURATION = tl.constexpr(E4M3_MAX)
# e4m3's smallest normal is 2^-6; below it the grid is uniform with step 2^-9.
E4M3_MIN_NORMAL = tl.constexpr(2.0**-6)
E4M3_SUBNORMAL_STEP = tl.constexpr(2.0**-9)
# Elements per thread of a program's tile: 64 fp32 values keep the tile, the rotation and the cast in registers.
ELEMENTS_PER_THREAD = 64
MAX_WARPS = 16
# Registers per thread: without a cap ptxas takes every register the launch bound allows (255 at 4 warps),
# leaving one or two CTAs per SM for a kernel that needs bytes in flight; 96 compile without spills at
# 64 elements per thread (D = 64, 128, 256; 64 fails to compile).
MAX_REGISTERS = 96
# The per-tensor amax reduction: one program per tensor reads its block amaxes in chunks.
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


# ----------------------------------------------------------------------------------------------------
# Device code
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _hadamard_butterflies(x, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, LOG2_HEAD_DIM: tl.constexpr):
    """x (ROWS, D) fp32 times Sylvester's Hadamard matrix H (entries ±1): log2(D) stages, each
    y[i] = x[2i] + x[2i+1], y[i + D/2] = x[2i] - x[2i+1] (constant geometry: the same reshape every stage)."""
    for _ in tl.static_range(LOG2_HEAD_DIM):
        even, odd = tl.split(tl.reshape(x, (ROWS, HEAD_DIM // 2, 2)))
        x = tl.reshape(tl.permute(tl.join(even + odd, even - odd), (0, 2, 1)), (ROWS, HEAD_DIM))
    return x


@triton.jit
def _rotated(x, ROTATION, rotation_scale, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, LOG2_HEAD_DIM: tl.constexpr,
             ROTATE: tl.constexpr, FP32_DOT: tl.constexpr):  # fmt: skip
    """x (ROWS, D) times random_hadamard(D, seed) in fp32 (module docstring, step 2)."""
    offs_d = tl.arange(0, HEAD_DIM)
    if ROTATE == ROTATE_TENSOR_CORE:
        # ROTATION: the (D, D) sign matrix (fp32 for FP32_DOT, else x's type); x · ±1 is exact, sums in fp32.
        signs = tl.load(ROTATION + offs_d[:, None] * HEAD_DIM + offs_d[None, :])
        product = tl.dot(x.to(tl.float32), signs, input_precision="ieee") if FP32_DOT else tl.dot(x, signs)
        return product * rotation_scale
    # ROTATION: the matrix's first row (the Hadamard's first row is all ones: column sign x c).
    column_factors = tl.load(ROTATION + offs_d)
    return _hadamard_butterflies(x.to(tl.float32), ROWS, HEAD_DIM, LOG2_HEAD_DIM) * column_factors[None, :]


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
def _tile_rows(m_block, BLOCK_ROWS: tl.constexpr, PERMUTED: tl.constexpr):
    """Row index of each tile row: the block's rows in order, or (PERMUTED) slot r holding key
    PERMUTED_KEY_ORDER[r % 16] of its group of 16 (a closed form of the table, checked by the tests)."""
    slots = tl.arange(0, BLOCK_ROWS)
    if PERMUTED:
        within = slots % 16
        slots = slots - within + 8 * ((within % 4) // 2) + 2 * (within // 4) + within % 2
    return m_block * BLOCK_ROWS + slots


@triton.jit
def _quantise_kernel(
    X, OUT, SCALES, BLOCK_AMAX, TENSOR_AMAX, ROTATION, rotation_scale,
    heads, seqlen, out_keys, scale_blocks, stride_xb, stride_xh, stride_xs, stride_xd,
    BLOCK_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, LOG2_HEAD_DIM: tl.constexpr, STEP: tl.constexpr,
    ROTATE: tl.constexpr, FP32_DOT: tl.constexpr, TRANSPOSED: tl.constexpr, PERMUTED: tl.constexpr,
    SOFTWARE_ROUNDING: tl.constexpr,
):  # fmt: skip
    """One block of BLOCK_ROWS rows of one (batch, head): the module docstring's steps 1-5."""
    m_block = tl.program_id(0)
    batch_head = tl.program_id(1).to(tl.int64)
    batch, head = batch_head // heads, batch_head % heads
    offs_d = tl.arange(0, HEAD_DIM)

    # ---- 1. load (V for a permuted layout in slot order)
    rows = _tile_rows(m_block, BLOCK_ROWS, PERMUTED)
    x_ptrs = X + batch * stride_xb + head * stride_xh + rows[:, None] * stride_xs + offs_d[None, :] * stride_xd
    x = tl.load(x_ptrs, mask=rows[:, None] < seqlen, other=0.0)

    # ---- 2. rotation
    if ROTATE != ROTATE_NONE:
        x = _rotated(x, ROTATION, rotation_scale, BLOCK_ROWS, HEAD_DIM, LOG2_HEAD_DIM, ROTATE, FP32_DOT)
    x = x.to(tl.float32)

    # ---- 3. amax and scale
    scale_index = batch_head * scale_blocks + m_block
    has_scale = m_block < scale_blocks
    amax = tl.load(TENSOR_AMAX) if STEP == STEP_CAST else tl.max(tl.max(tl.abs(x), axis=1), axis=0)
    if STEP == STEP_AMAX:
        tl.store(BLOCK_AMAX + scale_index, amax, mask=has_scale)
        return
    scale = tl.where(amax > 0, tl.math.div_rn(amax, tl.full((), SATURATION, tl.float32)), 1.0)
    tl.store(SCALES + scale_index, scale, mask=has_scale)

    # ---- 4. scale, saturate, round to e4m3
    y = tl.clamp(tl.math.div_rn(x, tl.broadcast_to(scale, x.shape)), -SATURATION, SATURATION)
    if SOFTWARE_ROUNDING:
        y = _round_to_e4m3_grid(y)
    y8 = y.to(tl.float8e4nv)

    # ---- 5. store: rows, or Vᵀ with its keys (slots) contiguous
    if TRANSPOSED:
        slots = m_block * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        out_ptrs = OUT + (batch_head * HEAD_DIM + offs_d[:, None]) * out_keys + slots[None, :]
        tl.store(out_ptrs, tl.trans(y8), mask=slots[None, :] < out_keys)
    else:
        out_ptrs = OUT + (batch_head * seqlen + rows[:, None]) * HEAD_DIM + offs_d[None, :]
        tl.store(out_ptrs, y8, mask=rows[:, None] < seqlen)


@triton.jit
def _tensor_amax_kernel(BLOCK_AMAX, TENSOR_AMAX, q_blocks, k_blocks, v_blocks, CHUNK: tl.constexpr):
    """Per-tensor scales: program t reduces tensor t's block amaxes (stored back to back) to one."""
    tensor = tl.program_id(0)
    start = tl.where(tensor == 0, 0, tl.where(tensor == 1, q_blocks, q_blocks + k_blocks))
    count = tl.where(tensor == 0, q_blocks, tl.where(tensor == 1, k_blocks, v_blocks))
    running = tl.zeros((CHUNK,), dtype=tl.float32)
    for first in range(0, count, CHUNK):
        offs = first + tl.arange(0, CHUNK)
        running = tl.maximum(running, tl.load(BLOCK_AMAX + start + offs, mask=offs < count, other=0.0))
    tl.store(TENSOR_AMAX + tensor, tl.max(running, axis=0))


# ----------------------------------------------------------------------------------------------------
# Host
# ----------------------------------------------------------------------------------------------------
@functools.cache
def _rotation_operand(
    head_dim: int, seed: int, method: str, dot_dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, float]:
    """What ``_rotated`` reads for random_hadamard(head_dim, seed): (sign matrix in ``dot_dtype``, c)
    for the tensor cores, (first row, unused 1.0) for the butterflies. Built once per key, like the
    matrix itself (the host reads c once, here)."""
    matrix = random_hadamard(head_dim, seed, device)
    if method == "tensor_core":
        magnitude = matrix[0, 0].abs().item()
        return torch.sign(matrix).to(dot_dtype).contiguous(), magnitude
    return matrix[0].contiguous(), 1.0


def _is_power_of_two(value: int) -> bool:
    return value >= 1 and not value & (value - 1)


def _check_quantisation(quantisation: Quantisation, value_layout: ValueLayout, head_dim: int) -> None:
    for name, value in (("head_dim", head_dim), ("q_block_rows", quantisation.q_block_rows),
                        ("kv_block_rows", quantisation.kv_block_rows)):  # fmt: skip
        if not _is_power_of_two(value):
            raise ValueError(f"the fused fp8 quantiser needs a power-of-two {name}, got {value}")
    if value_layout.permuted and quantisation.kv_block_rows % KEY_GROUP:
        raise ValueError(
            f"a permuted V layout needs kv_block_rows that are whole groups of {KEY_GROUP} keys, "
            f"got {quantisation.kv_block_rows}"
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


def _num_warps(block_rows: int, head_dim: int) -> int:
    """Warps for a (block_rows, D) tile at ELEMENTS_PER_THREAD fp32 values per thread (4 to MAX_WARPS)."""
    return max(4, min(MAX_WARPS, block_rows * head_dim // (32 * ELEMENTS_PER_THREAD)))


@dataclass(frozen=True)
class _TensorKind:
    """What the generated code of one tensor's launches depends on (beyond the head dim and dtype)."""

    name: str
    block_rows: int
    rotate: int
    transposed: bool
    permuted: bool

    def constexprs(self, head_dim: int, interpreted: bool) -> dict:
        """``_quantise_kernel``'s constexprs and launch options, all but STEP. The interpreter's
        rotation dot takes fp32 operands and its cast gets values already on e4m3's grid (module docstring)."""
        return {
            "BLOCK_ROWS": self.block_rows, "HEAD_DIM": head_dim, "LOG2_HEAD_DIM": int(math.log2(head_dim)),
            "ROTATE": self.rotate, "FP32_DOT": interpreted, "TRANSPOSED": self.transposed, "PERMUTED": self.permuted,
            "SOFTWARE_ROUNDING": interpreted, "num_warps": _num_warps(self.block_rows, head_dim),
            "maxnreg": MAX_REGISTERS,
        }  # fmt: skip


def _tensor_kinds(
    quantisation: Quantisation, value_layout: ValueLayout, rotation_method: str
) -> tuple[_TensorKind, ...]:
    """Q and K in rows, rotated if asked; V transposed in its layout, never rotated."""
    rotate = ROTATE_NONE.value
    if quantisation.rotation:
        rotate = (ROTATE_TENSOR_CORE if rotation_method == "tensor_core" else ROTATE_BUTTERFLY).value
    q_rows, kv_rows = quantisation.q_block_rows, quantisation.kv_block_rows
    return (
        _TensorKind("q", q_rows, rotate, transposed=False, permuted=False),
        _TensorKind("k", kv_rows, rotate, transposed=False, permuted=False),
        _TensorKind("v", kv_rows, ROTATE_NONE.value, transposed=True, permuted=value_layout.permuted),
    )


def _steps(quantisation: Quantisation) -> tuple[int, ...]:
    return (STEP_BLOCK.value,) if quantisation.block else (STEP_AMAX.value, STEP_CAST.value)


@dataclass(frozen=True)
class _TensorPlan:
    """One tensor's launches: its output and scales, its slice of the per-tensor amax buffers, the
    rows its grid covers (V: the padded keys) and the constexprs."""

    out: torch.Tensor
    scales: torch.Tensor
    block_amax: torch.Tensor
    tensor_amax: torch.Tensor
    out_keys: int
    grid: tuple[int, int]
    constexprs: dict


class FusedQuantiser:
    """The fused quantiser for one signature: outputs and scales allocated once; each call quantises
    new q, k, v of that signature into them and returns them as ``KernelOperands`` (the same buffers
    every call, as the registry's run() returns the same O).

    ``q_shape`` (B, H, Sq, D), ``kv_shape`` (B, Hkv, Sk, D); ``dtype`` fp16 or bf16; ``device`` CUDA,
    or CPU under the Triton interpreter. ``rotation_method``: one of ``ROTATION_METHODS``, by default
    ``DEFAULT_ROTATION_METHOD`` as it reads when the quantiser is built (the rungs and their
    emulations take it from there, so bench/fp8_quantiser.py can time both methods through them).
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
    ):
        rotation_method = rotation_method or DEFAULT_ROTATION_METHOD
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.q_shape, self.kv_shape, self.dtype, self.device = tuple(q_shape), tuple(kv_shape), dtype, device
        self.quantisation, self.rotation_method = quantisation, rotation_method
        _check_signature(self.q_shape, self.kv_shape, dtype, device, rotation_method)
        batch, heads, seqlen_q, head_dim = self.q_shape
        _, kv_heads, seqlen_k, _ = self.kv_shape
        _check_quantisation(quantisation, value_layout, head_dim)
        padded_keys = value_layout.padded_keys(seqlen_k)
        interpreted = device.type == "cpu"
        # Per tensor: output shape, heads, rows the scales cover, rows the grid covers (V: padded keys).
        shapes = (
            (self.q_shape, heads, seqlen_q, seqlen_q),
            (self.kv_shape, kv_heads, seqlen_k, seqlen_k),
            ((batch, kv_heads, head_dim, padded_keys), kv_heads, seqlen_k, padded_keys),
        )
        kinds = _tensor_kinds(quantisation, value_layout, rotation_method)
        scales = [
            torch.empty((batch, tensor_heads, -(-rows // kind.block_rows)), dtype=torch.float32, device=device)
            for kind, (_, tensor_heads, rows, _) in zip(kinds, shapes, strict=True)
        ]
        self._scale_counts = [tensor.numel() for tensor in scales]
        # Per-tensor scales: every block's amax (Q's, K's, V's back to back), then each tensor's.
        self._block_amax = torch.empty(sum(self._scale_counts), dtype=torch.float32, device=device)
        self._tensor_amax = torch.empty(len(kinds), dtype=torch.float32, device=device)
        offsets = [sum(self._scale_counts[:index]) for index in range(len(kinds))]
        self._plans = tuple(
            _TensorPlan(
                out=torch.empty(shape, dtype=torch.float8_e4m3fn, device=device),
                scales=scale,
                block_amax=self._block_amax[offset:],
                tensor_amax=self._tensor_amax[index:],
                out_keys=padded_keys if kind.transposed else 0,
                grid=(-(-grid_rows // kind.block_rows), batch * tensor_heads),
                constexprs=kind.constexprs(head_dim, interpreted),
            )
            for index, (kind, (shape, tensor_heads, _, grid_rows), scale, offset) in enumerate(
                zip(kinds, shapes, scales, offsets, strict=True)
            )
        )
        self._rotation = (
            _rotation_operand(
                head_dim, quantisation.seed, rotation_method, torch.float32 if interpreted else dtype, device
            )
            if quantisation.rotation
            else (self._tensor_amax, 1.0)  # a placeholder pointer, never read
        )
        self.operands = KernelOperands(
            *(plan.out for plan in self._plans), *(plan.scales for plan in self._plans), quantisation, value_layout
        )

    def _check_inputs(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        for name, tensor, shape in (("q", q, self.q_shape), ("k", k, self.kv_shape), ("v", v, self.kv_shape)):
            if tuple(tensor.shape) != shape or tensor.dtype != self.dtype or tensor.device != self.device:
                raise ValueError(
                    f"{name}: expected {shape} {self.dtype} on {self.device} (this quantiser's signature), "
                    f"got {tuple(tensor.shape)} {tensor.dtype} on {tensor.device}"
                )

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> KernelOperands:
        """Quantise q, k, v into this quantiser's buffers: 3 launches with block scales, 7 per tensor."""
        self._check_inputs(q, k, v)
        inputs = tuple(zip(self._plans, (q, k, v), strict=True))
        if self.quantisation.block:
            for plan, x in inputs:
                self._launch(plan, x, STEP_BLOCK.value)
            return self.operands
        for plan, x in inputs:
            self._launch(plan, x, STEP_AMAX.value)
        _tensor_amax_kernel[(len(inputs),)](
            self._block_amax, self._tensor_amax, *self._scale_counts, CHUNK=AMAX_CHUNK, num_warps=AMAX_WARPS
        )
        for plan, x in inputs:
            self._launch(plan, x, STEP_CAST.value)
        return self.operands

    def _launch(self, plan: _TensorPlan, x: torch.Tensor, step: int) -> None:
        rotation, rotation_scale = self._rotation
        _quantise_kernel[plan.grid](
            x, plan.out, plan.scales, plan.block_amax, plan.tensor_amax, rotation, rotation_scale,
            x.shape[1], x.shape[2], plan.out_keys, plan.scales.shape[-1], *x.stride(), STEP=step, **plan.constexprs,
        )  # fmt: skip


def compile_sm90(
    head_dim: int,
    dtype: torch.dtype,
    quantisation: Quantisation,
    value_layout: ValueLayout,
    rotation_method: str = DEFAULT_ROTATION_METHOD,
) -> list[KernelBinary]:
    """Every kernel a ``FusedQuantiser`` of this kind launches, compiled for sm_90a (no GPU needed):
    one per tensor and step, and the per-tensor amax reduction."""
    from common.reporting.static import compile_triton_sm90

    _check_quantisation(quantisation, value_layout, head_dim)
    element = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    binaries = []
    for kind in _tensor_kinds(quantisation, value_layout, rotation_method):
        rotation_type = element if kind.rotate == ROTATE_TENSOR_CORE.value else "fp32"
        signature = {
            "X": f"*{element}", "OUT": "*fp8e4nv", "SCALES": "*fp32", "BLOCK_AMAX": "*fp32", "TENSOR_AMAX": "*fp32",
            "ROTATION": f"*{rotation_type}", "rotation_scale": "fp32", "heads": "i32", "seqlen": "i32",
            "out_keys": "i32", "scale_blocks": "i32", "stride_xb": "i32", "stride_xh": "i32", "stride_xs": "i32",
            "stride_xd": "i32",
        }  # fmt: skip
        constexprs = kind.constexprs(head_dim, interpreted=False)
        options = {name: constexprs.pop(name) for name in ("num_warps", "maxnreg")}
        for step in _steps(quantisation):
            binaries.append(
                compile_triton_sm90(_quantise_kernel, signature, {**constexprs, "STEP": step}, options=options)
            )
    if not quantisation.block:
        signature = {"BLOCK_AMAX": "*fp32", "TENSOR_AMAX": "*fp32", "q_blocks": "i32", "k_blocks": "i32",
                     "v_blocks": "i32"}  # fmt: skip
        binaries.append(
            compile_triton_sm90(
                _tensor_amax_kernel, signature, {"CHUNK": AMAX_CHUNK}, options={"num_warps": AMAX_WARPS}
            )
        )
    return binaries


def quantise_fused(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    quantisation: Quantisation,
    value_layout: ValueLayout,
    rotation_method: str | None = None,
) -> KernelOperands:
    """One fused quantisation of q, k, v into fresh buffers (a ``FusedQuantiser`` used once)."""
    quantiser = FusedQuantiser(q.shape, k.shape, q.dtype, q.device, quantisation, value_layout, rotation_method)
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
