"""Tools a maintainer reruns behind the committed data in ``results/`` (benchmarks, sweeps, profiles).

Run each from the project root as a module, ``python -m bench.<name> --help``; the shell scripts here
wrap one device call each (``bash bench/<name>.sh``, ``$OUT`` set to the folder that comes back).
``bench/README.md`` lists every tool in one line with the results folder it feeds; ``docs/perf-log.md``
holds what the runs showed. The harness proper (``compare.py``, ``common/``) stays where it is: these
scripts only drive it for runs that the harness does not express.
"""

import functools
import sys
from collections.abc import Callable, Hashable, Mapping
from typing import TypeVar

from common.measure.rounds import interleaved_rounds

Key = TypeVar("Key", bound=Hashable)
Run = TypeVar("Run")
Sample = TypeVar("Sample")


def require_gpu(what: str) -> None:
    """Exit 2 with one line when no CUDA device is visible (every timed or launched run needs one)."""
    import torch

    if not torch.cuda.is_available():
        print(f"{what} needs a CUDA GPU (Hopper); none is visible", file=sys.stderr)
        sys.exit(2)


def interleaved(runs: Mapping[Key, Run], rounds: int, measure: Callable[[Run], Sample]) -> dict[Key, list[Sample]]:
    """key -> ``measure(runs[key])`` once a round: the keys in their order on even rounds, reversed on odd ones
    (``common.measure.rounds.interleaved_rounds``, the loop ``compare.py --backward --rounds`` times in). A run's
    time depends on its place in a round (H200, 2026-12-03, results/h200/fp8-quotient/: the same two kernels 5-20 µs
    apart by place, either way round; 2026-12-04: a heated GPU's lower clock charged to the rows timed last), so no
    key keeps the same place."""
    return interleaved_rounds({key: functools.partial(measure, run) for key, run in runs.items()}, rounds)
