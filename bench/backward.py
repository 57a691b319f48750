"""The backward pass timed on one GPU at issue #40's anchor shapes (bf16), in two modes:

    python -m bench.backward --out $OUT/backward                  # ladder rows against cuDNN, flash, FA4
    python -m bench.backward --impl cute/tiled --shape P1 --out $OUT/p1   # chosen rows and anchor shapes
    python -m bench.backward --candidates --out $OUT/candidates   # the tiled rung's variants, to pick one
    python -m bench.backward --candidates --rung gluon --out $OUT/gluon-candidates   # gluon/backward/hopper's
    python -m bench.backward --candidates --rung cute --out $OUT/cute-candidates     # cute/backward/hopper's
    python -m bench.backward --candidates --rung cute --variant default --variant m64_s2_dqreduce --out $OUT/c
    python -m bench.backward --shape P1 --shape 'P1 causal' --impl gluon/hopper --out $OUT/p1   # a selection
    python -m bench.backward --candidates --shape 'D256 B2 H16 S4096' --out $OUT/d256   # a shape only named
    python -m bench.backward --rounds 4 --shape 'D64 B4 H32' --impl cute/hopper --out $OUT/r   # interleaved

Default mode: per (shape, implementation) -- each forward rung that has a backward (through
``common.attention``'s autograd), SDPA's cuDNN and flash backends and FlashAttention-4's backward
(``fa4/sm90``, where ``flash_attn.cute`` imports) -- the forward once with inputs that require grad, then
``torch.autograd.grad`` of O with a fixed dO timed alone and forward + backward timed together
(``common.measure.backward``; device events, L2 flushed, median). Writes results.csv.

``--candidates``: per shape, O and the LSE from one untimed forward (``triton/hopper``), then every
variant of ``triton_impl/backward/tiled.py``'s ``CANDIDATES`` for the head dim (tiles × warps × stages,
TMA or pointer loads, dQ by atomics or by a separate pass) called directly (``--rung gluon``: the
forward ``gluon/hopper`` and the tiles of ``triton_impl/gluon/backward.py``'s ``CANDIDATES``; ``--rung
cute``: ``cute/hopper`` and ``cute_impl/backward/hopper.py``'s): its gradients are checked first
(relative L2 distance of dQ, dK and dV from cuDNN's on the same inputs, at most
:data:`CHECK_BOUND`; a variant that fails is reported ``wrong`` and not timed), then its backward is
timed alone, beside cuDNN's, flash's and FA4's backward timed alike. Writes candidates.csv and prints a
table per shape with TFLOP/s and the ratios to cuDNN and FA4; the fastest correct variant per head dim
is the one to make the default.

``--rounds N`` (both modes; default 1): one pass times the rows one after another in a fixed order, the
baselines first, and a GPU that a long run has heated (700 W cap, lower clock) makes the rows timed last
look slower (issue #40's ratios to FA4 are ratios within one run). With N > 1, per shape, every row is
checked first (gradients and distances, once; a ``wrong`` variant is not timed), then every row's timings
are taken once per round, the order reversed every other round (``common.measure.rounds``; an even N gives
each row the early and the late places equally); each time is the median over rounds of that round's
median, and ``rounds_ms`` lists the backward's per-round values; a shape's rows are written together,
after its rounds. With one round each row is checked, timed and written before the next is checked (one
row's graphs in memory at a time), and there is no ``rounds_ms`` column.

TFLOP/s of the backward = 2.5 × the forward's FLOPs (4·D per unmasked score) / time, as issue #40
counts them. Rows reached after ``--budget-s`` seconds are written ``skipped`` (the whole run stays within
one GPU call); with rounds, the budget is asked again before each round after the first: a checked row
always gets one round, and rounds cut short keep what they measured (``reason``: "timed in k of N
rounds"), so a run may pass the budget by one round of one shape. Correctness against fp64 is the GPU
tests' business (``tests/test_backward.py``); the distances here make a wrong row stand out. Without a GPU
it says so in one line and exits 2.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

EXIT_MISSING = 2
# (name, B, H, S, D, causal): the anchors.
SHAPES = (
    ("P1", 2, 16, 8192, 128, False),
    ("P1 causal", 2, 16, 8192, 128, True),
    ("D64 B4 H32", 4, 32, 8192, 64, False),
    ("B8 S2048 causal", 8, 16, 2048, 128, True),
)
# Shapes only ``--shape`` names (a run without it leaves them out): D=256, which only the Triton backwards
# take, its tiled candidates not yet timed (bench/triton_bwd_d256_ab.sh).
NAMED_SHAPES = (
    ("D256 B2 H16 S4096", 2, 16, 4096, 256, False),
    ("D256 B2 H16 S4096 causal", 2, 16, 4096, 256, True),
)
REFERENCE = "sdpa/cudnn"
FA4 = "fa4/sm90"
BASELINES = (REFERENCE, "sdpa/flash", FA4)
IMPLS = ("triton/tiled", "triton/hopper", "gluon/hopper", "cute/tiled", "cute/hopper", *BASELINES)
# --variant's name for each head dim's first candidate, the rung's default.
DEFAULT_VARIANT = "default"
# The forward whose O and LSE the candidates differentiate.
CANDIDATE_FORWARD = "triton/hopper"
# A variant's gradients may be at most this far from cuDNN's (relative L2, per gradient). bf16 puts
# cuDNN, flash and the tiled rung 3e-3 apart on dQ and dK (results/h200/backward); a lost scale or key
# block is off by 1e-1 or more.
CHECK_BOUND = 1e-2
DEFAULT_BUDGET_S = 150.0
# Where and in what dtype the shapes run (the CPU test swaps in the interpreter's fp32 and a tiny shape).
DEVICE, DTYPE_NAME = "cuda", "bfloat16"
COLUMNS = ("shape", "impl", "variant", "status", "bwd_ms", "fwd_bwd_ms", "bwd_tflops", "vs_cudnn", "vs_fa4",
           "dq_vs_cudnn", "dk_vs_cudnn", "dv_vs_cudnn", "reason")  # fmt: skip


def problem_of(shape: tuple):
    import torch

    from common.contract.problem import Problem

    _name, batch, heads, seqlen, head_dim, causal = shape
    return Problem(batch, heads, seqlen, seqlen, head_dim, getattr(torch, DTYPE_NAME), causal=causal)


def shape_inputs(shape: tuple) -> tuple:
    """q, k, v and dO of one anchor shape, standard normal, seeded."""
    import torch

    _name, batch, heads, seqlen, head_dim, _causal = shape
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    dtype = getattr(torch, DTYPE_NAME)
    return tuple(
        torch.randn(batch, heads, seqlen, head_dim, generator=generator, device=DEVICE, dtype=dtype) for _ in range(4)
    )


def _timer(fn: Callable[[], object]) -> float:
    from common.measure.timing import time_cuda, time_host

    return time_cuda(fn).ms if DEVICE == "cuda" else time_host(fn, warmup=0, rep=1).ms


def distances(grads: tuple, reference: tuple | None) -> dict[str, float]:
    from common.measure.backward import relative_distance

    if reference is None:
        return {}
    labels = ("dq_vs_cudnn", "dk_vs_cudnn", "dv_vs_cudnn")
    return {
        label: relative_distance(mine, theirs) for label, mine, theirs in zip(labels, grads, reference, strict=True)
    }


class Checked(NamedTuple):
    """A row after its check: its numbers so far (distances; a ``status`` if it failed the check), its calls
    to time by column (none: not timed) and the backward's FLOPs, for its TFLOP/s."""

    numbers: dict
    calls: dict[str, Callable[[], object]]
    flops: float = 0.0


