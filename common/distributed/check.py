"""Correctness of a sharded attention output against float64, on sampled query rows.

A float64 reference over a million tokens (S x S scores) is out of reach, but one row's reference
costs only one pass over the keys. So each rank checks a sample of its own query rows (the first
and last row of each of its chunks and random ones; all rows when the sample is as large as the
shard) against every key of the sequence:

* **inputs by chunk** (:class:`ChunkedInputs`): q, k and v of the whole sequence are drawn chunk by
  chunk from seeds, so any rank can rebuild any chunk, bit for bit, without communication: the
  shards a rank attends with and the full K/V its reference reads are the same numbers, and the
  reference does not depend on the ring's own transfers;
* **reference** (:func:`reference_rows`): float64 softmax of the sampled rows over the full K/V in
  global order, in two passes over key blocks (the row maximum, then the sums), the causal mask
  taken from the rows' global positions; memory stays at one key block in float64;
* **yardstick** (:func:`sdpa_rows`): SDPA in the inputs' dtype on the same rows (each causal row
  against its visible prefix), the error the suite's rule compares with (``common.contract.check``'s
  yardstick, on rows);
* **rules**: the output by ``SDPA_RELATIVE_RULE`` (at most 2x SDPA's error on these rows, plus
  atol), the LSE, when given, by the LSE rule (``common.contract.metrics.lse_bound``). NaN never
  passes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from common.contract.metrics import (
    SDPA_RELATIVE_RULE,
    ErrorStats,
    LseStats,
    error_stats,
    judge_lse,
    lse_bound,
    lse_stats,
)
from common.contract.problem import Problem

# Keys upcast to float64 at once by the reference: KEY_BLOCK x Hkv x D x 8 bytes (256 MiB at 16 x 128).
KEY_BLOCK = 16384
# What make_inputs adds to v, so the output's mean is not near zero.
V_OFFSET = 0.5
TENSOR_NAMES = ("q", "k", "v")


@dataclass(frozen=True)
class ChunkedInputs:
    """q, k, v of the full sequence of ``problem`` (S = ``problem.seqlen_q`` tokens), drawn chunk by
    chunk: chunk i of each tensor comes from its own seed, so any process on the same device type
    rebuilds it exactly. Standard normal, ``V_OFFSET`` added to v, cast to the problem's dtype."""

    problem: Problem
    n_chunks: int
    device: torch.device
    seed: int = 0

    def __post_init__(self) -> None:
        if self.problem.seqlen_q != self.problem.seqlen_k:
            raise ValueError(f"one sequence has Sq = Sk, got {self.problem.describe()}")
        if self.n_chunks < 1 or self.problem.seqlen_q % self.n_chunks:
            raise ValueError(f"{self.n_chunks} chunks must divide the sequence of {self.problem.seqlen_q} tokens")

    @property
    def chunk_len(self) -> int:
        return self.problem.seqlen_q // self.n_chunks

    def chunk(self, name: str, index: int) -> torch.Tensor:
        """Chunk ``index`` of tensor ``name`` (q: (B, H, c, D); k, v: (B, Hkv, c, D))."""
        if name not in TENSOR_NAMES or not 0 <= index < self.n_chunks:
            raise ValueError(f"no chunk {name!r}[{index}]: names {TENSOR_NAMES}, indices [0, {self.n_chunks})")
        problem = self.problem
        heads = problem.heads if name == "q" else problem.kv_heads
        generator = torch.Generator(device=self.device)
        generator.manual_seed((self.seed * self.n_chunks + index) * len(TENSOR_NAMES) + TENSOR_NAMES.index(name))
        shape = (problem.batch, heads, self.chunk_len, problem.head_dim)
        values = torch.randn(shape, generator=generator, device=self.device, dtype=torch.float32)
        if name == "v":
            values += V_OFFSET
        return values.to(problem.dtype)

    def local(self, name: str, ids: tuple[int, ...]) -> torch.Tensor:
        """The chunks ``ids`` of tensor ``name`` stored one after the other (a rank's shard)."""
        return torch.cat([self.chunk(name, index) for index in ids], dim=2)

    def full(self, name: str) -> torch.Tensor:
        """Tensor ``name`` over the whole sequence, in global order."""
        return self.local(name, tuple(range(self.n_chunks)))


def sample_rows(local_len: int, count: int, seed: int = 0) -> torch.Tensor:
    """Sorted local row indices: the first and last row of each half (chunk) and random others,
    ``count`` in all; every row when ``count >= local_len``."""
    if count >= local_len:
        return torch.arange(local_len)
    half = local_len // 2
    edges = {0, half - 1, half, local_len - 1} if local_len >= 2 else {0}
    generator = torch.Generator().manual_seed(seed)
    others = torch.randperm(local_len, generator=generator).tolist()
    chosen = list(edges) + [row for row in others if row not in edges][: max(0, count - len(edges))]
    return torch.tensor(sorted(chosen), dtype=torch.long)


def _visible(row_positions: torch.Tensor, key_start: int, key_stop: int, causal: bool) -> torch.Tensor | None:
    """Boolean (R, n): which keys of [key_start, key_stop) each row sees; None when all of them."""
    if not causal:
        return None
    keys = torch.arange(key_start, key_stop, device=row_positions.device)
    return keys[None, :] <= row_positions[:, None]


