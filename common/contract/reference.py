"""Float64 attention on the inputs' device: the ground truth every implementation is judged by.

Chunked over (batch, head) and query rows so that the score block held at once stays bounded
(a few hundred MiB at S=16384) however large the problem. The causal mask is SDPA's ``is_causal``:
top-left aligned, query row i sees keys j <= i.
"""

from __future__ import annotations

import torch

from common.contract.problem import Problem

# fp64 scores held at once: QUERY_CHUNK x Sk x 8 bytes (512 MiB at Sk=16384).
QUERY_CHUNK = 4096


def _attend_rows(
    q_rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first_row: int, problem: Problem
) -> tuple[torch.Tensor, torch.Tensor]:
    """Output and log-sum-exp of query rows [first_row, first_row + len) for one (batch, head)."""
    scores = (q_rows @ k.transpose(-1, -2)) * problem.scale
    if problem.causal:
        rows = torch.arange(first_row, first_row + q_rows.shape[0], device=q_rows.device)
        cols = torch.arange(k.shape[0], device=q_rows.device)
        scores.masked_fill_(cols[None, :] > rows[:, None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse[:, None])
    return probs @ v, lse


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, *, with_lse: bool = False
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """float64 O (B, H, Sq, D), and the natural-log LSE (B, H, Sq) when ``with_lse``."""
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    lse = torch.empty(q.shape[:3], dtype=torch.float64, device=q.device)
    for b in range(problem.batch):
        for h in range(problem.heads):
            k64 = k[b, h].to(torch.float64)
            v64 = v[b, h].to(torch.float64)
            for start in range(0, problem.seqlen_q, QUERY_CHUNK):
                stop = min(start + QUERY_CHUNK, problem.seqlen_q)
                q64 = q[b, h, start:stop].to(torch.float64)
                out[b, h, start:stop], lse[b, h, start:stop] = _attend_rows(q64, k64, v64, start, problem)
    return (out, lse) if with_lse else out
