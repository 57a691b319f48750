"""Rung 6, FP8 attention in Triton: e4m3 operands on the Hopper kernel (counterpart: ``cute_impl/fp8.py``).

What it adds over ``hopper``: both GEMMs read e4m3 operands, which doubles the tensor-core rate
(dense fp8 wgmma runs at twice the bf16 rate on sm_90) and halves the bytes every TMA copy and
shared-memory stage moves, so deeper pipelines fit. The price is accuracy: e4m3 keeps 3 mantissa
bits, so the result is judged against an fp64 emulation of this rung's own quantisation (``emulate``,
``FP8_RULE``: the same e4m3 operands and scales, P rounded as this kernel rounds it, key blocks
visited first to last) instead of SDPA's error.

What Triton decides for you that ``cute_impl/fp8.py`` writes by hand: the fp8 wgmma shapes and the
register layout of P for the second GEMM; here, as there, the operand layouts are our choice. fp8
``wgmma`` reads both shared-memory operands K-major only, so V is stored transposed (Vᵀ, keys
contiguous): for O += P V the reduction runs over keys, and a (D, Sk) tile is K-major. Without it
Triton would insert a shared-memory transpose of every V tile.

The kernel is ``hopper``'s with one block step replaced: ``_fp8_attention_kernel`` uses hopper's
``tile_coordinates``, ``kv_loop`` and ``store_tile`` (``triton_impl/hopper.py``) and adds what is
fp8's own: the scale pointers of its tile, Q's descale in the prologue, ``fp8_attention_step`` as the
loop's ``STEP`` and the last block's P V in the epilogue. The rest of this file is quantisation,
configurations and launch.

Algorithm (steps 1-4 are the sections of the kernel):
  0. In ``bind`` (per call, since the values change; ``prepare`` = validate + bind + warm-up): the
     fused quantiser shared by the three FP8 rungs (``triton_impl.fp8_quantiser``, one launch with block scales,
     the values of ``common.contract.fp8.quantise``): optionally Q and K rotated by a seeded
     random Hadamard matrix, then scales s = amax / 448 per tensor or, with block quantisation, per
     64 rows of Q (one CTA's BLOCK_M) and per 128 rows of K and of V (a BLOCK_N key block or two),
     per (batch, head) of Q and per (batch, KV head) of K and V (GQA: K and V are quantised as
     given, and the kernel indexes their scales by KV head). ``DEFAULT_QUANTISATION`` (block
     scales and rotation) is what compare.py runs; ``quantisation=`` selects the others. Vᵀ
     written by the quantiser in key order (``VALUE_LAYOUT``), its rows padded to a 16-element
     multiple of Sk so that they are 16-byte aligned for TMA. ``prepare_end_to_end``'s run() is the
     quantiser and the kernel, the per-call cost of a user holding bf16 activations.
  1. Load the Q8 tile by TMA; fold its block's s_q (per tensor: s_q · s_k) into the softmax scale.
  2. Unmasked KV blocks: S = Q8 K8ᵀ (fp8 wgmma), the block's s_k joined to the softmax scale (a
     positive factor commutes with the row max, so row_max keeps one unit for every block; no cost
     per score), online softmax with exp2, and P computed as exp2(S·scale - row_max + P_EXPONENT)
     (``common.contract.fp8.P_EXPONENT`` = 8): the 2^8 headroom lifts P from [0, 1] to
     [0, 256], where e4m3 keeps full precision (its normals start at 2^-6), and cancels exactly
     because row_sum is accumulated from the same scaled P. Then O = (O + pv · s_v) · alpha adds the
     previous block's P V times its V scale, and pv = P8 V8 (fp8 wgmma, Vᵀ tile read K-major) starts
     from zero. The block scales are scalar loads that Triton prefetches with cp.async.
  3. Masked blocks (causal diagonal in either alignment, the sequence's ragged last block): the same
     with -inf masking and the guard for rows with no visible key, as in ``hopper`` (GQA, alignment
     and ``cache_seqlens`` come from the shared ``kv_head_index`` and ``seqlen_info``).
  4. O = acc / row_sum (per tensor: acc · s_v / row_sum) in bf16 by a TMA store; with
     ``return_lse``, lse = (row_max + log2(row_sum) - P_EXPONENT) · ln 2 (-inf where a row sees no key).

Data movement: as in ``hopper`` (4-D TMA descriptors, per-(batch, head) bounds, ``wgmma`` from
shared memory), with e4m3 tiles: a BLOCK_N × D K tile and a D × BLOCK_N Vᵀ tile per stage.

Constraints: fp16 or bf16 inputs, bf16 output; D ∈ {64, 128} (at D=256 the fused quantiser's tiles
and rotation matrix need more shared memory than an sm_90 CTA has: ``supports`` refuses it, naming the
bytes); any Sq, Sk ≥ 1; GQA/MQA; causal
aligned top-left or bottom-right, or not; ``cache_seqlens``; ``return_lse``; softmax_scale ≥ 0; sm_90.
Block scales need BLOCK_M | 64 and BLOCK_N | 128. The emulation (``emulate``) follows the same
conventions (KV head, mask, key lengths) and also gives the LSE of the quantised scores with a
bound; an fp8 LSE is judged against it (``common.contract.check.check_on_inputs``), since e4m3
scores are not accurate to the fp64 LSE's bf16-level rule.

What block quantisation and the rotation buy: on FlashAttention-3's outlier inputs a per-tensor
scale is set by the largest outlier and ordinary entries lose bits; block scales confine that to
the blocks holding an outlier, and the rotation spreads each outlier of Q and K over all D channels
before rounding. FA3's outliers sit in single channels, so the rotation does almost all of the
gain and block scales add little on top of it. ``results/h200/fp8_error.md`` (``python -m
common.tools.fp8_error``) has each variant's RMSE, its emulation's and FA3's; ``results/h200/fp8_speed.md``
the speed, kernel only and end to end.

What the measurements taught (the A/B runs are in ``docs/perf-log.md``, "Figures moved out of rung
docstrings"; current figures in the generated table of ``docs/ladder.md``):
  * fp8 wgmma's accumulation is not full fp32: chaining P V through the accumulator lets the error
    grow with the number of key blocks, so each block's P V gets a fresh accumulator, added in fp32.
  * Adding it one step late lets that wgmma retire with the next S = Q Kᵀ instead of being waited
    for at once.
  * One warpgroup per CTA (64 × 128 tiles, 4 warps, 3 stages) beats 128 × 128 with 8 warps: two
    independent CTAs share an SM and drift apart, so one's softmax runs under the other's wgmmas,
    the overlap that the 8-warp CTA, whose two warpgroups Triton keeps in lockstep, never gets.
  * The hand-pipelined loop of ``hopper.py`` needs the accumulator chained through the fp8 wgmma
    and fails the error rule, so this rung refuses ``HopperKernelConfig.overlap``; a separate pv in that
    loop needs S, P, O and pv live at once and spills.
  * Block scales and rotation: ``results/h200/fp8_speed.md`` and ``docs/perf-log.md``.
On zero-mean (standard-normal) values the e4m3 rounding of Q, K, V and P alone gives ≈ 5% relative
L2 against fp64: the emulation sets that floor, and the rule asks the kernel to match it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from common.contract import fp8 as fp8_quantisation
from common.contract.devices import triton_device_supported, triton_interpreting
from common.contract.fp8 import KernelOperands, KernelOrder, Quantisation, ValueLayout
from common.contract.problem import Problem
from common.contract.registry import Implementation
from common.toolchain.compile import KernelBinary
from common.toolchain.releases import release_configs
from triton_impl._device import online_softmax_finalize, online_softmax_rescale
from triton_impl._host import TritonInputs, allocate_lse, feature_buffers, rung_result
from triton_impl.fp8_launch import Fp8Entry, QuantisedLaunch
from triton_impl.fp8_quantiser import FusedQuantiser, compile_sm90_for, shared_memory_supported
from triton_impl.hopper import (
    HEAD_DIMS,
    SCALAR_SIGNATURE,
    HopperKernelConfig,
    block_softmax,
    compile_kernel_sm90,
    descriptor,
    hopper_supported,
    kernel_fits,
    kernel_sizes,
    kv_loop,
    non_negative_scale,
    store_tile,
    tile_constexprs,
    tile_coordinates,
)

# FP8: P = 2^(S·scale - row_max + P_EXPONENT) lies in [0, 2^8], clear of e4m3's subnormals
# (common/contract/fp8.py, shared with the other fp8 rungs and the emulation).
P_EXPONENT = tl.constexpr(fp8_quantisation.P_EXPONENT)
# Inputs this rung quantises (whatever the interpreter would accept).
INPUT_DTYPES = (torch.float16, torch.bfloat16)
# TMA needs 16-byte row strides: the keys of Vᵀ are padded to this many e4m3 elements. The kernel
# reads V in key order (Triton arranges P's registers for the second GEMM itself).
VT_ROW_ALIGN = 16
VALUE_LAYOUT = ValueLayout(permuted=False, key_multiple=VT_ROW_ALIGN)
# No warp-specialised candidates: this is hopper's kernel, whose warp-specialised loop
# ``check_launchable`` refuses on a GPU (it left query rows unwritten).
FP8_CANDIDATES = tuple(
    HopperKernelConfig(block_m, block_n, num_warps, num_stages)
    for block_m, block_n, num_warps in ((64, 128, 4), (128, 128, 8), (128, 64, 8))
    for num_stages in (2, 3, 4)
)
# One warpgroup per CTA and two CTAs per SM (e4m3 tiles leave room for both in shared memory):
# the two CTAs run independently, so one's softmax overlaps the other's wgmmas (measured below).
# D=256 takes 8 warps: with 4, the fresh P V accumulator next to O needs 2 × 128 fp32 registers per
# thread and spills (~350 B on Triton 3.6 and 3.9). Chosen under Triton 3.6; ``release_configs``
# applies another release's spill-free replacements.
DEFAULT_CONFIGS = release_configs(
    "triton/fp8",
    {
        64: HopperKernelConfig(64, 128, 4, 3),
        128: HopperKernelConfig(64, 128, 4, 3),
        256: HopperKernelConfig(64, 64, 8, 2),
    },
)
INTERPRETER_CONFIG = HopperKernelConfig(64, 32, 4, 1)
# What compare.py and the tests run: the most accurate variant whose kernel is within 5 % of the
# per-tensor kernel's speed in every stack (issue #17): block scales + rotation, the most accurate on
# FA3's inputs, cost at most 4 % (results/h200/fp8_speed.md; docs/perf-log.md).
DEFAULT_QUANTISATION = Quantisation(block=True, rotation=True)


def default_config(head_dim: int) -> HopperKernelConfig:
    return INTERPRETER_CONFIG if triton_interpreting() else DEFAULT_CONFIGS[head_dim]


def candidate_configs(head_dim: int) -> list[HopperKernelConfig]:
    """The fp8 candidates whose one-byte tiles fit the shared-memory budget at this head dim."""
    return [config for config in FP8_CANDIDATES if config.fits(head_dim, element_bytes=1)]


# ----------------------------------------------------------------------------------------------
# Kernel: hopper's pieces (``tile_coordinates``, ``kv_loop``, ``store_tile``) around fp8's block step
# ----------------------------------------------------------------------------------------------
@triton.jit
def fp8_attention_step(
    state, q, kv, coords, n_block, softmax_scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """One KV block of steps 2 and 3 (``kv_loop``'s ``STEP``), what fp8 changes in hopper's
    ``attention_step``. ``state`` = (acc, pv, pv_scale, row_sum, row_max), ``kv`` = (desc_k, desc_v,
    K_SCALE, V_SCALE, BLOCK_SCALED, KV_QUANT_BLOCK).

    The block's K scale joins the softmax scale (positive, so the row max commutes with it), P is
    lifted by 2^P_EXPONENT, and P V goes into a fresh fp32 accumulator ``pv`` that the next step
    adds to O times its V scale ``pv_scale``: fp8 wgmma accumulates with reduced precision, so
    chaining O through it over thousands of keys would lose accuracy, and adding it one step late
    lets that wgmma retire with the next S = Q Kᵀ instead of being waited for at once.
    """
    acc, pv, pv_scale, row_sum, row_max = state
    desc_k, desc_v, K_SCALE, V_SCALE, BLOCK_SCALED, KV_QUANT_BLOCK = kv
    batch, kv_head = coords[0], coords[1]
    start_n = n_block * BLOCK_N
    k = desc_k.load([batch, kv_head, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    S = tl.dot(q, k.T)
    if BLOCK_SCALED:
        softmax_scale_log2 = softmax_scale_log2 * tl.load(K_SCALE + start_n // KV_QUANT_BLOCK)
        v_scale = tl.load(V_SCALE + start_n // KV_QUANT_BLOCK)
    else:
        v_scale = pv_scale
    P, alpha, row_max, row_sum = block_softmax(
        S, row_max, row_sum, coords, start_n, softmax_scale_log2, BLOCK_N, MASKED, CAUSAL, P_EXPONENT
    )
    # desc_v holds Vᵀ (B, Hkv, D, Sk): fp8 wgmma reads its shared-memory B operand K-major only.
    vt = desc_v.load([batch, kv_head, 0, start_n]).reshape(HEAD_DIM, BLOCK_N)
    acc = online_softmax_rescale(acc + pv * pv_scale if BLOCK_SCALED else acc + pv, alpha)
    pv = tl.dot(P.to(vt.dtype), vt.T)
    return acc, pv, v_scale, row_sum, row_max


@triton.jit
def _fp8_attention_kernel(
    desc_q, desc_k, desc_v, desc_o, LSE, CacheSeqlens, Q_SCALE, K_SCALE, V_SCALE,
    heads, kv_heads, seqlen_q, seqlen_k, q_blocks, kv_blocks, softmax_scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, HAS_CACHE_SEQLENS: tl.constexpr, RETURN_LSE: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    BLOCK_SCALED: tl.constexpr, Q_QUANT_BLOCK: tl.constexpr, KV_QUANT_BLOCK: tl.constexpr,
):  # fmt: skip
    m_block, batch_head, head, start_m, coords = tile_coordinates(
        CacheSeqlens, heads, kv_heads, seqlen_q, seqlen_k, BLOCK_M, CAUSAL, BOTTOM_RIGHT, HAS_CACHE_SEQLENS
    )
    batch, kv_head = coords[0], coords[1]
    # This tile's block scales: Q's (B, H, blocks), K's and V's (B, Hkv, blocks), fp32, contiguous.
    Q_SCALE += batch_head * q_blocks
    K_SCALE += (batch * kv_heads + kv_head) * kv_blocks
    V_SCALE += (batch * kv_heads + kv_head) * kv_blocks

    # 1. Q8 tile, loaded once; rows past Sq read as zeros. Its descale (per tensor: s_q · s_k) folds
    # into the softmax scale.
    q = desc_q.load([batch, head, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
    if BLOCK_SCALED:
        softmax_scale_log2 = softmax_scale_log2 * tl.load(Q_SCALE + start_m // Q_QUANT_BLOCK)
    else:
        softmax_scale_log2 = softmax_scale_log2 * tl.load(Q_SCALE) * tl.load(K_SCALE)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # The last block's P V and its V scale, in flight until the next step adds them.
    pv = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    pv_scale = tl.load(V_SCALE)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    state = (acc, pv, pv_scale, row_sum, row_max)
    kv = (desc_k, desc_v, K_SCALE, V_SCALE, BLOCK_SCALED, KV_QUANT_BLOCK)

    # 2+3. The key blocks, fp8's step in hopper's loop.
    acc, pv, pv_scale, row_sum, row_max = kv_loop(
        fp8_attention_step, state, q, kv, coords, m_block, softmax_scale_log2,
        HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, WARP_SPECIALIZE,
    )  # fmt: skip

    # 4. Add the last block's P V; a per-tensor V scale multiplies O once, here; the 2^P_EXPONENT
    # headroom cancels in O and is taken out of the lse. A row that saw no key writes 0 and -inf.
    acc = acc + pv * pv_scale if BLOCK_SCALED else acc + pv
    out, lse = online_softmax_finalize(acc, row_max, row_sum, 1.0 if BLOCK_SCALED else pv_scale, P_EXPONENT)
    store_tile(desc_o, LSE, out, lse, coords, batch_head, head, start_m, seqlen_q, BLOCK_M, HEAD_DIM, RETURN_LSE)


# ----------------------------------------------------------------------------------------------
# Host: quantise (triton_impl.fp8_quantiser), build descriptors, launch
# ----------------------------------------------------------------------------------------------
def kernel_constexprs(problem: Problem, config: HopperKernelConfig, quantisation: Quantisation) -> dict[str, object]:
    """The kernel's compile-time arguments: hopper's ``tile_constexprs`` and the quantisation's scales."""
    return {
        **tile_constexprs(problem, config),
        "BLOCK_SCALED": quantisation.block,
        "Q_QUANT_BLOCK": quantisation.q_block_rows,
        "KV_QUANT_BLOCK": quantisation.kv_block_rows,
    }


def check_quantisation_blocks(quantisation: Quantisation, config: HopperKernelConfig) -> None:
    """Block scales are scalars per tile only if each tile lies inside one quantisation block."""
    if quantisation.block and (
        quantisation.q_block_rows % config.block_m or quantisation.kv_block_rows % config.block_n
    ):
        raise ValueError(
            f"block quantisation of {quantisation.q_block_rows} Q rows / {quantisation.kv_block_rows} K/V rows "
            f"needs tiles that divide them, got BLOCK_M={config.block_m}, BLOCK_N={config.block_n}"
        )


class Fp8Attention:
    """Prepared launch over quantised operands (buffers the fused quantiser writes); calling it
    launches the kernel and returns O (bf16)."""

    def __init__(
        self, operands: KernelOperands, problem: Problem, config: HopperKernelConfig,
        cache_seqlens: torch.Tensor | None = None,
    ):  # fmt: skip
        batch, heads, seqlen_q, head_dim = operands.q8.shape
        if config.overlap:
            raise ValueError(
                "fp8 attention has no overlapped KV loop (HopperKernelConfig.overlap=True): it would chain the "
                "accumulator through fp8 wgmma, whose reduced-precision accumulation fails the error target"
            )
        quantisation = operands.quantisation
        check_quantisation_blocks(quantisation, config)
        self.config = config
        self.variant = quantisation.name
        # Kept as attributes: the descriptors point into these buffers.
        self.operands = operands
        # Vᵀ as (B, Hkv, D, Sk): a view whose rows keep the padded 16-byte stride.
        self.vt8 = operands.vt8[..., : operands.seqlen_k]
        device = operands.q8.device
        self.out = torch.empty(operands.q8.shape, device=device, dtype=torch.bfloat16)
        self.lse = allocate_lse(problem, device)
        # K8, Vᵀ and the K and V scales keep the KV heads (B, Hkv, ...): the kernel indexes them by KV head.
        self._args = (
            descriptor(operands.q8, config.block_m, head_dim),
            descriptor(operands.k8, config.block_n, head_dim),
            descriptor(self.vt8, head_dim, config.block_n),
            descriptor(self.out, config.block_m, head_dim),
            *feature_buffers(self.lse, cache_seqlens, device),
            operands.q_scale,
            operands.k_scale,
            operands.v_scale,
        )
        self._kwargs = {
            **kernel_sizes(problem),
            "q_blocks": operands.q_scale.shape[-1],
            "kv_blocks": operands.k_scale.shape[-1],
            **kernel_constexprs(problem, config, quantisation),
            **config.launch_options(),
        }
        self._grid = (triton.cdiv(seqlen_q, config.block_m), batch * heads)

    def __call__(self) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        _fp8_attention_kernel[self._grid](*self._args, **self._kwargs)
        return rung_result(self.out, self.lse)


def quantiser(q: torch.Tensor, k: torch.Tensor, quantisation: Quantisation) -> FusedQuantiser:
    """The fused quantiser of this signature, writing V in this kernel's layout."""
    return FusedQuantiser(q.shape, k.shape, q.dtype, q.device, quantisation, VALUE_LAYOUT)


def launch(
    q: torch.Tensor, k: torch.Tensor, problem: Problem, quantisation: Quantisation = DEFAULT_QUANTISATION, *,
    cache_seqlens: torch.Tensor | None = None,
) -> QuantisedLaunch:  # fmt: skip
    """The fused quantiser's buffers and the kernel's descriptors over them, at the default
    configuration; nothing launched."""
    fused = quantiser(q, k, quantisation)
    kernel = Fp8Attention(fused.operands, problem, default_config(problem.head_dim), cache_seqlens)
    return QuantisedLaunch(fused, kernel)


# fp16 and bf16 inputs (quantised here), hopper's head dims and rule on the scale.
INPUTS = TritonInputs("triton/fp8", HEAD_DIMS, INPUT_DTYPES, check=non_negative_scale("triton/fp8"))


def _kernel_order(problem: Problem) -> KernelOrder:
    """Key blocks of the default configuration, visited first to last."""
    return KernelOrder(block_n=default_config(problem.head_dim).block_n, reverse=False)


def _value_layout(problem: Problem) -> ValueLayout:
    return VALUE_LAYOUT


# bind, prepare, prepare_end_to_end and emulate: the FP8 rungs' shared entry (triton_impl/fp8_launch.py).
ENTRY = Fp8Entry(INPUTS.validate, launch, _kernel_order, _value_layout, DEFAULT_QUANTISATION)
bind, prepare, prepare_end_to_end, emulate = ENTRY.bind, ENTRY.prepare, ENTRY.prepare_end_to_end, ENTRY.emulate


# ----------------------------------------------------------------------------------------------
# Capability check and static compile
# ----------------------------------------------------------------------------------------------
def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    ok, reason = triton_device_supported(device)
    if not ok:
        return ok, reason
    if problem.dtype not in INPUT_DTYPES:
        return False, f"triton/fp8 quantises fp16 or bf16 inputs, got {problem.dtype_name}"
    ok, reason = hopper_supported(problem, device, "triton/fp8", "e4m3 wgmma")
    if not ok:
        return ok, reason
    # Both launches of a call must fit: the quantiser's tiles of 16-bit inputs, then the kernel's e4m3 tiles
    # (at D=256 the quantiser's do not: issue #38).
    ok, reason = shared_memory_supported("triton/fp8", problem, DEFAULT_QUANTISATION)
    if not ok:
        return ok, reason
    return kernel_fits("triton/fp8", problem, default_config(problem.head_dim), element_bytes=1)


def compile_sm90(
    problem: Problem, config: HopperKernelConfig | None = None, quantisation: Quantisation = DEFAULT_QUANTISATION
) -> list[KernelBinary]:
    """The kernel for sm_90a at the default configuration of this head dim (no GPU needed)."""
    config = config or DEFAULT_CONFIGS[problem.head_dim]
    head_dim = problem.head_dim
    signature = {
        "desc_q": f"tensordesc<fp8e4nv[1,1,{config.block_m},{head_dim}]>",
        "desc_k": f"tensordesc<fp8e4nv[1,1,{config.block_n},{head_dim}]>",
        "desc_v": f"tensordesc<fp8e4nv[1,1,{head_dim},{config.block_n}]>",
        "desc_o": f"tensordesc<bf16[1,1,{config.block_m},{head_dim}]>",
        **SCALAR_SIGNATURE,
        "Q_SCALE": "*fp32",
        "K_SCALE": "*fp32",
        "V_SCALE": "*fp32",
        "q_blocks": "i32",
        "kv_blocks": "i32",
    }
    constexprs = kernel_constexprs(problem, config, quantisation)
    return [compile_kernel_sm90(_fp8_attention_kernel, signature, constexprs, config)]


def compile_quantiser_sm90(problem: Problem) -> list[KernelBinary]:
    """The fused quantiser this rung launches before its kernel, for sm_90a at ``problem``'s shape."""
    return compile_sm90_for(problem, DEFAULT_QUANTISATION, VALUE_LAYOUT)


IMPLEMENTATION = Implementation.named(
    "triton/fp8",
    supports=supports,
    compile_sm90=compile_sm90,
    **ENTRY.registry_fields(compile_quantiser_sm90),
    required_ptx=("cp.async.bulk.tensor", "wgmma.mma_async", "e4m3 mma"),
    # Q, K and V tiles come by TMA; the block scales (4 bytes per key block) are scalar loads that
    # Triton's pipeliner prefetches num_stages blocks ahead with cp.async, so cp.async is allowed.
    forbidden_ptx=(),
    source_file=__file__,
    default_configs=DEFAULT_CONFIGS,
    notes=f"quantisation: {DEFAULT_QUANTISATION.describe()}",
)
