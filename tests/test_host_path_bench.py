"""bench/host_path.py on CPU (launches stubbed, in a child process: the stubs replace module state): the API's table
and, with ``--transformers``, each implementation through the adapter beside transformers' own sdpa, whose row is
there only in that mode."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parent.parent


def _table(*options: str) -> dict[str, tuple[float, float]]:
    """``impl -> (same µs, growing µs)`` of one short run."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "bench.host_path", "--impls", "auto", "--calls", "3", "--rounds", "1", *options]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("| ") and "µs" not in line]
    rows = [line.strip("|").split("|") for line in lines]
    return {name.strip(): (float(same), float(growing)) for name, same, growing in rows}


def test_the_api_table_and_the_transformers_table_with_sdpa_beside():
    api, through_transformers = _table(), _table("--transformers")
    assert list(api) == ["auto"] and list(through_transformers) == ["auto", "sdpa"]
    assert all(time > 0 for row in (*api.values(), *through_transformers.values()) for time in row)
