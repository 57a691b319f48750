"""Process-lifetime device buffers (``common.contract.devices.lasting``) stay out of CUDA graph pools.

torch.compile's CUDA graph trees hand a graph's memory pool every allocation of the thread that warms it
up, on any stream; a cache first filled inside a compiled step then leaves its entry in the pool and the
warm-up check fails ("tensor(s) in the cudagraph pool not tracked as outputs"). On the H200, ladder:triton's
compiled StaticCache generate failed so: its last step sees every slot, the mask function returns None, the
step is compiled and warmed up anew, and its plan (no lengths) made Triton's int32 placeholder there.
Two rules, both checkable without a GPU: ``lasting`` builds on a thread other than the caller's, and every
cached function that returns a tensor builds it through ``lasting``.

A third, since ``lasting``'s stream waits for no stream of the caller: its factory reads only host data and other
lasting buffers, so a function that calls ``lasting`` does no device work outside the factory. cute/fp8's sign
matrix broke it (the signs computed on the caller's stream, copied on ``lasting``'s): on a loaded H100 the copy read
the allocation before the signs were written, and the process kept that matrix, one wrong answer in the suite
(2026-12-05, ``results/h100/gpu-suite-2026-12-05/``). The rule is checked in the source, and on the GPU with the
caller's stream held busy while the cached matrices are built.
"""

from __future__ import annotations

import ast
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

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


def offenders_in_the_sources(rule: Callable[[str], list[str]]) -> list[str]:
    """``file::finding`` for each finding of ``rule`` (a source text's findings) in SOURCE_DIRS' Python files."""
    return [
        f"{path.relative_to(ROOT)}::{finding}"
        for folder in SOURCE_DIRS
        for path in sorted((ROOT / folder).rglob("*.py"))
        for finding in rule(path.read_text())
    ]


def test_every_cached_device_tensor_is_built_through_lasting():
    offenders = offenders_in_the_sources(cached_tensors_built_in_place)
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


# Calls that make or move a tensor on the device they are given positionally (``random_hadamard(d, seed, device)``).
DEVICE_POSITIONAL = {"random_hadamard", "to", "cuda"}


def device_work_outside_the_factory(source: str) -> list[str]:
    """``function: call`` for each call, in a function that calls ``lasting``, made outside ``lasting``'s arguments
    that puts a tensor on a device: a ``device=`` keyword, or ``device`` passed to a call in DEVICE_POSITIONAL."""
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, ast.FunctionDef):
            continue
        lasting_calls = [
            node for node in ast.walk(function) if isinstance(node, ast.Call) and _decorator_name(node) == "lasting"
        ]
        if not lasting_calls:
            continue
        inside = {id(node) for call in lasting_calls for argument in call.args for node in ast.walk(argument)}
        for node in ast.walk(function):
            if not isinstance(node, ast.Call) or id(node) in inside or node in lasting_calls:
                continue
            by_keyword = any(keyword.arg == "device" for keyword in node.keywords)
            by_position = _decorator_name(node) in DEVICE_POSITIONAL and any(
                isinstance(argument, ast.Name) and argument.id == "device" for argument in node.args
            )
            if by_keyword or by_position:
                found.append(f"{function.name}: {ast.unparse(node)}")
    return found


def test_no_device_work_outside_a_lasting_factory():
    offenders = offenders_in_the_sources(device_work_outside_the_factory)
    assert not offenders, f"device work on the caller's stream that a lasting factory may read early: {offenders}"


