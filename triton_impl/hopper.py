"""Rung 5, Hopper attention in Triton: TMA + wgmma (counterpart: ``cute_impl/hopper.py``).

What it adds over ``pipelined``: every tile moves through the Tensor Memory Accelerator instead of
per-thread ``cp.async`` copies, and both GEMMs run as asynchronous warpgroup MMAs (``wgmma``)
reading their operands straight from shared memory. A TMA copy is one instruction issued by one
thread for a whole BLOCK_N × D tile, with address generation and out-of-bounds zero-fill done by
the copy engine, so the warps that do the softmax no longer spend issue slots on address math.
Causal attention is split into a loop over unmasked blocks and a loop over the diagonal blocks,
and the blocks above the diagonal are never visited. ``HopperKernelConfig.overlap`` (the D=128 default)
selects a KV loop software-pipelined by hand (``_overlapped_step``): each step issues
S_n = Q K_nᵀ, then O += P V of block n-1, then the softmax of S_n, so Triton's wait for S_n comes
before the P V wgmma is issued and that wgmma runs under the softmax (FA3's intra-warpgroup
overlap); the plain loop waits for P V together with the next S. Optionally the KV loop is
warp-specialised (``tl.range(..., warp_specialize=True)``): Triton splits it into a producer warp
that only issues TMA loads and consumer warps that only compute, with ``setmaxnreg`` register
budgets. No default uses it, and it is refused on a GPU, where Triton's warp-specialised loop left
rows unwritten (``check_launchable``); it stays for the interpreter and sm_90a compiles.

The kernel is built from pieces that ``triton_impl/fp8.py`` reuses: ``tile_coordinates`` (the
program's tile, KV head and sequence), ``kv_loop`` (the unmasked and masked loops over key blocks,
taking the block step as a ``STEP`` function argument, a constexpr) and ``store_tile`` (the
epilogue's stores). This file's step is ``attention_step``; fp8's kernel passes its own
(``fp8_attention_step``: block scales, P lifted by 2^P_EXPONENT, a fresh accumulator per block's
P V, Vᵀ tiles), as FlashAttention-4's fp8 subclass overrides one method. Triton inlines every call,
so each kernel compiles to the code it would have written out in full.

What Triton decides for you that ``cute_impl/hopper.py`` writes by hand: the shared-memory layout
and swizzle of every tile, the mbarrier ring that pipelines the TMA loads (``num_stages`` deep), the
wgmma instruction shape and the fragment layout of S, P and O, the wait depth of the asynchronous
MMAs, and, with warp specialisation, the producer/consumer split and register budgets.

Algorithm (one program per BLOCK_M query rows of one (batch, head); sections of the kernel; the
names in ``code`` are the stack's shared vocabulary in ``triton_impl/_device.py``):
  0. ``kv_head_index``: the KV head this query head reads (GQA/MQA: ``head // (H // Hkv)``); every K
     and V load (and fp8's K and V scales) is indexed by it, so K and V are never repeated.
     ``seqlen_info``: this sequence's key length (``cache_seqlens[batch]`` or Sk) and its causal
     offset (0 top-left, ``seqlen_k - Sq`` bottom-right); the block range and the mask take both,
     so no loop special-cases either alignment.
  1. Load the Q tile once by TMA (rows past Sq are zero-filled by the descriptor's bounds).
     ``block_range`` gives the key blocks [n_block_min, n_block_max) the tile visits (empty for a
     tile whose rows see no key); the last ``n_masked_blocks`` of them need the mask.
  2. Unmasked loop over KV blocks that every row of the tile sees completely: S = Q Kᵀ (wgmma),
     ``online_softmax_update``: row_max_new = max(row_max, rowmax(S) · softmax_scale_log2),
     P = exp2(S · softmax_scale_log2 - row_max_new) (the scale folded into one FMA);
     ``online_softmax_rescale`` of O and row_sum by exp2(row_max - row_max_new); O += P V (wgmma,
     P from registers).
  3. Masked loop over the remaining blocks (the causal diagonal, and the last block when the
     sequence's length is not a multiple of BLOCK_N): the same step after ``attention_mask`` sets S
     to -inf where a key is past the sequence's length or after the query row's diagonal
     (j > i + causal_offset); a row that has seen only masked keys keeps row_max = -inf and
     subtracts 0 instead, so exp2 gives 0, never NaN.
  4. ``online_softmax_finalize``: O /= row_sum, written by a TMA store (rows past Sq are clipped by
     the descriptor); with ``return_lse``, lse = (row_max + log2(row_sum)) · ln 2 (natural log) to an
     fp32 (B, H, Sq) buffer. A row that sees no key (bottom-right with Sq > Sk, an empty cache) is
     written as O = 0 and lse = -inf.

Data movement: HBM → SMEM by ``cp.async.bulk.tensor`` (4-D host descriptors over (B, H, Sq, D) for
Q and O and (B, Hkv, Sk, D) for K and V, addressed by KV head, with a [1, 1, BLOCK, D] box, so each
(batch, head) is bounded by its own S: a ragged tail reads zeros, not the next head's rows; keys
between a sequence's ``cache_seqlens`` and the padded Sk are never loaded past its last block, and
masked within it), completion signalled on ``mbarrier``s; SMEM → tensor cores by
``wgmma.mma_async`` (Q and K from SMEM for S = Q Kᵀ; P from registers and V from SMEM for O += P V);
fp32 accumulators in registers; O registers → SMEM → HBM by a TMA store.

Constraints: fp16 and bf16 (fp32 only under the interpreter, for the CPU tests, which refuses bf16: it
computes bf16 wrongly without an error); D ∈ {64, 128, 256};
any Sq, Sk ≥ 1, Sq ≠ Sk; GQA/MQA (any Hkv dividing H); causal aligned top-left or bottom-right, or
not; ``cache_seqlens`` (per-sequence key lengths of a padded cache); ``return_lse``; softmax_scale ≥ 0
(row maxima are taken before scaling, which needs a non-negative scale); sm_90 exactly. Each
feature is a constexpr (``feature_constexprs``) or, for GQA, one division per program, so the plain
problem compiles to the loops it had without them. Row strides must be 16-byte aligned
(``kernel_operand`` copies otherwise). Backward (``common.attention`` with inputs that require grad):
``triton_impl/backward/tiled.py``, from this rung's O and LSE (no Hopper backward yet).

What the measurements taught (the A/B runs are in ``docs/perf-log.md``; current figures in the
generated table of ``docs/ladder.md``): the hand-pipelined loop is the largest single gain, because
without it the wait for S_n also retires the P V of block n-1 and the tensor cores idle through
every softmax. On sm_90 Triton 3.6 warp-specialises only with one consumer warpgroup (BLOCK_M=64):
each CTA then issues m64 wgmmas from a single warpgroup with the whole softmax on its critical path,
and it ran well behind the software-pipelined two-warpgroup kernel. The third pipeline stage hides
the TMA latency behind a full S = Q Kᵀ. The remaining gap to cuDNN is the overlap of softmax with
the MMAs across the two warpgroups (FA3's ping-pong), which Triton's scheduler does not do here.
Triton releases (``common.toolchain.releases``): the hand-pipelined loop holds S, P, O and the P V in flight
at once and spills under Triton 3.9's default ptxas register allocation; 3.9 assembles it with
``--regAllocOptLevel=4`` (``HopperKernelConfig.ptx_options``), spill-free.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from common.contract.capability import check_shared_memory
from common.contract.devices import triton_device_supported, triton_dtype_supported, triton_interpreting
from common.contract.problem import Problem
from common.contract.validation import kernel_operand
from common.toolchain.arch import SM90_SHARED_MEMORY_BYTES, check_sm90
from common.toolchain.compile import KernelBinary, compile_triton_sm90
from common.toolchain.releases import release_configs
from triton_impl._device import (
    attention_mask,
    block_range,
    kv_head_index,
    online_softmax_finalize,
    online_softmax_rescale,
    online_softmax_update,
    seqlen_info,
)
from triton_impl._host import (
    SIZE_SIGNATURE,
    Check,
    TritonEntry,
    TritonInputs,
    allocate_lse,
    feature_buffers,
    feature_constexprs,
    rung_result,
    size_arguments,
    tile_rung_supported,
)
from triton_impl.backward import tiled as tiled_backward

HEAD_DIMS = (64, 128, 256)
SHARED_MEMORY_BUDGET = SM90_SHARED_MEMORY_BYTES
TRITON_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


# ----------------------------------------------------------------------------------------------
# Configurations: tile sizes, warps, pipeline depth, warp specialisation
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HopperKernelConfig:
    """How the Hopper attention kernel (this rung's and fp8's) is built: tiles, warps, pipeline depth,
    the shape of its KV loop and ptxas flags. One point of the tuning space; every field changes the
    generated code."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    _: KW_ONLY
    # Warp-specialised KV loop (producer warp for TMA, consumer warps); refused on a GPU (check_launchable).
    warp_specialize: bool = False
    # Software-pipelined KV loop (``_overlapped_step``): P V of block n-1 runs under the softmax of n.
    overlap: bool = False
    # Extra ptxas flags (Triton's ``ptx_options``), set per release by ``common.toolchain.releases``.
    ptx_options: str | None = None

    def launch_options(self) -> dict[str, int | str]:
        """Triton's compile options of this configuration (warps, stages and, if set, ptxas flags)."""
        options: dict[str, int | str] = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        if self.ptx_options:
            options["ptx_options"] = self.ptx_options
        return options

    def shared_bytes(self, head_dim: int, element_bytes: int) -> int:
        """Shared memory estimate: the Q tile and a K and a V tile per stage (O reuses freed buffers)."""
        q_tile = self.block_m * head_dim
        k_and_v = 2 * self.num_stages * self.block_n * head_dim
        return element_bytes * (q_tile + k_and_v)

    def fits(self, head_dim: int, element_bytes: int) -> bool:
        return self.shared_bytes(head_dim, element_bytes) <= SHARED_MEMORY_BUDGET


