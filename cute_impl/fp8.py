"""Rung ``fp8`` (CuTe DSL): the ``hopper`` kernel on e4m3 operands. Counterpart: ``triton_impl/fp8.py``.

What it adds over ``hopper``
----------------------------
FP8 WGMMA (``wgmma.mma_async ... .e4m3.e4m3``) runs at twice the bf16 rate and halves the bytes of
Q, K and V in HBM and shared memory. The kernel is ``cute_impl/hopper.py``'s ``HopperAttention``
compiled for ``Float8E4M3FN``; what changes is the quantisation in ``bind``, how the scales enter
the kernel, and how P reaches the second GEMM.

Algorithm
---------
1. ``bind`` (per call: the values change): the fused quantiser shared by the three FP8 rungs
   (``triton_impl.fp8_quantiser``, one launch with block scales, the values of ``common.contract.fp8.quantise``).
   Optionally Q and K rotated by a seeded random Hadamard matrix, then one e4m3 scale per tensor
   or, with block quantisation, per 64 rows of Q (one consumer warpgroup's rows) and per 128 rows
   of K and of V (one key block), per (batch, head) for Q and per (batch, KV head) for K and V:
   with GQA they are quantised as given, and the kernel indexes their scales by the KV head.
   ``DEFAULT_QUANTISATION`` (block scales and rotation) is what compare.py runs; ``quantisation=``
   selects the other ``common.contract.fp8.VARIANTS``. The quantiser writes steps 2 and 3's layout
   (``VALUE_LAYOUT``) directly; ``prepare_end_to_end``'s run() is that quantiser and the kernel.
   ``QUANTISE_Q_IN_KERNEL`` (on by default at D=128, and at D=64 without the causal mask; issue #37): the
   quantiser does K and V only and the kernel reads Q in bf16/fp16, each consumer warpgroup rotating, scaling
   and rounding its 64-row box as the quantiser would (``_fp8_query.py``: Q's scale block is that box), so a
   call reads Q once instead of three times; the emulation and FP8_RULE are unchanged (the kernel's Q is the
   quantiser's).
   ``LEAN_Q_QUANTISATION`` (issue #37, on by default): the same e4m3 Q from 162 fewer instructions a consumer
   thread and tile (the amax before x c, the box written by stmatrix; ``_fp8_query.py``, "lean").
   ``Q_QUOTIENT_CORRECTIONS`` (issue #37, 1 by default; 2 as the quantiser): the same correctly rounded quotient
   of each Q value by its block scale from one Markstein correction instead of two (``_fp8_query.quotient``).
   ``SCALE_INDEX_32BIT`` (issue #37, on by default, causal only): K's and V's block scales read with 32-bit strides,
   so that the causal key loop no longer recomputes their addresses from 64-bit strides a block (causal kernels
   0.97-0.99x the time; non-causal D=64 lost 1.12x, so ``SCALE_INDEX_32BIT_CAUSAL_ONLY``).
   ``FOLD_V_SCALE`` (issue #37, on by default, D=128): each block's P V joins O in one FMA a value, O kept in its
   last V block's frame and owing the last softmax update's row factors, as gluon/fp8 accumulates (P1 kernels
   0.95x the time).
   ``PROGRAMMATIC_LAUNCH`` (issue #37, off by default): end to end, the kernel is launched by programmatic
   dependent launch, so that it starts under the quantiser's last wave and waits for it only before reading what
   it writes (``hopper.py``, "Programmatic dependent launch").
2. V stored transposed, (B, Hkv, D, Sk') with Sk' = Sk rounded up to 16 and zero padding: FP8 WGMMA
   reads a shared-memory B operand only K-major, and for O = P V the K dimension is the key index.
3. Inside each group of 16 keys, V's key order is permuted (``common.contract.fp8.PERMUTED_KEY_ORDER``). The m64k32 FP8
   A operand wants each lane to hold four *consecutive* k, while the S accumulator gives each lane
   column *pairs* (2t, 2t+1, 2t+8, 2t+9). Renaming registers (``scores_to_operand_a``) plus this
   permutation of V makes the product exact without any cross-lane shuffle.
4. The kernel runs as in ``hopper``, reading the scales from (B, H, blocks) fp32 tensors
   (``Fp8Descales``): Q's block scale folds into the warpgroup's softmax scale; K's scale of key
   block n joins that block's score scale (``OnlineSoftmax.update``, no cost per score: a positive
   factor commutes with the max); V's scale multiplies the block's
   fp32 P V when it is added to O (``add_block_product``, an FMA instead of an add). Per-tensor
   scales are read once per tile instead. P is computed as exp2(... + 8), i.e. in [0, 256] instead
   of [0, 1], so that small probabilities stay out of e4m3's subnormal range (the factor cancels in
   O / row_sum and is removed from the LSE), then converted to e4m3 in registers. O is bf16.
5. Each block's P V is accumulated from zero in its own registers and added to O in fp32
   (``separate_pv``): accumulating all blocks inside the FP8 WGMMA loses precision block after
   block (measurements below).

Data movement
-------------
As ``hopper``: TMA boxes into swizzled shared memory (64 x D Q, tile_n x D K, D x tile_n Vᵀ, all
K-major, one byte per element), WGMMA from shared memory for QKᵀ and from registers (P) for PV,
stmatrix + TMA store for O. The block scales are two fp32 loads per key block and thread (L1).

Error: what each technique buys
-------------------------------
Judged by ``FP8_RULE`` against ``emulate``: the fp64 attention of the same e4m3 operands and
scales with P rounded as this kernel rounds it (key blocks visited last to first). e4m3 keeps 3
mantissa bits, so even exact attention of the rounded operands misses fp64 by about 5 % relative
L2 on zero-mean inputs; no kernel reading e4m3 can do better than its emulation.
On FlashAttention-3's outlier inputs (``results/h200/fp8_error.md``, ``python -m common.tools.fp8_error``):
a per-tensor scale is set by the largest outlier, so ordinary entries fall towards e4m3's
subnormals and lose bits. Block scales keep that damage inside the blocks that hold an outlier;
the rotation spreads each outlier of Q and K over all D channels before rounding, lowering every
amax. FA3's outliers sit in single channels, so the rotation does almost all of the gain; block
scales help only the blocks without an outlier and add little on top of it, for a few percent of
kernel speed (``DEFAULT_QUANTISATION`` takes both: the most accurate variant within 5 %). The
table gives the RMSE of each variant, its emulation's, and FA3's own numbers;
``results/h200/fp8_speed.md`` their speed, kernel only and end to end.

What the measurements taught
----------------------------
Figures are in the generated table of ``docs/ladder.md``; the A/B runs behind these lessons are in
``docs/perf-log.md`` ("Figures moved out of rung docstrings").

* Accumulating P V across all key blocks in the WGMMA accumulator loses precision linearly in the
  number of blocks (the FP8 tensor-core accumulator is not full fp32): a per-block P V accumulator
  and the P offset fix it for a few percent of speed (the two fixes were measured together).
* As for ``hopper``, a third consumer warpgroup at D=64 and persistent CTAs pay off; ping-pong does
  not, FP8's GEMMs being too short for the turn to pay (D=64 causal gained 3.7 % with it on a plain
  problem, but spills with every feature on).
* Block scales and rotation: ``results/h200/fp8_speed.md`` and ``docs/perf-log.md``.

Constraints
-----------
sm_90, fp16/bf16 inputs, head_dim 64 or 128, softmax_scale > 0, any Sq, Sk >= 1. Every problem
feature of ``hopper`` (``FEATURES``), from the same kernel: GQA (K, V and their scales read at the KV
head), causal aligned top-left or bottom-right, ``cache_seqlens`` ((B,) int32, contiguous, passed to
``prepare``/``bind``/``emulate`` as ``cache_seqlens=``) and ``return_lse`` (``run()`` returns (O, lse),
the LSE in natural log of the original scores, the P offset removed; -inf and O = 0 for rows that see
no key). The emulation takes the same mask and key lengths and returns its LSE with a bound, which
judges the kernel's. Block scales must match the tiles (64 Q rows, 128 keys).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch

from common.contract.capability import FEATURES
from common.contract.devices import lasting
from common.contract.fp8 import KEY_GROUP, KernelOperands, KernelOrder, Quantisation, ValueLayout, random_hadamard
from common.contract.metrics import FP8_RULE
from common.contract.problem import Problem
from common.contract.registry import Implementation, Runner
from common.contract.validation import kernel_operand
from common.toolchain.compile import KernelBinary
from cute_impl._device import LOG2_E
from cute_impl._fp8_query import paired_columns
from cute_impl._hopper_host import DEFAULT_TILE_N, HopperAttentionConfig, default_config
from cute_impl.hopper import KERNELS, ROWS_PER_WARPGROUP, validated_problem, wgmma_supports
from triton_impl import fp8_quantiser
from triton_impl.fp8_launch import Fp8Entry, QuantisedLaunch
from triton_impl.fp8_quantiser import (
    ROTATED_CORRECTIONS,
    FusedQuantiser,
    compile_sm90_for,
    quantise_for_kernel,
    shared_memory_supported,
)

# What compare.py and the tests run: the most accurate variant whose kernel is within 5 % of the
# per-tensor kernel's speed in every stack (issue #17): block scales + rotation, the most accurate on
# FA3's inputs, cost at most 4 % (results/h200/fp8_speed.md; docs/perf-log.md).
DEFAULT_QUANTISATION = Quantisation(block=True, rotation=True)
# Vᵀ as the kernel reads it (steps 2-3): keys permuted, padded to a whole group of 16.
VALUE_LAYOUT = ValueLayout(permuted=True, key_multiple=KEY_GROUP)
# Issue #37's knob (bench/fp8_q_in_kernel_ab.sh times it): the kernel takes Q in bf16/fp16 and each consumer
# warpgroup quantises its 64 rows as the fused quantiser would (``_fp8_query.py``), so the quantiser runs for
# K and V only. Read when a launch is built (``launch``), so tests and benches can set it. On by default for
# block scales with rotation at the head dims in QUANTISE_Q_HEAD_DIMS, where it was measured (H200, P1 causal:
# end to end 813.6 -> 789.4 us, non-causal 1415.7 -> 1413.3; results/h200/fp8-q-in-kernel-ab2/) and its GPU
# tests run; with the causal mask only at the head dims in QUANTISE_Q_CAUSAL_HEAD_DIMS. D=64 (H100, B=4 H=32
# S=8192, 3 rounds, results/h100/fp8-q-in-kernel-2026-12-06/): non-causal end to end 3889.3 -> 3654.8 us (kernel
# 3674.5 -> 3554.9); causal the kernel loses 2241.5 -> 2374.3 us (its Q quantisation is not halved by the mask
# while its key blocks are) for 2473.5 -> 2453.4 end to end, so causal D=64 keeps the quantiser's Q.
QUANTISE_Q_IN_KERNEL = True
QUANTISE_Q_HEAD_DIMS = (64, 128)
QUANTISE_Q_CAUSAL_HEAD_DIMS = (128,)
# Issue #37's PDL knob (bench/fp8_pdl_ab.sh times it): end to end, the fused quantiser signals
# ``griddepcontrol.launch_dependents`` as each program starts (``QuantiserConfig.launch_dependents``) and the kernel
# is launched with programmatic dependent launch (``HopperAttentionConfig.pdl``), so that its CTAs start (launch,
# barriers, the sign matrix, Q's boxes and, with ``QUANTISE_Q_IN_KERNEL``, Q's quantisation) under the quantiser's
# last wave and wait (``griddepcontrol.wait``) just before their first read of what it writes. Only the end-to-end
# launch takes it: a kernel-only run follows any kernel, which may write Q while the kernel reads it early. Read
# when a launch is built. Off until the A/B.
PROGRAMMATIC_LAUNCH = False
# Issue #37's lean Q quantisation (bench/fp8_tile_work_ab.sh times it): with ``QUANTISE_Q_IN_KERNEL``, the same
# e4m3 Q from 162 fewer instructions a consumer thread and tile at P1, of the 1964 it runs outside the key-block
# steps (``HopperAttentionConfig.lean_quantise_q``): the amax before the rotation's x c, and the e4m3 box written
# by stmatrix from a rotation with its sign matrix's columns reordered (``sign_matrix_transposed``). Read when a
# launch is built. H200, P1, 3 rounds (results/h200/fp8-lean-q/): kernel causal 693.7 -> 679.4 us, non-causal
# 1327.9 -> 1310.7 (predicted -2 to -6), O bit for bit the full quantisation's.
LEAN_Q_QUANTISATION = True
# Issue #37's Q quotient (bench/fp8_quotient_ab.sh times it): with ``QUANTISE_Q_IN_KERNEL``, the Markstein corrections
# of each Q value's quotient by its block scale after q = x · (1 / scale) (``_fp8_query.quotient``,
# ``HopperAttentionConfig.q_quotient_corrections``): ``ROTATED_CORRECTIONS`` (2) as the quantiser, or 1, the same
# correctly rounded quotient for every fp32 x and scale (``common/tools/fp8_quotient.py`` proves it) from two fmas an
# element fewer (P1 causal: 256 static instructions fewer a consumer thread's tile). Read when a launch is built.
# 1 since its A/B (H200, 2026-12-03, results/h200/fp8-quotient/): O and Q's scales bit for bit the default's (6 GPU
# tests), no time it buys that the runs resolve: each setting ran 5-20 µs faster in the second place of a round, either
# way round; averaged over both orders the kernel -2.1 µs causal, +0.9 non-causal, end to end +0.9 / +6 (spreads 4-67).
Q_QUOTIENT_CORRECTIONS = 1
Q_QUOTIENT_CORRECTION_CHOICES = (1, ROTATED_CORRECTIONS)
# Issue #37's block-scale addressing (bench/fp8_scale_index_ab.sh times it): the K and V block scales read with 32-bit
# strides (``HopperAttentionConfig.scale_index_32``). With 64-bit ones, ptxas recomputes each key block's two scale
# addresses from the batch and head strides inside the causal key loop (Nsight Compute of causal D=64,
# results/h100/cute-decode-two-wg-left-2026-12-06/ncu/: the step 29 instructions longer than the non-causal one's).
# sm_90a, Triton-independent: the causal key loop 504 -> 486 instructions at D=64 and 575 -> 557 at P1 D=128,
# non-causal 475 and 549 -> 546. H100, 2026-12-06, with FOLD_V_SCALE on (results/h100/fp8-scale-index-2026-12-06/):
# causal kernels 0.989x the time at P1 and 0.968x at D=64 (B=4 H=32), each the same in the call without the fold;
# non-causal 1.00x at P1 but 1.12x at D=64 (3527 -> 3944 us, twice, with the same instruction count), hence
# SCALE_INDEX_32BIT_CAUSAL_ONLY. Nsight Compute of both non-causal D=64 builds
# (results/h100/fp8-d64-scale-index-ncu-2026-12-06/: 3.53 against 3.93 ms) puts the loss in the three consumers' wait
# for K's full barrier, 6156 -> 22371 stall samples: scheduled otherwise, they seem to run in step and free each K/V
# stage together and late. With ping-pong (off by default) the causal D=128 build with Q in the kernel takes an 8-byte
# stack frame with them (none with 64-bit strides). Both read when a launch is built.
SCALE_INDEX_32BIT = True
SCALE_INDEX_32BIT_CAUSAL_ONLY = True
# Issue #37's folded V scale (bench/fp8_fold_v_ab.sh times it): each key block's separate P V joins O in one FMA a
# value, O held in its last V block's frame and owing the last softmax update's row factors
# (``HopperAttentionConfig.fold_v_scale``; gluon/fp8's ``accumulate``), instead of an FMA with the block's V scale and a
# warp-uniform conditional multiply of O by the row factors, taken at 47-59 % of the D=64 blocks (Nsight Compute,
# results/h100/cute-decode-two-wg-left-2026-12-06/ncu/). At D=128 the key step is issue-bound: the gluon kernel's step
# is 466 instructions against this one's 549, 59 of them the conditional FMULs; folded, 489. H100, 2026-12-06
# (results/h100/fp8-fold-v-2026-12-06/): P1 kernels 0.950x the time causal (802 -> 844 TFLOP/s) and 0.947x non-causal
# (833 -> 880), causal end to end 1.069 -> 1.105x cute/hopper's kernel. Read when a launch is built.
# FOLD_V_SCALE_HEAD_DIMS: where it applies; D=64's three consumers at 128 registers carry the owed row factors and the V
# scale across the loop only by spilling (88 bytes with GQA, cache lengths and the LSE).
FOLD_V_SCALE = True
FOLD_V_SCALE_HEAD_DIMS = (128,)


# D=64 configurations for issue #37's A/B (``python -m bench.gluon_sweep bench 3 --cands fp8-d64``;
# ``tests/test_fp8_rungs.py`` judges each by FP8_RULE on the GPU): knobs replacing ``fp8_config``'s
# choice, each with the bottleneck it attacks. At D=64 a 64 x 128 block of one warpgroup costs each SM
# sub-partition 66 MUFU.EX2 (528 cycles of the exp2 unit), about 480 issue slots, but only 256 cycles
# of the e4m3 tensor core (docs/perf-log.md): the softmax, not the GEMMs, sets the pace, so every
# candidate changes how the consumers' softmaxes overlap or what each block costs beyond its scores.
D64_CANDIDATES: dict[bool, dict[str, dict[str, Any]]] = {
    False: {
        # Ping-pong serialises the warpgroups' GEMMs, which at FP8 are half as long as the softmax they
        # should hide (FP8 at D=128 gained 2.4 % without it; D=64 3.0 %: the default is without it).
        "pingpong-on": {"pingpong": True},
        # A third K/V stage: the loads run further ahead of three consumers.
        "3-stages": {"kv_stages": 3},
        "one-cta-per-tile": {"persistent": False},
        # 64-key blocks, 4 stages: shorter softmax phases interleave more finely across the consumers.
        "64-keys-4-stages": {"tile_n": 64, "kv_stages": 4},
        # Two consumers at 240 registers with 256-key blocks: the per-block work (O rescale and P V add,
        # barriers, two rescale exp2) over twice the keys, for a third fewer warps (causal: spills).
        "2-warpgroups-256-keys": {"consumer_warpgroups": 2, "tile_n": 256},
        # Per-tensor scales (rotation kept): what the block scales cost, two global loads per key
        # block in front of the exp2 phase (12 issue slots per block, 39 causal).
        "per-tensor-scales": {"block_scales": False},
    },
    True: {
        # 3.7 % faster on the timed shape (results/h200/fp8-d64/), but with GQA, cache lengths and the
        # LSE together the kernel spills 8 bytes (tests/test_cute_hopper.py): not the default.
        "pingpong-on": {"pingpong": True},
        "3-stages": {"kv_stages": 3},
        "persistent": {"persistent": True},
        "64-keys-4-stages": {"tile_n": 64, "kv_stages": 4},
        "per-tensor-scales": {"block_scales": False},
    },
}


def fp8_config(problem: Problem, quantisation: Quantisation, **knobs: Any) -> HopperAttentionConfig:
    """``hopper``'s FP8 configuration, reading block scales when ``quantisation`` has them; ``knobs``
    replace fields of the default (``D64_CANDIDATES``)."""
    fold = FOLD_V_SCALE and problem.head_dim in FOLD_V_SCALE_HEAD_DIMS
    index_32 = SCALE_INDEX_32BIT and (problem.causal or not SCALE_INDEX_32BIT_CAUSAL_ONLY)
    fields = {"block_scales": quantisation.block, "scale_index_32": index_32, "fold_v_scale": fold}
    fields.update(knobs)
    config = dataclasses.replace(default_config(problem, fp8=True), **fields)
    if config.rotate_ahead and not config.quantise_q:
        raise ValueError("cute/fp8 issues the next tile's rotation ahead (rotate_ahead) only with quantise_q")
    if config.lean_quantise_q and not config.quantise_q:
        raise ValueError("cute/fp8 quantises Q lean (lean_quantise_q) only with quantise_q")
    if config.q_quotient_corrections not in Q_QUOTIENT_CORRECTION_CHOICES:
        raise ValueError(
            f"cute/fp8 corrects Q's quotients once or twice (q_quotient_corrections in "
            f"{Q_QUOTIENT_CORRECTION_CHOICES}), got {config.q_quotient_corrections}"
        )
    if config.q_quotient_corrections != ROTATED_CORRECTIONS and not config.quantise_q:
        raise ValueError("cute/fp8 divides Q by its scale (q_quotient_corrections) only with quantise_q")
    if config.quantise_q and not (quantisation.block and quantisation.rotation):
        raise ValueError(
            f"cute/fp8 quantises Q in its kernel only with block scales and rotation, got {quantisation.name}"
        )
    if config.block_scales != quantisation.block:
        raise ValueError(
            f"cute/fp8 reads block scales exactly when the quantisation has them: block_scales="
            f"{config.block_scales}, quantisation {quantisation.name}"
        )
    if quantisation.block and (
        quantisation.q_block_rows != ROWS_PER_WARPGROUP or quantisation.kv_block_rows != config.tile_n
    ):
        raise ValueError(
            f"cute/fp8 block scales must match its tiles ({ROWS_PER_WARPGROUP} Q rows per warpgroup, "
            f"{config.tile_n} keys per block), got {quantisation.q_block_rows} / {quantisation.kv_block_rows}"
        )
    return config


def candidate_quantisation(knobs: dict[str, Any]) -> Quantisation:
    """``DEFAULT_QUANTISATION`` with K/V scale blocks of the candidate's key block (they must match), or
    per-tensor scales where the candidate reads no block scales."""
    return dataclasses.replace(
        DEFAULT_QUANTISATION,
        block=knobs.get("block_scales", DEFAULT_QUANTISATION.block),
        kv_block_rows=knobs.get("tile_n", DEFAULT_TILE_N),
    )


def quantised(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, quantisation: Quantisation) -> KernelOperands:
    """Steps 1-3 once: the operands this kernel reads (the fused quantiser on CUDA)."""
    return quantise_for_kernel(q, k, v, quantisation, VALUE_LAYOUT)


def quantised_launcher(
    config: HopperAttentionConfig,
    operands: KernelOperands,
    problem: Problem,
    sm_count: int | None = None,
    *,
    cache_seqlens: torch.Tensor | None = None,
    query: torch.Tensor | None = None,
) -> Runner:
    """The ``hopper`` launcher over the e4m3 bytes of Q, K and permuted Vᵀ (``VALUE_LAYOUT``) with
    the scales, the key lengths (``cache_seqlens``) and the LSE (returned with O when
    ``problem.return_lse``). With ``config.quantise_q`` it reads ``query`` (Q in bf16/fp16) instead of
    ``operands.q8`` and writes Q's scales into ``operands.q_scale``."""
    if operands.value_layout != VALUE_LAYOUT:
        raise ValueError(f"cute/fp8 reads Vᵀ as {VALUE_LAYOUT}, got {operands.value_layout}")
    if config.quantise_q != (query is not None):
        raise ValueError(
            f"Q in its input dtype must be given exactly when the kernel quantises it: quantise_q={config.quantise_q}, "
            f"query given={query is not None}"
        )
    scales = (operands.q_scale, operands.k_scale, operands.v_scale)
    rotation = None if query is None else sign_matrix_transposed(problem.head_dim, operands.quantisation.seed,
                                                                   query.dtype, query.device,
                                                                   paired=config.lean_quantise_q)  # fmt: skip
    run = KERNELS.launcher(
        config,
        operands.q8 if query is None else kernel_operand(query),
        operands.k8,
        operands.vt8,
        problem.scale * LOG2_E,
        1.0,
        sm_count=sm_count,
        scales=scales,
        cache_seqlens=cache_seqlens,
        return_lse=problem.return_lse,
        rotation=rotation,
    )
    run.variant = operands.quantisation.name
    return run


