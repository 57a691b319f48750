"""Rung ``fp8`` (CuTe DSL): the ``hopper`` kernel on e4m3 operands. Counterpart: ``triton_impl/fp8.py``.

What it adds over ``hopper``
----------------------------
FP8 WGMMA (``wgmma.mma_async ... .e4m3.e4m3``) runs at twice the bf16 rate and halves the bytes of
Q, K and V in HBM and shared memory. The kernel is ``cute_impl/hopper.py``'s ``HopperAttention``
compiled for ``Float8E4M3FN``; what changes is in ``prepare`` and in how P reaches the second GEMM.

Algorithm
---------
1. ``prepare`` (untimed; quickbench reports its time): per-tensor scales ``amax / 448`` for Q, K, V;
   quantise to e4m3.
2. ``prepare`` stores V transposed, (B, H, D, Sk') with Sk' = Sk rounded up to 16 and zero padding:
   FP8 WGMMA reads a shared-memory B operand only K-major, and for O = P V the K dimension is the
   key index, so V must be key-contiguous.
3. Inside each group of 16 keys, V's key order is permuted (``common.fp8.PERMUTED_KEY_ORDER``). The
   m64k32 FP8 A operand wants each lane to hold four *consecutive* k, while the S accumulator gives
   each lane column *pairs* (2t, 2t+1, 2t+8, 2t+9). Renaming registers (``scores_to_operand_a``) plus
   this permutation of V makes the product exact without any cross-lane shuffle.
4. The kernel runs as in ``hopper``; the Q and K descales are folded into ``softmax_scale_log2``
   (``scale * LOG2_E * q_scale * k_scale``) and V's descale multiplies O in the epilogue. P is
   computed as exp2(... + 8), i.e. in [0, 256] instead of [0, 1], so that small probabilities stay
   out of e4m3's subnormal range (the factor cancels in O / row_sum and is removed from the LSE),
   then converted to e4m3 in registers. O is written in bf16; LSE in fp32.
5. Each block's P V is accumulated from zero in its own registers and added to O in fp32
   (``separate_pv``): accumulating all blocks inside the FP8 WGMMA loses precision block after
   block (measurements below).

Data movement
-------------
As ``hopper``: TMA boxes into swizzled shared memory (64 x D Q, tile_n x D K, D x tile_n Vᵀ, all
K-major, one byte per element), WGMMA from shared memory for QKᵀ and from registers (P) for PV,
stmatrix + TMA store for O.

Error
-----
Judged by ``FP8_RULE`` (rel L2 <= 3e-2) against the fp64 reference of the *unquantised* inputs.
e4m3 keeps 3 mantissa bits: round-to-nearest leaves about 2.6 % RMS relative error per element.
O is linear in V and in P, and the scores' error (about 0.04 in scaled units for standard-normal
Q, K) becomes about 4 % noise in P, so with zero-mean V (nothing to average the error against)
the expected rel L2 is about sqrt(2.6² + 2.6² + 4²) ≈ 5 %: above the 3e-2 target, whatever the
kernel does. Inputs whose output has a mean (the harness adds 0.5 to V) stay far below it.

Measured (H200, B=2 H=16 S=8192 D=128 from bf16 inputs; TFLOP/s on visible scores)
----------------------------------------------------------------------------------
* First version (PV accumulated across all blocks in the WGMMA accumulator, P in [0, 1]):
  878 non-causal / 801 causal, but rel L2 grew with the number of key blocks: 7.8e-3 at S=1000,
  5.75e-2 at S=8191 (V offset 0.5) -- about 2.4e-4 lost per accumulating WGMMA, linear in steps,
  the signature of the FP8 tensor-core accumulator's reduced precision.
* Per-block PV accumulator + P offset (this version): 836 non-causal / 786 causal (-5 %), rel L2
  6.1e-3 at S=1000 and every shared GPU test passes (S up to 8191, Sq != Sk, hard inputs). The two
  fixes were measured together, not apart.
* Standard-normal inputs without offset, S=2048: rel L2 5.4e-2 (D=64) and 5.3e-2 (D=128)
  non-causal, 4.8e-2 / 4.7e-2 causal: the 3e-2 target is not met, as the budget above predicts.
  Floor 800 TFLOP/s met, goal 1000 not.
* D=64 (B=4, H=32) with three consumer warpgroups, as ``hopper`` at D=64: 629 / 558 vs 528 / 500
  with two, identical errors (one run, 2026-11-22).
* Persistent CTAs (``hopper``'s tile loop): 819 vs 802 at D=128, 642 vs 626 at D=64. Without
  ping-pong at D=128: 838-839 / 758-764 vs 818-820 / 752 (FP8's GEMMs are too short for the turn
  to pay). compare.py at a35d75f: 857 / 804 (SDPA cuDNN 617 / 555 in the same run); causal is
  persistent since that commit (799 vs 768 with one CTA per tile in one A/B run).

Incoherent processing (``prepare_incoherent``)
----------------------------------------------
Q and K multiplied by a random Hadamard rotation (``common.fp8.random_hadamard``) before quantising:
Q Kᵀ is unchanged and the kernel is the same, but an outlier entry is spread over all D channels
before it is rounded. ``python -m common.fp8_outliers`` measures both on standard-normal inputs and
on inputs with 0.1 % of Q, K entries scaled by 10 (``results/h200/fp8-outliers.md``).

Constraints
-----------
sm_90, fp16/bf16 inputs, head_dim 64 or 128, softmax_scale > 0, any Sq, Sk >= 1, causal.
"""

