"""Rung 4, pipelined FlashAttention-2 in Triton (counterpart: ``cute_impl/pipelined.py``).

What it adds over ``tiled``, three things, each removing a bottleneck of that rung:
  * Software pipelining (``num_stages`` ≥ 2): Triton's pipeliner issues the loads of the next K/V
    blocks (``cp.async`` into a ring of shared-memory buffers) while the tensor cores work on the
    current one, so the MMAs no longer wait for HBM after every block.
  * Autotuned tiles: BLOCK_M, BLOCK_N, num_warps and num_stages are chosen per problem shape by
    timing candidates in ``prepare`` (never inside ``run()``), after dropping every candidate whose
    compiled kernel needs more shared memory than the device offers. The canonical problem family
    (``Problem.canonical``) uses a fixed configuration so its numbers are reproducible.
  * A peeled causal mainloop: key blocks wholly below the diagonal run without any mask (no index
    compares, no -inf guard, unmasked loads); only the diagonal blocks and the sequence tail run
    the masked step; blocks wholly above the diagonal are skipped. Causal tiles are launched
    heaviest first, so the short tiles fill the tail of the grid.

Algorithm (one program per BLOCK_M query rows of one (batch, head)):
  1. Pick the query tile (heaviest first when causal) and load its Q tile once.
  2. ``block_range`` (the BlockRange of ``_device.py``) gives the key blocks [n_block_min,
     n_block_max) the tile visits; the last ``n_masked_blocks`` of them need the sequence and causal
     mask, the ones before are visible to every row of the tile.
  3. ``attend_key_range`` (``attend_key_blocks`` twice) folds the unmasked blocks, then the masked
     ones, into the running (acc, row_max, row_sum): S = Q Kᵀ → ``attention_mask`` → ``online_softmax_update`` →
     ``online_softmax_rescale`` of O → O += P V.
  4. ``online_softmax_finalize``: O = acc / row_sum, stored in the input dtype (rows past Sq are not
     stored).

Data movement: Q goes HBM → shared memory once; K (read as Kᵀ) and V stream HBM → shared memory
through ``cp.async`` into ``num_stages`` buffers, tracked by async-copy groups; ``wgmma.mma_async``
reads both operands of S = Q Kᵀ from shared memory and P from registers for O += P V; S, P and the
O accumulator stay in registers.

Constraints: fp16 and bf16 on a CUDA GPU (fp32 under the Triton interpreter only, which mishandles
bf16 ``tl.dot``; there autotuning is skipped and the fixed configuration runs); D ∈ {32, 64, 128,
256} (256 only where a candidate fits the device's shared memory, else the capability check says
so); any Sq, Sk ≥ 1; causal (top-left or bottom-right) or not; GQA (``kv_head_index``);
``cache_seqlens`` (``seqlen_info``); the LSE, stored in the epilogue. Backward (``common.attention``
with inputs that require grad): ``triton_impl/backward/tiled.py``, from this rung's O and LSE.

What the measurements taught (figures in the generated table of ``docs/ladder.md``; the tuner's
timings and earlier defaults in ``docs/perf-log.md``, "Figures moved out of rung docstrings"): the
tuner's timings rank configurations by up to 2x, the pipeline depth matters most (a third stage
beats a larger tile), and 128 × 64 tiles with 4 warps are the worst choice.
Triton releases (``common.toolchain.releases``): at D=256 non-causal Triton 3.9 spills with 4 warps, so it
runs 8 warps there (like all of D=256, not timed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch
import triton
import triton.language as tl

from common.contract.devices import triton_interpreting
from common.contract.problem import Problem
from common.contract.registry import Runner
from common.contract.validation import kernel_operand
from common.toolchain.compile import KernelBinary
from common.toolchain.releases import release_configs
from triton_impl._device import (
    attend_key_range,
    block_range,
    online_softmax_finalize,
    query_heads,
    seqlen_info,
)
from triton_impl._host import (
    TritonEntry,
    TritonInputs,
    allocate_lse,
    compile_pointer_kernel,
    feature_constexprs,
    ladder_supported,
    pointer_arguments,
    pointer_runner,
)
from triton_impl.backward import tiled as tiled_backward


@dataclass(frozen=True)
class TileConfig:
    """Everything the autotuner chooses; each field changes the generated code."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    def describe(self) -> str:
        return f"BLOCK_M={self.block_m} BLOCK_N={self.block_n} warps={self.num_warps} stages={self.num_stages}"


