"""Rung 2, online softmax on CUDA cores in Triton (counterpart: ``cute_impl/online.py``).

What it adds over ``naive``: one fused kernel and one pass over K and V, with no S in HBM. The naive
rung writes the fp32 score matrix (B·H·Sq·Sk·4 bytes) and reads it four times; here each program
keeps a running row max and row sum for its query rows, so scores live only in registers and HBM
traffic drops to reading Q, K, V and writing O. The products are still broadcast multiplies in
fp32 — deliberately no ``tl.dot`` — so this step isolates the algorithm (online softmax) from the
hardware (tensor cores, the next rung).

Algorithm (one program per BLOCK_M = ROWS_REP · ROWS_LANE query rows of one (batch, head)):
  1. Point at the Q tile; it is read BLOCK_D columns at a time (from L1 after the first key block).
  2. For each BLOCK_N block of keys up to the last one any row of the tile can see (causal tiles
     stop at the diagonal; blocks wholly above it are never loaded):
     a. S = Q Kᵀ · softmax_scale_log2 (scores in the log2 domain, so exp2 needs no extra multiply),
        summed over D one BLOCK_D slice at a time; keys past Sk and, when causal, keys after the
        row are set to -inf.
     b. new_max = max(row_max, rowmax(S)); P = exp2(S - new_max); alpha = exp2(row_max - new_max).
     c. row_sum = alpha · row_sum + rowsum(P); acc = alpha · acc + P V, one key after another.
  3. O = acc / row_sum, stored in the input dtype (rows past Sq are not stored).

Data movement: Q, K and V go HBM → registers through ``ld.global``; every FLOP is an fp32 FMA on
CUDA cores (the PTX holds no ``mma.sync`` or ``wgmma``). Each K/V block is re-read from L2/HBM by
every program of the same head: without tensor cores the FMAs, not that traffic, set the pace.
Shared memory is used only by Triton's layout conversions.

A lesson about the stack: Triton gives no say over register layouts, so the shape of the code
decides the instructions. Written as ``tl.sum(a[:, :, None] * b[None, :, :], axis=1)``, Triton's
combiner turns a 3-D product into ``tl.dot`` (tf32 ``mma.sync``) whenever both outer extents are
≥ 16; summed over the last axis, the sum is spread over a warp (shuffles). The default layout of an
N-D op puts lanes on the last axis, then warps, and leaves the leading axes inside each thread. So
the products here are 4-D, with the summed axis first and the query rows split as (ROWS_REP,
ROWS_LANE) at the two ends: Q Kᵀ is (BLOCK_D, ROWS_REP, BLOCK_N, ROWS_LANE), P V is (BLOCK_N,
ROWS_REP, D, ROWS_LANE). Every sum stays inside a thread, and each thread owns a 2-D tile of both
products (ROWS_REP rows × 2 keys of S, ROWS_REP rows × 16 columns of O at D=128), so a K or V
element it converts from bf16 feeds ROWS_REP FMAs. Q no longer fits in registers next to such a
tile (D · ROWS_REP values), so it is re-read one D-slice at a time; the D-slice loop is a real
loop, not unrolled, or the compiler hoists every slice's loads and spills. Loading K/V or Q as 4-D
pointer tensors instead of 2-D/3-D ones lets the loads' coalesced layout propagate into the
product (D across lanes: shuffles, and spills): keep the expand_dims (``x[:, None]``) form.
How a sum inside a thread is lowered is the compiler's choice too: Triton 3.6 chains ``tl.sum``'s
terms (one FFMA per product), Triton 3.9 adds them as a tree (Triton PR 9220: one FMUL per product
plus FADDs, and more values live). So P V is not a ``tl.sum``: ``_add_pv_by_key`` halves the key
axis, which lies inside each thread, with ``tl.split`` (only a renaming of registers) down to single
keys and adds each key's products into O, one FFMA chain per element of O under either release.

Constraints: fp16 and bf16 on a CUDA GPU (fp32 too under the Triton interpreter); D ∈ {32, 64, 128,
256}; any Sq, Sk ≥ 1; causal (top-left or bottom-right) or not; GQA (K and V read from the query
head's KV head); ``cache_seqlens`` (each sequence's own key length); the LSE, stored after O.

What the measurements taught (the tile study, six spill-free tiles timed on the H200, is in
``docs/perf-log.md``, "Figures moved out of rung docstrings"; current figures in the generated table
of ``docs/ladder.md``): the ladder is monotone here only with the 2-D thread tile. The previous
kernel gave each thread one query row and one key of both products, so every K/V element it
converted from bf16 fed a single FMA, and it ran slower than naive without the mask; the default
tile's key block is about half FFMA. What is left: the Q Kᵀ slice loop (Q and K converted per
slice, plus the barriers of Triton's layout conversions), and nothing prefetches the next K/V block.

Triton releases (the tile table passes through ``common.toolchain.releases.release_configs``): with
P V as a tree, Triton 3.9 spilled the 4×16 tile; as a chain every tile of the table is spill-free
under both releases, and P V's instructions are the same on both. Q Kᵀ's per-slice ``tl.sum``
stays a tree under 3.9 (its partial sums as FFMAs held BLOCK_D times the scores and measured slower
next to the chained P V). Under 3.9 the fastest spill-free tile at D=128 is 2×16 rows, 64 keys and
8-column D-slices, and the rung runs it there (release table). An fp32 ``tl.dot`` (the FMA dot the
naive rung uses) measured slower here on both releases. Figures: ``docs/perf-log.md``, "Triton 3.9
on the early rungs" and "P V as one FFMA chain".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from common.contract.problem import Problem
from common.contract.registry import Runner
from common.toolchain.compile import KernelBinary
from common.toolchain.releases import release_configs
from triton_impl._host import (
    TritonEntry,
    TritonInputs,
    compile_pointer_kernel,
    feature_constexprs,
    ladder_supported,
    pointer_runner,
)


@dataclass(frozen=True)
class TileConfig:
    """One program's tile: BLOCK_M = rows_rep · rows_lane query rows, BLOCK_N keys per step.

    The rows are indexed (rows_rep, rows_lane): Triton spreads lanes over the last axis and leaves
    the first axes in each thread, so a thread owns rows_rep rows of every product and reuses each
    K or V element it converts for rows_rep FMAs. ``block_d`` is the slice of D summed per step of
    Q Kᵀ (Q is re-read from L1 per slice, it does not fit in registers next to a 2-D tile).
    """

    rows_rep: int
    rows_lane: int
    block_n: int
    block_d: int
    num_warps: int

    @property
    def block_m(self) -> int:
        return self.rows_rep * self.rows_lane


# Per head dim, chosen under Triton 3.6; ``release_configs`` swaps in the tiles another Triton
# release runs faster or needs to stay spill-free (``common.toolchain.releases``). D=128 compiles for
# sm_90a with no spills (235 registers under 3.6, two CTAs per SM) and was the fastest spill-free
# tile timed on the H200 under 3.6 (docs/perf-log.md). D=64 sums Q Kᵀ over 8 columns of D per step:
# with 16, Triton 3.6 spilled 16 bytes in the causal build.
CONFIGS: dict[int, TileConfig] = release_configs(
    "triton/online",
    {
        32: TileConfig(4, 16, 16, 8, 4),
        64: TileConfig(4, 16, 16, 8, 4),
        128: TileConfig(4, 16, 16, 16, 4),
        256: TileConfig(2, 16, 16, 16, 4),
    },
)
HEAD_DIMS = tuple(CONFIGS)
# Natural log of 2, read in the kernel: the LSE is kept in log2 units until it is stored.
LN_2 = tl.constexpr(math.log(2.0))


# ----------------------------------------------------------------------------------------------
# Kernel: one pass over K/V with a running max and sum per query row
# ----------------------------------------------------------------------------------------------
@triton.jit
def _add_pv_by_key(acc, p_by_key, v, KEYS: tl.constexpr, ROWS_REP: tl.constexpr, ROWS_LANE: tl.constexpr,
                   HEAD_DIM: tl.constexpr):  # fmt: skip
    """acc (ROWS_REP, D, ROWS_LANE) + P V over KEYS keys, P (KEYS, ROWS_REP, ROWS_LANE) and V (KEYS, D),
    added one key at a time in key order, so each element of O is one FFMA chain. The key axis lies
    inside each thread: halving it with ``tl.split`` (first half, then second) only renames registers."""
    if KEYS == 1:
        acc = acc + p_by_key.reshape(ROWS_REP, ROWS_LANE)[:, None, :] * v.reshape(HEAD_DIM)[None, :, None]
    else:
        halves_p = p_by_key.reshape(2, KEYS // 2, ROWS_REP, ROWS_LANE).permute(1, 2, 3, 0)
        halves_v = v.reshape(2, KEYS // 2, HEAD_DIM).permute(1, 2, 0)
        first_p, second_p = tl.split(halves_p)
        first_v, second_v = tl.split(halves_v)
        acc = _add_pv_by_key(acc, first_p, first_v, KEYS // 2, ROWS_REP, ROWS_LANE, HEAD_DIM)
        acc = _add_pv_by_key(acc, second_p, second_v, KEYS // 2, ROWS_REP, ROWS_LANE, HEAD_DIM)
    return acc


@triton.jit
def _online_kernel(
    Q, K, V, Out, Lse, CacheSeqlens,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om,
    heads, kv_heads, seqlen_q, seqlen_k, softmax_scale_log2,
    CAUSAL: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, HAS_CACHE_SEQLENS: tl.constexpr, RETURN_LSE: tl.constexpr,
    HEAD_DIM: tl.constexpr, ROWS_REP: tl.constexpr, ROWS_LANE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    BLOCK_M: tl.constexpr = ROWS_REP * ROWS_LANE
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

    # Query rows as a (ROWS_REP, ROWS_LANE) grid: row = m_block · BLOCK_M + r · ROWS_LANE + l.
    offs_m = m_block * BLOCK_M + tl.arange(0, ROWS_REP)[:, None] * ROWS_LANE + tl.arange(0, ROWS_LANE)[None, :]
    row_ok = offs_m < seqlen_q
    offs_n = tl.arange(0, BLOCK_N)
    offs_dd = tl.arange(0, BLOCK_D)
    offs_d = tl.arange(0, HEAD_DIM)
    # 1. Pointers to one D-slice of the Q tile, (BLOCK_D, ROWS_REP, ROWS_LANE).
    q_ptrs = q_base + offs_m[None, :, :] * stride_qm + offs_dd[:, None, None]

    # Per query row: (ROWS_REP, ROWS_LANE); O is kept as (ROWS_REP, D, ROWS_LANE).
    row_max = tl.full((ROWS_REP, ROWS_LANE), float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros((ROWS_REP, ROWS_LANE), dtype=tl.float32)
    acc = tl.zeros((ROWS_REP, HEAD_DIM, ROWS_LANE), dtype=tl.float32)

    # 2. Causal: keys past the tile's last row's diagonal are masked for every row, so stop there.
    n_end = tl.minimum(seqlen_k, (m_block + 1) * BLOCK_M + causal_offset) if CAUSAL else seqlen_k
    for n_start in tl.range(0, n_end, BLOCK_N):
        offs_k = n_start + offs_n
        col_ok = offs_k < seqlen_k

        # 2a. S = Q Kᵀ (ROWS_REP, BLOCK_N, ROWS_LANE), BLOCK_D columns of D at a time: the
        # (BLOCK_D, ROWS_REP, BLOCK_N, ROWS_LANE) product summed over its first axis, inside each
        # thread. Then the log2 domain, and -inf for keys past Sk and (causal) keys after the row.
        scores = tl.zeros((ROWS_REP, BLOCK_N, ROWS_LANE), dtype=tl.float32)
        k_ptrs = k_base + offs_k[None, :] * stride_kn + offs_dd[:, None]
        for d_start in tl.range(0, HEAD_DIM, BLOCK_D):
            q_slice = tl.load(q_ptrs + d_start, mask=row_ok[None, :, :], other=0.0).to(tl.float32)
            k_slice = tl.load(k_ptrs + d_start, mask=col_ok[None, :], other=0.0).to(tl.float32)
            scores += tl.sum(q_slice[:, :, None, :] * k_slice[:, None, :, None], axis=0)
        scores = scores * softmax_scale_log2
        visible = col_ok[None, :, None]
        if CAUSAL:
            visible = visible & (offs_k[None, :, None] <= offs_m[:, None, :] + causal_offset)
        scores = tl.where(visible, scores, float("-inf"))

        # 2b. Online softmax along the key axis. Guard: a row that has seen no visible key keeps max
        # -inf; shifting by 0 instead gives P = 0 and alpha = 0 rather than exp2(-inf - -inf) = NaN.
        new_max = tl.maximum(row_max, tl.max(scores, axis=1))
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        p = tl.exp2(scores - shift[:, None, :])
        alpha = tl.exp2(row_max - shift)

        # 2c. Rescale what was accumulated under the old max, then O += P V: the products of the
        # (BLOCK_N, ROWS_REP, D, ROWS_LANE) grid added into O one key after another, inside each thread.
        row_sum = row_sum * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + offs_k[:, None] * stride_vn + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        p_by_key = tl.permute(p, (1, 0, 2))
        acc = _add_pv_by_key(
            acc * alpha[:, None, :], p_by_key, v.to(tl.float32), BLOCK_N, ROWS_REP, ROWS_LANE, HEAD_DIM
        )
        row_max = new_max

    # 3. Normalise once; a row with no visible key (row_sum 0) is written as 0, not 0 / 0.
    inv_sum = tl.where(row_sum > 0.0, 1.0 / row_sum, 0.0)
    out = (acc * inv_sum[:, None, :]).to(Out.dtype.element_ty)
    tl.store(o_base + offs_m[:, None, :] * stride_om + offs_d[None, :, None], out, mask=row_ok[:, None, :])
    if RETURN_LSE:
        # Natural-log LSE (row_max is in log2 units), -inf for a row with no visible key; the LSE is
        # (B, H, Sq) contiguous, so row m of (batch, head) is at batch_head · Sq + m.
        lse = tl.where(row_sum > 0.0, (row_max + tl.log2(row_sum)) * LN_2, float("-inf"))
        tl.store(Lse + batch_head.to(tl.int64) * seqlen_q + offs_m, lse, mask=row_ok)


# ----------------------------------------------------------------------------------------------
# Host: validate, allocate O once, launch
# ----------------------------------------------------------------------------------------------


def _constexprs(config: TileConfig) -> dict[str, int]:
    return {
        "ROWS_REP": config.rows_rep, "ROWS_LANE": config.rows_lane,
        "BLOCK_N": config.block_n, "BLOCK_D": config.block_d,
    }  # fmt: skip


def bind(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, *, cache_seqlens: torch.Tensor | None = None
) -> Runner:
    """Allocate O for validated q, k, v and return ``run()`` launching the fused kernel."""
    config = CONFIGS[problem.head_dim]
    constexprs = {**feature_constexprs(problem), "HEAD_DIM": problem.head_dim, **_constexprs(config)}
    launch_options = {**constexprs, "num_warps": config.num_warps}
    return pointer_runner(_online_kernel, q, k, v, problem, cache_seqlens, config.block_m, launch_options)


# prepare = validate (every Triton feature, these head dims) → bind → warm up.
ENTRY = TritonEntry(TritonInputs("triton/online", HEAD_DIMS), bind)
prepare = ENTRY.prepare


# ----------------------------------------------------------------------------------------------
# Capability check and sm_90a compile path
# ----------------------------------------------------------------------------------------------
def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    return ladder_supported(problem, device, HEAD_DIMS)


def compile_sm90(problem: Problem) -> list[KernelBinary]:
    """The fused kernel compiled for sm_90a at ``problem``'s head dim, dtype and mask."""
    config = CONFIGS[problem.head_dim]
    constexprs = {**feature_constexprs(problem), "HEAD_DIM": problem.head_dim, **_constexprs(config)}
    return [compile_pointer_kernel(_online_kernel, problem, constexprs, num_warps=config.num_warps, num_stages=1)]


IMPLEMENTATION = ENTRY.implementation(
    supports, compile_sm90, forbidden_ptx=("mma.sync", "wgmma.mma_async"), source_file=__file__, default_configs=CONFIGS
)
