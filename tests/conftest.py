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


# trylast: after pytest-xdist's worker hook, whose group suffix _group_by_xdist_mark completes.
@pytest.hookimpl(trylast=True)
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
    if config.getoption("loadgroup", False):
        _group_by_xdist_mark(items)


def _group_by_xdist_mark(items: list[pytest.Item]) -> None:
    """pytest-xdist's --dist loadgroup sends the tests of one xdist_group to one worker by reading "@group" at the end
    of the node ids its workers report; its worker adds the suffix by assigning ``item._nodeid``. pytest 9 computes
    ``nodeid`` from ``item._id`` instead, so under pytest 9.2 + xdist 3.8 (what the README's install resolves,
    2026-12-01) the assignment was lost, no test was grouped, and each group's builds ran once per worker. The suffix
    is added here where it is missing (pytest 8 keeps xdist's own)."""
    for item in items:
        names = {str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                 for mark in item.iter_markers("xdist_group")}  # fmt: skip
        if names and "@" not in item.nodeid:
            from _pytest.nodeid import coerce_node_id

            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(sorted(names))}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A run where nothing passed (everything skipped or deselected) must not look green."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    passed = len(reporter.stats.get("passed", [])) if reporter else 0
    if exitstatus == 0 and passed == 0:
        session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED
