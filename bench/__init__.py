"""Tools a maintainer reruns behind the committed data in ``results/`` (benchmarks, sweeps, profiles).

Run each from the project root as a module, ``python -m bench.<name> --help``; the shell scripts here
wrap one device call each (``bash bench/<name>.sh``, ``$OUT`` set to the folder that comes back).
``bench/README.md`` lists every tool in one line with the results folder it feeds; ``docs/perf-log.md``
holds what the runs showed. The harness proper (``compare.py``, ``common/``) stays where it is: these
scripts only drive it for runs that the harness does not express.
"""

import sys


def require_gpu(what: str) -> None:
    """Exit 2 with one line when no CUDA device is visible (every timed or launched run needs one)."""
    import torch

    if not torch.cuda.is_available():
        print(f"{what} needs a CUDA GPU (Hopper); none is visible", file=sys.stderr)
        sys.exit(2)