@functools.cache
def sign_matrix_transposed(
    head_dim: int, seed: int, dtype: torch.dtype, device: torch.device, paired: bool = False
) -> torch.Tensor:
    """The ±1 signs of ``random_hadamard(head_dim, seed)`` transposed, (D, D) in ``dtype``: the K-major B
    operand of the in-kernel rotation (the quantiser's sign matrix; its magnitude is the kernel's constant).
    ``paired`` (``lean_quantise_q``): its output columns in ``paired_columns``' order, for the stmatrix store.

    Built on the host and copied by ``lasting``'s own stream, which waits for no stream of the caller: a matrix
    computed on the caller's stream and read there raced with that stream (on a busy GPU the copy read the
    allocation before the signs were written, and the process kept that matrix: one wrong answer in the H100's
    suite, 2026-12-05, ``tests/test_lasting_buffers.py``)."""
    matrix = torch.sign(random_hadamard(head_dim, seed)).T
    if paired:
        matrix = matrix[torch.tensor(paired_columns(head_dim))]
    host = matrix.to(dtype).contiguous()
    return lasting(lambda: host.to(device), device)


def quantises_q_in_kernel(problem: Problem, quantisation: Quantisation) -> bool:
    """Whether ``launch`` takes Q unquantised: ``QUANTISE_Q_IN_KERNEL`` on, block scales with rotation (the only
    variant the kernel's Q quantisation implements) and a head dim in ``QUANTISE_Q_HEAD_DIMS`` (causal: in
    ``QUANTISE_Q_CAUSAL_HEAD_DIMS``)."""
    head_dims = QUANTISE_Q_CAUSAL_HEAD_DIMS if problem.causal else QUANTISE_Q_HEAD_DIMS
    return QUANTISE_Q_IN_KERNEL and quantisation.block and quantisation.rotation and problem.head_dim in head_dims


def query_knobs(in_kernel: bool) -> dict[str, Any]:
    """The fields of ``fp8_config`` that follow from whether the kernel quantises Q (``quantises_q_in_kernel``): the
    module's knobs for Q's quantisation where it does, none of them where it does not."""
    return {
        "quantise_q": in_kernel,
        "lean_quantise_q": in_kernel and LEAN_Q_QUANTISATION,
        "q_quotient_corrections": Q_QUOTIENT_CORRECTIONS if in_kernel else ROTATED_CORRECTIONS,
    }


def launch(
    q: torch.Tensor, k: torch.Tensor, problem: Problem, quantisation: Quantisation = DEFAULT_QUANTISATION, *,
    cache_seqlens: torch.Tensor | None = None, after_quantiser: bool = False,
) -> QuantisedLaunch:  # fmt: skip
    """The fused quantiser's buffers and the launch-only kernel over them (compiled once per
    configuration); nothing launched. With ``QUANTISE_Q_IN_KERNEL`` the quantiser does K and V only and the
    kernel reads ``q`` itself (this very tensor, at every launch). ``after_quantiser``: the kernel is only ever
    launched right after the quantiser (end to end), so ``PROGRAMMATIC_LAUNCH`` applies."""
    in_kernel = quantises_q_in_kernel(problem, quantisation)
    pdl = after_quantiser and PROGRAMMATIC_LAUNCH
    config = fp8_config(problem, quantisation, pdl=pdl, **query_knobs(in_kernel))
    quantiser_config = fp8_quantiser.default_config(problem.head_dim, quantisation, query=not in_kernel)
    fused = FusedQuantiser(q.shape, k.shape, q.dtype, q.device, quantisation, VALUE_LAYOUT, query=not in_kernel,
                           config=dataclasses.replace(quantiser_config, launch_dependents=pdl))  # fmt: skip
    kernel = quantised_launcher(
        config, fused.operands, problem, cache_seqlens=cache_seqlens, query=q if in_kernel else None
    )
    return QuantisedLaunch(fused, kernel)


