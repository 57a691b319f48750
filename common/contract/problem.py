"""The attention problem: shapes, dtype, masking convention, and what it costs.

Layout is SDPA's: q is (B, H, Sq, D), k and v are (B, H, Sk, D), o is (B, H, Sq, D).
Causal masking is top-left aligned exactly like ``torch.nn.functional.scaled_dot_product_attention``
with ``is_causal=True``: query row ``i`` sees keys ``j <= i``. When Sq > Sk the rows ``i >= Sk``
see every key; when Sq < Sk the last keys are never seen by anyone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

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


def visible_keys(seqlen_q: int, seqlen_k: int, causal: bool) -> int:
    """Number of (query, key) pairs that survive the mask, summed over all query rows."""
    if not causal:
        return seqlen_q * seqlen_k
    # Row i sees min(i + 1, Sk) keys.
    full_rows = max(seqlen_q - seqlen_k, 0)
    ramp = min(seqlen_q, seqlen_k)
    return ramp * (ramp + 1) // 2 + full_rows * seqlen_k


@dataclass(frozen=True)
class Problem:
    """One forward-attention problem. ``softmax_scale=None`` means 1/sqrt(head_dim)."""

    batch: int
    heads: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    dtype: torch.dtype = torch.bfloat16
    causal: bool = False
    softmax_scale: float | None = None

    def __post_init__(self) -> None:
        for field_name in ("batch", "heads", "seqlen_q", "seqlen_k", "head_dim"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Problem.{field_name} must be a positive int, got {value!r}")
        if self.softmax_scale is not None and not math.isfinite(self.softmax_scale):
            raise ValueError(f"softmax_scale must be finite, got {self.softmax_scale!r}")

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
        """Unmasked score entries over the whole batch."""
        return self.batch * self.heads * visible_keys(self.seqlen_q, self.seqlen_k, self.causal)

    @property
    def flops(self) -> int:
        """Two GEMMs, 2 FLOPs per multiply-add, counted only on unmasked scores."""
        return 4 * self.head_dim * self.visible_scores

    @property
    def min_bytes(self) -> int:
        """Q, K, V read once and O written once, in the problem's dtype."""
        element = torch.empty((), dtype=self.dtype).element_size()
        q_and_o = 2 * self.seqlen_q
        k_and_v = 2 * self.seqlen_k
        return element * self.batch * self.heads * self.head_dim * (q_and_o + k_and_v)

    @property
    def score_buffer_bytes(self) -> int:
        """Size of a materialised fp32 S matrix (what the naive rung allocates)."""
        return 4 * self.batch * self.heads * self.seqlen_q * self.seqlen_k

    def with_(self, **changes: object) -> Problem:
        return replace(self, **changes)

    def describe(self) -> str:
        mask = "causal" if self.causal else "full"
        seq = f"S={self.seqlen_q}" if self.seqlen_q == self.seqlen_k else f"Sq={self.seqlen_q} Sk={self.seqlen_k}"
        return f"B={self.batch} H={self.heads} {seq} D={self.head_dim} {self.dtype_name} {mask}"

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
