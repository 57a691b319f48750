"""Input checks shared by every entry point: a clear error naming what was expected and given.

Every rung's host function calls :func:`validate_attention_inputs` before touching a kernel, so a
bad call never reaches device code. Tensors a kernel cannot address directly (inner dimension not
contiguous, misaligned strides) are copied explicitly by :func:`kernel_operand`, never read wrongly.

A paged KV cache (``block_table`` given) changes what k and v are: page pools (num_pages, page_size,
Hkv, D) instead of (B, Hkv, Sk, D). Its page indices are checked with the values of ``cache_seqlens``, in the
same device synchronisation: each entry of a page holding keys below its sequence's length must lie in
[0, num_pages) (entries past a sequence's length are never read and may be anything, as vLLM's padding).
``common.contract.api`` validates when it plans a signature; a later call of that signature is not checked
(that would synchronise every call), and an index outside the pools there is the caller's contract, as in
FlashAttention's ``flash_attn_with_kvcache``.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

import torch

from common.contract.problem import CAUSAL_ALIGNMENTS, MAX_PAGE_SIZE, MIN_PAGE_SIZE, Problem, dtype_name

# TMA and 16-byte vector loads need every outer stride and the base address 16-byte aligned.
OPERAND_ALIGNMENT_BYTES = 16
# What the dimensions of q (and of a contiguous k and v) and of the page pools of a paged k and v are.
DENSE_LAYOUT = "(batch, heads, seqlen, head_dim)"
PAGED_LAYOUT = "(num_pages, page_size, kv_heads, head_dim)"


def _names(dtypes: Collection[torch.dtype]) -> str:
    return ", ".join(sorted(dtype_name(d) for d in dtypes))


def _check_tensor(name: str, tensor: object, layout: str = DENSE_LAYOUT) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() != 4:
        raise ValueError(f"{name} must have rank 4 {layout}, got shape {tuple(tensor.shape)}")
    if tensor.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(tensor.shape)}")
    return tensor


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allow_gqa: bool) -> None:
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if not allow_gqa and q.shape[:2] != k.shape[:2]:
        raise ValueError(
            f"q and k must agree on (batch, heads) (this implementation has no GQA), "
            f"got q {tuple(q.shape[:2])} and k {tuple(k.shape[:2])}"
        )
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"q and k must agree on batch, got q {q.shape[0]} and k {k.shape[0]}")
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads % kv_heads:
        raise ValueError(
            f"k's heads (kv_heads) must divide q's heads (GQA: query head h reads KV head h // (heads // kv_heads)), "
            f"got q {heads} heads and k {kv_heads}"
        )
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must have the same head_dim, got q {q.shape[3]} and k {k.shape[3]}")


def _check_paged_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allow_gqa: bool) -> None:
    """k and v as page pools (num_pages, page_size, Hkv, D) of one shape, for q (B, H, Sq, D)."""
    if k.shape != v.shape:
        raise ValueError(f"k and v page pools must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    page_size = k.shape[1]
    if not MIN_PAGE_SIZE <= page_size <= MAX_PAGE_SIZE:
        raise ValueError(
            f"with a block_table, k and v are {PAGED_LAYOUT} page pools with pages of "
            f"{MIN_PAGE_SIZE} to {MAX_PAGE_SIZE} keys, got page_size (k's dim 1) {page_size}"
        )
    heads, kv_heads = q.shape[1], k.shape[2]
    if not allow_gqa and heads != kv_heads:
        raise ValueError(
            f"q's heads and the pools' kv_heads must agree (this implementation has no GQA), got {heads} and {kv_heads}"
        )
    if heads % kv_heads:
        raise ValueError(
            f"the pools' kv_heads (k's dim 2) must divide q's heads (GQA), got q {heads} heads and k {kv_heads}"
        )
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must have the same head_dim, got q {q.shape[3]} and k {k.shape[3]}")


def _check_dtype_and_device(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dtypes: Collection[torch.dtype],
    device_types: Collection[str],
) -> None:
    given = {dtype_name(t.dtype) for t in (q, k, v)}
    if len(given) != 1:
        raise TypeError(f"q, k and v must share one dtype, got {sorted(given)}")
    if q.dtype not in dtypes:
        raise TypeError(f"dtype must be one of [{_names(dtypes)}], got {dtype_name(q.dtype)}")
    devices = {str(t.device) for t in (q, k, v)}
    if len(devices) != 1:
        raise ValueError(f"q, k and v must be on one device, got {sorted(devices)}")
    if q.device.type not in device_types:
        raise ValueError(f"tensors must be on a {' or '.join(sorted(device_types))} device, got {q.device}")


def _check_scale(softmax_scale: object) -> float | None:
    if softmax_scale is None:
        return None
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise TypeError(f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
    if not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale must be finite, got {softmax_scale!r}")
    return float(softmax_scale)


def _check_alignment(causal_alignment: object) -> str:
    if causal_alignment not in CAUSAL_ALIGNMENTS:
        raise ValueError(f"causal_alignment must be one of {CAUSAL_ALIGNMENTS}, got {causal_alignment!r}")
    return causal_alignment


def check_cache_seqlens(
    cache_seqlens: object,
    batch: int,
    seqlen_k: int,
    device: torch.device,
    block_table: torch.Tensor | None = None,
    num_pages: int = 0,
) -> torch.Tensor:
    """``cache_seqlens`` must be a (B,) int32 tensor on the inputs' device with values in [0, Sk]; with a
    ``block_table`` (already checked by :func:`check_block_table`) of pools of ``num_pages`` pages, the entries in
    use (pages holding keys below each sequence's length) must lie in [0, num_pages). Checking the values reads
    them back: one device synchronisation for both."""
    if not isinstance(cache_seqlens, torch.Tensor):
        raise TypeError(f"cache_seqlens must be a torch.Tensor or None, got {type(cache_seqlens).__name__}")
    if tuple(cache_seqlens.shape) != (batch,):
        raise ValueError(f"cache_seqlens must have shape (batch,) = ({batch},), got {tuple(cache_seqlens.shape)}")
    if cache_seqlens.dtype != torch.int32:
        raise TypeError(f"cache_seqlens must be int32, got {dtype_name(cache_seqlens.dtype)}")
    if cache_seqlens.device != device:
        raise ValueError(f"cache_seqlens must be on the inputs' device {device}, got {cache_seqlens.device}")
    bounds = [*torch.aminmax(cache_seqlens)]
    if block_table is not None:
        bounds += _pages_in_use_bounds(cache_seqlens, block_table, seqlen_k // block_table.shape[1])
    low, high, *pages = torch.stack(bounds).tolist()
    if low < 0 or high > seqlen_k:
        raise ValueError(
            f"cache_seqlens must lie in [0, Sk] = [0, {seqlen_k}] (Sk the padded key length, or the block "
            f"table's capacity max_pages_per_seq * page_size), got values in [{low}, {high}]"
        )
    if pages and (pages[0] < 0 or pages[1] >= num_pages):
        raise ValueError(
            f"block_table's entries for the keys below each sequence's length must be page indices in "
            f"[0, num_pages) = [0, {num_pages}), got values in [{pages[0]}, {pages[1]}] (entries past a "
            f"sequence's length are not read and may be anything)"
        )
    return cache_seqlens


def _pages_in_use_bounds(
    cache_seqlens: torch.Tensor, block_table: torch.Tensor, page_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(min, max) of the block table's entries that the kernels read, sequence b's first ceil(length / page_size),
    as device scalars; 0 stands for the entries not read (a valid index: a pool has a page at least)."""
    pages_used = (cache_seqlens + page_size - 1).div(page_size, rounding_mode="floor")
    slots = torch.arange(block_table.shape[1], device=block_table.device)
    in_use = torch.where(slots < pages_used[:, None], block_table, 0)
    return in_use.amin(), in_use.amax()


def check_block_table(block_table: object, batch: int, device: torch.device) -> torch.Tensor:
    """``block_table`` must be a (B, max_pages_per_seq) int32 tensor on the inputs' device. Its values, the page
    indices, are read with ``cache_seqlens``' (:func:`check_cache_seqlens`)."""
    if not isinstance(block_table, torch.Tensor):
        raise TypeError(f"block_table must be a torch.Tensor or None, got {type(block_table).__name__}")
    if block_table.dim() != 2 or block_table.shape[0] != batch or block_table.shape[1] < 1:
        raise ValueError(
            f"block_table must have shape (batch, max_pages_per_seq) = ({batch}, >= 1), got {tuple(block_table.shape)}"
        )
    if block_table.dtype != torch.int32:
        raise TypeError(f"block_table must be int32, got {dtype_name(block_table.dtype)}")
    if block_table.device != device:
        raise ValueError(f"block_table must be on the inputs' device {device}, got {block_table.device}")
    return block_table


def validate_attention_inputs(
    q: object,
    k: object,
    v: object,
    *,
    causal: object = False,
    softmax_scale: object = None,
    causal_alignment: object = "top_left",
    cache_seqlens: object = None,
    return_lse: object = False,
    block_table: object = None,
    allow_gqa: bool = False,
    dtypes: Collection[torch.dtype] = (torch.float16, torch.bfloat16),
    head_dims: Collection[int] | None = None,
    device_types: Collection[str] = ("cuda",),
) -> Problem:
    """Check q (B, H, Sq, D), k and v (B, Hkv, Sk, D) and return the Problem they describe.

    ``allow_gqa``: the caller implements GQA (Hkv a divisor of H); otherwise Hkv must equal H.
    ``cache_seqlens``: None, or the per-sequence key lengths (:func:`check_cache_seqlens`).
    ``block_table``: None, or a paged KV cache: k and v are then page pools (num_pages, page_size,
    Hkv, D), Sk = max_pages_per_seq · page_size, and ``cache_seqlens`` is required.
    Raises TypeError for wrong types/dtypes and ValueError for wrong shapes, devices, head dims,
    empty tensors, a non-finite scale, an unknown alignment, bad lengths or page indices; each message names what
    was expected and what was given.
    """
    paged = block_table is not None
    q = _check_tensor("q", q)
    k, v = (_check_tensor(name, t, PAGED_LAYOUT if paged else DENSE_LAYOUT) for name, t in (("k", k), ("v", v)))
    if paged:
        _check_paged_shapes(q, k, v, allow_gqa)
    else:
        _check_shapes(q, k, v, allow_gqa)
    _check_dtype_and_device(q, k, v, dtypes, device_types)
    for name, flag in (("causal", causal), ("return_lse", return_lse)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    scale = _check_scale(softmax_scale)
    alignment = _check_alignment(causal_alignment)
    batch, heads, seqlen_q, head_dim = q.shape
    if paged:
        check_block_table(block_table, batch, q.device)
        if cache_seqlens is None:
            raise ValueError(
                "a block_table needs cache_seqlens, each sequence's key length ((batch,) int32): "
                "a block table holds no lengths, got cache_seqlens=None"
            )
        # Sk is the logical capacity of a sequence: its row of the block table, in keys.
        page_size, kv_heads, seqlen_k = k.shape[1], k.shape[2], block_table.shape[1] * k.shape[1]
    else:
        page_size, kv_heads, seqlen_k = 0, k.shape[1], k.shape[2]
    if cache_seqlens is not None:
        pages = (block_table, k.shape[0]) if paged else (None, 0)
        check_cache_seqlens(cache_seqlens, batch, seqlen_k, q.device, *pages)
    if head_dims is not None and head_dim not in head_dims:
        raise ValueError(f"head_dim must be one of {sorted(head_dims)}, got {head_dim}")
    return Problem(
        batch=batch,
        heads=heads,
        seqlen_q=seqlen_q,
        seqlen_k=seqlen_k,
        head_dim=head_dim,
        dtype=q.dtype,
        causal=causal,
        softmax_scale=scale,
        kv_heads=kv_heads,
        causal_alignment=alignment,
        has_cache_seqlens=cache_seqlens is not None,
        return_lse=return_lse,
        page_size=page_size,
    )


def validate_longer_cache(
    problem: Problem, k: torch.Tensor, v: torch.Tensor, cache_seqlens: torch.Tensor | None = None
) -> Problem:
    """``problem`` at k's key length, for tensors that differ from those ``problem`` was validated on
    (by :func:`validate_attention_inputs`) only in Sk: q the same, k and v contiguous (B, Hkv, Sk, D)
    caches of the same shapes less Sk, dtype, device and alignment, ``cache_seqlens`` of the same
    signature, the same options (``common.contract.api.growing_cache_key`` proves all of it). Only the
    checks that read Sk run again: v as long as k, and the values of ``cache_seqlens`` in [0, Sk]."""
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    seqlen_k = k.shape[2]
    if cache_seqlens is not None:
        check_cache_seqlens(cache_seqlens, problem.batch, seqlen_k, k.device)
    return problem.with_seqlen_k(seqlen_k)


def require_cache_seqlens_as_stated(problem: Problem, cache_seqlens: object) -> None:
    """``cache_seqlens`` is given exactly when ``problem`` says it has per-sequence lengths."""
    if problem.has_cache_seqlens != (cache_seqlens is not None):
        raise ValueError(
            f"cache_seqlens must be given exactly when the problem has per-sequence lengths: "
            f"has_cache_seqlens={problem.has_cache_seqlens}, got cache_seqlens={cache_seqlens!r}"
        )


def require_block_table_as_stated(problem: Problem, block_table: object) -> None:
    """``block_table`` is given exactly when ``problem`` says its cache is paged."""
    if problem.paged != (block_table is not None):
        given = "a tensor" if block_table is not None else "None"
        raise ValueError(
            f"block_table must be given exactly when the problem's cache is paged: "
            f"page_size={problem.page_size}, got block_table={given}"
        )


def validate_for_problem(
    q: object,
    k: object,
    v: object,
    problem: Problem,
    *,
    cache_seqlens: object = None,
    block_table: object = None,
    **limits: Any,
) -> Problem:
    """:func:`validate_attention_inputs` with every feature ``problem`` states (mask, scale, alignment, GQA,
    cache lengths, LSE, paging) and the rung's ``limits`` (dtypes, head_dims, device_types): the check of
    a rung that implements all of them, on tensors a caller described by ``problem``."""
    require_cache_seqlens_as_stated(problem, cache_seqlens)
    require_block_table_as_stated(problem, block_table)
    return validate_attention_inputs(
        q,
        k,
        v,
        causal=problem.causal,
        softmax_scale=problem.softmax_scale,
        causal_alignment=problem.causal_alignment,
        cache_seqlens=cache_seqlens,
        return_lse=problem.return_lse,
        block_table=block_table,
        allow_gqa=True,
        **limits,
    )


def is_kernel_addressable(tensor: torch.Tensor) -> bool:
    """True when the inner dim is contiguous and base and outer strides are 16-byte aligned."""
    *outer, inner = tensor.stride()
    if inner != 1 or tensor.data_ptr() % OPERAND_ALIGNMENT_BYTES:
        return False
    # Every outer stride is a multiple of the alignment in bytes exactly when their gcd is: one call,
    # not a generator per stride (bind asks it of q, k and v at every decode step).
    return math.gcd(*outer) * tensor.element_size() % OPERAND_ALIGNMENT_BYTES == 0


def kernel_operand(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor itself if a kernel can address it by strides, else an explicit contiguous copy."""
    return tensor if is_kernel_addressable(tensor) else tensor.contiguous()
