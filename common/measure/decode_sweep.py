"""The decode workload of ``compare.py --decode``: one new token against a long KV cache.

The sweep (flash-decode issue's defaults): B ∈ {1, 8, 64}, cache lengths ∈ {4096, 32768, 131072},
32 query heads with 8 (GQA) or 32 KV heads, D = 128, Sq = 1, bf16, causal aligned bottom-right (the
KV-cache convention; with one token it sees every key), plus one ragged batch whose sequences have
their own lengths (``cache_seqlens``) and one paged batch (a block table of vLLM's default 16-key
pages, shuffled in the pool: the B=8, 8 KV heads, 32k case read through pages, so its row beside the
contiguous one shows what paging costs; implementations without a paged path report their refusal).
A decode step is memory-bound, so each row is judged by the
K and V bytes it must read (at each sequence's own length) over its time, in GB/s and as a share of
the measured HBM read bandwidth (``common.measure.peaks.measure_read_gbps``).

The roofline (:func:`roofline_us`): a step is memory-bound only while its tensor cores keep up. With
``rows = group · Sq`` packed query rows per KV head, a key costs 4 · D · rows FLOPs (Q Kᵀ and P V) for
its 4 · D bytes of K and V (bf16): ``rows`` FLOPs a byte. At 128 rows that is 4.4 TB/s × 128 = 564
TFLOP/s, near the H200's sustained bf16 GEMM rate (677 TFLOP/s); at group 16 × Sq 16 (256 rows) the
tensor cores, not HBM, set the floor, and no kernel reaches 85 % of the read bandwidth. So each row is
also judged against max(bytes / read bandwidth, FLOPs / sustained bf16 GEMM rate), the FLOPs counted
on the scores the causal mask keeps at each sequence's own length (``DecodeCase.flops``).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from common.contract.problem import Problem

if TYPE_CHECKING:
    from common.measure.runner import Workload

BATCHES = (1, 8, 64)
CACHE_LENGTHS = (4096, 32768, 131072)
KV_HEADS = (8, 32)
HEADS, HEAD_DIM = 32, 128
# The ragged batch: 8 sequences of a 32768-key padded cache, lengths spread from short to full.
RAGGED_BATCH, RAGGED_SEQLEN_K = 8, 32768
RAGGED_FRACTIONS = (1.0, 0.03, 0.5, 0.25, 0.9, 0.1, 0.7, 0.0)
# The paged batch: 8 full sequences of 32768 keys in pages of 16 (common.contract.inputs.make_block_table).
PAGED_BATCH, PAGED_SEQLEN_K, PAGE_SIZE = 8, 32768, 16
# The random sweep's caches: at least 128 MB read per step (issue #38: "every cache of 128 MB or more"),
# at most 4 GB, and all a case allocates (padded cache, fp64 reference, SDPA's GQA yardstick) at most
# 48 GiB, so that any Hopper runs every drawn case and each takes seconds.
RANDOM_MIN_CACHE_BYTES, RANDOM_MAX_CACHE_BYTES = 128 * 2**20, 4 * 2**30
RANDOM_MAX_MEMORY_BYTES = 48 * 2**30
# Device memory a case may plan for: inputs, the fp64 reference's per-head copies, and SDPA's
# yardstick, which may expand K and V to every query head (GQA through the math backend).
MEMORY_FRACTION = 0.8


@dataclass(frozen=True)
class DecodeCase:
    """One decode problem, with the per-sequence key lengths when the batch is ragged."""

    problem: Problem
    lengths: tuple[int, ...] | None = None

    def cache_seqlens(self, device: torch.device | str) -> torch.Tensor | None:
        if self.lengths is None:
            return None
        return torch.tensor(self.lengths, dtype=torch.int32, device=device)

    def gpu_workload(self, device: torch.device) -> tuple[Workload, dict[str, torch.Tensor]]:
        """The case's workload drawn on ``device`` (the padded caches reach 14 GB: the D=256 paged shape) and
        its per-call inputs beyond q, k, v (``common.contract.registry.per_call_inputs``)."""
        from common.contract.registry import per_call_inputs
        from common.measure.runner import make_workload

        workload = make_workload(self.problem, device.type, self.cache_seqlens(device), on_device=True)
        return workload, per_call_inputs(self.problem, workload.cache_seqlens, workload.block_table)

    @property
    def kv_bytes_read(self) -> int:
        """K and V bytes a decode step must read: every valid key of every KV head, once."""
        element = torch.empty((), dtype=self.problem.dtype).element_size()
        keys = sum(self.lengths) if self.lengths is not None else self.problem.batch * self.problem.seqlen_k
        return 2 * keys * self.problem.kv_heads * self.problem.head_dim * element

    @property
    def flops(self) -> int:
        """Tensor-core FLOPs a step must do: Q Kᵀ and P V (4 · D a kept score) on every score the mask
        keeps, each sequence at its own length (bottom-right causal: token i of Sq sees L - Sq + 1 + i keys)."""
        if self.lengths is None:
            return self.problem.flops
        return 4 * self.problem.head_dim * self.problem.visible_scores_for(self.lengths)

    def memory_needed(self) -> int:
        """A bound on the device memory of one case: the padded K and V, once more per query head of a
        group for SDPA's yardstick, plus Q, O and the reference's fp64 copies of one KV head."""
        p = self.problem
        element = torch.empty((), dtype=p.dtype).element_size()
        padded_kv = 2 * p.batch * p.kv_heads * p.seqlen_k * p.head_dim * element
        one_head_fp64 = 2 * p.seqlen_k * p.head_dim * 8
        # Paged: the pools and the contiguous cache the reference and the yardstick gather from them.
        copies = 2 + p.kv_group if p.paged else 1 + p.kv_group
        return padded_kv * copies + one_head_fp64 + 8 * p.batch * p.heads * p.seqlen_q * p.head_dim * 8

    def describe(self) -> str:
        ragged = f" lengths={min(self.lengths)}..{max(self.lengths)}" if self.lengths is not None else ""
        return self.problem.describe() + ragged


def decode_problem(
    batch: int,
    seqlen_k: int,
    kv_heads: int,
    *,
    ragged: bool = False,
    page_size: int = 0,
    heads: int = HEADS,
    head_dim: int = HEAD_DIM,
    seqlen_q: int = 1,
) -> Problem:
    """One decode step (``seqlen_q`` new tokens, bottom-right causal: the KV-cache convention); a paged
    one (``page_size`` > 0) carries per-sequence lengths, as paging requires."""
    return Problem(
        batch, heads, seqlen_q, seqlen_k, head_dim, dtype=torch.bfloat16, causal=True, kv_heads=kv_heads,
        causal_alignment="bottom_right", has_cache_seqlens=ragged or page_size > 0, page_size=page_size,
    )  # fmt: skip


def ragged_lengths(seqlen_k: int) -> tuple[int, ...]:
    """The ragged batch's cache lengths (``RAGGED_FRACTIONS`` of a ``seqlen_k``-key padded cache): one a sequence."""
    return tuple(round(fraction * seqlen_k) for fraction in RAGGED_FRACTIONS)