# Fixed configurations per (head dim, causal): the canonical problems and the interpreter run
# these. D=128 and D=64 were chosen from the tuner's timings on the H200 at the canonical shape
# (bf16; docs/perf-log.md). D=32 reuses D=64's choice and D=256 takes the one shape whose K/V
# stages fit; neither was measured.
_WIDE = TileConfig(128, 128, 8, 3)
_NARROW = TileConfig(64, 64, 4, 3)
# Chosen under Triton 3.6; ``release_configs`` applies another release's spill-free replacements.
DEFAULT_CONFIGS: dict[tuple[int, bool], TileConfig] = release_configs(
    "triton/pipelined",
    {
        (32, False): _NARROW,
        (32, True): _NARROW,
        (64, False): _NARROW,
        (64, True): _NARROW,
        (128, False): _WIDE,
        (128, True): _NARROW,
        (256, False): TileConfig(64, 32, 4, 2),
        (256, True): TileConfig(64, 32, 4, 2),
    },
)
HEAD_DIMS = tuple(sorted({head_dim for head_dim, _ in DEFAULT_CONFIGS}))
# What the autotuner times: tile shapes that map onto one or two warpgroups, two or three stages.
CANDIDATES: tuple[TileConfig, ...] = tuple(
    TileConfig(block_m, block_n, num_warps, num_stages)
    for block_m, block_n, num_warps in ((128, 128, 8), (128, 64, 8), (128, 64, 4), (64, 64, 4), (64, 32, 4))
    for num_stages in (2, 3)
)
# Timing budget per candidate while tuning (milliseconds of warm-up and of measurement).
TUNE_WARMUP_MS, TUNE_REP_MS = 5, 25
# Tuned configurations, keyed on everything that changes the best choice (see _tuning_key).
_TUNED: dict[tuple, TileConfig] = {}
# Problems whose canonical test and tuning key are remembered (the hot path of bind).
PLANNED_PROBLEMS = 1024


# ----------------------------------------------------------------------------------------------
# Kernel: the mainloop peeled into unmasked and masked key blocks
# ----------------------------------------------------------------------------------------------
@triton.jit
def _pipelined_kernel(
    Q, K, V, Out, Lse, CacheSeqlens,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om,
    heads, kv_heads, seqlen_q, seqlen_k, softmax_scale_log2,
    CAUSAL: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, HAS_CACHE_SEQLENS: tl.constexpr, RETURN_LSE: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # 1. Causal tiles near the bottom see the most keys: launching them first shortens the tail.
    m_block = tl.num_programs(0) - 1 - tl.program_id(0) if CAUSAL else tl.program_id(0)
    batch_head = tl.program_id(1)
    batch, head, kv_head = query_heads(batch_head, heads, kv_heads)
    seqlen_k, causal_offset = seqlen_info(CacheSeqlens, batch, seqlen_q, seqlen_k, HAS_CACHE_SEQLENS, BOTTOM_RIGHT)
    q_base = Q + batch * stride_qb + head * stride_qh
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh
    o_base = Out + batch * stride_ob + head * stride_oh

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seqlen_q
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :], mask=row_ok[:, None], other=0.0)

    row_max = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)

    # 2. Which key blocks need no mask, which need one, and where to stop. The loops below step over
    # key offsets; the masked range ends at the last key a row of the tile sees (Sk when not causal).
    n_block_min, n_block_max, n_masked_blocks = block_range(m_block, seqlen_k, causal_offset, CAUSAL, BLOCK_M, BLOCK_N)
    unmasked_end = (n_block_max - n_masked_blocks) * BLOCK_N
    key_end = tl.minimum(seqlen_k, m_block * BLOCK_M + BLOCK_M + causal_offset) if CAUSAL else seqlen_k

    # 3. The unmasked blocks first (the bulk of the work), then the diagonal and the sequence tail.
    acc, row_max, row_sum = attend_key_range(
        acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_vn,
        offs_m, n_block_min * BLOCK_N, unmasked_end, key_end, seqlen_k, causal_offset, softmax_scale_log2,
        CAUSAL=CAUSAL, HEAD_DIM=HEAD_DIM, BLOCK_N=BLOCK_N,
    )  # fmt: skip

    # 4. Normalise once; a row with no visible key (row_sum 0) is written as 0, not 0 / 0, and its
    # LSE as -inf. The LSE is (B, H, Sq) contiguous: row offs_m of (batch, head) is batch_head · Sq + m.
    out, lse = online_softmax_finalize(acc, row_max, row_sum, 1.0)
    tl.store(o_base + offs_m[:, None] * stride_om + offs_d[None, :], out.to(Out.dtype.element_ty), mask=row_ok[:, None])
    if RETURN_LSE:
        tl.store(Lse + batch_head.to(tl.int64) * seqlen_q + offs_m, lse, mask=row_ok)


