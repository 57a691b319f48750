"""Rung 3, FlashAttention-2 tiled on tensor cores in Triton (counterpart: ``cute_impl/tiled.py``).

What it adds over ``online``: the two products run on tensor cores. The online rung spends one fp32
FMA per multiply-add on CUDA cores; here S = Q Kᵀ and O += P V are ``tl.dot`` on fp16/bf16 operands
with fp32 accumulation, which Triton lowers to warpgroup MMAs on sm_90a. The algorithm is the same
one-pass online softmax; only the engine under the products changes, on bigger tiles (64 or 128
query rows; one warpgroup MMA covers 64) because a tensor-core tile is large. P is cast to the
input dtype before P V, as in FlashAttention-2. One pipeline stage (``num_stages=1``): each K/V
block is loaded and then used, with no overlap of loads and math — the next rung's lesson.

Algorithm (one program per BLOCK_M query rows of one (batch, head)):
  1. Load the Q tile (BLOCK_M × D) once.
  2. For each BLOCK_N block of keys up to the last one any row of the tile can see (causal tiles
     stop at the diagonal; blocks wholly above it are never loaded):
     a. S = tl.dot(Q, Kᵀ) · softmax_scale_log2; keys past Sk and, when causal, keys after the row
        are set to -inf (every block is masked here; the pipelined rung splits that off).
     b. new_max = max(row_max, rowmax(S)); P = exp2(S - new_max); alpha = exp2(row_max - new_max).
     c. row_sum = alpha · row_sum + rowsum(P); acc = alpha · acc + tl.dot(P in the input dtype, V).
  3. O = acc / row_sum, stored in the input dtype (rows past Sq are not stored).

Data movement: Q, K and V go HBM → registers with ``ld.global`` (K read as Kᵀ, D × BLOCK_N), then
into shared memory for the MMA operands; S and the O accumulator live in registers. The MMA
instruction is a lesson about the stack: for ``tl.dot`` on sm_90a Triton 3.6 emits
``wgmma.mma_async`` (Hopper warpgroup MMA, operands in shared memory, fenced and waited on right
away), not the Ampere-style ``mma.sync`` a CUDA programmer might expect from "FA2".

Constraints: fp16 and bf16 on a CUDA GPU (fp32 under the Triton interpreter only, which mishandles
bf16 ``tl.dot``); D ∈ {32, 64, 128, 256}; any Sq, Sk ≥ 1; causal (top-left or bottom-right) or not; GQA
(K and V read from the query head's KV head); ``cache_seqlens``; the LSE, stored after O. Backward
(``common.attention`` with inputs that require grad): ``triton_impl/backward/tiled.py``.

What the measurements taught (figures in the generated table of ``docs/ladder.md``, history in
``docs/perf-log.md``): moving the two products onto tensor cores is worth more than an order of
magnitude over the online rung, all of it from the engine, not the algorithm. Without pipelining the
warps stall on every K/V load, and every causal block pays for the mask.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from common.contract.problem import Problem
from common.contract.registry import Runner
from common.toolchain.compile import KernelBinary
from triton_impl._host import (
    TritonEntry,
    TritonInputs,
    compile_pointer_kernel,
    feature_constexprs,
    ladder_supported,
    pointer_runner,
)
from triton_impl.backward import tiled as tiled_backward


class Blocks(NamedTuple):
    """The tiles and warps of one head dim."""

    block_m: int
    block_n: int
    num_warps: int


# Per head dim: (BLOCK_M, BLOCK_N, num_warps). Fixed on purpose (tuning is the next rung's job);
# each compiles for sm_90a with no spills under both tested Triton releases. D=128 takes 64 x 64
# with one warpgroup, the fastest of three tiles timed on the H200 under both releases (perf log,
# "Triton 3.9 on the early rungs").
BLOCKS = {32: Blocks(128, 64, 4), 64: Blocks(128, 64, 4), 128: Blocks(64, 64, 4), 256: Blocks(64, 32, 4)}
HEAD_DIMS = tuple(BLOCKS)
# Natural log of 2, read in the kernel: the LSE is kept in log2 units until it is stored.
LN_2 = tl.constexpr(math.log(2.0))
NUM_STAGES = 1


# ----------------------------------------------------------------------------------------------
# Kernel: FA2 forward, one masked step per K/V block
# ----------------------------------------------------------------------------------------------
@triton.jit
def _tiled_kernel(
    Q, K, V, Out, Lse, CacheSeqlens,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om,
    heads, kv_heads, seqlen_q, seqlen_k, softmax_scale_log2,
    CAUSAL: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, HAS_CACHE_SEQLENS: tl.constexpr, RETURN_LSE: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    m_block = tl.program_id(0)
    batch_head = tl.program_id(1)
    batch = (batch_head // heads).to(tl.int64)
    head = (batch_head % heads).to(tl.int64)
    # GQA: this query head reads KV head head // (heads // kv_heads).
    kv_head = head // (heads // kv_heads)
    q_base = Q + batch * stride_qb + head * stride_qh
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh
    o_base = Out + batch * stride_ob + head * stride_oh
    # This sequence's keys: its own length in a padded cache (clamped to [0, Sk]), else Sk. Row i
    # sees keys j <= i + causal_offset: 0 top-left, the sequence's Sk - Sq bottom-right.
    if HAS_CACHE_SEQLENS:
        seqlen_k = tl.minimum(tl.maximum(tl.load(CacheSeqlens + batch), 0), seqlen_k)
    causal_offset = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seqlen_q

    # 1. The Q tile, loaded once.
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :], mask=row_ok[:, None], other=0.0)

    row_max = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)

    # 2. Causal: keys past the tile's last row's diagonal are masked for every row, so stop there.
    n_end = tl.minimum(seqlen_k, (m_block + 1) * BLOCK_M + causal_offset) if CAUSAL else seqlen_k
    for n_start in tl.range(0, n_end, BLOCK_N):
        offs_k = n_start + offs_n
        col_ok = offs_k < seqlen_k
        k_t = tl.load(k_base + offs_k[None, :] * stride_kn + offs_d[:, None], mask=col_ok[None, :], other=0.0)
        v = tl.load(v_base + offs_k[:, None] * stride_vn + offs_d[None, :], mask=col_ok[:, None], other=0.0)

        # 2a. S = Q Kᵀ on tensor cores, in the log2 domain, then the sequence and causal masks.
        scores = tl.dot(q, k_t) * softmax_scale_log2
        visible = col_ok[None, :]
        if CAUSAL:
            visible = visible & (offs_k[None, :] <= offs_m[:, None] + causal_offset)
        scores = tl.where(visible, scores, float("-inf"))

        # 2b. Online softmax. Guard: a row that has seen no visible key keeps max -inf; shifting by
        # 0 instead gives P = 0 and alpha = 0 rather than exp2(-inf - -inf) = NaN.
        new_max = tl.maximum(row_max, tl.max(scores, axis=1))
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        p = tl.exp2(scores - shift[:, None])
        alpha = tl.exp2(row_max - shift)

        # 2c. Rescale, then O += P V on tensor cores with P in the input dtype.
        row_sum = row_sum * alpha + tl.sum(p, axis=1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        row_max = new_max

    # 3. Normalise once; a row with no visible key (row_sum 0) is written as 0, not 0 / 0.
    inv_sum = tl.where(row_sum > 0.0, 1.0 / row_sum, 0.0)
    out = acc * inv_sum[:, None]
    tl.store(o_base + offs_m[:, None] * stride_om + offs_d[None, :], out.to(Out.dtype.element_ty), mask=row_ok[:, None])
    if RETURN_LSE:
        # Natural-log LSE (row_max is in log2 units), -inf for a row with no visible key; the LSE is
        # (B, H, Sq) contiguous, so row m of (batch, head) is at batch_head · Sq + m.
        lse = tl.where(row_sum > 0.0, (row_max + tl.log2(row_sum)) * LN_2, float("-inf"))
        tl.store(Lse + batch_head.to(tl.int64) * seqlen_q + offs_m, lse, mask=row_ok)


# ----------------------------------------------------------------------------------------------
# Host: validate, allocate O once, launch
# ----------------------------------------------------------------------------------------------


def bind(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, *, cache_seqlens: torch.Tensor | None = None
) -> Runner:
    """Allocate O for validated q, k, v and return ``run()`` launching the FA2 kernel."""
    block_m, block_n, num_warps = BLOCKS[problem.head_dim]
    constexprs = {**feature_constexprs(problem), "HEAD_DIM": problem.head_dim, "BLOCK_M": block_m, "BLOCK_N": block_n}
    launch_options = {**constexprs, "num_warps": num_warps, "num_stages": NUM_STAGES}
    return pointer_runner(_tiled_kernel, q, k, v, problem, cache_seqlens, block_m, launch_options)


# prepare = validate (every Triton feature, these head dims) → bind → warm up.
ENTRY = TritonEntry(TritonInputs("triton/tiled", HEAD_DIMS), bind)
prepare = ENTRY.prepare


# ----------------------------------------------------------------------------------------------
# Capability check and sm_90a compile path
# ----------------------------------------------------------------------------------------------
def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    return ladder_supported(problem, device, HEAD_DIMS)


def compile_sm90(problem: Problem) -> list[KernelBinary]:
    """The FA2 kernel compiled for sm_90a at ``problem``'s head dim, dtype and mask."""
    block_m, block_n, num_warps = BLOCKS[problem.head_dim]
    constexprs = {**feature_constexprs(problem), "HEAD_DIM": problem.head_dim, "BLOCK_M": block_m, "BLOCK_N": block_n}
    return [compile_pointer_kernel(_tiled_kernel, problem, constexprs, num_warps=num_warps, num_stages=NUM_STAGES)]


IMPLEMENTATION = ENTRY.implementation(
    supports,
    compile_sm90,
    required_ptx=("wgmma.mma_async",),
    source_file=__file__,
    default_configs=BLOCKS,
    backward=tiled_backward.BACKWARD,
)
