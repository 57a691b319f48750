"""cute/fp8 end to end with programmatic dependent launch (``cute_impl.fp8.PROGRAMMATIC_LAUNCH``, issue #37): the
fused quantiser signals ``griddepcontrol.launch_dependents`` as each program starts, the attention kernel is launched
with programmatic stream serialisation and waits (``griddepcontrol.wait``) before its first read of what the
quantiser writes. On the CPU: where the instructions sit in each kernel's sm_90a PTX, the launch attribute in the
compiled host code, and that only the end-to-end launch takes the knob; each rule with a planted bug. On the GPU:
end to end with the knob equals kernel only, bit for bit, with the quantiser's buffers poisoned before every call.
A GPU planted bug (the kernel built without its waits, which may read K and V before the quantiser has written
them) is not a test: on an H200 it gave a differing call in one run and none in five calls of the next
(2026-11-30), a race that shows only sometimes; the waits' placement is what the PTX tests check."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import re
from types import SimpleNamespace

import pytest
import torch

from common.contract.inputs import poison_, poison_all_
from common.contract.problem import Problem
from tests._helpers import MASKS, fa3_case, json_from_child

HAS_CUTLASS = importlib.util.find_spec("cutlass") is not None
needs_cutlass = pytest.mark.skipif(not HAS_CUTLASS, reason="needs nvidia-cutlass-dsl")

WAIT = "griddepcontrol.wait;"
TMA_LOAD = re.compile(r"cp\.async\.bulk\.tensor\.\d+d\.shared::cta\.global")
GLOBAL_LOAD = re.compile(r"\bld\.global\b")
# cudaLaunchAttributeProgrammaticStreamSerialization (cuda_runtime_api's cudaLaunchAttributeID).
PROGRAMMATIC_STREAM_SERIALIZATION = 6
# With ``quantise_q`` the producer loads, before its wait, the (D, D) sign matrix and each consumer's 64 x D Q box in
# bf16: at D = 128 each is two TMA copies (a 256-byte row is two 128-byte swizzle atoms).
CONSUMER_WARPGROUPS = 2
LOADS_BEFORE_WAIT = {True: 2 + 2 * CONSUMER_WARPGROUPS, False: 0}


# ----------------------------------------------------------------------------------------------------
# Rules on the sm_90a PTX and the host code
# ----------------------------------------------------------------------------------------------------
def _roles(ptx: str) -> tuple[str, str]:
    """(producer, consumers): the kernel's text from the producer's ``setmaxnreg.dec`` to the consumers'
    ``setmaxnreg.inc``, and from there on."""
    decrease, increase = ptx.index("setmaxnreg.dec"), ptx.index("setmaxnreg.inc")
    return ptx[decrease:increase], ptx[increase:]


def producer_loads_around_wait(ptx: str) -> tuple[int, int] | None:
    """The producer's TMA loads before its first ``griddepcontrol.wait`` and after it; None without a wait."""
    producer, _ = _roles(ptx)
    at = producer.find(WAIT)
    if at < 0:
        return None
    return len(TMA_LOAD.findall(producer[:at])), len(TMA_LOAD.findall(producer[at:]))


def consumers_read_after_wait(ptx: str) -> bool:
    """The consumers execute a ``griddepcontrol.wait`` before their first global load (the FP8 scales)."""
    _, consumers = _roles(ptx)
    wait, load = consumers.find(WAIT), GLOBAL_LOAD.search(consumers)
    return wait >= 0 and load is not None and wait < load.start()


