"""A real model's ``generate()`` per attention implementation: prefill ms, decode ms per token, tokens/s.

transformers' ``LlamaForCausalLM`` is built from a ``LlamaConfig`` with random bf16 weights (no
download): GQA with 32 query and 8 KV heads, head_dim 128, 4 layers. For every prompt length (1k, 8k,
32k), batch (1, 8) and KV cache (``DynamicCache``; ``StaticCache`` through ``cache_implementation=
"static"``, run eagerly; optionally ``static-compiled``: the same with transformers'
``torch.compile(mode="reduce-overhead")`` of the decode step, i.e. CUDA graphs) each attention
implementation (``ladder:<stack>``, ``sdpa``, ``eager`` where its score matrix fits, transformers' own
FlashAttention path where one loads) runs one row:

1. a warm-up ``generate()`` of the same length: compiles, makes ``common.attention``'s plan for every
   decode signature (a DynamicCache grows by one key per step) and captures the CUDA graphs;
2. a timed greedy ``generate()`` of 128 new tokens (``min_new_tokens = max_new_tokens``, so every
   implementation decodes the same count), timed with CUDA events;
3. a timed ``generate()`` of one new token (the same setup and prefill, no decode step), three times
   (medians; the CPU mode also repeats step 2 three times: ``Sweep.samples``);
4. the prefill alone, timed separately: one forward over the prompt into a fresh cache, keeping only
   the last position's logits (as ``generate()`` does); those logits are compared with SDPA's
   (relative L2) — the first row of each case is SDPA's for that reason.

Decode ms per token = (generate ms − one-token generate ms) / (new tokens − 1): both generates pay the
same cache setup and prefill, so the difference is the decode steps alone (a prefill timed on its own
pays a different setup, and subtracting it gave negative decode times on a loaded CPU); tokens/s =
batch · 1000 / that.
A row that fails, runs out of memory or overruns its time budget is written with its reason, and the
sweep goes on; once the total budget is spent, the remaining rows are written as skipped. With
``--rounds R`` every case measures its implementations R times in turn and keeps the medians (an eager
decode step is host time, and the host's speed drifts: SDPA's step read 5.8 and 7.3 ms in two calls of
one day). Writes results.csv (a row per implementation and case, as each case finishes), rounds.csv
(a row per round; its ``rounds`` column is the round's number), env.json, report.md and
generate_ms_per_token.png under ``--out``.

    python -m bench.generate --out runs/generate              # H200: about 8 minutes
    python -m bench.generate --quick --out runs/generate-q    # 1k prompt, batch 1, 32 tokens
    python compare.py --generate --quick                      # the same tool through compare.py
    python -m bench.generate --device cpu --out /tmp/gen      # tiny fp32 model, Triton interpreter

Without a GPU (and without ``--device cpu``) it prints one line and exits 2. ``--device cpu`` runs a
tiny model (2 layers, 4 / 2 heads, head_dim 64, fp32) on short prompts under the Triton interpreter:
it exercises the machinery end to end (tests/test_generate_bench.py), its times mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as dt
import json
import math
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

LADDER_NAMES = ("ladder:auto", "ladder:cute", "ladder:gluon", "ladder:triton")
SDPA, EAGER, FLASH = "sdpa", "eager", "flash"
# transformers' own FlashAttention paths, newest first; the "flash" row runs the first that loads.
FLASH_CANDIDATES = ("flash_attention_4", "flash_attention_3", "flash_attention_2")
# SDPA first: its prefill logits are each case's reference.
DEFAULT_IMPLS = (SDPA, *LADDER_NAMES, FLASH, EAGER)
CACHES = ("dynamic", "static", "static-compiled")
PREFILL_REPEATS = 3
PROFILE_LINES = 45
# Eager materialises B·H·Sq·Sk scores in the model dtype, their fp32 softmax and its cast back (about
# 8 bytes per score); it runs only where that takes at most this share of the free memory.
EAGER_BYTES_PER_SCORE = 8
EAGER_MEMORY_SHARE = 0.5
EXIT_USAGE = 2


@dataclass(frozen=True)
class ModelSpec:
    """The Llama built for the run (random weights)."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    vocab: int

    def config(self) -> Any:
        from transformers import LlamaConfig

        return LlamaConfig(
            hidden_size=self.hidden, intermediate_size=self.intermediate, num_hidden_layers=self.layers,
            num_attention_heads=self.heads, num_key_value_heads=self.kv_heads, head_dim=self.head_dim,
            vocab_size=self.vocab, max_position_embeddings=65536, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        )  # fmt: skip


