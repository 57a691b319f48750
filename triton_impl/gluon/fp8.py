"""Gluon rung ``fp8``: the ``gluon/hopper`` kernel on e4m3 operands (counterparts:
``triton_impl/fp8.py``, ``cute_impl/fp8.py``).

Where the code lives: the kernel is ``gluon/hopper``'s ``attention_kernel`` (``triton_impl/gluon/hopper.py``)
with its ``FP8`` constexpr set: Gluon has no subclassing, and a second copy of the kernel would double
the code. What FP8 adds to it is this file's device section, the steps the kernel's ``if FP8:``
branches call: ``consumer_scales`` (Q's and key block 0's scales into the softmax scale),
``values_product`` and ``accumulate`` (P V into a fresh fp32 accumulator, added to O by one FFMA),
``rescale_factor`` and ``block_scale`` (the V-scale ratio carried in alpha), ``operand_p`` (P renamed
into the A-operand registers by ``scores_as_operand`` and packed to e4m3 words by ``packed_words``)
and ``P_EXPONENT`` (the lift of P that ``online_softmax_update`` / ``finalize`` take). What the flag
changes in hopper.py itself is the V ring (Vᵀ tiles, read by the load warp at column coordinates),
wgmma's k per instruction (32), O's own shared buffer, and the order of ``_pipelined_step`` (P V into
a fresh accumulator; masked blocks finish the previous P V before issuing S).

What it adds over ``gluon/hopper``: both GEMMs read e4m3 operands, which doubles the tensor-core
rate (dense fp8 wgmma runs at twice the bf16 rate on sm_90) and halves the bytes of every TMA copy
and ring slot. The warp specialisation stays as it is (one TMA load warp, two consumer warpgroups
of 64 query rows each, ``setmaxnreg`` budgets, the hand-pipelined S_n / P_(n-1) V_(n-1) overlap);
what changes is the FP8 contract that ``triton/fp8`` and ``cute/fp8`` follow too:

  * Quantisation in ``bind``, by the fused quantiser shared by the three fp8 rungs
    (``triton_impl.fp8_quantiser``: one launch with block scales, the values of ``common.contract.fp8.quantise``,
    Vᵀ written in this kernel's layout, ``value_layout``): optionally Q and K rotated by a seeded
    random Hadamard matrix, then scales amax / 448 per tensor
    or per block (64 rows of Q: one consumer warpgroup's tile; 128 rows of K and of V: two key
    blocks), per (batch, head). ``DEFAULT_QUANTISATION`` is ``triton/fp8``'s (block scales and
    rotation); ``quantisation=`` selects the other ``common.contract.fp8.VARIANTS``.
  * V stored transposed (Vᵀ, (B, H, D, Sk) with keys contiguous, rows padded to 16 keys for TMA's
    16-byte strides): fp8 wgmma reads shared-memory operands K-major only, and for O += P V the
    reduction runs over keys. The load warp copies D × BLOCK_N boxes of Vᵀ; the consumer hands
    wgmma the tile's transposed view.
  * The scales as scalars in the kernel: the consumer's Q block scale joins its softmax scale once;
    K's scale of key block n joins the scale of S_n before the row max and exp2 (a positive factor
    commutes with the max); V's scale of block n multiplies that block's P V when it is added to O.
    Per-tensor scales are the same arrays with one value, so both variants run the same code.
  * P = exp2(S · scale - row_max + P_EXPONENT) with P_EXPONENT = 8: P lies in [0, 256], where e4m3
    has full precision (its normals start at 2^-6); row_sum adds the same scaled P, so the factor
    cancels in O / row_sum, and the LSE subtracts it (``online_softmax_update`` and
    ``online_softmax_finalize`` with ``P_EXPONENT``; row_max is in log2 units of the scaled scores).
  * A fresh fp32 accumulator per key block: fp8 wgmma does not accumulate in full fp32, so chaining O
    through it loses accuracy block after block (``triton_impl/fp8.py`` measured 5.8e-2 at S = 8191).
    Step n issues S_n = Q Kᵀ_n and pv = P_(n-1) V_(n-1) from zero, runs the softmax of S_n under
    that wgmma, waits for pv and adds it into O in fp32. The accumulator holds O / s_v of the last
    block added, and the rescale factor carries s_v(n-2) / s_v(n-1) with alpha, so rescaling O and
    adding the block is one FFMA per element (``rescale_factor``, ``accumulate``), not a multiply of O
    plus a multiply-add of pv · s_v. O is not an operand of the wgmma any more, so O and pv are both
    live: 64 more fp32 registers per thread at D=128. 128-key blocks fit only because P costs no
    registers beyond S's (next point), and because masked blocks (the ragged tail, the causal
    diagonal) finish P_(n-1) V_(n-1) before they issue S_n.
  * P stays in S's registers. fp32 P is renamed into the A-operand layout (below), converted by
    inline PTX to e4m3 packed four k per 32-bit word (``packed_words``), and carried to the
    next step's wgmma as those words, written only after the previous P V has retired. Carried as
    e4m3 bytes instead, LLVM unpacked P after the softmax and packed it again before each wgmma
    (about three integer instructions per word), and writing it before that retirement made ptxas
    serialise every wgmma of the kernel.
  * Row max and row sum as trees (``row_tree``, ``_device._row_tree``): the softmax of S_n is the step's
    critical path, and Triton 3.6 reduces a thread's 32 columns of a row as one chain of 32 dependent
    FMNMX / FADD. Folding the column halves in registers (``gl.reshape`` / ``gl.permute`` /
    ``gl.split``, no data moved) leaves chains of 8. Triton 3.9 builds a tree of its own, and at D=128
    its table keeps it (``common.toolchain.releases``).

The FP8-specific mechanisms in the three stacks (what Triton decides / what Gluon makes you write /
what CuTe makes you write):
  * P as the A operand of the second GEMM. An e4m3 m64n?k32 wgmma wants each thread to hold four
    consecutive k per register, while S's accumulator gives each thread column pairs (2t, 2t+1,
    2t+8, 2t+9). Triton (``triton_impl/fp8.fp8_attention_step``: ``tl.dot(P.to(fp8), vt.T)``)
    picks the register layout and inserts the shuffles. Gluon and CuTe rename registers instead and
    read V with its keys permuted the same way inside each group of 16
    (``common.contract.fp8.PERMUTED_KEY_ORDER``, one definition for both, written so by the fused
    quantiser), so no data crosses lanes. Gluon (``scores_as_operand``) writes the
    permutation of the key index as ``gl.reshape`` / ``gl.permute`` over its four low bits; the
    layout Gluon infers for the result is the A-operand layout
    ``DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)`` up to the order of each
    thread's registers, and ``gl.convert_layout(..., assert_trivial=True)`` makes the compiler
    refuse the kernel if that ever stops being true. CuTe (``cute_impl/fp8.py``,
    ``scores_to_operand_a``) retiles the accumulator fragment as the operand fragment.
  * K-major V: the fused quantiser writes Vᵀ for all three; Triton transposes the loaded tile with ``vt.T``,
    Gluon with ``tile.permute((1, 0))`` on a shared-memory descriptor, CuTe by choosing the B
    operand's K-major shared layout.
  * The per-block accumulator: Triton's ``tl.dot`` without an accumulator plus an fp32 add; Gluon's
    ``warpgroup_mma(..., use_acc=False, is_async=True)`` and its own ``warpgroup_mma_wait``;
    CuTe's ``separate_pv`` fragment zeroed per block.

Data movement: HBM → SMEM by ``cp.async.bulk.tensor`` on 4-D descriptors (e4m3 Q: 64 × D per
consumer, K: BLOCK_N × D, Vᵀ: D × BLOCK_N; per-(batch, head) bounds give the ragged tails zeros);
SMEM → tensor cores by ``wgmma.mma_async ... e4m3.e4m3`` (P from registers); O in bf16 through a
shared buffer of its own (twice the bytes of the e4m3 Q tile it replaced in ``gluon/hopper``) and a
TMA store; the scales are fp32 scalar loads (two per key block, L1 hits).

Judged by ``FP8_RULE`` against ``common.contract.fp8.emulate`` with this kernel's order (key blocks of
the configuration's BLOCK_N first to last, the maximum moved on every increase, P rounded from fp32 to e4m3 and
the row sum of the unrounded P): the same numerics as ``triton/fp8``, so the shared emulation
applies unchanged.

Constraints: fp16 or bf16 inputs, bf16 output; D ∈ {64, 128}; any Sq, Sk ≥ 1; causal or not;
softmax_scale ≥ 0; exactly sm_90; Triton 3.6 or 3.9. Block scales need Q blocks that are whole
consumer tiles (a multiple of 64 rows) and K/V blocks that are whole key blocks (a multiple of
BLOCK_N). No interpreter path, as for ``gluon/hopper``. Not done: the gluon/hopper list (lazy O
rescaling, a persistent scheduler).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma

from common.contract import fp8 as contract_fp8
from common.contract.fp8 import KernelOperands, KernelOrder, Quantisation, ValueLayout
from common.contract.problem import Problem
from common.toolchain.compile import KernelBinary
from common.toolchain.releases import release_configs
from triton_impl._host import LOG2_E
from triton_impl.fp8 import DEFAULT_QUANTISATION, INPUT_DTYPES
from triton_impl.fp8_launch import Fp8Entry, QuantisedLaunch
from triton_impl.fp8_quantiser import FusedQuantiser, compile_sm90_for, shared_memory_supported
from triton_impl.gluon import hopper
from triton_impl.gluon._device import _words_as_operand, online_softmax_rescale
from triton_impl.gluon._host import (
    CONSUMER_ROWS,
    GLUON_DTYPES,
    GluonConfig,
    descriptor,
    descriptor_type,
    feature_arguments,
    gluon_implementation,
    gluon_supported,
    launch_constexprs,
    launch_options,
    validate_gluon_inputs,
)

RUNG = "gluon/fp8"
FP8_DTYPE = gl.float8e4nv
OUTPUT_DTYPE = torch.bfloat16


# ----------------------------------------------------------------------------------------------
# What FP8 adds to the gluon/hopper kernel: the steps its ``if FP8:`` branches call
# ----------------------------------------------------------------------------------------------
# P = 2^(S · scale - row_max + P_EXPONENT) lies in [0, 2^8], clear of e4m3's subnormals; the factor
# cancels because row_sum adds the same lifted P (common/contract/fp8.py, shared with the other fp8 rungs).
P_EXPONENT = gl.constexpr(contract_fp8.P_EXPONENT)
# Keys per group of the register rename of P (``scores_as_operand``; common.contract.fp8.KEY_GROUP), and
# the permutation of [rows, groups, key bit 3, bit 2, bit 1, bit 0] that puts slot k = 4t + i on key
# 8 (i // 2) + 2t + i % 2 (common.contract.fp8.PERMUTED_KEY_ORDER; tests/test_gluon.py checks they agree).
KEY_GROUP = gl.constexpr(contract_fp8.KEY_GROUP)
KEY_BIT_ORDER = gl.constexpr((0, 1, 3, 4, 2, 5))


@gluon.jit
def block_scale(scales, n_block, BLOCK_N: gl.constexpr, KV_QUANT_BLOCK: gl.constexpr):
    """Key block n's scale (K's or V's) of this (batch, head); a key block lies in one quantisation block."""
    return gl.load(scales + n_block * BLOCK_N // KV_QUANT_BLOCK)


@gluon.jit
def consumer_scales(
    scales,
    start_m,
    batch_head,
    kv_batch_head,
    softmax_scale_log2,
    Q_QUANT_BLOCK: gl.constexpr,
    KV_QUANT_BLOCK: gl.constexpr,
    BLOCK_N: gl.constexpr,
):
    """One consumer's scales: ``(k_scales, v_scales, softmax_scale_log2, first_scale_log2)``.

    ``scales``: the fp32 scales of Q (B, H, blocks), K and V (B, Hkv, blocks) and the block counts.
    The consumer's 64 rows from ``start_m`` lie in one Q quantisation block, whose scale joins the
    softmax scale; K's and V's are those of the KV head (``kv_batch_head`` = batch · Hkv + kv_head),
    and key block 0's K scale joins the scale of S_0 (``first_scale_log2``)."""
    Q_SCALE, K_SCALE, V_SCALE, q_blocks, kv_blocks = scales
    k_scales = K_SCALE + kv_batch_head * kv_blocks
    v_scales = V_SCALE + kv_batch_head * kv_blocks
    # The CTA's last consumer may start past Sq (its rows are never stored): clamp to the last block.
    q_block = gl.minimum(start_m // Q_QUANT_BLOCK, q_blocks - 1)
    softmax_scale_log2 = softmax_scale_log2 * gl.load(Q_SCALE + batch_head * q_blocks + q_block)
    first_scale_log2 = softmax_scale_log2 * block_scale(k_scales, 0, BLOCK_N, KV_QUANT_BLOCK)
    return k_scales, v_scales, softmax_scale_log2, first_scale_log2


@gluon.jit
def values_product(P_words, vt_tile, p_layout: gl.constexpr):
    """Issue one key block's P8 V8 into a fresh fp32 accumulator (a wgmma token). fp8 wgmma
    accumulates with reduced precision, so O is not chained through it: each block's product starts
    from zero and is added to O in fp32 (``accumulate``; see triton_impl/fp8.py). Vᵀ's tile is read K-major."""
    P = _words_as_operand(P_words, vt_tile.dtype, p_layout)
    BLOCK_M: gl.constexpr = P.shape[0]
    HEAD_DIM: gl.constexpr = vt_tile.shape[0]
    # P's operand layout is derived from O's accumulator layout, which the product takes.
    o_layout: gl.constexpr = p_layout.parent
    zero = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    return warpgroup_mma(P, vt_tile.permute((1, 0)), zero, use_acc=False, is_async=True)


@gluon.jit
def accumulate(acc, alpha, pv):
    """O in fp32: acc · alpha + P V, one FFMA per element that both rescales O and adds the block
    (alpha carries the V-scale ratio, ``rescale_factor``)."""
    return online_softmax_rescale(acc, alpha) + pv


@gluon.jit
def rescale_factor(alpha, v_scales, n_block, BLOCK_N: gl.constexpr, KV_QUANT_BLOCK: gl.constexpr):
    """The factor that takes acc = O / s_v(n-1) to the frame of block n, alpha · s_v(n-1) / s_v(n)
    (one division per row and step, against one multiply per element of O)."""
    ratio = block_scale(v_scales, n_block - 1, BLOCK_N, KV_QUANT_BLOCK) / block_scale(
        v_scales, n_block, BLOCK_N, KV_QUANT_BLOCK
    )
    return alpha * ratio


@gluon.jit
def packed_words(P):
    """fp32 P in the A-operand layout as e4m3 in int32 words of four consecutive k (the operand's own
    registers): two ``cvt.rn.satfinite.e4m3x2.f32`` per word. Carried from one loop iteration to the
    next as e4m3 bytes, P would be unpacked after the softmax and packed again before its wgmma (about
    three integer instructions per word); as words, it is not."""
    BLOCK_M: gl.constexpr = P.shape[0]
    BLOCK_N: gl.constexpr = P.shape[1]
    # k = 4 word + 2 j1 + j0; gl.split takes the last dimension (j0) apart, then j1.
    k02, k13 = gl.split(gl.reshape(P, [BLOCK_M, BLOCK_N // 4, 2, 2]))
    k0, k2 = gl.split(k02)
    k1, k3 = gl.split(k13)
    words = gl.inline_asm_elementwise(
        asm="""
        {
        .reg .b16 lo, hi;
        cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;
        cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;
        mov.b32 $0, {lo, hi};
        }
        """,
        constraints="=r,r,r,r,r",
        args=[k0, k1, k2, k3],
        dtype=gl.int32,
        is_pure=True,
        pack=1,
    )
    return words


@gluon.jit
def scores_as_operand(P, p_layout: gl.constexpr):
    """P (e4m3, in S's accumulator layout) as the A operand of P V without moving data.

    Per 16 keys, S's accumulator gives lane t the keys 2t, 2t+1, 2t+8, 2t+9 (key bits 1-2 from the
    lane, bits 0 and 3 from the register), while the e4m3 A operand wants lane t to hold four
    consecutive k, 4t..4t+3 (k bits 2-3 from the lane, bits 0-1 from the register). Swapping the key
    bits so that slot k = 4t + i holds key 8 (i // 2) + 2t + i % 2 makes the two layouts the same
    registers: the reshape / permute below only renames them, and ``assert_trivial`` makes the
    compiler refuse a conversion that would exchange data. V's keys are stored in the same order
    (``common.contract.fp8.permuted_key_values``), so the product is unchanged."""
    BLOCK_M: gl.constexpr = P.shape[0]
    BLOCK_N: gl.constexpr = P.shape[1]
    # Key bits (from the top) 3, 2, 1, 0 of each group of 16 -> slot bits 1, 3, 2, 0.
    P = gl.reshape(P, [BLOCK_M, BLOCK_N // KEY_GROUP, 2, 2, 2, 2])
    P = gl.permute(P, KEY_BIT_ORDER.value)
    P = gl.reshape(P, [BLOCK_M, BLOCK_N])
    return gl.convert_layout(P, p_layout, assert_trivial=True)


@gluon.jit
def operand_p(P_f32, p_layout: gl.constexpr):
    """The e4m3 P conversion: fp32 P renamed into the A-operand layout, then packed as e4m3 words
    (fp16/bf16 P changes layout instead: ``_device._operand_p``)."""
    return packed_words(scores_as_operand(P_f32, p_layout))


# ----------------------------------------------------------------------------------------------
# Host: configuration, quantised operands, prepared launch
# ----------------------------------------------------------------------------------------------
# (head_dim, causal) -> configuration, chosen on the H200 (docs/perf-log.md, "Gluon `fp8`: P in S's
# registers" and "Gluon: seqlen_k = 1, racecheck and the floors"). With P handed over in S's own
# registers and masked blocks finishing the previous P V first, 128-key blocks fit the 240 registers
# of a D=128 consumer (O, the running P V, S and P live at once) without spills on Triton 3.6 and
# 3.9, causal or not; they replaced the causal build's 64-key blocks taken two per loop iteration.
# D=128 takes ping-pong (faster on 3.9, even on 3.6; causal at P1 under 3.6 696.8 against 738.5 µs,
# docs/perf-log.md, "twelfth stop", where 3.9 runs causal without it: common.toolchain.releases) and,
# causal, a third stage. D=64 runs two consumers with 128-key blocks. Row max and sum are trees
# (``row_tree``; docs/perf-log.md, "Fourth stop"): Triton 3.6 makes a dependent chain of them, 3.9 a
# tree of its own (kept at D=128).
DEFAULT_CONFIGS = release_configs(
    RUNG,
    {
        (64, False): GluonConfig(128, 3, row_tree=True),
        (64, True): GluonConfig(128, 3, row_tree=True),
        (128, False): GluonConfig(128, 2, pingpong=True, row_tree=True),
        (128, True): GluonConfig(128, 3, pingpong=True, row_tree=True),
    },
)


# D=64 configurations for issue #37's A/B (``python -m bench.gluon_sweep bench 3 --cands fp8-d64``;
# ``tests/test_fp8_rungs.py`` judges each by FP8_RULE on the GPU), keyed by causal. The softmax sets
# the pace at D=64 (each 64 x 128 block: 66 MUFU.EX2 per thread, 528 exp2-unit cycles per SM
# sub-partition against 256 tensor-core cycles), so the candidates change how many consumers overlap
# their softmaxes and how long each phase is: three consumers fit 128 registers with 64-key blocks only
# (128-key blocks spill 48-72 bytes); 256-key blocks fit two consumers non-causal under Triton 3.6 only
# (causal, or Triton 3.8: 216-312 bytes of spill).
D64_CANDIDATES: dict[bool, tuple[GluonConfig, ...]] = {
    False: (
        GluonConfig(64, 3, consumers=3, pingpong=True, row_tree=True),
        GluonConfig(64, 4, consumers=3, pingpong=True, row_tree=True),
        GluonConfig(64, 3, consumers=3, row_tree=True),
        GluonConfig(128, 3, pingpong=True, row_tree=True),
        GluonConfig(256, 2, row_tree=True),
    ),
    True: (
        GluonConfig(64, 3, consumers=3, pingpong=True, row_tree=True),
        GluonConfig(64, 3, consumers=3, row_tree=True),
        GluonConfig(128, 3, pingpong=True, row_tree=True),
    ),
}


def candidate_quantisation(config: GluonConfig) -> Quantisation:
    """``DEFAULT_QUANTISATION`` with K/V scale blocks that hold whole key blocks of ``config``."""
    kv_rows = max(DEFAULT_QUANTISATION.kv_block_rows, config.block_n)
    return dataclasses.replace(DEFAULT_QUANTISATION, kv_block_rows=kv_rows)


def default_config(problem: Problem) -> GluonConfig:
    """The configuration for this head dim and mask under the installed Triton release."""
    return DEFAULT_CONFIGS[problem.head_dim, problem.causal]


def value_layout(config: GluonConfig) -> ValueLayout:
    """Vᵀ as this kernel reads it: keys permuted for P in S's registers, padded to whole key blocks."""
    return ValueLayout(permuted=True, key_multiple=config.block_n)


def check_quantisation_blocks(quantisation: Quantisation, config: GluonConfig) -> None:
    """Block scales are scalars per tile only if each consumer's Q tile and each key block lie inside
    one quantisation block."""
    if quantisation.block and (
        quantisation.q_block_rows % CONSUMER_ROWS or quantisation.kv_block_rows % config.block_n
    ):
        raise ValueError(
            f"{RUNG}: block quantisation of {quantisation.q_block_rows} Q rows / {quantisation.kv_block_rows} "
            f"K/V rows needs multiples of the consumer tile ({CONSUMER_ROWS} rows) and of BLOCK_N "
            f"({config.block_n}), got {quantisation.q_block_rows} / {quantisation.kv_block_rows}"
        )


class GluonFp8Attention:
    """Prepared launch over quantised operands (buffers the fused quantiser writes, Vᵀ in
    ``value_layout(config)``): descriptors, O (bf16) and lse built once; calling it launches and
    returns O, or (O, lse) when the problem returns the LSE. K, V and their scales have the KV heads'
    shape (B, Hkv, ...), quantised as given (per KV head)."""

    def __init__(
        self, operands: KernelOperands, problem: Problem, config: GluonConfig,
        cache_seqlens: torch.Tensor | None = None,
    ):  # fmt: skip
        batch, heads, seqlen_q, head_dim = operands.q8.shape
        quantisation = operands.quantisation
        check_quantisation_blocks(quantisation, config)
        if operands.value_layout != value_layout(config):
            raise ValueError(f"{RUNG} reads Vᵀ as {value_layout(config)}, got {operands.value_layout}")
        self.variant = quantisation.name
        # Kept as attributes: the descriptors point into these buffers.
        self.operands = operands
        # Vᵀ padded with zeros to whole key blocks, so that no V tile reads past its tensor.
        self.vt8 = operands.vt8
        self.return_lse = problem.return_lse
        self.out = torch.empty(operands.q8.shape, device=operands.q8.device, dtype=OUTPUT_DTYPE)
        self.lse = torch.empty((batch, heads, seqlen_q), device=operands.q8.device, dtype=torch.float32)
        self._args = (
            descriptor(operands.q8, CONSUMER_ROWS, FP8_DTYPE),
            descriptor(operands.k8, config.block_n, FP8_DTYPE),
            descriptor(self.vt8, head_dim, FP8_DTYPE, box_cols=config.block_n),
            descriptor(self.out, CONSUMER_ROWS, GLUON_DTYPES[OUTPUT_DTYPE]),
            self.lse,
            cache_seqlens,
            heads,
            problem.kv_heads,
            seqlen_q,
            problem.seqlen_k,
            problem.scale * LOG2_E,
            operands.q_scale,
            operands.k_scale,
            operands.v_scale,
            operands.q_scale.shape[-1],
            operands.k_scale.shape[-1],
        )
        quant_blocks = (quantisation.q_block_rows, quantisation.kv_block_rows)
        self._options = launch_options(config, problem, quant_blocks)
        self._grid = (triton.cdiv(seqlen_q, config.block_m), batch * heads)

    def __call__(self) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        hopper.attention_kernel[self._grid](*self._args, **self._options)
        return (self.out, self.lse) if self.return_lse else self.out


def _validate(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, cache_seqlens: torch.Tensor | None = None
) -> Problem:
    return validate_gluon_inputs(q, k, v, problem, INPUT_DTYPES, RUNG, cache_seqlens)


def launch(
    q: torch.Tensor, k: torch.Tensor, problem: Problem, quantisation: Quantisation = DEFAULT_QUANTISATION, *,
    cache_seqlens: torch.Tensor | None = None,
) -> QuantisedLaunch:  # fmt: skip
    """The fused quantiser's buffers (Vᵀ in this kernel's layout) and the kernel's descriptors over
    them, at the default configuration; nothing launched."""
    config = default_config(problem)
    fused = FusedQuantiser(q.shape, k.shape, q.dtype, q.device, quantisation, value_layout(config))
    return QuantisedLaunch(fused, GluonFp8Attention(fused.operands, problem, config, cache_seqlens))


def _kernel_order(problem: Problem) -> KernelOrder:
    """Key blocks of the default configuration, visited first to last (every consumer walks its blocks upwards)."""
    return KernelOrder(block_n=default_config(problem).block_n, reverse=False)


def _value_layout(problem: Problem) -> ValueLayout:
    return value_layout(default_config(problem))


# bind, prepare, prepare_end_to_end and emulate: the FP8 rungs' shared entry (triton_impl/fp8_launch.py).
ENTRY = Fp8Entry(_validate, launch, _kernel_order, _value_layout, DEFAULT_QUANTISATION)
bind, prepare, prepare_end_to_end, emulate = ENTRY.bind, ENTRY.prepare, ENTRY.prepare_end_to_end, ENTRY.emulate


# ----------------------------------------------------------------------------------------------
# Capability check and static compile
# ----------------------------------------------------------------------------------------------
def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    if problem.dtype not in INPUT_DTYPES:
        return False, f"{RUNG} quantises fp16 or bf16 inputs, got {problem.dtype_name}"
    ok, reason = gluon_supported(problem, device, RUNG)
    if not ok:
        return ok, reason
    return shared_memory_supported(RUNG, problem, DEFAULT_QUANTISATION)


def compile_sm90(
    problem: Problem, config: GluonConfig | None = None, quantisation: Quantisation = DEFAULT_QUANTISATION
) -> list[KernelBinary]:
    """The kernel for sm_90a at the default configuration of this head dim (no GPU needed)."""
    config = config or default_config(problem)
    check_quantisation_blocks(quantisation, config)
    head_dim = problem.head_dim
    operand_types = {
        "desc_q": descriptor_type(torch.float8_e4m3fn, CONSUMER_ROWS, head_dim),
        "desc_k": descriptor_type(torch.float8_e4m3fn, config.block_n, head_dim),
        "desc_v": descriptor_type(torch.float8_e4m3fn, head_dim, head_dim, box_cols=config.block_n),
        "desc_o": descriptor_type(OUTPUT_DTYPE, CONSUMER_ROWS, head_dim),
    }
    scale_types = {"Q_SCALE": "*fp32", "K_SCALE": "*fp32", "V_SCALE": "*fp32", "q_blocks": "i32", "kv_blocks": "i32"}
    quant_blocks = (quantisation.q_block_rows, quantisation.kv_block_rows)
    constexprs = {
        **feature_arguments(problem)[1],
        **launch_constexprs(config, problem, quant_blocks),
        "num_warps": config.num_warps,
    }
    signature = hopper.kernel_signature(problem, operand_types, scale_types)
    return [hopper.compile_kernel_sm90(signature, constexprs, config)]


def compile_quantiser_sm90(problem: Problem) -> list[KernelBinary]:
    """The fused quantiser this rung launches before its kernel, for sm_90a at ``problem``'s shape."""
    return compile_sm90_for(problem, DEFAULT_QUANTISATION, value_layout(default_config(problem)))


# Q, K, Vᵀ come by TMA; the scales are plain scalar loads.
IMPLEMENTATION = gluon_implementation(
    "fp8",
    supports,
    compile_sm90,
    **ENTRY.registry_fields(compile_quantiser_sm90),
    required_ptx=("setmaxnreg", "e4m3 mma"),
    source_file=__file__,
    default_configs=DEFAULT_CONFIGS,
    notes=f"quantisation: {DEFAULT_QUANTISATION.describe()}",
)
