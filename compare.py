"""Run every rung of every stack and the baselines (SDPA backends, FlashAttention-4) on one problem
family; write CSV, plots and a report.

    python compare.py --seqlen 8192                 # canonical problem, bf16, causal and non-causal
    python compare.py --seqlen 1024,8192 --only 'triton/*' --causal false
    python compare.py --list                        # what can run on this machine, and why not (and what
                                                    # the stack names triton/gluon/cute/auto pick)
    python compare.py --device cpu                  # no GPU: Triton under the interpreter + SDPA math
    python compare.py --decode                      # decode sweep: one token against a KV cache (GPU)
    python compare.py --decode --all-rungs          # ... with the teaching rungs too (naive to pipelined)
    python compare.py --backward                    # forward + backward of every implementation with a backward
    python compare.py --decode --decode-batch 1,8 --decode-seqlen 4096,32768 --only 'triton/decode'
    python compare.py --gpus 4 --seqlen 1024,4096,8192,16384   # the sweep spread over 4 GPUs, one worker each
    python compare.py --generate --quick            # a Llama's generate() per attention implementation
                                                    # (bench/generate.py; the arguments after --generate go to it)

Without a GPU (and without ``--device``) the run is capped to the CPU teaching size and says what it
ran instead of what was asked; ``--device cuda`` without a GPU is refused (exit 2); ``--device cpu``
runs the sizes asked for and prints an estimate first.

Outputs go to ``--out`` (default ``runs/<date>-<gpu>-s<seqlen>/``): results.csv (rows appended as
they finish), env.json, latency.png, tflops.png, error.png and report.md. Ctrl-C keeps the rows
measured so far and writes the report and plots for them, marked as interrupted (exit 130).
"""

from __future__ import annotations

import argparse
import datetime as dt
import fnmatch
import json
import math
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

CONSOLE_WIDTH = 160
CAUSAL_MODES = {"true": (True,), "false": (False,), "both": (False, True)}
DTYPE_CHOICES = ("bf16", "fp16")
GPU_DEFAULT_SEQLEN, GPU_DEFAULT_HEAD_DIM = 8192, 128


@dataclass(frozen=True)
class TeachingSize:
    """The CPU teaching size: every Triton rung finishes under the interpreter in seconds."""

    batch: int = 1
    heads: int = 2
    seqlen: int = 128
    head_dim: int = 64


CPU_TEACHING = TeachingSize()
# Rough cost of the slowest interpreted rung (triton/naive) on a 2-core machine, and how many times
# one measurement calls it (prepare, first call, two poisoned runs, warm-up and three timed runs).
INTERPRETER_SECONDS_PER_GFLOP = 330.0
INTERPRETER_CALLS_PER_MEASUREMENT = 7
# compare.py's exit statuses beyond 0 (all selected rows ran and passed) and 1 (some row did not).
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
# Optional third-party packages whose absence is a stated capability, not a broken rung.
OPTIONAL_PACKAGES = {
    "cutlass": "the CuTe DSL (nvidia-cutlass-dsl)",
    "tvm_ffi": "TVM-FFI (apache-tvm-ffi), through which the CuTe rungs compile",
}
# The ladder's teaching rungs. They show each step of the ladder on one problem, but take 0.1 s a call
# at a sweep's large shapes (triton/naive 104 ms at decode B=64, 32k: issue #38), so --decode and the
# prefill sweeps time them only with --all-rungs.
TEACHING_RUNGS = ("naive", "online", "tiled", "pipelined")
# --decode also leaves out the FP8 rungs (prefill kernels with a quantiser in front: they answer no decode
# question, and each adds its own compile and check to every shape) and SDPA's math backend (the naive
# rung's counterpart, 12 ms a call at B=64, 4k keys, H200) unless --all-rungs: with them the default
# sweep took over 3.5 minutes on an H200 (issue #38 asks for 3).
DECODE_LEFT_OUT = ("fp8", "math")


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


# (warm-up ms, timed ms) per measurement. A decode step takes 10 us to 6 ms and do_bench flushes L2
# before each call, so a short step costs ~5x its own time per repetition: 60 ms of repetitions is 10 or
# more of the slowest step and keeps each row under half a second (with 25/150 ms the default decode
# sweep did 10 of its 19 shapes in 200 s on an H200, 2026-11-28).
PREFILL_TIMING = (100.0, 500.0)
DECODE_TIMING = (10.0, 60.0)


def timing_options(args: argparse.Namespace):
    """The measurements' TimingOptions: --warmup/--rep when given, else the default of the sweep."""
    from common.measure.runner import TimingOptions

    warmup, rep = DECODE_TIMING if args.decode else PREFILL_TIMING
    return TimingOptions(args.warmup or warmup, args.rep or rep, args.cuda_graph)