@dataclass(frozen=True)
class Sweep:
    """What one run measures and how long it may take."""

    prompts: tuple[int, ...]
    batches: tuple[int, ...]
    caches: tuple[str, ...]
    impls: tuple[str, ...]
    new_tokens: int
    row_budget_s: float
    total_budget_s: float
    profile: bool = False
    rounds: int = 1
    # Timed long generates per row, their median kept (the one-token one at least PREFILL_REPEATS times): the
    # CPU mode's host is shared with other work (pytest's workers), where one sample timed a 4-token generate
    # shorter than the 1-token one's median (a negative decode time).
    samples: int = 1


# A Llama-3-8B-like layer (32 / 8 heads, head_dim 128, hidden 4096, MLP 14336), 4 of them.
GPU_MODEL = ModelSpec(layers=4, heads=32, kv_heads=8, head_dim=128, hidden=4096, intermediate=14336, vocab=32000)
# Head dim 64: the smallest the Triton decode and Hopper rungs take, so ladder:triton routes as on a GPU.
CPU_MODEL = ModelSpec(layers=2, heads=4, kv_heads=2, head_dim=64, hidden=128, intermediate=256, vocab=128)
# The budgets keep a full run near 8 minutes on one H200 (model build and report included).
GPU_SWEEP = Sweep((1024, 8192, 32768), (1, 8), ("dynamic", "static"), DEFAULT_IMPLS, 128, 60.0, 420.0)
QUICK_SWEEP = replace(GPU_SWEEP, prompts=(1024,), batches=(1,), new_tokens=32, row_budget_s=30.0, total_budget_s=150.0)
CPU_SWEEP = Sweep((12,), (1, 2), ("dynamic", "static"), (SDPA, "ladder:triton", EAGER), 4, 300.0, 900.0, samples=3)


@dataclass(frozen=True)
class Case:
    """One (cache, batch, prompt length) configuration."""

    cache: str
    batch: int
    prompt: int
    new_tokens: int

    def describe(self) -> str:
        return f"{self.cache} cache, B={self.batch}, prompt {self.prompt}"


@dataclass
class Row:
    """One results.csv row; a row that did not measure keeps NaN and says why."""

    impl: str
    attn_implementation: str
    cache: str
    batch: int
    prompt: int
    new_tokens: int
    status: str
    prefill_ms: float = math.nan
    decode_ms_per_token: float = math.nan
    tokens_per_s: float = math.nan
    logits_rel_l2: float = math.nan
    rungs: str = ""
    reason: str = ""
    rounds: int = 0


COLUMNS = tuple(item.name for item in fields(Row))


class RowTimeoutError(Exception):
    """A row ran past its time budget."""


# ----------------------------------------------------------------------------------------------
# Arguments
# ----------------------------------------------------------------------------------------------
def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(item) for item in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return values


