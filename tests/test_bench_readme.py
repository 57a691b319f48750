"""bench/README.md documents every tool in bench/ (issue #36, item 5): each file other than ``__init__.py`` is named
as `` `name` `` in the first cell of a row of its table, and every ``results/...`` path the README names exists
(a ``*`` in a path must match at least one)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
README = BENCH / "README.md"
RESULTS_PATH = re.compile(r"`(results/[^`\s]+)`")


def table_names(readme: str) -> set[str]:
    """The `` `name` ``s in the first cell of each row of the README's table."""
    names: set[str] = set()
    for line in readme.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([^`]+)`", line.split(" | ")[0]))
    return names


def bench_readme_problems(readme: str, files: Iterable[str], root: Path) -> list[str]:
    """One line per tool the table does not name and per ``results/...`` path that is not under ``root``."""
    named = table_names(readme)
    problems = [f"bench/{name} is not in bench/README.md's table" for name in sorted(files) if name not in named]
    for path in sorted(set(RESULTS_PATH.findall(readme))):
        found = any(root.glob(path.rstrip("/"))) if "*" in path else (root / path).exists()
        if not found:
            problems.append(f"bench/README.md names {path}, which does not exist")
    return problems


def bench_files() -> list[str]:
    return [p.name for p in BENCH.iterdir() if p.is_file() and p.name not in ("__init__.py", "README.md")]


def test_every_bench_tool_is_in_the_readme_and_every_results_path_exists() -> None:
    assert bench_readme_problems(README.read_text(), bench_files(), ROOT) == []


def test_planted_unlisted_tool_and_missing_folder_fail_the_rule() -> None:
    readme = README.read_text()
    planted = readme + "\n| `planted_tool.sh` | a row | `results/h200/planted-folder-that-is-not-there/` |\n"
    problems = bench_readme_problems(planted, [*bench_files(), "planted_unlisted_ab.sh"], ROOT)
    assert problems == [
        "bench/planted_unlisted_ab.sh is not in bench/README.md's table",
        "bench/README.md names results/h200/planted-folder-that-is-not-there/, which does not exist",
    ]
    # A name mentioned only in prose, or as a substring of a listed name, does not count as listed.
    assert bench_readme_problems("`gpu_run.sh` in prose\n| `_gpu_run.sh` | x | — |\n", ["gpu_run.sh"], ROOT) == [
        "bench/gpu_run.sh is not in bench/README.md's table"
    ]