def build_parser() -> argparse.ArgumentParser:
    """Every option says what it does and its default, once."""
    parser = argparse.ArgumentParser(
        description="Compare the Triton, Gluon and CuTe DSL FlashAttention ladders with SDPA and FlashAttention-4.",
        epilog="Exit status: 0 every selected row ran and passed (capability skips are fine); 1 a row was wrong, "
        "failed, timed out, ran out of memory or its module failed to import; 2 bad arguments or a refused "
        "request; 130 interrupted (rows measured so far are kept, with report and plots).",
    )
    parser.add_argument(
        "--seqlen",
        type=_positive_int_list,
        help="sequence length(s), e.g. 8192 or 1024,8192 (default 8192 on a GPU, 128 on the CPU)",
    )
    parser.add_argument("--batch", type=_positive_int, help="batch (default max(1, 16384 / seqlen); 1 on the CPU)")
    parser.add_argument("--heads", type=_positive_int, help="heads (default 2048 / head_dim; 2 on the CPU)")
    parser.add_argument("--head-dim", type=_positive_int_list, help="head dim(s) (default 128; 64 on the CPU)")
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, help="input dtype (default bf16; fp16 on the CPU)")
    parser.add_argument(
        "--causal",
        choices=tuple(CAUSAL_MODES),
        default="both",
        help="causal mask (aligned as --causal-alignment says): true, false or both (default both)",
    )
    parser.add_argument(
        "--causal-alignment",
        choices=("top_left", "bottom_right"),
        default="top_left",
        help="where the causal diagonal sits: top_left (SDPA's is_causal: row i sees keys j <= i) or "
        "bottom_right (KV caches: j <= i + Sk - Sq); equal when Sq = Sk (default top_left)",
    )
    parser.add_argument(
        "--kv-heads",
        type=_positive_int,
        help="K/V heads for GQA (a divisor of the heads; 1 is MQA; default: the heads, no GQA)",
    )
    parser.add_argument("--only", action="append", default=[], help="glob on implementation names (repeatable)")
    parser.add_argument("--skip", action="append", default=[], help="glob on names to leave out (repeatable)")
    parser.add_argument(
        "--all-rungs",
        action="store_true",
        help=f"also time the teaching rungs ({', '.join(TEACHING_RUNGS)}) in --decode and in prefill sweeps on a "
        "GPU (several --seqlen or --head-dim values, as --gpus spreads them), and the FP8 rungs in --decode. By "
        "default a prefill sweep times the hopper, fp8 and decode rungs and the baselines, --decode the hopper "
        "and decode rungs and the baselines, and both say which rows they left out; a single-problem run times "
        "every rung. An --only that names a left-out rung exactly selects it as well",
    )
    parser.add_argument(
        "--list", action="store_true", help="list implementations, whether each can run here and why not, and exit"
    )
    parser.add_argument("--out", type=Path, help="output folder (default runs/<date>-<gpu>-s<seqlen>/)")
    parser.add_argument("--cuda-graph", action="store_true", help="time CUDA-graph replays of each call")
    parser.add_argument(
        "--warmup",
        type=_positive_float,
        help=f"warm-up time per measurement, ms (default {PREFILL_TIMING[0]:g}; {DECODE_TIMING[0]:g} with --decode)",
    )
    parser.add_argument(
        "--rep",
        type=_positive_float,
        help=f"timed repetitions per measurement, ms (default {PREFILL_TIMING[1]:g}; {DECODE_TIMING[1]:g} with "
        "--decode)",
    )
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        help="cuda: refuse to run without a GPU; cpu: the Triton interpreter at the size asked for (prints an "
        "estimate first). Default: the GPU when there is one, else the CPU teaching mode at a capped size",
    )
    parser.add_argument(
        "--isolate", action="store_true", help="run each measurement in its own process (survives hangs and crashes)"
    )
    parser.add_argument(
        "--timeout", type=_positive_float, default=600.0, help="seconds per isolated measurement (default 600)"
    )
    parser.add_argument(
        "--no-static", action="store_true", help="skip the sm_90a compile analysis (tradeoff table's static half)"
    )
    parser.add_argument(
        "--gpus",
        type=_positive_int,
        help="spread the sweep's (problem x implementation) jobs over this many GPUs of this host, one worker "
        "process per GPU measuring its own peaks; one merged results.csv with a gpu column (default: one GPU, "
        "no workers)",
    )
    parser.add_argument(
        "--generate",
        action="store_true",
        help="as the first argument: run bench/generate.py (a random-weight Llama's generate() per attention "
        "implementation); every later argument goes to it (python compare.py --generate --help)",
    )
    # A --gpus worker's share of the jobs (common.measure.multi_gpu); not for direct use.
    parser.add_argument("--jobs", type=Path, help=argparse.SUPPRESS)
    decode = parser.add_argument_group(
        "decode workload (--decode)",
        "one token (Sq=1, bf16, D=128, 32 query heads) against a KV cache, judged in GB/s of K and V read "
        "and as a share of the measured HBM read bandwidth; writes decode.csv and env.json (needs a GPU)",
    )
    decode.add_argument("--decode", action="store_true", help="run the decode sweep instead of the prefill one")
    decode.add_argument("--decode-batch", type=_positive_int_list, help="batches (default 1,8,64)")
    decode.add_argument("--decode-seqlen", type=_positive_int_list, help="cache lengths (default 4096,32768,131072)")
    decode.add_argument("--decode-kv-heads", type=_positive_int_list, help="KV heads of the 32 (default 8,32)")
    decode.add_argument(
        "--decode-no-ragged", action="store_true", help="leave out the ragged batch (cache_seqlens, B=8, 32768 keys)"
    )
    decode.add_argument(
        "--decode-no-paged", action="store_true", help="leave out the paged batch (block_table, pages of 16 keys)"
    )
    decode.add_argument(
        "--decode-random",
        type=_positive_int,
        metavar="N",
        help="instead of the fixed sweep, N seeded random shapes over B 1-64, KV heads 1-32, group 1-16, Sq 1-16, "
        "D 64/128/256, ragged or full, contiguous or paged, caches of 128 MB to 4 GB; the run ends with each "
        "rung's lowest share of the read bandwidth",
    )
    decode.add_argument("--decode-seed", type=int, default=0, help="seed of --decode-random's shapes (default 0)")
    backward = parser.add_argument_group(
        "backward workload (--backward)",
        "forward + backward and backward alone of every implementation with a backward (ladder rungs, SDPA "
        "backends, FA4) on the prefill problems (--seqlen, --head-dim, --causal, --kv-heads, ...), each "
        "gradient judged against fp64; writes backward.csv, env.json, plots and report.md. A problem's rows "
        "are timed one after another in the ladder's order, so a GPU that the run heats (a lower clock) "
        "charges the last ones; --rounds N checks them all first, then times them N times, the order "
        "reversed every other round",
    )
    backward.add_argument("--backward", action="store_true", help="run the backward sweep instead of the forward one")
    backward.add_argument(
        "--rounds",
        type=_positive_int,
        default=1,
        metavar="N",
        help="--backward: N interleaved rounds per problem; each row's median over rounds, its rounds in a "
        "rounds_ms column (default 1: one pass in order, no such column; an even N gives every row the early "
        "and the late places equally)",
    )
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and validate; errors exit with status 2 before any GPU work."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.generate:
        parser.error("--generate must come first: the arguments after it go to bench/generate.py")
    if args.cuda_graph and args.device == "cpu":
        parser.error("--cuda-graph needs --device cuda")
    if args.rounds > 1 and not args.backward:
        parser.error("--rounds applies to --backward")
    if args.gpus and (args.decode or args.list or args.device == "cpu" or args.jobs):
        parser.error("--gpus spreads the prefill sweep over GPUs: it takes no --decode, --list, --device cpu or --jobs")
    return args


