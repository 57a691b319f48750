"""common.distributed.teardown.exit_without_finalising: the status and the buffered output survive, and
the interpreter's finalisation (where a late gloo worker thread aborts the process) does not run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROGRAM = """
import atexit, sys
from common.distributed.teardown import exit_without_finalising
atexit.register(lambda: print("finalised"))
print("written", end="")
print("to stderr", end="", file=sys.stderr)
exit_without_finalising(3)
"""


def test_it_exits_with_the_status_and_flushed_output_and_no_finalisation() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert done.stdout == "written"  # flushed, and no atexit handler (finalisation) ran
    assert done.stderr.endswith("to stderr")
