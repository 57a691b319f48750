"""FlashAttention-4's SM90 forward (``flash_attn.cute``) as a baseline row, ``fa4/sm90``.

FA4 is the strongest public CuTe DSL attention kernel, so the suite measures its rungs against it
exactly as against the SDPA backends: same inputs, same correctness rule, same timing. It is
imported like torch, never copied: when ``flash_attn.cute`` is absent or fails to import, the row
reads ``unavailable: <reason>`` and every other row is unaffected.

Layout: FA4 takes (B, S, H, D) tensors; the suite's are (B, H, S, D). ``prepare`` (untimed) copies
q, k and v into FA4's layout and allocates O there; ``run()`` launches FA4's forward into that O and
returns its (B, H, Sq, D) view, so the harness poisons and checks the very buffer FA4 writes. The
launch goes through ``flash_attn.cute.interface._flash_attn_fwd``, the function its public
``flash_attn_func`` calls minus the autograd wrapper, because only it takes a caller's ``out``.

Limits (the capability check): compute capability 9.0 (FA4's SM90 kernel; other GPUs run other
FA4 kernels, which are not this row), fp16 or bf16, head dim 8..256 in multiples of 8. FA4 aligns
the causal mask to the bottom-right corner: it runs ``causal_alignment="bottom_right"`` problems,
and top-left ones only where the two agree (Sq = Sk, no per-sequence lengths). GQA is FA4's own
(K and V keep their kv_heads heads). Per-sequence key lengths go to FA4 as ``seqused_k``, the
LSE comes from ``return_lse=True``, and a paged KV cache's block table goes to FA4 as ``page_table``
(the pools, (num_pages, page_size, Hkv, D), are FA4's paged layout as they are, so they are not
copied; the SM90 kernel loads pages by TMA when page_size equals its key tile, else by cp.async, a
page lookup per key row), each only where the installed ``_flash_attn_fwd`` takes that keyword
(:data:`FEATURE_KEYWORDS`); otherwise the row says so. These paths have not been run on a GPU by
this suite yet.

Install: FA4's package index release ``fa4`` 4.0.0b3 does not import with nvidia-cutlass-dsl 4.8.1;
the source of ``flash_attn/cute`` at Dao-AILab/flash-attention commit 0251105 (2026-08-15) does,
with quack-kernels 0.6.5, apache-tvm-ffi 0.1.15.post2 and torch-c-dlpack-ext 0.1.5 (README, "Use it
as a library"). :func:`fa4_version_info` names the source that ran, for env.json.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
from collections.abc import Callable
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from common.contract.problem import Problem
from common.contract.registry import Implementation, Runner, warmed_up
from common.contract.validation import validate_for_problem
from common.toolchain.arch import check_sm90

NAME = "fa4/sm90"
PACKAGE = "flash_attn.cute"
# The module holding the forward that accepts a caller's output buffer.
INTERFACE = "flash_attn.cute.interface"
FORWARD = "_flash_attn_fwd"
DTYPES = (torch.float16, torch.bfloat16)
MIN_HEAD_DIM, MAX_HEAD_DIM, HEAD_DIM_MULTIPLE = 8, 256, 8
# Distributions FA4 has been published as; the snapshot used on the H200 has none (source only).
DISTRIBUTIONS = ("flash-attn-4", "fa4")
# Source fingerprints (see source_fingerprint) of FA4 snapshots known to run with the pinned CuTe DSL.
# Keywords of _flash_attn_fwd a problem feature needs (checked against the installed signature).
FEATURE_KEYWORDS = {"cache_seqlens": "seqused_k", "return_lse": "return_lse", "block_table": "page_table"}
KNOWN_SOURCES = {
    "49ba1b925fd1c4fd": "Dao-AILab/flash-attention@0251105 (2026-08-15), flash_attn/cute",
}


@cache
def load_forward() -> tuple[Callable[..., Any] | None, str]:
    """FA4's forward function, or None and the reason it cannot be used (read once per process)."""
    try:
        interface = importlib.import_module(INTERFACE)
    except ModuleNotFoundError as error:
        if error.name is not None and (error.name == PACKAGE or PACKAGE.startswith(error.name + ".")):
            return None, f"unavailable: {PACKAGE} is not installed (README: 'Use it as a library' installs it)"
        return None, f"unavailable: {PACKAGE} failed to import: {error}"
    except Exception as error:  # noqa: BLE001 - any import failure is this row's reason, never fatal
        return None, f"unavailable: {PACKAGE} failed to import: {type(error).__name__}: {error}"
    forward = getattr(interface, FORWARD, None)
    if forward is None or "out" not in inspect.signature(forward).parameters:
        return (
            None,
            f"unavailable: {INTERFACE} has no {FORWARD}(..., out=...) (an FA4 version this suite does not know)",
        )
    return forward, ""


def availability() -> tuple[bool, str]:
    """Whether ``flash_attn.cute`` imports here, and if not, why."""
    forward, reason = load_forward()
    return forward is not None, reason