class RefusedError(Exception):
    """A request compare.py will not run as asked (exit status 2), with the reason for the user."""


def resolve_device(requested: str | None) -> tuple[str, bool]:
    """(device, teaching): the GPU when there is one; without one, the CPU teaching mode, unless the
    user asked for ``--device cuda``, which is refused. ``teaching`` means the sizes get capped."""
    import torch

    has_gpu = torch.cuda.is_available()
    if requested == "cuda" and not has_gpu:
        raise RefusedError(
            "--device cuda was asked for, but no CUDA GPU is visible (torch.cuda.is_available() is False). "
            "Leave out --device for the CPU teaching mode at a small size, or pass --device cpu to run the "
            "sizes you ask for under the Triton interpreter."
        )
    device = requested or ("cuda" if has_gpu else "cpu")
    if device == "cpu":
        # Must be set before any Triton kernel is decorated (the registry imports rungs lazily).
        os.environ["TRITON_INTERPRET"] = "1"
    return device, requested is None and not has_gpu


def build_problems(args: argparse.Namespace, device: str, teaching: bool = False) -> list:
    """The problems to run: the arguments, with the GPU or CPU defaults filled in; ``teaching``
    caps batch, heads and sequence lengths to the CPU teaching size (head dims and dtype stay)."""
    import torch

    from common.contract.problem import DTYPE_NAMES, Problem

    cpu = device == "cpu"
    seqlens = args.seqlen or ([CPU_TEACHING.seqlen] if cpu else [GPU_DEFAULT_SEQLEN])
    head_dims = args.head_dim or ([CPU_TEACHING.head_dim] if cpu else [GPU_DEFAULT_HEAD_DIM])
    dtype = DTYPE_NAMES[args.dtype] if args.dtype else (torch.float16 if cpu else torch.bfloat16)
    batch = args.batch or (CPU_TEACHING.batch if cpu else None)
    heads = args.heads or (CPU_TEACHING.heads if cpu else None)
    if teaching:
        seqlens = sorted({min(seqlen, CPU_TEACHING.seqlen) for seqlen in seqlens})
        batch, heads = min(batch, CPU_TEACHING.batch), min(heads, CPU_TEACHING.heads)
    problems = [
        Problem.canonical(seqlen, head_dim=head_dim, batch=batch, heads=heads, dtype=dtype, causal=causal)
        for head_dim in head_dims
        for seqlen in seqlens
        for causal in CAUSAL_MODES[args.causal]
    ]
    alignment = getattr(args, "causal_alignment", "top_left")
    kv_heads = getattr(args, "kv_heads", None)
    if kv_heads is None and alignment == "top_left":
        return problems
    # GQA and the alignment are recorded in every row; a kv_heads that does not divide the heads is
    # refused (exit 2) with both numbers.
    try:
        return [
            problem.with_(kv_heads=kv_heads if kv_heads is not None else problem.heads, causal_alignment=alignment)
            for problem in problems
        ]
    except ValueError as error:
        raise RefusedError(f"--kv-heads: {error}") from error


def _sizes(problems: list) -> str:
    """The distinct sizes of a problem list, without the mask: 'B=2 H=16 S=8192 D=128 bf16'."""
    described = [problem.with_(causal=False).describe().removesuffix(" full") for problem in problems]
    return ", ".join(dict.fromkeys(described))


def teaching_note(args: argparse.Namespace, ran: list) -> str:
    """What was asked for and what the CPU teaching mode runs instead."""
    asked = _sizes(build_problems(args, "cuda"))
    return f"requested {asked}; running {_sizes(ran)} on the Triton interpreter (no CUDA GPU: CPU teaching size)"


def interpreter_estimate_s(problems: list) -> float:
    """A rough wall-clock estimate of the slowest interpreted rung (triton/naive) on these problems."""
    gflop = sum(problem.flops for problem in problems) / 1e9
    return gflop * INTERPRETER_SECONDS_PER_GFLOP * INTERPRETER_CALLS_PER_MEASUREMENT


def _duration(seconds: float) -> str:
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def _beyond_teaching_size(problems: list) -> bool:
    return any(
        problem.seqlen_q > CPU_TEACHING.seqlen
        or problem.batch > CPU_TEACHING.batch
        or problem.heads > CPU_TEACHING.heads
        for problem in problems
    )


def plan_problems(args: argparse.Namespace, device: str, teaching: bool) -> tuple[list, str]:
    """The problems to run and a note for the user and the report ('' when nothing needs saying)."""
    problems = build_problems(args, device, teaching)
    if teaching:
        return problems, teaching_note(args, problems)
    if device == "cpu" and _beyond_teaching_size(problems):
        estimate = _duration(interpreter_estimate_s(problems))
        return problems, (
            f"running {_sizes(problems)} under the Triton interpreter as asked (--device cpu): estimate for "
            f"triton/naive alone, about {estimate} on a 2-core machine; the CPU teaching size is "
            f"S={CPU_TEACHING.seqlen}"
        )
    return problems, ""


def select(implementations: list, only: list[str], skip: list[str]) -> list:
    """Apply --only/--skip globs; a glob matching nothing is an error that lists the valid names."""
    names = [impl.name for impl in implementations]
    for pattern in [*only, *skip]:
        if not fnmatch.filter(names, pattern):
            raise RefusedError(f"no implementation matches {pattern!r}; valid names: {', '.join(names)}")

    def wanted(name: str) -> bool:
        chosen = not only or any(fnmatch.fnmatch(name, pattern) for pattern in only)
        return chosen and not any(fnmatch.fnmatch(name, pattern) for pattern in skip)

    return [impl for impl in implementations if wanted(impl.name)]


def times_a_sweep(problems: list, device: str) -> bool:
    """True for a prefill run on a GPU over several sizes (sequence lengths or head dims)."""
    return device == "cuda" and len({(problem.seqlen_q, problem.head_dim) for problem in problems}) > 1


