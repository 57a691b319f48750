"""Seeded random inputs in SDPA's (B, H, S, D) layout (K and V with kv_heads heads), per-sequence key
lengths, paged copies of a KV cache (a shuffled block table), and output poisoning."""

from __future__ import annotations

import torch

from common.contract.problem import Problem


def make_inputs(
    problem: Problem,
    *,
    seed: int = 0,
    device: str | torch.device = "cuda",
    offset: float = 0.0,
    on_device: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Standard-normal q, k, v; ``offset`` is added to v so the output mean is not near zero.

    By default they are drawn in fp32 on the CPU, so a seed gives the same numbers on every device.
    ``on_device=True`` draws them on ``device`` with its own generator instead: the same numbers for a
    seed only on the same kind of device, but a decode cache of tens of GB takes a fraction of a second
    there, against a minute of the CPU's serial generator (``compare.py --decode``)."""
    where = torch.device(device) if on_device else torch.device("cpu")
    generator = torch.Generator(device=where).manual_seed(seed)
    q_shape = (problem.batch, problem.heads, problem.seqlen_q, problem.head_dim)
    kv_shape = (problem.batch, problem.kv_heads, problem.seqlen_k, problem.head_dim)

    def draw(shape: tuple[int, ...], shift: float = 0.0) -> torch.Tensor:
        drawn = torch.randn(shape, generator=generator, dtype=torch.float32, device=where)
        if shift:
            # In place: a second fp32 copy of a decode cache would double the draw's peak memory.
            drawn.add_(shift)
        return drawn.to(device=device, dtype=problem.dtype)

    return draw(q_shape), draw(kv_shape), draw(kv_shape, offset)


def poison_(out: torch.Tensor) -> torch.Tensor:
    """Fill with NaN so that any element a kernel forgets to write shows up as non-finite."""
    return out.fill_(float("nan"))


def make_cache_seqlens(problem: Problem, *, seed: int = 0, device: str | torch.device = "cuda") -> torch.Tensor:
    """(B,) int32 key lengths, uniform in [0, Sk], with the first sequence full (Sk) and, from B = 3,
    the last one empty (0): the two edge cases are always present."""
    generator = torch.Generator(device="cpu").manual_seed(seed + 1)
    lengths = torch.randint(0, problem.seqlen_k + 1, (problem.batch,), generator=generator, dtype=torch.int32)
    lengths[0] = problem.seqlen_k
    if problem.batch >= 3:
        lengths[-1] = 0
    return lengths.to(device)


def poison_all_(result: torch.Tensor | tuple[torch.Tensor, ...]) -> None:
    """:func:`poison_` on an output, or on every tensor of an ``(out, lse)`` result."""
    for tensor in result if isinstance(result, tuple) else (result,):
        poison_(tensor)


# Pool pages no sequence refers to, past the B · max_pages_per_seq the block table uses. The pool's last
# page is always one of them, so a kernel that reads page + 1 stays inside the pool (and reads NaN).
SPARE_PAGES = 2


def pool_pages(problem: Problem) -> int:
    """Pages in the pool of :func:`make_block_table`: every sequence's capacity plus the spare pages."""
    return problem.batch * (problem.seqlen_k // problem.page_size) + SPARE_PAGES


def make_block_table(problem: Problem, *, seed: int = 0, device: str | torch.device = "cuda") -> torch.Tensor:
    """(B, Sk / page_size) int32: a random permutation of the pool's pages but its last, so that
    logically adjacent pages lie far apart in memory (as in a serving engine after many sequences came
    and went) and no two sequences share a page."""
    if not problem.paged:
        raise ValueError(f"a block table needs a paged problem (page_size > 0), got {problem.describe()}")
    generator = torch.Generator(device="cpu").manual_seed(seed + 2)
    max_pages = problem.seqlen_k // problem.page_size
    pages = torch.randperm(pool_pages(problem) - 1, generator=generator)[: problem.batch * max_pages]
    return pages.view(problem.batch, max_pages).to(device=device, dtype=torch.int32)


def to_pages(cache: torch.Tensor, block_table: torch.Tensor, num_pages: int) -> torch.Tensor:
    """The page pool (num_pages, page_size, Hkv, D) holding the contiguous (B, Hkv, Sk, D) ``cache`` where
    ``block_table`` says (its every entry, padding past the lengths included, as in a contiguous cache);
    pages the table does not name are NaN, so a kernel that reads one shows it."""
    batch, kv_heads, seqlen_k, head_dim = cache.shape
    page_size = seqlen_k // block_table.shape[1]
    pool = cache.new_full((num_pages, page_size, kv_heads, head_dim), float("nan"))
    pages = cache.transpose(1, 2).reshape(batch * block_table.shape[1], page_size, kv_heads, head_dim)
    pool[block_table.flatten().long()] = pages
    return pool


def make_paged_kv(
    problem: Problem, k: torch.Tensor, v: torch.Tensor, *, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The contiguous k and v of ``problem`` as page pools, and their shuffled block table:
    ``(k_pages, v_pages, block_table)``, on k's device."""
    block_table = make_block_table(problem, seed=seed, device=k.device)
    num_pages = pool_pages(problem)
    return to_pages(k, block_table, num_pages), to_pages(v, block_table, num_pages), block_table