# ----------------------------------------------------------------------------------------------
# Host: launch with a configuration, choose the configuration, prepare
# ----------------------------------------------------------------------------------------------
def _launch_options(config: TileConfig, problem: Problem) -> dict[str, int | bool]:
    return {
        **feature_constexprs(problem),
        "HEAD_DIM": problem.head_dim, "BLOCK_M": config.block_m, "BLOCK_N": config.block_n,
        "num_warps": config.num_warps, "num_stages": config.num_stages,
    }  # fmt: skip


def _launch(config: TileConfig, args: tuple, problem: Problem) -> None:
    grid = (triton.cdiv(problem.seqlen_q, config.block_m), problem.batch * problem.heads)
    _pipelined_kernel[grid](*args, **_launch_options(config, problem))


def _compiled_shared_bytes(config: TileConfig, args: tuple, problem: Problem) -> int:
    """Shared memory the compiled kernel needs: exact, from compiling it (no launch)."""
    return _pipelined_kernel.warmup(*args, **_launch_options(config, problem), grid=(1,)).metadata.shared


def shared_memory_budget(device: torch.device) -> int:
    """Shared memory one CTA may use on ``device`` (the opt-in maximum), read from the device."""
    return torch.cuda.get_device_properties(device).shared_memory_per_block_optin


# Memoised (bind asks at every call of common.attention): problems and devices are hashable.
@lru_cache(maxsize=PLANNED_PROBLEMS)
def _is_canonical(problem: Problem) -> bool:
    canonical = Problem.canonical(
        problem.seqlen_q, head_dim=problem.head_dim, dtype=problem.dtype, causal=problem.causal
    ).with_(softmax_scale=problem.softmax_scale)
    return problem == canonical


@lru_cache(maxsize=PLANNED_PROBLEMS)
def _tuning_key(problem: Problem, device: torch.device) -> tuple:
    # Shapes within a power of two share a tuned choice; everything compiled in is in the key.
    def bucket(n: int) -> int:
        return 1 << math.ceil(math.log2(n))

    return (
        torch.cuda.get_device_name(device),
        problem.dtype,
        problem.head_dim,
        tuple(feature_constexprs(problem).items()),
        problem.kv_group,
        bucket(problem.batch * problem.heads),
        bucket(problem.seqlen_q),
        bucket(problem.seqlen_k),
    )


def tune(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, problem: Problem,
    cache_seqlens: torch.Tensor | None = None,
) -> list[tuple[TileConfig, float]]:  # fmt: skip
    """Median milliseconds of every candidate that fits the device's shared memory, fastest first."""
    budget = shared_memory_budget(q.device)
    args = pointer_arguments(q, k, v, out, problem, allocate_lse(problem, q.device), cache_seqlens)
    timings = []
    for config in CANDIDATES:
        if _compiled_shared_bytes(config, args, problem) > budget:
            continue
        ms = triton.testing.do_bench(
            lambda config=config: _launch(config, args, problem), warmup=TUNE_WARMUP_MS, rep=TUNE_REP_MS
        )
        timings.append((config, ms))
    return sorted(timings, key=lambda timing: timing[1])


def planned_config(problem: Problem, device: torch.device) -> TileConfig | None:
    """The configuration of ``problem``: fixed under the interpreter and for canonical problems,
    else the one tuned for its bucket (None until ``choose_config`` has tuned it)."""
    if triton_interpreting() or _is_canonical(problem):
        return DEFAULT_CONFIGS[problem.head_dim, problem.causal]
    return _TUNED.get(_tuning_key(problem, device))