from __future__ import annotations

import dataclasses

import torch

from common.fp8 import Emulation, KernelOrder, Quantisation, QuantisedOperands, quantise
from common.fp8 import emulate as emulate_quantised
from common.metrics import FP8_RULE
from common.problem import Problem
from common.registry import Implementation, KernelBinary, Runner, warmed_up
from common.validation import kernel_operand, validate_attention_inputs
from cute_impl._hopper_device import LOG2_E
from cute_impl.hopper import (
    DTYPES,
    HEAD_DIMS,
    ROWS_PER_WARPGROUP,
    HopperConfig,
    common_problem_supported,
    compile_config_sm90,
    default_config,
    hopper_device_supported,
    launcher,
)

# Keys per permutation group: one 16-wide half of the 32-wide FP8 k-block.
KEY_GROUP = 16
# Slot s = 4 t + i of a key group (lane t's four consecutive k) holds key 8 (i // 2) + 2 t + i % 2,
# the key whose score lane t holds in accumulator register i of that group.
PERMUTED_KEY_ORDER = tuple(8 * ((slot % 4) // 2) + 2 * (slot // 4) + slot % 2 for slot in range(KEY_GROUP))
# What compare.py and the tests run: the most accurate variant, at a kernel speed within the 5 % the
# issue allows of per-tensor scaling (docs/perf-log.md).
DEFAULT_QUANTISATION = Quantisation(block=True, rotation=True)


def value_operand(v8: torch.Tensor) -> torch.Tensor:
    """(B, H, Sk, D) e4m3 -> (B, H, D, Sk') key-contiguous, zero-padded to Sk' = Sk rounded up to 16,
    keys permuted per group by ``PERMUTED_KEY_ORDER``.

    The padding is real zeros, not out-of-bounds fill: a permuted group can move a key below Sk to a
    slot above it, so kernels must read the whole padded group.
    """
    batch, heads, seqlen_k, head_dim = v8.shape
    padded = -(-seqlen_k // KEY_GROUP) * KEY_GROUP
    order = torch.tensor(PERMUTED_KEY_ORDER, device=v8.device)
    keys = (torch.arange(padded // KEY_GROUP, device=v8.device)[:, None] * KEY_GROUP + order).flatten()
    # e4m3 has no torch kernels for indexing or padding: move the bytes as uint8.
    v_bytes = torch.zeros((batch, heads, padded, head_dim), dtype=torch.uint8, device=v8.device)
    v_bytes[:, :, :seqlen_k] = v8.view(torch.uint8)
    return v_bytes[:, :, keys].transpose(2, 3).contiguous().view(torch.float8_e4m3fn)


def fp8_config(problem: Problem, quantisation: Quantisation) -> HopperConfig:
    """``hopper``'s FP8 configuration, reading block scales when ``quantisation`` has them."""
    config = dataclasses.replace(default_config(problem, fp8=True), block_scales=quantisation.block)
    if quantisation.block and (
        quantisation.q_block_rows != ROWS_PER_WARPGROUP or quantisation.kv_block_rows != config.tile_n
    ):
        raise ValueError(
            f"cute/fp8 block scales must match its tiles ({ROWS_PER_WARPGROUP} Q rows per warpgroup, "
            f"{config.tile_n} keys per block), got {quantisation.q_block_rows} / {quantisation.kv_block_rows}"
        )
    return config


def quantised(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, quantisation: Quantisation) -> QuantisedOperands:
    return quantise(*(kernel_operand(t) for t in (q, k, v)), quantisation)


def quantised_launcher(
    config: HopperConfig, operands: QuantisedOperands, problem: Problem, sm_count: int | None = None
) -> Runner:
    """Steps 1-3: e4m3 bytes of Q, K and permuted Vᵀ, then the ``hopper`` launcher with the scales."""
    q8, k8, vt8 = (t.view(torch.uint8) for t in (operands.q8, operands.k8, value_operand(operands.v8)))
    scales = (operands.q_scale, operands.k_scale, operands.v_scale)
    run = launcher(config, q8, k8, vt8, problem.scale * LOG2_E, 1.0, sm_count=sm_count, scales=scales)
    run.variant = operands.quantisation.name
    return run


def bind(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: Problem,
    quantisation: Quantisation = DEFAULT_QUANTISATION,
) -> Runner:
    """Quantise validated q, k, v (values change per call, so this is per-call work) and return the
    launch-only ``run`` (compiled once per configuration); no launch."""
    return quantised_launcher(fp8_config(problem, quantisation), quantised(q, k, v, quantisation), problem)


def _validate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem) -> Problem:
    return validate_attention_inputs(
        q, k, v, causal=problem.causal, softmax_scale=problem.softmax_scale, dtypes=DTYPES, head_dims=HEAD_DIMS
    )


def prepare(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: Problem,
    quantisation: Quantisation = DEFAULT_QUANTISATION,
) -> Runner:
    """Validate, quantise (``quantisation``: ``common.fp8.VARIANTS``), bind, warm up; run() is the kernel."""
    return warmed_up(bind(q, k, v, _validate(q, k, v, problem), quantisation), q.device)


def prepare_end_to_end(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: Problem,
    quantisation: Quantisation = DEFAULT_QUANTISATION,
) -> Runner:
    """Like ``prepare``, but every run() quantises, rotates and launches: the per-call cost of fp8."""
    checked = _validate(q, k, v, problem)
    prepare(q, k, v, checked, quantisation)

    def run() -> torch.Tensor:
        return bind(q, k, v, checked, quantisation)()

    run.variant = quantisation.name
    return run


def emulate(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: Problem,
    quantisation: Quantisation = DEFAULT_QUANTISATION,
) -> Emulation:
    """The fp64 emulation this rung is judged against: the same quantisation, key blocks of
    ``tile_n`` visited from the last to the first."""
    order = KernelOrder(block_n=default_config(problem, fp8=True).tile_n, reverse=True)
    return emulate_quantised(quantised(q, k, v, quantisation), problem, order)


def compile_sm90(problem: Problem, quantisation: Quantisation = DEFAULT_QUANTISATION) -> list[KernelBinary]:
    return compile_config_sm90(fp8_config(problem, quantisation), "cute_fp8_attention")


def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    ok, reason = hopper_device_supported(device)
    if not ok:
        return ok, reason
    if problem.dtype not in DTYPES:
        return False, f"inputs must be fp16 or bf16 (quantised to e4m3 in prepare), got {problem.dtype_name}"
    return common_problem_supported(problem)


IMPLEMENTATION = Implementation(
    name="cute/fp8",
    stack="cute",
    rung="fp8",
    prepare=prepare,
    bind=bind,
    supports=supports,
    compile_sm90=compile_sm90,
    error_rule=FP8_RULE,
    emulate=emulate,
    prepare_end_to_end=prepare_end_to_end,
    runs_on_cpu=False,
    required_ptx=("e4m3 mma", "wgmma.mma_async"),
    forbidden_ptx=("mma.sync",),
    source_file=__file__,
    notes=f"quantisation: {DEFAULT_QUANTISATION.describe()}",
)
