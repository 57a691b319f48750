"""cute/naive — attention as three plain SIMT kernels (counterpart: ``triton_impl/naive.py``).

What it is
----------
The first step of the ladder: the textbook definition, one kernel per line of it, with every
intermediate in HBM. Nothing is fused, no tile is reused from shared memory and no tensor core is
used, so each later rung can be read as "this, minus one bottleneck".

Algorithm (three launches; the numbers match the kernels below)
0. Each kernel first finds what its (batch, head) reads, as ``triton_impl/naive.py`` does: GQA's
   ``kv_head = head // (heads // kv_heads)`` (K and V are indexed by it, never repeated), the
   sequence's key length ``seqlen_k_seq`` (its ``cache_seqlens`` entry clamped to [0, Sk] in a padded
   cache, else Sk) and ``causal_offset`` (``seqlen_k_seq - Sq`` aligned bottom-right, else 0).
1. ``scores_kernel``: S = softmax_scale_log2 · Q Kᵀ into an fp32 buffer of shape (B, H, Sq, Sk), one
   thread per score, a dot product over D with fp32 FMAs. Entries row i may not see are set to
   ``-inf``: keys j >= seqlen_k_seq and, causal, keys j > i + causal_offset. S is kept in base-2 units
   (``softmax_scale_log2 = softmax_scale * LOG2_E``) so the softmax can use ``exp2``, the instruction
   the hardware has.
2. ``softmax_kernel``: row-wise softmax in place, one warp per row: (a) row max, (b) P = exp2(S - max)
   and the row sum, (c) P /= sum. The lanes stride along the row so every pass reads HBM coalesced,
   and the warp combines its partial max and sum with butterfly shuffles. A row whose every key is
   masked has max ``-inf``; it uses 0 instead, so it gets P = 0 rather than NaN. With ``return_lse``,
   lane 0 writes lse = (max + log2(sum)) · ln 2 (natural log; -inf for a row that sees no key).
3. ``pv_kernel``: O = P V over the sequence's ``seqlen_k_seq`` keys (P is 0 past them), one thread per
   output element, fp32 accumulation, written in the input dtype.

Data movement
-------------
Everything is HBM/L2 → registers → HBM with ``ld.global``/``st.global``; the caches are the only
reuse. The scores kernel reads Q and K rows 16 bytes at a time (``ld.global.v4``; ``head_view``
tells the compiler the strides are multiples of 8 elements, which ``kernel_operand`` guarantees),
because the 32 lanes of a warp read 32 different K rows. S is written once, read and written twice
by the softmax and read once by PV. No shared memory, no ``mma``, no ``cp.async``.

Backward (``common.attention`` with inputs that require grad): ``cute_impl/backward/naive.py`` (D 64
and 128), from this rung's O and LSE.

Constraints: fp16/bf16, head_dim in {32, 64, 128, 256}, any Sq, Sk ≥ 1, sm_80 or newer. Every problem
feature (``FEATURES``): GQA/MQA (``kv_heads`` dividing ``heads``), causal aligned top-left (SDPA) or
bottom-right (KV cache), ``cache_seqlens`` ((B,) int32, contiguous, ``prepare``/``bind`` take it as
``cache_seqlens=``) and ``return_lse`` (``run()`` returns (O, lse), lse (B, H, Sq) fp32). The fp32
S buffer must fit in free device memory; the capability check refuses with the bytes it needs
otherwise. batch·heads ≤ 65535 (it is a grid dimension).

What the measurements taught
----------------------------
Figures are in the generated table of ``docs/ladder.md``; the measurements behind these lessons are
in ``docs/perf-log.md`` ("Figures moved out of rung docstrings").

* Causal takes as long as non-causal: every score is computed, then masked.
* The softmax, the only kernel that streams the S buffer, is a small part of the time. The two
  GEMM-shaped kernels dominate because nothing is tiled: each score re-reads a K row, and each
  output element walks a whole column of V and a row of P, all through L2. Reuse through on-chip
  memory, not the S round trip alone, is what the online rung buys.
* Loading K one 16-bit element at a time made every warp load 32 separate requests; 128-bit loads
  were worth several times the speed.
"""

from __future__ import annotations

import math
from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32, const_expr

from common.contract.capability import FEATURES, check_common
from common.contract.problem import Problem
from cute_impl._host import (
    CUTE_DTYPES,
    CompiledKernels,
    Launch,
    ProblemConfig,
    RungHost,
    cache_seqlens_tensor,
    fake_cache_seqlens,
    fake_stream,
    fake_tensor,
    generic_view,
)
from cute_impl.backward import naive as naive_backward

LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)
SUPPORTED_HEAD_DIMS = (32, 64, 128, 256)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
MIN_COMPUTE_CAPABILITY = (8, 0)
# CUDA grid limit on gridDim.y and gridDim.z.
MAX_GRID_YZ = 65535
WARP_SIZE = 32
# Elements per global vector load in the scores kernel (8 x 16-bit = 128 bits).
GMEM_VEC = 8
# validation.kernel_operand guarantees 16-byte aligned strides: 8 elements of 16 bits.
STRIDE_DIVISIBILITY = 8


class NaiveAttention:
    """Three launches: scores to HBM, softmax in place, P V."""

    def __init__(self, config: ProblemConfig) -> None:
        self.head_dim = config.head_dim
        self.causal = config.causal
        # Problem features, compile time: the causal alignment, per-sequence key lengths, the LSE.
        self.bottom_right = config.bottom_right
        self.has_cache_seqlens = config.has_cache_seqlens
        self.return_lse = config.return_lse
        self.scores_threads = 128
        self.softmax_rows_per_cta = 4
        # The largest CTA of the three kernels (the P V kernel has one thread per column of O).
        self.threads_per_cta = max(self.scores_threads, self.softmax_rows_per_cta * WARP_SIZE, self.head_dim)

    @cute.jit
    def __call__(
        self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mS: cute.Tensor, mO: cute.Tensor,
        mLse: cute.Tensor | None, mCacheSeqlens: cute.Tensor | None, softmax_scale_log2: Float32, stream: cuda.CUstream,
    ) -> None:  # fmt: skip
        """q, o (B, H, Sq, D), k, v (B, Hkv, Sk, D), s (B, H, Sq, Sk) fp32; ``mLse`` (B, H, Sq) fp32, None
        without ``return_lse``; ``mCacheSeqlens`` the (B,) int32 key lengths, None without them."""
        mCacheSeqlens = generic_view(mCacheSeqlens)  # read through a generic pointer (``_host.generic_view``)
        batch_heads = mQ.shape[0] * mQ.shape[1]
        seqlen_q, seqlen_k = mQ.shape[2], mK.shape[2]
        self.scores_kernel(mQ, mK, mS, mCacheSeqlens, softmax_scale_log2).launch(
            grid=[seqlen_q, cute.ceil_div(seqlen_k, self.scores_threads), batch_heads],
            block=[self.scores_threads, 1, 1],
            stream=stream,
        )
        self.softmax_kernel(mS, mLse).launch(
            grid=[cute.ceil_div(seqlen_q, self.softmax_rows_per_cta), batch_heads, 1],
            block=[self.softmax_rows_per_cta * WARP_SIZE, 1, 1],
            stream=stream,
        )
        self.pv_kernel(mS, mV, mO, mCacheSeqlens).launch(
            grid=[seqlen_q, batch_heads, 1],
            block=[self.head_dim, 1, 1],
            stream=stream,
        )

    @cute.jit
    def head_view(self, mX: cute.Tensor, batch: Int32, head: Int32) -> cute.Tensor:
        """(seqlen, D) view of one head whose strides are known to be multiples of 8 elements."""
        batch_stride, head_stride, row_stride = (cute.assume(s, divby=STRIDE_DIVISIBILITY) for s in mX.stride[:3])
        head_start = mX.iterator + batch * batch_stride + head * head_stride
        return cute.make_tensor(head_start, cute.make_layout((mX.shape[2], self.head_dim), stride=(row_stride, 1)))

    @cute.jit
    def sequence_seqlen_k(self, mCacheSeqlens: cute.Tensor | None, batch: Int32, seqlen_k: Int32) -> Int32:
        """This sequence's keys: its own length in a padded cache (clamped to [0, Sk]), else Sk."""
        seqlen_k_seq = seqlen_k
        if const_expr(self.has_cache_seqlens):
            seqlen_k_seq = cutlass.min(cutlass.max(mCacheSeqlens[batch], 0), seqlen_k)
        return seqlen_k_seq

    # ---- 1. S = softmax_scale_log2 · Q Kᵀ, one thread per (row, col) ----
    @cute.kernel
    def scores_kernel(
        self, mQ: cute.Tensor, mK: cute.Tensor, mS: cute.Tensor, mCacheSeqlens: cute.Tensor | None,
        softmax_scale_log2: Float32,
    ) -> None:  # fmt: skip
        tidx, _, _ = cute.arch.thread_idx()
        row, col_block, batch_head = cute.arch.block_idx()
        heads, kv_heads = mQ.shape[1], mK.shape[1]
        batch, head = batch_head // heads, batch_head % heads
        # GQA: this query head reads KV head head // (heads // kv_heads).
        kv_head = head // (heads // kv_heads)
        col = col_block * self.scores_threads + tidx
        gQ = self.head_view(mQ, batch, head)
        gK = self.head_view(mK, batch, kv_head)
        # Row i sees keys j < seqlen_k_seq and, causal, j <= i + causal_offset: 0 top-left, the
        # sequence's Sk - Sq bottom-right.
        seqlen_k_seq = self.sequence_seqlen_k(mCacheSeqlens, batch, mK.shape[2])
        causal_offset = 0
        if const_expr(self.bottom_right):
            causal_offset = seqlen_k_seq - mQ.shape[2]
        # The 32 lanes of a warp read 32 different K rows; 128-bit loads make that 8x fewer requests.
        rQ = cute.make_rmem_tensor((1, GMEM_VEC), mQ.element_type)
        rK = cute.make_rmem_tensor((1, GMEM_VEC), mK.element_type)
        if col < mK.shape[2]:
            dot = Float32(0.0)
            for chunk in cutlass.range(self.head_dim // GMEM_VEC, unroll=2):
                cute.autovec_copy(cute.local_tile(gQ, (1, GMEM_VEC), (row, chunk)), rQ)
                cute.autovec_copy(cute.local_tile(gK, (1, GMEM_VEC), (col, chunk)), rK)
                for e in cutlass.range_constexpr(GMEM_VEC):
                    dot += rQ[0, e].to(Float32) * rK[0, e].to(Float32)
            score = dot * softmax_scale_log2
            if col >= seqlen_k_seq:
                score = -Float32.inf
            # const_expr is resolved while tracing; the inner test runs on the GPU, so they stay apart.
            if const_expr(self.causal):  # noqa: SIM102
                if col > row + causal_offset:
                    score = -Float32.inf
            mS[batch, head, row, col] = score

    # ---- 2. softmax in place, one warp per row ----
    @cute.kernel
    def softmax_kernel(self, mS: cute.Tensor, mLse: cute.Tensor | None) -> None:
        row_block, batch_head, _ = cute.arch.block_idx()
        lane = cute.arch.lane_idx()
        row = row_block * self.softmax_rows_per_cta + cute.arch.warp_idx()
        batch, head = batch_head // mS.shape[1], batch_head % mS.shape[1]
        seqlen_k = mS.shape[3]
        if row < mS.shape[2]:
            # (a) row max
            row_max = -Float32.inf
            for col in cutlass.range(lane, seqlen_k, WARP_SIZE):
                row_max = cute.arch.fmax(row_max, mS[batch, head, row, col])
            row_max = cute.arch.warp_reduction_max(row_max)
            # Guard: a row with every key masked has max -inf; subtracting 0 instead keeps exp2 at 0, not NaN.
            if row_max == -Float32.inf:
                row_max = Float32(0.0)
            # (b) P = exp2(S - max), row sum
            row_sum = Float32(0.0)
            for col in cutlass.range(lane, seqlen_k, WARP_SIZE):
                p = cute.math.exp2(mS[batch, head, row, col] - row_max, fastmath=True)
                mS[batch, head, row, col] = p
                row_sum += p
            row_sum = cute.arch.warp_reduction_sum(row_sum)
            if const_expr(self.return_lse):  # noqa: SIM102
                # S is in log2 units: lse = ln(sum exp(scaled S)) = (max + log2(sum)) · ln 2, -inf for a
                # row that sees no key (sum 0). The reductions left every lane with max and sum.
                if lane == 0:
                    lse = Float32(-Float32.inf)
                    if row_sum > 0.0:
                        lse = (row_max + cute.math.log2(row_sum, fastmath=False)) * LN_2
                    mLse[batch, head, row] = lse
            # (c) normalise
            inv_sum = Float32(0.0)
            if row_sum > 0.0:
                inv_sum = 1.0 / row_sum
            for col in cutlass.range(lane, seqlen_k, WARP_SIZE):
                mS[batch, head, row, col] = mS[batch, head, row, col] * inv_sum

    # ---- 3. O = P V, one thread per output element ----
    @cute.kernel
    def pv_kernel(self, mP: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mCacheSeqlens: cute.Tensor | None) -> None:
        d, _, _ = cute.arch.thread_idx()
        row, batch_head, _ = cute.arch.block_idx()
        heads, kv_heads = mO.shape[1], mV.shape[1]
        batch, head = batch_head // heads, batch_head % heads
        kv_head = head // (heads // kv_heads)
        # P is 0 past the sequence's keys: the loop stops there (and never reads a padded cache's rows).
        seqlen_k_seq = self.sequence_seqlen_k(mCacheSeqlens, batch, mV.shape[2])
        acc = Float32(0.0)
        for col in cutlass.range(seqlen_k_seq, unroll=4):
            acc += mP[batch, head, row, col] * mV[batch, kv_head, col, d].to(Float32)
        mO[batch, head, row, d] = acc.to(mO.element_type)


# ---------------------------------------------------------------------------------------------
# Host side: validate, compile once per configuration, allocate, launch.
# ---------------------------------------------------------------------------------------------


def fake_arguments(config: ProblemConfig) -> tuple[Any, ...]:
    """The launcher's arguments without data, as :func:`plan_launch` passes them: q, k, v, the fp32
    scores, O, the LSE and the key lengths (None when the problem has none), softmax_scale_log2 (its
    value does not enter the code) and the stream."""
    element = CUTE_DTYPES[config.dtype]
    tensors = [fake_tensor(element, 4) for _ in range(3)] + [fake_tensor(Float32, 4), fake_tensor(element, 4)]
    lse = fake_tensor(Float32, 3) if config.return_lse else None
    lengths = fake_cache_seqlens() if config.has_cache_seqlens else None
    return (*tensors, lse, lengths, Float32(1.0), fake_stream())


def plan_launch(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, *, cache_seqlens: torch.Tensor | None = None
) -> Launch:
    """Allocate S (fp32, B·H·Sq·Sk), O (and the LSE) for validated q, k, v; ``run()`` returns O, or
    (O, lse) when the problem returns the LSE."""
    batch, heads, seqlen_q, seqlen_k = problem.batch, problem.heads, problem.seqlen_q, problem.seqlen_k
    scores = torch.empty((batch, heads, seqlen_q, seqlen_k), dtype=torch.float32, device=q.device)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q.device) if problem.return_lse else None
    # None when the problem returns no LSE or has no per-sequence lengths: compiled out of the kernels.
    lengths = None if cache_seqlens is None else cache_seqlens_tensor(cache_seqlens)
    arguments = (q, k, v, scores, out, lse, lengths, problem.scale * LOG2_E)
    return Launch(ProblemConfig.of(problem), arguments, out if lse is None else (out, lse))


