"""Rung 1, naive attention in Triton: materialise S in HBM (counterpart: ``cute_impl/naive.py``).

The starting point of the ladder: attention computed exactly as the formula reads, one full pass
per operation, with the whole score matrix written to HBM in fp32. It adds nothing over a textbook
implementation; it exists to show what every later rung removes. Its GEMMs run on CUDA cores in
fp32, like the online rung, so that the step naive → online isolates the algorithmic change: no S
in HBM, one pass over K and V.

The products are ``tl.dot`` on fp32 operands with ``input_precision="ieee"``. No tensor-core
instruction computes IEEE fp32 products, so Triton lowers this dot to its FMA dot: both operands
are staged through shared memory into a layout where each thread owns a 2-D tile of the output,
and every output is one chain of FFMAs. An earlier version summed broadcast products with
``tl.sum``; Triton 3.9 lowers such an in-thread sum to a tree, so half the products became an FMUL
and an FADD instead of an FFMA, and the rung ran slower than under Triton 3.6. The FMA dot
compiles to the same FFMA chains under both releases (``docs/perf-log.md``, "Triton 3.9 on the
early rungs"). The online rung keeps broadcast products: there the FMA dot measured slower.

Algorithm (three launches, each a section below):
  1. ``_scores_kernel``: S = softmax_scale · Q Kᵀ into an fp32 buffer of shape (B·H, Sq, Sk), K read
     from the query head's KV head (GQA: ``kv_head = head // (heads // kv_heads)``); masked entries
     are set to -inf: keys past the sequence's length (``cache_seqlens``) and, causal, keys after
     the row's diagonal (j > i + causal_offset; the offset is 0 top-left, Sk - Sq bottom-right).
     One program per BLOCK_M × BLOCK_N tile of S, one fp32 dot per BLOCK_D-wide slice of D.
  2. ``_softmax_kernel``: one program per row of S, in place: the row max, then the sum of
     exp(S - max) (as exp2 with LOG2_E folded in), then P = exp(S - max) / sum written over S, and
     (``return_lse``) lse = max + ln(sum), -inf for a row that sees no key.
  3. ``_pv_kernel``: O = P V (V of the KV head) with fp32 accumulation over BLOCK_N-wide slices of
     the keys, written in the input dtype. One program per BLOCK_M rows of O.

Data movement: every operand goes HBM → registers through plain ``ld.global``, then through shared
memory into the FMA dot's register tiles (no tensor cores; the PTX holds neither ``mma.sync`` nor
``wgmma``). The fp32 S buffer is written once and read four times (max, sum, normalise, P·V) and
P written once: for B=2, H=16, S=8192 that is 8.6 GB per round trip, so the rung is bound by HBM
traffic on S long before the FLOPs matter, and by HBM capacity as S grows.

Constraints: fp16 and bf16 on a CUDA GPU (fp32 too under the Triton interpreter); D ∈ {32, 64, 128,
256}; any Sq, Sk ≥ 1; causal (top-left or bottom-right) or not; GQA; ``cache_seqlens``; LSE. The
capability check refuses problems whose S buffer (B·H·Sq·Sk·4 bytes) does not fit in free device
memory. Backward (``common.attention`` with inputs that require grad): ``triton_impl/backward/naive.py``.

What the measurements taught (figures in the generated table of ``docs/ladder.md``, history in
``docs/perf-log.md``): the time does not change with the mask: every score is computed, stored and
read back, and causal only halves the FLOPs that count.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from common.contract.problem import Problem
from common.contract.registry import Runner
from common.contract.validation import kernel_operand
from common.toolchain.compile import KernelBinary, compile_triton_sm90
from triton_impl._device import head_base, program_heads
from triton_impl._host import TritonEntry, TritonInputs, allocate_lse, feature_buffers, ladder_supported
from triton_impl.backward import naive as naive_backward

# A constexpr: the softmax kernel reads it (the scale is applied when S is written, in natural units).
LOG2_E = tl.constexpr(1.4426950408889634)
HEAD_DIMS = (32, 64, 128, 256)
# Score tiles: a 64 × 64 tile of S per program, one dot per 16-wide slice of D.
SCORES_BLOCK_M, SCORES_BLOCK_N, SCORES_BLOCK_D = 64, 64, 16
# Softmax: one row per program, read in chunks of this many keys.
SOFTMAX_BLOCK_N = 1024
# P·V: 32 rows of O per program, 16 keys per dot.
PV_BLOCK_M, PV_BLOCK_N = 32, 16
NUM_WARPS = 4


# ----------------------------------------------------------------------------------------------
# 1. S = softmax_scale · Q Kᵀ (causal entries -inf), fp32 in HBM
# ----------------------------------------------------------------------------------------------
@triton.jit
def _scores_kernel(
    Q, K, S, CacheSeqlens,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    heads, kv_heads, seqlen_q, seqlen_k, softmax_scale,
    CAUSAL: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, HAS_CACHE_SEQLENS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    m_block = tl.program_id(0)
    n_block = tl.program_id(1)
    batch_head, batch, head, kv_head = program_heads(2, heads, kv_heads)
    q_base = head_base(Q, batch, head, stride_qb, stride_qh)
    k_base = head_base(K, batch, kv_head, stride_kb, stride_kh)
    # This sequence's keys: its own length in a padded cache (clamped to [0, Sk]), else Sk. Row i
    # sees keys j <= i + causal_offset: 0 top-left, the sequence's Sk - Sq bottom-right.
    seqlen_k_seq = seqlen_k
    if HAS_CACHE_SEQLENS:
        seqlen_k_seq = tl.minimum(tl.maximum(tl.load(CacheSeqlens + batch), 0), seqlen_k)
    causal_offset = seqlen_k_seq - seqlen_q if BOTTOM_RIGHT else 0

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = n_block * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < seqlen_q
    col_ok = offs_n < seqlen_k

    # S tile = Q Kᵀ, one fp32 dot per BLOCK_D slice of D, accumulated in fp32.
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for d_start in range(0, HEAD_DIM, BLOCK_D):
        q = tl.load(q_base + offs_m[:, None] * stride_qm + (d_start + offs_d)[None, :], mask=row_ok[:, None], other=0.0)
        k_t = tl.load(
            k_base + offs_n[None, :] * stride_kn + (d_start + offs_d)[:, None], mask=col_ok[None, :], other=0.0
        )
        acc = tl.dot(q.to(tl.float32), k_t.to(tl.float32), acc, input_precision="ieee")

    scores = acc * softmax_scale
    visible = (offs_n < seqlen_k_seq)[None, :]
    if CAUSAL:
        visible = visible & (offs_n[None, :] <= offs_m[:, None] + causal_offset)
    scores = tl.where(visible, scores, float("-inf"))

    # S is (B·H, Sq, Sk) contiguous; offsets in int64 because B·H·Sq·Sk passes 2³¹ at S=8192.
    s_rows = (batch_head.to(tl.int64) * seqlen_q + offs_m) * seqlen_k
    tl.store(S + s_rows[:, None] + offs_n[None, :], scores, mask=row_ok[:, None] & col_ok[None, :])


# ----------------------------------------------------------------------------------------------
# 2. Row softmax of S in place: max, exp and sum, normalise
# ----------------------------------------------------------------------------------------------
@triton.jit
def _softmax_kernel(S, Lse, seqlen_k, RETURN_LSE: tl.constexpr, BLOCK_N: tl.constexpr):
    row = S + tl.program_id(0).to(tl.int64) * seqlen_k
    offs_n = tl.arange(0, BLOCK_N)

    row_max = tl.full((BLOCK_N,), float("-inf"), dtype=tl.float32)
    for n_start in tl.range(0, seqlen_k, BLOCK_N):
        s = tl.load(row + n_start + offs_n, mask=n_start + offs_n < seqlen_k, other=float("-inf"))
        row_max = tl.maximum(row_max, s)
    row_max = tl.max(row_max, axis=0)
    # Guard: a row with every key masked has max -inf; subtracting 0 instead keeps exp2 at 0, not NaN.
    row_max = tl.where(row_max == float("-inf"), 0.0, row_max)

    row_sum = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for n_start in tl.range(0, seqlen_k, BLOCK_N):
        s = tl.load(row + n_start + offs_n, mask=n_start + offs_n < seqlen_k, other=float("-inf"))
        row_sum += tl.exp2((s - row_max) * LOG2_E)
    row_sum = tl.sum(row_sum, axis=0)
    # Same guard: a fully masked row gets P = 0 (output 0) instead of 0 / 0, and lse -inf.
    inv_sum = tl.where(row_sum > 0.0, 1.0 / row_sum, 0.0)
    if RETURN_LSE:
        # Rows of S are the rows of the (B, H, Sq) LSE, in the same order; S is in natural units.
        lse = tl.where(row_sum > 0.0, row_max + tl.log(row_sum), float("-inf"))
        tl.store(Lse + tl.program_id(0), lse)

    for n_start in tl.range(0, seqlen_k, BLOCK_N):
        in_row = n_start + offs_n < seqlen_k
        s = tl.load(row + n_start + offs_n, mask=in_row, other=float("-inf"))
        tl.store(row + n_start + offs_n, tl.exp2((s - row_max) * LOG2_E) * inv_sum, mask=in_row)


# ----------------------------------------------------------------------------------------------
# 3. O = P V, fp32 accumulation, stored in the input dtype
# ----------------------------------------------------------------------------------------------
@triton.jit
def _pv_kernel(
    P, V, Out,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om,
    heads, kv_heads, seqlen_q, seqlen_k,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    m_block = tl.program_id(0)
    batch_head, batch, head, kv_head = program_heads(1, heads, kv_heads)
    v_base = head_base(V, batch, kv_head, stride_vb, stride_vh)
    o_base = head_base(Out, batch, head, stride_ob, stride_oh)

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seqlen_q
    p_rows = (batch_head.to(tl.int64) * seqlen_q + offs_m) * seqlen_k

    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    for n_start in tl.range(0, seqlen_k, BLOCK_N):
        col_ok = n_start + offs_n < seqlen_k
        p = tl.load(
            P + p_rows[:, None] + (n_start + offs_n)[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0
        )
        v = tl.load(v_base + (n_start + offs_n)[:, None] * stride_vn + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        # O += P V over BLOCK_N keys, an fp32 dot (P is fp32 already).
        acc = tl.dot(p, v.to(tl.float32), acc, input_precision="ieee")

    o_ptrs = o_base + offs_m[:, None] * stride_om + offs_d[None, :]
    tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=row_ok[:, None])


# ----------------------------------------------------------------------------------------------
# Host: validate, allocate S and O once, launch the three kernels
# ----------------------------------------------------------------------------------------------


def bind(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, *, cache_seqlens: torch.Tensor | None = None
) -> Runner:
    """Allocate S, O (and the LSE) for validated q, k, v and return ``run()`` launching the three kernels."""
    q, k, v = (kernel_operand(t) for t in (q, k, v))
    batch, heads, seqlen_q, seqlen_k = problem.batch, problem.heads, problem.seqlen_q, problem.seqlen_k
    scores = torch.empty((batch * heads, seqlen_q, seqlen_k), dtype=torch.float32, device=q.device)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = allocate_lse(problem, q.device)
    # Placeholders (never read or written) when the problem has no lengths or returns no LSE.
    lse_arg, lengths_arg = feature_buffers(lse, cache_seqlens, q.device)
    scores_grid = (triton.cdiv(seqlen_q, SCORES_BLOCK_M), triton.cdiv(seqlen_k, SCORES_BLOCK_N), batch * heads)
    pv_grid = (triton.cdiv(seqlen_q, PV_BLOCK_M), batch * heads)

    def run() -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        _scores_kernel[scores_grid](
            q, k, scores, lengths_arg,
            q.stride(0), q.stride(1), q.stride(2),
            k.stride(0), k.stride(1), k.stride(2),
            heads, problem.kv_heads, seqlen_q, seqlen_k, problem.scale,
            CAUSAL=problem.causal, BOTTOM_RIGHT=problem.bottom_right, HAS_CACHE_SEQLENS=problem.has_cache_seqlens,
            HEAD_DIM=problem.head_dim, BLOCK_M=SCORES_BLOCK_M, BLOCK_N=SCORES_BLOCK_N, BLOCK_D=SCORES_BLOCK_D,
            num_warps=NUM_WARPS,
        )  # fmt: skip
        _softmax_kernel[(batch * heads * seqlen_q,)](
            scores, lse_arg, seqlen_k, RETURN_LSE=problem.return_lse, BLOCK_N=SOFTMAX_BLOCK_N, num_warps=NUM_WARPS
        )
        _pv_kernel[pv_grid](
            scores, v, out,
            v.stride(0), v.stride(1), v.stride(2),
            out.stride(0), out.stride(1), out.stride(2),
            heads, problem.kv_heads, seqlen_q, seqlen_k,
            HEAD_DIM=problem.head_dim, BLOCK_M=PV_BLOCK_M, BLOCK_N=PV_BLOCK_N,
            num_warps=NUM_WARPS,
        )  # fmt: skip
        return out if lse is None else (out, lse)

    return run


# prepare = validate (every Triton feature, these head dims) → bind → warm up.
ENTRY = TritonEntry(TritonInputs("triton/naive", HEAD_DIMS), bind)
prepare = ENTRY.prepare


# ----------------------------------------------------------------------------------------------
# Capability check and sm_90a compile path
# ----------------------------------------------------------------------------------------------
def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    ok, reason = ladder_supported(problem, device, HEAD_DIMS)
    if not ok:
        return False, reason
    if device.type == "cuda":
        free_bytes, _ = torch.cuda.mem_get_info(device)
        if problem.score_buffer_bytes > free_bytes:
            return False, (
                f"the fp32 S buffer needs {problem.score_buffer_bytes:,} bytes (B·H·Sq·Sk·4) "
                f"but only {free_bytes:,} bytes of device memory are free"
            )
    return True, ""


def _divisible_by_16(**values: int) -> tuple[str, ...]:
    # Triton specialises integer arguments divisible by 16; the static compile must match a real launch.
    return tuple(name for name, value in values.items() if value % 16 == 0)


def compile_sm90(problem: Problem) -> list[KernelBinary]:
    """The three kernels compiled for sm_90a at ``problem``'s head dim, dtype and mask."""
    element = "*fp16" if problem.dtype == torch.float16 else "*bf16"
    aligned = ("stride_qb", "stride_qh", "stride_qm", "stride_kb", "stride_kh", "stride_kn")
    scores = compile_triton_sm90(
        _scores_kernel,
        {
            "Q": element, "K": element, "S": "*fp32", "CacheSeqlens": "*i32",
            **{name: "i32" for name in aligned},
            "heads": "i32", "kv_heads": "i32", "seqlen_q": "i32", "seqlen_k": "i32", "softmax_scale": "fp32",
        },
        {
            "CAUSAL": problem.causal, "BOTTOM_RIGHT": problem.bottom_right,
            "HAS_CACHE_SEQLENS": problem.has_cache_seqlens, "HEAD_DIM": problem.head_dim,
            "BLOCK_M": SCORES_BLOCK_M, "BLOCK_N": SCORES_BLOCK_N, "BLOCK_D": SCORES_BLOCK_D,
        },
        num_warps=NUM_WARPS,
        num_stages=1,
        aligned=("Q", "K", "S", *aligned),
    )  # fmt: skip
    softmax = compile_triton_sm90(
        _softmax_kernel,
        {"S": "*fp32", "Lse": "*fp32", "seqlen_k": "i32"},
        {"RETURN_LSE": problem.return_lse, "BLOCK_N": SOFTMAX_BLOCK_N},
        num_warps=NUM_WARPS,
        num_stages=1,
        aligned=("S", "Lse", *_divisible_by_16(seqlen_k=problem.seqlen_k)),
    )
    pv_strides = ("stride_vb", "stride_vh", "stride_vn", "stride_ob", "stride_oh", "stride_om")
    pv = compile_triton_sm90(
        _pv_kernel,
        {
            "P": "*fp32", "V": element, "Out": element,
            **{name: "i32" for name in pv_strides},
            "heads": "i32", "kv_heads": "i32", "seqlen_q": "i32", "seqlen_k": "i32",
        },
        {"HEAD_DIM": problem.head_dim, "BLOCK_M": PV_BLOCK_M, "BLOCK_N": PV_BLOCK_N},
        num_warps=NUM_WARPS,
        num_stages=1,
        aligned=("P", "V", "Out", *pv_strides, *_divisible_by_16(seqlen_k=problem.seqlen_k)),
    )  # fmt: skip
    return [scores, softmax, pv]


IMPLEMENTATION = ENTRY.implementation(
    supports,
    compile_sm90,
    forbidden_ptx=("mma.sync", "wgmma.mma_async"),
    source_file=__file__,
    backward=naive_backward.BACKWARD,
)
