"""bench.generate_trace on a CPU: a step's kernels as the difference of two traces, and the refusal
without a GPU."""

from __future__ import annotations

import collections

import pytest
import torch

from bench import generate_trace


def test_a_step_is_the_long_trace_minus_the_short_one_per_step() -> None:
    long = collections.Counter({"gemm": 170.0, "attention": 40.0, "embed": 5.0})
    short = collections.Counter({"gemm": 10.0, "embed": 5.0, "prefill_only": 3.0})
    step = generate_trace.per_step(long, short, steps=4)
    assert step == {"gemm": 40.0, "attention": 10.0, "prefill_only": -0.75}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_without_a_gpu_it_says_so_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        generate_trace.main([])
    assert exited.value.code == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