# On sm_90, Triton 3.6 warp-specialises the loop only with num_warps=4 and BLOCK_M=64 (one consumer
# warpgroup): BLOCK_M=128 with 4 warps fails in its data-partition pass, and with 8 warps the flag
# is ignored and the loop is software-pipelined instead (no setmaxnreg in the PTX).
# Warp-specialised configurations are not candidates: on the H200 they left query rows unwritten
# (docs/perf-log.md, 2026-11-24), so ``check_launchable`` refuses them on a GPU.
# The hand-pipelined loop (overlap) is a candidate for the two-warpgroup tiles, where it pays.
CANDIDATE_CONFIGS = tuple(
    HopperKernelConfig(block_m, block_n, num_warps, num_stages, overlap=overlap)
    for block_m, block_n, num_warps, overlap in (
        (128, 128, 8, True),
        (128, 128, 8, False),
        (128, 64, 8, True),
        (128, 64, 8, False),
        (64, 64, 4, False),
    )
    for num_stages in (2, 3, 4)
)
WARP_SPECIALIZE_REFUSAL = (
    "warp_specialize=True is refused on a GPU: Triton's warp-specialised KV loop left query rows "
    "unwritten on the H200 (64x128 and 64x64 tiles, 3 stages, Triton 3.6; docs/perf-log.md 2026-11-24). "
    "It stays available under TRITON_INTERPRET=1 and for sm_90a compiles, to study its PTX."
)


