"""The one-call entry point for users who just want the output."""

from __future__ import annotations

import torch

from common.registry import get
from common.validation import validate_attention_inputs

DEFAULT_IMPL = "triton/pipelined"


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
    impl: str = DEFAULT_IMPL,
) -> torch.Tensor:
    """Attention output O (B, H, Sq, D) of q (B, H, Sq, D), k and v (B, H, Sk, D) by ``impl``.

    Raises ValueError for an unknown ``impl`` (listing the valid names) or a problem the
    implementation cannot run (with its reason); bad tensors raise as each rung validates them.
    """
    implementation = get(impl)
    problem = validate_attention_inputs(
        q,
        k,
        v,
        causal=causal,
        softmax_scale=softmax_scale,
        dtypes=(torch.float16, torch.bfloat16, torch.float32),
        device_types=("cuda", "cpu"),
    )
    ok, reason = implementation.check(problem, q.device)
    if not ok:
        raise ValueError(f"{impl} cannot run {problem.describe()}: {reason}")
    return implementation.prepare(q, k, v, problem)()
