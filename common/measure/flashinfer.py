"""FlashInfer's batch decode (``flashinfer-python``) as a baseline row, ``flashinfer/decode``.

FlashInfer is the attention library serving engines (SGLang, vLLM) call for paged decoding, so the
decode rungs are measured against it as against cuDNN: same inputs, same fp64 check, same timing. It
is imported like torch, never copied. Where it does not import, or cannot build (JIT-compile) or run
its decode kernel for a problem's dtype and head dim, the row reads ``unavailable: <reason>`` and
every other row is unaffected (``bench/prepare_flashinfer.sh`` carries it to the GPU machine,
``bench/flashinfer_probe.sh`` says whether it can build there).

The call: ``BatchDecodeWithPagedKVCacheWrapper`` (``plan`` once per bound call, ``run`` per step).
  * Layout, zero-copy either way:
    - a paged problem's pools (num_pages, page_size, Hkv, D) are FlashInfer's "NHD" layout as they
      are (the suite's paged layout is FlashAttention's, which is FlashInfer's), and sequence b's pages
      are its ``block_table`` row;
    - the suite's contiguous cache (B, Hkv, Sk, D) is FlashInfer's "HND" paged layout, pages of (Hkv,
      page_size, D). Page p starts ``p · page_size`` keys into head 0 of the buffer and its heads lie
      ``Sk · D`` elements apart (FlashInfer reads the cache by its strides), so sequence b's pages are
      ``b · Hkv · Sk / page_size + c`` for its c-th chunk of keys and the pages tensor is an
      ``as_strided`` view of K (and of V). ``page_size`` is ``PAGE_SIZE`` (16, the size engines use)
      or the largest divisor of Sk below it, so that page numbers are whole. (One page of Sk keys per
      sequence would also be zero-copy, but FlashInfer splits a sequence's keys across CTAs only at
      page boundaries: such a batch of one long sequence would run on Hkv CTAs.)
    Both end in one (B, pages per sequence) table of page numbers, ``page_rows``.
  * GQA: FlashInfer's own (``num_qo_heads``, ``num_kv_heads``). Groups of ``TENSOR_CORE_MIN_GROUP``
    or more query heads per KV head, and Sq > 1, take its tensor-core path (``use_tensor_cores``,
    SGLang's rule), the others its CUDA-core decode kernel.
  * Per-sequence lengths: the page table (indptr, page indices, last page's length) is built on the
    host from ``cache_seqlens`` (and a paged problem's ``block_table``) in ``bind`` and planned there,
    as engines plan once per decode step for all layers; ``run()`` launches only. A caller who changes
    the lengths or the block table in place must bind again (``common.attention`` binds on every
    call). A sequence with no key is planned as one key of its first page and its rows are then set
    to O = 0, LSE = -inf (the suite's convention), as are the rows of a speculative step that see no
    key; these fixes run only when some row has no key.
  * LSE: FlashInfer's is in base 2 (``m + log2(d)`` over log2-scaled scores); ``run()`` returns it
    times ln 2, laid out (B, H, Sq).

Limits (the capability check): a CUDA GPU of compute capability 8.0 or newer; fp16 and bf16; head dim
64, 128 or 256; Sq from 1 to ``MAX_SEQLEN_Q``; the causal mask aligned bottom-right (FlashInfer's
convention: with Sq = 1 the token sees every key; Sq > 1 must be causal); GQA, ``cache_seqlens`` and
the LSE, paged KV caches (pages of 16 to 256 keys, the suite's range).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from types import ModuleType
from typing import Any

import torch

from common.contract.capability import BOTTOM_RIGHT, CACHE_SEQLENS, GQA, LSE, PAGED_KV, check_features
from common.contract.devices import lasting
from common.contract.problem import Problem
from common.contract.reference import sequence_lengths
from common.contract.registry import Implementation, Runner, warmed_up
from common.contract.validation import validate_for_problem

NAME = "flashinfer/decode"
PACKAGE = "flashinfer"
DISTRIBUTION = "flashinfer-python"
WRAPPER = "BatchDecodeWithPagedKVCacheWrapper"
DTYPES = (torch.float16, torch.bfloat16)
HEAD_DIMS = (64, 128, 256)
MIN_CAPABILITY = (8, 0)
MAX_SEQLEN_Q = 16
IMPLEMENTED = (GQA, BOTTOM_RIGHT, CACHE_SEQLENS, LSE, PAGED_KV)
# Keys per page of the contiguous cache's zero-copy view (or the largest divisor of Sk below it).
PAGE_SIZE = 16
# SGLang's rule: fp16/bf16 groups of 4 or more query heads per KV head decode on tensor cores.
TENSOR_CORE_MIN_GROUP = 4
# FlashInfer's recommended float workspace (split-KV partial outputs); zeroed before its first use.
WORKSPACE_BYTES = 128 * 2**20
# FlashInfer's LSE is log2 of the softmax denominator; the suite's is the natural log.
LN_2 = math.log(2.0)
# The probe that decides whether FlashInfer builds and runs a kernel: one KV head, a page of keys.
PROBE_SEQLEN_K = 16


@cache
def load_flashinfer() -> tuple[ModuleType | None, str]:
    """The ``flashinfer`` module, or None and the reason it cannot be used (read once per process)."""
    try:
        module = importlib.import_module(PACKAGE)
    except ModuleNotFoundError as error:
        if error.name == PACKAGE:
            return None, f"unavailable: {PACKAGE} is not installed (bench/prepare_flashinfer.sh carries it)"
        return None, f"unavailable: {PACKAGE} failed to import: {error}"
    except Exception as error:  # noqa: BLE001 - any import failure is this row's reason, never fatal
        return None, f"unavailable: {PACKAGE} failed to import: {type(error).__name__}: {error}"
    if not hasattr(module, WRAPPER):
        return None, f"unavailable: {PACKAGE} has no {WRAPPER} (a FlashInfer version this suite does not know)"
    return module, ""


def availability() -> tuple[bool, str]:
    """Whether ``flashinfer`` imports here, and if not, why."""
    module, reason = load_flashinfer()
    return module is not None, reason


def flashinfer_version_info() -> dict[str, Any]:
    """What env.json records: available or why not, and the installed distribution's version."""
    available, reason = availability()
    try:
        version = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        version = None
    return {"available": available, "reason": reason, "distribution": version}


