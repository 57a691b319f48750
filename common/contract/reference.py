"""Float64 attention on the inputs' device: the ground truth every implementation is judged by.

Chunked over (batch, head) and query rows so that the score block held at once stays bounded
(a few hundred MiB at S=16384) however large the problem. The masking conventions are the
problem's (``common/contract/problem.py``): GQA reads KV head ``h // (H // Hkv)``; causal is
top-left (SDPA's ``is_causal``) or bottom-right aligned; ``cache_seqlens`` masks each sequence's keys
past its length and sets its bottom-right offset. A row that sees no key has output 0 and LSE -inf.
A paged KV cache is first gathered into the contiguous (B, Hkv, Sk, D) cache it stands for
(:func:`gather_pages`, also the SDPA yardstick's input), reading only the pages that hold keys below
each sequence's length.

:func:`sdpa` is the other reference: PyTorch's SDPA in the problem's own dtype, whose error against the
fp64 reference is the yardstick of the error rules (``common.contract.check.sdpa_error``) and the body
of the SDPA baselines (``common.measure.sdpa``).
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from common.contract.problem import Problem, causal_offset

# fp64 scores held at once: QUERY_CHUNK x Sk x 8 bytes (512 MiB at Sk=16384).
QUERY_CHUNK = 4096


def sequence_lengths(problem: Problem, cache_seqlens: torch.Tensor | None) -> list[int]:
    """Each sequence's key length: ``cache_seqlens`` when the problem carries it, else Sk."""
    if not problem.has_cache_seqlens:
        return [problem.seqlen_k] * problem.batch
    if cache_seqlens is None:
        raise ValueError(f"{problem.describe()} carries per-sequence lengths: pass cache_seqlens")
    return [int(length) for length in cache_seqlens.tolist()]


def gather_pages(pages: torch.Tensor, block_table: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """The contiguous (B, Hkv, Sk, D) cache of a page pool (num_pages, page_size, Hkv, D): sequence b's
    key j from page ``block_table[b, j // page_size]``, slot ``j % page_size``, for j < lengths[b];
    keys past a sequence's length are 0 (their table entries are never read). Sk = the table's capacity."""
    batch, max_pages = block_table.shape
    page_size = pages.shape[1]
    dense = pages.new_zeros((batch, max_pages * page_size, *pages.shape[2:]))
    for b, length in enumerate(lengths):
        used = block_table[b, : math.ceil(length / page_size)].long()
        dense[b, :length] = pages[used].flatten(0, 1)[:length]
    return dense.transpose(1, 2)


def contiguous_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    problem: Problem,
    cache_seqlens: torch.Tensor | None,
    block_table: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v as (B, Hkv, Sk, D): themselves for a contiguous cache, their pages gathered for a paged one."""
    if not problem.paged:
        return k, v
    if block_table is None:
        raise ValueError(f"{problem.describe()} reads a paged KV cache: pass block_table")
    lengths = sequence_lengths(problem, cache_seqlens)
    return gather_pages(k, block_table, lengths), gather_pages(v, block_table, lengths)


def visible_keys_mask(
    problem: Problem, seqlen_k: int, rows: torch.Tensor, n_keys: int, device: torch.device
) -> torch.Tensor:
    """Boolean (len(rows), n_keys): which keys each query row sees, for one sequence of ``seqlen_k``
    valid keys (the padded length is ``n_keys``)."""
    cols = torch.arange(n_keys, device=device)
    visible = (cols < seqlen_k)[None, :].expand(rows.shape[0], n_keys)
    if problem.causal:
        offset = causal_offset(problem.seqlen_q, seqlen_k, problem.causal_alignment)
        visible = visible & (cols[None, :] <= rows[:, None] + offset)
    return visible


def _attend_rows(
    q_rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first_row: int, seqlen_k: int, problem: Problem
) -> tuple[torch.Tensor, torch.Tensor]:
    """Output and log-sum-exp of query rows [first_row, first_row + len) for one (batch, head)."""
    scores = (q_rows @ k.transpose(-1, -2)) * problem.scale
    rows = torch.arange(first_row, first_row + q_rows.shape[0], device=q_rows.device)
    scores.masked_fill_(~visible_keys_mask(problem, seqlen_k, rows, k.shape[0], q_rows.device), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    # A row with no visible key has lse -inf: subtract 0 instead, so its P (and output) is 0, not NaN.
    probs = torch.exp(scores - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))[:, None])
    return probs @ v, lse


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, *, cache_seqlens: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None, with_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """float64 O (B, H, Sq, D), and the natural-log LSE (B, H, Sq) when ``with_lse``; k and v are page
    pools read through ``block_table`` when the problem is paged."""
    k, v = contiguous_kv(k, v, problem, cache_seqlens, block_table)
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    lse = torch.empty(q.shape[:3], dtype=torch.float64, device=q.device)
    lengths = sequence_lengths(problem, cache_seqlens)
    for b in range(problem.batch):
        for h in range(problem.heads):
            kv_head = problem.kv_head(h)
            k64 = k[b, kv_head].to(torch.float64)
            v64 = v[b, kv_head].to(torch.float64)
            for start in range(0, problem.seqlen_q, QUERY_CHUNK):
                stop = min(start + QUERY_CHUNK, problem.seqlen_q)
                q64 = q[b, h, start:stop].to(torch.float64)
                out[b, h, start:stop], lse[b, h, start:stop] = _attend_rows(q64, k64, v64, start, lengths[b], problem)
    return (out, lse) if with_lse else out


def _visible(problem: Problem, cache_seqlens: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """Boolean (B, 1, Sq, Sk): which keys each query row of each sequence sees."""
    rows = torch.arange(problem.seqlen_q, device=device)
    masks = [
        visible_keys_mask(problem, length, rows, problem.seqlen_k, device)
        for length in sequence_lengths(problem, cache_seqlens)
    ]
    return torch.stack(masks)[:, None]


def sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, cache_seqlens: torch.Tensor | None = None
) -> torch.Tensor:
    """SDPA with PyTorch's own backend choice: the same-dtype error baseline."""
    options: dict[str, object] = {"scale": problem.scale}
    if problem.kv_heads != problem.heads:
        options["enable_gqa"] = True
    visible = None
    if problem.has_cache_seqlens:
        visible = _visible(problem, cache_seqlens, q.device)
        options["attn_mask"] = visible
    elif problem.bottom_right:
        with warnings.catch_warnings():
            # It warns that rows seeing no key (Sq > Sk) come out NaN: they are set to 0 below.
            warnings.filterwarnings("ignore", message="Lower right causal bias")
            options["attn_mask"] = causal_lower_right(problem.seqlen_q, problem.seqlen_k)
    else:
        options["is_causal"] = problem.causal
    out = F.scaled_dot_product_attention(q, k, v, **options)
    if problem.has_cache_seqlens or problem.bottom_right:
        if visible is None:
            visible = _visible(problem, None, q.device)
        out = torch.where(visible.any(dim=-1, keepdim=True), out, torch.zeros((), dtype=out.dtype, device=out.device))
    return out
