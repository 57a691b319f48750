"""The checks every rung's capability function starts with: device, architecture, dtype, head dim.

Each returns ``(ok, reason)`` with a reason that names the rung, what it needs and what it got, so a
rung's ``supports`` reads as this shared check followed by its own limits. :func:`check_features` is
the one refusal of the problem features a rung does not implement (yet).
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from common.contract.problem import Problem, dtype_name
from common.toolchain.arch import SM90_SHARED_MEMORY_BYTES

DEVICE_NAMES = {"cuda": "CUDA", "cpu": "CPU"}


def _architecture(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def check_common(
    name: str,
    problem: Problem,
    device: torch.device,
    *,
    dtypes: Collection[torch.dtype],
    head_dims: Collection[int],
    min_capability: tuple[int, int],
    device_types: Collection[str] = ("cuda",),
    features: Collection[str] = (),
) -> tuple[bool, str]:
    """Device type, minimum SM architecture (CUDA only), dtype, head dim and the problem features
    the rung implements (``features``, see :func:`check_features`), in that order."""
    if device.type not in device_types:
        wanted = " or ".join(DEVICE_NAMES.get(kind, kind) for kind in sorted(device_types))
        return False, f"{name} needs a {wanted} device, got {device}"
    if device.type == "cuda":
        major, minor = _architecture(device)
        if (major, minor) < min_capability:
            wanted = f"sm_{min_capability[0]}{min_capability[1]}"
            return False, f"{name} needs {wanted} or newer, got sm_{major}{minor}"
    if problem.dtype not in dtypes:
        names = ", ".join(sorted(dtype_name(d) for d in dtypes))
        return False, f"{name} supports dtypes [{names}], got {problem.dtype_name}"
    if problem.head_dim not in head_dims:
        return False, f"{name} supports head_dim in {sorted(head_dims)}, got {problem.head_dim}"
    return check_features(name, problem, features)


# The problem features beyond plain attention (common/contract/problem.py), as rungs name them.
GQA = "gqa"
BOTTOM_RIGHT = "bottom_right"
CACHE_SEQLENS = "cache_seqlens"
LSE = "lse"
PAGED_KV = "paged_kv"
# The features of a contiguous (B, Hkv, Sk, D) cache, which every rung implements and passes to
# check_features as ``FEATURES``; the paged KV cache (a block table) is not among them, so a rung
# takes it only by naming PAGED_KV as well (triton/decode so far) and every other rung refuses it.
FEATURES = (GQA, BOTTOM_RIGHT, CACHE_SEQLENS, LSE)
KNOWN_FEATURES = (*FEATURES, PAGED_KV)


def needed_features(problem: Problem) -> dict[str, str]:
    """The features ``problem`` uses, each with words that say how (for refusals)."""
    needed = {}
    if problem.kv_heads != problem.heads:
        needed[GQA] = f"GQA (kv_heads={problem.kv_heads} < heads={problem.heads})"
    if problem.bottom_right:
        needed[BOTTOM_RIGHT] = (
            f"the bottom-right causal alignment (Sq={problem.seqlen_q}, Sk={problem.seqlen_k}"
            f"{', per-sequence lengths' if problem.has_cache_seqlens else ''})"
        )
    if problem.has_cache_seqlens:
        needed[CACHE_SEQLENS] = "per-sequence key lengths (cache_seqlens)"
    if problem.return_lse:
        needed[LSE] = "returning the LSE (return_lse)"
    if problem.paged:
        needed[PAGED_KV] = f"a paged KV cache (block_table, pages of {problem.page_size} keys)"
    return needed


def check_features(name: str, problem: Problem, implemented: Collection[str] = ()) -> tuple[bool, str]:
    """Refuse the features of ``problem`` that ``name`` does not implement: ``implemented`` lists
    those it does (names of :data:`KNOWN_FEATURES`). The bottom-right alignment counts only where it
    differs from the top-left one (``Problem.bottom_right``)."""
    unknown = set(implemented) - set(KNOWN_FEATURES)
    if unknown:
        raise ValueError(f"unknown features {sorted(unknown)}; known: {KNOWN_FEATURES}")
    missing = [words for feature, words in needed_features(problem).items() if feature not in implemented]
    if missing:
        return False, f"{name}: {'; '.join(missing)} not implemented yet"
    return True, ""


def check_shared_memory(
    name: str, kernel: str, needed: int, available: int = SM90_SHARED_MEMORY_BYTES
) -> tuple[bool, str]:
    """Refuse a configuration whose ``kernel`` needs more shared memory per CTA than sm_90 offers, so
    that it is skipped with both numbers instead of failing at launch with Triton's OutOfResources."""
    if needed > available:
        return False, (
            f"{name}: {kernel} needs {needed:,} bytes of shared memory per CTA, "
            f"over the {available:,} bytes an sm_90 CTA may use"
        )
    return True, ""
