"""Backward rung 3, FlashAttention-2 tiled (forward counterpart: ``triton_impl/tiled.py``).

What it adds over ``naive``: neither P nor dS touches HBM. The naive backward writes both score-sized
matrices and reads them back twice; here one program owns a block of keys, keeps its K and V tiles and
its dK and dV accumulators on chip, and walks the query blocks, recomputing P from Q, K and the saved
LSE (one exp per score: cheaper than storing it) and using each tile of P and dS right where it is
made. The extra HBM traffic is O(Sq·D) per key block instead of O(Sq·Sk), and all five products of a
step run on tensor cores (fp16/bf16 operands, fp32 accumulation).

The key block is the rows of every product: the kernel computes Sᵀ = K Qᵀ (BLOCK_N × BLOCK_M) rather
than S = Q Kᵀ, so that Sᵀ, dPᵀ = V dOᵀ, dV += Pᵀ dO and dK += dSᵀ Q all have BLOCK_N = 128 rows, which
Hopper's warpgroup MMA (``wgmma``, 64 rows per warpgroup) takes whole; with S = Q Kᵀ and a 32-row query
block they would fall back to ``mma.sync``. (The Triton tutorial's backward is laid out the same way.)

dQ is the catch: a query row's gradient sums over every key block, and key blocks live in different
programs. Two strategies, chosen per variant (``BackwardConfig.dq``), both measured by
``python -m bench.backward --candidates``:
  - ``atomic`` (FlashAttention-2/3): each program adds its share dS K into an fp32 dQ buffer with
    relaxed atomics (fp32, as an fp16/bf16 running sum would lose the small shares), and a last kernel
    scales and casts it. Five products per tile, but the atomics cost L2 traffic (BLOCK_M × D floats
    per tile) and the sum's order varies between runs;
  - ``separate`` (the Triton tutorial): a second kernel with one program per query block walks the
    key blocks and recomputes S and dP (seven products per tile instead of five), with dQ in registers:
    no atomics, deterministic, every product with BLOCK_M = 128 rows.

Algorithm (three launches):
  1. ``_preprocess_kernel`` (one program per ROWS_BLOCK_M query rows of one (batch, head)):
     D = rowsum(dO ∘ O) − dLSE and LSE₂ = LSE · LOG2_E (+inf where a row sees no key, so that P = 0
     there rather than NaN) into (B·H·Sq) fp32; with atomics, the rows' dQ accumulator zeroed.
  2. ``_dkdv_kernel`` (one program per BLOCK_N keys of one (batch, KV head)):
     a. Load the K and V tiles once; dK = dV = 0 in registers.
     b. For every query head of the KV head's group (GQA sums there: no atomics for dK and dV), for
        every query block whose rows can see these keys (causal: earlier rows are skipped), first the
        blocks that need a mask (the causal diagonal; every block when this key block holds the
        sequence tail), then the rest without one:
        - Sᵀ = K Qᵀ; Pᵀ = exp2(Sᵀ · softmax_scale_log2 − LSE₂), masked entries 0.
        - dV += Pᵀ dO (P in the input dtype); dPᵀ = V dOᵀ; dSᵀ = Pᵀ ∘ (dPᵀ − D); dK += dSᵀ Q.
        - ``atomic``: dQ_accum[rows] += dS K (relaxed fp32 atomics).
     c. dK ·= softmax_scale; store dK and dV in the input dtype.
  3. ``atomic``: ``_dq_convert_kernel``, dQ = softmax_scale · dQ_accum in the input dtype.
     ``separate``: ``_dq_kernel`` (one program per DQ_BLOCK_M query rows of one (batch, head); the
     causal diagonal's programs, which have the most keys, launch first): for every key block the rows
     can see, unmasked blocks first and then the diagonal and the sequence tail, S = Q Kᵀ, P, dP = dO Vᵀ,
     dS = P ∘ (dP − D), dQ += dS K; dQ ·= softmax_scale, stored in the input dtype.

Data movement: Q, dO, LSE₂ and D go HBM → shared memory once per (key block, query block), pipelined
over ``num_stages`` buffers; K and V once per program. Tiles come either by TMA (``tma=True``: one
``cp.async.bulk.tensor`` per tile from a 4-D (B, H, S, D) descriptor whose per-head bounds zero-fill the
rows past the sequence; Hopper and later) or by masked pointer loads (``cp.async``, any GPU). TMA is not
only fewer instructions: a pointer tile keeps a BLOCK_M × D tensor of addresses and masks live in
registers, next to the 128 registers per thread that dK and dV take at D=128, and spills. On sm_90a
(Triton 3.8) every product with 128 rows compiles to ``wgmma`` (m64nBLOCK_Mk16, two warpgroups); the
dQ share of ``atomic`` (BLOCK_M rows) and its atomics (``red.global.add`` of fp32) go through L2. At D=256
the key block is 64 rows (dK and dV take 128 registers per thread over eight warps, as at D=128 with 128
keys): one wgmma row tile, the two warpgroups splitting the head dim of dK += dSᵀ Q and dV += Pᵀ dO.

Variants (:class:`BackwardConfig`): tiles, warps, stages, TMA or pointers, and the dQ strategy, with
candidates per head dim in :data:`CANDIDATES` (the first is the default; on a GPU before sm_90 the
first without TMA): :data:`ALL_CANDIDATES` less those the installed Triton release spills
(:data:`TMA_SPILLS`: at D=256 under 3.9, pointer tiles only). ``bench/backward.py --candidates`` checks
and times them all on one GPU; D=256's order is static reasoning, not yet timed.

Constraints: fp16 and bf16 on a CUDA GPU, fp32 under the Triton interpreter (bf16 refused there, as by
the forward rungs); D ∈ {64, 128, 256}; any Sq, Sk ≥ 1; causal (top-left or bottom-right) or not; GQA and
MQA. ``cache_seqlens`` and paged caches are refused. Every candidate compiles for sm_90a without
spills (``tests/test_backward.py``); which is fastest is the GPU's to say.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from common.contract.problem import Problem
from common.contract.registry import Backward, Launch
from common.contract.validation import kernel_operand
from common.toolchain.compile import KernelBinary
from common.toolchain.releases import triton_release
from triton_impl._device import batch_and_head, query_heads
from triton_impl.backward._device import softmax_delta
from triton_impl.backward._host import backward_supported, compile_launches, head_strides, run_launches

# softmax_scale_log2 = softmax_scale · LOG2_E, so the kernels use exp2; the preprocess scales the LSE by it.
LOG2_E = tl.constexpr(math.log2(math.e))
# Rows per program of the preprocess and of the dQ conversion.
ROWS_BLOCK_M = 64
# TMA copies exist from sm_90 (Hopper) on.
TMA_MIN_MAJOR = 9
DQ_STRATEGIES = ("atomic", "separate")


@dataclass(frozen=True)
class BackwardConfig:
    """The tiles and launch options of one variant: ``block_n`` keys per dK/dV program walking
    ``block_m`` query rows per step; dQ by ``dq`` (``atomic`` or ``separate``); the separate dQ
    kernel's ``dq_block_m`` query rows per program walking ``dq_block_n`` keys per step."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    dq: str
    dq_block_m: int = 128
    dq_block_n: int = 32
    dq_num_warps: int = 4
    dq_num_stages: int = 2
    # Q, K, V and dO tiles by TMA (4-D descriptors, Hopper) rather than by pointers (cp.async).
    tma: bool = False

    def __post_init__(self) -> None:
        if self.dq not in DQ_STRATEGIES:
            raise ValueError(f"dq must be one of {DQ_STRATEGIES}, got {self.dq!r}")

    @property
    def label(self) -> str:
        loads = "tma" if self.tma else "ptr"
        dkdv = f"{loads} dkdv {self.block_n}x{self.block_m} w{self.num_warps} s{self.num_stages}"
        if self.dq == "atomic":
            return f"{dkdv}, dq atomic"
        return f"{dkdv}, dq {self.dq_block_m}x{self.dq_block_n} w{self.dq_num_warps} s{self.dq_num_stages}"


