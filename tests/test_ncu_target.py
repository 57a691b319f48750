"""``bench.ncu_target``'s command line: the three kinds of target it profiles, what it refuses before asking for a
GPU (a wrong count or a non-number is the parser's error, exit 2 with the expected forms named), and ``--set``'s
constants held over the prepare and the profiled launch only."""

from __future__ import annotations

import argparse

import pytest

from bench import ncu_target
from bench.ncu_target import RUNNERS, parsed_target


def test_each_form_parses_to_its_runner():
    parser = argparse.ArgumentParser()
    # bench/ncu.sh splits a spec into words: a backward shape's name comes back whole.
    assert parsed_target(["backward", "B8", "S2048", "causal"], parser) == ("backward", ["B8 S2048 causal"])
    assert parsed_target(["decode", "151", "1"], parser) == ("decode", [151, 1])
    assert parsed_target(["2", "16", "8192", "128", "1"], parser) == ("prefill", [2, 16, 8192, 128, 1])
    assert set(RUNNERS) == {"backward", "decode", "prefill"}


@pytest.mark.parametrize("words", [["backward"], ["decode", "151"], ["2", "16", "x", "128", "1"], ["2", "16"]])
def test_a_malformed_target_is_the_parsers_error(words: list[str], capsys):
    with pytest.raises(SystemExit) as ended:
        parsed_target(words, argparse.ArgumentParser())
    assert ended.value.code == 2
    assert "expected" in capsys.readouterr().err


def test_the_prefill_runner_takes_the_parsed_numbers(monkeypatch: pytest.MonkeyPatch):
    """The parsed B H S D CAUSAL reach the problem as they were given (a runner that took them as one list raised
    before any launch)."""

    class Rung:
        def prepare(self, q, k, v, problem):
            return lambda: (q, k, v)

    monkeypatch.setattr(ncu_target, "get", lambda impl: Rung())
    monkeypatch.setattr(ncu_target, "make_inputs", lambda problem, seed: ("q", "k", "v"))
    kind, values = parsed_target(["4", "32", "8192", "64", "1"], argparse.ArgumentParser())
    runner, problem = RUNNERS[kind]("cute/fp8", *values)
    assert runner() == ("q", "k", "v")
    shape = (problem.batch, problem.heads, problem.seqlen_q, problem.seqlen_k, problem.head_dim, problem.causal)
    assert shape == (4, 32, 8192, 8192, 64, True)


def test_set_holds_a_constant_over_the_prepare_and_the_profiled_launch(monkeypatch: pytest.MonkeyPatch):
    from triton_impl import decode

    seen = []

    class Problem:
        def describe(self) -> str:
            return "a problem"

    def runner(impl: str, *values: int):
        seen.append(("prepare", decode.WIDE_M_TILE))
        return (lambda: None), Problem()

    monkeypatch.setattr(ncu_target, "require_gpu", lambda name: None)
    monkeypatch.setattr(ncu_target, "profile", lambda run: seen.append(("profile", decode.WIDE_M_TILE)))
    monkeypatch.setitem(RUNNERS, "prefill", runner)
    default = decode.WIDE_M_TILE
    ncu_target.main(["triton/decode", "1", "2", "64", "64", "0", "--set", "triton_impl.decode:WIDE_M_TILE=False"])
    assert seen == [("prepare", False), ("profile", False)] and decode.WIDE_M_TILE is default


def test_a_malformed_set_is_the_parsers_error(monkeypatch: pytest.MonkeyPatch, capsys):
    monkeypatch.setattr(ncu_target, "require_gpu", lambda name: pytest.fail("asked for a GPU"))
    with pytest.raises(SystemExit) as ended:
        ncu_target.main(["cute/fp8", "4", "32", "8192", "64", "0", "--set", "cute_impl.fp8:SCALE_INDEX_32BIT"])
    assert ended.value.code == 2
    assert "MODULE:NAME=LITERAL" in capsys.readouterr().err
