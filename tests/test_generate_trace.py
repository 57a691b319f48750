"""bench.generate_trace on a CPU: a step's kernels as the difference of two traces, and the refusal
without a GPU."""

from __future__ import annotations

import collections

from bench import generate_trace


def test_a_step_is_the_long_trace_minus_the_short_one_per_step() -> None:
    long = collections.Counter({"gemm": 170.0, "attention": 40.0, "embed": 5.0})
    short = collections.Counter({"gemm": 10.0, "embed": 5.0, "prefill_only": 3.0})
    step = generate_trace.per_step(long, short, steps=4)
    assert step == {"gemm": 40.0, "attention": 10.0, "prefill_only": -0.75}