def check_launchable(config: HopperKernelConfig, device: torch.device) -> None:
    """Refuse a configuration known to give wrong answers on the GPU, naming why."""
    if config.warp_specialize and device.type == "cuda":
        raise ValueError(f"{config}: {WARP_SPECIALIZE_REFUSAL}")


# Reproducible defaults per head dim (the canonical shape uses D=128), chosen by measurement under
# Triton 3.6; ``release_configs`` applies another release's spill-free replacements.
DEFAULT_CONFIGS = release_configs(
    "triton/hopper",
    {
        64: HopperKernelConfig(128, 128, 8, 3),
        128: HopperKernelConfig(128, 128, 8, 3, overlap=True),
        256: HopperKernelConfig(64, 64, 4, 2),
    },
)


def tile_constexprs(problem: Problem, config: HopperKernelConfig) -> dict[str, object]:
    """The compile-time arguments both Triton Hopper kernels take, the same for a launch and the static
    compile: head dim, tiles, the problem's features (``feature_constexprs``: causal, bottom-right,
    cache lengths, LSE) and whether the KV loop is warp-specialised."""
    return {
        "HEAD_DIM": problem.head_dim,
        "BLOCK_M": config.block_m,
        "BLOCK_N": config.block_n,
        **feature_constexprs(problem),
        "WARP_SPECIALIZE": config.warp_specialize,
    }


