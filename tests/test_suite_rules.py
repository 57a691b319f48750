"""Rules about the test suite itself (CPU, no kernel compiled):

- a test that compiles a CuTe DSL kernel in its own process carries the ``cute_compile`` marker, which
  .ci/run runs in one leg only (its header says why), unless it is allowed below with the reason;
- a batch of child scripts (``tests._helpers.scripts_in_one_child``) gives each script's failure to the
  test that reads it, and the other scripts' results still stand;
- the newest CI leg's selection (``.ci/run``) keeps the CPU teaching mode's tests: a file's ``teaching`` marker
  removed, or the marker dropped from the leg's ``-m``, would leave that leg with the static tests alone, silently;
- the three release legs (gpu-machine, newest, triton-3.7) select the ``release`` tests, and the files that compile
  every rung's default builds carry that marker: without it a release leg would compile nothing of theirs, silently.

The marker rule reads the test files' syntax: a call counts as a CuTe compile when it is the toolchain's
``compile_cute_sm90`` or a ``compile_sm90`` / ``binaries`` call whose receiver names a ``cute_impl`` module
(imported, assigned from one, or looked up in something built from one), in the test or in a function or
fixture of its file that the test calls or requests (functions of other modules are not followed).
Compiles through the registry (``impl.compile_sm90``, test_static_sm90.py) are every stack's and stay in
every leg; they are not CuTe calls here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests._helpers import child_result, scripts_in_one_child

TESTS = Path(__file__).resolve().parent
# The compile paths of a cute_impl rung (``compile_sm90``) and of its compile cache (``KERNELS.binaries``).
CUTE_COMPILE_METHODS = ("compile_sm90", "binaries")
# The toolchain's compile of any CuTe kernel (common/toolchain/compile.py).
CUTE_TOOLCHAIN_COMPILE = "compile_cute_sm90"
MARKER = "cute_compile"
# Unmarked tests that compile CuTe in process on purpose, so that every CI leg runs them: why, by test.
ALLOWED_UNMARKED: dict[str, str] = {}


def _names(node: ast.AST) -> set[str]:
    return {child.id for child in ast.walk(node) if isinstance(child, ast.Name)}


def _mentions_cute(node: ast.AST, cute_names: set[str]) -> bool:
    """``node`` reads a name bound to a cute_impl module, or names one in a string (``import_module``)."""
    strings = (c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return bool(_names(node) & cute_names) or any(s.startswith("cute_impl") for s in strings)


def cute_module_names(tree: ast.Module) -> set[str]:
    """Names that hold a cute_impl module or something built from one: the imports, then (until nothing
    changes) every name assigned or looped over from an expression that mentions one."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cute_impl"):
            names |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            names |= {
                alias.asname or alias.name.split(".")[0] for alias in node.names if alias.name.startswith("cute_impl")
            }
    bindings = [
        (target, value)
        for node in ast.walk(tree)
        for target, value in (
            [(t, node.value) for t in node.targets] if isinstance(node, ast.Assign)
            else [(node.target, node.iter)] if isinstance(node, ast.For | ast.comprehension)
            else []
        )
    ]  # fmt: skip
    while True:
        found = {name for target, value in bindings if _mentions_cute(value, names) for name in _names(target)}
        if found <= names:
            return names
        names |= found


def _compiles_cute(call: ast.Call, cute_names: set[str]) -> bool:
    function = call.func
    if isinstance(function, ast.Name):
        return function.id == CUTE_TOOLCHAIN_COMPILE
    if not isinstance(function, ast.Attribute):
        return False
    if function.attr == CUTE_TOOLCHAIN_COMPILE:
        return True
    return function.attr in CUTE_COMPILE_METHODS and _mentions_cute(function.value, cute_names)


def _is_marked(decorators: list[ast.expr], marker: str) -> bool:
    """A ``pytest.mark.<marker>`` among ``decorators`` (or in a ``pytestmark`` value), called or not."""
    return any(isinstance(node, ast.Attribute) and node.attr == marker for d in decorators for node in ast.walk(d))


