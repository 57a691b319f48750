"""compute-sanitizer memcheck and racecheck over every CUDA rung at small ragged shapes.

    python -m common.tools.sanitize --impl '*' --out results/h200/sanitizer.md

Each (rung, tool) pair runs in its own ``compute-sanitizer`` process that checks the rung on a few
small problems (ragged lengths, Sq != Sk, causal and not; for the decode rungs each of their launch plans, paged
caches and empty sequences among them: ``DECODE_PLANS``) and runs nothing but the rung's own
kernels; the summary records the verdict and the first error lines.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from common.contract.check import run_poisoned, seeded_inputs
from common.contract.problem import Problem
from common.contract.registry import discover, per_call_inputs

TOOLS = ("memcheck", "racecheck")


def _decode_step(
    batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int, kv_heads: int, **changes: object
) -> Problem:
    """A bf16 decode step, bottom-right causal, with per-sequence key lengths (from B = 3 the last one empty)."""
    return Problem(
        batch, heads, seqlen_q, seqlen_k, head_dim, dtype=torch.bfloat16, causal=True, kv_heads=kv_heads,
        causal_alignment="bottom_right", has_cache_seqlens=changes.pop("has_cache_seqlens", True), **changes,
    )  # fmt: skip


# The decode rungs' launch plans on a Hopper GPU's 132 SMs, one small problem each (at most 67 MB of K and V, so that
# an instrumented run stays short), the pages indexed through a shuffled block table: where a plan reads out of
# bounds (a page index, a share past its item, an empty sequence), memcheck sees it. tests/test_sanitize_problems.py
# checks that each rung's plans are all here.
DECODE_PLANS = {
    # The balanced split in all three (shares of the valid keys, merged in groups), pages of 16.
    "balanced, pages of 16": _decode_step(4, 8, 1, 2048, 128, 2, page_size=16),
    # MQA at D=256 in pages of 256: the balanced split on the widest rows.
    "balanced, D=256, pages of 256": _decode_step(3, 8, 2, 1024, 256, 1, page_size=256),
    # One long sequence over one KV head: 32 shares an item, the grouped merge.
    "balanced, one long item": _decode_step(2, 4, 1, 16384, 128, 1),
    # 256 packed rows on a contiguous cache: cute/decode's packed prefill with key splits and their merge (cute/hopper's
    # kernel), gluon/decode's two consumers a CTA, triton/decode's padded split.
    "packed prefill with key splits": _decode_step(2, 32, 16, 8192, 64, 2, has_cache_seqlens=False),
    # 128 packed rows over 128 (batch, KV head) tiles: the packed prefill without key splits in gluon and cute.
    "packed prefill": _decode_step(8, 128, 16, 1024, 64, 16, has_cache_seqlens=False),
    # 1024 short items of 80 rows in pages of 64: gluon/decode's items kernel (claims, longest first), triton/decode's
    # one padded split dispatched longest first, an empty sequence.
    "items, pages of 64": _decode_step(64, 40, 16, 512, 64, 8, page_size=64),
}
ROOT = Path(__file__).resolve().parents[2]
SMALL_PROBLEMS = (
    Problem(1, 2, 77, 77, 64, dtype=torch.bfloat16, causal=True),
    Problem(1, 1, 130, 200, 128, dtype=torch.float16, causal=True),
    Problem(1, 1, 200, 77, 128, dtype=torch.bfloat16, causal=False),
    # More query tiles (160) than the H200 has SMs (132): some persistent CTAs run two tiles.
    Problem(2, 40, 200, 200, 64, dtype=torch.bfloat16, causal=False),
    # The same with causal tiles of unequal length, dealt forwards then backwards (D=128 is persistent).
    Problem(2, 40, 200, 200, 128, dtype=torch.bfloat16, causal=True),
    # Sq >> Sk causal at D=128 in fp16 (8 query tiles of one key block): cute/fp8 answered it wrong once in the H100's
    # suite (2026-12-05, tests/test_cute_fp8_repeat.py), with a kernel that had passed it on the H200.
    Problem(2, 3, 1000, 77, 128, dtype=torch.float16, causal=True),
    # A decode step: 3 tokens, GQA, bottom-right, keys enough for the split rule to take 8 splits and so run the merge
    # kernel.
    Problem(2, 8, 3, 4096, 128, dtype=torch.bfloat16, causal=True, kv_heads=2, causal_alignment="bottom_right"),
    *DECODE_PLANS.values(),
)
TIMEOUT_S = 600
SANITIZER_ERROR_EXIT = 99
# Triton 3.8's kernel loader (``loadBinary`` in its ``cuda_utils``) makes a ``cuFuncSetAttribute`` call that
# the driver refuses with CUDA_ERROR_INVALID_VALUE and Triton ignores; memcheck reports host API errors like
# it by default (results/h200/triton-3.8/memcheck-backtrace.log). These checks are about device memory and
# races, so host API errors are left to the program that receives them.
HOST_API_ERRORS = "--report-api-errors=no"
# Sanitised processes are mostly host-bound (instrumented launches, JIT): a few run side by side.
PARALLEL_RUNS = 4


def _child(impl_name: str) -> int:
    """Run only the rung (no reference, no SDPA), so every report is about its own kernels."""
    available, _ = discover(include_baselines=False)
    impl = next(candidate for candidate in available if candidate.name == impl_name)
    failures = 0
    for problem in SMALL_PROBLEMS:
        ok, reason = impl.check(problem, torch.device("cuda"))
        if not ok:
            print(f"skip {problem.describe()}: {reason}")
            continue
        q, k, v, cache_seqlens, block_table = seeded_inputs(problem, seed=problem.seqlen_q)
        out = run_poisoned(impl.prepare(q, k, v, problem, **per_call_inputs(problem, cache_seqlens, block_table)))
        torch.cuda.synchronize()
        unwritten = int((~torch.isfinite(out)).sum().item())
        print(f"{problem.describe()}: {unwritten} non-finite output elements")
        failures += unwritten > 0
    return 1 if failures else 0


def _sanitize(impl_name: str, tool: str, timeout_s: float = TIMEOUT_S) -> tuple[str, str]:
    command = [
        "compute-sanitizer",
        f"--tool={tool}",
        f"--error-exitcode={SANITIZER_ERROR_EXIT}",
        HOST_API_ERRORS,
        "--target-processes=all",
        sys.executable,
        "-m",
        "common.tools.sanitize",
        "--child",
        impl_name,
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return "timeout", f"no verdict within {timeout_s:g} s"
    return _verdict(done.returncode, done.stdout + done.stderr)


# Reports about the kernels' own memory accesses and shared-memory hazards.
DEVICE_ERROR = re.compile(r"Invalid __\w+__ (?:read|write)|Misaligned|out of bounds|[Hh]azard|Race reported")
# Failed host API calls: cuda-python probes optional driver entry points (cuGetProcAddress) at import.
HOST_API_ERROR = re.compile(r"Program hit (CUDA_ERROR_\w+).*?on CUDA API call to (\w+)")


def _verdict(returncode: int, output: str) -> tuple[str, str]:
    """ "clean" means no device-side error; host API failures are counted in the detail, not hidden."""
    lines = output.splitlines()
    device_errors = [line for line in lines if DEVICE_ERROR.search(line) and "SUMMARY" not in line]
    host_calls = sorted({f"{m.group(1)} from {m.group(2)}" for m in map(HOST_API_ERROR.search, lines) if m})
    summary = [line for line in lines if "ERROR SUMMARY" in line or "RACECHECK SUMMARY" in line][-1:]
    if device_errors:
        verdict = "errors"
    elif returncode in (0, SANITIZER_ERROR_EXIT) and summary:
        verdict = "clean"
    else:
        verdict = f"exit {returncode}"
    detail = summary + device_errors[:3]
    if host_calls:
        detail.append(f"host API errors only: {', '.join(host_calls)}")
    if not summary:
        detail.append((lines or [""])[-1])
    return verdict, "; ".join(detail).replace("|", "/")


def _missing_tool() -> str | None:
    """What the sweep lacks to run at all (compute-sanitizer on PATH, a CUDA GPU), or None."""
    if shutil.which("compute-sanitizer") is None:
        return "common.tools.sanitize needs compute-sanitizer (from the CUDA toolkit) on PATH; it was not found"
    if not torch.cuda.is_available():
        return "common.tools.sanitize needs a CUDA GPU, and torch sees none (torch.cuda.is_available() is False)"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", default="*")
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--out", type=Path)
    # A device call has a limit of its own: a child still running near it is a "timeout" row, not a lost table.
    parser.add_argument("--timeout-s", type=float, default=TIMEOUT_S, help="each sanitised process's limit")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.exit(_child(args.child))
    missing = _missing_tool()
    if missing:
        print(missing, file=sys.stderr)
        sys.exit(2)
    available, _ = discover(include_baselines=False)
    lines = ["# compute-sanitizer sweep", "", "Problems: " + "; ".join(p.describe() for p in SMALL_PROBLEMS), ""]
    lines += ["| impl | tool | verdict | detail |", "|---|---|---|---|"]
    jobs = [
        (impl.name, tool)
        for impl in available
        if fnmatch.fnmatch(impl.name, args.impl)
        for tool in args.tools.split(",")
    ]
    with ThreadPoolExecutor(PARALLEL_RUNS) as pool:
        verdicts = pool.map(lambda job: _sanitize(*job, args.timeout_s), jobs)
        for (impl_name, tool), (verdict, detail) in zip(jobs, verdicts, strict=True):
            print(f"{impl_name:18s} {tool:10s} {verdict:8s} {detail[:150]}", flush=True)
            lines.append(f"| {impl_name} | {tool} | {verdict} | {detail[:300]} |")
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