def _validate(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, cache_seqlens: torch.Tensor | None
) -> Problem:
    return validated_problem(q, k, v, problem, cache_seqlens=cache_seqlens, name="cute/fp8", features=FEATURES)


def _kernel_order(problem: Problem) -> KernelOrder:
    """Key blocks of ``tile_n``, visited from the last to the first."""
    return KernelOrder(block_n=default_config(problem, fp8=True).tile_n, reverse=True)


def _value_layout(problem: Problem) -> ValueLayout:
    return VALUE_LAYOUT


# bind, prepare, prepare_end_to_end and emulate: the FP8 rungs' shared entry (triton_impl/fp8_launch.py).
ENTRY = Fp8Entry(_validate, launch, _kernel_order, _value_layout, DEFAULT_QUANTISATION,
                 launch_end_to_end=functools.partial(launch, after_quantiser=True))  # fmt: skip
bind, prepare, prepare_end_to_end, emulate = ENTRY.bind, ENTRY.prepare, ENTRY.prepare_end_to_end, ENTRY.emulate


def compile_sm90(
    problem: Problem, quantisation: Quantisation = DEFAULT_QUANTISATION, **knobs: Any
) -> list[KernelBinary]:
    """The kernel ``launch`` compiles for ``problem`` (Q quantised in it where ``quantises_q_in_kernel``), for sm_90a;
    ``knobs`` replace fields of that configuration (``quantise_q`` brings its own Q knobs)."""
    in_kernel = knobs.get("quantise_q", quantises_q_in_kernel(problem, quantisation))
    config = fp8_config(problem, quantisation, **{**query_knobs(in_kernel), **knobs})
    return KERNELS.binaries(config, "cute_fp8_attention")