def unmarked_cute_compiles(source: str, file_name: str) -> list[str]:
    """``file::test`` of every test in ``source`` that compiles a CuTe kernel in process without the
    ``cute_compile`` marker (on itself or the module's ``pytestmark``)."""
    tree = ast.parse(source)
    cute_names = cute_module_names(tree)
    functions = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
    compiling = {
        name
        for name, function in functions.items()
        if any(isinstance(node, ast.Call) and _compiles_cute(node, cute_names) for node in ast.walk(function))
    }
    # A function that calls a compiling function of the file, or requests a compiling fixture, compiles too.
    while True:
        found = {
            name
            for name, function in functions.items()
            if (_names(function) | {argument.arg for argument in function.args.args}) & (compiling - {name})
        }
        if found <= compiling:
            break
        compiling |= found
    module_marks = [node.value for node in tree.body if isinstance(node, ast.Assign) and _names(node) >= {"pytestmark"}]
    if _is_marked(module_marks, MARKER):
        return []
    return sorted(
        f"{file_name}::{name}"
        for name in compiling
        if name.startswith("test_") and not _is_marked(functions[name].decorator_list, MARKER)
    )


def test_every_in_process_cute_compile_is_marked_cute_compile():
    found = [
        test for path in sorted(TESTS.glob("test_*.py")) for test in unmarked_cute_compiles(path.read_text(), path.name)
    ]
    unexplained = sorted(set(found) - set(ALLOWED_UNMARKED))
    assert not unexplained, f"CuTe compiles without @pytest.mark.{MARKER} (.ci/run's header): {unexplained}"
    # An allowance for a test that no longer compiles, or is marked now, is stale.
    stale = sorted(set(ALLOWED_UNMARKED) - set(found))
    assert not stale, f"ALLOWED_UNMARKED lists tests that are not unmarked CuTe compiles: {stale}"


PLANTED_FILE = """
import importlib
import pytest
from common.contract.problem import Problem
from cute_impl import tiled as cute_tiled
from cute_impl.backward import hopper as hopper_backward
from triton_impl import hopper as triton_hopper
from common.toolchain.compile import compile_cute_sm90
RUNGS = {"cute/tiled": cute_tiled}
PROBLEM = Problem(1, 1, 64, 64, 64)

def _ptx(problem):
    return cute_tiled.compile_sm90(problem)[0].ptx

@pytest.fixture
def compiled():
    return hopper_backward.KERNELS["dq"].binaries(None, "dq")

def test_direct():
    assert cute_tiled.compile_sm90(PROBLEM)

def test_through_a_helper():
    assert _ptx(PROBLEM)

def test_through_a_fixture(compiled):
    assert compiled

def test_through_the_registry_of_the_file():
    assert RUNGS["cute/tiled"].compile_sm90(PROBLEM)

def test_through_an_imported_name():
    fp8 = importlib.import_module("cute_impl.fp8")
    assert fp8.compile_sm90(PROBLEM)

def test_through_the_toolchain():
    assert compile_cute_sm90(None, name="x", threads=128)

@pytest.mark.cute_compile
def test_marked():
    assert cute_tiled.compile_sm90(PROBLEM) and _ptx(PROBLEM)

def test_triton():
    assert triton_hopper.compile_sm90(PROBLEM)

def test_no_compile():
    assert cute_tiled.supports(PROBLEM)
"""


def test_the_marker_rule_catches_planted_unmarked_compiles():
    caught = unmarked_cute_compiles(PLANTED_FILE, "planted.py")
    expected = ["direct", "through_a_fixture", "through_a_helper", "through_an_imported_name"]
    expected += ["through_the_registry_of_the_file", "through_the_toolchain"]
    assert caught == [f"planted.py::test_{name}" for name in expected]
    # The same file under a module-wide marker breaks no rule.
    assert unmarked_cute_compiles(f"pytestmark = pytest.mark.{MARKER}\n{PLANTED_FILE}", "planted.py") == []