def _block_scores(q64: torch.Tensor, k_block: torch.Tensor, visible: torch.Tensor | None, scale: float) -> torch.Tensor:
    """(B, Hkv, G, R, n) float64 scaled scores, -inf where masked."""
    scores = torch.einsum("bhgrd,bhnd->bhgrn", q64, k_block.to(torch.float64)) * scale
    if visible is not None:
        scores.masked_fill_(~visible, float("-inf"))
    return scores


def reference_rows(
    q_rows: torch.Tensor,
    row_positions: torch.Tensor,
    k_full: torch.Tensor,
    v_full: torch.Tensor,
    problem: Problem,
    key_block: int = KEY_BLOCK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 O (B, H, R, D) and natural-log LSE (B, H, R) of the rows ``q_rows`` (B, H, R, D) at
    global positions ``row_positions`` (R,) over the whole ``k_full``/``v_full`` (B, Hkv, S, D)."""
    batch, heads, rows, head_dim = q_rows.shape
    kv_heads, seqlen = k_full.shape[1], k_full.shape[2]
    q64 = q_rows.to(torch.float64).reshape(batch, kv_heads, heads // kv_heads, rows, head_dim)
    blocks = [(start, min(start + key_block, seqlen)) for start in range(0, seqlen, key_block)]
    row_max = torch.full(q64.shape[:-1], float("-inf"), dtype=torch.float64, device=q_rows.device)
    for start, stop in blocks:
        visible = _visible(row_positions, start, stop, problem.causal)
        scores = _block_scores(q64, k_full[:, :, start:stop], visible, problem.scale)
        row_max = torch.maximum(row_max, scores.amax(dim=-1))
    # Rows that see no key keep -inf: subtract 0 there so their sums are 0, not NaN.
    shift = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    row_sum = torch.zeros_like(row_max)
    acc = torch.zeros(q64.shape, dtype=torch.float64, device=q_rows.device)
    for start, stop in blocks:
        visible = _visible(row_positions, start, stop, problem.causal)
        probs = torch.exp(_block_scores(q64, k_full[:, :, start:stop], visible, problem.scale) - shift[..., None])
        row_sum += probs.sum(dim=-1)
        acc += torch.einsum("bhgrn,bhnd->bhgrd", probs, v_full[:, :, start:stop].to(torch.float64))
    seen = row_sum > 0
    out = torch.where(seen[..., None], acc / torch.where(seen, row_sum, 1)[..., None], torch.zeros_like(acc))
    lse = torch.where(seen, row_max + torch.log(torch.where(seen, row_sum, 1)), torch.full_like(row_max, -torch.inf))
    return out.reshape(batch, heads, rows, head_dim), lse.reshape(batch, heads, rows)


def sdpa_rows(
    q_rows: torch.Tensor, row_positions: torch.Tensor, k_full: torch.Tensor, v_full: torch.Tensor, problem: Problem
) -> torch.Tensor:
    """SDPA in the inputs' dtype on the same rows (PyTorch's own backend choice, GQA read natively):
    one call over all keys, or per causal row one over its visible prefix (keys 0..position)."""

    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(
            q, k, v, scale=problem.scale, enable_gqa=problem.kv_heads != problem.heads
        )

    if not problem.causal:
        return call(q_rows, k_full, v_full)
    prefixes = [position + 1 for position in row_positions.tolist()]
    outs = [call(q_rows[:, :, i : i + 1], k_full[:, :, :n], v_full[:, :, :n]) for i, n in enumerate(prefixes)]
    return torch.cat(outs, dim=2)


@dataclass(frozen=True)
class RowCheck:
    """The verdict on one rank's sampled rows."""

    ok: bool
    reason: str
    rows: int
    error: ErrorStats
    sdpa_error: ErrorStats
    lse: LseStats | None

    def summary(self) -> str:
        verdict = "ok" if self.ok else f"WRONG ({self.reason})"
        lse_text = f" | {self.lse.summary()}" if self.lse else " | no LSE"
        return f"{verdict} on {self.rows} rows: {self.error.summary()} | sdpa: {self.sdpa_error.summary()}{lse_text}"


def check_rows(
    out: torch.Tensor,
    lse: torch.Tensor | None,
    q_local: torch.Tensor,
    local_positions: torch.Tensor,
    inputs: ChunkedInputs,
    rows: torch.Tensor,
) -> RowCheck:
    """Judge the local output ``out`` (B, H, L, D) and ``lse`` (B, H, L) or None on the local ``rows``:
    ``q_local`` is the shard the output was computed from, ``local_positions`` (L,) its tokens' global
    positions; the full K/V come from ``inputs``."""
    problem = inputs.problem
    device = q_local.device
    rows = rows.to(device)
    row_positions = local_positions.to(device)[rows]
    k_full, v_full = inputs.full("k"), inputs.full("v")
    q_rows = q_local[:, :, rows]
    ref, ref_lse = reference_rows(q_rows, row_positions, k_full, v_full, problem)
    yardstick = error_stats(sdpa_rows(q_rows, row_positions, k_full, v_full, problem), ref)
    del k_full, v_full
    err = error_stats(out[:, :, rows], ref)
    ok, reason = SDPA_RELATIVE_RULE.judge(err, yardstick)
    stats = None
    if lse is not None:
        stats = lse_stats(lse[:, :, rows].contiguous(), ref_lse, lse_bound(problem.dtype, problem.seqlen_k, ref_lse))
        lse_ok, lse_reason = judge_lse(stats)
        if ok and not lse_ok:
            ok, reason = False, lse_reason
    return RowCheck(ok, reason, int(rows.numel()), err, yardstick, stats)
