"""cute/online — online softmax on CUDA cores (counterpart: ``triton_impl/online.py``).

What it adds over ``cute/naive``
--------------------------------
The naive rung writes the whole fp32 score matrix S (B·H·Sq·Sk·4 bytes, 8.6 GB at S=8192) to HBM,
and worse, reuses nothing: every score re-reads a K row and every output element a V column from L2
(its two GEMM-shaped kernels take almost all of its time; ``docs/perf-log.md``). This rung fuses the
three steps into one kernel that never materialises S and reuses every tile it loads: a CTA owns
``tile_m`` query rows, keeps them in shared memory, and streams K and V through shared memory
``tile_n`` keys at a time. The softmax is computed *online*: each row keeps a running maximum and a
running sum, and the output accumulator is rescaled whenever the maximum grows, so one pass over the
keys suffices. HBM traffic drops to reading Q, K, V and writing O; the limiter becomes the fp32 FMA
rate of the CUDA cores.

Algorithm (one CTA = ``tile_m`` rows of one (batch, head); the numbers match the code's sections)
0. As in ``triton_impl/online.py``: GQA's ``kv_head = head // (heads // kv_heads)`` (K and V are read
   at it, never repeated), this sequence's ``seqlen_k`` (its ``cache_seqlens`` entry clamped to
   [0, Sk] in a padded cache, else Sk) and ``causal_offset`` (``seqlen_k - Sq`` aligned bottom-right,
   else 0): row i sees keys j < seqlen_k and, causal, j <= i + causal_offset.
1. Load the Q tile to shared memory once, converted to fp32 and multiplied by
   ``softmax_scale_log2 = softmax_scale * LOG2_E`` so that scores come out in base-2 units.
2. For each block of ``tile_n`` keys (causal: only blocks left of the diagonal; none for a tile whose
   rows see no key):
   a. load the K tile to shared memory (fp32);
   b. S = Q Kᵀ for this thread's 8x4 sub-tile with fp32 FMAs;
   c. mask keys past ``seqlen_k`` and, if causal, keys right of the diagonal (j > i + causal_offset)
      to ``-inf``;
   d. online softmax: the tile's row maximum is reduced across the 16 lanes that share a row with
      warp shuffles; ``correction = exp2(row_max_old - row_max_new)`` rescales the running row sum
      and the O accumulator; ``P = exp2(S - row_max_new)`` (a row with no visible key yet uses 0 as
      its maximum, so ``-inf - -inf`` never produces NaN);
   e. write P to shared memory, then load the V tile into the buffer K used;
   f. O += P V for this thread's 8 x (D/16) sub-tile with fp32 FMAs.
3. Reduce the per-thread row sums across the 16 lanes, divide O by them once, store O (0 for a row
   that saw no key) and, with ``return_lse``, lse = (row_max + log2(row_sum)) · ln 2 (natural log,
   -inf for a row that saw no key).

Data movement
-------------
HBM → registers with 128-bit loads of 8 elements (``ld.global.v4``; ``head_view`` tells the compiler
the strides are multiples of 8 elements, which ``kernel_operand`` guarantees), converted to fp32 and
stored to shared memory (``st.shared.v4``); shared memory → registers with 128-bit loads of four
fp32 values (``ld.shared.v4``). Rows are padded by 4 floats so that the 16 rows read by one warp in
the same instruction fall into different banks. No tensor cores (no ``mma``), no ``cp.async``.

Thread layout (128 threads = 4 warps): lane ``l`` of warp ``w`` owns row group ``rg = 2w + l // 16``
(rows ``rg + 8i``, i < 8) and column group ``cg = l % 16``: S columns ``cg + 16j`` (j < 4) and O
columns ``64jj + 4cg + e`` (e < 4, jj < D/64). The 16 lanes of a half-warp hold one row group, so
row reductions are 4 butterfly shuffles.

Constraints: fp16/bf16 inputs, head_dim 64 or 128 (the O accumulator is 8·D/16 fp32 registers per
thread; D=256 would need 128 of them and spill), any Sq, Sk ≥ 1, sm_80 or newer (nothing here needs
Hopper). Every problem feature (``FEATURES``): GQA/MQA (``kv_heads`` dividing ``heads``), causal
aligned top-left (SDPA) or bottom-right (KV cache), ``cache_seqlens`` ((B,) int32, contiguous,
``prepare``/``bind`` take it as ``cache_seqlens=``) and ``return_lse`` (``run()`` returns (O, lse),
lse (B, H, Sq) fp32).

What the measurements taught
----------------------------
Figures are in the generated table of ``docs/ladder.md``; the measurements behind these lessons are
in ``docs/perf-log.md`` ("Figures moved out of rung docstrings").

* K and V tiles in shared memory are reused by 64 query rows, Q by every key, and S never leaves
  the chip: several times ``cute/naive``'s speed before any tensor core is used.
* That is still about half of what the CUDA cores can do in fp32 FMAs. At D = 128 the kernel needs
  nearly all 255 registers a thread may have (no spills; the static table has the count), so only
  two CTAs (8 warps) share an SM. Not profiled; the likely losses are the
  four barriers per key block and the exposed latency of the synchronous K and V loads, which the
  next rungs hide with asynchronous copies while moving the GEMMs to tensor cores.
* Causal runs at the same rate as non-causal: skipped blocks right of the diagonal remove half the
  work and launching the longest rows first keeps the tail short.
* Keeping S and O in fp32 and P unrounded makes the error slightly below SDPA's.
"""

