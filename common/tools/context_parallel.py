"""Context parallelism on the GPUs of one host: our ring attention with each implementation that returns
the LSE, against PyTorch's ``context_parallel`` with SDPA, as scaling efficiency over one GPU.

    torchrun --nproc-per-node 4 -m common.tools.context_parallel --out runs/cp4
    torchrun --nproc-per-node 2 -m common.tools.context_parallel --tokens-per-gpu 32768 --impl cute/hopper
    torchrun --nproc-per-node 2 -m common.tools.context_parallel --device cpu --tokens-per-gpu 64 \\
        --heads 2 --head-dim 32 --impl triton/tiled --torch-cp none          # gloo on CPUs (tests)

Every process is one rank with one GPU (NCCL) or a CPU (gloo, ``--device cpu``: the Triton rungs under
the interpreter, for tests). One sequence of N x T tokens (T = ``--tokens-per-gpu``, N processes),
B=1, H=16, D=128, bf16 by default, is zig-zag sharded over the ranks. Per implementation (default:
the Hopper rungs of the three stacks, which return the LSE), tokens per GPU and mask, one row
(``common.measure.context_parallel``): checked against float64 on sampled rows of every rank, the
ring timed with and without its transfers, its steps' kernels timed alone, and the same
implementation on one GPU at S = T. PyTorch's ``context_parallel`` runs with each SDPA backend of
``--torch-cp`` (head-tail load balancing when causal; K/V rotated by ``--torch-cp-rotate``: NCCL
all-to-all or all-gather; nothing uses symmetric memory or multicast). The one-GPU baseline runs in
the same launch on every rank's GPU at once, after the ring; its median is the row's.

Outputs (rank 0) under ``--out`` (default ``runs/<date>-cp<N>-<gpu>/``): results.csv (rows appended as
they finish, longest shards first), env.json (GPUs, ``nvidia-smi topo -m``, NCCL version, the
multicast settings), efficiency.png and report.md.

Exit status: 0 every row ran and passed (skips with a stated reason are fine); 1 a row was wrong,
failed or ran out of memory, or ``--deadline-s`` left rows unrun; 2 refused: not started by torchrun,
fewer GPUs than processes on this host (``--device cpu`` is the CPU test mode), or bad arguments.
(torchrun itself reports a child's non-zero status as its own failure.)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

EXIT_REFUSED = 2
DEFAULT_IMPLS = ("cute/hopper", "gluon/hopper", "triton/hopper")
DEFAULT_TOKENS = (32768, 65536, 131072, 262144)
DEFAULT_TORCH_CP = ("cudnn", "flash")
# Set by the GPU hosts this project runs on and kept whatever happens: NVLink multicast (NVLS) can
# take a host's shared GPUs out of service. The ring needs only point-to-point transfers; PyTorch's
# context_parallel here uses plain NCCL all-to-all / all-gather. Defaults only: a value already set
# is never changed.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
METHOD_NOTE = (
    "ring ms: per repetition the slowest rank (each repetition starts at a barrier on idle GPUs, timed by "
    "device events), median over repetitions; TFLOP/s per GPU = FLOPs of the whole sequence (causal: "
    "unmasked scores only) ÷ N ÷ ring time; 1 GPU: the same implementation without a ring at S = tokens "
    "per GPU, timed on every rank's GPU at once in the same launch, median over ranks; efficiency = the "
    "two TFLOP/s' ratio; Σ steps: each step shape of a rank's plan timed alone, summed, slowest rank; "
    "no-transfer ms: the ring with communicate=False (kernels and merges only)"
)


class RefusedError(Exception):
    """The launch cannot run as asked; the message is the one line printed (exit status 2)."""


def _positive_ints(text: str) -> list[int]:
    values = [item.strip() for item in text.split(",")]
    if not all(re.fullmatch(r"\d+", value) and int(value) > 0 for value in values):
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return [int(value) for value in values]


def _positive_int(text: str) -> int:
    values = _positive_ints(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"expected one positive integer, got {text!r}")
    return values[0]


def _backends(text: str) -> list[str]:
    from common.measure.context_parallel import TORCH_CP_BACKENDS

    if text == "none":
        return []
    names = [item.strip() for item in text.split(",")]
    unknown = [name for name in names if name not in TORCH_CP_BACKENDS]
    if unknown:
        raise argparse.ArgumentTypeError(f"SDPA backends are {', '.join(TORCH_CP_BACKENDS)} or none, got {unknown}")
    return names


def build_parser() -> argparse.ArgumentParser:
    from common.measure.context_parallel import TORCH_CP_ROTATE

    parser = argparse.ArgumentParser(
        prog="torchrun --nproc-per-node N -m common.tools.context_parallel",
        description="Ring attention on N GPUs per implementation, against PyTorch's context_parallel.",
        epilog="Exit status: 0 all rows ran and passed; 1 a row was wrong, failed or ran out of memory; 2 refused.",
    )
    parser.add_argument(
        "--tokens-per-gpu",
        type=_positive_ints,
        default=list(DEFAULT_TOKENS),
        help="tokens per GPU, comma-separated (default 32768,65536,131072,262144)",
    )
    parser.add_argument("--batch", type=_positive_int, default=1, help="batch (default 1)")
    parser.add_argument("--heads", type=_positive_int, default=16, help="query heads (default 16)")
    parser.add_argument("--kv-heads", type=_positive_int, help="K/V heads, a divisor of the heads (default: heads)")
    parser.add_argument("--head-dim", type=_positive_int, default=128, help="head dim (default 128)")
    parser.add_argument(
        "--dtype", choices=("bf16", "fp16", "fp32"), help="dtype (default bf16; fp32 with --device cpu)"
    )
    parser.add_argument("--causal", choices=("true", "false", "both"), default="both", help="mask (default both)")
    parser.add_argument(
        "--impl",
        action="append",
        help=f"local kernel of the ring, a registered implementation that returns the LSE (repeatable; "
        f"default {', '.join(DEFAULT_IMPLS)})",
    )
    parser.add_argument(
        "--torch-cp",
        type=_backends,
        default=list(DEFAULT_TORCH_CP),
        help="SDPA backends for PyTorch's context_parallel, comma-separated, or none (default cudnn,flash)",
    )
    parser.add_argument(
        "--torch-cp-rotate",
        choices=TORCH_CP_ROTATE,
        default="alltoall",
        help="how PyTorch's context_parallel passes K/V (NCCL all-to-all or all-gather; default alltoall)",
    )
    parser.add_argument(
        "--transfer-first",
        action="store_true",
        help="our ring issues each step's transfer before its kernel, not after (the order to compare)",
    )
    parser.add_argument("--check-rows", type=_positive_int, default=32, help="rows per rank checked (default 32)")
    parser.add_argument(
        "--target-ms", type=float, default=2000.0, help="timed milliseconds per measurement (default 2000)"
    )
    parser.add_argument("--min-reps", type=_positive_int, default=3, help="fewest timed repetitions (default 3)")
    parser.add_argument("--max-reps", type=_positive_int, default=20, help="most timed repetitions (default 20)")
    parser.add_argument(
        "--deadline-s",
        type=float,
        help="after this many seconds, the rows not yet started are recorded as skipped (default: none)",
    )
    parser.add_argument("--timeout-s", type=_positive_int, default=900, help="process-group timeout (default 900)")
    parser.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cuda (NCCL) or cpu (gloo tests)")
    parser.add_argument("--out", type=Path, help="output folder (default runs/<date>-cp<N>-<gpu>/)")
    return parser


# ----------------------------------------------------------------------------------------------
# The launch
# ----------------------------------------------------------------------------------------------
def _launch_layout() -> tuple[int, int, int, int]:
    """(rank, world size, local rank, local world size) from torchrun's environment."""
    missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
    if missing:
        raise RefusedError(
            f"not started by torchrun ({', '.join(missing)} unset): run "
            "torchrun --nproc-per-node N -m common.tools.context_parallel ..."
        )
    return tuple(int(os.environ[name]) for name in TORCHRUN_VARIABLES)  # type: ignore[return-value]


