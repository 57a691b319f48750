"""triton/pipelined tiles under the installed Triton, in one process (issue #16, fourth stop).

Each candidate (a tile, optionally extra compile options) is compiled for both masks, checked
on a ragged problem (B=1 H=16 Sq=1008 Sk=1232 D=128 bf16, causal and not: poisoned output, fp64 reference, SDPA
yardstick, ``common.contract.check``; Triton specialises integers on % 16, so the checked binary is the timed one),
then timed at P1 (B=2 H=16 S=8192 D=128 bf16) with ``common.measure.timing.time_cuda`` (L2 flushed), ROUNDS
interleaved rounds in rotated order, median. Candidates that spill, exceed the device's shared memory or fail the
check are reported and not timed. One JSON line per result on stdout and in $OUT/p16-<triton version>.log.

usage (project root):  python -m bench.pipelined_tiles [--only name,name] [--rounds 3] [--dry]
  --dry compiles every candidate for sm_90a without a GPU (registers, stack, shared memory) and times nothing.

Produced results/h200/triton-3.9-rungs/pipelined-tiles/p16-*.log. Those runs also timed
``unroll2@128x64w8s2``, a scratch copy of the kernel with its unmasked loop unrolled twice (5 CTA
barriers per 2 blocks under 3.9); that copy was not kept (docs/perf-log.md, "Fourth stop").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from pathlib import Path

import torch
import triton

from bench import require_gpu
from common.contract.problem import Problem
from triton_impl import pipelined
from triton_impl._host import POINTER_ALIGNED, pointer_arguments, pointer_signature

RELEASE = triton.__version__
RAGGED = {"batch": 1, "heads": 16, "seqlen_q": 1008, "seqlen_k": 1232, "head_dim": 128, "dtype": torch.bfloat16}


@dataclasses.dataclass(frozen=True)
class Candidate:
    name: str
    tile: tuple[int, int, int, int]  # BLOCK_M, BLOCK_N, num_warps, num_stages
    options: tuple[tuple[str, str], ...] = ()  # extra Triton compile options
    releases: tuple[str, ...] = ("3.6", "3.9")


def _tile_name(tile: tuple[int, int, int, int]) -> str:
    return "{}x{}w{}s{}".format(*tile)


TILES = [
    (128, 128, 8, 3),  # the default (both masks under 3.9)
    (128, 128, 8, 2),
    (128, 64, 8, 3),
    (128, 64, 8, 2),
    (128, 64, 8, 4),
    (64, 128, 4, 2),
    (64, 64, 4, 3),
    (64, 64, 4, 2),
    (64, 64, 4, 4),
    (64, 32, 4, 3),
]
CANDIDATES = [Candidate(_tile_name(tile), tile) for tile in TILES] + [
    # Triton 3.9's ptxas with the register allocator at level 4 instead of the forced 2 (hopper/fp8's override).
    Candidate(
        "128x128w8s3+ra4", (128, 128, 8, 3), options=(("ptx_options", "--regAllocOptLevel=4"),), releases=("3.9",)
    ),
]


def launch_options(candidate: Candidate, causal: bool) -> dict:
    block_m, block_n, warps, stages = candidate.tile
    return {"CAUSAL": causal, "HEAD_DIM": 128, "BLOCK_M": block_m, "BLOCK_N": block_n,
            "num_warps": warps, "num_stages": stages, **dict(candidate.options)}  # fmt: skip


class Log:
    def __init__(self) -> None:
        out = Path(os.environ.get("OUT", "."))
        out.mkdir(parents=True, exist_ok=True)
        self.file = open(out / f"p16-{RELEASE}.log", "a")  # noqa: SIM115

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.file.write(text + "\n")
        self.file.flush()

    def record(self, **fields) -> None:
        self.say(json.dumps({"triton": RELEASE, **fields}))


def dry(candidates: list[Candidate], log: Log) -> None:
    """Compile each candidate for sm_90a (no GPU): registers, stack bytes, shared memory."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from common.reporting.static import cubin_resources

    for candidate in candidates:
        kernel = pipelined._pipelined_kernel
        for causal in (False, True):
            options = launch_options(candidate, causal)
            constexprs = {name: options.pop(name) for name in ("CAUSAL", "HEAD_DIM", "BLOCK_M", "BLOCK_N")}
            signature = {**pointer_signature(torch.bfloat16), **{name: "constexpr" for name in constexprs}}
            attrs = {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in POINTER_ALIGNED}
            start = time.time()
            compiled = triton.compile(
                ASTSource(kernel, signature, constexprs, attrs), target=GPUTarget("cuda", 90, 32), options=options
            )
            resources = next(iter(cubin_resources(compiled.asm["cubin"]).values()))
            log.record(candidate=candidate.name, causal=causal, dry=True, regs=resources["registers"],
                       stack=resources["stack_bytes"], smem=compiled.metadata.shared,
                       compile_s=round(time.time() - start, 1))  # fmt: skip