class Table:
    """Rows to a CSV (flushed as they come) and to the console, with the budget's clock. A row is checked
    when it is added; with one round it is timed and written at once (one row's graphs in memory at a time),
    with more it waits for :meth:`time_pending`, which times a shape's rows in interleaved rounds."""

    def __init__(self, path: Path, budget_s: float, rounds: int = 1):
        from common.measure.rounds import ROUNDS_COLUMN

        # The per-round times only with rounds to show: one round writes the columns it always has.
        self.columns = (*COLUMNS, ROUNDS_COLUMN) if rounds > 1 else COLUMNS
        self.handle = path.open("w", newline="")
        self.writer = csv.DictWriter(self.handle, self.columns)
        self.writer.writeheader()
        self.deadline = time.monotonic() + budget_s
        self.rounds = rounds
        self.failed = 0
        # (record, calls to time, FLOPs) of the rows checked and not yet timed.
        self.pending: list[tuple[dict, dict, float]] = []
        # (shape, baseline) -> backward TFLOP/s, for the ratios of the rows that follow.
        self.baselines: dict[tuple[str, str], float] = {}

    def over_budget(self) -> bool:
        return time.monotonic() > self.deadline

    def add(self, base: dict, check: Callable[[], Checked]) -> dict:
        """One row: ``check()``'s numbers, or ``skipped`` past the budget, or ``failed`` with the error; timed
        later unless the check failed. Returns the record, which gets its times when they are taken."""
        record = {**base, "status": "ok", "reason": ""}
        calls, flops = {}, 0.0
        if self.over_budget():
            record |= {"status": "skipped", "reason": "past --budget-s"}
        else:
            try:
                numbers, calls, flops = check()
                record |= numbers
            except Exception as error:  # noqa: BLE001 - a failed row is recorded and the sweep goes on
                record |= {"status": "failed", "reason": f"{type(error).__name__}: {error}"[:300]}
        self.pending.append((record, calls if record["status"] == "ok" else {}, flops))
        if self.rounds == 1:
            self.time_pending()
        return record

    def time_pending(self) -> None:
        """Time the rows checked so far in interleaved rounds (``common.measure.rounds``; the budget asked
        before every round but the first, so that a checked row has at least one) and write them in the
        order they were added."""
        import torch

        from common.measure.rounds import time_rows

        time_rows([(record, calls) for record, calls, _ in self.pending], self.rounds, _timer,
                  go_on=lambda: not self.over_budget())  # fmt: skip
        for record, _calls, flops in self.pending:
            if "bwd_ms" in record:
                record["bwd_tflops"] = flops / record["bwd_ms"] / 1e9
            self.write(record)
        self.pending = []
        if DEVICE == "cuda":
            torch.cuda.empty_cache()

    def write(self, record: dict) -> None:
        """Write ``record`` with its ratios to the baselines of its shape written before it."""
        if record["status"] not in ("ok", "skipped"):
            self.failed += 1
        if record["status"] == "ok":
            self.baselines.setdefault((record["shape"], record["impl"]), record["bwd_tflops"])
            for column, baseline in (("vs_cudnn", REFERENCE), ("vs_fa4", FA4)):
                if (record["shape"], baseline) in self.baselines:
                    record[column] = record["bwd_tflops"] / self.baselines[record["shape"], baseline]
        self.writer.writerow(record)
        self.handle.flush()
        shown = {key: f"{value:.4g}" if isinstance(value, float) else value for key, value in record.items()}
        print(" | ".join(str(shown.get(column, "")) for column in self.columns), flush=True)

    def close(self) -> None:
        self.handle.close()