def _name_list(choices: Sequence[str] | None) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        values = tuple(item.strip() for item in text.split(",") if item.strip())
        unknown = [value for value in values if choices is not None and value not in choices]
        if not values or unknown:
            raise argparse.ArgumentTypeError(f"expected names from {', '.join(choices or ())}, got {text!r}")
        return values

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.generate",
        description="generate() of a random-weight GQA Llama per attention implementation: prefill ms, decode ms "
        "per token, tokens/s, prefill logits against SDPA's.",
        epilog="Exit status: 0 every row ran or was skipped for a stated reason; 1 a row failed, ran out of memory "
        "or timed out; 2 no GPU (without --device cpu) or bad arguments.",
    )
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: tiny fp32 model (default cuda)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1k prompt, batch 1, 32 new tokens")
    parser.add_argument("--out", type=Path, help="output folder (default runs/<date>-generate)")
    parser.add_argument("--prompts", type=_int_list, help="prompt lengths (default 1024,8192,32768)")
    parser.add_argument("--batches", type=_int_list, help="batch sizes (default 1,8)")
    parser.add_argument("--new-tokens", type=int, help="tokens generated per row, at least 2 (default 128)")
    parser.add_argument(
        "--caches", type=_name_list(CACHES), help="dynamic, static, static-compiled (default the two first)"
    )
    parser.add_argument(
        "--impls", type=_name_list(None), help=f"attention implementations (default {','.join(DEFAULT_IMPLS)})"
    )
    parser.add_argument("--row-budget", type=float, help="seconds one row may take (default 60)")
    parser.add_argument("--total-budget", type=float, help="seconds for all rows; later rows are skipped (default 420)")
    parser.add_argument(
        "--rounds",
        type=int,
        help="measure every row of a case this many times, the implementations in turn, and keep the medians "
        "(default 1): an eager decode step is host time, which drifts by tens of percent over minutes",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after each case's rounds, cProfile one more generate() of each row's length: profile-<row>.txt "
        "under --out (where a decode step's host time goes)",
    )
    return parser


def sweep_for(args: argparse.Namespace) -> Sweep:
    """The preset (GPU, quick or CPU) with the options given on the command line over it."""
    base = CPU_SWEEP if args.device == "cpu" else QUICK_SWEEP if args.quick else GPU_SWEEP
    overrides = {
        "prompts": args.prompts, "batches": args.batches, "caches": args.caches, "impls": args.impls,
        "new_tokens": args.new_tokens, "row_budget_s": args.row_budget, "total_budget_s": args.total_budget,
        "profile": args.profile or None, "rounds": args.rounds,
    }  # fmt: skip
    sweep = replace(base, **{key: value for key, value in overrides.items() if value is not None})
    if sweep.new_tokens < 2:
        raise ValueError(
            f"--new-tokens must be at least 2 (one prefill token, then decode steps), got {sweep.new_tokens}"
        )
    if sweep.rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {sweep.rounds}")
    if min(sweep.row_budget_s, sweep.total_budget_s) <= 0:
        raise ValueError(f"budgets must be positive, got {sweep.row_budget_s} and {sweep.total_budget_s}")
    return sweep