# Candidates per head dim, the default first; each compiles for sm_90a without spills under Triton 3.6, 3.7,
# 3.8 and (those CANDIDATES keeps) 3.9 (the static test compiles them all, causal and not). dK and dV
# (2 · BLOCK_N × D fp32) live in registers: 128 per thread over eight warps at D=128, which leaves room for
# the rest only when the Q and dO tiles come by TMA (pointer loads keep a BLOCK_M × D tensor of addresses
# live: 32-row pointer tiles spill at D=128, 16-row ones do not). The one-warpgroup 64-key variants fit two
# CTAs per SM (about 29K registers and 66-81 KB of shared memory each), so one CTA's softmax can overlap
# the other's MMAs.
# The first of D=64 and D=128 is the default: the fastest at issue #40's anchors on an H200 (2026-11-29,
# bench/backward.py --candidates, results/h200/backward-candidates/: D=128 376 TFLOP/s at P1, 348 causal,
# 287 at B=8 S=2048 causal; D=64 332 at B=4 H=32 S=8192); dQ by atomics was the slowest at every shape.
# At D=128 the atomic variants (TMA tiles 230 at P1 there, pointer tiles 199) are left out: beside dK and
# dV in registers the dQ tile's atomics spill under Triton 3.9 (TMA) and 3.7 (pointers); the committed
# run keeps their numbers, and D=64 keeps atomic variants for the comparison.
# D=256 has no measurement: its order is static reasoning. 64 keys over eight warps hold dK and dV in 128
# registers per thread, as 128 keys do at D=128 (the two warpgroups split D; 128 keys need 16 warps, capped
# at 128 registers, and spill 520-624 bytes; 64 keys on one warpgroup spill 1 KB). At 217-255 registers one
# dK/dV CTA fits an SM, so its order is query rows per step (32 before 16) and stages (3 before 2: 165 KB of
# shared memory); the default's dQ pass (64 × 16, four warps, 184-226 registers, 98 KB) fits two CTAs per
# SM, 64 × 32 (131 KB) and 128 × 32 (197 KB) one. Atomics are left out (16 query rows: 255 registers,
# Triton 3.8; 32 rows spill). Under Triton 3.9 every TMA dK/dV kernel at D=256 spills (24-152 bytes per
# thread here: ``TMA_SPILLS``), so CANDIDATES keeps only the 32-key pointer variant there (``mma.sync``;
# 160-248 registers under every release), the default on GPUs before sm_90 too.
ALL_CANDIDATES: dict[int, tuple[BackwardConfig, ...]] = {
    64: (
        BackwardConfig(64, 64, 4, 3, "separate", 128, 64, 8, 2, tma=True),
        BackwardConfig(64, 128, 8, 3, "separate", 128, 64, 8, 2, tma=True),
        BackwardConfig(32, 128, 8, 3, "separate", 128, 64, 8, 2, tma=True),
        BackwardConfig(64, 128, 8, 2, "atomic", tma=True),
        BackwardConfig(32, 128, 8, 3, "atomic", tma=True),
        BackwardConfig(32, 128, 8, 3, "separate", 128, 32, 4, 2),
    ),
    128: (
        BackwardConfig(32, 128, 8, 3, "separate", 128, 64, 8, 3, tma=True),
        BackwardConfig(32, 128, 8, 2, "separate", 128, 64, 8, 2, tma=True),
        BackwardConfig(32, 64, 4, 3, "separate", 128, 64, 8, 2, tma=True),
        BackwardConfig(16, 128, 8, 2, "separate", 64, 64, 4, 2),
    ),
    256: (
        BackwardConfig(32, 64, 8, 3, "separate", 64, 16, 4, 2, tma=True),
        BackwardConfig(32, 64, 8, 2, "separate", 64, 32, 4, 2, tma=True),
        BackwardConfig(16, 64, 8, 3, "separate", 128, 32, 8, 2, tma=True),
        BackwardConfig(32, 32, 8, 2, "separate", 32, 32, 4, 2),
    ),
}
# Per Triton release, the head dims whose TMA variants spill there (left out of its CANDIDATES).
TMA_SPILLS: dict[str, tuple[int, ...]] = {"3.9": (256,)}
CANDIDATES: dict[int, tuple[BackwardConfig, ...]] = {
    head_dim: tuple(c for c in configs if not (c.tma and head_dim in TMA_SPILLS.get(triton_release(), ())))
    for head_dim, configs in ALL_CANDIDATES.items()
}
HEAD_DIMS = tuple(CANDIDATES)


