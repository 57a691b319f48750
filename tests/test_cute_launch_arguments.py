"""What every CuTe rung passes at launch fits the TVM-FFI signature its kernel is compiled with.

Each kernel is compiled once from fake tensors with ``--enable-tvm-ffi`` (``cute_impl._host``); the
compiled function then takes torch tensors, ``None`` and Python scalars, and checks each against the
fakes in compiled code on the GPU. Here, without a GPU, the launches are bound on CPU tensors, every
kernel call is recorded instead of made, and each argument is checked against the parameter the DSL
derives from the fakes (as the compile does): a torch tensor of the dtype and rank, a CUDA device,
the last dimension contiguous and aligned; ``None`` where the configuration compiled a tensor out; a
float or an int for a scalar; no stream (the call takes torch's current one).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import pytest
import torch

pytest.importorskip("cutlass")

from cutlass import Float8E4M3FN, Int32
from cutlass.base_dsl.tvm_ffi_builder import spec
from cutlass.cute._tvm_ffi_args_spec_converter import _tvm_ffi_args_spec_converter
from cutlass.cute.runtime import from_dlpack, make_fake_tensor
from cutlass.cute.typing import AddressSpace

from common.contract.fp8 import KernelOperands
from common.contract.problem import Problem
from cute_impl import _host, decode, fp8, hopper, naive, online, pipelined, tiled
from cute_impl.backward import hopper as hopper_backward
from cute_impl.backward import naive as naive_backward
from cute_impl.backward import tiled as tiled_backward
from cute_impl.backward._device import BackwardOperands

SM_COUNT = 132
Call = tuple[_host.CompiledKernels, Any, tuple[Any, ...]]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    """Every compiled-kernel call made while the fixture is active, recorded instead of compiled and launched."""
    recorded: list[Call] = []

    def recorder(self: _host.CompiledKernels, config: Any) -> Callable[..., None]:
        return lambda *arguments: recorded.append((self, config, arguments))

    monkeypatch.setattr(_host.CompiledKernels, "kernel", recorder)
    return recorded


def signature(kernels: _host.CompiledKernels, config: Any) -> list[spec.Param]:
    """The TVM-FFI parameters the compile of ``config`` declares (the DSL's own conversion of the fakes)."""
    call = kernels.kernel_class(config).__call__
    params, _, _ = _tvm_ffi_args_spec_converter(
        "launch", inspect.signature(call), list(kernels.fake_arguments(config)), {}
    )
    return params


def mismatches(params: list[spec.Param], arguments: tuple[Any, ...]) -> list[str]:
    """What of ``arguments`` the compiled function would refuse (or read wrongly), one line each."""
    *passed, stream = params
    found = [] if isinstance(stream, spec.EnvStream) else [f"the last parameter is {stream.name}, not the env stream"]
    if len(passed) != len(arguments):
        return [*found, f"{len(arguments)} arguments for {len(passed)} parameters"]
    for param, argument in zip(passed, arguments, strict=True):
        found += [f"{param.name}: {problem}" for problem in _argument_problems(param, argument)]
    return found


def _argument_problems(param: spec.Param, argument: Any) -> list[str]:
    if isinstance(param, spec.ConstNone):
        return [] if argument is None else [f"compiled out, given {type(argument).__name__}"]
    if isinstance(param, spec.Var):
        wanted = float if str(param.dtype).startswith("float") else int
        ok = isinstance(argument, wanted) and not isinstance(argument, bool)
        return [] if ok else [f"a {wanted.__name__} for {param.dtype}, given {type(argument).__name__}"]
    if not isinstance(param, spec.Tensor):
        return [f"unexpected parameter kind {type(param).__name__}"]
    if not isinstance(argument, torch.Tensor):
        return [f"a torch tensor, given {type(argument).__name__}"]
    problems = []
    if str(argument.dtype).removeprefix("torch.") != str(param.dtype):
        problems.append(f"dtype {param.dtype}, given {argument.dtype}")
    if param.device_type_name != "cuda":
        problems.append(f"declared on {param.device_type_name}, launched on CUDA tensors")
    if argument.dim() != len(param.shape):
        problems.append(f"rank {len(param.shape)}, given {argument.dim()}")
    elif argument.stride(-1) != 1:
        problems.append(f"a contiguous last dimension, given strides {argument.stride()}")
    if param.data_alignment and argument.data_ptr() % param.data_alignment:
        problems.append(f"{param.data_alignment}-byte alignment")
    return problems


def _inputs(problem: Problem, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, ...]:
    q = torch.zeros(problem.batch, problem.heads, problem.seqlen_q, problem.head_dim, dtype=dtype)
    k = torch.zeros(problem.batch, problem.kv_heads, problem.seqlen_k, problem.head_dim, dtype=dtype)
    return q, k, k.clone()


def _lengths(problem: Problem) -> torch.Tensor:
    return torch.full((problem.batch,), problem.seqlen_k, dtype=torch.int32)


FEATURED = Problem(2, 8, 64, 256, 128, kv_heads=2, causal=True, has_cache_seqlens=True, return_lse=True)
PLAIN = Problem(1, 2, 64, 64, 64)


def _bind(rung: Any, problem: Problem, **options: Any) -> None:
    q, k, v = _inputs(problem)
    lengths = _lengths(problem) if problem.has_cache_seqlens else None
    rung.HOST.bind(q, k, v, problem, cache_seqlens=lengths, **options)()


def _bind_paged(problem: Problem) -> None:
    q = torch.zeros(problem.batch, problem.heads, problem.seqlen_q, problem.head_dim, dtype=torch.bfloat16)
    pages_per_sequence = problem.seqlen_k // problem.page_size
    pool = torch.zeros(problem.batch * pages_per_sequence, problem.page_size, problem.kv_heads, problem.head_dim)
    pool = pool.to(torch.bfloat16)
    table = torch.arange(problem.batch * pages_per_sequence, dtype=torch.int32).view(problem.batch, -1)
    decode.HOST.bind(q, pool, pool.clone(), problem, cache_seqlens=_lengths(problem), block_table=table, num_splits=3)()


def _hopper(problem: Problem) -> None:
    q, k, v = _inputs(problem)
    config = hopper.default_config(problem)
    lengths = _lengths(problem) if problem.has_cache_seqlens else None
    hopper.KERNELS.launcher(config, q, k, v, 1.0, 1.0, sm_count=SM_COUNT, cache_seqlens=lengths)()


def _fp8(problem: Problem) -> None:
    q8, k8, _ = _inputs(problem, torch.float8_e4m3fn)
    vt8 = k8.transpose(2, 3).contiguous()
    blocks = torch.ones(problem.batch, problem.heads, 4), torch.ones(problem.batch, problem.kv_heads, 4)
    operands = KernelOperands(
        q8, k8, vt8, blocks[0], blocks[1], blocks[1].clone(), fp8.DEFAULT_QUANTISATION, fp8.VALUE_LAYOUT
    )
    config = fp8.fp8_config(problem, fp8.DEFAULT_QUANTISATION)
    lengths = _lengths(problem) if problem.has_cache_seqlens else None
    fp8.quantised_launcher(config, operands, problem, sm_count=SM_COUNT, cache_seqlens=lengths)()


# cute/hopper's backward with dQ by a separate kernel (its deterministic variant; the default adds dQ
# into an fp32 buffer, one more argument, then runs its postprocess).
SEPARATE_DQ_PASS = hopper_backward.CANDIDATES[128][0]
# LSE₂ and D by TMA (``hopper_rows.py``): the same host arguments, the rows allocated TMA-aligned.
TMA_ROWS = next(tiles for tiles in hopper_backward.CANDIDATES[128] if tiles.tma_rows)
# dQaccum zeroed by the preprocess: it takes dQaccum too.
ZERO_IN_PREPROCESS = next(tiles for tiles in hopper_backward.CANDIDATES[128] if tiles.zero_in_preprocess)


def _backward(launch: Callable[..., None], problem: Problem, with_dlse: bool) -> None:
    q, k, v = _inputs(problem)
    rows = torch.zeros(problem.batch, problem.heads, problem.seqlen_q)
    tensors = (
        q,
        k,
        v,
        q.clone(),
        q.clone(),
        rows,
        rows.clone() if with_dlse else None,
        q.clone(),
        k.clone(),
        v.clone(),
    )
    launch(BackwardOperands(*tensors), problem, q.device)


LAUNCHES: dict[str, Callable[[], None]] = {
    "naive": lambda: _bind(naive, FEATURED),
    "naive-plain": lambda: _bind(naive, PLAIN),
    "online": lambda: _bind(online, FEATURED),
    "tiled": lambda: _bind(tiled, FEATURED),
    "pipelined": lambda: _bind(pipelined, FEATURED),
    "pipelined-plain": lambda: _bind(pipelined, PLAIN),
    "decode-split": lambda: _bind(decode, FEATURED.with_(seqlen_q=1), num_splits=4),
    "decode-one-split": lambda: _bind(decode, PLAIN.with_(seqlen_q=2), num_splits=1),
    "decode-paged": lambda: _bind_paged(FEATURED.with_(seqlen_q=1, page_size=16)),
    "hopper": lambda: _hopper(FEATURED),
    "hopper-plain": lambda: _hopper(PLAIN),
    "fp8": lambda: _fp8(FEATURED),
    "backward-naive": lambda: _backward(naive_backward._launch, FEATURED.with_(has_cache_seqlens=False), True),
    "backward-tiled": lambda: _backward(tiled_backward._launch, FEATURED.with_(has_cache_seqlens=False), False),
    "backward-hopper": lambda: _backward(hopper_backward._launch, FEATURED.with_(has_cache_seqlens=False), True),
    "backward-hopper-separate-dq": lambda: _backward(
        functools.partial(hopper_backward._launch, tiles=SEPARATE_DQ_PASS),
        FEATURED.with_(has_cache_seqlens=False),
        True,
    ),
    "backward-hopper-tma-rows": lambda: _backward(
        functools.partial(hopper_backward._launch, tiles=TMA_ROWS),
        FEATURED.with_(has_cache_seqlens=False, seqlen_q=77),  # LSE₂ and D as views of padded rows
        True,
    ),
    "backward-hopper-zero-in-preprocess": lambda: _backward(
        functools.partial(hopper_backward._launch, tiles=ZERO_IN_PREPROCESS),
        FEATURED.with_(has_cache_seqlens=False, seqlen_q=77),  # dQaccum to the preprocess as (B, H, n)
        True,
    ),
}


@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_every_launch_argument_fits_the_compiled_signature(launch: str, calls: list[Call]):
    LAUNCHES[launch]()
    assert calls, "no kernel call was made"
    for kernels, config, arguments in calls:
        found = mismatches(signature(kernels, config), arguments)
        assert not found, f"{kernels.kernel_class.__name__} {config}: {found}"


def test_planted_launch_arguments_are_caught(calls: list[Call]):
    """The check refuses what the old DLPack path passed (CuTe tensors; FP8 as uint8), a tensor where
    the configuration compiled one out, a wrong scalar kind, a transposed operand, and a fake in the
    generic address space, which the DSL declares a CPU tensor (hence ``_host.generic_view``)."""
    _fp8(FEATURED)
    kernels, config, arguments = calls[0]
    params = signature(kernels, config)
    assert mismatches(params, arguments) == []

    q8 = arguments[0]
    assert "dtype float8_e4m3fn, given torch.uint8" in " ".join(planted_in(params, arguments, 0, q8.view(torch.uint8)))
    as_cute = from_dlpack(q8.view(torch.uint8), assumed_align=16)
    as_cute.element_type = Float8E4M3FN
    assert "a torch tensor" in " ".join(planted_in(params, arguments, 0, as_cute))
    assert "contiguous last dimension" in " ".join(planted_in(params, arguments, 0, q8.transpose(2, 3)))
    assert "a float" in " ".join(planted_in(params, arguments, len(arguments) - 3, 1))
    assert mismatches(params, arguments[:-1])

    _bind(decode, PLAIN.with_(seqlen_q=1), num_splits=1)
    kernels, config, arguments = calls[-1]
    params = signature(kernels, config)
    lse_index = next(i for i, param in enumerate(params) if param.name == "mLSE")
    assert "compiled out" in " ".join(planted_in(params, arguments, lse_index, torch.zeros(2, 2)))

    undeclared = make_fake_tensor(Int32, (4,), (1,), memspace=AddressSpace.generic, assumed_align=4)
    declared = _host.fake_cache_seqlens()
    converted = [signature_of_one(fake) for fake in (undeclared, declared)]
    assert [param.device_type_name for param in converted] == ["cpu", "cuda"]


def planted_in(params: list[spec.Param], arguments: tuple[Any, ...], index: int, value: Any) -> list[str]:
    return mismatches(params, (*arguments[:index], value, *arguments[index + 1 :]))


def signature_of_one(fake: Any) -> spec.Param:
    def one(tensor: Any) -> None: ...

    params, _, _ = _tvm_ffi_args_spec_converter("one", inspect.signature(one), [fake], {})
    return params[0]


@pytest.mark.cute_compile
def test_the_compiled_kernel_takes_torch_tensors_and_checks_them():
    """The compile goes through TVM-FFI: the result is a TVM-FFI function whose compiled checks refuse
    a tensor on the wrong device by name before anything launches."""
    problem = PLAIN.with_(seqlen_q=1)
    config = decode.decode_config(problem, split=False)
    # The device's own arch, as decode launches (here the DSL's default target): a compile for sm_90a
    # builds no host function without a device that runs it (the DSL's ``_runtime_can_run_compiled``).
    kernels = _host.CompiledKernels(decode.DecodeKernel, decode.fake_arguments)
    compiled = kernels.kernel(config)
    assert compiled.__tvm_ffi_object__() is not None
    q, k, v = _inputs(problem)
    out = torch.empty(problem.batch * problem.kv_heads, problem.kv_group, problem.head_dim, dtype=torch.bfloat16)
    # Every argument between O and the scale is None in this configuration (the fakes less q, k, v, O, scale, stream).
    nones = (None,) * (len(decode.fake_arguments(config)) - 6)
    with pytest.raises(ValueError, match=r"argument #0.*expected device_type=cuda"):
        compiled(q, k, v, out, *nones, problem.scale)


def test_the_environment_manifest_records_the_launch_path():
    """Runs record the TVM-FFI release the CuTe rungs launch through, and whether torch hands it tensors
    through the DLPack exchange API."""
    import tvm_ffi

    from common.measure.environment import manifest

    info = manifest(torch.device("cpu"))
    assert info["apache_tvm_ffi"] == tvm_ffi.__version__
    assert info["torch_dlpack_exchange_api"] is hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