def kernel_constexprs(problem: Problem, config: HopperKernelConfig) -> dict[str, object]:
    """This rung's kernel's compile-time arguments: ``tile_constexprs`` and the loop shape (``overlap``)."""
    return {**tile_constexprs(problem, config), "OVERLAP": config.overlap}


# Interpreter runs use small tiles: the CPU tests need a ragged tail, not speed.
INTERPRETER_CONFIG = HopperKernelConfig(64, 32, 4, 1)


def default_config(head_dim: int) -> HopperKernelConfig:
    """The fixed configuration of this head dim (the interpreter's small tile on the CPU)."""
    return INTERPRETER_CONFIG if triton_interpreting() else DEFAULT_CONFIGS[head_dim]


def candidate_configs(head_dim: int, dtype: torch.dtype) -> list[HopperKernelConfig]:
    """Candidates that fit the shared-memory budget for this head dim and dtype."""
    element_bytes = torch.empty((), dtype=dtype).element_size()
    return [config for config in CANDIDATE_CONFIGS if config.fits(head_dim, element_bytes)]


# ----------------------------------------------------------------------------------------------
# Kernel: shared pieces (the tile's coordinates, the KV loop that takes a block ``STEP``, the
# epilogue's stores), then this rung's step, its hand-pipelined loop, and the kernel. The fp8 rung's
# kernel (``triton_impl/fp8.py``) is built from the same pieces with its own step.
# ----------------------------------------------------------------------------------------------
@triton.jit
def tile_coordinates(
    CacheSeqlens, heads, kv_heads, seqlen_q, seqlen_k,
    BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, HAS_CACHE_SEQLENS: tl.constexpr,
):  # fmt: skip
    """This program's query tile: ``(m_block, batch_head, head, start_m, coords)``, where ``coords`` =
    (batch, kv_head, offs_m, seqlen_k, causal_offset) is what every block step reads."""
    # Causal tiles near the bottom do the most work: launching them first shortens the tail.
    m_block = tl.num_programs(0) - 1 - tl.program_id(0) if CAUSAL else tl.program_id(0)
    batch_head = tl.program_id(1)
    batch = batch_head // heads
    head = batch_head % heads
    # GQA: K and V (and fp8's scales) are those of the KV head this query head reads.
    kv_head = kv_head_index(head, heads, kv_heads)
    # This sequence's key length (cache_seqlens) and causal diagonal (row i sees j <= i + causal_offset).
    seqlen_k, causal_offset = seqlen_info(CacheSeqlens, batch, seqlen_q, seqlen_k, HAS_CACHE_SEQLENS, BOTTOM_RIGHT)
    start_m = m_block * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    return m_block, batch_head, head, start_m, (batch, kv_head, offs_m, seqlen_k, causal_offset)


