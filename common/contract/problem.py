"""The attention problem: shapes, dtype, masking convention, and what it costs.

Layout is SDPA's: q is (B, H, Sq, D), k and v are (B, Hkv, Sk, D), o is (B, H, Sq, D).

* **GQA / MQA**: ``kv_heads`` (Hkv, default H) divides H; query head ``h`` reads KV head
  ``kv_head = h // (H // Hkv)`` (``Problem.kv_head``), never a repeated copy. Hkv = 1 is MQA.
* **Causal alignment** (``causal_alignment``): ``"top_left"`` is SDPA's ``is_causal`` (the default):
  query row ``i`` sees keys ``j <= i``; when Sq > Sk the rows ``i >= Sk`` see every key, when Sq < Sk
  the last keys are never seen by anyone. ``"bottom_right"`` is the KV-cache convention
  (FlashAttention's): row ``i`` sees keys ``j <= i + Sk - Sq`` (``causal_offset = Sk - Sq``), so the
  last query row sees every key, and when Sq > Sk the first Sq - Sk rows see none. The two agree
  when Sq = Sk.
* **Per-sequence key lengths** (``has_cache_seqlens``): a (B,) int32 tensor ``cache_seqlens`` passed
  with the inputs (not part of the problem: it changes every call, the compiled code does not) gives
  the valid keys of each sequence of a padded (B, Hkv, Sk, D) cache. Keys ``j >= cache_seqlens[b]``
  are masked, and the bottom-right alignment is taken from it: ``causal_offset = cache_seqlens[b] - Sq``.
* **Paged KV cache** (``page_size``, 0 = a contiguous cache): K and V are page pools (num_pages,
  page_size, Hkv, D) (FlashAttention's ``flash_attn_with_kvcache`` / FlashInfer's "NHD" layout), and a
  (B, max_pages_per_seq) int32 ``block_table`` passed with the inputs (like ``cache_seqlens``, not part of
  the problem) says where each sequence's keys are: sequence b's key j lives in page
  ``block_table[b, j // page_size]``, slot ``j % page_size``. ``seqlen_k`` is the logical capacity
  max_pages_per_seq · page_size, and a paged problem always has ``cache_seqlens`` (a block table holds no
  lengths).
* **LSE** (``return_lse``): the implementation also returns ``lse`` (B, H, Sq) fp32, the natural-log
  log-sum-exp of each row's scaled scores (FlashAttention's convention); -inf for a row that sees no
  key, whose output row is 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

DTYPE_NAMES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
}
# The canonical problem keeps the model width H * D and the tokens per batch B * S fixed.
CANONICAL_MODEL_WIDTH = 2048
CANONICAL_TOKENS = 16384
CANONICAL_HEAD_DIM = 128


def dtype_name(dtype: torch.dtype) -> str:
    """Short name of a dtype (``bf16``, ``fp16``, ``fp32``, else torch's own name)."""
    for name, candidate in DTYPE_NAMES.items():
        if candidate == dtype:
            return name
    return str(dtype).removeprefix("torch.")


CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")
# Keys per page of a paged KV cache: vLLM's default is 16, FlashInfer's examples use up to 256.
MIN_PAGE_SIZE, MAX_PAGE_SIZE = 16, 256


def causal_offset(seqlen_q: int, seqlen_k: int, causal_alignment: str) -> int:
    """How far the causal diagonal is shifted right: row i sees keys j <= i + offset."""
    return seqlen_k - seqlen_q if causal_alignment == "bottom_right" else 0


def visible_keys(seqlen_q: int, seqlen_k: int, causal: bool, causal_alignment: str = "top_left") -> int:
    """Number of (query, key) pairs that survive the mask, summed over all query rows."""
    if not causal:
        return seqlen_q * seqlen_k
    # Row i sees clamp(i + 1 + offset, 0, Sk) keys: none before row -offset, a ramp, then all Sk.
    offset = causal_offset(seqlen_q, seqlen_k, causal_alignment)
    ramp_begin = min(max(0, -offset), seqlen_q)
    ramp_end = min(max(ramp_begin, seqlen_k - 1 - offset), seqlen_q)
    ramp_keys = (ramp_begin + 1 + offset + ramp_end + offset) * (ramp_end - ramp_begin) // 2
    return ramp_keys + (seqlen_q - ramp_end) * seqlen_k


@dataclass(frozen=True)
class Problem:
    """One forward-attention problem (the module docstring defines every field's convention).

    ``softmax_scale=None`` means 1/sqrt(head_dim); ``kv_heads=None`` means ``heads`` (no GQA) and is
    stored as ``heads``, so equal problems compare and hash equal. ``seqlen_k`` is the padded key
    length when ``has_cache_seqlens``, the block table's capacity when ``page_size`` is set.
    """

    batch: int
    heads: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    dtype: torch.dtype = torch.bfloat16
    causal: bool = False
    softmax_scale: float | None = None
    kv_heads: int | None = None
    causal_alignment: str = "top_left"
    has_cache_seqlens: bool = False
    return_lse: bool = False
    page_size: int = 0

    def __post_init__(self) -> None:
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        for field_name in ("batch", "heads", "seqlen_q", "seqlen_k", "head_dim", "kv_heads"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Problem.{field_name} must be a positive int, got {value!r}")
        if self.heads % self.kv_heads:
            raise ValueError(
                f"Problem.kv_heads must divide heads (GQA groups of heads // kv_heads query heads), "
                f"got heads={self.heads} and kv_heads={self.kv_heads}"
            )
        if self.causal_alignment not in CAUSAL_ALIGNMENTS:
            raise ValueError(f"causal_alignment must be one of {CAUSAL_ALIGNMENTS}, got {self.causal_alignment!r}")
        for field_name in ("causal", "has_cache_seqlens", "return_lse"):
            if not isinstance(getattr(self, field_name), bool):
                raise ValueError(f"Problem.{field_name} must be a bool, got {getattr(self, field_name)!r}")
        if self.softmax_scale is not None and not math.isfinite(self.softmax_scale):
            raise ValueError(f"softmax_scale must be finite, got {self.softmax_scale!r}")
        if self.page_size != 0 or type(self.page_size) is not int:
            self._check_paging()

    def _check_paging(self) -> None:
        """A paged problem: a page size in range, a capacity of whole pages, and per-sequence lengths."""
        if type(self.page_size) is not int or not MIN_PAGE_SIZE <= self.page_size <= MAX_PAGE_SIZE:
            raise ValueError(
                f"Problem.page_size must be 0 (a contiguous cache) or an int in [{MIN_PAGE_SIZE}, {MAX_PAGE_SIZE}], "
                f"got {self.page_size!r}"
            )
        if self.seqlen_k % self.page_size:
            raise ValueError(
                f"a paged problem's seqlen_k is whole pages (max_pages_per_seq * page_size), "
                f"got seqlen_k={self.seqlen_k} and page_size={self.page_size}"
            )
        if not self.has_cache_seqlens:
            raise ValueError("a paged problem (page_size > 0) needs has_cache_seqlens: a block table holds no lengths")

    @property
    def paged(self) -> bool:
        """True when K and V are page pools read through a block table."""
        return self.page_size > 0

    @property
    def kv_group(self) -> int:
        """Query heads per KV head (1 without GQA, ``heads`` for MQA)."""
        return self.heads // self.kv_heads

    def kv_head(self, head: int) -> int:
        """The KV head that query head ``head`` reads."""
        return head // self.kv_group

    @property
    def bottom_right(self) -> bool:
        """True when the causal mask is aligned bottom-right and that differs from top-left: Sq != Sk,
        or per-sequence lengths (each sequence's own Sk). The mask a kernel must apply."""
        return (
            self.causal
            and self.causal_alignment == "bottom_right"
            and (self.seqlen_q != self.seqlen_k or self.has_cache_seqlens)
        )

    @property
    def scale(self) -> float:
        """The softmax scale actually applied to QKᵀ."""
        if self.softmax_scale is None:
            return 1.0 / math.sqrt(self.head_dim)
        return float(self.softmax_scale)

    @property
    def dtype_name(self) -> str:
        return dtype_name(self.dtype)

    @property
    def visible_scores(self) -> int:
        """Unmasked score entries over the whole batch. With ``has_cache_seqlens`` the lengths are
        not part of the problem: this counts every sequence at the full (padded) Sk; use
        :meth:`visible_scores_for` with the lengths to count what a call actually sees."""
        return self.batch * self.heads * visible_keys(self.seqlen_q, self.seqlen_k, self.causal, self.causal_alignment)

    def visible_scores_for(self, cache_seqlens: Sequence[int]) -> int:
        """Unmasked score entries given each sequence's key length (``cache_seqlens``, B values)."""
        return self.heads * sum(
            visible_keys(self.seqlen_q, int(length), self.causal, self.causal_alignment) for length in cache_seqlens
        )

    @property
    def flops(self) -> int:
        """Two GEMMs, 2 FLOPs per multiply-add, counted only on unmasked scores (at the padded Sk
        when ``has_cache_seqlens``, see :attr:`visible_scores`)."""
        return 4 * self.head_dim * self.visible_scores

    @property
    def min_bytes(self) -> int:
        """Q, K, V read once and O written once, in the problem's dtype (K and V have kv_heads heads),
        plus the fp32 LSE when returned."""
        element = torch.empty((), dtype=self.dtype).element_size()
        q_and_o = 2 * self.seqlen_q * self.heads
        k_and_v = 2 * self.seqlen_k * self.kv_heads
        lse = 4 * self.batch * self.heads * self.seqlen_q if self.return_lse else 0
        return element * self.batch * self.head_dim * (q_and_o + k_and_v) + lse

    @property
    def score_buffer_bytes(self) -> int:
        """Size of a materialised fp32 S matrix (what the naive rung allocates)."""
        return 4 * self.batch * self.heads * self.seqlen_q * self.seqlen_k

    def with_(self, **changes: object) -> Problem:
        """A copy with ``changes``; a problem without GQA keeps kv_heads = heads when heads changes."""
        if "heads" in changes and "kv_heads" not in changes and self.kv_heads == self.heads:
            changes["kv_heads"] = None
        # The constructor on every field (all are init fields): dataclasses.replace's field walk took
        # twice as long, and a growing KV cache makes a problem one key longer at every decode step.
        return type(self)(**{**vars(self), **changes})

    def with_seqlen_k(self, seqlen_k: int) -> Problem:
        """``with_(seqlen_k=seqlen_k)`` for a contiguous cache, checking only what reads Sk (a positive
        int; ``bottom_right`` and the rest are properties): every other field was checked when ``self``
        was made. A growing KV cache makes one such problem per decode step, at a fifth of ``with_``'s cost."""
        if self.paged:
            return self.with_(seqlen_k=seqlen_k)
        if type(seqlen_k) is not int or seqlen_k < 1:
            raise ValueError(f"Problem.seqlen_k must be a positive int, got {seqlen_k!r}")
        longer = object.__new__(type(self))
        longer.__dict__.update(vars(self), seqlen_k=seqlen_k)
        return longer

    def describe(self) -> str:
        mask = "causal" if self.causal else "full"
        if self.causal and self.causal_alignment != "top_left":
            mask += f"({self.causal_alignment})"
        seq = f"S={self.seqlen_q}" if self.seqlen_q == self.seqlen_k else f"Sq={self.seqlen_q} Sk={self.seqlen_k}"
        heads = f"H={self.heads}" if self.kv_heads == self.heads else f"H={self.heads} Hkv={self.kv_heads}"
        extras = "".join(
            (
                " cache_seqlens" if self.has_cache_seqlens else "",
                " lse" if self.return_lse else "",
                f" paged({self.page_size})" if self.paged else "",
            )
        )
        return f"B={self.batch} {heads} {seq} D={self.head_dim} {self.dtype_name} {mask}{extras}"

    @classmethod
    def canonical(
        cls,
        seqlen: int,
        *,
        head_dim: int = CANONICAL_HEAD_DIM,
        batch: int | None = None,
        heads: int | None = None,
        dtype: torch.dtype = torch.bfloat16,
        causal: bool = False,
    ) -> Problem:
        """The suite's standard shape: H·D = 2048 and B·S = 16384 (B=2, H=16 at S=8192, D=128)."""
        return cls(
            batch=batch if batch is not None else max(1, CANONICAL_TOKENS // seqlen),
            heads=heads if heads is not None else max(1, CANONICAL_MODEL_WIDTH // head_dim),
            seqlen_q=seqlen,
            seqlen_k=seqlen,
            head_dim=head_dim,
            dtype=dtype,
            causal=causal,
        )
