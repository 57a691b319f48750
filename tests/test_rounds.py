"""``common.measure.rounds``: interleaved rounds (the order reversed every other round) and the rows they time.

Fake runs stand in for the timer: each records its label and returns a time from a script or from its place in
the whole sequence of calls (a clock that drifts steadily). A planted helper that never reverses the order must
fail the order and the drift tests. The benches that use the rounds are tested in tests/test_backward.py.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import pytest

from common.measure.rounds import ROUNDS_COLUMN, interleaved_rounds, time_rows


def never_reversed(runs: dict, rounds: int, **options) -> dict:
    """A planted bug: every round in the same order (the bias the rounds are there to remove)."""
    samples = {label: [] for label in runs}
    for _ in range(rounds):
        for label, run in runs.items():
            samples[label].append(run())
    return samples


HELPERS = {"interleaved_rounds": interleaved_rounds, "planted: never reversed": never_reversed}


def drifting_runs(labels: str, calls: list[str], drift: float = 0.01) -> dict[str, Callable[[], float]]:
    """Runs that all take 1 ms on a clock that slows by ``drift`` per call: each returns 1 + drift × its place
    in the whole sequence, and records its label in ``calls``."""

    def run(label: str) -> float:
        calls.append(label)
        return 1.0 + drift * (len(calls) - 1)

    return {label: lambda label=label: run(label) for label in labels}


@pytest.mark.parametrize("helper", HELPERS)
def test_the_order_is_reversed_every_other_round(helper: str) -> None:
    calls: list[str] = []
    samples = HELPERS[helper](drifting_runs("abc", calls), 4)
    expected = [*"abc", *"cba", *"abc", *"cba"]
    if helper.startswith("planted"):
        assert calls != expected, calls
        return
    assert calls == expected
    # Each label's values in round order: its places in the sequence above.
    places = {"a": (0, 5, 6, 11), "b": (1, 4, 7, 10), "c": (2, 3, 8, 9)}
    assert samples == {label: [1.0 + 0.01 * place for place in places[label]] for label in "abc"}


@pytest.mark.parametrize("helper", HELPERS)
@pytest.mark.parametrize("rounds", [2, 4, 6])
def test_a_steady_drift_favours_no_place_over_even_rounds(helper: str, rounds: int) -> None:
    """Three equal runs on a clock that slows steadily: in one fixed order the last looks 2 % slower than the
    first; over an even number of interleaved rounds the medians are equal. Never reversed, the bias stays."""
    one_pass = interleaved_rounds(drifting_runs("abc", []), 1)
    assert one_pass["c"][0] / one_pass["a"][0] == pytest.approx(1.02)
    samples = HELPERS[helper](drifting_runs("abc", []), rounds)
    medians = {label: statistics.median(values) for label, values in samples.items()}
    if helper.startswith("planted"):
        assert medians["c"] / medians["a"] > 1.015, medians
        return
    assert medians["a"] == pytest.approx(medians["b"]) == pytest.approx(medians["c"])


def test_the_median_over_rounds_of_scripted_times() -> None:
    script = {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 7.0, 9.0])}
    samples = interleaved_rounds({label: lambda label=label: next(script[label]) for label in script}, 3)
    assert samples == {"a": [3.0, 1.0, 2.0], "b": [5.0, 7.0, 9.0]}
    assert {label: statistics.median(values) for label, values in samples.items()} == {"a": 2.0, "b": 7.0}


def test_go_on_is_asked_before_every_round_but_the_first() -> None:
    """A budget that has run out before the first round still gets one (a checked row keeps a time); one that
    runs out later stops the rounds, every label keeping the same number."""
    calls: list[str] = []
    asked = []
    samples = interleaved_rounds(drifting_runs("ab", calls), 5, go_on=lambda: asked.append(1) or len(asked) < 2)
    assert calls == [*"ab", *"ba"] and len(asked) == 2
    assert [len(values) for values in samples.values()] == [2, 2]
    assert interleaved_rounds(drifting_runs("ab", []), 3, go_on=lambda: False) == {"a": [1.0], "b": [1.01]}


def test_a_run_that_raises_is_recorded_and_not_called_again() -> None:
    calls: list[str] = []

    def broken() -> float:
        calls.append("broken")
        if calls.count("broken") == 2:
            raise RuntimeError("out of memory")
        return 1.0

    runs = {**drifting_runs("a", calls), "broken": broken}
    errors: dict[str, str] = {}
    samples = interleaved_rounds(runs, 4, errors=errors)
    assert errors == {"broken": "RuntimeError: out of memory"}
    assert calls == ["a", "broken", "broken", "a", "a", "a"]
    assert len(samples["a"]) == 4 and samples["broken"] == [1.0]
    with pytest.raises(RuntimeError, match="out of memory"):
        calls.clear()
        interleaved_rounds(runs, 2)
    with pytest.raises(ValueError, match="at least 1"):
        interleaved_rounds(runs, 0)


def test_time_rows_writes_medians_rounds_and_failures() -> None:
    """Per row: each timed column's median, the first column's rounds, a timing error as ``failed`` without
    times; a row with no calls is left as it is; one round adds no rounds column."""
    times = {"fast": iter([1.0, 3.0, 2.0]), "slow": iter([4.0, 6.0, 5.0]), "both": iter([9.0, 8.0, 7.0])}

    def timer(call: Callable[[], object]) -> float:
        return call()

    def broken() -> float:
        raise RuntimeError("lost the device")

    rows = [({"impl": "x", "status": "ok", "reason": ""},
             {"bwd_ms": lambda: next(times["fast"]), "fwd_bwd_ms": lambda: next(times["slow"])}),
            ({"impl": "wrong", "status": "skipped", "reason": "no GPU"}, {}),
            ({"impl": "y", "status": "ok", "reason": ""},
             {"bwd_ms": lambda: next(times["both"]), "fwd_bwd_ms": broken})]  # fmt: skip
    time_rows(rows, 3, timer)
    assert rows[0][0] == {"impl": "x", "status": "ok", "reason": "", "bwd_ms": 2.0, "fwd_bwd_ms": 5.0,
                          ROUNDS_COLUMN: "1.0000 3.0000 2.0000"}  # fmt: skip
    assert rows[1][0] == {"impl": "wrong", "status": "skipped", "reason": "no GPU"}
    assert rows[2][0] == {"impl": "y", "status": "failed", "reason": "RuntimeError: lost the device"}
    one = [({"status": "ok", "reason": ""}, {"bwd_ms": lambda: 4.0})]
    time_rows(one, 1, timer)
    assert one[0][0] == {"status": "ok", "reason": "", "bwd_ms": 4.0}


def test_time_rows_says_when_the_rounds_were_cut_short() -> None:
    rounds = iter([True, False])
    rows = [({"status": "wrong", "reason": "dk 2x off"}, {"bwd_ms": lambda: 1.0}), ({"status": "ok", "reason": ""},
            {"bwd_ms": lambda: 2.0})]  # fmt: skip
    time_rows(rows, 4, lambda call: call(), go_on=lambda: next(rounds))
    assert [row[ROUNDS_COLUMN] for row, _ in rows] == ["1.0000 1.0000", "2.0000 2.0000"]
    assert [row["reason"] for row, _ in rows] == ["dk 2x off; timed in 2 of 4 rounds", "timed in 2 of 4 rounds"]