# ----------------------------------------------------------------------------------------------
# Measuring one row
# ----------------------------------------------------------------------------------------------
class Clock:
    """Milliseconds of one call: CUDA events on a GPU, the host clock on the CPU."""

    def __init__(self, device: Any) -> None:
        self.device = device

    def time(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        import torch

        if self.device.type != "cuda":
            start = time.perf_counter()
            result = fn()
            return (time.perf_counter() - start) * 1e3, result
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        result = fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end), result


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise RowTimeoutError in this (main) thread once ``seconds`` have passed: generate() is a Python loop,
    so the timer interrupts it between steps."""

    def expire(signum: int, frame: Any) -> None:
        raise RowTimeoutError(f"over its time budget of {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def generate_kwargs(case: Case, ids: Any) -> dict[str, Any]:
    """Greedy, exactly ``new_tokens`` tokens; static caches compiled only in the static-compiled case
    (transformers would otherwise compile every static-cache decode on a GPU by itself)."""
    import torch

    kwargs: dict[str, Any] = {
        "attention_mask": torch.ones_like(ids), "max_new_tokens": case.new_tokens,
        "min_new_tokens": case.new_tokens, "do_sample": False, "pad_token_id": 0,
        "disable_compile": case.cache != "static-compiled",
    }  # fmt: skip
    if case.cache != "dynamic":
        kwargs["cache_implementation"] = "static"
    if case.cache == "static-compiled":
        from transformers import CompileConfig

        kwargs["compile_config"] = CompileConfig(mode="reduce-overhead")
    return kwargs


def prefill(model: Any, ids: Any, case: Case) -> Any:
    """One forward over the prompt into a fresh cache of the case's kind; the last position's logits."""
    import torch
    from transformers import DynamicCache, StaticCache

    if case.cache == "dynamic":
        cache = DynamicCache(config=model.config)
    else:
        cache = StaticCache(config=model.config, max_cache_len=case.prompt + case.new_tokens)
    with torch.no_grad():
        return model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits


def relative_l2(got: Any, reference: Any) -> float:
    import torch

    reference = reference.double()
    return (torch.linalg.vector_norm(got.double() - reference) / torch.linalg.vector_norm(reference)).item()


@contextlib.contextmanager
def compiled_afresh(case: Case) -> Iterator[None]:
    """A static-compiled row compiles the decode step afresh (``torch._dynamo.reset()``), and fails where Dynamo would
    give up compiling it. Each row's batch, cache length and attention implementation add a recompile of the model's
    forward, and past Dynamo's limit (8 a frame) the step ran eagerly, with no CUDA graphs, while its rows still read
    "static-compiled" (a one-process sweep of every case on an H200, 2026-12-01: SDPA's B=8 8k step 7.99 ms against
    4.15 in a run of 4 cases)."""
    if case.cache != "static-compiled":
        yield
        return
    import torch

    torch._dynamo.reset()
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        yield


def measure(
    model: Any, ids: Any, case: Case, clock: Clock, reference: Any, samples: int = 1
) -> tuple[dict[str, float], Any]:
    """The numbers of one row (the module docstring's steps 1-3) and its prefill logits."""
    kwargs = generate_kwargs(case, ids)
    one_token = {**kwargs, "max_new_tokens": 1, "min_new_tokens": 1}
    with compiled_afresh(case):
        model.generate(ids, **kwargs)
        total_ms = statistics.median(clock.time(lambda: model.generate(ids, **kwargs))[0] for _ in range(samples))
        first_ms = statistics.median(
            clock.time(lambda: model.generate(ids, **one_token))[0] for _ in range(max(samples, PREFILL_REPEATS))
        )
    logits = prefill(model, ids, case)
    prefill_ms = statistics.median(clock.time(lambda: prefill(model, ids, case))[0] for _ in range(PREFILL_REPEATS))
    decode_ms = (total_ms - first_ms) / (case.new_tokens - 1)
    numbers = {
        "prefill_ms": prefill_ms, "decode_ms_per_token": decode_ms, "tokens_per_s": case.batch * 1e3 / decode_ms,
        "logits_rel_l2": math.nan if reference is None else relative_l2(logits, reference),
    }  # fmt: skip
    return numbers, logits


def profile_generate(model: Any, ids: Any, case: Case, path: Path) -> None:
    """cProfile of one generate() of the case's length, its functions by own time and by cumulative time:
    at these model sizes a decode step is host time, and this says whose."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.runcall(model.generate, ids, **generate_kwargs(case, ids))
    with path.open("w") as handle:
        for order in ("tottime", "cumulative"):
            pstats.Stats(profiler, stream=handle).sort_stats(order).print_stats(PROFILE_LINES)


def eager_refusal(case: Case, spec: ModelSpec, device: Any) -> str:
    """Why eager attention would not fit here ('' when it would)."""
    import torch

    if device.type != "cuda":
        return ""
    scores = case.batch * spec.heads * case.prompt * (case.prompt + case.new_tokens)
    needed, free = scores * EAGER_BYTES_PER_SCORE, torch.cuda.mem_get_info(device)[0]
    if needed <= EAGER_MEMORY_SHARE * free:
        return ""
    return f"eager's score matrices need about {needed / 2**30:.0f} GiB, over half of the {free / 2**30:.0f} GiB free"


def planned_rungs(impl: str, case: Case, spec: ModelSpec, dtype: Any, device: Any) -> str:
    """What a ``ladder:<stack>`` name runs in each phase of this case (as the adapter calls the API)."""
    from common.contract.dispatch import DISPATCH_NAMES, choose
    from common.contract.problem import Problem

    name = impl.removeprefix("ladder:")
    if name not in DISPATCH_NAMES:
        return ""
    static = case.cache != "dynamic"
    capacity = case.prompt + case.new_tokens if static else case.prompt
    shape = dict(batch=case.batch, heads=spec.heads, kv_heads=spec.kv_heads, head_dim=spec.head_dim, dtype=dtype)
    phases = {
        "prefill": Problem(**shape, seqlen_q=case.prompt, seqlen_k=capacity, causal=True,
                           causal_alignment="bottom_right", has_cache_seqlens=static),
        "decode": Problem(**shape, seqlen_q=1, seqlen_k=capacity if static else case.prompt + 1,
                          causal=static, causal_alignment="bottom_right", has_cache_seqlens=static),
    }  # fmt: skip
    chosen = {phase: choose(name, problem, device).implementation for phase, problem in phases.items()}
    return ", ".join(f"{phase} {item.name if item else 'refused'}" for phase, item in chosen.items())


def failure(error: BaseException) -> tuple[str, str]:
    """(status, reason) of a row that raised."""
    import torch

    first_line = (str(error).strip().splitlines() or [""])[0][:300]
    if isinstance(error, RowTimeoutError):
        return "timeout", first_line
    if isinstance(error, torch.OutOfMemoryError):
        return "oom", first_line
    return "failed", f"{type(error).__name__}: {first_line}"


# ----------------------------------------------------------------------------------------------
# The sweep
# ----------------------------------------------------------------------------------------------
@dataclass
class Context:
    """What every row of a run shares."""

    model: Any
    spec: ModelSpec
    sweep: Sweep
    clock: Clock
    flash: tuple[str, str]
    started: float
    out_dir: Path

    def remaining_s(self) -> float:
        return self.sweep.total_budget_s - (time.monotonic() - self.started)


def find_flash(model: Any) -> tuple[str, str]:
    """(name, '') of the first FlashAttention path of transformers that loads here, else ('', why not)."""
    reasons = []
    for name in FLASH_CANDIDATES:
        try:
            model.set_attn_implementation(name)
        except Exception as error:  # noqa: BLE001 - a path that does not load is a row with its reason
            reasons.append(f"{name}: {type(error).__name__}: {(str(error).splitlines() or [''])[0][:160]}")
        else:
            return name, ""
    return "", "; ".join(reasons)


def attn_implementation(impl: str, context: Context) -> tuple[str, str]:
    """(transformers name, refusal) of a row: the flash row takes the path found at start-up."""
    if impl == FLASH:
        return context.flash
    return impl, ""


def run_row(impl: str, case: Case, ids: Any, reference: Any, context: Context) -> tuple[Row, Any]:
    """One row, never raising: its numbers and logits, or its status and reason."""
    import torch

    device = ids.device
    name, refusal = attn_implementation(impl, context)
    row = Row(impl, name, case.cache, case.batch, case.prompt, case.new_tokens, "skipped")
    row.rungs = planned_rungs(impl, case, context.spec, context.model.dtype, device)
    budget = min(context.sweep.row_budget_s, context.remaining_s())
    refusal = refusal or (eager_refusal(case, context.spec, device) if impl == EAGER else "")
    if refusal or budget <= 0:
        row.reason = refusal or f"the total time budget of {context.sweep.total_budget_s:.0f} s is spent"
        return row, None
    logits = None
    try:
        with deadline(budget):
            context.model.set_attn_implementation(name)
            numbers, logits = measure(context.model, ids, case, context.clock, reference, context.sweep.samples)
        row.status = "ok"
        for key, value in numbers.items():
            setattr(row, key, value)
    except Exception as error:  # noqa: BLE001 - a failed row is a row with its reason, never the end of the sweep
        row.status, row.reason = failure(error)
    finally:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
    return row, logits


def cases(sweep: Sweep) -> list[Case]:
    """Short prompts first, so that a spent budget leaves out the longest contexts."""
    return [
        Case(cache, batch, prompt, sweep.new_tokens)
        for prompt in sweep.prompts
        for batch in sweep.batches
        for cache in sweep.caches
    ]


def prompt_ids(case: Case, spec: ModelSpec, device: Any) -> Any:
    import torch

    generator = torch.Generator().manual_seed(case.prompt * 131 + case.batch)
    return torch.randint(3, spec.vocab, (case.batch, case.prompt), generator=generator).to(device)


def combined(measured: list[Row]) -> Row:
    """One row from a case's rounds of one implementation: the medians of the times when every round ran,
    else the first round that did not run, with its status and reason."""
    for index, row in enumerate(measured):
        if row.status != "ok":
            return replace(row, rounds=index, reason=f"round {index + 1}: {row.reason}" if index else row.reason)
    decode_ms = statistics.median(row.decode_ms_per_token for row in measured)
    return replace(
        measured[0],
        prefill_ms=statistics.median(row.prefill_ms for row in measured),
        decode_ms_per_token=decode_ms,
        tokens_per_s=measured[0].batch * 1e3 / decode_ms,
        rounds=len(measured),
    )


def run_case(case: Case, context: Context, rounds_writer: csv.DictWriter) -> list[Row]:
    """Every implementation of one case, ``rounds`` times in turn (so that a drift of the host's speed
    spreads over all of them), combined into one row each; an implementation whose row did not run is
    not tried again."""
    ids = prompt_ids(case, context.spec, context.model.device)
    reference = None
    measured: dict[str, list[Row]] = {impl: [] for impl in context.sweep.impls}
    for round_index in range(context.sweep.rounds):
        for impl, earlier in measured.items():
            if earlier and earlier[-1].status != "ok":
                continue
            row, logits = run_row(impl, case, ids, reference, context)
            if impl == SDPA and row.status == "ok" and reference is None:
                reference = logits
            earlier.append(row)
            rounds_writer.writerow({**asdict(row), "rounds": round_index + 1})
    if context.sweep.profile:
        # Once per implementation that ran, after its rounds (a profile per round would be overwritten).
        for impl, rows in measured.items():
            if rows[-1].status == "ok":
                context.model.set_attn_implementation(rows[-1].attn_implementation)
                label = f"{impl.replace(':', '-')}-{case.cache}-B{case.batch}-P{case.prompt}"
                profile_generate(context.model, ids, case, context.out_dir / f"profile-{label}.txt")
    return [combined(rows) for rows in measured.values()]


def run_sweep(context: Context, out_dir: Path) -> list[Row]:
    """Every row, appended to results.csv and printed as its case finishes; rounds.csv keeps each round."""
    rows = []
    with (
        (out_dir / "results.csv").open("w", newline="") as handle,
        (out_dir / "rounds.csv").open("w", newline="") as rounds_handle,
    ):
        writer, rounds_writer = csv.DictWriter(handle, COLUMNS), csv.DictWriter(rounds_handle, COLUMNS)
        writer.writeheader()
        rounds_writer.writeheader()
        for case in cases(context.sweep):
            for row in run_case(case, context, rounds_writer):
                rows.append(row)
                writer.writerow(asdict(row))
                print(line(row), flush=True)
            handle.flush()
            rounds_handle.flush()
    return rows


def line(row: Row) -> str:
    numbers = f"{row.prefill_ms:10.2f} ms prefill {row.decode_ms_per_token:8.3f} ms/token {row.tokens_per_s:9.1f} tok/s"
    return f"{row.impl:14s} {row.cache:16s} B={row.batch:<2d} P={row.prompt:<6d} {row.status:8s} {numbers} {row.reason}"


def build_model(spec: ModelSpec, dtype: Any, device: Any) -> Any:
    """The Llama with random weights, in ``dtype`` on ``device``, in eval mode."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(spec.config())
    return model.to(dtype).eval()


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------
REPORT_COLUMNS = (
    ("impl", "impl"), ("attn_implementation", "attn_implementation"), ("status", "status"),
    ("prefill_ms", "prefill ms"), ("decode_ms_per_token", "decode ms/token"), ("tokens_per_s", "tokens/s"),
    ("logits_rel_l2", "logits rel L2 vs SDPA"), ("rungs", "rungs"), ("reason", "reason"),
)  # fmt: skip


def write_plot(frame: Any, out_dir: Path) -> Path | None:
    """Decode ms per token against the prompt length: a panel per (cache, batch), a line per implementation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = frame[frame["status"] == "ok"]
    if measured.empty:
        return None
    panels = list(measured.groupby(["cache", "batch"], sort=False))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for axis, ((cache, batch), panel) in zip(axes[0], panels, strict=True):
        for impl, series in panel.groupby("impl", sort=False):
            axis.plot(series["prompt"], series["decode_ms_per_token"], marker="o", label=impl)
        axis.set(
            xscale="log", xlabel="context (prompt tokens)", ylabel="decode ms per token", title=f"{cache}, B={batch}"
        )
        axis.legend(fontsize="small")
    fig.tight_layout()
    path = out_dir / "generate_ms_per_token.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write_report(rows: list[Row], env: dict[str, Any], out_dir: Path) -> Path:
    """report.md: the model and sweep, one table per case, the plot."""
    import pandas as pd

    from common.reporting.report import markdown_table

    frame = pd.DataFrame([asdict(row) for row in rows], columns=COLUMNS)
    plot = write_plot(frame, out_dir)
    lines = [
        "# generate() per attention implementation (bench/generate.py)", "",
        f"GPU: {env.get('gpu') or 'none (CPU, Triton interpreter: times mean nothing)'}; torch {env['torch']}, "
        f"transformers {env['transformers']}, Triton {env['triton']}, commit {env.get('git_commit')}.", "",
        f"Model: {env['model']}; {env['dtype']}; sweep: {env['sweep']}.", "",
        "Decode ms per token = (generate ms − one-token generate ms) / (new tokens − 1); tokens/s = batch · 1000 / "
        "decode ms per token; logits: the prefill's last position against SDPA's in the same case.", "",
    ]  # fmt: skip
    for (cache, batch, prompt), group in frame.groupby(["cache", "batch", "prompt"], sort=False):
        lines += [f"## {cache} cache, batch {batch}, prompt {prompt}", "", markdown_table(group, REPORT_COLUMNS), ""]
    if plot:
        lines += [f"![{plot.stem}]({plot.name})", ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines))
    return path


def environment(device: Any, spec: ModelSpec, sweep: Sweep, dtype: Any) -> dict[str, Any]:
    import transformers

    from common.measure.environment import manifest

    return {
        **manifest(device), "transformers": transformers.__version__, "model": asdict(spec),
        "dtype": str(dtype).removeprefix("torch."), "sweep": asdict(sweep),
    }  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        sweep = sweep_for(args)
    except ValueError as error:
        parser.error(str(error))
    if args.device == "cpu":
        # Before any Triton kernel is decorated (the registry imports the rungs lazily).
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "bench.generate needs a CUDA GPU (none is visible); --device cpu runs a tiny model instead", file=sys.stderr
        )
        return EXIT_USAGE
    from common.integrations.transformers import register_attention_implementations

    register_attention_implementations()
    device = torch.device(args.device)
    spec, dtype = (CPU_MODEL, torch.float32) if args.device == "cpu" else (GPU_MODEL, torch.bfloat16)
    out_dir = args.out or Path("runs") / f"{dt.datetime.now():%Y%m%d-%H%M%S}-generate"
    out_dir.mkdir(parents=True, exist_ok=True)
    env = environment(device, spec, sweep, dtype)
    (out_dir / "env.json").write_text(json.dumps(env, indent=2, default=str))
    model = build_model(spec, dtype, device)
    flash = find_flash(model) if FLASH in sweep.impls else ("", "")
    context = Context(model, spec, sweep, Clock(device), flash, time.monotonic(), out_dir)
    rows = run_sweep(context, out_dir)
    report = write_report(rows, env, out_dir)
    print(f"wrote {out_dir}/results.csv, env.json, {report.name} and the plot")
    bad = sorted({f"{row.impl} ({row.status})" for row in rows if row.status in ("failed", "oom", "timeout")})
    if bad:
        print(f"bench.generate: did not pass: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