def source_fingerprint(package_dir: Path) -> str:
    """The first 16 hex digits of a SHA-256 over the package's ``.py`` files (path and bytes)."""
    digest = hashlib.sha256()
    for path in sorted(package_dir.rglob("*.py")):
        digest.update(path.relative_to(package_dir).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _distribution_version() -> str | None:
    for name in DISTRIBUTIONS:
        try:
            return f"{name} {metadata.version(name)}"
        except metadata.PackageNotFoundError:
            continue
    return None


def fa4_version_info() -> dict[str, Any]:
    """What env.json records about FA4: available or why not, where it was found, its distribution
    version (None for a source checkout) and a fingerprint of its source, named when known."""
    available, reason = availability()
    info: dict[str, Any] = {"available": available, "reason": reason, "distribution": _distribution_version()}
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None:
        return {**info, "path": None, "source_fingerprint": None, "source": None}
    package_dir = Path(spec.origin).parent
    fingerprint = source_fingerprint(package_dir)
    return {
        **info,
        "path": str(package_dir),
        "source_fingerprint": fingerprint,
        "source": KNOWN_SOURCES.get(fingerprint, "unknown source (fingerprint not in common/measure/fa4.py)"),
    }


def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    """Importable, an sm_90 GPU, fp16/bf16, a head dim FA4's SM90 kernel takes, a square causal mask."""
    available, reason = availability()
    if not available:
        return False, reason
    ok, reason = check_sm90(NAME, device, "FA4's SM90 kernel")
    if not ok:
        return ok, reason
    if problem.dtype not in DTYPES:
        return False, f"{NAME} runs fp16 and bf16, got {problem.dtype_name}"
    head_dim = problem.head_dim
    if not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM or head_dim % HEAD_DIM_MULTIPLE:
        return False, (
            f"{NAME} needs head_dim in [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}] and a multiple of {HEAD_DIM_MULTIPLE}, "
            f"got {head_dim}"
        )
    if (
        problem.causal
        and problem.causal_alignment == "top_left"
        and (problem.seqlen_q != problem.seqlen_k or problem.has_cache_seqlens)
    ):
        return False, (
            f"{NAME} aligns the causal mask bottom-right, this problem top-left (SDPA's is_causal); "
            f"they differ when Sq != Sk or with per-sequence lengths (got Sq={problem.seqlen_q}, "
            f"Sk={problem.seqlen_k}{', cache_seqlens' if problem.has_cache_seqlens else ''})"
        )
    parameters = inspect.signature(load_forward()[0]).parameters
    wanted = {
        "cache_seqlens": problem.has_cache_seqlens,
        "return_lse": problem.return_lse,
        "block_table": problem.paged,
    }
    for feature, keyword in FEATURE_KEYWORDS.items():
        if wanted[feature] and keyword not in parameters:
            return False, f"{NAME}: {feature} needs {FORWARD}(..., {keyword}=...), which this FA4 version lacks"
    return True, ""


def bind(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, *, cache_seqlens: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
) -> Runner:  # fmt: skip
    """Copy validated q, k, v into FA4's (B, S, H, D) layout (paged k and v stay the pools they are) and
    allocate O there; ``run()`` only launches FA4 and returns O viewed as (B, H, Sq, D), with FA4's LSE
    when the problem returns it."""
    forward, reason = load_forward()
    if forward is None:
        raise RuntimeError(reason)
    q_bshd = q.transpose(1, 2).contiguous()
    k_bshd, v_bshd = (k, v) if problem.paged else (t.transpose(1, 2).contiguous() for t in (k, v))
    out = torch.empty_like(q_bshd)
    # Only the keywords of features this problem uses, so a plain problem calls FA4 exactly as before.
    extra: dict[str, object] = {}
    if problem.has_cache_seqlens:
        extra["seqused_k"] = cache_seqlens
    if problem.return_lse:
        extra["return_lse"] = True
    if problem.paged:
        extra["page_table"] = block_table

    def run() -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        result = forward(q_bshd, k_bshd, v_bshd, softmax_scale=problem.scale, causal=problem.causal, out=out, **extra)
        if problem.return_lse:
            return out.transpose(1, 2), result[1]
        return out.transpose(1, 2)

    return run


def prepare(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, *, cache_seqlens: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
) -> Runner:  # fmt: skip
    """Validate q (B, H, Sq, D), k and v (B, Hkv, Sk, D) or page pools, change their layout (untimed),
    and compile by one warm-up launch."""
    checked = validate_for_problem(
        q, k, v, problem, cache_seqlens=cache_seqlens, block_table=block_table, dtypes=DTYPES
    )
    run = bind(q, k, v, checked, cache_seqlens=cache_seqlens, block_table=block_table)
    return warmed_up(run, q.device)


NOTES = "FlashAttention-4 (flash_attn.cute), imported as a baseline"
IMPLEMENTATION = Implementation.named(NAME, prepare=prepare, bind=bind, supports=supports, notes=NOTES)