@triton.jit
def block_softmax(
    S, row_max, row_sum, coords, start_n, softmax_scale_log2,
    BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, P_EXPONENT: tl.constexpr,
):  # fmt: skip
    """Mask (masked blocks) and online-softmax update of one block of S = Q Kᵀ: (P, alpha, row_max,
    row_sum). Unmasked blocks leave S unscaled (the scale is >= 0, so the row max is scaled once per
    row); masked blocks scale S before the mask, as ``attention_mask`` asks."""
    if MASKED:
        _, _, offs_m, seqlen_k, causal_offset = coords
        S = S * softmax_scale_log2
        S = attention_mask(S, offs_m, start_n + tl.arange(0, BLOCK_N), seqlen_k, causal_offset, CAUSAL)
    return online_softmax_update(S, row_max, row_sum, softmax_scale_log2, MASKED, MASKED, P_EXPONENT)


@triton.jit
def kv_loop(
    STEP: tl.constexpr, state, q, kv, coords, m_block, softmax_scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
):  # fmt: skip
    """Steps 2 and 3: ``state = STEP(state, q, kv, coords, n_block, softmax_scale_log2, HEAD_DIM,
    BLOCK_N, MASKED, CAUSAL)`` over this tile's key blocks, unmasked blocks first. ``STEP`` is the
    rung's block step (``attention_step`` here, ``fp8_attention_step`` in ``fp8.py``); ``state`` and
    ``kv`` are its own tuples (running O and softmax state; the K and V operands)."""
    _, _, _, seqlen_k, causal_offset = coords
    # Key blocks [n_block_min, n_block_max); the last n_masked_blocks need the mask.
    n_block_min, n_block_max, n_masked_blocks = block_range(m_block, seqlen_k, causal_offset, CAUSAL, BLOCK_M, BLOCK_N)
    n_block_masked = n_block_max - n_masked_blocks
    if WARP_SPECIALIZE:
        # 2+3 in one warp-specialised loop with the mask on every block: Triton 3.6 on sm_90
        # specialises a kernel only when one loop holds the dots and that loop has no branch.
        for n_block in tl.range(n_block_min, n_block_max, warp_specialize=True):
            state = STEP(state, q, kv, coords, n_block, softmax_scale_log2, HEAD_DIM, BLOCK_N, True, CAUSAL)
    else:
        # 2. Blocks every row sees in full.
        for n_block in tl.range(n_block_min, n_block_masked):
            state = STEP(state, q, kv, coords, n_block, softmax_scale_log2, HEAD_DIM, BLOCK_N, False, CAUSAL)
        # 3. The causal diagonal and the ragged last block.
        for n_block in tl.range(n_block_masked, n_block_max):
            state = STEP(state, q, kv, coords, n_block, softmax_scale_log2, HEAD_DIM, BLOCK_N, True, CAUSAL)
    return state


@triton.jit
def store_tile(
    desc_o, LSE, out, lse, coords, batch_head, head, start_m, seqlen_q,
    BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, RETURN_LSE: tl.constexpr,
):  # fmt: skip
    """Step 4's stores: O by TMA (rows past Sq are clipped by the descriptor) and, with RETURN_LSE,
    the lse of the tile's rows."""
    batch, _, offs_m, _, _ = coords
    desc_o.store([batch, head, start_m, 0], out.to(desc_o.dtype).reshape(1, 1, BLOCK_M, HEAD_DIM))
    if RETURN_LSE:
        # (B, H, Sq) contiguous: row offs_m of (batch, head) is batch_head · Sq + m.
        tl.store(LSE + batch_head.to(tl.int64) * seqlen_q + offs_m, lse, mask=offs_m < seqlen_q)


