"""The registry: every implementation behind one interface.

A rung module defines a module-level ``IMPLEMENTATION = Implementation(...)``. The registry imports
the modules listed in :data:`RUNG_MODULES` lazily; a module that cannot be imported (for example the
CuTe DSL is not installed) is reported as unavailable with the import error as the reason, never
silently dropped and never replaced by another implementation.

The contract of an implementation:

* ``supports(problem, device) -> (ok, reason)``: ``ok`` False means "skipped", and ``reason`` says why.
  A rung that does not implement one of the problem's features (GQA, the bottom-right causal
  alignment, per-sequence key lengths, returning the LSE) refuses it here through
  ``common.contract.capability.check_features``, which names the rung, the feature and the values.
* ``prepare(q, k, v, problem, *, cache_seqlens=None) -> run``: everything that is not the kernel
  (validation, choosing the configuration, autotuning, compilation, quantisation, layout changes,
  descriptors, allocation) happens here, untimed, ending with one warm-up launch on a GPU.
  q is (B, H, Sq, D); k and v are (B, Hkv, Sk, D) with ``Hkv = problem.kv_heads``. ``run()``
  launches the kernel(s) and returns O of shape (B, H, Sq, D) in the problem's dtype (bf16 for FP8
  rungs) or, when ``problem.return_lse``, the pair ``(O, lse)`` with ``lse`` a contiguous (B, H, Sq)
  fp32 tensor in natural-log units (-inf, and a zero row of O, where a row sees no key). Every call
  of ``run()`` writes into the same buffers.
* ``cache_seqlens`` (keyword-only): the (B,) int32 tensor of per-sequence key lengths on the inputs'
  device, passed exactly when ``problem.has_cache_seqlens`` (:func:`per_call_inputs` builds the
  keyword arguments; a rung whose ``supports`` refuses those problems need not take the keyword).
  It is an input like q, k and v: ``run()`` reads the tensor's current values at every launch,
  and a plan never depends on them.
* ``block_table`` (keyword-only): a paged KV cache (``problem.page_size`` > 0, always with
  ``cache_seqlens``): the (B, max_pages_per_seq) int32 page indices, passed exactly when the problem is
  paged, like ``cache_seqlens``; k and v are then page pools (num_pages, page_size, Hkv, D). A rung
  whose ``supports`` refuses paged problems (every rung that does not name
  ``common.contract.capability.PAGED_KV``) never receives it.
* ``bind(q, k, v, problem, *, cache_seqlens=None) -> run``: the per-call part of ``prepare`` alone,
  for tensors of a signature that ``prepare`` has already planned (validated, configured,
  compiled): it builds the operands, descriptors and output for these tensors and returns the same
  kind of ``run()``, with no validation beyond cheap checks, no warm-up launch and no autotuning
  (kernels come from the rung's compile cache or Triton's JIT cache). A rung's ``prepare`` is its
  validation, then ``bind``, then :func:`warmed_up`, so the two cannot drift. ``common.attention``
  calls ``prepare`` once per signature and ``bind`` on every later call (``common/contract/api.py``).
* ``plan_bind(problem, device) -> planned`` (optional): the part of ``bind`` that the problem, the device
  and the rung's module switches decide (split count, configuration), which ``bind(..., planned=planned)``
  takes instead of deciding again; ``common.attention`` makes it once per plan, so a plan hit (the other
  layers of a decode step) only allocates and launches.
* ``make_binder(problem, device, planned, ready) -> binder`` (optional): ``bind``'s work that the plan key
  decides, done once per plan; ``binder(q, k, v, cache_seqlens, block_table)`` then only allocates and
  returns the same ``run()`` as ``bind`` for tensors of that key (shapes, strides, dtypes, device and
  alignment as when planned; ``ready``: q, k and v were kernel-addressable, so are these). ``common.attention``
  calls it on every plan hit instead of ``bind``. A *growing binder* also has ``grown(problem, device)``: the
  binder of ``problem``, a longer cache of its family (a contiguous KV cache whose plan key differs only in Sk:
  ``common.contract.api.growing_cache_key``), which re-decides only what Sk enters and takes the rest from this
  binder; it must hold what ``make_binder`` makes for ``problem`` from scratch under the switches read when the
  family was planned (``tests/test_growing_path.py``). ``common.attention`` calls it at each step of a growing cache.
* ``check_reads_seqlen_k``: True (the default) unless ``supports`` (and the device check) answers alike
  for every Sk > Sq of a problem otherwise the same; ``tests/test_plan_cache.py`` holds each rung that
  says False to it.
* ``compile_sm90(problem) -> [KernelBinary]`` (optional): compile for sm_90a without a GPU, so the
  PTX and resource usage can be inspected on any machine.
* ``compile_input_transform_sm90(problem) -> [KernelBinary]`` (optional): the same for the kernels a
  rung launches on its inputs before its attention kernel (FP8: the fused quantiser). They are not
  the rung's kernel (the tradeoff table leaves them out), but ``supports`` must refuse what they
  cannot launch as it does for the kernel; the capability-matrix test compiles both.
* ``backward`` (optional): the :class:`Backward` rung that differentiates this forward, given the O
  and LSE it returned (``triton_impl/backward/``). ``common.attention`` runs it through autograd for
  inputs that require grad; an implementation without one refuses them.

A :class:`Backward` holds ``gradients(q, k, v, out, lse, d_out, problem, *, d_lse=None) -> (dq, dk,
dv)``: the gradients of the loss with respect to q (B, H, Sq, D), k and v (B, Hkv, Sk, D) in the
inputs' dtype, given the forward's O and natural-log LSE (B, H, Sq) and the loss's gradient with
respect to O (``d_out``) and, when the caller differentiates the returned LSE too, to the LSE
(``d_lse``). GQA: dK and dV of a KV head sum the contributions of every query head that reads it. Its
``supports(problem, device)`` refuses what it cannot differentiate, with a reason.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import torch

from common.contract.metrics import SDPA_RELATIVE_RULE, ErrorRule
from common.contract.problem import Problem
from common.toolchain.compile import KernelBinary

STACKS = ("triton", "gluon", "cute", "sdpa", "fa4", "flashinfer")
# Stacks of external kernels measured as references: their rows are named by backend, not by rung.
BASELINE_STACKS = ("sdpa", "fa4", "flashinfer")
RUNGS = ("naive", "online", "tiled", "pipelined", "hopper", "fp8")
# Rungs beside the prefill ladder, in Triton, Gluon and CuTe: ``decode`` (flash decoding, Sq <= 16
# against a KV cache). They are not ladder steps, so the ladder's tables (README, docs) leave them out.
DECODE_RUNGS = ("decode",)
KNOWN_RUNGS = (*RUNGS, *DECODE_RUNGS)
# Ladder order of the rung modules; the baselines (SDPA backends, FlashAttention-4, FlashInfer) come last.
# Gluon (Triton's explicit dialect, under triton_impl/) has only the Hopper rungs and decode.
GLUON_RUNGS = ("hopper", "fp8")
RUNG_MODULES = (
    *(f"triton_impl.{rung}" for rung in RUNGS),
    *(f"triton_impl.{rung}" for rung in DECODE_RUNGS),
    *(f"triton_impl.gluon.{rung}" for rung in GLUON_RUNGS),
    *(f"triton_impl.gluon.{rung}" for rung in DECODE_RUNGS),
    *(f"cute_impl.{rung}" for rung in RUNGS),
    *(f"cute_impl.{rung}" for rung in DECODE_RUNGS),
)
BASELINE_MODULES = ("common.measure.sdpa", "common.measure.fa4", "common.measure.flashinfer")

# run() returns O, or (O, lse) when problem.return_lse.
Runner = Callable[[], torch.Tensor | tuple[torch.Tensor, torch.Tensor]]
# (q, k, v, problem, *, cache_seqlens=None, block_table=None) -> run; each keyword only when the
# problem has the feature (per_call_inputs).
Prepare = Callable[..., Runner]
Bind = Callable[..., Runner]
Supports = Callable[[Problem, torch.device], tuple[bool, str]]
# (q, k, v, out, lse, d_out, problem, *, d_lse=None) -> (dq, dk, dv); see the module docstring.
Gradients = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
# One kernel launch of a backward rung: (kernel, grid, positional arguments, constexprs and launch options).
Launch = tuple[Any, tuple[int, ...], tuple[Any, ...], dict[str, Any]]


class DeviceChecked:
    """The capability check of a forward or backward rung (``name``, ``runs_on_cpu`` and ``supports``
    are its fields): shared so that both refuse a CPU device in the same words, before the rung's own check."""

    name: str
    runs_on_cpu: bool
    supports: Supports

    def check(self, problem: Problem, device: torch.device) -> tuple[bool, str]:
        """The capability check, with the device type checked first."""
        if device.type == "cpu" and not self.runs_on_cpu:
            return False, f"{self.name} needs a CUDA GPU (it has no CPU or interpreter path)"
        return self.supports(problem, device)


