"""Rung 5, Hopper attention in Triton: TMA + wgmma, a hand-pipelined KV loop (counterpart: ``cute_impl/hopper.py``).

What it adds over ``pipelined``: every tile moves through the Tensor Memory Accelerator instead of
per-thread ``cp.async`` copies, and both GEMMs run as asynchronous warpgroup MMAs (``wgmma``)
reading their operands straight from shared memory. A TMA copy is one instruction issued by one
thread for a whole BLOCK_N × D tile, with address generation and out-of-bounds zero-fill done by
the copy engine, so the warps that do the softmax no longer spend issue slots on address math.
Optionally the KV loop is warp-specialised (``tl.range(..., warp_specialize=True)``): Triton splits
the loop into a producer warp that only issues TMA loads and consumer warps that only compute, and
rebalances registers between them with ``setmaxnreg`` (refused on a GPU, where Triton's warp-specialised
loop left rows unwritten: ``check_launchable``). Causal attention is split into a loop over
unmasked blocks and a loop over the diagonal blocks, and the blocks above the diagonal are never
visited. ``HopperConfig.overlap`` selects a KV loop software-pipelined by hand (``_overlapped_step``):
each step issues S_n = Q K_nᵀ, then O += P V of block n-1, then the softmax of S_n, so Triton's
wait for S_n comes before the P V wgmma is issued and that wgmma runs under the softmax (FA3's
intra-warpgroup overlap); the default loop waits for P V together with the next S.

What Triton decides for you that ``cute_impl/hopper.py`` writes by hand: the shared-memory layout
and swizzle of every tile, the mbarrier ring that pipelines the TMA loads (``num_stages`` deep), the
wgmma instruction shape and the fragment layout of S, P and O, the wait depth of the asynchronous
MMAs, and, with warp specialisation, the producer/consumer split and register budgets.

Algorithm (one program per BLOCK_M query rows of one (batch, head); sections of the kernel):
  1. Load the Q tile once by TMA (rows past Sq are zero-filled by the descriptor's bounds).
  2. Unmasked loop over KV blocks that every row of the tile sees completely: S = Q Kᵀ (wgmma),
     row_max_new = max(row_max, rowmax(S) · softmax_scale_log2), P = exp2(S · softmax_scale_log2 -
     row_max_new) (the scale folded into one FMA), rescale O and row_sum by exp2(row_max -
     row_max_new), O += P V (wgmma, P from registers).
  3. Masked loop over the remaining blocks (the causal diagonal, and the last block when Sk is not
     a multiple of BLOCK_N): the same step with S set to -inf where a key is past Sk or after the
     query row; a row that has seen only masked keys keeps row_max = -inf and subtracts 0 instead,
     so exp2 gives 0, never NaN.
  4. O /= row_sum, written by a TMA store (rows past Sq are clipped by the descriptor);
     lse = (row_max + log2(row_sum)) · ln 2 (natural log) to an fp32 (B, H, Sq) buffer.

Data movement: HBM → SMEM by ``cp.async.bulk.tensor`` (4-D host descriptors over (B, H, S, D) with a
[1, 1, BLOCK, D] box, so each (batch, head) is bounded by its own S: a ragged tail reads zeros, not
the next head's rows), completion signalled on ``mbarrier``s; SMEM → tensor cores by
``wgmma.mma_async`` (Q and K from SMEM for S = Q Kᵀ; P from registers and V from SMEM for O += P V);
fp32 accumulators in registers; O registers → SMEM → HBM by a TMA store.

Constraints: fp16 and bf16 (fp32 only under the interpreter, for the CPU tests); D ∈ {64, 128, 256};
any Sq, Sk ≥ 1, Sq ≠ Sk; causal (top-left) or not; softmax_scale ≥ 0 (row maxima are taken before
scaling, which needs a non-negative scale); sm_90 or newer. Row strides must be 16-byte aligned
(``kernel_operand`` copies otherwise).

What the measurements taught (the A/B tables are in ``docs/perf-log.md``, "Figures moved out of
rung docstrings"; current figures in the generated table of ``docs/ladder.md``): the hand-pipelined
loop is the largest single gain, because without it the wait for S_n also retires the P V of block
n-1 and the tensor cores idle through every softmax. On sm_90 Triton 3.6's warp specialisation is
limited to one consumer warpgroup (BLOCK_M=64): each CTA then issues m64 wgmmas from a single
warpgroup with the whole softmax on its critical path, and it runs at half the speed of the
software-pipelined two-warpgroup kernel, so the default is not specialised (the flag is kept, tested
and documented). The third pipeline stage hides the TMA latency behind a full S = Q Kᵀ. The
remaining gap to cuDNN is the overlap of softmax with the MMAs across the two warpgroups (FA3's
ping-pong), which Triton's scheduler does not do here.
Triton releases (``common.toolchain``): under Triton 3.9 the hand-pipelined loop at 128 × 128 spills
(104 bytes per thread, 88 causal), as it must hold S, P, O and the P V in flight at once; 3.9 runs
the plain loop (222 registers), the fastest spill-free tile of the three timed under 3.9 (the
overlapped loop with 2 stages, or with 128 × 64 tiles, was slower; docs/perf-log.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources
from triton.tools.tensor_descriptor import TensorDescriptor

from common.devices import triton_device_supported, triton_dtypes, triton_interpreting
from common.problem import Problem
from common.registry import Implementation, KernelBinary, Runner, warmed_up
from common.static import compile_triton_sm90
from common.toolchain import release_configs
from common.validation import kernel_operand
from triton_impl._host import LOG2_E, validate_triton_inputs

# Natural log of 2, read inside the kernel (hence a constexpr): lse = log2-domain lse · ln 2.
LN_2 = tl.constexpr(0.6931471805599453)
HEAD_DIMS = (64, 128, 256)
HOPPER_CAPABILITY = (9, 0)
# Dynamic shared memory one CTA may use on sm_90 (227 KiB).
SHARED_MEMORY_BUDGET = 232_448
TRITON_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


# ----------------------------------------------------------------------------------------------
# Configurations: tile sizes, warps, pipeline depth, warp specialisation
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HopperConfig:
    """One point of the tuning space; every field changes the generated code."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    warp_specialize: bool
    # Software-pipelined KV loop (``_overlapped_step``): P V of block n-1 runs under the softmax of n.
    overlap: bool = False
    # Extra ptxas flags (Triton's ``ptx_options``), set per release by ``common.toolchain``.
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
    HopperConfig(block_m, block_n, num_warps, num_stages, False, overlap)
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


