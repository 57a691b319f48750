"""Every registered implementation x dtype x head dim x (Sq, Sk) class on an sm_90 device: the capability
check's verdict and, where a Triton or Gluon rung accepts, what its sm_90a builds use.

A rung that accepts a problem must be able to launch it: its kernel and the kernels it runs on its inputs
(``Implementation.compile_input_transform_sm90``) within sm_90's shared memory and registers. Run in a
process without ``TRITON_INTERPRET`` (the checks then see what a GPU process sees, and Triton compiles):

    python -m tests.capability_matrix                  # JSON rows on the last line of stdout
    python -m tests.capability_matrix --stacks triton  # the Triton rungs' rows only
    python -m tests.capability_matrix --impls triton/fp8,gluon/fp8  # those rungs' rows only
    python -m tests.capability_matrix --plant-fp8-d256 # triton/fp8's check forced to accept D=256

No GPU is needed: the device is an H200 as the checks read it (``pretend_sm90``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from types import SimpleNamespace
from unittest import mock

import torch

from common.contract.problem import Problem
from common.contract.registry import Implementation, KernelBinary, discover
from common.toolchain.arch import SM90_SHARED_MEMORY_BYTES

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
HEAD_DIMS = (64, 128, 256)
# (Sq, Sk) classes: a decode step, a speculative or chunked step, a square prefill, a ragged prefill; and
# (Sq, Sk, page_size) decode steps over a paged KV cache, with pages smaller than a key block (vLLM's
# 16) and larger (256).
SEQLEN_CLASSES = {
    "decode": (1, 4096), "chunk": (16, 1000), "prefill": (128, 128), "ragged": (77, 1000),
    "paged-16": (1, 4096, 16), "paged-256": (1, 4096, 256),
}  # fmt: skip
COMPILED_STACKS = ("triton", "gluon")
# SDPA's check is a launch of the backend on the device (a probe), so it cannot accept what then fails
# to launch, and it cannot be asked without a GPU: the matrix leaves it out.
PROBING_STACKS = ("sdpa",)
# sm_90's register limits: 255 a thread (ptxas's ceiling) and a 64K-register file a CTA may fill.
MAX_REGISTERS_PER_THREAD = 255
REGISTERS_PER_CTA = 65536
H200 = SimpleNamespace(
    name="NVIDIA H200",
    major=9,
    minor=0,
    multi_processor_count=132,
    shared_memory_per_block_optin=SM90_SHARED_MEMORY_BYTES,
    total_memory=141 * 2**30,
)


@contextmanager
def pretend_sm90() -> Iterator[None]:
    """The torch.cuda queries the capability checks make, answered as an H200 would."""
    answers = {
        "get_device_capability": lambda device=None: (H200.major, H200.minor),
        "get_device_properties": lambda device=None: H200,
        "get_device_name": lambda device=None: H200.name,
        "mem_get_info": lambda device=None: (H200.total_memory, H200.total_memory),
        "is_available": lambda: True,
    }
    with ExitStack() as patches:
        for name, answer in answers.items():
            patches.enter_context(mock.patch.object(torch.cuda, name, answer))
        yield


def problem_for(dtype: torch.dtype, head_dim: int, seqlens: tuple[int, ...]) -> Problem:
    """A causal GQA problem of this class. Aligned top-left in every class, so that a rung's build is the
    same for the four unpaged ones (its constexprs do not change with Sq and Sk) and the matrix compiles
    each once: the alignment moves the diagonal by a runtime offset, not the shared memory or the
    registers. A third entry is a page size: the cache is paged (with the lengths that paging needs)."""
    seqlen_q, seqlen_k, *page_size = seqlens
    paging = {"page_size": page_size[0], "has_cache_seqlens": True} if page_size else {}
    return Problem(2, 8, seqlen_q, seqlen_k, head_dim, dtype=dtype, causal=True, kv_heads=2, **paging)


def _overflows(binary: KernelBinary) -> list[str]:
    """What keeps ``binary`` from launching on sm_90: shared memory or registers beyond the limits."""
    from common.reporting.static import cubin_resources

    found = []
    if binary.shared_bytes is not None and binary.shared_bytes > SM90_SHARED_MEMORY_BYTES:
        found.append(f"{binary.name}: {binary.shared_bytes:,} bytes of shared memory > {SM90_SHARED_MEMORY_BYTES:,}")
    threads = binary.threads_per_cta or 0
    for function, usage in (cubin_resources(binary.cubin) if binary.cubin else {}).items():
        registers = usage["registers"]
        if registers > MAX_REGISTERS_PER_THREAD or registers * threads > REGISTERS_PER_CTA:
            found.append(f"{function}: {registers} registers x {threads} threads > {REGISTERS_PER_CTA} a CTA")
    return found


def verdict(impl: Implementation, case: str, problem: Problem) -> dict:
    """One row: the check's answer and, for an accepted Triton or Gluon rung, why its builds cannot
    launch (``overflows``); ``error`` when the check or a compile raised instead of answering."""
    row = {"impl": impl.name, "case": f"{case} {problem.describe()}", "accepted": False, "reason": ""}
    row.update(overflows=[], error="")
    try:
        row["accepted"], row["reason"] = impl.check(problem, torch.device("cuda"))
        if row["accepted"] and impl.stack in COMPILED_STACKS:
            builds = [impl.compile_sm90, impl.compile_input_transform_sm90]
            binaries = [binary for build in builds if build is not None for binary in build(problem)]
            row["overflows"] = [found for binary in binaries for found in _overflows(binary)]
    except Exception as error:  # noqa: BLE001 - an exception is the finding this matrix looks for
        row["error"] = f"{type(error).__name__}: {error}"
    return row


def matrix(
    implementations: list[Implementation],
    dtypes: tuple[torch.dtype, ...] = DTYPES,
    head_dims: tuple[int, ...] = HEAD_DIMS,
    cases: tuple[str, ...] = tuple(SEQLEN_CLASSES),
) -> list[dict]:
    """A row for every implementation x dtype x head dim x (Sq, Sk) class, on the pretended H200."""
    with pretend_sm90():
        return [
            verdict(impl, case, problem_for(dtype, head_dim, SEQLEN_CLASSES[case]))
            for impl in implementations
            for dtype in dtypes
            for head_dim in head_dims
            for case in cases
        ]


def implementations() -> list[Implementation]:
    """Every registered implementation whose check answers without a GPU (all but ``PROBING_STACKS``)."""
    return [impl for impl in discover()[0] if impl.stack not in PROBING_STACKS]


def planted_fp8_d256() -> list[Implementation]:
    """triton/fp8 alone, its check forced to accept D=256 (bf16, the decode step's head dim of issue #38)."""
    (fp8,) = [impl for impl in discover(include_baselines=False)[0] if impl.name == "triton/fp8"]
    real = fp8.supports

    def accepts_d256(problem: Problem, device: torch.device) -> tuple[bool, str]:
        return (True, "") if problem.head_dim == 256 else real(problem, device)

    return [dataclasses.replace(fp8, supports=accepts_d256)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plant-fp8-d256", action="store_true", help="triton/fp8 accepting D=256 (a planted bug)")
    parser.add_argument("--stacks", default="", help="comma-separated stacks whose rows to make (default: all)")
    parser.add_argument("--impls", default="", help="comma-separated implementations whose rows to make (default: all)")
    args = parser.parse_args()
    if args.plant_fp8_d256:
        rows = matrix(planted_fp8_d256(), (torch.bfloat16,), (256,), ("decode",))
    else:
        stacks, names = (set(filter(None, text.split(","))) for text in (args.stacks, args.impls))
        chosen = [impl for impl in implementations() if (not stacks or impl.stack in stacks)
                  and (not names or impl.name in names)]  # fmt: skip
        unknown = names - {impl.name for impl in implementations()}
        if unknown:
            parser.error(f"--impls names no registered implementation: {', '.join(sorted(unknown))}")
        rows = matrix(chosen)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
