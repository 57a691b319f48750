"""Run every rung of both stacks and every SDPA backend on one problem family; write CSV, plots, report.

    python compare.py --seqlen 8192                 # canonical problem, bf16, causal and non-causal
    python compare.py --seqlen 1024,8192 --only 'triton/*' --causal false
    python compare.py --device cpu                  # no GPU: Triton under the interpreter + SDPA math

Outputs go to ``--out`` (default ``runs/<date>-<gpu>-s<seqlen>/``): results.csv (rows appended as
they finish), env.json, latency.png, tflops.png, error.png and report.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import fnmatch
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

CONSOLE_WIDTH = 160
CPU_DEFAULTS = {"batch": 1, "heads": 2, "seqlen": [128], "head_dim": [64]}
CAUSAL_MODES = {"true": (True,), "false": (False,), "both": (False, True)}
DTYPE_CHOICES = ("bf16", "fp16")


def _positive_int_list(text: str) -> list[int]:
    values = []
    for item in text.split(","):
        item = item.strip()
        if not re.fullmatch(r"\d+", item) or int(item) <= 0:
            raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
        values.append(int(item))
    return values


def _positive_int(text: str) -> int:
    return _positive_int_list(text)[0] if "," not in text else _fail(f"expected one positive integer, got {text!r}")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _fail(message: str):
    raise argparse.ArgumentTypeError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Compare the Triton and CuTe DSL FlashAttention ladders with PyTorch SDPA backends.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--seqlen", type=_positive_int_list, help="sequence length(s), e.g. 8192 or 1024,8192")
    parser.add_argument("--batch", type=_positive_int, help="batch (default: max(1, 16384 / seqlen))")
    parser.add_argument("--heads", type=_positive_int, help="heads (default: 2048 / head_dim)")
    parser.add_argument("--head-dim", type=_positive_int_list, help="head dim(s) (default 128)")
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, help="input dtype (default bf16; fp16 on --device cpu)")
    parser.add_argument("--causal", choices=tuple(CAUSAL_MODES), default="both")
    parser.add_argument("--only", action="append", default=[], help="glob on implementation names (repeatable)")
    parser.add_argument("--skip", action="append", default=[], help="glob on implementation names to leave out")
    parser.add_argument("--list", action="store_true", help="list implementations and exit")
    parser.add_argument("--out", type=Path, help="output folder (default runs/<date>-<gpu>-s<seqlen>/)")
    parser.add_argument("--cuda-graph", action="store_true", help="time CUDA-graph replays of each call")
    parser.add_argument("--warmup", type=_positive_float, default=100.0, help="warm-up time per measurement, ms")
    parser.add_argument("--rep", type=_positive_float, default=500.0, help="timed repetitions per measurement, ms")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument(
        "--isolate", action="store_true", help="run each measurement in its own process (survives hangs and crashes)"
    )
    parser.add_argument("--timeout", type=_positive_float, default=600.0, help="seconds per isolated measurement")
    parser.add_argument(
        "--no-static", action="store_true", help="skip the sm_90a compile analysis (tradeoff table's static half)"
    )
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and validate; errors exit with status 2 before any GPU work."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.cuda_graph and args.device == "cpu":
        parser.error("--cuda-graph needs --device cuda")
    return args


def resolve_device(requested: str) -> str:
    """'cuda' when a GPU is present; otherwise say so and switch to the CPU teaching mode."""
    import torch

    if requested == "cuda" and not torch.cuda.is_available():
        print(
            "compare.py: no CUDA GPU found. GPU timings need an NVIDIA GPU (Hopper for the top rungs).\n"
            "Running the CPU teaching mode instead (same as --device cpu): Triton rungs under the Triton\n"
            "interpreter and SDPA math at a small size; timings are labelled as CPU interpreter timings.",
            file=sys.stderr,
        )
        requested = "cpu"
    if requested == "cpu":
        # Must be set before any Triton kernel is decorated (the registry imports rungs lazily).
        os.environ["TRITON_INTERPRET"] = "1"
    return requested


def select(implementations: list, only: list[str], skip: list[str]) -> list:
    """Apply --only/--skip globs; a glob matching nothing is an error that lists the valid names."""
    names = [impl.name for impl in implementations]
    for pattern in [*only, *skip]:
        if not fnmatch.filter(names, pattern):
            raise SystemExit(f"compare.py: no implementation matches {pattern!r}; valid names: {', '.join(names)}")

    def wanted(name: str) -> bool:
        chosen = not only or any(fnmatch.fnmatch(name, pattern) for pattern in only)
        return chosen and not any(fnmatch.fnmatch(name, pattern) for pattern in skip)

    return [impl for impl in implementations if wanted(impl.name)]


def build_problems(args: argparse.Namespace, device: str) -> list:
    import torch

    from common.problem import DTYPE_NAMES, Problem

    cpu = device == "cpu"
    seqlens = args.seqlen or (CPU_DEFAULTS["seqlen"] if cpu else [8192])
    head_dims = args.head_dim or (CPU_DEFAULTS["head_dim"] if cpu else [128])
    dtype = DTYPE_NAMES[args.dtype] if args.dtype else (torch.float16 if cpu else torch.bfloat16)
    batch = args.batch or (CPU_DEFAULTS["batch"] if cpu else None)
    heads = args.heads or (CPU_DEFAULTS["heads"] if cpu else None)
    return [
        Problem.canonical(seqlen, head_dim=head_dim, batch=batch, heads=heads, dtype=dtype, causal=causal)
        for head_dim in head_dims
        for seqlen in seqlens
        for causal in CAUSAL_MODES[args.causal]
    ]


def default_out_dir(device: str, seqlens: list[int]) -> Path:
    import torch

    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    gpu_slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    date = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{date}-{gpu_slug}-s{'-'.join(map(str, seqlens))}"


def print_implementations(implementations: list, missing: list) -> None:
    for impl in implementations:
        print(f"{impl.name:20s} stack={impl.stack:7s} rung={impl.rung}")
    for item in missing:
        print(f"{item.name:20s} unavailable: {item.reason}")


def _status_colour(status: str) -> str:
    return {"ok": "green", "wrong": "red", "failed": "red", "oom": "yellow", "skipped": "dim"}.get(status, "white")


def print_table(rows: list) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="FlashAttention forward")
    for column in ("impl", "shape", "status", "ms", "TFLOP/s", "% peak", "rel L2 err", "reason"):
        table.add_column(column)
    for row in rows:
        mask = "causal" if row.causal else "full"
        shape = f"S={row.seqlen_q} D={row.head_dim} {row.dtype} {mask}"
        measured = row.status in ("ok", "wrong")
        table.add_row(
            row.impl,
            shape,
            f"[{_status_colour(row.status)}]{row.status}[/]",
            f"{row.ms:.3f}" if measured else "",
            f"{row.tflops:.1f}" if measured else "",
            f"{row.pct_peak:.0f}" if measured and row.pct_peak == row.pct_peak else "",
            f"{row.rel_l2_err:.2e}" if measured else "",
            row.reason[:60],
        )
    Console(width=CONSOLE_WIDTH).print(table)


def _measurer(args: argparse.Namespace, problem, device, options, peaks):
    """A function impl -> row for one problem: in this process, or each in its own (--isolate)."""
    from common.isolation import measure_isolated
    from common.runner import make_workload, measure

    if args.isolate:
        return lambda impl: measure_isolated(impl.name, impl, problem, device.type, options, peaks, args.timeout)
    workload = make_workload(problem, device.type)
    return lambda impl: measure(impl, workload, device, options, peaks)


def _measure_problem(problem, selected: list, missing: list, measure_one, log, progress, task) -> list:
    """Rows for one problem: unavailable rungs as skipped, then every selected implementation."""
    from common.runner import blank_row

    rows = []
    for item in missing:
        stack, rung = item.name.split("/")
        rows.append(blank_row(item.name, stack, rung, problem, "skipped", item.reason))
        log.append(rows[-1])
        progress.advance(task)
    for impl in selected:
        progress.update(task, description=f"{impl.name} {problem.describe()}")
        row = measure_one(impl)
        rows.append(row)
        log.append(row)
        progress.console.print(
            f"{impl.name:18s} {problem.describe():40s} {row.status:8s} {row.tflops:8.1f} TFLOP/s {row.reason[:80]}"
        )
        progress.advance(task)
    return rows


def run_all(args: argparse.Namespace, device_name: str) -> tuple[list, Path, dict, object]:
    """Measure every selected implementation on every problem; rows are written as they finish.

    Returns the rows, the output folder, the environment manifest and the measured peaks.
    """
    import torch
    from rich.console import Console
    from rich.progress import Progress

    from common.environment import manifest
    from common.peaks import measure_peaks
    from common.registry import discover
    from common.results import CsvLog
    from common.runner import TimingOptions

    available, missing = discover()
    selected = select(available + missing, args.only, args.skip)
    missing = [item for item in selected if item in missing]
    selected = [impl for impl in selected if impl not in missing]
    problems = build_problems(args, device_name)
    out_dir = args.out or default_out_dir(device_name, sorted({p.seqlen_q for p in problems}))
    out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device(device_name)
    env = manifest(device)
    (out_dir / "env.json").write_text(json.dumps(env, indent=2))
    peaks = measure_peaks(device)
    env["peaks"] = {"bf16_tflops": peaks.bf16_tflops, "fp8_tflops": peaks.fp8_tflops, "copy_gbps": peaks.copy_gbps}
    log = CsvLog(out_dir / "results.csv")
    options = TimingOptions(args.warmup, args.rep, args.cuda_graph)
    rows = []
    with Progress(transient=True, console=Console(width=CONSOLE_WIDTH)) as progress:
        task = progress.add_task("measuring", total=len(problems) * (len(selected) + len(missing)))
        for problem in problems:
            measure_one = _measurer(args, problem, device, options, peaks)
            rows += _measure_problem(problem, selected, missing, measure_one, log, progress, task)
    if device.type == "cuda":
        from common.environment import gpu_clocks

        env["clocks_end"] = gpu_clocks()
    (out_dir / "env.json").write_text(json.dumps(env, indent=2))
    return rows, out_dir, env, peaks


def write_outputs(rows: list, out_dir: Path, env: dict, peaks, cpu_only: bool, with_static: bool) -> None:
    import pandas as pd

    from common.plots import write_run_plots, write_sweep_plots, write_tradeoff_plot
    from common.report import write_report

    frame = pd.read_csv(out_dir / "results.csv")
    frame["reason"] = frame["reason"].fillna("")
    shape = _plot_subset(frame)
    plots = write_run_plots(shape, out_dir) + write_sweep_plots(frame, out_dir)
    sections = []
    if with_static:
        table, tradeoff_sections = tradeoff_outputs(shape, out_dir)
        sections += tradeoff_sections
        tradeoff_plot = write_tradeoff_plot(table, out_dir)
        plots += [tradeoff_plot] if tradeoff_plot else []
    write_report(frame, env, peaks, plots, out_dir, cpu_only, sections)


def tradeoff_outputs(shape, out_dir: Path):
    """tradeoffs.csv and the report sections: compile every rung for sm_90a, join the timed rows."""
    from common.problem import DTYPE_NAMES, Problem
    from common.report import markdown_table
    from common.static import static_report_subprocess
    from common.tradeoffs import feature_matrix, implementation_table, side_by_side

    first = shape.sort_values("causal").iloc[0]
    problem = Problem(
        int(first["batch"]),
        int(first["heads"]),
        int(first["seqlen_q"]),
        int(first["seqlen_k"]),
        int(first["head_dim"]),
        dtype=DTYPE_NAMES[first["dtype"]],
        causal=bool(first["causal"]),
    )
    static_rows = static_report_subprocess(problem)
    table = implementation_table(static_rows, shape[shape["causal"] == first["causal"]], Path(__file__).parent)
    pairs = side_by_side(table)
    pairs.to_csv(out_dir / "tradeoffs.csv", index=False)
    columns = tuple((c, c) for c in ("rung", "metric", "triton", "cute", "cute/triton"))
    sections = [
        (f"Triton vs CuTe, rung by rung ({problem.describe()})", markdown_table(pairs, columns)),
        ("Instructions in the PTX of each rung (compiled for sm_90a)", feature_matrix(static_rows)),
    ]
    return table, sections


def _plot_subset(frame):
    """The per-run plots show one shape: the largest sequence length at the largest head dim."""
    largest = frame[frame["seqlen_q"] == frame["seqlen_q"].max()]
    return largest[largest["head_dim"] == largest["head_dim"].max()]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        from common.registry import discover

        print_implementations(*discover())
        return 0
    device_name = resolve_device(args.device)
    rows, out_dir, env, peaks = run_all(args, device_name)
    write_outputs(rows, out_dir, env, peaks, cpu_only=device_name == "cpu", with_static=not args.no_static)
    print_table(rows)
    print(f"wrote {out_dir}/results.csv, env.json, report.md and plots")
    bad = [row.impl for row in rows if row.status in ("wrong", "failed")]
    if bad:
        print(f"compare.py: wrong or failed: {', '.join(sorted(set(bad)))}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
