"""What compare.py adds to a runner's row: the pass bound of the rung's error rule, and the
end-to-end timing of rungs whose ``prepare`` transforms the inputs (FP8: quantisation, rotation).

The bound (``rel_l2_bound``) is what the error plot draws per rung: the rel-L2 error the rule lets
the row reach. The harness times ``run()`` with the input transformation done once, untimed, in ``prepare``: the
kernel's own speed. A user who calls the rung on fresh bf16 tensors pays for the transformation on
every call. A rung that has such a path exposes ``prepare_end_to_end(q, k, v, problem) -> run`` on
its :class:`~common.contract.registry.Implementation`, where ``run()`` quantises, rotates and launches in one
call; this module times it into ``ms_end_to_end``/``tflops_end_to_end`` and checks its output with
the rung's own rule. Rows of rungs without the hook keep NaN there, shown as "—" with
:data:`NO_END_TO_END`.
"""

from __future__ import annotations

import torch

from common.contract.metrics import ErrorRule
from common.measure.results import MEASURED_STATUSES, ResultRow
from common.measure.runner import TimingOptions, Workload, judge_on_workload
from common.measure.timing import Timing, tflops, time_cuda, time_host

HOOK = "prepare_end_to_end"
NO_END_TO_END = "— where a rung has no per-call input transformation to time (no prepare_end_to_end)"


def end_to_end_path(impl: object):
    """The rung's end-to-end prepare, or None (the registry field may not exist on older registries)."""
    return getattr(impl, HOOK, None)


def _timed(run, device: torch.device, options: TimingOptions) -> Timing:
    if device.type == "cuda":
        return time_cuda(run, warmup_ms=options.warmup_ms, rep_ms=options.rep_ms, cuda_graph=options.cuda_graph)
    return time_host(run)


def add_end_to_end(
    row: ResultRow, impl: object, workload: Workload, device: torch.device, options: TimingOptions
) -> ResultRow:
    """Fill the end-to-end columns of a measured row in place; a wrong or failing path marks the row."""
    prepare = end_to_end_path(impl)
    if prepare is None or row.status not in MEASURED_STATUSES:
        return row
    try:
        _measure_end_to_end(row, impl, prepare, workload, device, options)
    except Exception as error:  # noqa: BLE001 - like the runner: a failure is a result, never a crash
        row.status = "failed"
        row.reason = "; ".join(filter(None, [row.reason, f"end-to-end path raised {type(error).__name__}: {error}"]))
    return row


def _measure_end_to_end(row, impl, prepare, workload: Workload, device: torch.device, options: TimingOptions) -> None:
    problem = workload.problem
    run = prepare(workload.q, workload.k, workload.v, problem)
    ok, reason, _ = judge_on_workload(impl, run, workload)
    if not ok:
        row.status = "wrong"
        row.reason = "; ".join(filter(None, [row.reason, f"end-to-end path: {reason}"]))
    timing = _timed(run, device, options)
    row.ms_end_to_end = timing.ms
    row.tflops_end_to_end = tflops(problem.flops, timing.ms)


def rel_l2_bound(rule: ErrorRule, row: ResultRow) -> float:
    """The largest rel-L2 error ``rule`` passes on this row; NaN where the row lacks the yardstick.

    An emulation rule (FP8) needs the emulation's own error in ``row.emulation_rel_l2_err``.
    """
    return rule.rel_l2_limit(row.sdpa_rel_l2_err, row.emulation_rel_l2_err)


def complete_row(
    row: ResultRow, impl: object, workload: Workload, device: torch.device, options: TimingOptions
) -> ResultRow:
    """The rule's bound and, for rungs with an end-to-end path, its timing."""
    if row.status in MEASURED_STATUSES:
        row.rel_l2_bound = rel_l2_bound(impl.error_rule, row)
    return add_end_to_end(row, impl, workload, device, options)