def runner(kernel, candidate: Candidate, q, k, v, problem: Problem):
    """run() launching ``kernel`` with the candidate's tile on validated q, k, v; returns O."""
    from common.contract.validation import kernel_operand

    q, k, v = (kernel_operand(t) for t in (q, k, v))
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    args = pointer_arguments(q, k, v, out, problem)
    options = launch_options(candidate, problem.causal)
    grid = (triton.cdiv(problem.seqlen_q, candidate.tile[0]), problem.batch * problem.heads)

    def run() -> torch.Tensor:
        kernel[grid](*args, **options)
        return out

    run.args, run.options = args, options
    return run


def resources(kernel, run) -> dict:
    """Registers, spills and shared memory of the binary ``run`` launches (compiled by its first call)."""
    run()
    torch.cuda.synchronize()
    compiled = kernel.warmup(*run.args, grid=(1,), **run.options)
    compiled._init_handles()
    return {"regs": compiled.n_regs, "spills": compiled.n_spills, "smem": compiled.metadata.shared}


def measure(candidates: list[Candidate], rounds: int, log: Log) -> None:
    from common.contract.check import check_implementation
    from common.contract.inputs import make_inputs
    from common.measure.timing import tflops, time_cuda

    budget = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    p1 = {causal: Problem.canonical(8192, causal=causal) for causal in (False, True)}
    inputs = {causal: make_inputs(p1[causal], seed=0, device="cuda") for causal in (False, True)}
    runners, eligible = {}, {}
    for candidate in candidates:
        kernel = pipelined._pipelined_kernel
        for causal in (False, True):
            start = time.time()
            run = runner(kernel, candidate, *inputs[causal], p1[causal])
            info = resources(kernel, run)
            impl = dataclasses.replace(
                pipelined.IMPLEMENTATION,
                name=f"triton/pipelined~{candidate.name}",
                prepare=lambda q, k, v, problem, kernel=kernel, candidate=candidate: runner(kernel, candidate, q, k, v, problem),  # noqa: E501
            )  # fmt: skip
            check = check_implementation(impl, Problem(**RAGGED, causal=causal), device="cuda")
            log.record(candidate=candidate.name, causal=causal, check=check.summary()[:160], ok=check.ok, **info,
                       setup_s=round(time.time() - start, 1))  # fmt: skip
            # Spilling tiles are timed too (marked ineligible): the 3.6 default for causal D=128 spills 16 B.
            if check.ok and info["smem"] <= budget:
                runners[candidate.name, causal] = run
                eligible[candidate.name, causal] = info["spills"] == 0
    keys = list(runners)
    samples = {key: [] for key in keys}
    for round_index in range(rounds):
        shift = round_index * len(keys) // rounds
        for key in keys[shift:] + keys[:shift]:
            ms = time_cuda(runners[key], warmup_ms=50, rep_ms=250).ms
            samples[key].append(tflops(p1[key[1]].flops, ms))
    # The release's own default tile (pipelined.DEFAULT_CONFIGS after its release overrides) is the yardstick.
    default = {
        causal: _tile_name(dataclasses.astuple(pipelined.DEFAULT_CONFIGS[128, causal])) for causal in (False, True)
    }
    baseline = {causal: statistics.median(samples[default[causal], causal]) for causal in (False, True)
                if (default[causal], causal) in samples}  # fmt: skip
    for (name, causal), values in sorted(samples.items(), key=lambda item: (item[0][1], -statistics.median(item[1]))):
        median = statistics.median(values)
        ratio = round(median / baseline[causal], 3) if causal in baseline else None
        log.record(candidate=name, causal=causal, tflops=round(median, 1), vs_default=ratio, default=default[causal],
                   eligible=eligible[name, causal], rounds=[round(value, 1) for value in values])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated candidate names (default: all for this release)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dry", action="store_true", help="compile for sm_90a only (no GPU)")
    args = parser.parse_args()
    release = ".".join(RELEASE.split(".")[:2])
    chosen = [c for c in CANDIDATES if release in c.releases and (not args.only or c.name in args.only.split(","))]
    unknown = set(filter(None, args.only.split(","))) - {c.name for c in CANDIDATES}
    if unknown:
        parser.error(f"unknown candidates {sorted(unknown)}; expected some of {[c.name for c in CANDIDATES]}")
    if not args.dry:
        require_gpu("bench.pipelined_tiles (without --dry)")
    log = Log()
    device = "sm_90a (dry)" if args.dry else torch.cuda.get_device_name()
    log.say(f"# p16 bench: Triton {RELEASE} ({triton.__file__}) torch {torch.__version__} {device} "
            f"ptxas={os.environ.get('TRITON_PTXAS_BLACKWELL_PATH', 'default')} {time.strftime('%H:%M:%S')} "
            f"candidates={[c.name for c in chosen]}")  # fmt: skip
    if args.dry:
        dry(chosen, log)
    else:
        measure(chosen, args.rounds, log)
    log.say(f"# done {time.strftime('%H:%M:%S')}")


if __name__ == "__main__":
    main()
