"""Rung 2, online softmax on CUDA cores in Triton (counterpart: ``cute_impl/online.py``).

What it adds over ``naive``: one fused kernel and one pass over K and V, with no S in HBM. The naive
rung writes the fp32 score matrix (B·H·Sq·Sk·4 bytes) and reads it four times; here each program
keeps a running row max and row sum for its query rows, so scores live only in registers and HBM
traffic drops to reading Q, K, V and writing O. The products are still broadcast multiply +
``tl.sum`` in fp32 — deliberately no ``tl.dot`` — so this step isolates the algorithm (online
softmax) from the hardware (tensor cores, the next rung).

Algorithm (one program per BLOCK_M query rows of one (batch, head)):
  1. Load the Q tile (BLOCK_M × D) once into registers, in fp32.
  2. For each BLOCK_N block of keys up to the last one any row of the tile can see (causal tiles
     stop at the diagonal; blocks wholly above it are never loaded):
     a. S = Q Kᵀ · softmax_scale_log2 (scores in the log2 domain, so exp2 needs no extra multiply);
        keys past Sk and, when causal, keys after the row are set to -inf.
     b. new_max = max(row_max, rowmax(S)); P = exp2(S - new_max); alpha = exp2(row_max - new_max).
     c. row_sum = alpha · row_sum + rowsum(P); acc = alpha · acc + P V.
  3. O = acc / row_sum, stored in the input dtype (rows past Sq are not stored).

Data movement: Q, K and V go HBM → registers through ``ld.global``; every FLOP is an fp32 FMA on
CUDA cores (the PTX holds no ``mma.sync`` or ``wgmma``). Each K/V block is re-read from L2/HBM by
every program of the same head: without tensor cores the FMAs, not that traffic, set the pace.
A lesson about the stack: Triton gives no say over register layouts, so the shape of the code
decides the instructions. Written as ``tl.sum(a[:, :, None] * b[None, :, :], axis=1)``, Triton's
combiner turns the product into ``tl.dot`` (tf32 ``mma.sync`` in the PTX) whenever both outer
extents are ≥ 16; summed over the last axis, the sum is spread over a warp (five times more
shuffles than FMAs). Summing over the first axis keeps every sum inside a thread, and working on
transposed tiles (Sᵀ = K Qᵀ, Oᵀ += Vᵀ Pᵀ) lets both products do so without a register transpose:
compiled for sm_90a at D=128, that gives 2.4x the FMAs per barrier of the untransposed form
(256 FMAs and 20 barriers per thread per key block, against 128 and 24). Shared memory is used
only by Triton's layout conversions.

Constraints: fp16 and bf16 on a CUDA GPU (fp32 too under the Triton interpreter); D ∈ {32, 64, 128,
256}; any Sq, Sk ≥ 1; causal (top-left) or not.

Measured (H200, B=2, H=16, S=8192, D=128, bf16): the 32×8-row, 8-warp tile ran 94.7 ms = 11.6
TFLOP/s full and 11.6 causal; the 32×4, 4-warp tile now used ran 12.9 full (see ``results/h200``
for the canonical run). Causal halves the time (blocks above the diagonal are skipped), so it beats
naive there (7.2); full, it is slower than naive (14.4): the ladder is NOT monotone at this step in
Triton. The SASS (not a profile) says why: Triton's default layouts give each thread a 1×1 tile of
both products, so every K or V element a thread converts from bf16 feeds a single FMA (about 1.5
conversion instructions per FMA), and at 218-255 registers one or two CTAs fit per SM with no
prefetch of the next K/V block to cover L2 latency. Barriers are not the limiter (11 per 256 FMAs
in SASS, fewer than naive's 4 per 56). The untransposed first version measured 7.9 TFLOP/s.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from common.devices import (
    triton_device_supported,
    triton_device_types,
    triton_dtype_supported,
    triton_dtypes,
)
from common.problem import Problem
from common.registry import Implementation, KernelBinary, Runner
from common.static import compile_triton_sm90
from common.validation import kernel_operand, validate_attention_inputs

LOG2_E = 1.4426950408889634
# Per head dim: (BLOCK_M, BLOCK_N, num_warps), tiles that compile for sm_90a with no spills. Each
# thread holds its share of the two 3-D products (D × BLOCK_N × BLOCK_M), so tiles shrink as D
# grows. D=128 was timed on the H200 among spill-free candidates (32×8×8 warps 11.6 TFLOP/s,
# 16×8×4 12.4, 32×4×4 12.9 at 225 registers); 32×8×4 ran 15.7 but spills 152 bytes per thread.
BLOCKS: dict[int, tuple[int, int, int]] = {32: (64, 16, 8), 64: (64, 8, 8), 128: (32, 4, 4), 256: (16, 8, 8)}
HEAD_DIMS = tuple(BLOCKS)


# ----------------------------------------------------------------------------------------------
# Kernel: one pass over K/V with a running max and sum per query row
# ----------------------------------------------------------------------------------------------
@triton.jit
def _online_kernel(
    Q, K, V, Out,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om,
    heads, seqlen_q, seqlen_k, softmax_scale_log2,
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    m_block = tl.program_id(0)
    batch_head = tl.program_id(1)
    batch = (batch_head // heads).to(tl.int64)
    head = (batch_head % heads).to(tl.int64)
    q_base = Q + batch * stride_qb + head * stride_qh
    k_base = K + batch * stride_kb + head * stride_kh
    v_base = V + batch * stride_vb + head * stride_vh
    o_base = Out + batch * stride_ob + head * stride_oh

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seqlen_q

    # 1. The Q tile, read as Qᵀ (D × BLOCK_M), stays in registers for the whole pass.
    q_t = tl.load(q_base + offs_m[None, :] * stride_qm + offs_d[:, None], mask=row_ok[None, :], other=0.0)
    q_t = q_t.to(tl.float32)

    # Per query row (kept as a BLOCK_M vector) and Oᵀ (D × BLOCK_M): see the module doc for why
    # the kernel works on transposed tiles.
    row_max = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc_t = tl.zeros((HEAD_DIM, BLOCK_M), dtype=tl.float32)

    # 2. Causal: keys at or past the tile's last row + 1 are masked for every row, so stop there.
    n_end = tl.minimum(seqlen_k, (m_block + 1) * BLOCK_M) if CAUSAL else seqlen_k
    for n_start in tl.range(0, n_end, BLOCK_N):
        offs_k = n_start + offs_n
        col_ok = offs_k < seqlen_k
        k_t = tl.load(k_base + offs_k[None, :] * stride_kn + offs_d[:, None], mask=col_ok[None, :], other=0.0)
        v = tl.load(v_base + offs_k[:, None] * stride_vn + offs_d[None, :], mask=col_ok[:, None], other=0.0)

        # 2a. Sᵀ = K Qᵀ (BLOCK_N × BLOCK_M): the D × BLOCK_N × BLOCK_M product summed over D, in the
        # log2 domain; keys past Sk and, when causal, keys after the row are set to -inf.
        scores_t = tl.sum(k_t.to(tl.float32)[:, :, None] * q_t[:, None, :], axis=0) * softmax_scale_log2
        visible = col_ok[:, None]
        if CAUSAL:
            visible = visible & (offs_k[:, None] <= offs_m[None, :])
        scores_t = tl.where(visible, scores_t, float("-inf"))

        # 2b. Online softmax down the key axis. Guard: a row that has seen no visible key keeps max
        # -inf; shifting by 0 instead gives P = 0 and alpha = 0 rather than exp2(-inf - -inf) = NaN.
        new_max = tl.maximum(row_max, tl.max(scores_t, axis=0))
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        p_t = tl.exp2(scores_t - shift[None, :])
        alpha = tl.exp2(row_max - shift)

        # 2c. Rescale what was accumulated under the old max, then Oᵀ += Vᵀ Pᵀ: the
        # BLOCK_N × D × BLOCK_M product summed over the keys.
        row_sum = row_sum * alpha + tl.sum(p_t, axis=0)
        acc_t = acc_t * alpha[None, :] + tl.sum(p_t[:, None, :] * v.to(tl.float32)[:, :, None], axis=0)
        row_max = new_max

    # 3. Normalise once; a row with no visible key (row_sum 0) is written as 0, not 0 / 0.
    inv_sum = tl.where(row_sum > 0.0, 1.0 / row_sum, 0.0)
    out_t = (acc_t * inv_sum[None, :]).to(Out.dtype.element_ty)
    tl.store(o_base + offs_m[None, :] * stride_om + offs_d[:, None], out_t, mask=row_ok[None, :])


# ----------------------------------------------------------------------------------------------
# Host: validate, allocate O once, launch
# ----------------------------------------------------------------------------------------------


def online_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem) -> Runner:
    """Validate q, k, v (B, H, S, D), allocate O, and return ``run()`` launching the fused kernel."""
    checked = validate_attention_inputs(
        q,
        k,
        v,
        causal=problem.causal,
        softmax_scale=problem.softmax_scale,
        dtypes=triton_dtypes(),
        head_dims=HEAD_DIMS,
        device_types=triton_device_types(),
    )
    q, k, v = (kernel_operand(t) for t in (q, k, v))
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    block_m, block_n, num_warps = BLOCKS[checked.head_dim]
    grid = (triton.cdiv(checked.seqlen_q, block_m), checked.batch * checked.heads)
    softmax_scale_log2 = checked.scale * LOG2_E

    def run() -> torch.Tensor:
        _online_kernel[grid](
            q, k, v, out,
            q.stride(0), q.stride(1), q.stride(2),
            k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2),
            out.stride(0), out.stride(1), out.stride(2),
            checked.heads, checked.seqlen_q, checked.seqlen_k, softmax_scale_log2,
            CAUSAL=checked.causal, HEAD_DIM=checked.head_dim, BLOCK_M=block_m, BLOCK_N=block_n,
            num_warps=num_warps,
        )  # fmt: skip
        return out

    return run


# ----------------------------------------------------------------------------------------------
# Capability check and sm_90a compile path
# ----------------------------------------------------------------------------------------------
def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    ok, reason = triton_device_supported(device)
    if not ok:
        return False, reason
    ok, reason = triton_dtype_supported(problem.dtype)
    if not ok:
        return False, reason
    if problem.head_dim not in HEAD_DIMS:
        return False, f"head_dim {problem.head_dim} not supported (supported: {list(HEAD_DIMS)})"
    return True, ""


def compile_sm90(problem: Problem) -> list[KernelBinary]:
    """The fused kernel compiled for sm_90a at ``problem``'s head dim, dtype and mask."""
    element = "*fp16" if problem.dtype == torch.float16 else "*bf16"
    strides = tuple(f"stride_{t}{dim}" for t, last in zip("qkvo", "mnnm", strict=True) for dim in ("b", "h", last))
    block_m, block_n, num_warps = BLOCKS[problem.head_dim]
    binary = compile_triton_sm90(
        _online_kernel,
        {
            "Q": element, "K": element, "V": element, "Out": element,
            **{name: "i32" for name in strides},
            "heads": "i32", "seqlen_q": "i32", "seqlen_k": "i32", "softmax_scale_log2": "fp32",
        },
        {"CAUSAL": problem.causal, "HEAD_DIM": problem.head_dim, "BLOCK_M": block_m, "BLOCK_N": block_n},
        num_warps=num_warps,
        num_stages=1,
        aligned=("Q", "K", "V", "Out", *strides),
    )  # fmt: skip
    return [binary]


IMPLEMENTATION = Implementation(
    name="triton/online",
    stack="triton",
    rung="online",
    prepare=online_attention,
    supports=supports,
    compile_sm90=compile_sm90,
    runs_on_cpu=True,
    forbidden_ptx=("mma.sync", "wgmma.mma_async"),
    source_file=__file__,
)
