"""How the fuzzers (``common.tools.fuzz`` on the GPU, ``tests/test_fuzz_cpu.py`` under the interpreter) fit a drawn
problem to a rung: a decode rung gets a decode-sized Sq, a rung without paging the same problem on a contiguous cache,
and half the draws are paged. Each rule's planted break fails here."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.contract.dispatch import DECODE_MAX_SEQLEN_Q
from common.contract.problem import Problem
from common.contract.registry import discover
from common.tools import fuzz

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parent.parent
AVAILABLE = {impl.name: impl for impl in discover(include_baselines=False)[0]}
# A prefill-sized draw with every feature and pages of 32: what a seed may hand any rung.
DRAWN = Problem(
    batch=2, heads=4, seqlen_q=100, seqlen_k=224, head_dim=64, dtype=torch.float16, kv_heads=2, causal=True,
    causal_alignment="bottom_right", has_cache_seqlens=True, return_lse=True, page_size=32,
)  # fmt: skip


def test_a_decode_rung_gets_the_draw_with_its_sq_folded_and_its_pages_kept() -> None:
    problem = fuzz.fitted(AVAILABLE["triton/decode"], DRAWN, CPU)
    assert problem == DRAWN.with_(seqlen_q=1 + (DRAWN.seqlen_q - 1) % DECODE_MAX_SEQLEN_Q)
    assert 1 <= problem.seqlen_q <= DECODE_MAX_SEQLEN_Q and problem.paged


def test_a_rung_without_pages_keeps_the_other_features() -> None:
    problem = fuzz.fitted(AVAILABLE["triton/tiled"], DRAWN, CPU)
    assert problem == DRAWN.with_(page_size=0), "GQA, alignment, lengths and the LSE kept on a contiguous cache"


def test_a_rung_that_takes_nothing_drawn_is_skipped() -> None:
    refusing = dataclasses.replace(AVAILABLE["triton/tiled"], supports=lambda problem, device: (False, "planted"))
    assert fuzz.fitted(refusing, DRAWN, CPU) is None


def test_paged_rounds_the_capacity_up_to_whole_pages_and_keeps_the_rest() -> None:
    contiguous = DRAWN.with_(page_size=0, has_cache_seqlens=False, seqlen_k=130)
    problem = fuzz.paged(contiguous, 64)
    assert (problem.page_size, problem.seqlen_k, problem.has_cache_seqlens) == (64, 192, True)
    assert problem.with_(page_size=0, seqlen_k=130, has_cache_seqlens=False) == contiguous
    assert fuzz.plain(problem) == fuzz.plain(contiguous).with_(seqlen_k=192)


def test_draws_are_paged_about_half_the_time_wide_a_quarter_and_reproducible() -> None:
    drawn = [fuzz.random_problem(seed) for seed in range(200)]
    assert drawn == [fuzz.random_problem(seed) for seed in range(200)]
    page_sizes = {problem.page_size for problem, _ in drawn}
    assert page_sizes == {0, *fuzz.PAGE_SIZES}
    assert 60 <= sum(problem.paged for problem, _ in drawn) <= 140
    assert {problem.head_dim for problem, _ in drawn} == {64, 128, 256}
    assert 25 <= sum(problem.head_dim == 256 for problem, _ in drawn) <= 75


def test_a_rung_without_d256_takes_the_draw_at_d128() -> None:
    wide = DRAWN.with_(head_dim=256)
    tiled = AVAILABLE["triton/tiled"]
    assert fuzz.fitted(tiled, wide, CPU) == wide.with_(page_size=0)

    def without_d256(problem: Problem, device: torch.device) -> tuple[bool, str]:
        return (False, "planted: D=256 refused") if problem.head_dim > 128 else tiled.supports(problem, device)

    narrow = dataclasses.replace(tiled, supports=without_d256)
    assert fuzz.fitted(narrow, wide, CPU) == DRAWN.with_(head_dim=128, page_size=0)


def _interpreter_sized(problem: Problem) -> bool:
    scores = problem.seqlen_q * problem.seqlen_k * problem.batch * problem.heads
    return problem.dtype == torch.float16 and scores < 40_000


# The interpreter's share of the GPU tool's draws: fp16 (it refuses bf16) and small enough to run in seconds.
SMALL_SEEDS = [seed for seed in range(400) if _interpreter_sized(fuzz.random_problem(seed)[0])][:3]


def test_the_gpu_tool_fuzzes_forward_and_backward_seeds_end_to_end() -> None:
    """``fuzz_one`` and ``fuzz_backward_one`` as ``main`` runs them, here on the interpreter: each seed's problem is
    run or skipped, every run one right."""
    impl = AVAILABLE["triton/tiled"]
    forward, backward = fuzz.FuzzSummary(impl.name), fuzz.FuzzSummary(impl.name)
    for seed in SMALL_SEEDS:
        fuzz.fuzz_one(impl, seed, forward, device="cpu")
        fuzz.fuzz_backward_one(impl, seed, backward, device="cpu")
    for summary in (forward, backward):
        assert summary.ran + summary.skipped == len(SMALL_SEEDS) and summary.ran and not summary.mismatches, summary


def test_planted_a_wrong_gradient_is_a_mismatch_naming_its_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    import common.measure.backward as measure_backward

    real = measure_backward.gradients_of

    def dv_doubled(entry, inputs):
        (dq, dk, dv), backward, forward_backward = real(entry, inputs)
        return (dq, dk, 2 * dv), backward, forward_backward

    monkeypatch.setattr(measure_backward, "gradients_of", dv_doubled)
    summary = fuzz.FuzzSummary("triton/tiled")
    fuzz.fuzz_backward_one(AVAILABLE["triton/tiled"], SMALL_SEEDS[0], summary, device="cpu")
    assert len(summary.mismatches) == 1 and summary.mismatches[0].startswith(f"seed {SMALL_SEEDS[0]}:")
    assert "dv" in summary.mismatches[0]


def test_each_seeds_outcome_line_names_what_it_did() -> None:
    """The GPU tool prints each seed's outcome as it ends (a run cut by a device call's limit keeps its findings)."""
    summary = fuzz.FuzzSummary("triton/tiled", ran=3, skipped=1, oversized=1, mismatches=["seed 7: wrong"])
    assert fuzz.seed_outcome(8, (2, 1, 1), summary) == "seed 8: passed"
    assert fuzz.seed_outcome(8, (3, 1, 1), summary) == "seed 8: skipped (capability)"
    assert fuzz.seed_outcome(8, (3, 0, 1), summary).startswith("seed 8: skipped (over the interpreter's")
    assert fuzz.seed_outcome(7, (2, 1, 0), summary) == "seed 7: wrong"


def test_on_the_cpu_a_seed_over_the_size_cap_is_skipped_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cap applies to the problem as fitted (a decode rung's folded Sq), and only on the CPU; planted: with the
    cap at one score fewer than a seed's problem, it is oversized, not run."""
    impl = AVAILABLE["triton/tiled"]
    seed = SMALL_SEEDS[0]
    problem = fuzz.fitted(impl, fuzz.random_problem(seed)[0], CPU)
    assert fuzz.size_cap("cuda") is None and fuzz.size_cap("cpu") == fuzz.INTERPRETER_MAX_SCORES
    monkeypatch.setattr(fuzz, "INTERPRETER_MAX_SCORES", fuzz.scores(problem) - 1)
    summary = fuzz.FuzzSummary(impl.name)
    fuzz.fuzz_one(impl, seed, summary, device="cpu")
    assert (summary.ran, summary.skipped, summary.oversized) == (0, 0, 1)


def test_the_cpu_fuzzer_needs_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without TRITON_INTERPRET=1 every Triton rung would refuse the CPU: the tool says so instead of skipping all."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert "needs TRITON_INTERPRET=1, got None" in fuzz.missing_device("cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert fuzz.missing_device("cpu") is None


def test_the_tool_fuzzes_on_the_cpu_from_its_command_line(tmp_path: Path) -> None:
    """``--device cpu`` as a user without a GPU runs it: each seed's line, then the table, nothing wrong."""
    table = tmp_path / "fuzz.md"
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "common.tools.fuzz", "--device", "cpu", "--impl", "triton/tiled", "--count", "3"]
    done = subprocess.run(
        [*command, "--out", str(table)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert sum(line.startswith("triton/tiled seed ") for line in done.stdout.splitlines()) == 3, done.stdout
    text = table.read_text()
    assert text.startswith("# CPU (Triton interpreter) fuzz summary") and "| triton/tiled | " in text
    assert "| 0 |\n" in text, text
