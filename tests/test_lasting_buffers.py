"""Process-lifetime device buffers (``common.contract.devices.lasting``) stay out of CUDA graph pools.

torch.compile's CUDA graph trees hand a graph's memory pool every allocation of the thread that warms it
up, on any stream; a cache first filled inside a compiled step then leaves its entry in the pool and the
warm-up check fails ("tensor(s) in the cudagraph pool not tracked as outputs"). On the H200, ladder:triton's
compiled StaticCache generate failed so: its last step sees every slot, the mask function returns None, the
step is compiled and warmed up anew, and its plan (no lengths) made Triton's int32 placeholder there.
Two rules, both checkable without a GPU: ``lasting`` builds on a thread other than the caller's, and every
cached function that returns a tensor builds it through ``lasting``.
"""

from __future__ import annotations

import ast
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from common.contract import devices

ROOT = Path(__file__).resolve().parent.parent
# Where the process-lifetime caches of device tensors live (rungs, contract, baselines).
SOURCE_DIRS = ("common", "triton_impl", "cute_impl")
CACHE_DECORATORS = {"cache", "lru_cache"}


def builds_off_thread(lasting: Callable, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Whether ``lasting(factory, "cuda:0")`` runs the factory on a thread other than the caller's (the
    stream set-up, which needs a GPU, replaced by a plain call) and returns what it built."""
    monkeypatch.setattr(devices, "_build_on_own_stream", lambda factory, device: factory())
    built_on = []
    made = lasting(lambda: built_on.append(threading.get_ident()) or "buffer", "cuda:0")
    return made == "buffer" and built_on != [threading.get_ident()]


def test_lasting_builds_on_a_thread_of_its_own(monkeypatch):
    assert builds_off_thread(devices.lasting, monkeypatch)
    # Planted bug: the factory called on the caller's thread (what a warming graph's pool takes).
    assert not builds_off_thread(lambda factory, device: factory(), monkeypatch)


def test_lasting_raises_the_factory_error_and_builds_cpu_buffers_in_place(monkeypatch):
    monkeypatch.setattr(devices, "_build_on_own_stream", lambda factory, device: factory())

    def broken() -> None:
        raise ValueError("factory failed")

    with pytest.raises(ValueError, match="factory failed"):
        devices.lasting(broken, "cuda:0")
    assert devices.lasting(threading.get_ident, "cpu") == threading.get_ident()


def _decorator_name(node: ast.expr) -> str:
    target = node.func if isinstance(node, ast.Call) else node
    return target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")


def cached_tensors_built_in_place(source: str) -> list[str]:
    """Functions of ``source`` under ``functools.cache`` / ``lru_cache`` that return a tensor (their return
    annotation names ``Tensor``) without calling ``lasting``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef) or node.returns is None:
            continue
        if not any(_decorator_name(d) in CACHE_DECORATORS for d in node.decorator_list):
            continue
        calls_lasting = any(
            isinstance(call, ast.Call) and _decorator_name(call) == "lasting" for call in ast.walk(node)
        )
        if "Tensor" in ast.unparse(node.returns) and not calls_lasting:
            found.append(node.name)
    return found


def test_every_cached_device_tensor_is_built_through_lasting():
    offenders = [
        f"{path.relative_to(ROOT)}::{name}"
        for folder in SOURCE_DIRS
        for path in sorted((ROOT / folder).rglob("*.py"))
        for name in cached_tensors_built_in_place(path.read_text())
    ]
    assert not offenders, f"cached tensors built on the caller's thread (use devices.lasting): {offenders}"


def test_the_cache_rule_flags_a_cached_tensor_built_in_place():
    planted = """
@functools.cache
def workspace(device: torch.device) -> torch.Tensor:
    return torch.zeros(16, device=device)

@lru_cache(maxsize=4)
def fine(device: torch.device) -> torch.Tensor:
    return lasting(lambda: torch.zeros(16, device=device), device)

@cache
def not_a_tensor(device: torch.device) -> int:
    return 3
"""
    assert cached_tensors_built_in_place(planted) == ["workspace"]