def autograd_row(shape: tuple, impl: str, inputs: tuple, reference: tuple | None, keep: dict) -> Callable[[], Checked]:
    """The check of one implementation through autograd (its gradients go to ``keep[impl]``); the backward
    alone and forward + backward to time."""

    def check() -> Checked:
        from common.measure.backward import backward_flops, contender, gradients_of

        problem = problem_of(shape)
        grads, backward, forward_backward = gradients_of(contender(impl, problem), inputs)
        keep[impl] = grads
        calls = {"bwd_ms": backward, "fwd_bwd_ms": forward_backward}
        return Checked(distances(grads, reference), calls, backward_flops(problem))

    return check


def baselines_first(impls: Sequence[str]) -> list[str]:
    """cuDNN (always: the distances are to its gradients), the other baselines asked for, then the rest,
    so that every row comes after the baselines it is divided by."""
    others = [impl for impl in impls if impl not in BASELINES]
    return [REFERENCE, *[impl for impl in BASELINES[1:] if impl in impls], *others]


def run_ladder(
    out_dir: Path, impls: Sequence[str], budget_s: float, shapes: Sequence[str] | None = None, rounds: int = 1
) -> int:
    """Every implementation on every shape (``shapes``: the names to keep, default all), each shape's rows
    timed in ``rounds`` interleaved rounds."""
    table = Table(out_dir / "results.csv", budget_s, rounds)
    for shape in chosen_shapes(shapes):
        inputs, grads = shape_inputs(shape), {}
        for impl in baselines_first(impls):
            base = {"shape": shape[0], "impl": impl, "variant": ""}
            table.add(base, autograd_row(shape, impl, inputs, grads.get(REFERENCE), grads))
        table.time_pending()
    table.close()
    return 1 if table.failed else 0


