"""Interleaved rounds: a set of timings taken once per round, the order reversed every other round.

Why: a long run on an H200 under its 700 W cap lowers the clock, so in one fixed order the timings taken
last run on a hotter, slower GPU (issue #40: at D64 B4 H32 ``bench.backward``'s fixed order read cute/hopper
0.96x FA4's speed, a profile of each call with cute/hopper first 1.07x; docs/perf-log.md). Reversed every
other round, each timing takes every place in the order equally often (over an even number of rounds); the
median over rounds of each one's per-round value then leaves out a steady drift (exactly, for a linear
drift and an even number of rounds: ``tests/test_rounds.py``).

:func:`interleaved_rounds` runs the rounds over any mapping of label -> call that returns milliseconds;
:func:`time_rows` does it for table rows (a record and its calls to time by column), writing each column's
median into the record, the per-round values into :data:`ROUNDS_COLUMN` and a timing error as ``failed``.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TypeVar

Label = TypeVar("Label", bound=Hashable)
Sample = TypeVar("Sample")
# The per-round values of a row's first timed column (milliseconds, space-separated), when rounds > 1.
ROUNDS_COLUMN = "rounds_ms"
# An error's text in a row's reason is cut to this many characters.
REASON_CHARS = 400


def _always() -> bool:
    return True


def interleaved_rounds(
    runs: Mapping[Label, Callable[[], Sample]],
    rounds: int,
    *,
    go_on: Callable[[], bool] = _always,
    errors: dict[Label, str] | None = None,
) -> dict[Label, list[Sample]]:
    """label -> each round's value of ``runs[label]()``: round 0 in ``runs``' order, round 1 reversed, and so
    on. ``go_on`` is asked before every round but the first (a budget: a stopped run keeps its rounds so far,
    the same number for every label). With ``errors`` a run that raises has its error's text stored there
    and is not called again (its list stays short); without it the exception goes up."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    samples: dict[Label, list[Sample]] = {label: [] for label in runs}
    order = list(runs)
    for round_index in range(rounds):
        if round_index and not go_on():
            break
        for label in order if round_index % 2 == 0 else reversed(order):
            if errors is not None and label in errors:
                continue
            try:
                samples[label].append(runs[label]())
            except Exception as error:  # recorded for the caller's row; the other runs go on
                if errors is None:
                    raise
                errors[label] = f"{type(error).__name__}: {error}"
    return samples


def time_rows(
    rows: Sequence[tuple[dict, Mapping[str, Callable[[], object]]]],
    rounds: int,
    timer: Callable[[Callable[[], object]], float],
    *,
    go_on: Callable[[], bool] = _always,
) -> None:
    """Time every row's calls (``column -> call``; none: the row is not timed) in interleaved rounds, each
    call through ``timer`` (milliseconds), and write into each row: every timed column's median over rounds;
    with more than one round, :data:`ROUNDS_COLUMN` and, if ``go_on`` cut the rounds short, how many ran (in
    ``reason``); if a call raised, ``failed`` and the error, without times (a partial row would read as
    measured)."""
    runs = {
        (index, column): functools.partial(timer, call)
        for index, (_record, calls) in enumerate(rows)
        for column, call in calls.items()
    }
    errors: dict[tuple[int, str], str] = {}
    samples = interleaved_rounds(runs, rounds, go_on=go_on, errors=errors)
    for index, (record, calls) in enumerate(rows):
        failed = [errors[index, column] for column in calls if (index, column) in errors]
        if failed:
            record |= {"status": "failed", "reason": failed[0][:REASON_CHARS]}
            continue
        for column in calls:
            record[column] = statistics.median(samples[index, column])
        if calls and rounds > 1:
            first = samples[index, next(iter(calls))]
            record[ROUNDS_COLUMN] = " ".join(f"{value:.4f}" for value in first)
            if len(first) < rounds:  # added to the reason a wrong row may already give
                short = f"timed in {len(first)} of {rounds} rounds"
                record["reason"] = "; ".join(filter(None, (record.get("reason"), short)))