# The host entry points: validate (head dims, every feature) → plan (the compile key: dtype, head dim
# and the features; shapes and strides are dynamic, so one compilation serves every size) → bind.
HOST = RungHost(
    "cute/naive",
    CompiledKernels(NaiveAttention, fake_arguments),
    plan=ProblemConfig.of,
    plan_launch=plan_launch,
    head_dims=SUPPORTED_HEAD_DIMS,
)
prepare, bind, compile_sm90 = HOST.prepare, HOST.bind, HOST.compile_sm90


def score_buffer_fits(problem: Problem, free_bytes: int) -> tuple[bool, str]:
    """Whether the fp32 S buffer (B·H·Sq·Sk·4 bytes) fits in ``free_bytes`` of device memory."""
    needed = problem.score_buffer_bytes
    if needed > free_bytes:
        return False, (
            f"the fp32 score buffer needs {needed:,} bytes (B·H·Sq·Sk·4) but only {free_bytes:,} bytes "
            "of device memory are free"
        )
    return True, ""


def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    """The capability check: a CUDA device of sm_80+, fp16/bf16, a supported head_dim, S fits."""
    ok, reason = check_common(
        "cute/naive", problem, device,
        dtypes=SUPPORTED_DTYPES, head_dims=SUPPORTED_HEAD_DIMS, min_capability=MIN_COMPUTE_CAPABILITY,
        features=FEATURES,
    )  # fmt: skip
    if not ok:
        return ok, reason
    if problem.batch * problem.heads > MAX_GRID_YZ:
        return False, f"batch * heads must be <= {MAX_GRID_YZ} (CUDA grid limit), got {problem.batch * problem.heads}"
    free_bytes, _ = torch.cuda.mem_get_info(device)
    return score_buffer_fits(problem, free_bytes)


IMPLEMENTATION = HOST.implementation(
    supports=supports,
    forbidden_ptx=("mma.sync", "wgmma.mma_async"),
    source_file=__file__,
    backward=naive_backward.BACKWARD,
)
