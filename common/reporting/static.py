"""Compile kernels for sm_90a without a GPU and read what they use from PTX and cubin.

Both stacks compile for Hopper on a CPU-only machine: Triton through ``triton.compile`` with a
``GPUTarget``, the CuTe DSL through ``cute.compile[GPUArch("sm_90a"), KeepPTX, KeepCUBIN]`` on fake
tensors. Registers, shared memory and spills come from the cubin via the ``cuobjdump`` that ships
with Triton, so nothing here needs a driver.

Triton decides at decoration time whether a kernel is interpreted (``TRITON_INTERPRET=1``) or
compiled, so a process running the interpreter cannot also compile. :func:`static_report_subprocess`
runs the analysis in a clean child process for callers in interpreter mode.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from common.contract.problem import Problem
from common.contract.registry import Implementation, KernelBinary

SM90_CAPABILITY = 90
WARP_SIZE = 32
# Instruction families the ladder is about, as regular expressions over PTX text.
PTX_FEATURES: dict[str, str] = {
    "mma.sync": r"\bmma\.sync\.",
    "wgmma.mma_async": r"\bwgmma\.mma_async",
    "ldmatrix": r"\bldmatrix\.",
    "stmatrix": r"\bstmatrix\.",
    "cp.async": r"\bcp\.async\.(?:ca|cg)\.",
    "cp.async.bulk.tensor": r"\bcp\.async\.bulk\.tensor",
    "mbarrier": r"\bmbarrier\.",
    "setmaxnreg": r"\bsetmaxnreg\.",
    "e4m3 mma": r"\b(?:wgmma\.mma_async|mma\.sync)\S*e4m3",
}


def ptx_features(ptx: str) -> dict[str, bool]:
    """Which instruction families appear in the PTX."""
    return {name: re.search(pattern, ptx) is not None for name, pattern in PTX_FEATURES.items()}


def _cuobjdump() -> str:
    import triton

    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if bundled.exists():
        return str(bundled)
    found = shutil.which("cuobjdump")
    if found is None:
        raise FileNotFoundError("cuobjdump not found (neither in Triton's package nor on PATH)")
    return found


_RESOURCE_LINE = re.compile(r"Function (\S+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def cubin_resources(cubin: bytes) -> dict[str, dict[str, int]]:
    """Per-function registers, stack, static shared and local (spill) bytes of a cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        listing = subprocess.run(
            [_cuobjdump(), "--dump-resource-usage", handle.name], capture_output=True, text=True, check=True
        ).stdout
    return {
        match.group(1): {
            "registers": int(match.group(2)),
            "stack_bytes": int(match.group(3)),
            "static_shared_bytes": int(match.group(4)),
            "local_bytes": int(match.group(5)),
        }
        for match in _RESOURCE_LINE.finditer(listing)
    }


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
        target=GPUTarget("cuda", SM90_CAPABILITY, WARP_SIZE),
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
    ``triton.runtime.jit.MockTensor``; ``kwargs`` holds the constexprs and launch options."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", SM90_CAPABILITY, WARP_SIZE)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound_args, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound_args, specialization, options)
    compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target, options=options.__dict__)
    return _triton_binary(kernel, compiled)


def compile_cute_sm90(
    jit_function: Callable[..., Any], *fake_args: Any, name: str, threads: int, shared_bytes: int | None = None
) -> KernelBinary:
    """Compile a ``@cute.jit`` launcher for sm_90a on fake tensors; keeps PTX and cubin.

    The cubin records only static shared memory; a rung that knows its dynamic shared-memory size
    passes it as ``shared_bytes`` so the tradeoff table shows what a CTA really occupies.
    """
    import cutlass.cute as cute
    from cutlass.base_dsl.compiler import DumpDir

    # KeepPTX/KeepCUBIN also write files; send them to a scratch folder, not the working directory.
    with tempfile.TemporaryDirectory(prefix="cute-sm90-") as scratch:
        options = cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX, cute.KeepCUBIN, DumpDir(scratch)]
        compiled = options(jit_function, *fake_args)
        return KernelBinary(
            name=name,
            ptx=compiled.__ptx__,
            cubin=compiled.__cubin__,
            threads_per_cta=threads,
            shared_bytes=shared_bytes,
        )


