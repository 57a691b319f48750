"""FlashAttention-4's step order for the Gluon ``hopper`` backward's dK/dV kernel (``backward.py``,
``BackwardTiles(late_dv=True)``; counterpart: ``cute_impl/backward/hopper.py``'s ``late_dv``): what lets a
consumer step take 128 query rows at D=64 without spills.

Why: at D=64 every product of the 64-row step is an m64n64 wgmma, two of them with both operands from shared
memory (Sᵀ = K Qᵀ, dPᵀ = V dOᵀ): per step and consumer 48 KB of operand reads for 512 tensor-core cycles, with the
ring's TMA writes ~110 B a cycle of the SM's 128. With 128 query rows Sᵀ and dPᵀ are m64n128 (a B tile twice as
wide for the same A) and dV, dK run k=128: 80 KB for 1024 cycles (~94 B a cycle), and the step's fixed costs
(barriers, waits, the slot's release) are paid once per 128 rows. cute/hopper's D=64 default steps 128 rows
(435.5 → 490.9 TFLOP/s there). But a consumer thread then holds Sᵀ and dPᵀ (64 fp32 each) beside dK and dV
(32 each), and LSE₂ and D take 32 registers each: the plain step's order spills (304 bytes under Triton 3.6).

What it changes in ``_dkdv_step``:
  1. dPᵀ's accumulator starts at −D (``scores_minus_rows``): the wgmma leaves dPᵀ − D, so D's registers die
     when dPᵀ is issued instead of living under the exp2;
  2. LSE₂ is read from its ring slot once Sᵀ has retired (the early read, unused, is dropped);
  3. dV += Pᵀ dO is issued after dSᵀ = Pᵀ ∘ (dPᵀ − D), beside dK += dSᵀ Q, Pᵀ's 16-bit copy made only then:
     no 16-bit Pᵀ beside fp32 Pᵀ and dPᵀ (FlashAttention-4's order); the step waits for both at its end.
The exp2 no longer runs under dV's product, only under the other consumer's: two consumers per CTA keep the
tensor cores fed. Sᵀ, the mask and the products' operands are unchanged.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma

from triton_impl.gluon.backward_rows import step_row


@gluon.jit
def scores_minus_rows(a_smem, b_tile, rows, s_layout: gl.constexpr):
    """Issue A Bᵀ − ``rows`` (one value per column, in ``s_layout``'s column slice) asynchronously: the
    accumulator starts at −rows, so the subtraction takes no registers once the wgmma is in flight."""
    ROWS: gl.constexpr = a_smem.shape[0]
    COLUMNS: gl.constexpr = b_tile.shape[0]
    seed = gl.zeros([ROWS, COLUMNS], gl.float32, s_layout) - rows[None, :]
    return warpgroup_mma(a_smem, b_tile.permute((1, 0)), seed, use_acc=True, is_async=True)


@gluon.jit
def dp_t_minus_delta(v_smem, do_tile, Delta, m_start, batch_head, seqlen_q, step, constants: gl.constexpr):
    """Issue dPᵀ − D = V dOᵀ − D for the query rows from ``m_start`` of ``batch_head`` (step 1 above); call once
    the slot's dO (and with it, TMA_ROWS, its D) has landed."""
    BLOCK_M: gl.constexpr = do_tile.shape[0]
    offs_m = m_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, constants.s_layout))
    row_base = batch_head.to(gl.int64) * seqlen_q
    delta = step_row(Delta, row_base, offs_m, seqlen_q, step, constants.NUM_STAGES, constants.TMA_ROWS, 0.0)
    return scores_minus_rows(v_smem, do_tile, delta, constants.s_layout)