def check_launchable(config: HopperConfig, device: torch.device) -> None:
    """Refuse a configuration known to give wrong answers on the GPU, naming why."""
    if config.warp_specialize and device.type == "cuda":
        raise ValueError(f"{config}: {WARP_SPECIALIZE_REFUSAL}")


# Reproducible defaults per head dim (the canonical shape uses D=128), chosen by measurement under
# Triton 3.6; ``release_configs`` applies another release's spill-free replacements.
DEFAULT_CONFIGS = release_configs(
    "triton/hopper",
    {
        64: HopperConfig(128, 128, 8, 3, False),
        128: HopperConfig(128, 128, 8, 3, False, overlap=True),
        256: HopperConfig(64, 64, 4, 2, False),
    },
)
# Interpreter runs use small tiles: the CPU tests need a ragged tail, not speed.
INTERPRETER_CONFIG = HopperConfig(64, 32, 4, 1, False)


def default_config(head_dim: int) -> HopperConfig:
    """The fixed configuration used unless autotuning is asked for."""
    return INTERPRETER_CONFIG if triton_interpreting() else DEFAULT_CONFIGS[head_dim]


def candidate_configs(head_dim: int, dtype: torch.dtype) -> list[HopperConfig]:
    """Candidates that fit the shared-memory budget for this head dim and dtype."""
    element_bytes = torch.empty((), dtype=dtype).element_size()
    return [config for config in CANDIDATE_CONFIGS if config.fits(head_dim, element_bytes)]


