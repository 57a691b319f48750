"""Compile kernels for sm_90a without a GPU: Triton and Gluon through ``triton.compile`` with a
``GPUTarget``, the CuTe DSL through ``cute.compile[GPUArch("sm_90a"), KeepPTX, KeepCUBIN]`` on fake
tensors. Each returns :class:`KernelBinary` records; ``common.reporting.static`` reads what they use.

Triton decides at decoration time whether a kernel is interpreted (``TRITON_INTERPRET=1``) or
compiled, so these compile only in a process without the interpreter (see ``common.reporting.static``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from common.toolchain.arch import SM90_TARGET, SM90A, WARP_SIZE


@dataclass(frozen=True)
class KernelBinary:
    """One kernel compiled for sm_90a: its PTX text and, when available, its cubin."""

    name: str
    ptx: str
    cubin: bytes | None = None
    threads_per_cta: int | None = None
    shared_bytes: int | None = None


def compile_triton_sm90(
    kernel: Any,
    signature: Mapping[str, str],
    constexprs: Mapping[str, Any],
    *,
    num_warps: int | None = None,
    num_stages: int | None = None,
    aligned: tuple[str, ...] = (),
    options: Mapping[str, Any] | None = None,
    source_type: Any = None,
) -> KernelBinary:
    """Compile a ``@triton.jit`` kernel for sm_90a. ``aligned`` names pointer/int args divisible by 16;
    ``options`` (Triton's compile options, e.g. ``num_warps``, ``ptx_options``) replaces the two counts;
    ``source_type`` is Gluon's ``GluonASTSource`` for ``@gluon.jit`` kernels (default: Triton's)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    full_signature = {**signature, **{name: "constexpr" for name in constexprs}}
    arg_names = kernel.arg_names
    attrs = {(arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned}
    source = (source_type or ASTSource)(kernel, full_signature, dict(constexprs), attrs)
    compiled = triton.compile(
        source,
        target=GPUTarget("cuda", SM90_TARGET, WARP_SIZE),
        options=dict(options or {"num_warps": num_warps, "num_stages": num_stages}),
    )
    return _triton_binary(kernel, compiled)


def _triton_binary(kernel: Any, compiled: Any) -> KernelBinary:
    """The PTX, cubin and launch shape of ``triton.compile``'s result for ``kernel``."""
    return KernelBinary(
        name=kernel.__name__,
        ptx=compiled.asm["ptx"],
        cubin=compiled.asm["cubin"],
        threads_per_cta=compiled.metadata.num_warps * WARP_SIZE,
        shared_bytes=compiled.metadata.shared,
    )


def compile_triton_sm90_launch(kernel: Any, *args: Any, **kwargs: Any) -> KernelBinary:
    """Compile a ``@triton.jit`` kernel for sm_90a as a launch ``kernel[grid](*args, **kwargs)`` would
    build it: Triton's own launch binder specialises the argument values (integers equal to 1 become
    constants, integers and pointers divisible by 16 get the divisibility hint, tuples element by
    element), so the binary is the one the GPU runs for those values. Pointers may be CPU tensors or
    ``triton.runtime.jit.MockTensor``; ``kwargs`` holds the constexprs and launch options. A
    ``@gluon.jit`` kernel compiles as Gluon (``GluonASTSource``)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", SM90_TARGET, WARP_SIZE)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound_args, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound_args, specialization, options)
    source_type = GluonASTSource if isinstance(kernel, GluonJITFunction) else ASTSource
    source = source_type(kernel, signature, constexprs, attrs)
    compiled = triton.compile(source, target=target, options=options.__dict__)
    return _triton_binary(kernel, compiled)


def compile_cute_sm90(
    jit_function: Callable[..., Any],
    *fake_args: Any,
    name: str,
    threads: int,
    shared_bytes: int | None = None,
    options: tuple[Any, ...] = (),
) -> KernelBinary:
    """Compile a ``@cute.jit`` launcher for sm_90a on fake tensors; keeps PTX and cubin.

    The cubin records only static shared memory; a rung that knows its dynamic shared-memory size
    passes it as ``shared_bytes`` so the tradeoff table shows what a CTA really occupies. ``options``:
    the compile options of the launches (the CuTe rungs': ``cute.EnableTVMFFI``), so that this is
    their compile.
    """
    import cutlass.cute as cute
    from cutlass.base_dsl.compiler import DumpDir

    # KeepPTX/KeepCUBIN also write files; send them to a scratch folder, not the working directory.
    with tempfile.TemporaryDirectory(prefix="cute-sm90-") as scratch:
        compile_for = cute.compile[(cute.GPUArch(SM90A), cute.KeepPTX, cute.KeepCUBIN, DumpDir(scratch), *options)]
        compiled = compile_for(jit_function, *fake_args)
        return KernelBinary(
            name=name,
            ptx=compiled.__ptx__,
            cubin=compiled.__cubin__,
            threads_per_cta=threads,
            shared_bytes=shared_bytes,
        )