def start(args: argparse.Namespace):
    """Initialise the process group for this rank: NCCL with one GPU per process, or gloo on CPUs."""
    rank, world_size, local_rank, local_world = _launch_layout()
    if args.device == "cpu":
        # Before any rung is imported: the Triton rungs run on CPU tensors under the interpreter.
        os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import torch.distributed as dist

    from common.measure.context_parallel import Ranks

    timeout = dt.timedelta(seconds=args.timeout_s)
    if args.device == "cpu":
        dist.init_process_group("gloo", timeout=timeout)
        return Ranks(rank, world_size, torch.device("cpu"), dist.group.WORLD)
    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if found < local_world:
        raise RefusedError(
            f"{local_world} processes on this host need {local_world} CUDA GPUs, found {found}; "
            "--device cpu runs the gloo test mode"
        )
    for name, value in MULTICAST_OFF.items():
        os.environ.setdefault(name, value)
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    # High-priority NCCL streams: when a local kernel's blocks retire, the transfer's blocks go first.
    options = dist.ProcessGroupNCCL.Options(is_high_priority_stream=True)
    dist.init_process_group("nccl", timeout=timeout, device_id=device, pg_options=options)
    control = dist.new_group(backend="gloo", timeout=timeout)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cuda", (world_size,))
    return Ranks(rank, world_size, device, control, mesh)


