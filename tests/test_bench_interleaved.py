"""``bench.interleaved``, the rounds every A/B in bench/ times its settings in: each key once a round, the order
reversed every other round, so that no setting keeps the place a heated GPU or a warm cache favours."""

from __future__ import annotations

from collections.abc import Callable

from bench import interleaved

RUNS = {"a": 1, "b": 2, "c": 3}


def call_order(rounds_of: Callable, rounds: int) -> tuple[list[int], dict]:
    """The runs in the order ``rounds_of`` measured them, and what it returned."""
    seen: list[int] = []
    samples = rounds_of(RUNS, rounds, lambda run: seen.append(run) or run * 10)
    return seen, samples


def places_alternate(seen: list[int], rounds: int) -> bool:
    """Each round's order is the first's, reversed on odd rounds."""
    width = len(RUNS)
    first = seen[:width]
    return all(
        seen[r * width : (r + 1) * width] == (first if r % 2 == 0 else first[::-1]) for r in range(rounds)
    ) and first == list(RUNS.values())


def never_reversed(runs: dict, rounds: int, measure: Callable) -> dict:
    """A planted loop that keeps one order every round."""
    return {key: [measure(run) for _ in range(rounds)] for key, run in runs.items()}


def test_each_key_once_a_round_in_alternating_order():
    seen, samples = call_order(interleaved, 4)
    assert places_alternate(seen, 4)
    assert samples == {"a": [10] * 4, "b": [20] * 4, "c": [30] * 4}


def test_a_loop_that_never_reverses_fails_the_order_check():
    seen, samples = call_order(never_reversed, 4)
    assert samples == {"a": [10] * 4, "b": [20] * 4, "c": [30] * 4}
    assert not places_alternate(seen, 4)