def without_teaching_rungs(chosen: list, args: argparse.Namespace, workload: str) -> tuple[list, str]:
    """``chosen`` less the teaching rungs, unless ``--all-rungs`` or an ``--only`` names the rung exactly;
    with a note for the user and the report that names the rows left out and why ('' when none)."""
    if args.all_rungs:
        return chosen, ""
    rungs = TEACHING_RUNGS + (DECODE_LEFT_OUT if args.decode else ())
    kept, left_out = [], []
    for item in chosen:
        leave = item.name.split("/")[-1] in rungs and item.name not in args.only
        (left_out if leave else kept).append(item)
    if not left_out:
        return chosen, ""
    names = ", ".join(item.name for item in left_out)
    what = "teaching, FP8 and SDPA math rows" if args.decode else "teaching rungs"
    return kept, f"{what} not timed in {workload} (--all-rungs times them): {names}"


def _record_left_out(env: dict, left_out: str) -> None:
    """The rows a run leaves out (``without_teaching_rungs``' note), for the report and the user."""
    if left_out:
        env["left_out"] = left_out
        print(f"compare.py: {left_out}", file=sys.stderr)


def broken_import(item) -> bool:
    """True when an unavailable module is broken rather than absent by a stated capability reason.

    Stated reasons: the rung is not implemented yet, or an optional third-party package (the CuTe DSL,
    FlashAttention-4) is not installed here. Anything else that stops a module importing is a failure.
    """
    import importlib.util

    if item.reason == "not implemented yet":
        return False
    missing = re.search(r"No module named '([\w.]+)'", item.reason)
    package = missing.group(1).split(".")[0] if missing else None
    return not (package in OPTIONAL_PACKAGES and importlib.util.find_spec(package) is None)


def default_out_dir(device: str, seqlens: list[int]) -> Path:
    import torch

    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    gpu_slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    date = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{date}-{gpu_slug}-s{'-'.join(map(str, seqlens))}"


def availability(chosen: list, problem, device) -> list[tuple[str, str, str]]:
    """(name, can run here: yes / no / failed, reason) per implementation or unavailable module."""
    from common.contract.registry import Unavailable

    rows = []
    for item in chosen:
        if isinstance(item, Unavailable):
            verdict = "failed" if broken_import(item) else "no"
            rows.append((item.name, verdict, f"unavailable: {item.reason}"))
            continue
        try:
            ok, reason = item.check(problem, device)
        except Exception as error:  # noqa: BLE001 - a broken capability check is an answer too
            ok, reason = False, f"capability check raised {type(error).__name__}: {error}"
        rows.append((item.name, "yes" if ok else "no", reason))
    return rows


def list_implementations(args: argparse.Namespace) -> int:
    """--list: every implementation, whether it can run on this machine at the default problem, and why not."""
    import torch
    from rich.console import Console
    from rich.table import Table

    from common.contract.registry import discover

    device, teaching = resolve_device(args.device)
    problem = build_problems(args, device, teaching)[0]
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU, Triton interpreter"
    table = Table(title=f"Implementations on this machine ({where}) at {problem.describe()}")
    for column in ("impl", "runs here", "reason"):
        table.add_column(column, overflow="fold")
    available, missing = discover()
    for name, verdict, reason in availability(ladder_sorted(available + missing), problem, torch.device(device)):
        table.add_row(name, verdict, reason)
    console = Console(width=CONSOLE_WIDTH)
    console.print(table)
    console.print(dispatch_table(torch.device(device), where))
    return 0


def dispatch_problems() -> list:
    """The problems ``--list`` resolves the stack names on: P1 (a prefill) and one decode token."""
    import torch

    from common.contract.problem import Problem

    decode = Problem(1, 32, 1, GPU_DEFAULT_SEQLEN, GPU_DEFAULT_HEAD_DIM, dtype=torch.bfloat16, kv_heads=8)
    return [Problem.canonical(GPU_DEFAULT_SEQLEN), decode]


def dispatch_table(device, where: str):
    """What each stack name (``impl="triton"``, ..., ``"auto"``) runs here, with the candidates it skipped."""
    from rich.table import Table

    from common.contract.dispatch import DISPATCH_NAMES, choose

    table = Table(title=f"Stack names resolved on this machine ({where})")
    for column in ("impl", "problem", "runs", "skipped candidates"):
        table.add_column(column, overflow="fold")
    for problem in dispatch_problems():
        for name in DISPATCH_NAMES:
            choice = choose(name, problem, device)
            chosen = choice.implementation.name if choice.implementation else "[red]nothing: refused[/]"
            skipped = "\n".join(choice.refusal_lines())
            table.add_row(name, problem.describe(), chosen, skipped)
    return table


def _status_colour(status: str) -> str:
    return {"ok": "green", "wrong": "red", "failed": "red", "oom": "yellow", "skipped": "dim"}.get(status, "white")


def _number(value: float, spec: str) -> str:
    return "—" if value != value else format(value, spec)


def stream_line(row, problem_text: str) -> str:
    """The line printed as a row finishes: timings for measured rows, the reason for the others."""
    head = f"{row.impl:18s} {problem_text:40s} {row.status:8s}"
    if row.status not in ("ok", "wrong"):
        return f"{head} {row.reason}"
    speed = f"{row.ms:10.3f} ms {_number(row.tflops, '8.4g')} TFLOP/s"
    return f"{head} {speed} {row.reason}".rstrip()


def print_table(rows: list, console=None) -> None:
    """The final table; long reasons wrap inside their column instead of being cut."""
    from rich.console import Console
    from rich.table import Table

    from common.measure.row_extras import NO_END_TO_END

    caption = f"e2e TFLOP/s: input transformation and kernel timed together; {NO_END_TO_END}"
    table = Table(title="FlashAttention forward", caption=caption)
    for column in ("impl", "shape", "status", "ms", "TFLOP/s", "e2e TFLOP/s", "% peak", "rel L2 err"):
        table.add_column(column, no_wrap=True)
    table.add_column("reason", overflow="fold", ratio=1)
    for row in rows:
        mask = "causal" if row.causal else "full"
        shape = f"S={row.seqlen_q} D={row.head_dim} {row.dtype} {mask}"
        measured = row.status in ("ok", "wrong")
        cells = (
            (row.ms, ".3f"),
            (row.tflops, ".4g"),
            (row.tflops_end_to_end, ".4g"),
            (row.pct_peak, ".0f"),
            (row.rel_l2_err, ".2e"),
        )
        numbers = [_number(value, spec) if measured else "—" for value, spec in cells]
        table.add_row(row.impl, shape, f"[{_status_colour(row.status)}]{row.status}[/]", *numbers, row.reason)
    (console or Console(width=CONSOLE_WIDTH)).print(table)


