"""Where an eager ``generate()`` step waits for the GPU: host synchronisations per decode step, or per
prefill, by origin.

An eager decode step is host time, and the host overlaps it with the GPU's work only while it never
waits: one synchronisation per step makes the step the host's time *plus* the GPU's. This tool runs the
``bench.generate`` model (4-layer Llama, 32 / 8 heads, D=128, random bf16 weights) with a DynamicCache,
greedy, for each implementation, under ``torch.cuda.set_sync_debug_mode("warn")`` (torch warns at every
synchronising CUDA call: ``.item()``, ``bool()`` of a tensor, a device-to-host copy), and counts the
warnings of the decode steps: a ``generate()`` of N+1 tokens minus one of 1 token, divided by N, each
sync attributed to the innermost frame of this project, else of transformers.

    python -m bench.generate_syncs --prompt 1024 --batches 1,8 --impls sdpa,ladder:auto --out $OUT/syncs

``--phase prefill`` counts instead the synchronisations of one prefill as ``bench.generate`` times it (one
forward over the prompt into a fresh StaticCache, after a warm-up one): a prefill that waits for the GPU
in its layers leaves the GPU idle while the host launches the next kernels, wall time its kernels do not
show.

Writes syncs.csv (impl, batch, phase, origin, syncs per decode step or per prefill) under ``--out`` and
prints it. Without a CUDA GPU it prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import collections
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import require_gpu
from bench.generate import GPU_MODEL, Case, build_model, prefill
from common.measure.results import write_rows

OWN_CODE = ("common/", "triton_impl/", "cute_impl/")


def origin(stack: Sequence[traceback.FrameSummary]) -> str:
    """``file:line (function)`` of the innermost frame of this project, else of transformers, else the
    innermost frame at all."""
    for marks in (OWN_CODE, ("transformers/",), ("",)):
        for frame in reversed(stack):
            if any(mark in frame.filename for mark in marks):
                return f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno} ({frame.name})"
    return "unknown"


@contextmanager
def counted_syncs() -> Iterator[collections.Counter]:
    """Counts torch's synchronisation warnings by origin while the block runs."""
    import torch

    counts: collections.Counter = collections.Counter()

    def record(message: Any, category: Any, *_: Any, **__: Any) -> None:
        if "synchroniz" in str(message):
            counts[origin(traceback.extract_stack()[:-1])] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        previous, warnings.showwarning = warnings.showwarning, record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield counts
        finally:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = previous


def syncs_per_step(generate: Callable[[int], Any], steps: int) -> dict[str, float]:
    """Synchronisations per decode step by origin: a generate() of ``steps + 1`` tokens minus one of 1."""
    generate(steps + 1)
    with counted_syncs() as long:
        generate(steps + 1)
    with counted_syncs() as short:
        generate(1)
    return {where: (long[where] - short[where]) / steps for where in long | short if long[where] != short[where]}


def syncs_per_prefill(run: Callable[[], Any]) -> dict[str, float]:
    """Synchronisations of one prefill by origin, after a warm-up prefill."""
    run()
    with counted_syncs() as counts:
        run()
    return {where: float(count) for where, count in counts.items()}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", type=int, default=1024, help="prompt length (default 1024)")
    parser.add_argument("--batches", default="1,8", help="comma-separated batch sizes (default 1,8)")
    parser.add_argument("--impls", default="sdpa,ladder:auto", help="comma-separated attn_implementation names")
    parser.add_argument("--steps", type=int, default=8, help="decode steps counted (default 8)")
    parser.add_argument(
        "--phase", choices=("decode", "prefill"), default="decode",
        help="count per decode step (DynamicCache) or per prefill (a fresh StaticCache; default decode)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("runs/generate-syncs"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    require_gpu("bench.generate_syncs")
    import torch

    from common.integrations.transformers import register_attention_implementations

    register_attention_implementations()
    model = build_model(GPU_MODEL, torch.bfloat16, torch.device("cuda"))
    rows = []
    for batch in (int(text) for text in args.batches.split(",")):
        ids = torch.randint(3, GPU_MODEL.vocab, (batch, args.prompt), device="cuda")

        def generate(tokens: int, ids: torch.Tensor = ids) -> Any:
            return model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, min_new_tokens=tokens,
                do_sample=False, pad_token_id=0, disable_compile=True,
            )  # fmt: skip

        for impl in args.impls.split(","):
            model.set_attn_implementation(impl)
            if args.phase == "prefill":
                case = Case("static", batch, args.prompt, args.steps)
                counts = syncs_per_prefill(lambda ids=ids, case=case: prefill(model, ids, case))
            else:
                counts = syncs_per_step(generate, args.steps)
            counts["total"] = sum(counts.values())
            row = {"impl": impl, "batch": batch, "phase": args.phase}
            rows += [{**row, "origin": where, "syncs": count} for where, count in counts.items()]
    args.out.mkdir(parents=True, exist_ok=True)
    write_rows(args.out / "syncs.csv", rows, ["impl", "batch", "phase", "origin", "syncs"])
    for row in rows:
        print(f"{row['impl']:14s} B={row['batch']:<2d} {row['syncs']:6.2f}  {row['origin']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
