"""The layer order of ``common/__init__.py`` (``LAYERS``), held by reading every file's imports.

The checker parses each source file with ``ast`` (nothing is imported or run) and reports every
``import`` or ``from ... import``, at module level or inside a function, whose target sits in a layer
above the importing file's. A planted violation shows the checker reports what it should, and a child
process shows that a user's call of ``common.attention`` loads no benchmark code.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from common import LAYERS

ROOT = Path(__file__).resolve().parent.parent
# The folders and files held to the order; tests may import anything.
CHECKED = ("common", "triton_impl", "cute_impl", "bench", "compare.py")
# ``common/__init__.py`` re-exports the user's entry point, so the bare package is the contract layer.
PACKAGE_ROOT = "common"
PACKAGE_ROOT_LAYER = "common.contract"


def layer_of(module: str) -> int | None:
    """The rank of the layer ``module`` belongs to (0 lowest), or None for a module outside the project."""
    if module == PACKAGE_ROOT:
        module = PACKAGE_ROOT_LAYER
    matches = [
        (len(prefix), rank)
        for rank, prefixes in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    return max(matches)[1] if matches else None


def module_name(path: Path) -> str:
    """The dotted name of a source file below the repository root (a package's ``__init__`` is the package)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, importer: str) -> list[tuple[int, str]]:
    """(line, module) of every import in ``source``; relative imports are resolved against ``importer``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = importer.split(".")[: -node.level]
                base = ".".join([*package, base] if base else package)
            found.append((node.lineno, base))
    return found


def violations(source: str, importer: str, where: str) -> list[str]:
    """Each import in ``source`` that reaches above ``importer``'s layer, as ``where:line: a -> b``."""
    rank = layer_of(importer)
    assert rank is not None, f"{importer} is in no layer of common.LAYERS: place it there"
    return [
        f"{where}:{line}: {importer} (layer {rank + 1}) imports {target} (layer {target_rank + 1})"
        for line, target in imported_modules(source, importer)
        if (target_rank := layer_of(target)) is not None and target_rank > rank
    ]


def checked_files() -> list[Path]:
    files = []
    for entry in CHECKED:
        path = ROOT / entry
        files.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return files


def test_no_import_runs_against_the_layer_order():
    found = [
        problem
        for path in checked_files()
        for problem in violations(path.read_text(), module_name(path), str(path.relative_to(ROOT)))
    ]
    assert not found, "imports against the layer order (common/__init__.py):\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("importer", "source", "target"),
    [
        ("common.contract.check", "from common.measure.sdpa import sdpa\n", "common.measure.sdpa"),
        ("common.measure.runner", "from common.reporting.results import ResultRow\n", "common.reporting.results"),
        ("triton_impl.hopper", "def f():\n    import common.reporting.static\n", "common.reporting.static"),
        ("cute_impl.hopper", "from common.measure import fa4\n", "common.measure"),
        ("common.toolchain.compile", "from common.contract import registry\n", "common.contract"),
        ("common.measure.results", "from ..reporting import plots\n", "common.reporting"),
        ("common.distributed.ring", "from common.tools.fuzz import main\n", "common.tools.fuzz"),
    ],
    ids=["contract->measure", "measure->reporting", "rung->reporting-lazily", "rung->measure",
         "toolchain->contract", "relative", "distributed->tools"],
)  # fmt: skip
def test_a_planted_violation_is_reported(importer: str, source: str, target: str):
    found = violations(source, importer, "planted.py")
    assert len(found) == 1 and found[0].endswith(f"imports {target} (layer {layer_of(target) + 1})"), found


@pytest.mark.parametrize(
    ("importer", "source"),
    [
        ("common.reporting.static", "from common.measure.peaks import Peaks\nimport torch\n"),
        ("triton_impl.gluon.hopper", "from common.toolchain.compile import compile_triton_sm90\n"),
        ("bench.ncu_target", "from common.contract.registry import get\nimport compare\n"),
        ("common.contract.api", "from common.contract.registry import get\nfrom common import attention\n"),
    ],
    ids=["downward", "rung->toolchain", "top", "same-layer"],
)
def test_imports_down_or_within_a_layer_pass(importer: str, source: str):
    assert violations(source, importer, "planted.py") == []


USER_CALL = """
import sys
import torch
from common.contract.api import attention

q = torch.randn(1, 2, 16, 64)
out = attention(q, q, q, causal=True)
assert out.shape == q.shape
loaded = sorted(name for name in sys.modules if name.startswith(("common.measure", "common.reporting")))
print(f"loaded: {loaded}")
"""


def test_a_user_call_imports_no_benchmark_code():
    """``common.attention`` on the default rung, in a fresh interpreter: no module of the measure layer
    (where the SDPA, FA4 and FlashInfer baselines live) or of reporting is loaded."""
    # The interpreter runs the default rung on CPU tensors on any machine.
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", USER_CALL], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip().splitlines()[-1] == "loaded: []", done.stdout
