"""The one-call entry point for users who just want the output, with a plan cache behind it.

``attention(q, k, v)`` does the expensive work once per problem signature: on the first call of a
signature it validates the tensors in full, runs the implementation's capability check and its
``prepare`` (choose the configuration, compile, warm up), and keeps a *plan*: the implementation and
the validated :class:`Problem`. Every later call with tensors of the same signature only computes
the key, then ``bind``-s the new tensors and launches (no validation beyond the key, no warm-up, no
autotuning), so a call costs about what the prepared launch costs.

``impl`` names a rung (``"triton/pipelined"``) or a stack (``"triton"``, ``"gluon"``, ``"cute"``, or
``"auto"`` for the fastest stack this machine runs): a stack name chooses its rung per signature, the
decode rung for a few query tokens against a longer cache, else the fastest prefill rung that accepts
the problem (``common/contract/dispatch.py``). The choice is made with the plan and kept in it.

The key holds everything a plan depends on: the implementation (or stack) name, shapes, dtypes,
strides and 16-byte alignment of q, k and v (so the number of KV heads), their devices, ``causal``, ``softmax_scale``,
``causal_alignment``, ``return_lse``, whether the call is differentiable, whether ``cache_seqlens`` and
``block_table`` are given and their signatures (shape, stride, dtype, device; never their values), and the
Triton and CuTe DSL versions.
A paged cache's page size is k's dim 1, so it is in the key with k's shape.

``cache_seqlens`` is an input, not part of the plan: its values are checked (in [0, Sk], one device
synchronisation) when a signature is planned; later calls check only its signature through the key,
and the kernels clamp each length to [0, Sk], so a bad value cannot read out of bounds.
``block_table`` (a paged KV cache) is an input too; its values, the page indices a call reads, are checked with
``cache_seqlens``' (in [0, num_pages), the same synchronisation) when a signature is planned; later calls are not
checked (that would synchronise every call): an index outside the pools there is the caller's contract, as in
FlashAttention's ``flash_attn_with_kvcache``.

A decode step against a growing cache (transformers' DynamicCache: K and V are whole contiguous
(B, Hkv, Sk, D) tensors one key longer at every step) is a new signature at every step. Where a plan of
the same signature *less Sk* (:func:`growing_cache_key`) was made (the last one is kept), the key proves everything
validation checks but what reads Sk, so only that is checked again (v as long as k, the values of
``cache_seqlens``; ``validation.validate_longer_cache``); the capability check (or the dispatch) runs
on the new problem in full, unless it answers alike for every Sk (``Implementation.check_reads_seqlen_k``
False: the decode rungs; for a stack name, every candidate the dispatch tried) and the call is not
differentiable: then the growing key proves all of its inputs, and the earlier plan's rung is taken
as it is. Where that earlier plan has the same rung, the new one only binds: the rung
compiled and warmed up for the earlier length, and its kernels take Sk as an argument, so ``prepare``'s
warm-up launch (a second kernel launch per step) and its rung-level set-up are skipped. Where the earlier
plan's binder has ``grown`` (the decode rungs; the registry's growing binder), the new plan's binder is
its ``grown(problem, device)``: the rung re-decides only what Sk enters (the split rule, the
balanced split's applicability and shares, the short-cache tile) and takes everything else from the
earlier binder, so a growing step costs about a hit plus the split rule. Those binders keep the module
switches read when the family was planned: ``clear_plan_cache()`` after changing one, as for any plan.

A rung with ``plan_bind`` (cute/decode) has its split count and configuration decided once per plan, not
at every bind: its module switches (``BALANCED_SPLIT``, the tile table, ...) are read when a signature
is planned, so ``clear_plan_cache()`` after changing one.

The hit path: a rung with ``make_binder`` (the decode rungs) has its ``bind`` split at the plan key. The plan
keeps a *binder*, made with the plan, holding everything the key decides (split count, grid, constexprs,
size arguments, the compiled kernel, whether q, k and v are kernel-addressable, which reads only strides,
dtype and base alignment); a later call of the key is the key, one lookup and the binder, which allocates
this call's O, LSE and split workspace (never a previous call's: results must not alias) and binds the
tensors. Everything the binder skips is proven by the key: a call whose strides, dtype, device or
alignment differ has another key and plans again.

The cache keeps the :data:`PLAN_CACHE_SIZE` most recently used plans; ``clear_plan_cache()`` empties
it and ``plan_cache_info()`` reports hits, misses and size. Plans hold no tensors: memory belongs to
the caller and to each rung's own compile cache.

Training: when q, k or v requires grad under grad mode, the call is differentiable through the
implementation's backward rung (``Implementation.backward``; ``common/contract/autograd.py``): the
plan is made for a forward that returns the LSE, and both capability checks, the forward's and the
backward's, run when it is made. Whether a call is differentiable is part of the key, so a grad plan
and a no-grad plan of the same tensors are two plans. An implementation without a backward raises
``NotImplementedError`` naming those that have one: nothing falls back to another implementation.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from typing import NamedTuple

import torch

from common.contract import dispatch
from common.contract.autograd import AttentionFunction, detached, requires_grad
from common.contract.problem import Problem
from common.contract.registry import Implementation, Runner, get, per_call_inputs, with_backward
from common.contract.validation import (
    OPERAND_ALIGNMENT_BYTES,
    is_kernel_addressable,
    validate_attention_inputs,
    validate_longer_cache,
)

DEFAULT_IMPL = "triton/pipelined"
# Plans kept before the least recently used one is dropped: a plan is a few hundred bytes, and a
# model calls attention with a handful of signatures (one per layer shape and sequence bucket).
PLAN_CACHE_SIZE = 256
API_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
API_DEVICE_TYPES = ("cuda", "cpu")
_SCALE_TYPES = (type(None), float, int)


@dataclass(frozen=True)
class Plan:
    """What one signature needs at every call: the implementation and its validated problem;
    ``for_every_seqlen_k``: the capability check (or the dispatch) that chose it answers alike for
    every Sk > Sq of the problem (``Implementation.check_reads_seqlen_k``), and the call was not
    differentiable, so a longer cache of its growing key needs no check of its own."""

    implementation: Implementation
    problem: Problem
    for_every_seqlen_k: bool = False
    # The rung's ``plan_bind(problem, device)``, which each bind of this plan takes (None: it has none, or the
    # binder was grown from its family's and holds its own).
    planned: object = None
    # The rung's ``make_binder(problem, device, planned, ready)``: its bind less what the plan key decides,
    # which every bind of this plan calls instead (None: the rung has none; ``_bind`` calls its ``bind``).
    binder: Callable[..., Runner] | None = None


@dataclass(frozen=True)
class PlanCacheInfo:
    hits: int
    misses: int
    size: int
    max_size: int


class PlanCache:
    """A thread-safe LRU map from signature keys to plans, with hit and miss counts."""

    def __init__(self, max_size: int = PLAN_CACHE_SIZE) -> None:
        if max_size < 1:
            raise ValueError(f"max_size must be >= 1, got {max_size}")
        self.max_size = max_size
        self._plans: OrderedDict[tuple, Plan] = OrderedDict()
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0

    def get(self, key: tuple) -> Plan | None:
        with self._lock:
            plan = self._plans.get(key)
            if plan is None:
                self._misses += 1
                return None
            self._plans.move_to_end(key)
            self._hits += 1
            return plan

    def put(self, key: tuple, plan: Plan) -> None:
        with self._lock:
            self._plans[key] = plan
            self._plans.move_to_end(key)
            while len(self._plans) > self.max_size:
                self._plans.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()
            self._hits = self._misses = 0

    def info(self) -> PlanCacheInfo:
        with self._lock:
            return PlanCacheInfo(self._hits, self._misses, len(self._plans), self.max_size)


_PLANS = PlanCache()
# growing_cache_key -> the last plan made under it (see the module docstring).
_GROWING = PlanCache()


def clear_plan_cache() -> None:
    """Forget every plan (and the hit/miss counts); the next call of each signature prepares again."""
    _PLANS.clear()
    _GROWING.clear()


def plan_cache_info() -> PlanCacheInfo:
    """Hits, misses, plans held and the bound of ``attention``'s plan cache."""
    return _PLANS.info()