def default_config(head_dim: int, device: torch.device | None = None) -> BackwardConfig:
    """The head dim's first candidate; on a CUDA GPU without TMA (before sm_90), its first without TMA."""
    no_tma = (
        device is not None and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] < TMA_MIN_MAJOR
    )
    return next(config for config in CANDIDATES[head_dim] if not (no_tma and config.tma))


# ----------------------------------------------------------------------------------------------
# 1. Preprocess: D = rowsum(dO ∘ O) − dLSE, LSE₂ = LSE · LOG2_E, dQ accumulator zeroed
# ----------------------------------------------------------------------------------------------
@triton.jit
def _preprocess_kernel(
    Out, DOut, Lse, DLse, Delta, LseLog2, DQAccum,
    stride_ob, stride_oh, stride_om,
    stride_dob, stride_doh, stride_dom,
    heads, seqlen_q,
    HAS_DLSE: tl.constexpr, ZERO_DQ: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
    ROW_ALIGN: tl.constexpr,
):  # fmt: skip
    m_block = tl.program_id(0)
    batch_head = tl.program_id(1)
    # rows: the rows of the (B, H, Sq) LSE, D, LSE₂ and the (B, H, Sq, D) dQ accumulator, all contiguous.
    delta, rows, row_ok = softmax_delta(
        Out, DOut, DLse, (stride_ob, stride_oh, stride_om), (stride_dob, stride_doh, stride_dom),
        batch_head, heads, m_block, seqlen_q, tl.float32, HAS_DLSE, HEAD_DIM, BLOCK_M,
    )  # fmt: skip
    # D and LSE₂ rows: each head's starts ROW_ALIGN-aligned (a TMA source: gluon's ``tma_rows``), or packed.
    stat_rows = rows
    if ROW_ALIGN > 1:
        stat_rows = rows + batch_head.to(tl.int64) * (tl.cdiv(seqlen_q, ROW_ALIGN) * ROW_ALIGN - seqlen_q)
    tl.store(Delta + stat_rows, delta, mask=row_ok)
    # Guard: a row that sees no key has LSE -inf; +inf makes its P = exp2(S − inf) = 0, not NaN.
    lse = tl.load(Lse + rows, mask=row_ok, other=0.0)
    tl.store(LseLog2 + stat_rows, tl.where(lse == float("-inf"), float("inf"), lse * LOG2_E), mask=row_ok)
    if ZERO_DQ:
        offs_d = tl.arange(0, HEAD_DIM)
        tl.store(DQAccum + rows[:, None] * HEAD_DIM + offs_d[None, :], tl.zeros((BLOCK_M, HEAD_DIM), tl.float32),
                 mask=row_ok[:, None])  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Tile loads: by TMA from a (B, H, S, D) descriptor, or by pointers