def launch_attributes(host_ir: str) -> dict[int, int]:
    """{launch attribute id: value} that the compiled host function stores into ``cudaLaunchKernelEx``'s attributes
    (an i32 id, then the value's first i32), read from the LLVM dialect of the function that calls it."""
    (function,) = [text for text in host_ir.split("llvm.func ") if "llvm.call @_cudaLaunchKernelEx(" in text]
    constants = dict(re.findall(r"(%\d+) = llvm\.mlir\.constant\((-?\d+) : i32\) : i32", function))
    field_pattern = (r"(%\d+) = llvm\.getelementptr (%\d+)\[0, ([02])\] : \(!llvm\.ptr\) -> !llvm\.ptr, "
                     r"!llvm\.struct<\(i32, array<4 x i8>, array<64 x i8>\)>")  # fmt: skip
    fields = {result: (entry, int(index)) for result, entry, index in re.findall(field_pattern, function)}
    entries: dict[str, dict[int, int]] = {}
    for value, address in re.findall(r"llvm\.store (%\d+), (%\d+) : i32, !llvm\.ptr", function):
        if address in fields and value in constants:
            entry, index = fields[address]
            entries.setdefault(entry, {})[index] = int(constants[value])
    return {fields_of[0]: fields_of[2] for fields_of in entries.values() if fields_of.keys() >= {0, 2}}


def _wait_moved_below(section: str, pattern: re.Pattern) -> str:
    """``section`` with its first wait moved to the line after the next match of ``pattern`` (a planted bug)."""
    at = section.index(WAIT)
    line_end = section.index("\n", pattern.search(section, at).end())
    return section[:at] + section[at + len(WAIT) : line_end] + "\n" + WAIT + section[line_end:]


def _p1(causal: bool) -> Problem:
    return Problem(2, 16, 8192, 8192, 128, dtype=torch.bfloat16, causal=causal)


@functools.cache
def _kernel_ptx(quantise_q: bool, pdl: bool, causal: bool) -> str:
    from cute_impl import fp8

    return fp8.compile_sm90(_p1(causal), quantise_q=quantise_q, pdl=pdl)[0].ptx


@pytest.mark.cute_compile
@needs_cutlass
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("quantise_q", [True, False], ids=["q-in-kernel", "quantisers-q"])
def test_kernel_waits_before_its_first_read_of_the_quantisers_writes(quantise_q: bool, causal: bool):
    """The producer waits after loading the sign matrix and Q's bf16 boxes (``quantise_q``: Q is the caller's), or
    before its first load (the quantiser's e4m3 Q), and loads K and V after; the consumers wait before reading the
    scales. Without the knob the kernel has no wait."""
    ptx = _kernel_ptx(quantise_q, True, causal)
    loads = producer_loads_around_wait(ptx)
    assert loads is not None, "the producer never waits"
    before, after = loads
    assert before == LOADS_BEFORE_WAIT[quantise_q], f"{before} TMA loads before the wait"
    assert after >= 2, f"K's and V's loads must follow the wait, {after} do"
    assert consumers_read_after_wait(ptx), "a consumer reads global memory before its wait"
    assert WAIT not in _kernel_ptx(quantise_q, False, causal)


@pytest.mark.cute_compile
@needs_cutlass
def test_the_wait_rules_catch_a_missing_or_late_wait(monkeypatch: pytest.MonkeyPatch):
    """Planted bugs: the kernel built with ``griddepcontrol_wait`` emitting nothing (its launch still PDL); the
    producer's wait moved below its next TMA load (K's); the consumers' wait moved below their first global load."""
    import cutlass.cute as cute

    from cute_impl import fp8

    ptx = _kernel_ptx(True, True, True)
    producer, consumers = _roles(ptx)
    late_producer = ptx.replace(producer, _wait_moved_below(producer, TMA_LOAD))
    assert producer_loads_around_wait(late_producer)[0] == LOADS_BEFORE_WAIT[True] + 1
    assert not consumers_read_after_wait(ptx.replace(consumers, _wait_moved_below(consumers, GLOBAL_LOAD)))

    monkeypatch.setattr(cute.arch, "griddepcontrol_wait", lambda **_: None)
    unguarded = fp8.compile_sm90(_p1(True), quantise_q=True, pdl=True)[0].ptx
    assert producer_loads_around_wait(unguarded) is None
    assert not consumers_read_after_wait(unguarded)