def chosen_shapes(names: Sequence[str] | None) -> tuple[tuple, ...]:
    """The shapes called ``names`` (without names the anchors, :data:`SHAPES`); an unknown name lists the
    known ones."""
    known = [shape[0] for shape in (*SHAPES, *NAMED_SHAPES)]
    unknown = sorted(set(names or ()) - set(known))
    if unknown:
        raise SystemExit(f"bench.backward: unknown --shape {unknown}; known: {known}")
    return tuple(shape for shape in (*SHAPES, *NAMED_SHAPES) if shape[0] in names) if names else SHAPES


class CandidateRung(NamedTuple):
    """A backward rung whose variants ``--candidates`` times: its row name, module (with ``CANDIDATES``),
    gradients function and the keyword that takes a variant; the forward whose O and LSE it differentiates
    (None: :data:`CANDIDATE_FORWARD`)."""

    name: str
    module: str
    gradients: str
    keyword: str
    forward: str | None


CANDIDATE_RUNGS = {
    "tiled": CandidateRung("triton/backward/tiled", "triton_impl.backward.tiled", "tiled_gradients", "config", None),
    "gluon": CandidateRung(
        "gluon/backward/hopper", "triton_impl.gluon.backward", "hopper_gradients", "tiles", "gluon/hopper"
    ),
    "cute": CandidateRung(
        "cute/backward/hopper", "cute_impl.backward.hopper", "hopper_gradients", "tiles", "cute/hopper"
    ),
}


def candidate_row(
    shape: tuple, config, inputs: tuple, saved: tuple, reference: tuple, rung: CandidateRung = CANDIDATE_RUNGS["tiled"]
) -> Callable[[], Checked]:
    """A variant of ``rung``: checked against cuDNN's gradients, then (if close) its backward to time alone."""

    def check() -> Checked:
        from common.measure.backward import backward_flops

        # Looked up when the row runs, so that a test can plant a wrong variant in the module.
        gradients = getattr(importlib.import_module(rung.module), rung.gradients)
        problem = problem_of(shape)
        q, k, v, d_out = inputs
        out, lse = saved

        def backward() -> tuple:
            return gradients(q, k, v, out, lse, d_out, problem, **{rung.keyword: config})

        found = distances(backward(), reference)
        far = {label: value for label, value in found.items() if not value <= CHECK_BOUND}
        if far:
            return Checked(found | {"status": "wrong", "reason": f"farther than {CHECK_BOUND} from cuDNN: {far}"}, {})
        return Checked(found, {"bwd_ms": backward}, backward_flops(problem))

    return check