@dataclass(frozen=True)
class StaticRow:
    """What one implementation's compiled kernels use, for the tests and the tradeoff table."""

    impl: str
    kernels: int
    compile_s: float
    registers: int
    spill_bytes: int
    # Total shared memory per CTA; None where only the static part is known (CuTe sizes its dynamic
    # shared memory at launch, and the cubin records only the static part).
    shared_bytes: int | None
    threads_per_cta: int
    features: dict[str, bool]
    error: str = ""


def _summarise(impl: Implementation, binaries: list[KernelBinary], seconds: float) -> StaticRow:
    features = {name: False for name in PTX_FEATURES}
    registers = spills = shared = threads = 0
    total_known = all(binary.shared_bytes is not None for binary in binaries)
    for binary in binaries:
        features = {name: features[name] or found for name, found in ptx_features(binary.ptx).items()}
        for usage in cubin_resources(binary.cubin).values() if binary.cubin else ():
            registers = max(registers, usage["registers"])
            # ptxas puts register spills in the stack frame (STACK); LOCAL is other local memory.
            spills = max(spills, usage["stack_bytes"] + usage["local_bytes"])
            shared = max(shared, usage["static_shared_bytes"])
        shared = max(shared, binary.shared_bytes or 0)
        threads = max(threads, binary.threads_per_cta or 0)
    return StaticRow(
        impl.name, len(binaries), seconds, registers, spills, shared if total_known else None, threads, features
    )


def static_row(impl: Implementation, problem: Problem) -> StaticRow:
    """Compile one implementation for sm_90a and summarise it (errors are recorded, not raised)."""
    empty = {name: False for name in PTX_FEATURES}
    if impl.compile_sm90 is None:
        return StaticRow(impl.name, 0, 0.0, 0, 0, 0, 0, empty, error="no sm_90a compile path")
    start = time.perf_counter()
    try:
        binaries = impl.compile_sm90(problem)
    except Exception as error:  # noqa: BLE001 - a compile failure is data for the report
        return StaticRow(impl.name, 0, 0.0, 0, 0, 0, 0, empty, error=f"{type(error).__name__}: {error}")
    return _summarise(impl, binaries, time.perf_counter() - start)


def static_report(problem: Problem) -> list[StaticRow]:
    """Static rows for every registered rung that has a compile path."""
    from common.contract.registry import discover

    available, _ = discover(include_baselines=False)
    return [static_row(impl, problem) for impl in available]


def static_report_subprocess(problem: Problem, timeout_s: float = 1800.0) -> list[StaticRow]:
    """:func:`static_report` in a child process without ``TRITON_INTERPRET`` (see module doc)."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    # A fresh cache directory, so the compile times are cold compiles, not disk-cache hits.
    env["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cold-")
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    spec = json.dumps(
        {
            "batch": problem.batch,
            "heads": problem.heads,
            "seqlen_q": problem.seqlen_q,
            "seqlen_k": problem.seqlen_k,
            "head_dim": problem.head_dim,
            "dtype": problem.dtype_name,
            "causal": problem.causal,
        }
    )
    done = subprocess.run(
        [sys.executable, "-m", "common.reporting.static", spec],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
    )
    if done.returncode != 0:
        raise RuntimeError(f"static analysis failed:\n{done.stderr[-4000:]}")
    return [StaticRow(**row) for row in json.loads(done.stdout.splitlines()[-1])]


def _main(spec_json: str) -> None:
    from common.contract.problem import DTYPE_NAMES

    spec = json.loads(spec_json)
    spec["dtype"] = DTYPE_NAMES[spec["dtype"]]
    rows = static_report(Problem(**spec))
    print(json.dumps([asdict(row) for row in rows]))


if __name__ == "__main__":
    _main(sys.argv[1])