@pytest.mark.cute_compile
@needs_cutlass
@pytest.mark.parametrize("pdl", [False, True], ids=["off", "on"])
def test_kernel_is_launched_with_programmatic_stream_serialisation(pdl: bool):
    """The TVM-FFI host function sets cudaLaunchAttributeProgrammaticStreamSerialization to 1 exactly with ``pdl``
    (the off build is the planted bug of the on build's rule: the attribute is there, its value 0)."""
    from cute_impl import fp8, hopper

    config = fp8.fp8_config(_p1(True), fp8.DEFAULT_QUANTISATION, quantise_q=True, pdl=pdl)
    attributes = launch_attributes(str(hopper.KERNELS.kernel(config).ir_module))
    assert attributes.get(PROGRAMMATIC_STREAM_SERIALIZATION) == int(pdl), attributes


_QUANTISER_PROBE = """
import dataclasses, json, re, torch
from common.contract.fp8 import KEY_GROUP, Quantisation, ValueLayout
from common.reporting.static import cubin_resources
from triton_impl import fp8_quantiser
quantisation, layout = Quantisation(block=True, rotation=True), ValueLayout(permuted=True, key_multiple=KEY_GROUP)
rows = {}
for query in (False, True):
    for signal in (False, True):
        default = fp8_quantiser.default_config(128, quantisation, query=query)
        config = dataclasses.replace(default, launch_dependents=signal)
        binary = fp8_quantiser.compile_sm90(128, torch.bfloat16, quantisation, layout, config=config, query=query)[0]
        ptx, signal_text = binary.ptx, "griddepcontrol.launch_dependents"
        usage = max(u["local_bytes"] + u["stack_bytes"] for u in cubin_resources(binary.cubin).values())
        rows[f"query={query} signal={signal}"] = {
            "signals": ptx.count(signal_text), "waits": ptx.count("griddepcontrol.wait"),
            "signal_at": ptx.find(signal_text), "first_load_at": re.search(r"ld\\.global|cp\\.async", ptx).start(),
            "spills": usage, "describe": config.describe()}
print(json.dumps(rows))
"""


def quantiser_signals_first(row: dict) -> bool:
    """One ``launch_dependents``, before the program's first global load, and no wait (the quantiser reads nothing
    its predecessor may still be writing: it is launched without PDL)."""
    return row["signals"] == 1 and row["waits"] == 0 and 0 <= row["signal_at"] < row["first_load_at"]


@pytest.mark.static
def test_quantiser_signals_its_dependents_before_its_first_load():
    """The fused quantiser (K and V only, as cute/fp8 runs it, and Q, K, V) with ``launch_dependents``: one signal
    at the top of the program, no spill; without it, none (the planted bug of the rule)."""
    rows = json_from_child(["-c", _QUANTISER_PROBE], timeout=900)
    for name, row in rows.items():
        assert row["spills"] == 0, f"{name}: {row['spills']} bytes spilled"
        signal = name.endswith("signal=True")
        assert quantiser_signals_first(row) == signal, f"{name}: {row}"
        assert row["describe"].endswith("launch-dependents") == signal


@needs_cutlass
@pytest.mark.parametrize("knob", [False, True], ids=["off", "on"])
def test_only_the_end_to_end_launch_takes_the_knob(knob: bool, monkeypatch: pytest.MonkeyPatch):
    """``launch`` (kernel only: any kernel may precede it) never builds a PDL kernel; the end-to-end launch (after
    the quantiser) builds the kernel with ``pdl`` and the quantiser with ``launch_dependents`` exactly with the knob."""
    from cute_impl import fp8

    built = []
    monkeypatch.setattr(fp8, "PROGRAMMATIC_LAUNCH", knob)
    monkeypatch.setattr(fp8, "FusedQuantiser", lambda *args, config, query: SimpleNamespace(
        config=config, query=query, operands=None, quantisation=fp8.DEFAULT_QUANTISATION))  # fmt: skip
    monkeypatch.setattr(fp8, "quantised_launcher", lambda config, *args, **kwargs: built.append(config))
    problem = Problem(1, 2, 256, 256, 128, dtype=torch.bfloat16, causal=True)
    q = torch.empty(1, 2, 256, 128, dtype=torch.bfloat16)
    kernel_only = fp8.ENTRY.launch(q, q, problem, fp8.DEFAULT_QUANTISATION)
    end_to_end = fp8.ENTRY.launch_end_to_end(q, q, problem, fp8.DEFAULT_QUANTISATION)
    assert [config.pdl for config in built] == [False, knob]
    assert (kernel_only.quantiser.config.launch_dependents, end_to_end.quantiser.config.launch_dependents) == (
        False, knob)  # fmt: skip
    default = dataclasses.replace(end_to_end.quantiser.config, launch_dependents=False)
    assert default == kernel_only.quantiser.config, "the knob changes nothing else of the quantiser"


