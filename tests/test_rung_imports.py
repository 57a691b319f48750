"""No silent skips: every rung module the registry lists imports, or the tests fail.

The registry turns a module that fails to import into an ``Unavailable`` row (compare.py reports it
and exits non-zero); here the same failure is a test failure, and so is a listed module with no file. CuTe rungs
are skipped only when the CuTe DSL package itself is not installed.
"""

from __future__ import annotations

import importlib.util

import pytest

from common.contract.registry import RUNG_MODULES, RUNGS, Unavailable, _load

HAS_CUTLASS = importlib.util.find_spec("cutlass") is not None
# The two ladders every checkout has: six rungs in Triton and six in the CuTe DSL.
LADDER_MODULES = [f"{package}.{rung}" for package in ("triton_impl", "cute_impl") for rung in RUNGS]


def test_the_registry_lists_both_ladders():
    assert len(LADDER_MODULES) == 12 and set(LADDER_MODULES) <= set(RUNG_MODULES)


@pytest.mark.parametrize("module_name", RUNG_MODULES)
def test_every_rung_module_imports(module_name: str):
    if module_name.startswith("cute_impl.") and not HAS_CUTLASS:
        pytest.skip("the CuTe DSL (nvidia-cutlass-dsl) is not installed")
    assert importlib.util.find_spec(module_name) is not None, f"{module_name} is listed but has no file"
    loaded = _load(module_name)
    assert not isinstance(loaded, Unavailable), f"{module_name}: {loaded.reason}"
    assert loaded, f"{module_name} defines no implementation"