# ----------------------------------------------------------------------------------------------
@triton.jit
def _load_rows(X, strides, batch, head, start, seqlen, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, TMA: tl.constexpr):
    """Rows [start, start + ROWS) of one (batch, head) of X, rows past ``seqlen`` as zeros: one TMA copy
    (the descriptor's per-head bounds zero-fill them) or masked pointer loads (``cp.async``); ``strides``
    are X's (batch, head, row) strides, unused by TMA."""
    if TMA:
        tile = X.load([tl.cast(batch, tl.int32), tl.cast(head, tl.int32), start, 0]).reshape(ROWS, HEAD_DIM)
    else:
        rows = start + tl.arange(0, ROWS)
        offsets = batch * strides[0] + head * strides[1] + rows[:, None] * strides[2] + tl.arange(0, HEAD_DIM)[None, :]
        tile = tl.load(X + offsets, mask=(rows < seqlen)[:, None], other=0.0)
    return tile


# ----------------------------------------------------------------------------------------------
# 2. dK and dV: one key block per program, the query blocks walked, dQ shares by atomics if asked
# ----------------------------------------------------------------------------------------------
@triton.jit
def _dkdv_steps(
    dk, dv, k, v, offs_n, m_lo, m_hi, q_and_do, batch, head, row_base, LseLog2, Delta, DQAccum,
    seqlen_q, seqlen_k, causal_offset, softmax_scale_log2,
    MASK: tl.constexpr, CAUSAL: tl.constexpr, DQ_ATOMIC: tl.constexpr, TMA: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    """dK, dV (and dQ shares) over the query blocks starting in [m_lo, m_hi) of one query head, whose
    rows start at ``row_base`` in the (B·H·Sq) vectors; ``q_and_do`` = (Q, its strides, dO, its strides).
    ``MASK``: the causal diagonal and the key tail get P = 0 (the rows' sequence tail needs no mask:
    their Q and dO load as 0 and their LSE₂ as +inf, so their P is 0)."""
    Q, q_strides, DOut, do_strides = q_and_do
    offs_d = tl.arange(0, HEAD_DIM)
    for m_start in tl.range(m_lo, m_hi, BLOCK_M):
        rows = m_start + tl.arange(0, BLOCK_M)
        row_ok = rows < seqlen_q
        q = _load_rows(Q, q_strides, batch, head, m_start, seqlen_q, BLOCK_M, HEAD_DIM, TMA)
        lse_log2 = tl.load(LseLog2 + row_base + rows, mask=row_ok, other=float("inf"))
        # Sᵀ = K Qᵀ (keys as rows: BLOCK_N-row products); Pᵀ recomputed from the saved LSE.
        p_t = tl.exp2(tl.dot(k, tl.trans(q)) * softmax_scale_log2 - lse_log2[None, :])
        if MASK:
            visible = offs_n[:, None] < seqlen_k
            if CAUSAL:
                visible = visible & (offs_n[:, None] <= rows[None, :] + causal_offset)
            p_t = tl.where(visible, p_t, 0.0)
        d_o = _load_rows(DOut, do_strides, batch, head, m_start, seqlen_q, BLOCK_M, HEAD_DIM, TMA)
        delta = tl.load(Delta + row_base + rows, mask=row_ok, other=0.0)
        # dV += Pᵀ dO; dPᵀ = V dOᵀ; dSᵀ = Pᵀ ∘ (dPᵀ − D); dK += dSᵀ Q (softmax_scale applied once, at the end).
        dv = tl.dot(p_t.to(d_o.dtype), d_o, dv)
        d_s_t = (p_t * (tl.dot(v, tl.trans(d_o)) - delta[None, :])).to(q.dtype)
        dk = tl.dot(d_s_t, q, dk)
        if DQ_ATOMIC:
            dq_ptrs = DQAccum + (row_base + rows)[:, None] * HEAD_DIM + offs_d[None, :]
            tl.atomic_add(dq_ptrs, tl.dot(tl.trans(d_s_t), k), mask=row_ok[:, None], sem="relaxed")
    return dk, dv


@triton.jit
def _dkdv_kernel(
    Q, K, V, DOut, LseLog2, Delta, DQAccum, DK, DV,
    q_strides, k_strides, v_strides, do_strides,
    heads, kv_heads, seqlen_q, seqlen_k, softmax_scale, softmax_scale_log2,
    CAUSAL: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, DQ_ATOMIC: tl.constexpr, TMA: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    n_block = tl.program_id(0)
    batch_kv_head = tl.program_id(1)
    batch, kv_head = batch_and_head(batch_kv_head, kv_heads)
    group = heads // kv_heads
    # Row i sees keys j <= i + causal_offset: 0 top-left, Sk − Sq bottom-right.
    causal_offset = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0
    n_start = n_block * BLOCK_N
    offs_n = n_start + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    col_ok = offs_n < seqlen_k

    # 2a. This program's K and V tiles, loaded once; dK and dV accumulate in registers.
    k = _load_rows(K, k_strides, batch, kv_head, n_start, seqlen_k, BLOCK_N, HEAD_DIM, TMA)
    v = _load_rows(V, v_strides, batch, kv_head, n_start, seqlen_k, BLOCK_N, HEAD_DIM, TMA)
    dk = tl.zeros((BLOCK_N, HEAD_DIM), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, HEAD_DIM), dtype=tl.float32)

    # 2b. Query blocks: causal skips rows i < n_start − causal_offset (they see none of these keys) and
    # masks those up to the diagonal's last row; a key block holding the key tail masks every block.
    m_lo = 0
    m_unmasked = 0
    if CAUSAL:
        m_lo = tl.maximum(n_start - causal_offset, 0) // BLOCK_M * BLOCK_M
        diagonal_end = tl.maximum(n_start + BLOCK_N - 1 - causal_offset, 0)
        m_unmasked = tl.minimum(tl.cdiv(diagonal_end, BLOCK_M) * BLOCK_M, seqlen_q)
        m_unmasked = tl.maximum(m_unmasked, m_lo)
    m_unmasked = tl.where(n_start + BLOCK_N > seqlen_k, seqlen_q, m_unmasked)
    q_and_do = (Q, q_strides, DOut, do_strides)
    # GQA: the query heads kv_head · group ... kv_head · group + group − 1 read this KV head.
    for head in range(kv_head * group, kv_head * group + group):
        row_base = (batch * heads + head) * seqlen_q
        # The masked query blocks (the diagonal, or all of them at the key tail), then the others.
        dk, dv = _dkdv_steps(
            dk, dv, k, v, offs_n, m_lo, m_unmasked, q_and_do, batch, head, row_base, LseLog2, Delta, DQAccum,
            seqlen_q, seqlen_k, causal_offset, softmax_scale_log2,
            MASK=True, CAUSAL=CAUSAL, DQ_ATOMIC=DQ_ATOMIC, TMA=TMA, HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M,
        )  # fmt: skip
        dk, dv = _dkdv_steps(
            dk, dv, k, v, offs_n, m_unmasked, seqlen_q, q_and_do, batch, head, row_base, LseLog2, Delta, DQAccum,
            seqlen_q, seqlen_k, causal_offset, softmax_scale_log2,
            MASK=False, CAUSAL=CAUSAL, DQ_ATOMIC=DQ_ATOMIC, TMA=TMA, HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M,
        )  # fmt: skip

    # 2c. dK carries the softmax scale of S = softmax_scale · Q Kᵀ; dV none.
    dk *= softmax_scale
    dk_ptrs = DK + (batch_kv_head.to(tl.int64) * seqlen_k + offs_n)[:, None] * HEAD_DIM + offs_d[None, :]
    dv_ptrs = DV + (batch_kv_head.to(tl.int64) * seqlen_k + offs_n)[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(dk_ptrs, dk.to(DK.dtype.element_ty), mask=col_ok[:, None])
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


# ----------------------------------------------------------------------------------------------
# 3a. atomic: dQ = softmax_scale · dQ_accum, in the input dtype
# ----------------------------------------------------------------------------------------------
@triton.jit
def _dq_convert_kernel(DQAccum, DQ, seqlen_q, softmax_scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    m_block = tl.program_id(0)
    batch_head = tl.program_id(1)
    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seqlen_q
    # dQ_accum and dQ are both (B, H, Sq, D) contiguous.
    offsets = (batch_head.to(tl.int64) * seqlen_q + offs_m)[:, None] * HEAD_DIM + offs_d[None, :]
    dq = tl.load(DQAccum + offsets, mask=row_ok[:, None], other=0.0) * softmax_scale
    tl.store(DQ + offsets, dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])


# ----------------------------------------------------------------------------------------------
# 3b. separate: one query block per program, the key blocks walked, dQ in registers
# ----------------------------------------------------------------------------------------------
@triton.jit
def _dq_steps(
    dq, q, d_o, lse_log2, delta, rows, n_lo, n_hi, k_and_v, batch, kv_head,
    seqlen_k, causal_offset, softmax_scale_log2,
    MASK: tl.constexpr, CAUSAL: tl.constexpr, TMA: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """dQ over the key blocks starting in [n_lo, n_hi); ``k_and_v`` = (K, its strides, V, its strides).
    ``MASK``: the causal diagonal and the key tail."""
    K, k_strides, V, v_strides = k_and_v
    for n_start in tl.range(n_lo, n_hi, BLOCK_N):
        k = _load_rows(K, k_strides, batch, kv_head, n_start, seqlen_k, BLOCK_N, HEAD_DIM, TMA)
        v = _load_rows(V, v_strides, batch, kv_head, n_start, seqlen_k, BLOCK_N, HEAD_DIM, TMA)
        p = tl.exp2(tl.dot(q, tl.trans(k)) * softmax_scale_log2 - lse_log2[:, None])
        if MASK:
            offs_n = n_start + tl.arange(0, BLOCK_N)
            visible = offs_n[None, :] < seqlen_k
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= rows[:, None] + causal_offset)
            p = tl.where(visible, p, 0.0)
        # dP = dO Vᵀ; dS = P ∘ (dP − D); dQ += dS K (softmax_scale applied once, at the end).
        d_s = (p * (tl.dot(d_o, tl.trans(v)) - delta[:, None])).to(q.dtype)
        dq = tl.dot(d_s, k, dq)
    return dq


@triton.jit
def _dq_kernel(
    Q, K, V, DOut, LseLog2, Delta, DQ,
    q_strides, k_strides, v_strides, do_strides,
    heads, kv_heads, seqlen_q, seqlen_k, softmax_scale, softmax_scale_log2,
    CAUSAL: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, TMA: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # Causal: the last query blocks see the most keys; launching them first evens out the tail.
    m_block = tl.num_programs(0) - 1 - tl.program_id(0) if CAUSAL else tl.program_id(0)
    batch_head = tl.program_id(1)
    batch, head, kv_head = query_heads(batch_head, heads, kv_heads)
    causal_offset = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0
    m_start = m_block * BLOCK_M
    rows = m_start + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = rows < seqlen_q
    row_base = batch_head.to(tl.int64) * seqlen_q

    q = _load_rows(Q, q_strides, batch, head, m_start, seqlen_q, BLOCK_M, HEAD_DIM, TMA)
    d_o = _load_rows(DOut, do_strides, batch, head, m_start, seqlen_q, BLOCK_M, HEAD_DIM, TMA)
    lse_log2 = tl.load(LseLog2 + row_base + rows, mask=row_ok, other=float("inf"))
    delta = tl.load(Delta + row_base + rows, mask=row_ok, other=0.0)
    dq = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)

    # Keys: every key block before the first that some row cannot fully see needs no mask; then the
    # causal diagonal (up to the last row's last key) and the key tail are masked.
    n_hi = seqlen_k
    n_unmasked = seqlen_k // BLOCK_N * BLOCK_N
    if CAUSAL:
        n_hi = tl.minimum(tl.maximum(m_start + BLOCK_M + causal_offset, 0), seqlen_k)
        n_unmasked = tl.minimum(tl.maximum(m_start + causal_offset + 1, 0) // BLOCK_N * BLOCK_N, n_unmasked)
    k_and_v = (K, k_strides, V, v_strides)
    dq = _dq_steps(
        dq, q, d_o, lse_log2, delta, rows, 0, n_unmasked, k_and_v, batch, kv_head,
        seqlen_k, causal_offset, softmax_scale_log2,
        MASK=False, CAUSAL=CAUSAL, TMA=TMA, HEAD_DIM=HEAD_DIM, BLOCK_N=BLOCK_N,
    )  # fmt: skip
    dq = _dq_steps(
        dq, q, d_o, lse_log2, delta, rows, n_unmasked, n_hi, k_and_v, batch, kv_head,
        seqlen_k, causal_offset, softmax_scale_log2,
        MASK=True, CAUSAL=CAUSAL, TMA=TMA, HEAD_DIM=HEAD_DIM, BLOCK_N=BLOCK_N,
    )  # fmt: skip

    dq *= softmax_scale
    # dQ is (B, H, Sq, D) contiguous.
    tl.store(DQ + (row_base + rows)[:, None] * HEAD_DIM + offs_d[None, :], dq.to(DQ.dtype.element_ty),
             mask=row_ok[:, None])  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Host: allocate D, LSE₂, dQ (and its accumulator) and the gradients, list the launches
# ----------------------------------------------------------------------------------------------
def _tma_operand(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """A 4-D TMA descriptor over (B, H, S, D), one (batch, head) box of ``rows`` × D per copy, so every
    (batch, head) keeps its own bounds. ``kernel_operand`` has aligned the base and the strides to 16
    bytes; a broadcast dim (stride 0, as autograd's dO of a sum can be) is materialised for TMA."""
    if any(stride == 0 and size > 1 for stride, size in zip(t.stride(), t.shape, strict=True)):
        t = t.contiguous()
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, t.shape[-1]])


def preprocess_launch(
    out: torch.Tensor,
    d_out: torch.Tensor,
    lse: torch.Tensor,
    d_lse: torch.Tensor | None,
    problem: Problem,
    dq_accum: torch.Tensor | None = None,
    row_align: int = 1,
) -> tuple[Launch, torch.Tensor, torch.Tensor]:
    """The preprocess launch (step 1) and the fp32 (B·H·Sq) D and LSE₂ it writes; ``dq_accum`` (atomic
    dQ) is zeroed by it too. ``out`` and ``d_out`` must be kernel operands (``kernel_operand``).
    ``gluon/backward/hopper`` launches it as well; ``row_align`` > 1 (its ``tma_rows``): each head's rows
    of D and LSE₂ start at a multiple of ``row_align`` floats (B·H·Sq rounded up per head; never read there)."""
    batch, heads, seqlen_q = problem.batch, problem.heads, problem.seqlen_q
    lse = lse.contiguous()
    stat_rows = batch * heads * -(-seqlen_q // row_align) * row_align
    delta, lse_log2 = (torch.empty((stat_rows,), dtype=torch.float32, device=out.device) for _ in "01")
    # Without d_lse the kernel never reads its argument (HAS_DLSE False): pass the LSE in its place;
    # without an accumulator (ZERO_DQ False), D in its.
    d_lse_arg = d_lse.contiguous() if d_lse is not None else lse
    accum_arg = delta if dq_accum is None else dq_accum
    launch = (
        _preprocess_kernel, (triton.cdiv(seqlen_q, ROWS_BLOCK_M), batch * heads),
        (
            out, d_out, lse, d_lse_arg, delta, lse_log2, accum_arg, *head_strides(out), *head_strides(d_out),
            heads, seqlen_q,
        ),
        {"HAS_DLSE": d_lse is not None, "ZERO_DQ": dq_accum is not None, "HEAD_DIM": problem.head_dim,
         "BLOCK_M": ROWS_BLOCK_M, "ROW_ALIGN": row_align},
    )  # fmt: skip
    return launch, delta, lse_log2


def _launches(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, d_out: torch.Tensor,
    problem: Problem, d_lse: torch.Tensor | None, config: BackwardConfig | None = None,
) -> tuple[list[Launch], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:  # fmt: skip
    """The three launches and the (dq, dk, dv) they write; buffers are allocated on the inputs' device."""
    config = config or default_config(problem.head_dim, q.device)
    atomic = config.dq == "atomic"
    q, k, v, out, d_out = (kernel_operand(t) for t in (q, k, v, out, d_out))
    batch, heads, seqlen_q, seqlen_k = problem.batch, problem.heads, problem.seqlen_q, problem.seqlen_k
    dq_accum = torch.empty(q.shape, dtype=torch.float32, device=q.device) if atomic else None
    preprocess, delta, lse_log2 = preprocess_launch(out, d_out, lse, d_lse, problem, dq_accum)
    # Without atomics the kernels never touch the accumulator (DQ_ATOMIC False): D stands in for it.
    dq_accum = delta if dq_accum is None else dq_accum
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    rows_grid = (triton.cdiv(seqlen_q, ROWS_BLOCK_M), batch * heads)
    rows_options = {"HEAD_DIM": problem.head_dim, "BLOCK_M": ROWS_BLOCK_M}
    strides = tuple(head_strides(t) for t in (q, k, v, d_out))
    sizes = (heads, problem.kv_heads, seqlen_q, seqlen_k, problem.scale, problem.scale * LOG2_E.value)
    common = {
        "CAUSAL": problem.causal, "BOTTOM_RIGHT": problem.bottom_right, "TMA": config.tma,
        "HEAD_DIM": problem.head_dim,
    }  # fmt: skip

    def tiles(rows_q: int, rows_k: int) -> tuple:
        """q, k, v and dO as the kernels read them: TMA descriptors of the given box rows, or the tensors."""
        if not config.tma:
            return q, k, v, d_out
        return tuple(_tma_operand(t, rows) for t, rows in ((q, rows_q), (k, rows_k), (v, rows_k), (d_out, rows_q)))

    q_in, k_in, v_in, do_in = tiles(config.block_m, config.block_n)
    launches = [
        preprocess,
        (
            _dkdv_kernel, (triton.cdiv(seqlen_k, config.block_n), batch * problem.kv_heads),
            (q_in, k_in, v_in, do_in, lse_log2, delta, dq_accum, dk, dv, *strides, *sizes),
            {
                **common, "DQ_ATOMIC": atomic, "BLOCK_M": config.block_m, "BLOCK_N": config.block_n,
                "num_warps": config.num_warps, "num_stages": config.num_stages,
            },
        ),
    ]  # fmt: skip
    if atomic:
        launches.append((_dq_convert_kernel, rows_grid, (dq_accum, dq, seqlen_q, problem.scale), rows_options))
    else:
        q_in, k_in, v_in, do_in = tiles(config.dq_block_m, config.dq_block_n)
        launches.append((
            _dq_kernel, (triton.cdiv(seqlen_q, config.dq_block_m), batch * heads),
            (q_in, k_in, v_in, do_in, lse_log2, delta, dq, *strides, *sizes),
            {
                **common, "BLOCK_M": config.dq_block_m, "BLOCK_N": config.dq_block_n,
                "num_warps": config.dq_num_warps, "num_stages": config.dq_num_stages,
            },
        ))  # fmt: skip
    return launches, (dq, dk, dv)


def tiled_gradients(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, d_out: torch.Tensor,
    problem: Problem, *, d_lse: torch.Tensor | None = None, config: BackwardConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """The rung's ``Gradients`` (``common.contract.registry``: dq, dk, dv from O, the LSE, dO and dLSE);
    ``config`` replaces the head dim's default variant (``CANDIDATES``)."""
    return run_launches(_launches, q, k, v, out, lse, d_out, problem, d_lse, config=config)


def compile_sm90(problem: Problem, config: BackwardConfig | None = None) -> list[KernelBinary]:
    """The three kernels compiled for sm_90a as ``problem``'s launches build them (meta tensors: no GPU)."""
    return compile_launches(_launches, problem, config=config)


# ----------------------------------------------------------------------------------------------
# Capability check
# ----------------------------------------------------------------------------------------------
def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    """Device, dtype (bf16 refused under the interpreter), head dim and the features (no
    ``cache_seqlens``, no paged cache)."""
    return backward_supported(BACKWARD_NAME, problem, device, HEAD_DIMS)


BACKWARD_NAME = "triton/backward/tiled"
BACKWARD = Backward(BACKWARD_NAME, tiled_gradients, supports, compile_sm90, runs_on_cpu=True, source_file=__file__)