def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    ok, reason = wgmma_supports(
        "cute/fp8", problem, device, "inputs must be fp16 or bf16 (quantised to e4m3 in prepare)"
    )
    if not ok:
        return ok, reason
    return shared_memory_supported("cute/fp8", problem, DEFAULT_QUANTISATION)


def compile_quantiser_sm90(problem: Problem) -> list[KernelBinary]:
    """The fused quantiser this rung launches before its kernel (K and V only where the kernel quantises Q), for
    sm_90a at ``problem``'s shape."""
    return compile_sm90_for(
        problem, DEFAULT_QUANTISATION, VALUE_LAYOUT, not quantises_q_in_kernel(problem, DEFAULT_QUANTISATION)
    )


IMPLEMENTATION = Implementation(
    name="cute/fp8", stack="cute", rung="fp8", prepare=prepare, bind=bind, supports=supports,
    compile_sm90=compile_sm90, compile_input_transform_sm90=compile_quantiser_sm90, runs_on_cpu=False,
    error_rule=FP8_RULE, emulate=emulate, prepare_end_to_end=prepare_end_to_end, source_file=__file__,
    required_ptx=("e4m3 mma", "wgmma.mma_async"), forbidden_ptx=("mma.sync",),
    notes=f"quantisation: {DEFAULT_QUANTISATION.describe()}",
)  # fmt: skip
