"""``PreparedLaunch``'s A/B (``triton_impl._host.DIRECT_LAUNCH``): a bound triton/decode or gluon/decode call through
Triton's JIT at every launch (off) against its compiled kernel launched directly after the first (on).

On the decode sweep's small steps, where a step is host time: for each shape and rung, both settings prepared afresh,
their outputs compared bit for bit and the first checked against fp64 on a poisoned output; then, the settings
alternating over ``--rounds`` rounds, the step as ``compare.py --decode`` times it (``time_cuda``: median of device
events, the L2 flushed clean) and the host time to enqueue one call (a loop of back-to-back calls, host timer).
cute/decode and FlashInfer's decode run beside them as references (the knob does not touch them: their two columns
are one setting timed twice, the run's spread). Writes ``launch.csv`` and ``launch.md`` under ``--out``.

    python -m bench.prepared_launch --out runs/prepared-launch
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from bench import require_gpu
from common.contract.check import check_on_inputs, run_poisoned
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from common.contract.registry import discover
from common.measure.results import CsvLog
from common.measure.timing import time_cuda

RUNGS = ("triton/decode", "gluon/decode", "cute/decode", "flashinfer/decode")
# (B, Hkv, Sk) of one token, H=32 D=128 bf16 bottom-right: the decode sweep's caches under 64 MB.
SHAPES = ((1, 8, 4096), (1, 32, 4096), (8, 8, 4096), (1, 8, 32768), (8, 32, 4096))
SETTINGS = (False, True)
COLUMNS = ("impl", "shape", "direct", "status", "step_us", "host_us", "reason")
HOST_CALLS = 200


def host_us(run) -> float:
    """Host microseconds to enqueue one call, over ``HOST_CALLS`` back-to-back calls."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(HOST_CALLS):
        run()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed * 1e6 / HOST_CALLS


def prepared_pair(impl, problem: Problem) -> tuple[dict, str]:
    """setting -> run() for both settings on one set of inputs, or ({}, the reason none can run)."""
    from triton_impl import _host

    ok, reason = impl.check(problem, torch.device("cuda"))
    if not ok:
        return {}, reason
    q, k, v = make_inputs(problem, seed=0, device="cuda", offset=0.5)
    check = check_on_inputs(impl, q, k, v, problem)
    if not check.ok:
        return {}, f"fp64 check failed: {check.summary()}"
    runs = {}
    for direct in SETTINGS:
        _host.DIRECT_LAUNCH = direct
        runs[direct] = impl.prepare(q, k, v, problem)
    _host.DIRECT_LAUNCH = True
    outputs = [run_poisoned(runs[direct]) for direct in SETTINGS]
    if not torch.equal(outputs[0], outputs[1]):
        return {}, "the direct launch's output differs from the JIT's"
    return runs, f"rel. L2 {check.error.rel_l2_err:.2e}"


def measure(impl, problem: Problem, rounds: int, log: CsvLog) -> list[dict]:
    """Both settings of one rung on one shape, alternating; one row per setting (means over rounds)."""
    runs, note = prepared_pair(impl, problem)
    shape = problem.describe()
    if not runs:
        rows = [dict(impl=impl.name, shape=shape, direct=d, status="skipped", reason=note) for d in SETTINGS]
    else:
        samples = {direct: [] for direct in SETTINGS}
        for _ in range(rounds):
            for direct in SETTINGS:
                step = time_cuda(runs[direct], warmup_ms=10, rep_ms=60).ms * 1e3
                samples[direct].append((step, host_us(runs[direct])))
        rows = [
            {"impl": impl.name, "shape": shape, "direct": direct, "status": "ok", "reason": note}
            | {"step_us": statistics.mean(s[0] for s in samples[direct])}
            | {"host_us": statistics.mean(s[1] for s in samples[direct])}
            for direct in SETTINGS
        ]
    for row in rows:
        log.append({column: row.get(column, "") for column in COLUMNS})
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "| impl | shape | step µs JIT → direct | host µs JIT → direct |",
        "|---|---|---|---|",
    ]
    for jit, direct in zip(rows[::2], rows[1::2], strict=True):
        if jit["status"] != "ok":
            lines.append(f"| {jit['impl']} | {jit['shape']} | {jit['status']}: {jit['reason']} | |")
            continue
        lines.append(
            f"| {jit['impl']} | {jit['shape']} | {jit['step_us']:.1f} → {direct['step_us']:.1f} "
            f"| {jit['host_us']:.1f} → {direct['host_us']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    require_gpu("bench.prepared_launch")
    args.out.mkdir(parents=True, exist_ok=True)
    implementations = {impl.name: impl for impl in discover()[0] if impl.name in RUNGS}
    log, rows = CsvLog(args.out / "launch.csv", COLUMNS), []
    for batch, kv_heads, seqlen_k in SHAPES:
        problem = Problem(
            batch, 32, 1, seqlen_k, 128, dtype=torch.bfloat16, causal=True, kv_heads=kv_heads,
            causal_alignment="bottom_right",
        )  # fmt: skip
        for name in RUNGS:
            if name in implementations:
                rows += measure(implementations[name], problem, args.rounds, log)
                (args.out / "launch.md").write_text(markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main()