@cache
def toolchain_versions() -> tuple[str | None, str | None]:
    """Triton and CuTe DSL versions (distribution metadata, read once): part of every plan key."""

    def version(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    return version("triton"), version("nvidia-cutlass-dsl")


def _tensor_signature(t: torch.Tensor) -> tuple:
    # A misaligned tensor is copied by kernel_operand in bind; alignment is part of the signature so
    # that the plan (and its validated problem) is keyed on the same layout class it was made for.
    return (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % OPERAND_ALIGNMENT_BYTES == 0)


def _without_seqlen(t: torch.Tensor) -> tuple:
    """:func:`_tensor_signature` of a contiguous (B, Hkv, Sk, D) cache less Sk (its strides follow from the shape)."""
    shape = t.shape
    return (shape[0], shape[1], shape[3], t.dtype, t.device, t.data_ptr() % OPERAND_ALIGNMENT_BYTES == 0)


class Options(NamedTuple):
    """The keyword arguments of ``attention`` beyond the tensors and ``impl``, and ``differentiable``:
    whether autograd must see the call (q, k or v requires grad under grad mode). A named tuple: made
    at every call, in a third of a frozen dataclass's time."""

    causal: object = False
    softmax_scale: object = None
    causal_alignment: object = "top_left"
    cache_seqlens: object = None
    return_lse: object = False
    block_table: object = None
    differentiable: bool = False


def _index_signature(index: torch.Tensor | None) -> tuple | None:
    """Signature of an int32 per-call input (``cache_seqlens``, ``block_table``): never its values."""
    if index is None:
        return None
    return (tuple(index.shape), index.stride(), index.dtype, index.device)


def _options_signature(options: Options) -> tuple:
    return (
        options.causal,
        options.softmax_scale,
        options.causal_alignment,
        options.return_lse,
        options.differentiable,
        _index_signature(options.cache_seqlens),
        _index_signature(options.block_table),
        toolchain_versions(),
    )


def plan_key(impl: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: Options) -> tuple:
    """Everything a plan depends on (see the module docstring)."""
    return _plan_key(impl, _tensor_signature(q), k, v, _options_signature(options))


def _plan_key(impl: str, q_signature: tuple, k: torch.Tensor, v: torch.Tensor, options_signature: tuple) -> tuple:
    return (impl, q_signature, _tensor_signature(k), _tensor_signature(v), *options_signature)


def growing_cache_key(impl: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: Options) -> tuple | None:
    """:func:`plan_key` less Sk for a decode step (at most ``DECODE_MAX_SEQLEN_Q`` query tokens against
    a longer cache) whose K and V are whole contiguous 4-D tensors, whose strides then follow from the
    shape; None for any other call (a paged cache, views into a larger cache, prefill), which keeps its
    full key only."""
    return _growing_key(impl, q, _tensor_signature(q), k, v, options, _options_signature(options))


def _growing_key(
    impl: str, q: torch.Tensor, q_signature: tuple, k: torch.Tensor, v: torch.Tensor, options: Options,
    options_signature: tuple,
) -> tuple | None:  # fmt: skip
    if options.block_table is not None or q.dim() != 4 or q.shape[2] > dispatch.DECODE_MAX_SEQLEN_Q:
        return None
    if k.dim() != 4 or v.dim() != 4 or not (k.is_contiguous() and v.is_contiguous()) or k.shape[2] <= q.shape[2]:
        return None
    return (impl, q_signature, _without_seqlen(k), _without_seqlen(v), *options_signature)


def _cacheable(impl: object, q: object, k: object, v: object, options: Options) -> bool:
    """Arguments of the types a plan is keyed on; anything else takes the full path every call, so
    that ``causal=1`` or ``softmax_scale=True`` never hit a plan validated for a bool and a float."""
    # Spelled out rather than all() over generators: it runs at every call, and each generator costs.
    return (
        type(impl) is str
        and type(options.causal) is bool
        and type(options.return_lse) is bool
        and type(options.causal_alignment) is str
        and type(options.softmax_scale) in _SCALE_TYPES
        and (options.cache_seqlens is None or isinstance(options.cache_seqlens, torch.Tensor))
        and (options.block_table is None or isinstance(options.block_table, torch.Tensor))
        and isinstance(q, torch.Tensor)
        and isinstance(k, torch.Tensor)
        and isinstance(v, torch.Tensor)
    )


def _check_backward(implementation: Implementation, problem: Problem, device: torch.device) -> None:
    """A differentiable call needs a backward rung that accepts the problem; no fallback to another."""
    if implementation.backward is None:
        raise NotImplementedError(
            f"{implementation.name} is forward-only (it has no backward pass), but q, k or v requires grad; "
            f"implementations with a backward: {', '.join(with_backward())}; or call it under torch.no_grad() "
            "or torch.inference_mode(), or pass detached tensors"
        )
    ok, reason = implementation.backward.check(problem, device)
    if not ok:
        raise ValueError(f"{implementation.backward.name} cannot differentiate {problem.describe()}: {reason}")


def _registered(impl: object) -> Implementation:
    """The registry's implementation ``impl``; an unknown name lists the rungs and the stack names."""
    try:
        return get(impl)
    except ValueError as error:
        raise ValueError(
            f"{error}; or a stack name, which picks the rung per call: {', '.join(dispatch.DISPATCH_NAMES)}"
        ) from None


def _make_plan(
    impl: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: Options, growing: tuple | None = None
) -> tuple[Plan, Runner]:
    """Validation (in full, or only of what reads Sk where the ``growing`` cache key has a plan), the
    rung (``impl`` itself, or the one a stack name dispatches to), its capability check (and its
    backward's, for a differentiable call) and ``prepare`` (only ``bind`` where the ``growing`` cache
    key has a plan of this rung); returns the plan and this call's launch."""
    earlier = None if growing is None else _GROWING.get(growing)
    if earlier is not None:
        # The growing key proves every check but those that read Sk (validate_longer_cache).
        problem = validate_longer_cache(earlier.problem, k, v, options.cache_seqlens)
        if earlier.for_every_seqlen_k and earlier.implementation.bind is not None:
            # ... and every input of the capability check (or dispatch) but Sk, which that check ignores.
            plan = _plan(earlier.implementation, problem, True, q, k, v, earlier.binder)
            # The next step grows from this plan's binder, whose decisions are its length's.
            _GROWING.put(growing, plan)
            return plan, _bind(plan, q, k, v, options)
    else:
        problem = validate_attention_inputs(
            q,
            k,
            v,
            causal=options.causal,
            softmax_scale=options.softmax_scale,
            causal_alignment=options.causal_alignment,
            cache_seqlens=options.cache_seqlens,
            # The backward recomputes P from the LSE, so a differentiable forward always returns it.
            return_lse=options.return_lse or options.differentiable,
            block_table=options.block_table,
            allow_gqa=True,
            dtypes=API_DTYPES,
            device_types=API_DEVICE_TYPES,
        )
    if impl in dispatch.DISPATCH_NAMES:
        choice = dispatch.resolve_choice(impl, problem, q.device)
        implementation, for_every_seqlen_k = choice.implementation, choice.same_for_every_seqlen_k
    else:
        implementation = _registered(impl)
        ok, reason = implementation.check(problem, q.device)
        if not ok:
            raise ValueError(f"{impl} cannot run {problem.describe()}: {reason}")
        for_every_seqlen_k = not implementation.check_reads_seqlen_k
    if options.differentiable:
        _check_backward(implementation, problem, q.device)
    same_rung = earlier is not None and earlier.implementation is implementation
    family = earlier.binder if same_rung else None
    plan = _plan(implementation, problem, for_every_seqlen_k and not options.differentiable, q, k, v, family)
    if same_rung and implementation.bind is not None:
        run = _bind(plan, q, k, v, options)
    else:
        extra = per_call_inputs(problem, options.cache_seqlens, options.block_table)
        run = implementation.prepare(q, k, v, problem, **extra)
    if growing is not None:
        _GROWING.put(growing, plan)
    return plan, run


def _plan(
    implementation: Implementation, problem: Problem, for_every_seqlen_k: bool, q: torch.Tensor, k: torch.Tensor,
    v: torch.Tensor, family: Callable[..., Runner] | None = None,
) -> Plan:  # fmt: skip
    """The plan of a checked problem made for q, k, v, with the rung's ``plan_bind`` and ``make_binder``
    made once for all its binds; ``family``: the binder of this rung's plan of a shorter cache under the
    same growing key, whose ``grown`` (where it has one) makes this plan's binder from its own decisions."""
    device = q.device
    grown = getattr(family, "grown", None)
    if grown is not None:
        # The growing key holds what addressability reads (dtype, 16-byte alignment of the base; the strides
        # of a contiguous cache follow from its shape), so the family's binder knows it; it holds its own
        # decisions (plan_bind's too), so the plan keeps none.
        return Plan(implementation, problem, for_every_seqlen_k, None, grown(problem, device))
    planned = None if implementation.plan_bind is None else implementation.plan_bind(problem, device)
    binder = None
    # A rung without bind re-prepares at every call (_bind), binder or not.
    if implementation.make_binder is not None and implementation.bind is not None:
        # Addressability reads only what the plan key holds (strides, dtype, 16-byte alignment of the
        # base), so every later call of this plan's key answers as these tensors do.
        ready = is_kernel_addressable(q) and is_kernel_addressable(k) and is_kernel_addressable(v)
        binder = implementation.make_binder(problem, device, planned, ready)
    return Plan(implementation, problem, for_every_seqlen_k, planned, binder)


def _bind(plan: Plan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: Options) -> Runner:
    """The launch of an already-planned signature: the plan's binder, else the rung's ``bind`` (no
    validation, no warm-up)."""
    if plan.binder is not None:
        # The plan key holds whether cache_seqlens and block_table are given, so it proves what
        # per_call_inputs checks: they are given exactly as the plan's problem states.
        return plan.binder(q, k, v, options.cache_seqlens, options.block_table)
    extra = per_call_inputs(plan.problem, options.cache_seqlens, options.block_table)
    bind = plan.implementation.bind
    if bind is None:
        # A rung without bind yet: correct, but every call pays its prepare (and warm-up).
        return plan.implementation.prepare(q, k, v, plan.problem, **extra)
    if plan.planned is not None:
        extra["planned"] = plan.planned
    return bind(q, k, v, plan.problem, **extra)


def autocast_operands(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k and v in autocast's dtype where autocast is on for their device, else unchanged.

    SDPA is on autocast's lower-precision list, so a model whose projections or rotary embedding
    hand it fp32 tensors under ``torch.autocast(dtype=bf16)`` attends in bf16; ``attention`` does the
    same, so that a model trained under autocast runs the same kernels with either. The cast is
    differentiable: gradients reach the fp32 tensors in fp32. Like autocast, fp64 is left alone.
    """
    # Anything but a tensor, or a tensor on a device the API does not run (which autocast may not know:
    # "meta" raises there), goes on unchanged to validation, which names it.
    if not isinstance(q, torch.Tensor):
        return q, k, v
    device_type = q.device.type
    if device_type not in API_DEVICE_TYPES or not torch.is_autocast_enabled(device_type):
        return q, k, v
    dtype = torch.get_autocast_dtype(device_type)

    def cast(t: torch.Tensor) -> torch.Tensor:
        castable = isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
        return t.to(dtype) if castable else t

    return cast(q), cast(k), cast(v)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    impl: str = DEFAULT_IMPL,
    causal_alignment: str = "top_left",
    cache_seqlens: torch.Tensor | None = None,
    return_lse: bool = False,
    block_table: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention output O (B, H, Sq, D) of q (B, H, Sq, D), k and v (B, Hkv, Sk, D) by ``impl``.

    ``impl``: a rung (``"cute/hopper"``; ``compare.py --list`` names them) or a stack name (``"triton"``,
    ``"gluon"``, ``"cute"``, ``"auto"``) that picks the stack's decode rung for Sq <= 16 against a
    longer cache and its fastest prefill rung otherwise (``common.contract.dispatch``).

    Hkv (a divisor of H; 1 is MQA) gives GQA: query head h reads KV head h // (H // Hkv).
    ``causal_alignment``: "top_left" (SDPA's is_causal: row i sees keys j <= i) or "bottom_right"
    (KV caches: j <= i + Sk - Sq). ``cache_seqlens``: optional (B,) int32 on the inputs' device, each
    sequence's valid key length in a padded cache; keys past it are masked and the bottom-right
    alignment uses it. ``return_lse=True`` returns ``(O, lse)``, lse (B, H, Sq) fp32 in natural-log
    units, -inf for a row that sees no key (whose output row is 0).

    Under ``torch.autocast`` for the inputs' device, q, k and v are cast to its dtype first, as SDPA's
    are (:func:`autocast_operands`).

    Inputs that require grad (under grad mode) make the call differentiable through the implementation's
    backward rung (``common.contract.registry.with_backward()`` names the rungs that have one; see the
    module docstring); the returned LSE is then differentiable too.

    ``block_table``: a paged KV cache (FlashAttention's ``flash_attn_with_kvcache`` layout, FlashInfer's
    "NHD"): a (B, max_pages_per_seq) int32 tensor on the inputs' device, with k and v page pools
    (num_pages, page_size, Hkv, D), page_size in [16, 256]. Sequence b's key j lives in page
    ``block_table[b, j // page_size]``, slot ``j % page_size``; Sk = max_pages_per_seq · page_size.
    ``cache_seqlens`` is then required. Only the entries of pages holding keys below a sequence's
    length are read; each must lie in [0, num_pages). The first call of a signature checks them (ValueError);
    later calls do not (the caller's contract, as in FlashAttention; checking would synchronise every call).

    The first call of a signature prepares a plan (validates, compiles, warms up); later calls with
    new tensors of the same signature bind and launch only. Raises ValueError for an unknown
    ``impl`` (listing the valid names) or a problem the implementation cannot run (with its reason;
    for a stack name, every candidate rung's reason),
    NotImplementedError for tensors that require grad when the implementation has no backward,
    ValueError when its backward cannot differentiate the problem, and TypeError/ValueError for bad tensors.
    """
    q, k, v = autocast_operands(q, k, v)
    differentiable = requires_grad(q, k, v)
    options = Options(causal, softmax_scale, causal_alignment, cache_seqlens, return_lse, block_table, differentiable)
    # A differentiable call's rung reads detached tensors; autograd sees q, k, v through AttentionFunction.
    operands = detached(q, k, v) if differentiable else (q, k, v)
    if not _cacheable(impl, q, k, v, options):
        plan, run = _make_plan(impl, *operands, options)
    else:
        # Both keys from one signature of q and of the options: a growing cache computes both per step.
        q_signature, options_signature = _tensor_signature(q), _options_signature(options)
        key = _plan_key(impl, q_signature, k, v, options_signature)
        plan = _PLANS.get(key)
        if plan is None:
            growing = _growing_key(impl, q, q_signature, k, v, options, options_signature)
            plan, run = _make_plan(impl, *operands, options, growing)
            _PLANS.put(key, plan)
        else:
            run = _bind(plan, *operands, options)
    if not differentiable:
        return run()
    return AttentionFunction.apply(q, k, v, run, plan.implementation.backward, plan.problem, return_lse)