def _measurer(args: argparse.Namespace, problem, device, options, peaks):
    """A function impl -> row for one problem: in this process, or each in its own (--isolate)."""
    from common.measure.isolation import measure_isolated
    from common.measure.row_extras import complete_row
    from common.measure.runner import make_workload, measure

    if args.isolate:
        return lambda impl: measure_isolated(impl.name, impl, problem, device.type, options, peaks, args.timeout)
    workload = make_workload(problem, device.type)
    return lambda impl: complete_row(measure(impl, workload, device, options, peaks), impl, workload, device, options)


@dataclass
class Run:
    """What a run measured so far; ``interrupted`` is set when Ctrl-C stopped it."""

    out_dir: Path
    env: dict
    peaks: object
    rows: list = field(default_factory=list)
    planned: int = 0
    interrupted: bool = False


def ladder_sorted(items: list) -> list:
    """Implementations and unavailable modules in ladder order: stacks as the registry lists them,
    rungs in ladder order, baselines in their registry order."""
    from common.contract.registry import KNOWN_RUNGS, STACKS

    def key(item) -> tuple[int, int]:
        stack, rung = item.name.split("/")
        return (
            STACKS.index(stack) if stack in STACKS else len(STACKS),
            KNOWN_RUNGS.index(rung) if rung in KNOWN_RUNGS else 0,
        )

    return sorted(items, key=key)


def unavailable_row(item, problem):
    """The row of an implementation whose module is not here: skipped with its reason, failed when broken."""
    from common.measure.runner import blank_row

    stack, rung = item.name.split("/")
    status = "failed" if broken_import(item) else "skipped"
    return blank_row(item.name, stack, rung, problem, status, f"unavailable: {item.reason}")


def _measure_problem(problem, chosen: list, measure_one, run: Run, log, progress, task) -> None:
    """Rows for one problem in ladder order; an unavailable module is skipped, or failed when broken."""
    from common.contract.registry import Unavailable

    for item in chosen:
        progress.update(task, description=f"{item.name} {problem.describe()}")
        row = unavailable_row(item, problem) if isinstance(item, Unavailable) else measure_one(item)
        _record(row, run, log, progress)
        progress.advance(task)


def _record(row, run: Run, log, progress) -> None:
    run.rows.append(row)
    log.append(row)
    mask = "causal" if row.causal else "full"
    progress.console.print(stream_line(row, f"S={row.seqlen_q} D={row.head_dim} {row.dtype} {mask}"), markup=False)


def run_all(args: argparse.Namespace, device_name: str, problems: list, note: str, jobs: dict | None = None) -> Run:
    """Measure every selected implementation on every problem (or, for a ``--gpus`` worker, the
    implementations ``jobs`` names per problem); rows are written as they finish.

    Ctrl-C stops the measuring: the rows done so far stay, and the run is marked interrupted.
    """
    import torch
    from rich.console import Console
    from rich.progress import Progress

    from common.contract.registry import discover
    from common.measure.environment import manifest
    from common.measure.peaks import measure_peaks
    from common.measure.results import CsvLog

    available, missing = discover()
    chosen = ladder_sorted(select(available + missing, args.only, args.skip))
    left_out = ""
    if jobs is None and times_a_sweep(problems, device_name):
        chosen, left_out = without_teaching_rungs(chosen, args, "a sweep")
    out_dir = args.out or default_out_dir(device_name, sorted({p.seqlen_q for p in problems}))
    out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device(device_name)
    env = manifest(device)
    if note:
        env["size_note"] = note
    _record_left_out(env, left_out)
    (out_dir / "env.json").write_text(json.dumps(env, indent=2))
    peaks = measure_peaks(device)
    env["peaks"] = peaks.as_dict()
    planned = sum(map(len, jobs.values())) if jobs else len(problems) * len(chosen)
    run = Run(out_dir, env, peaks, planned=planned)
    log = CsvLog(out_dir / "results.csv")
    options = timing_options(args)
    try:
        with Progress(transient=True, console=Console(width=CONSOLE_WIDTH)) as progress:
            task = progress.add_task("measuring", total=run.planned)
            for problem in problems:
                measure_one = _measurer(args, problem, device, options, peaks)
                wanted = chosen if jobs is None else [item for item in chosen if item.name in jobs[problem]]
                _measure_problem(problem, wanted, measure_one, run, log, progress, task)
    except KeyboardInterrupt:
        run.interrupted = True
        env["interrupted"] = f"Ctrl-C after {len(run.rows)} of {run.planned} measurements"
    if device.type == "cuda":
        from common.measure.environment import gpu_clocks

        env["clocks_end"] = gpu_clocks()
    (out_dir / "env.json").write_text(json.dumps(env, indent=2))
    return run


def write_outputs(run: Run, cpu_only: bool, with_static: bool) -> None:
    """Plots and report.md from results.csv; an interrupted run skips the slow static analysis."""
    import pandas as pd

    from common.reporting.plots import PlotContext, shape_text, write_run_plots, write_sweep_plots, write_tradeoff_plot
    from common.reporting.report import write_report

    frame = pd.read_csv(run.out_dir / "results.csv", dtype={"reason": str})
    frame["reason"] = frame["reason"].fillna("")
    shape = _plot_subset(frame)
    context = PlotContext.from_env(run.env, cpu_only)
    plots = write_run_plots(shape, run.out_dir, context) + write_sweep_plots(frame, run.out_dir, context)
    sections = []
    if with_static and not run.interrupted and not shape.empty:
        table, tradeoff_sections = tradeoff_outputs(shape, run.out_dir)
        sections += tradeoff_sections
        tradeoff_plot = write_tradeoff_plot(table, run.out_dir, context, shape_text(shape))
        plots += [tradeoff_plot] if tradeoff_plot else []
    write_report(frame, run.env, run.peaks, plots, run.out_dir, cpu_only, sections)


