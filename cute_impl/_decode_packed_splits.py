"""cute/decode's packed prefill with key splits (``decode.PACKED_PREFILL_SPLITS``): cute/hopper's kernel built with
``HopperAttentionConfig.key_splits`` writes each split's fp32 partials, then cute/decode's own merge kernel
(:meth:`decode.DecodeKernel.merge_kernel`, ``_decode_merge.merge_splits``) merges them into O and the LSE. One
``@cute.jit`` launcher runs both, so one host call launches the two kernels. Kept beside the rung so that the rung
file stays readable; ``decode.py``'s docstring ("Many packed rows on the prefill kernel") says when it runs.

Shapes: q packed (B, Hkv, group · Sq, D); k, v (B, Hkv, Sk, D); the partials (splits, B, Hkv, group · Sq, D) and
(splits, B, Hkv, group · Sq) fp32 as cute/hopper's kernel writes them, and the same memory as (splits, B · Hkv,
group · Sq, ·) as the merge reads it; O and the LSE packed, (B · Hkv, group · Sq, D) and (B · Hkv, group · Sq).
"""

from __future__ import annotations

from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch

from cute_impl import decode
from cute_impl._hopper_host import STATIC_SM_COUNT, HopperAttentionConfig
from cute_impl._host import (
    CUTE_DTYPES,
    cache_seqlens_tensor,
    fake_cache_seqlens,
    fake_stream,
    fake_tensor,
    static_head_dim_view,
)
from cute_impl.hopper import HopperAttention

# The merge kernel's tile fields do not enter it: the smallest tile of cute/decode's table at the head dim.
MERGE_TILE_M = 16


def merge_config(config: HopperAttentionConfig) -> decode.DecodeConfig:
    """cute/decode's configuration whose merge kernel merges ``config``'s splits: the padded split's merge (one chain
    a row, unrolled ``DecodeConfig``'s default ``MERGE_SPLITS_PER_STEP`` times: fixed, since ``config``, the compile
    key, does not hold it), the LSE always written (the packed prefill always allocates it)."""
    return decode.DecodeConfig(
        dtype=config.dtype,
        head_dim=config.head_dim,
        tile_m=MERGE_TILE_M,
        shape=decode.TILE_CONFIGS[config.head_dim],
        causal=config.causal,
        bottom_right=config.bottom_right,
        has_cache_seqlens=config.has_cache_seqlens,
        return_lse=True,
        split=True,
    )


class PackedSplitsKernel:
    """cute/hopper's key-split kernel, then cute/decode's merge: compile-time configuration only."""

    def __init__(self, config: HopperAttentionConfig):
        if not config.key_splits:
            raise ValueError(f"the packed prefill's splits need a key_splits configuration, got {config}")
        self.attention = HopperAttention(config)
        self.merge = decode.DecodeKernel(merge_config(config))
        self.head_dim = config.head_dim
        self.threads_per_cta = self.attention.threads_per_cta

    @cute.jit
    def __call__(
        self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mOPartial: cute.Tensor, mLSEPartial: cute.Tensor,
        mCacheSeqlens: cute.Tensor | None, mOPartialItems: cute.Tensor, mLSEPartialItems: cute.Tensor,
        mO: cute.Tensor, mLSE: cute.Tensor, softmax_scale_log2: cutlass.Float32, sm_count: cutlass.Int32,
        stream: cuda.CUstream,
    ):  # fmt: skip
        """The module docstring's shapes; ``mOPartialItems`` and ``mLSEPartialItems`` are the partials' memory as the
        merge reads it (splits, B · Hkv, rows, ·)."""
        self.attention(
            mQ, mK, mV, mOPartial, mLSEPartial, mCacheSeqlens, None, None, None, None, softmax_scale_log2,
            cutlass.Float32(1.0), sm_count, stream,
        )  # fmt: skip
        mOPartialItems, mO = (static_head_dim_view(t, self.head_dim) for t in (mOPartialItems, mO))
        self.merge.launch_merge(None, None, mO, mLSE, mOPartialItems, mLSEPartialItems, None, None, None, stream)


def fake_arguments(config: HopperAttentionConfig) -> tuple[Any, ...]:
    """:meth:`PackedSplitsKernel.__call__`'s arguments without data, as :func:`launch_arguments` passes them."""
    element = CUTE_DTYPES[config.dtype]
    operands = [fake_tensor(element, 4) for _ in range(3)]
    partials = [fake_tensor(cutlass.Float32, 5), fake_tensor(cutlass.Float32, 4)]
    lengths = fake_cache_seqlens() if config.has_cache_seqlens else None
    merged_views = [fake_tensor(cutlass.Float32, 4), fake_tensor(cutlass.Float32, 3)]
    outputs = [fake_tensor(element, 3), fake_tensor(cutlass.Float32, 2)]
    scalars = [cutlass.Float32(1.0), cutlass.Int32(STATIC_SM_COUNT)]
    return (*operands, *partials, lengths, *merged_views, *outputs, *scalars, fake_stream())


def launch_arguments(
    packed_q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, outputs: tuple[torch.Tensor, torch.Tensor],
    num_splits: int, cache_seqlens: torch.Tensor | None, scalars: tuple[float, int],
) -> tuple[Any, ...]:  # fmt: skip
    """The launch counterparts of :func:`fake_arguments`: the partials allocated here (fp32, ``num_splits`` leading,
    written in full by every launch: each split writes all its rows, an empty one O = 0 and LSE = -inf), ``outputs``
    the packed O and LSE (B, Hkv, rows, D) and (B, Hkv, rows), viewed as the merge reads them."""
    batch, kv_heads, rows, head_dim = packed_q.shape
    o_partial = torch.empty((num_splits, batch, kv_heads, rows, head_dim), dtype=torch.float32, device=packed_q.device)
    lse_partial = torch.empty((num_splits, batch, kv_heads, rows), dtype=torch.float32, device=packed_q.device)
    lengths = None if cache_seqlens is None else cache_seqlens_tensor(cache_seqlens)
    items = batch * kv_heads
    merged_views = (o_partial.view(num_splits, items, rows, head_dim), lse_partial.view(num_splits, items, rows))
    out, lse = outputs
    packed_outputs = (out.view(items, rows, head_dim), lse.view(items, rows))
    return (packed_q, k, v, o_partial, lse_partial, lengths, *merged_views, *packed_outputs, *scalars)