def sweep_points(args: argparse.Namespace):
    """Longest shards first (the rows that matter most finish first), then the masks."""
    from common.contract.problem import DTYPE_NAMES
    from common.measure.context_parallel import SweepPoint

    dtype = DTYPE_NAMES[args.dtype or ("fp32" if args.device == "cpu" else "bf16")]
    masks = {"true": (True,), "false": (False,), "both": (False, True)}[args.causal]
    return [
        SweepPoint(tokens, args.batch, args.heads, args.kv_heads or args.heads, args.head_dim, dtype, causal)
        for tokens in sorted(args.tokens_per_gpu, reverse=True)
        for causal in masks
    ]


def _nvidia_smi(*arguments: str) -> str | None:
    try:
        done = subprocess.run(["nvidia-smi", *arguments], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def environment(ranks, args: argparse.Namespace) -> dict:
    """env.json: the usual manifest plus the launch, every rank's GPU, the links and NCCL."""
    import torch

    from common.measure.context_parallel import gather
    from common.measure.environment import manifest

    env = manifest(ranks.device)
    names = gather(ranks, torch.cuda.get_device_name(ranks.device) if ranks.device.type == "cuda" else "cpu")
    nccl = torch.cuda.nccl.version() if ranks.device.type == "cuda" else None
    env.update(
        world_size=ranks.world_size,
        backend="nccl" if ranks.device.type == "cuda" else "gloo",
        gpus_by_rank=names,
        nccl=".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
        topology=_nvidia_smi("topo", "-m") if ranks.device.type == "cuda" else None,
        multicast_settings={name: os.environ.get(name) for name in MULTICAST_OFF},
        nccl_high_priority_streams=ranks.device.type == "cuda",
        torch_cp_rotate=args.torch_cp_rotate,
        method_note=METHOD_NOTE,
    )
    return env


def default_out(ranks) -> Path:
    import torch

    gpu = torch.cuda.get_device_name(ranks.device) if ranks.device.type == "cuda" else "cpu"
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    return Path("runs") / f"{dt.datetime.now():%Y%m%d-%H%M%S}-cp{ranks.world_size}-{slug}"


def _line(row) -> str:
    mask = "causal" if row.causal else "full"
    head = f"{row.method:8s} {row.impl:14s} T={row.tokens_per_gpu:<7d} {mask:6s} {row.status:7s}"
    if row.status not in ("ok", "wrong"):
        return f"{head} {row.reason}"
    return (
        f"{head} ring {row.ring_ms:9.2f} ms  {row.tflops_per_gpu:6.1f} TFLOP/s/GPU  1 GPU {row.single_gpu_tflops:6.1f}"
        f"  eff {row.efficiency:5.3f}  ring/Σsteps {row.hidden_ratio:5.3f}  rel_l2 {row.rel_l2_err:.2e} {row.reason}"
    )


def run(args: argparse.Namespace, ranks) -> int:
    """The sweep: one row per (tokens, mask, method), written by rank 0 as it finishes."""
    from common.measure.context_parallel import CP_COLUMNS, Options, blank_row, gather, measure_ring, measure_torch_cp
    from common.measure.results import CsvLog
    from common.reporting.context_parallel import exit_status, read_rows, write_efficiency_plot, write_report

    leader = ranks.rank == 0
    out_dir = Path(gather(ranks, str(args.out or default_out(ranks)))[0])
    env = environment(ranks, args)
    if leader:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "env.json").write_text(json.dumps(env, indent=2))
        log = CsvLog(out_dir / "results.csv", CP_COLUMNS)
    options = Options(
        args.check_rows, args.target_ms, args.min_reps, args.max_reps, args.seed, args.torch_cp_rotate,
        args.transfer_first,
    )  # fmt: skip
    methods = [("ring", impl) for impl in args.impl or DEFAULT_IMPLS] + [("torch-cp", b) for b in args.torch_cp]
    began = time.perf_counter()
    for point in sweep_points(args):
        for method, name in methods:
            late = args.deadline_s is not None and time.perf_counter() - began > args.deadline_s
            if gather(ranks, late)[0]:
                label = name if method == "ring" else f"sdpa/{name}"
                row = blank_row(method, label, point, ranks)
                row.status, row.reason = "skipped", f"not run: --deadline-s {args.deadline_s:g} reached"
                env["interrupted"] = f"--deadline-s {args.deadline_s:g} reached; later rows are skipped"
            elif method == "ring":
                row = measure_ring(ranks, name, point, options)
            else:
                row = measure_torch_cp(ranks, name, point, options)
            if leader:
                log.append(row.record())
                print(_line(row), flush=True)
    if not leader:
        return 0
    frame = read_rows(out_dir / "results.csv")
    (out_dir / "env.json").write_text(json.dumps(env, indent=2))
    shape = f"B={args.batch} H={args.heads} D={args.head_dim}, {ranks.world_size} × {env.get('gpu') or 'CPU'}"
    plot = write_efficiency_plot(frame, out_dir, f"Ring attention scaling, {shape}")
    write_report(frame, env, out_dir, plot)
    print(f"wrote {out_dir}/results.csv, env.json, report.md" + (", efficiency.png" if plot else ""))
    # A row the deadline left unrun is not a pass: the sweep did not finish.
    return 1 if "interrupted" in env else exit_status(frame)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and validate; errors exit with status 2 before any process group starts."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.kv_heads and args.heads % args.kv_heads:
        parser.error(f"--kv-heads must divide --heads (GQA groups), got {args.kv_heads} and {args.heads}")
    if args.min_reps > args.max_reps:
        parser.error(f"--min-reps {args.min_reps} exceeds --max-reps {args.max_reps}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        ranks = start(args)
    except RefusedError as refusal:
        if os.environ.get("LOCAL_RANK", "0") == "0":
            print(f"context_parallel: {refusal}", file=sys.stderr)
        return EXIT_REFUSED
    from common.distributed.teardown import leaving_process_group
    from common.measure.context_parallel import gather

    with leaving_process_group(ranks.control):
        status = run(args, ranks)
        # Every rank leaves with the leader's status.
        status = gather(ranks, status)[0]
    return status


if __name__ == "__main__":
    from common.distributed.teardown import exit_without_finalising

    exit_without_finalising(main())