def decode_cases(
    batches: tuple[int, ...] = BATCHES,
    cache_lengths: tuple[int, ...] = CACHE_LENGTHS,
    kv_heads: tuple[int, ...] = KV_HEADS,
    ragged: bool = True,
    paged: bool = True,
) -> list[DecodeCase]:
    """The sweep: every (B, cache length, KV heads), then the ragged batch, then the paged one."""
    cases = [
        DecodeCase(decode_problem(batch, seqlen_k, heads))
        for heads in kv_heads
        for seqlen_k in cache_lengths
        for batch in batches
    ]
    if ragged:
        lengths = ragged_lengths(RAGGED_SEQLEN_K)
        cases.append(DecodeCase(decode_problem(RAGGED_BATCH, RAGGED_SEQLEN_K, min(kv_heads), ragged=True), lengths))
    if paged:
        problem = decode_problem(PAGED_BATCH, PAGED_SEQLEN_K, min(kv_heads), page_size=PAGE_SIZE)
        cases.append(DecodeCase(problem, (PAGED_SEQLEN_K,) * PAGED_BATCH))
    return cases


def random_cases(count: int, seed: int) -> list[DecodeCase]:
    """``count`` seeded random decode shapes over issue #38's space, each with a cache (K and V bytes
    read) of at least ``RANDOM_MIN_CACHE_BYTES``: B 1–64, KV heads 1–32, group 1–16, Sq 1–16, D 64, 128
    or 256, full or ragged lengths (log-uniform, so some sequences are a few keys and others the whole
    cache), contiguous or paged (pages of 16 to 256 keys). Shapes are drawn, not picked, so a rule tuned
    on the fixed sweep meets shapes it has not seen; the same seed gives the same shapes."""
    rng = random.Random(seed)
    cases: list[DecodeCase] = []
    while len(cases) < count:
        case = _random_case(rng)
        fits = case.memory_needed() <= RANDOM_MAX_MEMORY_BYTES
        if fits and RANDOM_MIN_CACHE_BYTES <= case.kv_bytes_read <= RANDOM_MAX_CACHE_BYTES:
            cases.append(case)
    return cases