def run_candidates(
    out_dir: Path,
    budget_s: float,
    shapes: Sequence[str] | None = None,
    rung: str = "tiled",
    variants: Sequence[str] | None = None,
    rounds: int = 1,
) -> int:
    """``variants``: only the candidates with these labels, in this order (default all); ``default``
    names each head dim's first candidate for the shape's mask, the rung's default. A named label may also be
    one of the rung's ``ALL_CANDIDATES`` that no release lists (an off-by-default variant under A/B); a label a
    head dim lacks is left out at that head dim. Each shape's rows, baselines and variants, are timed in ``rounds``
    interleaved rounds."""
    import torch

    from common.contract.api import attention

    candidate = CANDIDATE_RUNGS[rung]
    module = importlib.import_module(candidate.module)
    candidates = module.CANDIDATES
    nameable = getattr(module, "ALL_CANDIDATES", candidates)
    known = {DEFAULT_VARIANT} | {config.label for configs in nameable.values() for config in configs}
    if set(variants or ()) - known:
        raise ValueError(f"--variant {sorted(set(variants) - known)} not among {rung}'s candidates {sorted(known)}")
    forward = candidate.forward or CANDIDATE_FORWARD
    table = Table(out_dir / "candidates.csv", budget_s, rounds)
    summary = []
    for shape in chosen_shapes(shapes):
        if shape[4] not in candidates:
            print(f"{shape[0]}: {rung} has no D={shape[4]} candidates; shape left out", flush=True)
            continue
        inputs, grads, records = shape_inputs(shape), {}, []
        for impl in BASELINES:
            base = {"shape": shape[0], "impl": impl, "variant": ""}
            records.append(table.add(base, autograd_row(shape, impl, inputs, grads.get(REFERENCE), grads)))
        if REFERENCE not in grads:
            table.time_pending()
            print(f"{shape[0]}: no cuDNN gradients to check the candidates against; shape left out", flush=True)
            continue
        with torch.no_grad():
            saved = attention(*inputs[:3], causal=shape[5], impl=forward, return_lse=True)
        # gluon/hopper lists more for a non-causal problem (``NON_CAUSAL_CANDIDATES``), its default among them.
        listed = candidates if shape[5] else getattr(module, "NON_CAUSAL_CANDIDATES", candidates)
        configs = listed[shape[4]]
        if variants:  # in the order given, so that the budget skips the last ones named
            labels = [configs[0].label if label == DEFAULT_VARIANT else label for label in variants]
            pool = nameable[shape[4]]
            configs = [config for label in dict.fromkeys(labels) for config in pool if config.label == label]
        for config in configs:
            base = {"shape": shape[0], "impl": candidate.name, "variant": config.label}
            row = candidate_row(shape, config, inputs, saved, grads[REFERENCE], candidate)
            records.append(table.add(base, row))
        table.time_pending()
        summary += records
    table.close()
    print_summary(summary)
    return 1 if table.failed else 0


def print_summary(records: list[dict]) -> None:
    """Per shape: every row's backward TFLOP/s and its ratio to cuDNN and FA4, fastest first."""
    for shape in dict.fromkeys(record["shape"] for record in records):
        rows = [record for record in records if record["shape"] == shape]
        rows.sort(key=lambda record: -(record.get("bwd_tflops") or 0.0))
        print(f"\n{shape}: backward TFLOP/s (x cuDNN, x FA4)")
        for record in rows:
            name = record["variant"] or record["impl"]
            if record["status"] != "ok":
                print(f"  {name:58s} {record['status']}: {record['reason'][:80]}")
                continue
            ratios = " ".join(f"{record[key]:.2f}x" if record.get(key) else "-" for key in ("vs_cudnn", "vs_fa4"))
            print(f"  {name:58s} {record['bwd_tflops']:7.1f}  {ratios}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.backward", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/backward"), help="output folder")
    parser.add_argument("--impl", action="append", help=f"implementations (repeatable; default {', '.join(IMPLS)})")
    parser.add_argument("--candidates", action="store_true", help="time a backward rung's variants instead")
    parser.add_argument(
        "--rung", choices=tuple(CANDIDATE_RUNGS), default="tiled", help="whose variants --candidates times"
    )
    parser.add_argument("--shape", action="append", help="anchor shapes by name (repeatable; default all)")
    parser.add_argument(
        "--variant", action="append", help="--candidates: only these labels, 'default' the rung's (repeatable)"
    )
    parser.add_argument(
        "--budget-s", type=float, default=DEFAULT_BUDGET_S, help="rows after this many seconds are skipped"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="N",
        help="time each shape's rows in N rounds, the order reversed every other round; each row's median "
        "over rounds, its rounds in rounds_ms (default 1: one pass in order)",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    chosen_shapes(args.shape)
    import torch

    if not torch.cuda.is_available():
        print("bench.backward: needs a CUDA GPU (the anchors are H200 shapes); none found", file=sys.stderr)
        return EXIT_MISSING
    args.out.mkdir(parents=True, exist_ok=True)
    if args.candidates:
        return run_candidates(args.out, args.budget_s, args.shape, args.rung, args.variant, args.rounds)
    return run_ladder(args.out, args.impl or IMPLS, args.budget_s, args.shape, args.rounds)


if __name__ == "__main__":
    sys.exit(main())