# ----------------------------------------------------------------------------------------------
# Kernel
# ----------------------------------------------------------------------------------------------
@triton.jit
def _online_softmax(
    S, row_max, row_sum, offs_m, start_n, seqlen_k, softmax_scale_log2,
    BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, P_EXPONENT: tl.constexpr = 0.0,
):  # fmt: skip
    """(mask), row_max_new, P = exp2(S · scale - row_max_new + P_EXPONENT), alpha = exp2(row_max -
    row_max_new), row_sum. P_EXPONENT > 0 (fp8) scales P up by a constant that cancels in O / row_sum."""
    if MASKED:
        # Scale before masking: -inf · 0 would be NaN for softmax_scale = 0.
        S = S * softmax_scale_log2
        offs_n = start_n + tl.arange(0, BLOCK_N)
        visible = offs_n[None, :] < seqlen_k
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= offs_m[:, None])
        S = tl.where(visible, S, float("-inf"))
        row_max_new = tl.maximum(row_max, tl.max(S, 1))
        # Guard: a row with no visible key so far subtracts 0, so exp2(-inf) = 0 and not NaN.
        row_max_base = tl.where(row_max_new == float("-inf"), 0.0, row_max_new)
        P = tl.math.exp2(S - (row_max_base - P_EXPONENT)[:, None])
    else:
        row_max_new = tl.maximum(row_max, tl.max(S, 1) * softmax_scale_log2)
        row_max_base = row_max_new
        P = tl.math.exp2(S * softmax_scale_log2 - (row_max_base - P_EXPONENT)[:, None])
    alpha = tl.math.exp2(row_max - row_max_base)
    row_sum = row_sum * alpha + tl.sum(P, 1)
    return P, alpha, row_max_new, row_sum