def _random_case(rng: random.Random) -> DecodeCase:
    batch = rng.choice((1, 1, 2, 3, 4, 8, 16, 32, 64))
    kv_heads = rng.choice((1, 2, 4, 8, 16, 32))
    group = rng.choice((1, 2, 4, 5, 8, 16))
    head_dim = rng.choice((64, 128, 128, 256))
    seqlen_q = rng.choice((1, 1, 1, 2, 4, 8, 16))
    page_size = 0 if rng.random() < 0.6 else rng.choice((16, 32, 64, 128, 256))
    ragged = page_size > 0 or rng.random() < 0.4
    # Cache lengths from 1k to 512k keys, log-uniform, in whole pages.
    unit = max(page_size, 256)
    seqlen_k = unit * max(1, round(2 ** rng.uniform(10, 19) / unit))
    problem = decode_problem(
        batch, seqlen_k, kv_heads, ragged=ragged, page_size=page_size, heads=kv_heads * group,
        head_dim=head_dim, seqlen_q=seqlen_q,
    )  # fmt: skip
    if not ragged:
        return DecodeCase(problem)
    lengths = tuple(max(seqlen_q, min(seqlen_k, round(2 ** rng.uniform(4, math.log2(seqlen_k))))) for _ in range(batch))
    return DecodeCase(problem, lengths)


def roofline_us(case: DecodeCase, read_gbps: float | None, gemm_tflops: float | None) -> float:
    """The least time a step can take, µs: its K and V bytes at the read bandwidth or its FLOPs at the
    sustained bf16 GEMM rate, whichever is longer; NaN when either ceiling was not measured."""
    if not read_gbps or not gemm_tflops:
        return math.nan
    return max(case.kv_bytes_read / (read_gbps * 1e3), case.flops / (gemm_tflops * 1e6))


def too_large(case: DecodeCase, device: torch.device) -> str:
    """Why ``case`` is skipped on ``device`` ('' when it fits)."""
    if device.type != "cuda":
        return ""
    total = torch.cuda.get_device_properties(device).total_memory
    needed = case.memory_needed()
    if needed > MEMORY_FRACTION * total:
        return (
            f"needs about {needed / 2**30:.0f} GiB (K and V, SDPA's GQA expansion, the fp64 reference), "
            f"over {MEMORY_FRACTION:.0%} of the GPU's {total / 2**30:.0f} GiB"
        )
    return ""