from __future__ import annotations

import math
from functools import partial

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32, const_expr

from common.contract.capability import FEATURES, check_common
from common.contract.problem import Problem
from cute_impl._host import (
    CompiledKernels,
    ProblemConfig,
    RungHost,
    attention_launch,
    fake_attention_arguments,
    generic_view,
)

LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)
SUPPORTED_HEAD_DIMS = (64, 128)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
MIN_COMPUTE_CAPABILITY = (8, 0)
# CUDA grid limit on gridDim.y and gridDim.z, which carry heads and batch.
MAX_GRID_YZ = 65535
WARP_SIZE = 32
# Floats of padding per shared-memory row: keeps 16-byte alignment and shifts consecutive rows by
# four banks, so the rows one warp reads in one instruction do not collide.
SMEM_ROW_PAD = 4
# Elements per shared-memory vector load (4 x fp32 = 128 bits).
VEC = 4
# Elements per global vector load (8 x 16-bit = 128 bits).
GMEM_VEC = 8
# validation.kernel_operand guarantees 16-byte aligned strides: 8 elements of 16 bits.
STRIDE_DIVISIBILITY = 8


class OnlineAttention:
    """Fused attention forward with online softmax, fp32 FMAs on CUDA cores."""

    def __init__(self, config: ProblemConfig) -> None:
        self.head_dim = config.head_dim
        self.causal = config.causal
        # Problem features, compile time: the causal alignment, per-sequence key lengths, the LSE.
        self.bottom_right = config.bottom_right
        self.has_cache_seqlens = config.has_cache_seqlens
        self.return_lse = config.return_lse
        self.tile_m = 64
        self.tile_n = 64
        self.threads_per_cta = 128
        # Lanes that share one row group (a half-warp) and the number of row groups per CTA.
        self.col_groups = 16
        self.row_groups = self.threads_per_cta // self.col_groups
        self.rows_per_thread = self.tile_m // self.row_groups
        self.s_cols_per_thread = self.tile_n // self.col_groups
        # O columns per thread come in chunks of VEC consecutive columns, one chunk per 64 columns.
        self.o_chunks = self.head_dim // (VEC * self.col_groups)
        self.d_stride = self.head_dim + SMEM_ROW_PAD
        self.p_stride = self.tile_n + SMEM_ROW_PAD

    @cute.jit
    def __call__(
        self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLse: cute.Tensor | None,
        mCacheSeqlens: cute.Tensor | None, softmax_scale_log2: Float32, stream: cuda.CUstream,
    ) -> None:  # fmt: skip
        """q, o (B, H, Sq, D), k, v (B, Hkv, Sk, D); ``mLse`` (B, H, Sq) fp32, None without
        ``return_lse``; ``mCacheSeqlens`` the (B,) int32 key lengths, None without them."""
        mCacheSeqlens = generic_view(mCacheSeqlens)  # read through a generic pointer (``_host.generic_view``)
        num_m_blocks = cute.ceil_div(mQ.shape[2], self.tile_m)
        self.kernel(mQ, mK, mV, mO, mLse, mCacheSeqlens, softmax_scale_log2).launch(
            grid=[num_m_blocks, mQ.shape[1], mQ.shape[0]],
            block=[self.threads_per_cta, 1, 1],
            stream=stream,
        )

    @cute.jit
    def head_view(self, mX: cute.Tensor, batch: Int32, head: Int32) -> cute.Tensor:
        """(seqlen, D) view of one head whose row stride is known to be a multiple of 8 elements."""
        batch_stride, head_stride, row_stride = (cute.assume(s, divby=STRIDE_DIVISIBILITY) for s in mX.stride[:3])
        head_start = mX.iterator + batch * batch_stride + head * head_stride
        layout = cute.make_layout((mX.shape[2], self.head_dim), stride=(row_stride, 1))
        return cute.make_tensor(head_start, layout)

    @cute.jit
    def load_tile(self, gX: cute.Tensor, sX: cute.Tensor, row0: Int32, seqlen: Int32, scale: Float32) -> None:
        """Rows ``row0 ..`` of gX (seqlen, D) into sX as fp32 times ``scale``; rows past the end are 0.

        Each thread moves GMEM_VEC consecutive elements per step: one 128-bit global load, a
        conversion to fp32, two 128-bit shared stores. Rows past ``seqlen`` load the last row
        (always in bounds) and are zeroed, so no load sits behind a branch.
        """
        tidx, _, _ = cute.arch.thread_idx()
        chunks_per_row = self.head_dim // GMEM_VEC
        rows_per_step = self.threads_per_cta // chunks_per_row
        chunk = tidx % chunks_per_row
        rX = cute.make_rmem_tensor((1, GMEM_VEC), gX.element_type)
        rF = cute.make_rmem_tensor((1, GMEM_VEC), Float32)
        for step in cutlass.range_constexpr(sX.shape[0] // rows_per_step):
            row = step * rows_per_step + tidx // chunks_per_row
            src_row = cutlass.min(row0 + row, seqlen - 1)
            cute.autovec_copy(cute.local_tile(gX, (1, GMEM_VEC), (src_row, chunk)), rX)
            rF.store(rX.load().to(Float32) * scale)
            if row0 + row >= seqlen:
                rF.fill(0.0)
            cute.autovec_copy(rF, cute.local_tile(sX, (1, GMEM_VEC), (row, chunk)))

    @cute.kernel
    def kernel(
        self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLse: cute.Tensor | None,
        mCacheSeqlens: cute.Tensor | None, softmax_scale_log2: Float32,
    ) -> None:  # fmt: skip
        tidx, _, _ = cute.arch.thread_idx()
        m_block_rev, head, batch = cute.arch.block_idx()
        heads, kv_heads = mQ.shape[1], mK.shape[1]
        # ---- 0. GQA: this query head reads KV head head // (heads // kv_heads) ----
        kv_head = head // (heads // kv_heads)
        seqlen_q = mQ.shape[2]
        seqlen_k = mK.shape[2]
        # This sequence's keys: its own length in a padded cache (clamped to [0, Sk]), else Sk. Row i
        # sees keys j <= i + causal_offset: 0 top-left, the sequence's Sk - Sq bottom-right.
        if const_expr(self.has_cache_seqlens):
            seqlen_k = cutlass.min(cutlass.max(mCacheSeqlens[batch], 0), seqlen_k)
        causal_offset = 0
        if const_expr(self.bottom_right):
            causal_offset = seqlen_k - seqlen_q
        # Causal CTAs near the bottom have the most keys: launch them first for a shorter tail.
        m_block = cute.ceil_div(seqlen_q, self.tile_m) - 1 - m_block_rev
        m0 = m_block * self.tile_m
        lane = tidx % WARP_SIZE
        row_group = (tidx // WARP_SIZE) * (WARP_SIZE // self.col_groups) + lane // self.col_groups
        col_group = lane % self.col_groups
        rows, s_cols, d = self.rows_per_thread, self.s_cols_per_thread, self.head_dim

        # ---- shared memory: Q tile, one K/V tile (K, then V reuses it), P tile ----
        smem = cutlass.memory.SmemAllocator()
        tile_layout_q = cute.make_layout((self.tile_m, d), stride=(self.d_stride, 1))
        tile_layout_kv = cute.make_layout((self.tile_n, d), stride=(self.d_stride, 1))
        sQ = smem.allocate_tensor(Float32, tile_layout_q, 16)
        sKV = smem.allocate_tensor(Float32, tile_layout_kv, 16)
        sP = smem.allocate_tensor(Float32, cute.make_layout((self.tile_m, self.tile_n), stride=(self.p_stride, 1)), 16)

        # ---- per-thread views of shared memory (vector mode first, so a slice is one ld.v4) ----
        # Q rows rg + 8i: (VEC, D/VEC, rows)
        tSsQ = cute.make_tensor(
            sQ.iterator + row_group * self.d_stride,
            cute.make_layout((VEC, d // VEC, rows), stride=(1, VEC, self.row_groups * self.d_stride)),
        )
        # K rows cg + 16j: (VEC, D/VEC, s_cols)
        tSsK = cute.make_tensor(
            sKV.iterator + col_group * self.d_stride,
            cute.make_layout((VEC, d // VEC, s_cols), stride=(1, VEC, self.col_groups * self.d_stride)),
        )
        # V columns 64jj + 4cg + e of every key row: (VEC, o_chunks, tile_n)
        tOsV = cute.make_tensor(
            sKV.iterator + col_group * VEC,
            cute.make_layout((VEC, self.o_chunks, self.tile_n), stride=(1, VEC * self.col_groups, self.d_stride)),
        )
        # P rows rg + 8i, all keys: (VEC, tile_n/VEC, rows) for reading; S columns cg + 16j for writing.
        tOsP = cute.make_tensor(
            sP.iterator + row_group * self.p_stride,
            cute.make_layout((VEC, self.tile_n // VEC, rows), stride=(1, VEC, self.row_groups * self.p_stride)),
        )
        tSsP = cute.make_tensor(
            sP.iterator + row_group * self.p_stride + col_group,
            cute.make_layout((rows, s_cols), stride=(self.row_groups * self.p_stride, self.col_groups)),
        )

        # ---- registers ----
        acc_s = cute.make_rmem_tensor((rows, s_cols), Float32)
        acc_o = cute.make_rmem_tensor((rows, VEC, self.o_chunks), Float32)
        acc_o.fill(0.0)
        row_max = cute.make_rmem_tensor((rows,), Float32)
        row_max.fill(-Float32.inf)
        row_sum = cute.make_rmem_tensor((rows,), Float32)
        row_sum.fill(0.0)
        rQ = cute.make_rmem_tensor((VEC, rows), Float32)
        rK = cute.make_rmem_tensor((VEC, s_cols), Float32)
        rP = cute.make_rmem_tensor((VEC, rows), Float32)
        rV = cute.make_rmem_tensor((VEC, self.o_chunks), Float32)

        # ---- this (batch, head) of each operand, strides known 16-byte aligned: (seqlen, D) ----
        gQ = self.head_view(mQ, batch, head)
        gK = self.head_view(mK, batch, kv_head)
        gV = self.head_view(mV, batch, kv_head)

        # ---- 1. Q tile, scaled into base-2 units ----
        self.load_tile(gQ, sQ, m0, seqlen_q, softmax_scale_log2)

        # Causal: keys past the tile's last row's diagonal are masked for every row, so stop there. A
        # tile whose rows see no key (a length of 0, bottom-right rows before the diagonal) loops 0
        # times, so load_tile never clamps into an empty sequence.
        n_end = seqlen_k
        if const_expr(self.causal):
            n_end = cutlass.max(cutlass.min(seqlen_k, m0 + self.tile_m + causal_offset), 0)
        for n_block in cutlass.range(cute.ceil_div(n_end, self.tile_n), unroll=1):
            n0 = n_block * self.tile_n
            # ---- 2a. K tile (the barrier first: the previous iteration may still read V) ----
            cute.arch.sync_threads()
            self.load_tile(gK, sKV, n0, seqlen_k, Float32(1.0))
            cute.arch.sync_threads()

            # ---- 2b. S = Q Kᵀ, (rows, s_cols) per thread ----
            acc_s.fill(0.0)
            for chunk in cutlass.range(d // VEC, unroll=2):
                for i in cutlass.range_constexpr(rows):
                    cute.autovec_copy(tSsQ[None, chunk, i], rQ[None, i])
                for j in cutlass.range_constexpr(s_cols):
                    cute.autovec_copy(tSsK[None, chunk, j], rK[None, j])
                for e in cutlass.range_constexpr(VEC):
                    for i in cutlass.range_constexpr(rows):
                        for j in cutlass.range_constexpr(s_cols):
                            acc_s[i, j] += rQ[e, i] * rK[e, j]

            # ---- 2c + 2d. mask, online softmax, rescale O ----
            for i in cutlass.range_constexpr(rows):
                row = m0 + row_group + i * self.row_groups
                tile_max = -Float32.inf
                for j in cutlass.range_constexpr(s_cols):
                    col = n0 + col_group + j * self.col_groups
                    masked = col >= seqlen_k
                    if const_expr(self.causal):
                        masked = masked | (col > row + causal_offset)
                    acc_s[i, j] = Float32(cutlass.select_(masked, -Float32.inf, acc_s[i, j]))
                    tile_max = cute.arch.fmax(tile_max, acc_s[i, j])
                tile_max = cute.arch.warp_reduction_max(tile_max, threads_in_group=self.col_groups)
                new_max = cute.arch.fmax(row_max[i], tile_max)
                # A row that has seen no visible key keeps max -inf; use 0 so exp2 sees -inf - 0.
                offset = new_max
                if new_max == -Float32.inf:
                    offset = Float32(0.0)
                correction = cute.math.exp2(row_max[i] - offset, fastmath=True)
                row_max[i] = new_max
                tile_sum = Float32(0.0)
                for j in cutlass.range_constexpr(s_cols):
                    p = cute.math.exp2(acc_s[i, j] - offset, fastmath=True)
                    acc_s[i, j] = p
                    tile_sum += p
                row_sum[i] = row_sum[i] * correction + tile_sum
                for e in cutlass.range_constexpr(VEC):
                    for jj in cutlass.range_constexpr(self.o_chunks):
                        acc_o[i, e, jj] = acc_o[i, e, jj] * correction

            # ---- 2e. P to shared memory, V tile replaces K ----
            for i in cutlass.range_constexpr(rows):
                for j in cutlass.range_constexpr(s_cols):
                    tSsP[i, j] = acc_s[i, j]
            cute.arch.sync_threads()
            self.load_tile(gV, sKV, n0, seqlen_k, Float32(1.0))
            cute.arch.sync_threads()

            # ---- 2f. O += P V, (rows, VEC, o_chunks) per thread ----
            for chunk in cutlass.range(self.tile_n // VEC, unroll=1):
                for i in cutlass.range_constexpr(rows):
                    cute.autovec_copy(tOsP[None, chunk, i], rP[None, i])
                for e in cutlass.range_constexpr(VEC):
                    for jj in cutlass.range_constexpr(self.o_chunks):
                        cute.autovec_copy(tOsV[None, jj, chunk * VEC + e], rV[None, jj])
                    for i in cutlass.range_constexpr(rows):
                        for jj in cutlass.range_constexpr(self.o_chunks):
                            for c in cutlass.range_constexpr(VEC):
                                acc_o[i, c, jj] += rP[e, i] * rV[c, jj]

        # ---- 3. final normalisation and store ----
        for i in cutlass.range_constexpr(rows):
            total = cute.arch.warp_reduction_sum(row_sum[i], threads_in_group=self.col_groups)
            inv_sum = Float32(0.0)
            if total > 0.0:
                inv_sum = 1.0 / total
            row = m0 + row_group + i * self.row_groups
            if row < seqlen_q:
                for jj in cutlass.range_constexpr(self.o_chunks):
                    for c in cutlass.range_constexpr(VEC):
                        col = jj * VEC * self.col_groups + col_group * VEC + c
                        mO[batch, head, row, col] = (acc_o[i, c, jj] * inv_sum).to(mO.element_type)
                if const_expr(self.return_lse):  # noqa: SIM102
                    # Natural-log LSE (row_max is in log2 units), -inf for a row with no visible key;
                    # the 16 lanes of the row group share row_max and total, the first one writes.
                    if col_group == 0:
                        lse = Float32(-Float32.inf)
                        if total > 0.0:
                            lse = (row_max[i] + cute.math.log2(total, fastmath=False)) * LN_2
                        mLse[batch, head, row] = lse


# ---------------------------------------------------------------------------------------------
# Host side: validate, compile once per configuration, allocate, launch.
# ---------------------------------------------------------------------------------------------

# The host entry points: validate (head dims, every feature) → plan (the compile key: dtype, head dim
# and the features; shapes and strides are dynamic, so one compilation serves every size) → bind (O
# and the LSE; the kernel takes softmax_scale_log2).
HOST = RungHost(
    "cute/online",
    CompiledKernels(OnlineAttention, fake_attention_arguments),
    plan=ProblemConfig.of,
    plan_launch=partial(attention_launch, plan=ProblemConfig.of, scale_factor=LOG2_E),
    head_dims=SUPPORTED_HEAD_DIMS,
)
prepare, bind, compile_sm90 = HOST.prepare, HOST.bind, HOST.compile_sm90


def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    """The capability check: a CUDA device of sm_80+, fp16/bf16, head_dim 64 or 128, grid limits."""
    ok, reason = check_common(
        "cute/online", problem, device,
        dtypes=SUPPORTED_DTYPES, head_dims=SUPPORTED_HEAD_DIMS, min_capability=MIN_COMPUTE_CAPABILITY,
        features=FEATURES,
    )  # fmt: skip
    if not ok and problem.head_dim > max(SUPPORTED_HEAD_DIMS):
        reason += " (the fp32 O accumulator of D=256 does not fit in registers)"
    if not ok:
        return ok, reason
    if problem.heads > MAX_GRID_YZ or problem.batch > MAX_GRID_YZ:
        return (
            False,
            f"heads and batch must be <= {MAX_GRID_YZ} (CUDA grid limit), got {problem.heads} and {problem.batch}",
        )
    return True, ""


IMPLEMENTATION = HOST.implementation(
    supports=supports, forbidden_ptx=("mma.sync", "wgmma.mma_async"), source_file=__file__
)
