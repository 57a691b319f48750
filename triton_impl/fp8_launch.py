"""The host entry points the three stacks' FP8 rungs share: quantise with the fused quantiser, then
launch the stack's own kernel (``triton_impl/fp8.py``, ``triton_impl/gluon/fp8.py``, ``cute_impl/fp8.py``).

Each FP8 rung's ``bind``, ``prepare``, ``prepare_end_to_end`` and ``emulate`` do the same thing in the
same order; only four pieces are the rung's own, and an ``Fp8Entry`` takes exactly those:

* ``validate(q, k, v, problem, cache_seqlens)``: the rung's input checks, returning the checked problem;
* ``launch(q, k, problem, quantisation, *, cache_seqlens)``: the fused quantiser's buffers and the
  rung's kernel bound to them (a ``QuantisedLaunch``), nothing launched;
* ``kernel_order(problem)``: the key blocks the kernel visits and in which direction, which the fp64
  emulation repeats (the order of the rounding of P V sums);
* ``value_layout(problem)``: Vᵀ as the kernel reads it (key order, padding), which the emulation's
  operands take on;

and, optionally, ``launch_end_to_end`` (``launch``'s arguments): the launch ``prepare_end_to_end`` builds where it
differs from ``launch`` (cute/fp8's kernel launched by programmatic dependent launch, which only the quantiser may
precede).

``Fp8Entry.registry_fields`` gives the registry fields these make, for every FP8 rung's entry alike.
The quantised launch (``QuantisedLaunch``) and the per-call end-to-end runner live here too: they
are what every FP8 rung's ``prepare`` builds over the quantiser (``triton_impl/fp8_quantiser.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from common.contract.fp8 import Emulation, KernelOperands, KernelOrder, Quantisation, ValueLayout
from common.contract.fp8 import emulate as emulate_quantised
from common.contract.metrics import FP8_RULE
from common.contract.problem import Problem
from common.contract.registry import Runner, per_call_inputs, warmed_up
from common.toolchain.compile import KernelBinary
from triton_impl.fp8_quantiser import FusedQuantiser, quantise_for_kernel


class QuantisedLaunch:
    """An fp8 rung's prepared kernel over a ``FusedQuantiser``'s buffers: ``quantise(q, k, v)`` writes
    new operands into them (the fused launches), calling it launches the kernel over them and returns
    O (or (O, lse)). Attributes other than these (``config``, ``lse``, ``out``, ``operands``) are the
    kernel's, so a rung's tests read its launch as they read its kernel."""

    def __init__(self, quantiser: FusedQuantiser, kernel: Runner):
        self.quantiser = quantiser
        self.kernel = kernel
        self.variant = quantiser.quantisation.name

    def quantise(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> KernelOperands:
        return self.quantiser(q, k, v)

    def __call__(self) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return self.kernel()

    def __getattr__(self, name: str) -> object:
        # Only reached for names this class lacks; "kernel" itself is excluded so that a half-built
        # object cannot recurse.
        if name == "kernel":
            raise AttributeError(name)
        return getattr(self.kernel, name)


def end_to_end_runner(launch: QuantisedLaunch, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Runner:
    """The run() that a user of bf16 activations pays per call (compare.py's end-to-end column): the
    fused quantisation of q, k, v into ``launch``'s buffers, then the kernel; no allocation, no torch
    op between the launches. Launched once here on a GPU, so the first timed call finds both compiled."""

    def run() -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        launch.quantise(q, k, v)
        return launch()

    if q.is_cuda:
        run()
    run.variant = launch.variant
    return run


@dataclass(frozen=True)
class Fp8Entry:
    """An FP8 rung's ``bind``, ``prepare``, ``prepare_end_to_end`` and ``emulate`` from its four own
    pieces (module docstring). ``default_quantisation`` is what a call without ``quantisation`` runs."""

    validate: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Problem, torch.Tensor | None], Problem]
    launch: Callable[..., QuantisedLaunch]
    kernel_order: Callable[[Problem], KernelOrder]
    value_layout: Callable[[Problem], ValueLayout]
    default_quantisation: Quantisation
    # What ``prepare_end_to_end`` builds, where it differs from ``launch`` (same arguments): a kernel that may start
    # under the quantiser's tail (cute/fp8's programmatic dependent launch) only where the quantiser precedes it.
    launch_end_to_end: Callable[..., QuantisedLaunch] | None = None

    def registry_fields(self, compile_quantiser_sm90: Callable[[Problem], list[KernelBinary]]) -> dict[str, Any]:
        """The FP8 part of the rung's registry entry: ``prepare``, ``bind``, ``prepare_end_to_end``, the
        fp64 ``emulate`` that ``FP8_RULE`` judges against, and the fused quantiser's sm_90a compile path
        as the input transform."""
        return {
            "prepare": self.prepare, "bind": self.bind, "prepare_end_to_end": self.prepare_end_to_end,
            "emulate": self.emulate, "error_rule": FP8_RULE, "compile_input_transform_sm90": compile_quantiser_sm90,
        }  # fmt: skip

    def _quantisation(self, quantisation: Quantisation | None) -> Quantisation:
        return self.default_quantisation if quantisation is None else quantisation

    def bind(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem,
        quantisation: Quantisation | None = None, *, cache_seqlens: torch.Tensor | None = None,
    ) -> QuantisedLaunch:  # fmt: skip
        """Per call (the values change): new buffers, the fused quantisation of validated q, k, v into
        them (one launch with block scales), the kernel bound to them; run() launches the kernel alone
        and returns (O, lse) when ``problem.return_lse``, else O."""
        prepared = self.launch(q, k, problem, self._quantisation(quantisation), cache_seqlens=cache_seqlens)
        prepared.quantise(q, k, v)
        return prepared

    def prepare(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem,
        quantisation: Quantisation | None = None, *, cache_seqlens: torch.Tensor | None = None,
    ) -> Runner:  # fmt: skip
        """Validate, quantise (``quantisation``: ``common.contract.fp8.VARIANTS``), bind, warm up; run() is
        the kernel."""
        checked = self.validate(q, k, v, problem, cache_seqlens)
        bound = self.bind(q, k, v, checked, quantisation, **per_call_inputs(checked, cache_seqlens))
        return warmed_up(bound, q.device)

    def prepare_end_to_end(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem,
        quantisation: Quantisation | None = None, *, cache_seqlens: torch.Tensor | None = None,
    ) -> Runner:  # fmt: skip
        """Like ``prepare``, but every run() runs the fused quantiser and then the kernel: fp8's per-call
        cost."""
        checked = self.validate(q, k, v, problem, cache_seqlens)
        launch = self.launch_end_to_end or self.launch
        prepared = launch(q, k, checked, self._quantisation(quantisation), **per_call_inputs(checked, cache_seqlens))
        return end_to_end_runner(prepared, q, k, v)

    def emulate(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem,
        quantisation: Quantisation | None = None, *, cache_seqlens: torch.Tensor | None = None,
    ) -> Emulation:  # fmt: skip
        """The fp64 emulation the rung is judged against: the operands its kernel reads (the fused
        quantiser's on CUDA; K and V per KV head), key blocks visited in the kernel's order, the
        problem's mask and key lengths; its LSE (with a bound) judges the kernel's."""
        layout = self.value_layout(problem)
        operands = quantise_for_kernel(q, k, v, self._quantisation(quantisation), layout).as_quantised()
        return emulate_quantised(operands, problem, self.kernel_order(problem), cache_seqlens=cache_seqlens)