def tradeoff_outputs(shape, out_dir: Path):
    """tradeoffs.csv and the report sections: compile every rung for sm_90a, join the timed rows."""
    from common.contract.problem import DTYPE_NAMES, Problem
    from common.reporting.report import markdown_table
    from common.reporting.static import static_report_subprocess
    from common.reporting.tradeoffs import feature_matrix, implementation_table, side_by_side

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
    columns = tuple((c, c) for c in pairs.columns)
    sections = [
        (f"The stacks, rung by rung ({problem.describe()})", markdown_table(pairs, columns)),
        ("Instructions in the PTX of each rung (compiled for sm_90a)", feature_matrix(static_rows)),
    ]
    return table, sections


def _plot_subset(frame):
    """The per-run plots show one shape: the largest sequence length at the largest head dim."""
    largest = frame[frame["seqlen_q"] == frame["seqlen_q"].max()]
    return largest[largest["head_dim"] == largest["head_dim"].max()]


def exit_status(run: Run) -> int:
    """0 when every selected row ran and passed or was skipped for a stated reason; 130 when
    interrupted; 1 when any row was wrong, failed, timed out, ran out of memory or failed to import."""
    from common.measure.results import BAD_STATUSES

    bad = sorted({f"{row.impl} ({row.status})" for row in run.rows if row.status in BAD_STATUSES})
    if bad:
        print(f"compare.py: did not pass: {', '.join(bad)}", file=sys.stderr)
    if run.interrupted:
        print(f"compare.py: interrupted; {run.env['interrupted']}; kept in {run.out_dir}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 1 if bad else 0


# ----------------------------------------------------------------------------------------------
# --decode: the decode workload (common/measure/decode_sweep.py), one row per implementation and case
# ----------------------------------------------------------------------------------------------
DECODE_COLUMNS = (
    "impl", "case", "batch", "heads", "kv_heads", "seqlen_k", "lengths", "status", "us", "gbps", "pct_read_bw",
    "pct_roofline", "read_floor_us", "pct_read_floor", "rel_l2_err", "sdpa_rel_l2_err", "reason",
)  # fmt: skip


def decode_cases_for(args: argparse.Namespace) -> list:
    from common.measure import decode_sweep

    if args.decode_random:
        return decode_sweep.random_cases(args.decode_random, args.decode_seed)
    return decode_sweep.decode_cases(
        tuple(args.decode_batch or decode_sweep.BATCHES),
        tuple(args.decode_seqlen or decode_sweep.CACHE_LENGTHS),
        tuple(args.decode_kv_heads or decode_sweep.KV_HEADS),
        ragged=not args.decode_no_ragged,
        paged=not args.decode_no_paged,
    )


def decode_record(
    row, case, read_gbps: float | None, gemm_tflops: float | None = None, read_floor_us: float | None = None
) -> dict:
    """A decode.csv record: the time in µs, K+V bytes read per second and their share of the read peak,
    the share of the roofline (``decode_sweep.roofline_us``: the bytes at ``read_gbps`` or the FLOPs
    at ``gemm_tflops``, the sustained bf16 GEMM rate, whichever takes longer), and the share of
    ``read_floor_us``, the time a plain read of the case's K+V bytes took in the same run
    (``peaks.same_size_read_us``; NaN where not measured)."""
    from common.measure.decode_sweep import roofline_us

    measured = row.status in ("ok", "wrong")
    gbps = case.kv_bytes_read / (row.ms * 1e-3) / 1e9 if measured else float("nan")
    us = row.ms * 1e3 if measured else float("nan")
    floor_us = read_floor_us if read_floor_us else float("nan")
    problem = case.problem
    return {
        "impl": row.impl, "case": case.describe(), "batch": problem.batch, "heads": problem.heads,
        "kv_heads": problem.kv_heads, "seqlen_k": problem.seqlen_k,
        "lengths": " ".join(map(str, case.lengths)) if case.lengths else "", "status": row.status,
        "us": us, "gbps": gbps, "pct_read_bw": 100 * gbps / read_gbps if read_gbps else float("nan"),
        "pct_roofline": 100 * roofline_us(case, read_gbps, gemm_tflops) / us,
        "read_floor_us": floor_us, "pct_read_floor": 100 * floor_us / us,
        "rel_l2_err": row.rel_l2_err, "sdpa_rel_l2_err": row.sdpa_rel_l2_err, "reason": row.reason,
    }  # fmt: skip


def lowest_bandwidth_line(records: list[dict]) -> str:
    """Each implementation's lowest share of the read bandwidth over the cases it ran (the issue #38
    yardstick: a decode rung is as good as its worst shape), and the case where it fell that low (with its
    share of the roofline where that differs, and of a plain read of the same bytes where it was measured)."""
    from common.reporting.decode_table import bandwidth_share, same_size_read_share

    worst: dict[str, dict] = {}
    for record in records:
        if record["status"] == "ok" and math.isfinite(record["pct_read_bw"]):
            held = worst.get(record["impl"])
            if held is None or record["pct_read_bw"] < held["pct_read_bw"]:
                worst[record["impl"]] = record
    parts = [
        f"{impl} {bandwidth_share(record['pct_read_bw'], record.get('pct_roofline', math.nan))}"
        f"{same_size_read_share(record.get('pct_read_floor', math.nan))} ({record['case']})"
        for impl, record in worst.items()
    ]
    return "lowest % of read bandwidth: " + ("; ".join(parts) if parts else "no row ran")


def write_decode_outputs(records: list[dict], env: dict, peaks, out_dir: Path) -> list[Path]:
    """decode_gbps.png and report.md beside decode.csv; returns what was written."""
    import pandas as pd

    from common.reporting.plots import PlotContext, write_decode_plot
    from common.reporting.report import write_decode_report

    plot = write_decode_plot(pd.DataFrame.from_records(records), out_dir, PlotContext.from_env(env, cpu_only=False))
    plots = [plot] if plot else []
    return [*plots, write_decode_report(env, peaks, plots, out_dir)]


def run_decode(args: argparse.Namespace) -> int:
    """Every selected implementation on every decode case: checked against fp64, timed, written to
    decode.csv as each finishes; cases too large for the GPU are skipped with the reason."""
    import csv

    import torch
    from rich.console import Console
    from rich.table import Table

    from common.contract.registry import Unavailable, discover
    from common.measure.decode_sweep import too_large
    from common.measure.environment import manifest
    from common.measure.peaks import measure_peaks, same_size_read_us
    from common.measure.runner import blank_row, freeze_imports, make_workload, measure

    if not torch.cuda.is_available() or args.device == "cpu":
        raise RefusedError("--decode needs a CUDA GPU (its caches are far beyond the Triton interpreter's reach)")
    device = torch.device("cuda")
    available, missing = discover()
    chosen, left_out = without_teaching_rungs(
        ladder_sorted(select(available + missing, args.only, args.skip)), args, "--decode"
    )
    out_dir = args.out or Path("runs") / f"{dt.datetime.now():%Y%m%d-%H%M%S}-decode"
    out_dir.mkdir(parents=True, exist_ok=True)
    env = manifest(device)
    _record_left_out(env, left_out)
    # The read bandwidth is the decode rows' ceiling; the GEMM peaks and the copy stand beside it.
    peaks = measure_peaks(device)
    read_gbps = peaks.read_gbps
    env["peaks"] = peaks.as_dict()
    (out_dir / "env.json").write_text(json.dumps(env, indent=2))
    options = timing_options(args)
    records = []
    freeze_imports()
    console = Console(width=CONSOLE_WIDTH)
    console.print(f"HBM read bandwidth (measured): {_number(read_gbps or float('nan'), '.0f')} GB/s")
    with (out_dir / "decode.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, DECODE_COLUMNS)
        writer.writeheader()
        for case in decode_cases_for(args):
            reason = too_large(case, device)
            # Before the case's own tensors, so that the two never hold the GPU's memory at once.
            read_floor_us = None if reason else same_size_read_us(case.kv_bytes_read, device, **asdict(options))
            torch.cuda.empty_cache()
            # Drawn on the GPU: the CPU's generator takes about a minute for the largest caches.
            cache_seqlens = None if reason else case.cache_seqlens(device)
            workload = None if reason else make_workload(case.problem, "cuda", cache_seqlens, on_device=True)
            for impl in chosen:
                started = time.perf_counter()
                if isinstance(impl, Unavailable):  # said in every case's rows, as the prefill sweep says it
                    row = unavailable_row(impl, case.problem)
                elif workload is None:
                    row = blank_row(impl.name, impl.stack, impl.rung, case.problem, "skipped", reason)
                else:
                    row = measure(impl, workload, device, options, peaks)
                record = decode_record(row, case, read_gbps, peaks.bf16_sustained_tflops, read_floor_us)
                records.append(record)
                writer.writerow(record)
                handle.flush()
                speed = (
                    f"{record['us']:9.1f} us {record['gbps']:7.0f} GB/s {record['pct_read_bw']:4.0f}% "
                    f"{record['pct_roofline']:4.0f}% roof {record['pct_read_floor']:4.0f}% same-size read"
                )
                # The row's wall time (compile, checks and timing): what the sweep's length is made of.
                took = f"[{time.perf_counter() - started:5.1f} s]"
                console.print(
                    f"{row.impl:18s} {case.describe():60s} {row.status:8s} {speed} {took} {row.reason}", markup=False
                )
            del workload
            torch.cuda.empty_cache()
    read = _number(read_gbps or float("nan"), ".0f")
    gemm = _number(peaks.bf16_sustained_tflops or float("nan"), ".0f")
    table = Table(
        title=f"Decode: µs, GB/s of K+V read, % of {read} GB/s read, % of the roofline (also {gemm} TFLOP/s bf16), "
        "% of the speed of a plain read of the same bytes"
    )
    for column in ("impl", "case", "status", "µs", "GB/s", "% read BW", "% roofline", "% same-size read", "rel L2 err"):
        table.add_column(column, no_wrap=column != "case")
    table.add_column("reason", overflow="fold", ratio=1)
    for record in records:
        shown = (
            ("us", ".1f"),
            ("gbps", ".0f"),
            ("pct_read_bw", ".0f"),
            ("pct_roofline", ".0f"),
            ("pct_read_floor", ".0f"),
        )
        cells = [_number(record[key], spec) for key, spec in shown]
        status = f"[{_status_colour(record['status'])}]{record['status']}[/]"
        table.add_row(
            record["impl"], record["case"], status, *cells, _number(record["rel_l2_err"], ".2e"), record["reason"]
        )
    console.print(table)
    print(lowest_bandwidth_line(records))
    written = write_decode_outputs(records, env, peaks, out_dir)
    print(f"wrote {out_dir}/decode.csv, env.json, {', '.join(path.name for path in written)}")
    from common.measure.results import BAD_STATUSES

    bad = sorted({f"{r['impl']} ({r['status']})" for r in records if r["status"] in BAD_STATUSES})
    if bad:
        print(f"compare.py: did not pass: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


# ----------------------------------------------------------------------------------------------
# --backward: the backward pass of every implementation that has one (common/measure/backward.py)
# ----------------------------------------------------------------------------------------------
def backward_timer(device: str):
    """Milliseconds of one call: device-event medians on a GPU, one wall-clock run under the interpreter."""
    from common.measure.timing import time_cuda, time_host

    if device == "cuda":
        return lambda fn: time_cuda(fn).ms
    return lambda fn: time_host(fn, warmup=0, rep=1).ms


def run_backward(args: argparse.Namespace) -> int:
    """Every selected implementation with a backward on every problem: gradients judged against fp64
    (2 × SDPA's error per gradient), backward and forward + backward timed, rows to backward.csv as they
    finish (``--rounds`` > 1: a problem's rows together, after its interleaved rounds); then plots and
    report.md."""
    import csv

    import pandas as pd
    import torch

    from common.contract.gradients import backward_inputs, sdpa_gradients
    from common.contract.registry import discover
    from common.measure.backward import COLUMNS, backward_rows, differentiable, reference_gradients_by_head
    from common.measure.environment import manifest
    from common.measure.rounds import ROUNDS_COLUMN
    from common.reporting.backward_report import write_backward_report

    device_name, teaching = resolve_device(args.device)
    problems, note = plan_problems(args, device_name, teaching)
    available, _ = discover()
    chosen = ladder_sorted(select(available, args.only, args.skip))
    implementations = [impl for impl in chosen if differentiable(impl)]
    forward_only = [impl.name for impl in chosen if not differentiable(impl)]
    out_dir = args.out or Path("runs") / f"{dt.datetime.now():%Y%m%d-%H%M%S}-backward"
    out_dir.mkdir(parents=True, exist_ok=True)
    env = manifest(torch.device(device_name))
    if note:
        env["size_note"] = note
        print(f"compare.py: {note}", file=sys.stderr)
    _record_left_out(env, f"forward-only: {', '.join(forward_only)}" if forward_only else "")
    (out_dir / "env.json").write_text(json.dumps(env, indent=2))
    timer, records = backward_timer(device_name), []
    # The per-round times only with rounds to show: one round writes the columns it always has.
    columns = (*COLUMNS, ROUNDS_COLUMN) if args.rounds > 1 else COLUMNS
    with (out_dir / "backward.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, columns)
        writer.writeheader()
        for problem in problems:
            inputs = backward_inputs(problem, seed=0, device=device_name)
            judged_against = (reference_gradients_by_head(*inputs, problem), sdpa_gradients(*inputs, problem))
            for record in backward_rows(implementations, problem, inputs, judged_against, timer, args.rounds):
                records.append(record)
                writer.writerow(record)
                handle.flush()
                ms, tflops = (
                    _number(record.get(key, math.nan), spec)
                    for key, spec in (("bwd_ms", "9.3f"), ("bwd_tflops", "6.1f"))
                )
                status = f"{record['status']:8s} {ms} ms {tflops} TFLOP/s"
                print(f"{record['impl']:22s} {problem.describe():56s} {status} {record['reason']}")
            del inputs, judged_against
            if device_name == "cuda":
                torch.cuda.empty_cache()
    written = write_backward_report(
        pd.DataFrame.from_records(records, columns=columns), env, out_dir, device_name == "cpu"
    )
    print(f"wrote {out_dir}/backward.csv, env.json, {', '.join(path.name for path in written)}")
    from common.measure.results import BAD_STATUSES

    bad = sorted({f"{r['impl']} ({r['status']})" for r in records if r["status"] in BAD_STATUSES})
    if bad:
        print(f"compare.py: did not pass: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


# ----------------------------------------------------------------------------------------------
# --gpus N: the sweep spread over N GPUs of this host (common/measure/multi_gpu.py)
# ----------------------------------------------------------------------------------------------
def run_multi_gpu(args: argparse.Namespace, argv: list[str]) -> int:
    """One ``compare.py --jobs`` worker per GPU over its share of the jobs, then one merged results.csv
    (with a ``gpu`` column) and report.md; each worker's own outputs stay under ``gpu<i>/``."""
    import torch

    from common.contract.registry import discover
    from common.measure import multi_gpu
    from common.reporting.multi_gpu import write_merged_report

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    try:
        devices = multi_gpu.visible_devices(args.gpus, dict(os.environ), count)
    except ValueError as error:
        raise RefusedError(str(error)) from error
    problems, note = plan_problems(args, "cuda", False)
    available, missing = discover()
    chosen = ladder_sorted(select(available + missing, args.only, args.skip))
    left_out = ""
    if times_a_sweep(problems, "cuda"):
        chosen, left_out = without_teaching_rungs(chosen, args, "a sweep")
    if left_out:
        print(f"compare.py: {left_out}", file=sys.stderr)
    names = [item.name for item in chosen]
    seqlens = "-".join(str(s) for s in sorted({p.seqlen_q for p in problems}))
    out_dir = args.out or Path("runs") / f"{dt.datetime.now():%Y%m%d-%H%M%S}-gpus{args.gpus}-s{seqlens}"
    base = [sys.executable, str(Path(__file__).resolve()), *multi_gpu.strip_options(argv, ("--gpus", "--out"))]
    workers = []
    for index, (device, jobs) in enumerate(zip(devices, multi_gpu.assign(problems, names, args.gpus), strict=True)):
        if jobs:
            folder = out_dir / multi_gpu.WORKER_DIR.format(index=index)
            folder.mkdir(parents=True, exist_ok=True)
            multi_gpu.write_jobs(folder / multi_gpu.JOBS_FILE, jobs)
            command = [*base, "--jobs", str(folder / multi_gpu.JOBS_FILE), "--out", str(folder), "--no-static"]
            workers.append(multi_gpu.Worker(index, device, folder, command))
            print(f"compare.py: GPU {device}: {len(jobs)} jobs, log in {folder / multi_gpu.LOG_FILE}")
    try:
        statuses = multi_gpu.run_workers(workers, dict(os.environ))
    except KeyboardInterrupt:
        statuses = [EXIT_INTERRUPTED] * len(workers)
    frame = multi_gpu.merge_results(workers, out_dir / "results.csv")
    by_device = {worker.device: status for worker, status in zip(workers, statuses, strict=True)}
    write_merged_report(frame, multi_gpu.worker_envs(workers), by_device, out_dir, note, left_out)
    print(f"wrote {out_dir}/results.csv (a gpu column) and report.md; each GPU's own outputs in gpu<i>/")
    if EXIT_INTERRUPTED in statuses:
        return EXIT_INTERRUPTED
    return 0 if all(status == 0 for status in statuses) else 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--generate"]:
        from bench.generate import main as generate

        return generate(argv[1:])
    args = parse_args(argv)
    try:
        if args.list:
            return list_implementations(args)
        if args.decode:
            return run_decode(args)
        if args.backward:
            return run_backward(args)
        if args.gpus:
            return run_multi_gpu(args, argv)
        device_name, teaching = resolve_device(args.device)
        jobs = None
        if args.jobs:
            from common.measure.multi_gpu import read_jobs

            jobs = read_jobs(args.jobs)
            problems, note = list(jobs), ""
        else:
            problems, note = plan_problems(args, device_name, teaching)
        if note:
            print(f"compare.py: {note}", file=sys.stderr)
        run = run_all(args, device_name, problems, note, jobs)
        write_outputs(run, cpu_only=device_name == "cpu", with_static=not args.no_static)
    except RefusedError as refusal:
        print(f"compare.py: {refusal}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("compare.py: interrupted; rows measured so far, if any, are in results.csv", file=sys.stderr)
        return EXIT_INTERRUPTED
    print_table(run.rows)
    print(f"wrote {run.out_dir}/results.csv, env.json, report.md and plots")
    return exit_status(run)


if __name__ == "__main__":
    sys.exit(main())
