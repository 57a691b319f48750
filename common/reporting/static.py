"""What kernels compiled for sm_90a use, read from their PTX and cubin, for the tests and the tradeoff table.

Every rung with a ``compile_sm90`` compiles through ``common.toolchain.compile`` (Triton and Gluon with a
``GPUTarget``, the CuTe DSL on fake tensors), so nothing needs a GPU. Registers, shared memory and spills
come from the cubin via the ``cuobjdump`` that ships with Triton, so nothing here needs a driver.

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
from dataclasses import asdict, dataclass
from pathlib import Path

from common.contract.problem import Problem
from common.contract.registry import Implementation
from common.toolchain.compile import KernelBinary

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


# The key-block loop's demand on the pipes of sm_90 (per SM: 4 sub-partitions, each issuing one warp
# instruction per cycle; an exp2 unit of 4 lanes per sub-partition, so a warp's MUFU.EX2 holds it 8
# cycles; dense tensor-core FLOP per cycle per SM by operand type, so H100's 989 / 1979 TFLOP/s at 1.83 GHz).
XU_CYCLES_PER_WARP_EXP2 = 8
TENSOR_FLOPS_PER_CLOCK = {"HGMMA": 4096, "QGMMA": 8192}
_SASS_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Za-z0-9_.]*)([^;]*);")
_GMMA_SHAPE = re.compile(r"^([HQ]GMMA)\.64x(\d+)x(\d+)\.")


@dataclass(frozen=True)
class LoopCensus:
    """One iteration of a kernel's key-block loop (one key block of one warpgroup), from its SASS: each
    of the warpgroup's 4 warps sits on its own sub-partition, so ``instructions`` is the issue cycles
    and ``exp2`` x 8 the exp2-unit cycles it costs each sub-partition, while its GEMMs hold the SM's
    tensor cores ``tensor_cycles``. Whichever is largest bounds the loop however well warps overlap."""

    instructions: int
    exp2: int
    gmma: int
    gmma_flops: int
    tensor_cycles: float

    @property
    def xu_cycles(self) -> int:
        return self.exp2 * XU_CYCLES_PER_WARP_EXP2

    @property
    def limiter(self) -> str:
        demands = {"issue": self.instructions, "exp2 unit": self.xu_cycles, "tensor cores": self.tensor_cycles}
        return max(demands, key=demands.__getitem__)

    def ceiling_tflops(self, sms: int, clock_ghz: float) -> float:
        """TFLOP/s if the limiting pipe never idles."""
        cycles = max(self.instructions, self.xu_cycles, self.tensor_cycles)
        return self.gmma_flops / cycles * sms * clock_ghz * 1e-3


def cubin_sass(cubin: bytes) -> str:
    """The SASS listing of a cubin (``cuobjdump -sass``)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        return subprocess.run([_cuobjdump(), "-sass", handle.name], capture_output=True, text=True, check=True).stdout


def sass_loops(sass: str) -> list[tuple[int, list[str]]]:
    """Every loop of a SASS listing, as (its first address, the opcodes from there to its backward branch): a
    backward branch and the instructions it spans, unless EXIT is among them (then it is no loop but a barrier's
    retry stub after the kernel's end jumping back)."""
    listing = [(int(m.group(1), 16), m.group(2), m.group(3)) for m in _SASS_INSTRUCTION.finditer(sass)]
    loops = []
    for end, (address, opcode, operands) in enumerate(listing):
        target = re.match(r"\s*(0x[0-9a-f]+)", operands)
        if not opcode.startswith("BRA") or target is None or int(target.group(1), 16) > address:
            continue
        start = int(target.group(1), 16)
        body = [op for at, op, _ in listing[: end + 1] if at >= start]
        if "EXIT" not in body:
            loops.append((start, body))
    return loops


def loop_census(sass: str) -> LoopCensus | None:
    """The smallest loop (:func:`sass_loops`) holding both MUFU.EX2 and a warpgroup GEMM: the steady-state
    key-block step. Instructions on a conditional path inside it (the lazy O rescale) count as if taken, so
    ``instructions`` is an upper bound. None without such a loop."""
    best = None
    for _, body in sass_loops(sass):
        gmmas = [shape for op in body if (shape := _GMMA_SHAPE.match(op))]
        if not gmmas or not any(op.startswith("MUFU.EX2") for op in body):
            continue
        if best is None or len(body) < best.instructions:
            flops = [2 * 64 * int(n) * int(k) for _, n, k in (g.groups() for g in gmmas)]
            rates = [TENSOR_FLOPS_PER_CLOCK[g.group(1)] for g in gmmas]
            best = LoopCensus(
                instructions=len(body),
                exp2=sum(op.startswith("MUFU.EX2") for op in body),
                gmma=len(gmmas),
                gmma_flops=sum(flops),
                tensor_cycles=sum(f / r for f, r in zip(flops, rates, strict=True)),
            )
    return best


def cubin_loop_census(cubin: bytes) -> LoopCensus | None:
    """:func:`loop_census` of a cubin's SASS."""
    return loop_census(cubin_sass(cubin))


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


def compile_environment() -> dict[str, str]:
    """This process's environment for a child that compiles: no ``TRITON_INTERPRET`` (see the module
    docstring) and the project root first on ``PYTHONPATH``."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


def static_report_subprocess(problem: Problem, timeout_s: float = 1800.0) -> list[StaticRow]:
    """:func:`static_report` in a child process without ``TRITON_INTERPRET`` (see module doc)."""
    env = compile_environment()
    # A fresh cache directory, so the compile times are cold compiles, not disk-cache hits.
    env["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cold-")
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