@triton.jit
def _attention_step(
    acc, row_sum, row_max, q, desc_k, desc_v, batch, head, offs_m, n_block, seqlen_k, softmax_scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """One KV block of steps 2 and 3: S = Q Kᵀ, (mask), online softmax, O += P V."""
    start_n = n_block * BLOCK_N
    k = desc_k.load([batch, head, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    S = tl.dot(q, k.T)
    P, alpha, row_max_new, row_sum = _online_softmax(
        S, row_max, row_sum, offs_m, start_n, seqlen_k, softmax_scale_log2, BLOCK_N, MASKED, CAUSAL
    )
    acc = acc * alpha[:, None]
    v = desc_v.load([batch, head, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    acc = tl.dot(P.to(v.dtype), v, acc)
    return acc, row_sum, row_max_new


@triton.jit
def _overlapped_step(
    acc, row_sum, row_max, P, alpha, q, desc_k, desc_v, batch, head, offs_m, n_block, seqlen_k,
    softmax_scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """One KV block, software-pipelined by hand: S = Q K_nᵀ, then O = O · alpha + P V_(n-1) with the P
    and alpha of the previous block, then the softmax of S_n. Triton waits for S before the softmax
    (wait_group 0, which also retires the previous P V), but issues P V_(n-1) asynchronously and waits
    for it only at the next S: that wgmma runs under this block's softmax."""
    start_n = n_block * BLOCK_N
    k = desc_k.load([batch, head, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    S = tl.dot(q, k.T)
    # Block n-1 = -1 lies before the sequence: the TMA box reads zeros (and P is 0 there anyway).
    v = desc_v.load([batch, head, start_n - BLOCK_N, 0]).reshape(BLOCK_N, HEAD_DIM)
    acc = tl.dot(P.to(v.dtype), v, acc * alpha[:, None])
    P, alpha, row_max, row_sum = _online_softmax(
        S, row_max, row_sum, offs_m, start_n, seqlen_k, softmax_scale_log2, BLOCK_N, MASKED, CAUSAL
    )
    return acc, row_sum, row_max, P, alpha


@triton.jit
def _hopper_attention_kernel(
    desc_q, desc_k, desc_v, desc_o, LSE,
    heads, seqlen_q, seqlen_k, softmax_scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, OVERLAP: tl.constexpr,
):  # fmt: skip
    # Causal tiles near the bottom do the most work: launching them first shortens the tail.
    m_block = tl.num_programs(0) - 1 - tl.program_id(0) if CAUSAL else tl.program_id(0)
    batch_head = tl.program_id(1)
    batch = batch_head // heads
    head = batch_head % heads
    start_m = m_block * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)

    # 1. Q tile, loaded once; rows past Sq read as zeros.
    q = desc_q.load([batch, head, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)

    # KV block ranges: [0, n_unmasked) needs no mask, [n_unmasked, n_stop) needs one.
    n_full = seqlen_k // BLOCK_N
    if CAUSAL:
        # Block n is unmasked for every row of the tile when its last key (n+1)·BLOCK_N - 1 <= start_m.
        n_unmasked = tl.minimum((start_m + 1) // BLOCK_N, n_full)
        n_stop = (tl.minimum(start_m + BLOCK_M, seqlen_k) + BLOCK_N - 1) // BLOCK_N
    else:
        n_unmasked = n_full
        n_stop = (seqlen_k + BLOCK_N - 1) // BLOCK_N

    if WARP_SPECIALIZE:
        # 2+3 in one warp-specialised loop with the mask on every block: Triton 3.6 on sm_90
        # specialises a kernel only when one loop holds the dots and that loop has no branch.
        for n_block in tl.range(0, n_stop, warp_specialize=True):
            acc, row_sum, row_max = _attention_step(
                acc, row_sum, row_max, q, desc_k, desc_v, batch, head, offs_m, n_block, seqlen_k,
                softmax_scale_log2, HEAD_DIM, BLOCK_N, True, CAUSAL,
            )  # fmt: skip
    elif OVERLAP:
        # 2+3 software-pipelined: each step issues S_n, then P V of block n-1, then the softmax of
        # S_n. P starts at 0 (the first step adds nothing), and one extra masked step past the last
        # block (every key hidden: P = 0, alpha = 1) adds the last block's P V.
        # P is carried in fp32: converted inside the step, it stays in registers as the wgmma A
        # operand (a carried 16-bit P would be staged through shared memory).
        P = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        alpha = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
        for n_block in tl.range(0, n_unmasked):
            acc, row_sum, row_max, P, alpha = _overlapped_step(
                acc, row_sum, row_max, P, alpha, q, desc_k, desc_v, batch, head, offs_m, n_block, seqlen_k,
                softmax_scale_log2, HEAD_DIM, BLOCK_N, False, CAUSAL,
            )  # fmt: skip
        for n_block in tl.range(n_unmasked, n_stop + 1):
            acc, row_sum, row_max, P, alpha = _overlapped_step(
                acc, row_sum, row_max, P, alpha, q, desc_k, desc_v, batch, head, offs_m, n_block, seqlen_k,
                softmax_scale_log2, HEAD_DIM, BLOCK_N, True, CAUSAL,
            )  # fmt: skip
    else:
        # 2. Blocks every row sees in full.
        for n_block in tl.range(0, n_unmasked):
            acc, row_sum, row_max = _attention_step(
                acc, row_sum, row_max, q, desc_k, desc_v, batch, head, offs_m, n_block, seqlen_k,
                softmax_scale_log2, HEAD_DIM, BLOCK_N, False, CAUSAL,
            )  # fmt: skip
        # 3. The causal diagonal and the ragged last block.
        for n_block in tl.range(n_unmasked, n_stop):
            acc, row_sum, row_max = _attention_step(
                acc, row_sum, row_max, q, desc_k, desc_v, batch, head, offs_m, n_block, seqlen_k,
                softmax_scale_log2, HEAD_DIM, BLOCK_N, True, CAUSAL,
            )  # fmt: skip

    # 4. Normalise and store; a row that saw no key (only rows past Sq) writes 0 and lse = -inf.
    has_keys = row_sum > 0.0
    inv_sum = tl.where(has_keys, 1.0 / row_sum, 0.0)
    out = acc * inv_sum[:, None]
    desc_o.store([batch, head, start_m, 0], out.to(desc_o.dtype).reshape(1, 1, BLOCK_M, HEAD_DIM))
    lse = tl.where(has_keys, (row_max + tl.math.log2(row_sum)) * LN_2, float("-inf"))
    lse_rows = LSE + batch_head.to(tl.int64) * seqlen_q + offs_m
    tl.store(lse_rows, lse, mask=offs_m < seqlen_q)


# ----------------------------------------------------------------------------------------------
# Host: validate, build descriptors and buffers once, launch
# ----------------------------------------------------------------------------------------------


def _descriptor(tensor: torch.Tensor, box_rows: int, box_cols: int | None = None) -> TensorDescriptor:
    """A 4-D TMA descriptor over (B, H, rows, cols): one (batch, head) box of box_rows × box_cols
    (default: all columns) per copy, so every (batch, head) keeps its own bounds."""
    box_cols = box_cols or tensor.shape[-1]
    return TensorDescriptor(tensor, list(tensor.shape), list(tensor.stride()), [1, 1, box_rows, box_cols])


class HopperAttention:
    """Prepared launch: descriptors, O and lse allocated once; calling it launches the kernel and returns O."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, config: HopperConfig):
        batch, heads, seqlen_q, head_dim = q.shape
        self.config = config
        self.out = torch.empty_like(q)
        self.lse = torch.empty((batch, heads, seqlen_q), device=q.device, dtype=torch.float32)
        self._args = (
            _descriptor(q, config.block_m),
            _descriptor(k, config.block_n),
            _descriptor(v, config.block_n),
            _descriptor(self.out, config.block_m),
            self.lse,
            heads,
            seqlen_q,
            problem.seqlen_k,
            problem.scale * LOG2_E,
        )
        self._constexprs = {
            "HEAD_DIM": head_dim,
            "BLOCK_M": config.block_m,
            "BLOCK_N": config.block_n,
            "CAUSAL": problem.causal,
            "WARP_SPECIALIZE": config.warp_specialize,
            "OVERLAP": config.overlap,
            **config.launch_options(),
        }
        self._grid = (triton.cdiv(seqlen_q, config.block_m), batch * heads)

    def __call__(self) -> torch.Tensor:
        _hopper_attention_kernel[self._grid](*self._args, **self._constexprs)
        return self.out


def _validate(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: Problem,
    rung: str = "triton/hopper",
    dtypes: tuple[torch.dtype, ...] | None = None,
) -> Problem:
    """The inputs checks of both Triton Hopper rungs (``dtypes``: the fp8 rung's own)."""
    checked = validate_triton_inputs(q, k, v, problem, HEAD_DIMS, dtypes)
    if checked.scale < 0:
        raise ValueError(f"softmax_scale must be >= 0 for {rung}, got {checked.scale}")
    return checked


def fastest_config(
    build: Callable[[HopperConfig], Callable[[], object]], candidates: Iterable[HopperConfig]
) -> HopperConfig:
    """Time every candidate's launch (``build(config)``) once, here in prepare, and keep the fastest."""
    timings = {}
    for config in candidates:
        try:
            timings[config] = triton.testing.do_bench(build(config))
        except OutOfResources:
            # The estimate is a pre-filter; warp-specialised kernels use more than it counts.
            continue
    return min(timings, key=timings.__getitem__)


def hopper_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: Problem,
    config: HopperConfig | None = None,
    autotune: bool = False,
) -> HopperAttention:
    """Validate, choose the configuration, compile by one warm-up launch; the result's call is run()."""
    checked = _validate(q, k, v, problem)
    q, k, v = (kernel_operand(t) for t in (q, k, v))
    if config is None:
        config = default_config(checked.head_dim)
        if autotune:
            candidates = candidate_configs(checked.head_dim, checked.dtype)
            config = fastest_config(partial(HopperAttention, q, k, v, checked), candidates)
    check_launchable(config, q.device)
    prepared = HopperAttention(q, k, v, checked, config)
    prepared()
    return prepared


def bind(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem) -> HopperAttention:
    """Descriptors and O for validated q, k, v at the default configuration, no launch."""
    q, k, v = (kernel_operand(t) for t in (q, k, v))
    return HopperAttention(q, k, v, problem, default_config(problem.head_dim))


def attention_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, softmax_scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """O (B, H, Sq, D) and the natural-log lse (B, H, Sq) in fp32, for callers that need both."""
    problem = _validate(q, k, v, Problem(1, 1, 1, 1, q.shape[-1], causal=causal, softmax_scale=softmax_scale))
    prepared = hopper_attention(q, k, v, problem)
    return prepared.out, prepared.lse


def prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem) -> Runner:
    """Validate, bind at the default configuration, and compile by one warm-up launch on a GPU."""
    return warmed_up(bind(q, k, v, _validate(q, k, v, problem)), q.device)


# ----------------------------------------------------------------------------------------------
# Capability check and static compile
# ----------------------------------------------------------------------------------------------
def hopper_supported(problem: Problem, device: torch.device, rung: str, needs: str) -> tuple[bool, str]:
    """Head dim, scale and sm_90 checks of both Triton Hopper rungs (after their own dtype check)."""
    if problem.head_dim not in HEAD_DIMS:
        return False, f"{rung} needs head_dim in {list(HEAD_DIMS)}, got {problem.head_dim}"
    if problem.scale < 0:
        return False, f"{rung} needs softmax_scale >= 0, got {problem.scale}"
    if device.type == "cuda":
        capability = torch.cuda.get_device_capability(device)
        if capability < HOPPER_CAPABILITY:
            return False, f"{rung} needs {needs} (sm_90+), got sm_{capability[0]}{capability[1]}"
    return True, ""


def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    ok, reason = triton_device_supported(device)
    if not ok:
        return ok, reason
    if problem.dtype not in triton_dtypes():
        return False, f"triton/hopper runs fp16 and bf16, got {problem.dtype_name}"
    return hopper_supported(problem, device, "triton/hopper", "TMA and wgmma")


def _descriptor_type(dtype_name: str, block_rows: int, head_dim: int) -> str:
    return f"tensordesc<{dtype_name}[1,1,{block_rows},{head_dim}]>"


def compile_sm90(problem: Problem, config: HopperConfig | None = None) -> list[KernelBinary]:
    """The kernel for sm_90a at the default configuration of this head dim (no GPU needed)."""
    config = config or DEFAULT_CONFIGS[problem.head_dim]
    dtype_name = TRITON_DTYPES[problem.dtype]
    q_type = _descriptor_type(dtype_name, config.block_m, problem.head_dim)
    kv_type = _descriptor_type(dtype_name, config.block_n, problem.head_dim)
    signature = {
        "desc_q": q_type,
        "desc_k": kv_type,
        "desc_v": kv_type,
        "desc_o": q_type,
        "LSE": "*fp32",
        "heads": "i32",
        "seqlen_q": "i32",
        "seqlen_k": "i32",
        "softmax_scale_log2": "fp32",
    }
    constexprs = {
        "HEAD_DIM": problem.head_dim,
        "BLOCK_M": config.block_m,
        "BLOCK_N": config.block_n,
        "CAUSAL": problem.causal,
        "WARP_SPECIALIZE": config.warp_specialize,
        "OVERLAP": config.overlap,
    }
    binary = compile_triton_sm90(
        _hopper_attention_kernel,
        signature,
        constexprs,
        options=config.launch_options(),
        aligned=("LSE",),
    )
    return [binary]


IMPLEMENTATION = Implementation(
    name="triton/hopper",
    stack="triton",
    rung="hopper",
    prepare=prepare,
    bind=bind,
    supports=supports,
    compile_sm90=compile_sm90,
    runs_on_cpu=True,
    required_ptx=("cp.async.bulk.tensor", "wgmma.mma_async"),
    forbidden_ptx=("cp.async",),
    source_file=__file__,
)
