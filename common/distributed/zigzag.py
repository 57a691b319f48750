"""Zig-zag sharding of one sequence over the ranks of a ring, and what each ring step must compute.

A causal mask gives late queries more keys than early ones, so cutting the sequence into N
contiguous shards would leave the last rank with N times the first rank's work. Zig-zag (head-tail)
sharding cuts the sequence into 2N equal chunks and gives rank r the mirrored pair

    chunk r  and  chunk 2N-1-r          (rank 0 holds the first and the last chunk)

stored one after the other, so every rank owns one early and one late chunk and does the same work.
This is the layout of PyTorch's ``context_parallel`` (its ``_HeadTailLoadBalancer``) and of
zhuzilin/ring-flash-attention's ``zigzag_ring_flash_attn``.

What a ring step computes (``step_plan``): at step s rank r holds the K/V shard of rank
``source = (r - s) mod N``. With c the chunk length and the local sequence [first chunk | second chunk]:

* step 0, ``source == rank``: its own shard, causal within the 2c local tokens: the local order is
  the global order restricted to the two chunks, so the top-left diagonal is exactly the mask;
* ``source < rank``: the source's first chunk (``source``) lies before both query chunks and its
  second chunk (2N-1-source) after both: every query sees the first half of the keys, none the rest;
* ``source > rank``: both source chunks lie after the rank's first chunk and before its second one:
  only the second half of the queries sees them, all of them.

Steps 1..N-1 each cost c x 2c scores and step 0 about half of 2c x 2c, so every rank does the same
work at every step. Without a causal mask every step is all queries against all keys and any layout
works; the tools here use the zig-zag one for both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SEQ_DIM = 2


def chunk_ids(rank: int, world_size: int) -> tuple[int, int]:
    """The two chunks (of 2N) that ``rank`` holds, in local order: (rank, 2N-1-rank)."""
    _check_rank(rank, world_size)
    return rank, 2 * world_size - 1 - rank


def contiguous_chunk_ids(rank: int, world_size: int) -> tuple[int, int]:
    """The chunks of plain contiguous sharding, (2r, 2r+1): PyTorch's layout without load balancing."""
    _check_rank(rank, world_size)
    return 2 * rank, 2 * rank + 1


def _check_rank(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must lie in [0, world_size), got rank={rank} and world_size={world_size}")


def chunk_length(seqlen: int, world_size: int) -> int:
    """Tokens per chunk when ``seqlen`` tokens are cut into 2N chunks; refuses a ragged cut."""
    if seqlen % (2 * world_size):
        raise ValueError(
            f"zig-zag sharding cuts the sequence into 2 x world_size = {2 * world_size} equal chunks, "
            f"so seqlen must be a multiple of {2 * world_size}, got {seqlen}"
        )
    return seqlen // (2 * world_size)


def shard(full: torch.Tensor, rank: int, world_size: int, dim: int = SEQ_DIM) -> torch.Tensor:
    """``rank``'s local tensor: its two chunks of ``full`` along ``dim``, concatenated (contiguous)."""
    chunk_length(full.shape[dim], world_size)
    chunks = full.chunk(2 * world_size, dim=dim)
    return torch.cat([chunks[index] for index in chunk_ids(rank, world_size)], dim=dim)


def unshard(shards: list[torch.Tensor], dim: int = SEQ_DIM) -> torch.Tensor:
    """The full sequence from every rank's local tensor (``shards[r]`` from rank r), in global order."""
    world_size = len(shards)
    chunks: list[torch.Tensor | None] = [None] * (2 * world_size)
    for rank, local in enumerate(shards):
        first, second = local.chunk(2, dim=dim)
        chunks[chunk_ids(rank, world_size)[0]] = first
        chunks[chunk_ids(rank, world_size)[1]] = second
    return torch.cat(chunks, dim=dim)


def positions(ids: tuple[int, ...], chunk_len: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Global positions (int64) of the local tokens of the chunks ``ids`` stored in that order."""
    return torch.cat([torch.arange(i * chunk_len, (i + 1) * chunk_len, device=device) for i in ids])


@dataclass(frozen=True)
class StepPlan:
    """What one ring step computes on one rank: which local queries against which part of the K/V
    shard in hand, and whether the causal diagonal applies (top-left, within those tokens).

    ``queries`` and ``keys`` are "all", "second" (queries) or "first" (keys): halves of the local
    sequence, i.e. one chunk each.
    """

    queries: str
    keys: str
    causal: bool

    def query_slice(self, local_len: int) -> slice:
        return slice(local_len // 2, local_len) if self.queries == "second" else slice(0, local_len)

    def key_slice(self, local_len: int) -> slice:
        return slice(0, local_len // 2) if self.keys == "first" else slice(0, local_len)


def source_rank(rank: int, step: int, world_size: int) -> int:
    """Whose K/V shard ``rank`` holds at ``step``: shards travel to the next rank, one hop a step."""
    return (rank - step) % world_size


def step_plan(rank: int, step: int, world_size: int, causal: bool) -> StepPlan:
    """The work of ``rank`` at ``step`` for zig-zag sharded inputs (see the module docstring)."""
    if not causal:
        return StepPlan("all", "all", causal=False)
    source = source_rank(rank, step, world_size)
    if source == rank:
        return StepPlan("all", "all", causal=True)
    if source < rank:
        return StepPlan("all", "first", causal=False)
    return StepPlan("second", "all", causal=False)