@dataclass(frozen=True)
class Backward(DeviceChecked):
    """A backward rung: the gradients of attention from the forward's O and LSE."""

    name: str
    gradients: Gradients
    supports: Supports
    # Its kernels compiled for sm_90a at a problem's shapes, without a GPU.
    compile_sm90: Callable[[Problem], list[KernelBinary]] | None = None
    # True when the Triton interpreter can run it on CPU tensors (TRITON_INTERPRET=1).
    runs_on_cpu: bool = False
    source_file: str | None = None


@dataclass(frozen=True)
class Implementation(DeviceChecked):
    name: str
    stack: str
    rung: str
    prepare: Prepare
    supports: Supports
    compile_sm90: Callable[[Problem], list[KernelBinary]] | None = None
    # The kernels run on the inputs before the rung's kernel (FP8: the fused quantiser), for sm_90a.
    compile_input_transform_sm90: Callable[[Problem], list[KernelBinary]] | None = None
    # The per-call part of prepare, for an already-prepared signature (see the module docstring).
    bind: Bind | None = None
    # FP8: the fp64 emulation of the rung's own quantisation, ``emulate(q, k, v, problem) ->
    # common.contract.fp8.Emulation``, which its error rule judges against (``common.contract.check.judge_output``).
    emulate: Callable[..., Any] | None = None
    # Rungs that transform their inputs in prepare (FP8): a prepare whose run() quantises, rotates and
    # launches in every call, timed end to end by ``common.measure.row_extras``.
    prepare_end_to_end: Prepare | None = None
    error_rule: ErrorRule = SDPA_RELATIVE_RULE
    # True when the Triton interpreter can run it on CPU tensors (TRITON_INTERPRET=1).
    runs_on_cpu: bool = False
    # Instruction families its PTX must contain / must not contain (checked by the tests).
    required_ptx: tuple[str, ...] = ()
    forbidden_ptx: tuple[str, ...] = ()
    source_file: str | None = None
    # The rung's default tile table (head dim, or (head dim, causal), -> configuration) as the
    # installed release resolves it; env.json records it (``common.toolchain.releases.triton_config_record``).
    default_configs: Mapping[Any, Any] | None = field(default=None, compare=False)
    notes: str = field(default="", compare=False)
    # The backward rung that differentiates this forward (see the module docstring); None: forward only.
    backward: Backward | None = field(default=None, compare=False)
    # What ``bind`` decides from the problem and the device alone (see the module docstring).
    plan_bind: Callable[[Problem, torch.device], Any] | None = field(default=None, compare=False)
    # ``bind`` split in two at the plan key: what the key decides once, the allocations per call (module docstring).
    make_binder: Callable[[Problem, torch.device, Any, bool], Callable[..., Runner]] | None = field(
        default=None, compare=False
    )
    # False where ``check`` gives one answer for every Sk > Sq of a problem otherwise the same (the decode
    # rungs): ``common.attention`` then checks a growing cache's family once, not at every step.
    check_reads_seqlen_k: bool = field(default=True, compare=False)

    def __post_init__(self) -> None:
        if self.stack not in STACKS:
            raise ValueError(f"stack must be one of {STACKS}, got {self.stack!r}")
        if self.stack not in BASELINE_STACKS and self.rung not in KNOWN_RUNGS:
            raise ValueError(f"rung must be one of {KNOWN_RUNGS}, got {self.rung!r}")

    @classmethod
    def named(cls, name: str, **fields: Any) -> Implementation:
        """The entry ``name`` ("stack/rung", e.g. "gluon/hopper") with its stack and rung read from the
        name, so the three cannot disagree; ``fields`` are the rest (``prepare``, ``supports``, ...)."""
        stack, rung = name.split("/")
        return cls(name=name, stack=stack, rung=rung, **fields)