def test_a_failing_script_of_a_batch_fails_only_its_own_test():
    script = "import json, sys\nassert sys.argv[1] != 'planted', 'planted failure'\nprint(json.dumps(sys.argv[1]))"
    results = scripts_in_one_child({"good": (script, ["fine"]), "bad": (script, ["planted"])}, timeout=120)
    assert child_result(results, "good") == "fine"
    with pytest.raises(pytest.fail.Exception, match=r"(?s)bad failed in the child process.*AssertionError: planted"):
        child_result(results, "bad")


def teaching_leg_gaps(ci_script: str, rung_tests_source: str) -> list[str]:
    """What keeps the newest leg from the teaching tests: its ``-m`` without ``teaching``, or test_rungs_cpu.py
    without a module-wide ``teaching`` marker."""
    newest = next((line for line in ci_script.splitlines() if line.strip().startswith("newest)")), "")
    gaps = [] if "teaching" in newest else [f".ci/run's newest selection lacks teaching: {newest.strip()!r}"]
    tree = ast.parse(rung_tests_source)
    assigns = [node for node in tree.body if isinstance(node, ast.Assign)]
    marks = [node.value for node in assigns if "pytestmark" in {getattr(t, "id", "") for t in node.targets}]
    if not any(isinstance(mark, ast.Attribute) and mark.attr == "teaching" for mark in marks):
        gaps.append("tests/test_rungs_cpu.py has no pytestmark = pytest.mark.teaching")
    return gaps


def test_the_newest_leg_runs_the_teaching_tests():
    ci_script = (TESTS.parent / ".ci" / "run").read_text()
    rung_tests = (TESTS / "test_rungs_cpu.py").read_text()
    assert teaching_leg_gaps(ci_script, rung_tests) == []
    # Planted: the marker gone from the leg, or from the file.
    assert len(teaching_leg_gaps(ci_script.replace("release or teaching", "release"), rung_tests)) == 1
    assert len(teaching_leg_gaps(ci_script, rung_tests.replace("pytest.mark.teaching", "pytest.mark.slow"))) == 1


# The files whose static tests compile every rung's default builds: what each Triton release must compile.
RELEASE_FILES = ("test_static_sm90.py", "test_triton_releases.py", "test_gluon.py", "test_capability_matrix.py")


def release_leg_gaps(ci_script: str, sources: dict[str, str]) -> list[str]:
    """What keeps a release leg from the default builds: a leg's ``-m`` without ``release``, or one of
    ``RELEASE_FILES`` (``sources``: name -> text) without a ``pytest.mark.release`` on it or on a test."""
    lines = {line.strip() for line in ci_script.splitlines()}
    selections = [line for line in lines if line.startswith(("newest)", "gpu-machine | triton-3.7)"))]
    gaps = [] if len(selections) == 2 else [f".ci/run's release legs' selections not found: {selections}"]
    gaps += [f".ci/run's selection lacks release: {line!r}" for line in selections if "release" not in line]
    for name, source in sources.items():
        marked = any(isinstance(node, ast.Attribute) and node.attr == "release" for node in ast.walk(ast.parse(source)))
        if not marked:
            gaps.append(f"tests/{name} has no pytest.mark.release")
    return gaps


def test_the_release_legs_compile_every_rungs_default_builds():
    ci_script = (TESTS.parent / ".ci" / "run").read_text()
    sources = {name: (TESTS / name).read_text() for name in RELEASE_FILES}
    assert release_leg_gaps(ci_script, sources) == []
    # Planted: the marker gone from a leg's selection, or from a file.
    assert len(release_leg_gaps(ci_script.replace('"release and', '"static and'), sources)) == 1
    unmarked = {**sources, "test_static_sm90.py": sources["test_static_sm90.py"].replace("mark.release", "mark.slow")}
    assert len(release_leg_gaps(ci_script, unmarked)) == 1
