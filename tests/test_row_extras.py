"""What compare.py adds to a runner row: the rule's pass bound and the end-to-end timing (FP8 hook)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from common.contract.metrics import SDPA_RELATIVE_RULE, ErrorRule, ErrorStats
from common.contract.problem import Problem
from common.contract.reference import reference_attention
from common.measure.results import ResultRow
from common.measure.row_extras import complete_row, rel_l2_bound
from common.measure.runner import TimingOptions, Workload, blank_row, make_workload

PROBLEM = Problem(1, 2, 16, 16, 8, dtype=torch.float32)
OPTIONS = TimingOptions(1.0, 1.0)
CPU = torch.device("cpu")


@dataclasses.dataclass(frozen=True)
class _Rung:
    """The parts of an Implementation that the row extras read, with an optional end-to-end path."""

    name: str = "triton/fp8"
    error_rule: ErrorRule = SDPA_RELATIVE_RULE
    emulate: object = None
    prepare_end_to_end: object = None


def _exact(q, k, v, problem):
    return lambda: reference_attention(q, k, v, problem).to(q.dtype)


def _wrong_scale(q, k, v, problem):
    return lambda: reference_attention(q, k, v, problem.with_(softmax_scale=1.1 * problem.scale)).to(q.dtype)


def _measured_row(workload: Workload) -> ResultRow:
    row = blank_row("triton/fp8", "triton", "fp8", PROBLEM, "ok", "")
    row.rel_l2_err = 1e-7
    row.sdpa_rel_l2_err = workload.sdpa_error.rel_l2_err
    return row


@pytest.fixture(scope="module")
def workload() -> Workload:
    return make_workload(PROBLEM, "cpu")


def test_rung_without_an_end_to_end_path_keeps_nan(workload: Workload):
    row = complete_row(_measured_row(workload), _Rung(), workload, CPU, OPTIONS)
    assert math.isnan(row.ms_end_to_end) and math.isnan(row.tflops_end_to_end) and row.status == "ok"


def test_end_to_end_path_is_timed_and_checked(workload: Workload):
    row = complete_row(_measured_row(workload), _Rung(prepare_end_to_end=_exact), workload, CPU, OPTIONS)
    assert row.status == "ok" and row.ms_end_to_end > 0
    assert math.isclose(row.tflops_end_to_end, PROBLEM.flops / (row.ms_end_to_end * 1e-3) / 1e12)


def test_a_wrong_end_to_end_path_marks_the_row_wrong(workload: Workload):
    row = complete_row(_measured_row(workload), _Rung(prepare_end_to_end=_wrong_scale), workload, CPU, OPTIONS)
    assert row.status == "wrong" and "end-to-end path" in row.reason


def test_a_raising_end_to_end_path_marks_the_row_failed(workload: Workload):
    def raises(q, k, v, problem):
        raise RuntimeError("planted")

    row = complete_row(_measured_row(workload), _Rung(prepare_end_to_end=raises), workload, CPU, OPTIONS)
    assert row.status == "failed" and "planted" in row.reason


def test_pass_bound_follows_the_rule(workload: Workload):
    row = _measured_row(workload)
    row.sdpa_rel_l2_err = 2e-3
    assert math.isclose(rel_l2_bound(SDPA_RELATIVE_RULE, row), 2 * 2e-3 + SDPA_RELATIVE_RULE.atol)
    capped = ErrorRule(name="cap", sdpa_factor=None, max_rel_l2=3e-2)
    assert rel_l2_bound(capped, row) == 3e-2
    assert math.isclose(complete_row(row, _Rung(), workload, CPU, OPTIONS).rel_l2_bound, 4e-3 + 1e-4)


def test_bound_of_a_planted_error_matches_the_rules_verdict():
    """The bound drawn in the error plot is where the rule's verdict flips."""
    row = blank_row("triton/tiled", "triton", "tiled", PROBLEM, "ok", "")
    row.sdpa_rel_l2_err = 1e-3
    bound = rel_l2_bound(SDPA_RELATIVE_RULE, row)
    sdpa = ErrorStats(1.0, 0.0, 1e-3, 0)
    assert SDPA_RELATIVE_RULE.judge(ErrorStats(0.0, 0.0, 0.99 * bound, 0), sdpa)[0]
    assert not SDPA_RELATIVE_RULE.judge(ErrorStats(0.0, 0.0, 1.01 * bound, 0), sdpa)[0]
