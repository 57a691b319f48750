"""Test set-up: interpreter mode on CPU-only machines, the ``gpu`` marker, ``--impl`` filtering."""

from __future__ import annotations

import fnmatch
import os

import pytest
import torch

# Triton picks interpreter vs compiler when a kernel is decorated, so this must precede any
# import of triton_impl: without a GPU, the Triton rungs run on CPU tensors in the interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

HAS_CUDA = torch.cuda.is_available()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--impl", default="*", help="glob on implementation names, e.g. 'cute/*'")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    pattern = config.getoption("--impl")
    kept = []
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
        impl_name = getattr(item, "callspec", None) and item.callspec.params.get("impl_name")
        if impl_name is None or fnmatch.fnmatch(impl_name, pattern):
            kept.append(item)
    items[:] = kept


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A run where nothing passed (everything skipped or deselected) must not look green."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    passed = len(reporter.stats.get("passed", [])) if reporter else 0
    if exitstatus == 0 and passed == 0:
        session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED
