"""``triton_impl._host.PreparedLaunch``: a bound call's second and later launches skip Triton's JIT.

CPU: the arguments a direct launch hands the compiled kernel are the JIT's (every parameter in signature order,
constexprs from the options in their places, defaults applied, launch options left out), a missing argument is
refused; with a stand-in JIT and compiled kernel, the first call goes through the JIT with the caller's grid,
arguments and options and later calls through the compiled kernel with a three-axis grid, ``DIRECT_LAUNCH`` off
sends every call through the JIT, and a JIT that returns no compiled kernel (the interpreter) is called every time;
under ``TRITON_INTERPRET`` a real kernel's repeated calls stay right. GPU (``gpu``): triton/decode and gluon/decode
(the split, balanced and merge launches) against fp64 on a poisoned output after their JIT launch, bit for bit
equal to every call through the JIT, the direct path taken; a planted direct launch with K and V swapped fails
the check.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import triton
import triton.language as tl

from common.contract.check import check_on_inputs, run_poisoned
from common.contract.devices import triton_interpreting
from common.contract.inputs import make_inputs, make_paged_kv
from common.contract.problem import Problem
from triton_impl import _host
from triton_impl import decode as triton_decode
from triton_impl.gluon import decode as gluon_decode


@triton.jit
def _scale_kernel(X, Out, n, factor, BLOCK: tl.constexpr, SHIFT: tl.constexpr = 0.0):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    tl.store(Out + offsets, tl.load(X + offsets, mask=inside) * factor + SHIFT, mask=inside)


class StandInCompiled:
    """What the JIT returns on a GPU: indexing by a grid gives a launcher of the bound arguments."""

    def __init__(self, calls: list):
        self.calls = calls

    def __getitem__(self, grid: tuple[int, ...]):
        return lambda *arguments: self.calls.append(("direct", grid, arguments))


class StandInJit:
    """A JIT function with ``_scale_kernel``'s signature that records its calls and returns ``compiled``."""

    fn = staticmethod(_scale_kernel.fn)

    def __init__(self, compiled: object):
        self.compiled, self.calls = compiled, []

    def __getitem__(self, grid: tuple[int, ...]):
        def launch(*args, **options):
            self.calls.append(("jit", grid, args, options))
            return self.compiled

        return launch


def test_bound_arguments_are_the_jits_in_signature_order() -> None:
    options = {"BLOCK": 64, "num_warps": 4, "num_stages": 2}
    arguments = _host.bound_arguments(_scale_kernel, ("x", "out", 100, 2.0), options)
    assert arguments == ("x", "out", 100, 2.0, 64, 0.0), "constexprs in place, the default applied, launch options out"
    with pytest.raises(TypeError, match="factor"):
        _host.bound_arguments(_scale_kernel, ("x", "out", 100), options)


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "jit-only"])
def test_first_call_through_the_jit_then_the_compiled_kernel(direct: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_host, "CompiledKernel", StandInCompiled)
    monkeypatch.setattr(_host, "DIRECT_LAUNCH", direct)
    direct_calls: list = []
    kernel = StandInJit(StandInCompiled(direct_calls))
    launch = _host.PreparedLaunch(kernel, (7,), ("x", "out", 100, 2.0), {"BLOCK": 64, "num_warps": 4})
    for _ in range(3):
        launch()
    assert kernel.calls[0] == ("jit", (7,), ("x", "out", 100, 2.0), {"BLOCK": 64, "num_warps": 4})
    if direct:
        assert len(kernel.calls) == 1
        assert direct_calls == [("direct", (7, 1, 1), ("x", "out", 100, 2.0, 64, 0.0))] * 2
    else:
        assert len(kernel.calls) == 3 and not direct_calls


def test_a_jit_without_a_compiled_kernel_is_called_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_host, "CompiledKernel", StandInCompiled)
    kernel = StandInJit(None)
    launch = _host.PreparedLaunch(kernel, (1,), ("x", "out", 4, 1.0), {"BLOCK": 16})
    launch()
    launch()
    assert [call[0] for call in kernel.calls] == ["jit", "jit"]


def test_repeated_calls_under_the_interpreter_stay_right() -> None:
    if not triton_interpreting():
        pytest.skip("the interpreter's path; on a GPU the decode tests below cover the compiled one")
    x = torch.arange(100, dtype=torch.float32)
    out = torch.full_like(x, float("nan"))
    launch = _host.PreparedLaunch(_scale_kernel, (triton.cdiv(100, 32),), (x, out, 100, 3.0), {"BLOCK": 32})
    for _ in range(2):
        out.fill_(float("nan"))
        launch()
        assert torch.equal(out, x * 3.0)


# ----------------------------------------------------------------------------------------------------
# GPU: the decode rungs' launches after their first
# ----------------------------------------------------------------------------------------------------
# (B, H, Hkv, Sq, Sk, D, ragged, page_size): the split kernel with the merge kernel (one full sequence, many
# splits), the balanced split (ragged) contiguous and paged, a speculative step.
GPU_CASES = [
    (1, 32, 8, 1, 4096, 128, False, 0),
    (4, 16, 2, 1, 20000, 64, True, 0),
    (4, 16, 2, 1, 20000, 64, True, 32),
    (2, 8, 8, 4, 3000, 128, True, 0),
]
RUNGS = {"triton/decode": triton_decode, "gluon/decode": gluon_decode}


def _gpu_inputs(case: tuple) -> tuple[Problem, dict, tuple]:
    batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim, ragged, page_size = case
    problem = Problem(
        batch, heads, seqlen_q, seqlen_k, head_dim, dtype=torch.bfloat16, causal=True, kv_heads=kv_heads,
        causal_alignment="bottom_right", has_cache_seqlens=ragged, return_lse=True, page_size=page_size,
    )  # fmt: skip
    q, k, v = make_inputs(problem, seed=7, device="cuda", offset=0.5)
    extra = {}
    if ragged:
        lengths = [seqlen_k, seqlen_k // 7, 0, seqlen_k // 2 + 3][:batch]
        extra["cache_seqlens"] = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    if page_size:
        k, v, extra["block_table"] = make_paged_kv(problem, k, v, seed=7)
    return problem, extra, (q, k, v)


def _prepared_launches(run: object) -> list[_host.PreparedLaunch]:
    """The PreparedLaunch objects a decode rung's ``run`` calls (a closure's cells or a GluonDecode's fields)."""
    if inspect.isfunction(run):
        values = [cell.cell_contents for cell in run.__closure__ or ()]
    else:
        values = list(vars(run).values())
    return [value for value in values if isinstance(value, _host.PreparedLaunch)]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=[f"b{c[0]}-hkv{c[2]}-sq{c[3]}-sk{c[4]}-p{c[7]}" for c in GPU_CASES])
@pytest.mark.parametrize("rung", sorted(RUNGS))
def test_gpu_direct_launches_match_fp64_and_the_jit(rung: str, case: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    module = RUNGS[rung]
    problem, extra, (q, k, v) = _gpu_inputs(case)
    result = check_on_inputs(module.IMPLEMENTATION, q, k, v, problem, **extra)
    assert result.ok, f"{rung} {problem.describe()}: {result.summary()}"
    run = module.IMPLEMENTATION.prepare(q, k, v, problem, **extra)
    launches = _prepared_launches(run)
    assert launches and all(launch._launch is not None for launch in launches), "the warm-up kept no compiled kernel"
    direct = [t.clone() for t in run_poisoned(run)]
    monkeypatch.setattr(_host, "DIRECT_LAUNCH", False)
    through_jit = run_poisoned(module.IMPLEMENTATION.prepare(q, k, v, problem, **extra))
    assert all(map(torch.equal, direct, through_jit)), "a direct launch differs from the JIT's"


@pytest.mark.gpu
def test_gpu_planted_direct_launch_with_k_and_v_swapped_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    problem, extra, (q, k, v) = _gpu_inputs(GPU_CASES[1])
    real_bound_arguments = _host.bound_arguments

    def k_and_v_swapped(kernel: triton.JITFunction, args: tuple, options: dict) -> tuple:
        arguments = list(real_bound_arguments(kernel, args, options))
        arguments[1], arguments[2] = arguments[2], arguments[1]
        return tuple(arguments)

    monkeypatch.setattr(_host, "bound_arguments", k_and_v_swapped)
    result = check_on_inputs(triton_decode.IMPLEMENTATION, q, k, v, problem, **extra)
    assert not result.ok, f"K and V swapped in the direct launch passed ({result.summary()})"