def test_the_factory_rule_flags_the_sign_matrix_that_raced():
    """Planted: cute/fp8's sign matrix as it was before 2026-12-05 (two device calls outside the factory); the
    host-built one and a factory doing its own device work pass."""
    planted = """
@functools.cache
def sign_matrix_transposed(head_dim, seed, dtype, device, paired=False):
    matrix = torch.sign(random_hadamard(head_dim, seed, device)).T
    if paired:
        matrix = matrix[torch.tensor(paired_columns(head_dim), device=device)]
    return lasting(lambda: matrix.to(dtype).contiguous(), device)

@functools.cache
def host_built(head_dim, seed, dtype, device):
    host = torch.sign(random_hadamard(head_dim, seed)).T.to(dtype).contiguous()
    return lasting(lambda: host.to(device), device)

@functools.cache
def on_its_own_stream(size, device):
    counters = lasting(lambda: torch.zeros(size, dtype=torch.int32, device=device), device)
    return counters
"""
    assert device_work_outside_the_factory(planted) == [
        "sign_matrix_transposed: random_hadamard(head_dim, seed, device)",
        "sign_matrix_transposed: torch.tensor(paired_columns(head_dim), device=device)",
    ]


def _stale_then_busy(size: int, device: torch.device) -> None:
    """A freed block of ``size`` fp32 sevens on the current stream (the next such allocation there takes it), then
    that stream held busy for about a tenth of a second."""
    stale = torch.full((size,), 7.0, device=device)
    torch.cuda.synchronize(device)
    del stale
    torch.cuda._sleep(200_000_000)


def _raced_sign_matrix(head_dim: int, seed: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The planted builder: cute/fp8's sign matrix as it was, the signs written on the caller's stream and copied on
    lasting's. Nothing may wait for the held stream before the copy runs, so everything that may wait for the whole
    device is done before the stream is held: a kernel's first launch (lazy module loading: the sign and the copy
    run once first), the rotation's first build (a copy from the host), an allocation on lasting's new stream (a
    cudaMalloc: the copy's destination is allocated first) and the process's first side stream (torch's pool of
    streams: one lasting build first). The signs then go into a block of sevens finished before the stream was held.
    Without these the planted race passed on an H100 and an H200 (2026-12-06)."""
    from common.contract.devices import lasting
    from common.contract.fp8 import random_hadamard

    lasting(lambda: None, device)
    rotation = random_hadamard(head_dim, seed, device)
    matrix = torch.sign(rotation)
    copied = torch.empty(head_dim, head_dim, dtype=dtype, device=device).copy_(matrix.T)
    matrix.fill_(7.0)
    torch.cuda.synchronize(device)
    torch.cuda._sleep(200_000_000)
    torch.sign(rotation, out=matrix)
    return lasting(lambda: copied.copy_(matrix.T), device)


@pytest.mark.gpu
@pytest.mark.parametrize("paired", [False, True], ids=["plain", "paired"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_sign_matrices_built_while_the_callers_stream_is_busy(dtype: torch.dtype, paired: bool):
    """cute/fp8's and the quantiser's cached sign matrices, built while the caller's stream still has a tenth of a
    second of work queued, equal the host's. Planted: the raced builder under the same conditions reads the stale
    block instead of the signs."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from common.contract.fp8 import random_hadamard
    from cute_impl import fp8
    from cute_impl._fp8_query import paired_columns
    from triton_impl import fp8_quantiser

    device, head_dim, seed = torch.device("cuda", torch.cuda.current_device()), 128, 20261205
    expected = torch.sign(random_hadamard(head_dim, seed)).T
    if paired:
        expected = expected[torch.tensor(paired_columns(head_dim))]
    raced = _raced_sign_matrix(head_dim, seed, dtype, device)
    torch.cuda.synchronize(device)
    assert not torch.equal(raced.cpu(), torch.sign(random_hadamard(head_dim, seed)).T.to(dtype)), "planted raced"

    fp8.sign_matrix_transposed.cache_clear()
    fp8_quantiser._rotation_operand_tensor.cache_clear()
    _stale_then_busy(head_dim * head_dim, device)
    built = fp8.sign_matrix_transposed(head_dim, seed, dtype, device, paired=paired)
    signs, magnitude = fp8_quantiser._rotation_operand_tensor(head_dim, seed, "tensor_core", dtype, device)
    torch.cuda.synchronize(device)
    assert torch.equal(built.cpu(), expected.to(dtype))
    assert torch.equal(signs.cpu(), torch.sign(random_hadamard(head_dim, seed)).to(dtype))
    assert magnitude == random_hadamard(head_dim, seed)[0, 0].abs().item()