def uses_tensor_cores(problem: Problem) -> bool:
    """FlashInfer's tensor-core decode for large GQA groups and speculative steps (Sq > 1)."""
    return problem.kv_group >= TENSOR_CORE_MIN_GROUP or problem.seqlen_q > 1


def page_size_for(seqlen_k: int) -> int:
    """The largest page of at most ``PAGE_SIZE`` keys that divides the padded cache length."""
    return math.gcd(seqlen_k, PAGE_SIZE)


# ----------------------------------------------------------------------------------------------
# The page table: which pages of the view each sequence reads, and which rows see no key
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PageTable:
    """FlashInfer's CSR page table (host int32): sequence b reads pages ``indices[indptr[b]:indptr[b+1]]``,
    the last of them up to ``last_page_len[b]`` keys."""

    indptr: torch.Tensor
    indices: torch.Tensor
    last_page_len: torch.Tensor


def page_table(lengths: Sequence[int], page_rows: torch.Tensor, page_size: int) -> PageTable:
    """Sequence b reads the first pages of ``page_rows[b]`` (host, (B, pages per sequence)), enough for
    its length; a sequence with no key gets its first page, of one key (its rows are overwritten, see
    :func:`rows_without_keys`)."""
    pages = [max(1, -(-length // page_size)) for length in lengths]
    indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32)
    indices = torch.cat([row[:count] for row, count in zip(page_rows, pages, strict=True)])
    last = [max(1, length - (count - 1) * page_size) for length, count in zip(lengths, pages, strict=True)]
    return PageTable(indptr, indices.to(torch.int32), torch.tensor(last, dtype=torch.int32))


def rows_without_keys(problem: Problem, lengths: Sequence[int]) -> torch.Tensor | None:
    """Boolean (B, Sq) on the host: query tokens that see no key (an empty sequence; with Sq > 1, the
    first tokens of a sequence shorter than Sq under the bottom-right mask), or None when there are none."""
    tokens = torch.arange(problem.seqlen_q)
    lengths_t = torch.tensor(list(lengths))[:, None]
    if problem.causal:
        # Bottom-right: token t sees keys j <= t + length - Sq (none of an empty sequence's).
        empty = tokens[None, :] + lengths_t - problem.seqlen_q < 0
    else:
        empty = (lengths_t == 0).expand(-1, problem.seqlen_q)
    return empty if bool(empty.any()) else None


def paged_view(cache: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The contiguous (B, Hkv, Sk, D) cache as FlashInfer's HND pages (num_pages, Hkv, page_size, D),
    zero-copy, and each sequence's pages in order, (B, Sk / page_size) on the host (module docstring)."""
    batch, kv_heads, seqlen_k, head_dim = cache.shape
    if not cache.is_contiguous():
        raise ValueError(
            f"{NAME}: the paged view needs a contiguous (B, Hkv, Sk, D) cache, got strides {cache.stride()}"
        )
    if seqlen_k % page_size:
        raise ValueError(f"{NAME}: page_size {page_size} must divide Sk={seqlen_k}")
    pages_per_head = seqlen_k // page_size
    page_rows = torch.arange(batch)[:, None] * (kv_heads * pages_per_head) + torch.arange(pages_per_head)[None, :]
    # The last page of the last sequence's head 0 ends exactly where the buffer's last head begins.
    num_pages = int(page_rows[-1, -1]) + 1
    strides = (page_size * head_dim, seqlen_k * head_dim, head_dim, 1)
    return cache.as_strided((num_pages, kv_heads, page_size, head_dim), strides), page_rows


def kv_pages(
    k: torch.Tensor, v: torch.Tensor, problem: Problem, block_table: torch.Tensor | None
) -> tuple[str, int, torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashInfer's layout name, page size, K and V pages and the (B, pages per sequence) host table of
    each sequence's pages: a paged problem's pools and block table as they are, else the contiguous
    cache's zero-copy view."""
    if problem.paged:
        if block_table is None:
            raise ValueError(f"{problem.describe()} reads a paged KV cache, but block_table is None")
        return "NHD", problem.page_size, k, v, block_table.cpu()
    page_size = page_size_for(problem.seqlen_k)
    k_pages, page_rows = paged_view(k.contiguous(), page_size)
    v_pages, _ = paged_view(v.contiguous(), page_size)
    return "HND", page_size, k_pages, v_pages, page_rows


# ----------------------------------------------------------------------------------------------
# Bind and prepare
# ----------------------------------------------------------------------------------------------
@cache
def _workspace(device: torch.device) -> torch.Tensor:
    """One float workspace per device, shared by every wrapper (runs are sequential on one stream)."""
    return lasting(lambda: torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device), device)


def _query_tokens(q: torch.Tensor, problem: Problem) -> torch.Tensor:
    """q (B, H, Sq, D) as FlashInfer's (B · Sq, H, D): a view for one token, else a copy (untimed)."""
    if problem.seqlen_q == 1:
        return q[:, :, 0, :]
    return q.transpose(1, 2).reshape(problem.batch * problem.seqlen_q, problem.heads, problem.head_dim)


def refuse_short_sequences(problem: Problem, lengths: Sequence[int]) -> None:
    """FlashInfer's multi-token decode needs every sequence to hold at least its Sq new tokens (its
    earlier rows would otherwise see no key); the suite's contract gives such rows O = 0 and LSE = -inf,
    which FlashInfer cannot express, so a step with a shorter sequence is refused before planning."""
    shortest = min(lengths)
    if problem.seqlen_q > 1 and shortest < problem.seqlen_q:
        raise ValueError(
            f"{NAME} needs every cache_seqlens >= Sq when Sq > 1 (FlashInfer's q_len_per_req rule), "
            f"got Sq={problem.seqlen_q} and a sequence of {shortest} keys"
        )


def bind(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, *,
    cache_seqlens: torch.Tensor | None = None, block_table: torch.Tensor | None = None,
) -> Runner:  # fmt: skip
    """Plan FlashInfer's decode for these tensors (page table on the host, its scheduler, JIT module)
    and return ``run()``, which launches it into the same O (and LSE) buffers every call."""
    module, reason = load_flashinfer()
    if module is None:
        raise RuntimeError(reason)
    layout, page_size, k_pages, v_pages, page_rows = kv_pages(k, v, problem, block_table)
    lengths = sequence_lengths(problem, cache_seqlens)
    refuse_short_sequences(problem, lengths)
    table = page_table(lengths, page_rows, page_size)
    wrapper = getattr(module, WRAPPER)(
        _workspace(q.device), kv_layout=layout, use_tensor_cores=uses_tensor_cores(problem)
    )
    wrapper.plan(
        table.indptr, table.indices, table.last_page_len, problem.heads, problem.kv_heads, problem.head_dim,
        page_size, q_data_type=problem.dtype, kv_data_type=problem.dtype, sm_scale=problem.scale,
        q_len_per_req=problem.seqlen_q,
    )  # fmt: skip
    tokens = problem.batch * problem.seqlen_q
    query = _query_tokens(q, problem)
    out = torch.empty((tokens, problem.heads, problem.head_dim), dtype=q.dtype, device=q.device)
    lse_log2 = torch.empty((tokens, problem.heads), dtype=torch.float32, device=q.device)
    lse = torch.empty((problem.batch, problem.heads, problem.seqlen_q), dtype=torch.float32, device=q.device)
    # O and LSE as the suite lays them out: (B, H, Sq, D) and (B, H, Sq), views of FlashInfer's buffers.
    out_bhsd = out.view(problem.batch, problem.seqlen_q, problem.heads, problem.head_dim).transpose(1, 2)
    lse_bsh = lse_log2.view(problem.batch, problem.seqlen_q, problem.heads).transpose(1, 2)
    empty = rows_without_keys(problem, lengths)
    empty_rows = None if empty is None else empty[:, None, :].expand(-1, problem.heads, -1).to(q.device)

    lse_out = {"lse": lse_log2, "return_lse": True} if problem.return_lse else {}

    def run() -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        wrapper.run(query, (k_pages, v_pages), out=out, **lse_out)
        if empty_rows is not None:
            out_bhsd.masked_fill_(empty_rows[..., None], 0.0)
        if not problem.return_lse:
            return out_bhsd
        torch.mul(lse_bsh, LN_2, out=lse)
        if empty_rows is not None:
            lse.masked_fill_(empty_rows, float("-inf"))
        return out_bhsd, lse

    return run


def prepare(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, *,
    cache_seqlens: torch.Tensor | None = None, block_table: torch.Tensor | None = None,
) -> Runner:  # fmt: skip
    """Validate q (B, H, Sq, D), k and v (B, Hkv, Sk, D) or page pools with their ``block_table``, plan
    (and JIT-compile, the first time for a dtype and head dim) and launch once."""
    checked = validate_for_problem(
        q, k, v, problem, cache_seqlens=cache_seqlens, block_table=block_table, dtypes=DTYPES, head_dims=HEAD_DIMS
    )
    ok, reason = supports(checked, q.device)
    if not ok:
        raise ValueError(reason)
    return warmed_up(bind(q, k, v, checked, cache_seqlens=cache_seqlens, block_table=block_table), q.device)


# ----------------------------------------------------------------------------------------------
# Capability check: the problem's shape and mask, then a probe that FlashInfer builds and runs
# ----------------------------------------------------------------------------------------------
def _mask_supported(problem: Problem) -> tuple[bool, str]:
    """FlashInfer's decode lets one token see every key and masks Sq > 1 tokens causally, bottom-right."""
    # Top-left equals bottom-right when Sq = Sk and every sequence has all Sk keys.
    bottom_right = problem.causal_alignment == "bottom_right" or (
        problem.seqlen_q == problem.seqlen_k and not problem.has_cache_seqlens
    )
    if problem.seqlen_q == 1 and (not problem.causal or bottom_right or problem.seqlen_k == 1):
        return True, ""
    if problem.seqlen_q > 1 and problem.causal and bottom_right:
        return True, ""
    if not problem.causal:
        return False, f"{NAME}: FlashInfer masks Sq > 1 query tokens causally, got a non-causal Sq={problem.seqlen_q}"
    return False, (
        f"{NAME}: FlashInfer aligns the causal mask bottom-right (the KV-cache convention), this problem top-left "
        f"(Sq={problem.seqlen_q}, Sk={problem.seqlen_k}{', cache_seqlens' if problem.has_cache_seqlens else ''})"
    )


@cache
def _builds(dtype: torch.dtype, head_dim: int, tensor_cores: bool, device: torch.device) -> tuple[bool, str]:
    """Plan and run FlashInfer's kernel for this dtype, head dim and path on one small problem, which
    JIT-compiles it the first time (minutes); any failure is the reason the row cannot run."""
    heads = TENSOR_CORE_MIN_GROUP if tensor_cores else 1
    probe = Problem(1, heads, 1, PROBE_SEQLEN_K, head_dim, dtype=dtype, causal=True, kv_heads=1,
                    causal_alignment="bottom_right")  # fmt: skip
    q = torch.randn((1, heads, 1, head_dim), dtype=dtype, device=device)
    kv = torch.randn((1, 1, PROBE_SEQLEN_K, head_dim), dtype=dtype, device=device)
    path = "tensor-core" if tensor_cores else "CUDA-core"
    try:
        bind(q, kv, kv, probe)()
        torch.cuda.synchronize(device)
    except Exception as error:  # noqa: BLE001 - a kernel that cannot be built is this row's reason
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return False, (
            f"unavailable: {PACKAGE} could not build or run its {path} decode for {probe.dtype_name} "
            f"D={head_dim}: {type(error).__name__}: {first_line}"
        )
    return True, ""


def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    """Importable, a CUDA sm_80+ GPU, fp16/bf16, a head dim FlashInfer's decode takes, 1 to 16 query
    tokens, FlashInfer's mask, the features it implements; then its kernel must build and run."""
    available, reason = availability()
    if not available:
        return False, reason
    if device.type != "cuda":
        return False, f"{NAME} needs a CUDA GPU, got {device}"
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        return False, f"{NAME} needs compute capability 8.0 or newer, got {capability[0]}.{capability[1]}"
    if problem.dtype not in DTYPES:
        return False, f"{NAME} runs fp16 and bf16, got {problem.dtype_name}"
    if problem.head_dim not in HEAD_DIMS:
        return False, f"{NAME} supports head_dim in {list(HEAD_DIMS)}, got {problem.head_dim}"
    if problem.seqlen_q > MAX_SEQLEN_Q:
        return False, f"{NAME} takes 1 to {MAX_SEQLEN_Q} query tokens, got Sq={problem.seqlen_q}: a prefill problem"
    for ok, reason in (_mask_supported(problem), check_features(NAME, problem, IMPLEMENTED)):
        if not ok:
            return False, reason
    return _builds(problem.dtype, problem.head_dim, uses_tensor_cores(problem), torch.device(device))


NOTES = "FlashInfer's batch decode (flashinfer-python), imported as a baseline"
IMPLEMENTATION = Implementation.named(NAME, prepare=prepare, bind=bind, supports=supports, notes=NOTES)