@dataclass(frozen=True)
class Unavailable:
    """A rung module that could not be imported; compare.py reports it as skipped."""

    module: str
    reason: str

    @property
    def name(self) -> str:
        *packages, rung = self.module.split(".")
        return f"{packages[-1].removesuffix('_impl')}/{rung}"


def meta_operands(problem: Problem) -> tuple[torch.Tensor, ...]:
    """q, k, v, O, LSE and dO of ``problem`` as meta tensors (shapes and dtypes, no memory): what a
    backward rung's ``compile_sm90`` builds its launches from."""
    q_shape = (problem.batch, problem.heads, problem.seqlen_q, problem.head_dim)
    kv_shape = (problem.batch, problem.kv_heads, problem.seqlen_k, problem.head_dim)
    shapes = (q_shape, kv_shape, kv_shape, q_shape, q_shape)
    q, k, v, out, d_out = (torch.empty(shape, dtype=problem.dtype, device="meta") for shape in shapes)
    lse = torch.empty(q_shape[:3], dtype=torch.float32, device="meta")
    return q, k, v, out, lse, d_out


def per_call_inputs(
    problem: Problem, cache_seqlens: torch.Tensor | None, block_table: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """The keyword arguments of ``prepare`` and ``bind`` beyond q, k, v and the problem: ``cache_seqlens``
    exactly when the problem carries per-sequence lengths, ``block_table`` exactly when its cache is
    paged (see the module docstring)."""
    inputs = {}
    if problem.has_cache_seqlens:
        if cache_seqlens is None:
            raise ValueError(f"{problem.describe()} carries per-sequence key lengths, but cache_seqlens is None")
        inputs["cache_seqlens"] = cache_seqlens
    elif cache_seqlens is not None:
        raise ValueError("cache_seqlens was given for a problem without per-sequence lengths (has_cache_seqlens=False)")
    if problem.paged:
        if block_table is None:
            raise ValueError(f"{problem.describe()} reads a paged KV cache, but block_table is None")
        inputs["block_table"] = block_table
    elif block_table is not None:
        raise ValueError("block_table was given for a problem without a paged KV cache (page_size=0)")
    return inputs


def warmed_up(run: Runner, device: torch.device) -> Runner:
    """``run`` after one launch on a GPU, so that the first timed call finds the kernel compiled
    and loaded; under the Triton interpreter nothing is compiled and the launch is skipped."""
    if device.type == "cuda":
        run()
    return run


def _load(module_name: str) -> list[Implementation] | Unavailable:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name == module_name:
            return Unavailable(module_name, "not implemented yet")
        return Unavailable(module_name, f"import failed: {error}")
    except Exception as error:  # noqa: BLE001 - a rung that fails to import is reported, not fatal
        return Unavailable(module_name, f"import failed: {type(error).__name__}: {error}")
    found = getattr(module, "IMPLEMENTATIONS", None) or getattr(module, "IMPLEMENTATION", None)
    if found is None:
        return Unavailable(module_name, "module defines no IMPLEMENTATION")
    return list(found) if isinstance(found, (list, tuple)) else [found]


def _implementations(modules: tuple[str, ...]) -> tuple[list[Implementation], list[Unavailable]]:
    available: list[Implementation] = []
    missing: list[Unavailable] = []
    for module_name in modules:
        loaded = _load(module_name)
        if isinstance(loaded, Unavailable):
            missing.append(loaded)
        else:
            available.extend(loaded)
    return available, missing


def discover(include_baselines: bool = True) -> tuple[list[Implementation], list[Unavailable]]:
    """All implementations in ladder order, plus the rung modules that could not be loaded."""
    return _implementations(RUNG_MODULES + (BASELINE_MODULES if include_baselines else ()))


def with_backward() -> list[str]:
    """The names of the rungs that have a backward (``Implementation.backward``), in ladder order."""
    return [impl.name for impl in _implementations(RUNG_MODULES)[0] if impl.backward is not None]


@cache
def _by_name(modules: tuple[str, ...]) -> dict[str, Implementation | Unavailable]:
    """The implementations of ``modules`` by name, and each module that did not import (its
    :class:`Unavailable`, under the name it would have had), built once per process: walking the
    modules cost tens of µs, and ``common.attention`` looks a rung up at every decode step against a
    growing cache (each step plans anew). A module that failed to import is not retried."""
    available, missing = _implementations(modules)
    by_name: dict[str, Implementation | Unavailable] = {}
    for item in (*available, *missing):
        by_name.setdefault(item.name, item)
    return by_name


def lookup(name: str) -> Implementation | Unavailable | None:
    """The rung called ``name`` (no baselines), the reason its module did not import, or None."""
    return _by_name(RUNG_MODULES).get(name)


def get(name: str) -> Implementation:
    """The implementation called ``name``; an unknown name lists the valid ones.

    Only a baseline's name (``sdpa/...``, ``fa4/...``) loads the baseline modules, which live in
    ``common.measure``: a user's call of a rung (``common.attention``) imports no benchmark code."""
    baseline = name.partition("/")[0] in BASELINE_STACKS
    found = _by_name(BASELINE_MODULES if baseline else RUNG_MODULES).get(name)
    if isinstance(found, Implementation):
        return found
    valid = ", ".join(impl.name for impl in discover()[0])
    raise ValueError(f"unknown implementation {name!r}; valid names: {valid}")