def test_prepare_end_to_end_builds_the_end_to_end_launch():
    """``Fp8Entry.prepare_end_to_end`` builds ``launch_end_to_end`` where a rung gives one, ``bind`` ``launch``."""
    from triton_impl.fp8_launch import Fp8Entry

    calls = []

    def recorder(name):
        def launch(q, k, problem, quantisation, **kwargs):
            calls.append(name)
            return SimpleNamespace(variant="v", quantise=lambda *inputs: None)

        return launch

    problem = Problem(1, 1, 64, 64, 64)
    entry = Fp8Entry(lambda q, k, v, problem, lengths: problem, recorder("launch"), None, None, "default",
                     launch_end_to_end=recorder("end-to-end"))  # fmt: skip
    q = torch.empty(1, 1, 64, 64)
    entry.prepare_end_to_end(q, q, q, problem)
    entry.bind(q, q, q, problem)
    assert calls == ["end-to-end", "launch"]
    dataclasses.replace(entry, launch_end_to_end=None).prepare_end_to_end(q, q, q, problem)
    assert calls[-1] == "launch"


# ----------------------------------------------------------------------------------------------------
# GPU
# ----------------------------------------------------------------------------------------------------
SHAPES = {
    # One wave of quantiser programs: every program has signalled at once, so the kernel's CTAs start on the SMs
    # the quantiser leaves free, long before it ends; 512 query tiles, so every persistent CTA walks several.
    "p1-like": (2, 8, 8, 4096, 4096),
    "ragged-gqa": (2, 8, 2, 1000, 777),
}
POISON_ROUNDS = 3


def _programmatic_end_to_end(problem: Problem, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """(the end-to-end launch with the knob on, its run()): the quantiser, then the PDL kernel."""
    from cute_impl import fp8
    from triton_impl.fp8_launch import end_to_end_runner

    launch = fp8.ENTRY.launch_end_to_end(q, k, problem, fp8.DEFAULT_QUANTISATION)
    assert launch.config.pdl and launch.quantiser.config.launch_dependents
    return launch, end_to_end_runner(launch, q, k, v)


def _poisoned_call(launch, run, out: torch.Tensor) -> torch.Tensor:
    """One end-to-end call after NaN in O and in every buffer the quantiser writes (K's and V's e4m3 values and
    scales): a kernel that reads them before the quantiser has written them gives NaN or other values."""
    operands = launch.quantiser.operands
    for tensor in (operands.k8, operands.vt8, operands.k_scale, operands.v_scale):
        poison_(tensor)
    poison_all_(out)
    result = run()
    torch.cuda.synchronize()
    return result


@pytest.mark.gpu
@needs_cutlass
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_gpu_programmatic_end_to_end_equals_kernel_only(shape: str, mask: str, monkeypatch: pytest.MonkeyPatch):
    """End to end with the knob (quantiser buffers poisoned before each call) equals kernel only bit for bit."""
    from cute_impl import fp8

    problem, (q, k, v) = fa3_case(SHAPES[shape], mask, seed=5)
    monkeypatch.setattr(fp8, "PROGRAMMATIC_LAUNCH", True)
    expected = fp8.prepare(q, k, v, problem)().clone()
    launch, run = _programmatic_end_to_end(problem, q, k, v)
    out = run()
    for _ in range(POISON_ROUNDS):
        out = _poisoned_call(launch, run, out)
        differing = (out != expected).sum().item()
        assert differing == 0, f"{problem.describe()}: {differing} of {out.numel()} outputs differ from kernel only"