def choose_config(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, problem: Problem,
    cache_seqlens: torch.Tensor | None = None,
) -> TileConfig:  # fmt: skip
    """``planned_config``, autotuning on these tensors first where the bucket has no choice yet."""
    config = planned_config(problem, q.device)
    if config is None:
        timings = tune(q, k, v, out, problem, cache_seqlens)
        if not timings:
            raise ValueError(
                f"no pipelined configuration fits the shared memory of {q.device} for {problem.describe()}"
            )
        config = _TUNED[_tuning_key(problem, q.device)] = timings[0][0]
    return config


def _tune_once(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, cache_seqlens: torch.Tensor | None
) -> None:
    """``prepare``'s plan: choose the tiles of validated q, k, v (autotuning here, once per bucket)."""
    operands = [kernel_operand(t) for t in (q, k, v)]
    out = torch.empty_like(operands[0], memory_format=torch.contiguous_format)
    choose_config(*operands, out, problem, cache_seqlens)


def bind(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, *, cache_seqlens: torch.Tensor | None = None
) -> Runner:
    """Allocate O (and the LSE) for validated q, k, v and return ``run()`` launching the kernel with
    the planned tiles, tuning them first where this problem's bucket has none yet: ``attention()``
    binds a growing cache's plan (a DynamicCache's decode step, one key more each call) without
    preparing it, and Sk crosses into a new power-of-two bucket every doubling."""
    config = planned_config(problem, q.device)
    if config is None:
        _tune_once(q, k, v, problem, cache_seqlens)
        config = planned_config(problem, q.device)
    launch_options = _launch_options(config, problem)
    return pointer_runner(_pipelined_kernel, q, k, v, problem, cache_seqlens, config.block_m, launch_options)


# prepare = validate (every Triton feature, these head dims) → choose the tiles → bind → warm up.
ENTRY = TritonEntry(TritonInputs("triton/pipelined", HEAD_DIMS), bind, plan=_tune_once)
prepare = ENTRY.prepare


# ----------------------------------------------------------------------------------------------
# Capability check and sm_90a compile path
# ----------------------------------------------------------------------------------------------
def _estimated_shared_bytes(config: TileConfig, problem: Problem) -> int:
    # Q once plus a K and a V buffer per stage, in the input dtype: a lower bound of what Triton
    # allocates, good enough to refuse configurations that cannot fit before compiling anything.
    element = torch.empty((), dtype=problem.dtype).element_size()
    return element * problem.head_dim * (config.block_m + 2 * config.num_stages * config.block_n)


def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    ok, reason = ladder_supported(problem, device, HEAD_DIMS)
    if not ok:
        return False, reason
    if device.type == "cuda":
        budget = shared_memory_budget(device)
        config = DEFAULT_CONFIGS[problem.head_dim, problem.causal]
        needed = _estimated_shared_bytes(config, problem)
        if needed > budget:
            return False, (
                f"head_dim {problem.head_dim} needs at least {needed:,} bytes of shared memory per CTA "
                f"({config.describe()}); {device} offers {budget:,}"
            )
    return True, ""


def compile_sm90(problem: Problem) -> list[KernelBinary]:
    """The kernel compiled for sm_90a at ``problem``'s head dim, dtype and mask, fixed configuration."""
    config = DEFAULT_CONFIGS[problem.head_dim, problem.causal]
    constexprs = {
        **feature_constexprs(problem),
        "HEAD_DIM": problem.head_dim, "BLOCK_M": config.block_m, "BLOCK_N": config.block_n,
    }  # fmt: skip
    binary = compile_pointer_kernel(
        _pipelined_kernel, problem, constexprs, num_warps=config.num_warps, num_stages=config.num_stages
    )
    return [binary]


IMPLEMENTATION = ENTRY.implementation(
    supports,
    compile_sm90,
    required_ptx=("wgmma.mma_async", "cp.async"),
    source_file=__file__,
    default_configs=DEFAULT_CONFIGS,
    backward=tiled_backward.BACKWARD,
)