@triton.jit
def attention_step(
    state, q, kv, coords, n_block, softmax_scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """One KV block of steps 2 and 3 (``kv_loop``'s ``STEP``): S = Q Kᵀ, (mask), online softmax, O += P V.
    ``state`` = (acc, row_sum, row_max), ``kv`` = (desc_k, desc_v)."""
    acc, row_sum, row_max = state
    desc_k, desc_v = kv
    batch, kv_head = coords[0], coords[1]
    start_n = n_block * BLOCK_N
    k = desc_k.load([batch, kv_head, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    S = tl.dot(q, k.T)
    P, alpha, row_max, row_sum = block_softmax(
        S, row_max, row_sum, coords, start_n, softmax_scale_log2, BLOCK_N, MASKED, CAUSAL, 0.0
    )
    acc = online_softmax_rescale(acc, alpha)
    v = desc_v.load([batch, kv_head, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    acc = tl.dot(P.to(v.dtype), v, acc)
    return acc, row_sum, row_max


@triton.jit
def _overlapped_step(
    acc, row_sum, row_max, P, alpha, q, kv, coords, n_block, softmax_scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """One KV block, software-pipelined by hand: S = Q K_nᵀ, then O = O · alpha + P V_(n-1) with the P
    and alpha of the previous block, then the softmax of S_n. Triton waits for S before the softmax
    (wait_group 0, which also retires the previous P V), but issues P V_(n-1) asynchronously and waits
    for it only at the next S: that wgmma runs under this block's softmax."""
    desc_k, desc_v = kv
    batch, kv_head = coords[0], coords[1]
    start_n = n_block * BLOCK_N
    k = desc_k.load([batch, kv_head, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    S = tl.dot(q, k.T)
    # Block n-1 = -1 lies before the sequence: the TMA box reads zeros (and P is 0 there anyway).
    v = desc_v.load([batch, kv_head, start_n - BLOCK_N, 0]).reshape(BLOCK_N, HEAD_DIM)
    acc = tl.dot(P.to(v.dtype), v, online_softmax_rescale(acc, alpha))
    P, alpha, row_max, row_sum = block_softmax(
        S, row_max, row_sum, coords, start_n, softmax_scale_log2, BLOCK_N, MASKED, CAUSAL, 0.0
    )
    return acc, row_sum, row_max, P, alpha


@triton.jit
def _overlapped_kv_loop(
    state, q, kv, coords, m_block, softmax_scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """Steps 2+3 software-pipelined (``HopperKernelConfig.overlap``): each step issues S_n, then P V of
    block n-1, then the softmax of S_n. P starts at 0 (the first step adds nothing), and one extra
    masked step past the last block (every key hidden: P = 0, alpha = 1) adds the last block's P V.
    P is carried in fp32: converted inside the step, it stays in registers as the wgmma A operand (a
    carried 16-bit P would be staged through shared memory)."""
    acc, row_sum, row_max = state
    _, _, _, seqlen_k, causal_offset = coords
    n_block_min, n_block_max, n_masked_blocks = block_range(m_block, seqlen_k, causal_offset, CAUSAL, BLOCK_M, BLOCK_N)
    n_block_masked = n_block_max - n_masked_blocks
    P = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    alpha = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
    for n_block in tl.range(n_block_min, n_block_masked):
        acc, row_sum, row_max, P, alpha = _overlapped_step(
            acc, row_sum, row_max, P, alpha, q, kv, coords, n_block, softmax_scale_log2,
            HEAD_DIM, BLOCK_N, False, CAUSAL,
        )  # fmt: skip
    for n_block in tl.range(n_block_masked, n_block_max + 1):
        acc, row_sum, row_max, P, alpha = _overlapped_step(
            acc, row_sum, row_max, P, alpha, q, kv, coords, n_block, softmax_scale_log2,
            HEAD_DIM, BLOCK_N, True, CAUSAL,
        )  # fmt: skip
    return acc, row_sum, row_max


@triton.jit
def _hopper_attention_kernel(
    desc_q, desc_k, desc_v, desc_o, LSE, CacheSeqlens,
    heads, kv_heads, seqlen_q, seqlen_k, softmax_scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, HAS_CACHE_SEQLENS: tl.constexpr, RETURN_LSE: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr, OVERLAP: tl.constexpr,
):  # fmt: skip
    m_block, batch_head, head, start_m, coords = tile_coordinates(
        CacheSeqlens, heads, kv_heads, seqlen_q, seqlen_k, BLOCK_M, CAUSAL, BOTTOM_RIGHT, HAS_CACHE_SEQLENS
    )
    # 1. Q tile, loaded once; rows past Sq read as zeros.
    q = desc_q.load([coords[0], head, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    state = (acc, row_sum, row_max)
    kv = (desc_k, desc_v)
    # 2+3. The key blocks, hand-pipelined or block after block.
    if OVERLAP:
        acc, row_sum, row_max = _overlapped_kv_loop(
            state, q, kv, coords, m_block, softmax_scale_log2, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL
        )
    else:
        acc, row_sum, row_max = kv_loop(
            attention_step, state, q, kv, coords, m_block, softmax_scale_log2,
            HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, WARP_SPECIALIZE,
        )  # fmt: skip
    # 4. O = acc / row_sum and the lse; a row that saw no key writes 0 and (RETURN_LSE) an lse of -inf.
    out, lse = online_softmax_finalize(acc, row_max, row_sum, 1.0)
    store_tile(desc_o, LSE, out, lse, coords, batch_head, head, start_m, seqlen_q, BLOCK_M, HEAD_DIM, RETURN_LSE)


# ----------------------------------------------------------------------------------------------
# Host: validate, build descriptors and buffers once, launch
# ----------------------------------------------------------------------------------------------


def descriptor(tensor: torch.Tensor, box_rows: int, box_cols: int | None = None) -> TensorDescriptor:
    """A 4-D TMA descriptor over (B, H, rows, cols): one (batch, head) box of box_rows × box_cols
    (default: all columns) per copy, so every (batch, head) keeps its own bounds."""
    box_cols = box_cols or tensor.shape[-1]
    return TensorDescriptor(tensor, list(tensor.shape), list(tensor.stride()), [1, 1, box_rows, box_cols])


def kernel_sizes(problem: Problem) -> dict[str, int | float]:
    """The kernel's scalar arguments by name (both Triton Hopper rungs): head counts, lengths, scale."""
    return dict(zip(SIZE_SIGNATURE, size_arguments(problem), strict=True))


class HopperAttention:
    """Prepared launch: descriptors, O (and the LSE when the problem returns it) allocated once;
    calling it launches the kernel and returns O, or (O, lse)."""

    def __init__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, config: HopperKernelConfig,
        cache_seqlens: torch.Tensor | None = None,
    ):  # fmt: skip
        batch, heads, seqlen_q, _ = q.shape
        self.config = config
        self.out = torch.empty_like(q)
        self.lse = allocate_lse(problem, q.device)
        # K and V keep their (B, Hkv, Sk, D) shape: the kernel indexes them by KV head.
        self._args = (
            descriptor(q, config.block_m),
            descriptor(k, config.block_n),
            descriptor(v, config.block_n),
            descriptor(self.out, config.block_m),
            *feature_buffers(self.lse, cache_seqlens, q.device),
        )
        self._kwargs = {**kernel_sizes(problem), **kernel_constexprs(problem, config), **config.launch_options()}
        self._grid = (triton.cdiv(seqlen_q, config.block_m), batch * heads)

    def __call__(self) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        _hopper_attention_kernel[self._grid](*self._args, **self._kwargs)
        return rung_result(self.out, self.lse)


def non_negative_scale(rung: str) -> Check:
    """The Hopper rungs' rule on a validated problem: row maxima are taken before scaling, which needs
    softmax_scale >= 0."""

    def check(problem: Problem, device: torch.device) -> tuple[bool, str]:
        if problem.scale < 0:
            return False, f"softmax_scale must be >= 0 for {rung}, got {problem.scale}"
        return True, ""

    return check


def bind(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, *,
    cache_seqlens: torch.Tensor | None = None, config: HopperKernelConfig | None = None,
) -> HopperAttention:  # fmt: skip
    """Descriptors, O and the LSE for validated q, k, v at ``config`` (default: this head dim's), no launch."""
    config = config or default_config(problem.head_dim)
    check_launchable(config, q.device)
    q, k, v = (kernel_operand(t) for t in (q, k, v))
    return HopperAttention(q, k, v, problem, config, cache_seqlens)


# prepare = validate (every Triton feature, softmax_scale >= 0) → bind (``config=``: another
# configuration than the default) → warm up.
ENTRY = TritonEntry(TritonInputs("triton/hopper", HEAD_DIMS, check=non_negative_scale("triton/hopper")), bind)
prepare = ENTRY.prepare


# ----------------------------------------------------------------------------------------------
# Capability check and static compile
# ----------------------------------------------------------------------------------------------
def hopper_supported(problem: Problem, device: torch.device, rung: str, needs: str) -> tuple[bool, str]:
    """Head dim, scale, feature and sm_90 checks of both Triton Hopper rungs (after their own dtype
    check). Both implement every problem feature: GQA, both causal alignments, cache_seqlens, the LSE."""
    ok, reason = tile_rung_supported(rung, problem, HEAD_DIMS)
    if not ok:
        return ok, reason
    # On the CPU the interpreter runs it; a GPU must be sm_90, the one architecture its tiles are for.
    return check_sm90(rung, device, needs) if device.type == "cuda" else (True, "")


def kernel_fits(rung: str, problem: Problem, config: HopperKernelConfig, element_bytes: int) -> tuple[bool, str]:
    """The shared kernel's shared memory at ``config`` (the launcher's configuration) within sm_90's
    budget; ``element_bytes``: the tiles' element size (1 for fp8)."""
    kernel = (
        f"the attention kernel at head_dim {problem.head_dim} ({config.block_m}x{config.block_n} tiles, "
        f"{config.num_stages} stages)"
    )
    return check_shared_memory(rung, kernel, config.shared_bytes(problem.head_dim, element_bytes))


def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    ok, reason = triton_device_supported(device)
    if not ok:
        return ok, reason
    # The ladder's dtype check: fp32 only under the interpreter, and bf16 refused there, where it
    # computes a wrong answer without any error (relative error 4e9, issue #38).
    ok, reason = triton_dtype_supported(problem.dtype)
    if not ok:
        return False, f"triton/hopper: {reason}"
    ok, reason = hopper_supported(problem, device, "triton/hopper", "TMA and wgmma")
    if not ok:
        return ok, reason
    config = default_config(problem.head_dim)
    return kernel_fits("triton/hopper", problem, config, problem.dtype.itemsize)


def _descriptor_type(dtype_name: str, block_rows: int, head_dim: int) -> str:
    return f"tensordesc<{dtype_name}[1,1,{block_rows},{head_dim}]>"


# Runtime arguments both Triton Hopper rungs pass besides the descriptors (and fp8's scales).
SCALAR_SIGNATURE = {"LSE": "*fp32", "CacheSeqlens": "*i32", **SIZE_SIGNATURE}


def compile_sm90(problem: Problem, config: HopperKernelConfig | None = None) -> list[KernelBinary]:
    """The kernel for sm_90a at the default configuration of this head dim (no GPU needed)."""
    config = config or DEFAULT_CONFIGS[problem.head_dim]
    dtype_name = TRITON_DTYPES[problem.dtype]
    q_type = _descriptor_type(dtype_name, config.block_m, problem.head_dim)
    kv_type = _descriptor_type(dtype_name, config.block_n, problem.head_dim)
    signature = {"desc_q": q_type, "desc_k": kv_type, "desc_v": kv_type, "desc_o": q_type, **SCALAR_SIGNATURE}
    return [compile_kernel_sm90(_hopper_attention_kernel, signature, kernel_constexprs(problem, config), config)]


def compile_kernel_sm90(
    kernel: triton.JITFunction, signature: dict[str, str], constexprs: dict[str, object], config: HopperKernelConfig
) -> KernelBinary:
    """A Triton Hopper kernel (this rung's or fp8's) for sm_90a: ``signature`` types its runtime arguments."""
    return compile_triton_sm90(kernel, signature, constexprs, options=config.launch_options(), aligned=("LSE",))


IMPLEMENTATION = ENTRY.implementation(
    supports,
    compile_sm90,
    required_ptx=("cp.async.bulk.tensor", "wgmma.mma_async"),
    forbidden_ptx=("cp.async",),
    source_file=__file__,
    default_configs=DEFAULT_CONFIGS,
    backward=tiled_backward.BACKWARD,
)
