"""pytest-xdist's ``--dist loadgroup`` (the README's test command) puts every test of an ``xdist_group`` on one
worker, with the group's name after "@" in its node id: under pytest 9.2 + xdist 3.8 only because
``tests/conftest.py``'s ``_group_by_xdist_mark`` adds the suffix xdist's own hook no longer can. Without it (the tree
before 2026-12-01) this test's child run reported bare ids spread over both workers."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_group_runs_on_one_worker_under_its_suffix():
    command = [sys.executable, "-m", "pytest", "-v", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider",
               "tests/test_triton_releases.py", "-k", "versions_map"]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    outcomes = re.findall(r"^\[(gw\d+)\] .*?PASSED (\S+::\S+)", done.stdout, re.MULTILINE)
    assert len(outcomes) >= 4, done.stdout[-3000:]
    assert all(node_id.endswith("@triton-releases") for _, node_id in outcomes), outcomes
    assert len({worker for worker, _ in outcomes}) == 1, f"one group, more than one worker: {outcomes}"
