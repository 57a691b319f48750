"""Every implementation of the registry as a Hugging Face ``transformers`` attention implementation.

::

    from common.integrations.transformers import register_attention_implementations

    names = register_attention_implementations()  # ["ladder:triton/naive", ..., "ladder:auto"]
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="ladder:auto")
    model.set_attn_implementation("ladder:cute/hopper")  # or switch a loaded model

**Names.** Each implementation ``<impl>`` is registered as ``"ladder:<impl>"``, and so is each stack
name of ``common.contract.dispatch`` (``ladder:triton``, ``ladder:gluon``, ``ladder:cute``,
``ladder:auto``): a model has one attention implementation for both phases, and a stack name runs
the prompt on the stack's fastest prefill rung and every decode step (one token against the cache)
on its decode rung, chosen once per signature by ``common.attention``'s plan. A single rung's name
runs that rung in both phases (``ladder:triton/decode`` refuses a prompt longer than 16 tokens). The names carry no
``"flash"``: transformers treats any implementation whose name contains "flash" as a FlashAttention
kernel (``is_flash_attention_requested``) and tries to import one from the hub at model creation
("Could not find the currently requested flash attention implementation"), and a name of the form
``org/repo`` or ``org/repo:kernel`` would be read as a hub kernel; ``ladder:<stack>/<rung>`` is
neither. The registered implementations are the ladder's rungs (Triton, Gluon, CuTe DSL); the
registry's baselines (``sdpa/*``, ``fa4/*``) are not registered: transformers has them already
(``"sdpa"``, ``"flash_attention_4"``), and their names contain "sdpa" or "flash", which transformers
also reads by substring.

**What is passed through.** transformers calls ``forward(module, query, key, value, attention_mask,
scaling=None, dropout=0.0, **kwargs)`` with query (B, H, Sq, D) and key/value (B, Hkv, Sk, D) straight
from the KV cache; the adapter hands them to :func:`common.attention` as they are (GQA is read
natively, k and v are never repeated), with ``softmax_scale=scaling``, and returns
``(out.transpose(1, 2), None)``, i.e. (B, Sq, H, D) and no attention weights. Refused with a
``ValueError``: ``dropout > 0``, ``softcap``, attention sinks (``s_aux``/``sinks``), a ``position_bias``
and every mask the API cannot express (below). A rung that cannot run the problem (dtype, head dim,
device, a feature) raises its own ``ValueError`` with its capability reason; nothing falls back to
another implementation. Training: under grad mode with tensors that require grad, ``common.attention``
differentiates through the rung's backward (each stack has some; ``cache_seqlens``, so a static
cache's mask, is refused) and raises ``NotImplementedError`` for a rung without one (use
``model.eval()`` and ``torch.no_grad()``; ``generate()`` already runs without grad).

**How the mask is read.** Registering an attention function alone is not enough: for a name that has
no mask function in ``AttentionMaskInterface``, transformers' ``create_causal_mask`` returns ``None``
and silently drops the padding mask. So the same name is also registered as a mask function
(:func:`ladder_mask`), and the two together decide what the model's mask means:

* The mask function returns ``None`` exactly when the mask is the plain causal one over every key
  (no padding, no window, no packed sequences, no custom mask function): ``kv_offset == 0``,
  ``q_offset + Sq == Sk`` (an empty cache for a prefill, a DynamicCache for chunked prefill and
  decode) and a 2D attention mask of all ones (or none). It decides this without building the
  mask where transformers passes ``q_length``/``q_offset`` (5.10 and later; 5.0 passes
  ``cache_position`` instead and always takes the next path: correct, but it builds the mask once
  per forward). In every other case it builds transformers' own boolean mask (``sdpa_mask`` with
  the skips off) and returns ``None`` if that mask equals the bottom-right causal mask, else the
  mask itself.
* The attention function, given ``attention_mask=None``, applies ``is_causal`` (the kwarg if
  transformers passes one, else ``module.is_causal``, else True) like SDPA does. A causal call maps
  to ``causal=True`` with ``causal_alignment="bottom_right"`` when Sq < Sk (chunked prefill against
  a cache: the new queries sit at the end of the keys), the same as top-left when Sq = Sk (prefill).
  A one-token decode step (Sq = 1) sees every key under the bottom-right mask, so it runs as
  ``causal=False``, which more rungs serve.
* Given a 4D mask (boolean, or additive with only 0 and -inf / dtype-min entries), the attention
  function reads it as the API's problem if it can: with L_b the number of keys the last query row
  of sequence b sees, the mask must be exactly "keys j < L_b, and (causal) j <= i + L_b - Sq", i.e.
  bottom-right causal (or full) attention over a prefix of each sequence's keys. That is what a
  ``StaticCache`` produces (the slots past the tokens written so far are masked), and it maps to
  ``cache_seqlens=L``. Anything else — left padding, right padding (its padded query rows see keys
  the bottom-right rule would not give them), packed sequences, a binding sliding window, a custom
  mask — is refused with a ``ValueError`` that says so. The check reads the mask (one device
  synchronisation) once per mask tensor: every layer of one forward reuses the verdict.

**CUDA graphs.** Reading a mask synchronises, which a CUDA graph capture forbids. While the current
stream is capturing, the mask function returns transformers' mask without checking it, and the
attention function reads a mask only for its per-sequence lengths (summed on the device, no
synchronisation), taking its pattern from the last mask of the same shape read outside the capture:
the eager warm-up steps before a capture (``torch.compile``'s "reduce-overhead" runs some) verify it.
A mask shape first seen during a capture is refused. ``common.attention``'s plan-cache hit path and
the decode rungs' ``bind`` neither synchronise nor read values, so a StaticCache's decode step (one
signature) is captured once it has been planned.

**torch.compile.** Under ``torch.compile`` (transformers' ``compile_config``: a StaticCache's decode
step compiled with ``mode="reduce-overhead"``, i.e. CUDA graphs) the attention function calls the
same code through the custom operator ``ladder::attention`` (``torch.library.custom_op``, shapes from
its fake implementation): Dynamo cannot trace a branch on a mask's values, the plan cache or a kernel
launch, and an opaque operator keeps the step one graph (``fullgraph=True`` works). The mask function
then builds transformers' mask without checking it; the operator checks it on its first, eager run
(CUDA graph trees run a step eagerly before recording it) and takes the verified pattern while the
graph is captured.

Batched generation therefore needs unpadded prompts of equal length (or batch size 1); for padded
batches use ``attn_implementation="sdpa"``.

Tested with transformers 5.0.0, 5.10.1 and 5.24.0 (CPU, Triton interpreter, a tiny GQA Llama:
tests/test_transformers_adapter.py).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from common.contract.api import attention, autocast_operands
from common.contract.dispatch import DISPATCH_NAMES
from common.contract.registry import discover

PREFIX = "ladder:"

# (weakref to the mask tensor, its version counter, (causal, every length is Sk)): the last verdict.
_LAST_MASK: list[Any] = [None, -1, None]
# (mask shape, dtype, Sq, Sk) -> causal, for the masks read as per-sequence lengths: what a CUDA graph
# capture, which cannot read a mask, takes their pattern from.
_VERIFIED_PATTERNS: dict[tuple, bool] = {}


def _capturing(device: torch.device | str | None) -> bool:
    """True while a CUDA graph is being captured on the current stream (never asks CUDA otherwise)."""
    return device is not None and torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing()


def implementation_name(impl: str) -> str:
    """The transformers ``attn_implementation`` name of registry implementation ``impl``."""
    return PREFIX + impl


def _refuse(name: str, what: str) -> ValueError:
    return ValueError(f"{name}: {what}")


def _keep(mask: torch.Tensor, name: str) -> torch.Tensor:
    """The boolean "attend" mask of a boolean or additive (0 / -inf) mask."""
    if mask.dtype == torch.bool:
        return mask
    if not mask.is_floating_point():
        raise _refuse(name, f"attention_mask of dtype {mask.dtype} is neither boolean nor additive")
    keep = mask == 0
    dropped = mask <= torch.finfo(mask.dtype).min
    if not bool((keep | dropped).all()):
        raise _refuse(name, "an additive attention_mask with values other than 0 and -inf (a bias) is not supported")
    return keep


def mask_pattern(mask: torch.Tensor, batch: int, seqlen_q: int, seqlen_k: int, name: str = PREFIX):
    """``(causal, cache_seqlens)`` equivalent to a 4D attention mask, or a ValueError if none is.

    The mask must be exactly bottom-right causal (or full) attention over the first L_b keys of each
    sequence b (see the module docstring); ``cache_seqlens`` is None when every L_b is Sk.
    """
    if mask.ndim != 4 or mask.shape[-2:] != (seqlen_q, seqlen_k) or mask.shape[0] not in (1, batch):
        raise _refuse(
            name, f"attention_mask of shape {tuple(mask.shape)} does not match (B={batch}, 1, {seqlen_q}, {seqlen_k})"
        )
    keep = _keep(mask, name)
    if keep.shape[1] != 1 and not torch.equal(keep, keep[:, :1].expand_as(keep)):
        raise _refuse(name, "a per-head attention_mask is not supported")
    keep = keep[:, 0]
    lengths = keep[:, -1, :].sum(-1)
    keys = torch.arange(seqlen_k, device=keep.device)
    rows = torch.arange(seqlen_q, device=keep.device)[:, None]
    valid = keys[None, None, :] < lengths[:, None, None]
    causal_keep = valid & (keys[None, None, :] <= rows[None] + lengths[:, None, None] - seqlen_q)
    if torch.equal(keep, causal_keep):
        causal = True
    elif torch.equal(keep, valid.expand_as(keep)):
        causal = False
    else:
        raise _refuse(
            name,
            "this attention mask is not one the API can express: it takes bottom-right causal (or full) "
            "attention over a prefix of each sequence's keys (a KV cache, cache_seqlens), and refuses "
            "padding masks (left or right padding), packed sequences, sliding windows and custom masks; "
            "pass unpadded inputs of equal length (or batch size 1), or use attn_implementation='sdpa'",
        )
    if bool((lengths == seqlen_k).all()):
        return causal, None
    return causal, lengths.to(torch.int32).expand(batch).contiguous()


def _mask_lengths(mask: torch.Tensor, batch: int) -> torch.Tensor:
    """The keys the last query row of each sequence sees, summed on the device (no synchronisation)."""
    keep = mask if mask.dtype == torch.bool else mask == 0
    # Summed straight into int32: one kernel per layer of a captured decode step, not a sum and a cast.
    lengths = keep[:, 0, -1, :].sum(-1, dtype=torch.int32)
    return lengths if lengths.shape[0] == batch else lengths.expand(batch).contiguous()


def _captured_mask_pattern(mask: torch.Tensor, batch: int, seqlen_q: int, seqlen_k: int, name: str):
    """``(causal, cache_seqlens)`` of a mask during a CUDA graph capture: the pattern verified for this
    shape outside the capture, the lengths summed on the device (see the module docstring)."""
    causal = _VERIFIED_PATTERNS.get((tuple(mask.shape), mask.dtype, seqlen_q, seqlen_k))
    if causal is None:
        raise _refuse(
            name,
            f"an attention_mask of shape {tuple(mask.shape)} was first seen during a CUDA graph capture, where "
            "reading it would synchronise; run one step of this shape eagerly before capturing",
        )
    return causal, _mask_lengths(mask, batch)


def _remember_verdict(mask: torch.Tensor, causal: bool, every_key: bool) -> tuple[bool, bool]:
    """Keep ``mask``'s verdict for the next call with this tensor and, for a mask of per-sequence lengths,
    its pattern for a CUDA-graph capture of the same shape (``_captured_mask_pattern``)."""
    _LAST_MASK[:] = [weakref.ref(mask), mask._version, (causal, every_key)]
    if not every_key:
        _VERIFIED_PATTERNS[(tuple(mask.shape), mask.dtype, *mask.shape[-2:])] = causal
    return causal, every_key


def _cached_mask_pattern(mask: torch.Tensor, batch: int, seqlen_q: int, seqlen_k: int, name: str):
    """``(causal, cache_seqlens)`` of a mask, read (one synchronisation) once per mask tensor: the verdict
    kept is ``(causal, every length is Sk)``, never a tensor, so nothing of a call outlives it (a kept
    tensor made during torch.compile's CUDA-graph warm-up would sit in the graph's memory pool and fail
    the recording); the lengths are summed again on the device at each call."""
    if _capturing(mask.device):
        return _captured_mask_pattern(mask, batch, seqlen_q, seqlen_k, name)
    ref, version, verdict = _LAST_MASK
    if ref is None or ref() is not mask or version != mask._version:
        causal, lengths = mask_pattern(mask, batch, seqlen_q, seqlen_k, name)
        verdict = _remember_verdict(mask, causal, every_key=lengths is None)
    causal, every_key = verdict
    return causal, None if every_key else _mask_lengths(mask, batch)


AttentionFn = Callable[..., torch.Tensor]

# name -> the eager attention function of each registered ``ladder:`` name, which the custom op
# ``ladder::attention`` runs by name (an op's arguments cannot carry a Python function).
_EAGER_FORWARDS: dict[str, Callable[..., torch.Tensor]] = {}


@torch.library.custom_op("ladder::attention", mutates_args=())
def compiled_attention(
    name: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
    causal: bool, scaling: float | None,
) -> torch.Tensor:  # fmt: skip
    """The ``ladder:`` attention ``name`` as one opaque operator for ``torch.compile``: Dynamo does not
    trace the mask check, the plan cache or the kernel launch (none of which it can), and CUDA graphs
    capture the launch (see the module docstring, "torch.compile")."""
    return _EAGER_FORWARDS[name](query, key, value, attention_mask, causal, scaling)


@compiled_attention.register_fake
def _compiled_attention_shape(
    name: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
    causal: bool, scaling: float | None,
) -> torch.Tensor:  # fmt: skip
    batch, heads, seqlen_q, _ = query.shape
    # Under autocast the op attends (and answers) in autocast's dtype, as attention() does.
    dtype = autocast_operands(query, key, value)[0].dtype
    return query.new_empty((batch, seqlen_q, heads, value.shape[-1]), dtype=dtype)


def _eager_forward(name: str, impl: str, attention_fn: AttentionFn) -> Callable[..., torch.Tensor]:
    """The attention of one call, (B, Sq, H, D) contiguous: the mask read as (causal, cache_seqlens)."""

    def attend(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        causal: bool,
        scaling: float | None,
    ) -> torch.Tensor:
        batch, _, seqlen_q, _ = query.shape
        seqlen_k = key.shape[2]
        cache_seqlens = None
        if attention_mask is not None:
            causal, cache_seqlens = _cached_mask_pattern(attention_mask, batch, seqlen_q, seqlen_k, name)
        if causal and seqlen_q == 1 and cache_seqlens is None:
            causal = False  # one query row at the bottom right sees every key
        alignment = "bottom_right" if causal and (seqlen_q != seqlen_k or cache_seqlens is not None) else "top_left"
        out = attention_fn(
            query,
            key,
            value,
            causal=causal,
            softmax_scale=scaling,
            impl=impl,
            causal_alignment=alignment,
            cache_seqlens=cache_seqlens,
        )
        return out.transpose(1, 2).contiguous()

    return attend


def make_attention_forward(impl: str, attention_fn: AttentionFn = attention) -> Callable[..., tuple]:
    """The transformers attention function running ``impl`` through ``attention_fn`` (the API); under
    ``torch.compile`` it calls the same code through the custom op ``ladder::attention``."""
    name = implementation_name(impl)
    op_name = f"{name}@{id(attention_fn):x}"
    _EAGER_FORWARDS[op_name] = eager = _eager_forward(name, impl, attention_fn)

    def forward(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float | None = None,
        dropout: float = 0.0,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        if dropout:
            raise _refuse(name, f"attention dropout is not supported (got dropout={dropout}); call model.eval()")
        for unsupported in ("softcap", "s_aux", "sinks", "position_bias"):
            if kwargs.get(unsupported) is not None:
                raise _refuse(name, f"{unsupported} is not supported")
        is_causal = kwargs.get("is_causal")
        causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
        scale = None if scaling is None else float(scaling)
        if torch.compiler.is_compiling():
            return compiled_attention(op_name, query, key, value, attention_mask, causal, scale), None
        return eager(query, key, value, attention_mask, causal, scale), None

    forward.__name__ = forward.__qualname__ = f"ladder_attention_forward[{impl}]"
    return forward


def ladder_mask(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """The mask function registered with each ``ladder:`` name (see the module docstring): ``None``
    for the plain bottom-right causal mask over every key, else transformers' boolean mask."""
    from transformers.masking_utils import causal_mask_function, prepare_padding_mask, sdpa_mask

    if torch.compiler.is_compiling() or _capturing(kwargs.get("device")):
        # Checking the mask synchronises (and Dynamo cannot trace a branch on tensor values): the
        # attention function reads it inside the custom op, by its verified pattern while capturing.
        # Compiling is asked first: Dynamo cannot trace CUDA's "is this stream capturing?" (a graph break
        # that split a compiled decode step into several graphs, parts of it eager, on the GPU).
        kwargs.update(allow_is_causal_skip=False, allow_is_bidirectional_skip=False)
        return sdpa_mask(*args, **kwargs)
    q_length, kv_length = kwargs.get("q_length"), kwargs.get("kv_length")
    q_offset, kv_offset = kwargs.get("q_offset", 0), kwargs.get("kv_offset", 0)
    kv_seen = None  # the keys a plain causal mask lets the last query see: q_offset + q_length
    if (
        not args
        and isinstance(q_length, int)
        and isinstance(q_offset, int)
        and kv_offset == 0
        and isinstance(kv_length, int)
        and q_offset + q_length <= kv_length
        and kwargs.get("mask_function", causal_mask_function) is causal_mask_function
        and kwargs.get("local_size") is None
    ):
        padding = prepare_padding_mask(kwargs.get("attention_mask"), kv_length, kv_offset)
        if padding is None or bool(padding[:, : q_offset + q_length].all()):
            kv_seen = q_offset + q_length
        if kv_seen == kv_length:
            return None
    kwargs.update(allow_is_causal_skip=False, allow_is_bidirectional_skip=False)
    mask = sdpa_mask(*args, **kwargs)
    if kv_seen is not None and mask is not None and mask.ndim == 4:
        # A StaticCache's slots past the tokens written: key j is kept for query i exactly when j <= q_offset
        # + i, i.e. bottom-right causal over the first kv_seen keys of every sequence. Known from the
        # arguments, so neither this function nor the attention reads the mask (reading an 8k prompt's at
        # B=8 took 3.5 ms on an H200: docs/perf-log.md, fifth stop).
        _remember_verdict(mask, causal=True, every_key=False)
        return mask
    if mask is None or mask.ndim != 4:
        return mask
    seqlen_q, seqlen_k = mask.shape[-2:]
    keep = mask[:, 0]
    keys = torch.arange(seqlen_k, device=mask.device)
    rows = torch.arange(seqlen_q, device=mask.device)[:, None]
    if seqlen_q <= seqlen_k and bool((keep == (keys <= rows + seqlen_k - seqlen_q)).all()):
        return None
    return mask


def register_attention_implementations(impls: Sequence[str] | None = None) -> list[str]:
    """Register ``impls`` (default: every rung the registry can import, baselines excluded, then the
    stack names ``triton``, ``gluon``, ``cute`` and ``auto``) with transformers' ``AttentionInterface``
    and ``AttentionMaskInterface``; returns their ``ladder:`` names.

    Registration is global to the process and idempotent. An implementation that cannot run on this
    machine is registered anyway: calling it raises its capability reason. A name transformers would
    misread (containing "flash" or "sdpa") raises ValueError.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    if impls is None:
        impls = [*(implementation.name for implementation in discover(include_baselines=False)[0]), *DISPATCH_NAMES]
    names = []
    for impl in impls:
        name = implementation_name(impl)
        if "flash" in name or "sdpa" in name:
            raise ValueError(
                f"{impl!r} cannot be registered as {name!r}: transformers reads any name containing "
                "'flash' as a FlashAttention kernel and 'sdpa' as its SDPA path; use transformers' own "
                "'sdpa' / 'flash_attention_*' for the baselines"
            )
        AttentionInterface.register(name, make_attention_forward(impl))
        AttentionMaskInterface.register(name, ladder_mask)
        names.append(name)
    return names
