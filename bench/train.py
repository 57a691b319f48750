"""A training check: a small Llama trained with the ladder's attention and with SDPA, loss curves compared.

    python -m bench.train --out $OUT/train        # 300 steps each, about a minute per run on an H200
    python -m bench.train --ladder ladder:gluon   # one stack (repeatable; default every stack)

transformers' ``LlamaForCausalLM`` from a ``LlamaConfig`` (GQA: 8 query heads over 2 KV heads, head dim
64, 4 layers, hidden 512, random init) learns a synthetic, deterministic token stream: every sequence is
a random prefix of ``period`` tokens (``period`` drawn per sequence) repeated to the sequence's length,
so after the first period the next token is predictable by attending back one period (an induction
head), and the loss can fall from ln(vocab) towards (mean period / seqlen) · ln(vocab). Each run starts
from the same initial weights (seeded) and sees the same batches in the same order; only
``attn_implementation`` differs: each ``ladder:<stack>`` (``common.integrations.transformers``; the
forward rung the stack dispatches to and its backward rung; by default triton, gluon and cute) against
``sdpa``. One more run, SDPA from another seed (initial weights and data), says what "noise" means for
this recipe.

Final loss = the mean of the last :data:`FINAL_WINDOW` steps' losses. The check passes when each ladder
run's final loss is within ``max(seed spread, 1 % of SDPA's)`` of SDPA's, where seed spread = |final(SDPA,
seed) − final(SDPA, other seed)|: issue #40 asks for 1 %, and a difference smaller than what changing
the seed does cannot be told from chance. Parameters are fp32, the steps run under bf16 autocast (so
attention sees bf16 q, k, v, as in mixed-precision training), AdamW with a linear warm-up.

Writes losses.csv (step, run, loss), summary.json (final losses, spread, a verdict per ladder run) and
loss.png (the curves). Exit 0 when every check passes, 1 when one does not or a run fails, 2 without a GPU.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

EXIT_MISSING = 2
LADDER, SDPA = "ladder:triton", "sdpa"
# The stacks trained by default; "ladder:auto" may be asked for too.
LADDERS = ("ladder:triton", "ladder:gluon", "ladder:cute")
FINAL_WINDOW = 20
RELATIVE_TOLERANCE = 0.01
SEED, OTHER_SEED = 0, 1


@dataclass(frozen=True)
class Recipe:
    """Model, data and optimiser of one run."""

    layers: int = 4
    hidden: int = 512
    heads: int = 8
    kv_heads: int = 2
    intermediate: int = 1376
    vocab: int = 256
    seqlen: int = 1024
    batch: int = 8
    steps: int = 300
    lr: float = 1e-3
    warmup: int = 30
    min_period: int = 16
    max_period: int = 96

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def batch_of(recipe: Recipe, step: int, seed: int, device: str):
    """Step ``step``'s (batch, seqlen) int64 tokens: per sequence a random prefix of a random period,
    repeated; the same for every run with the same seed."""
    import torch

    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    periods = torch.randint(recipe.min_period, recipe.max_period + 1, (recipe.batch,), generator=generator)
    prefixes = torch.randint(0, recipe.vocab, (recipe.batch, recipe.max_period), generator=generator)
    positions = torch.arange(recipe.seqlen)
    tokens = torch.stack([prefix[positions % period] for prefix, period in zip(prefixes, periods, strict=True)])
    return tokens.to(device)


def build_model(recipe: Recipe, seed: int, attn_implementation: str, device: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=recipe.hidden, intermediate_size=recipe.intermediate, num_hidden_layers=recipe.layers,
        num_attention_heads=recipe.heads, num_key_value_heads=recipe.kv_heads, head_dim=recipe.head_dim,
        vocab_size=recipe.vocab, max_position_embeddings=recipe.seqlen, pad_token_id=0, bos_token_id=1,
        eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(device)
    model.set_attn_implementation(attn_implementation)
    return model.train()


def train(recipe: Recipe, attn_implementation: str, seed: int, device: str) -> list[float]:
    """The loss of every step of one run."""
    import torch

    if attn_implementation.startswith("ladder:"):
        from common.integrations.transformers import register_attention_implementations

        register_attention_implementations()
    model = build_model(recipe, seed, attn_implementation, device)
    optimiser = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda step: min(1.0, (step + 1) / recipe.warmup))
    losses = []
    for step in range(recipe.steps):
        tokens = batch_of(recipe, step, seed, device)
        # bf16 autocast on a GPU (attention gets bf16 q, k, v); fp32 on the CPU, where the interpreter runs.
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        schedule.step()
        optimiser.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            raise FloatingPointError(f"{attn_implementation}: loss {losses[-1]} at step {step}")
    return losses


def final_loss(losses: list[float]) -> float:
    window = losses[-FINAL_WINDOW:]
    return sum(window) / len(window)


def verdict(ladder: float, sdpa: float, sdpa_other_seed: float) -> dict:
    """Whether the ladder's final loss is within max(seed spread, 1 % of SDPA's) of SDPA's."""
    spread = abs(sdpa - sdpa_other_seed)
    tolerance = max(spread, RELATIVE_TOLERANCE * sdpa)
    difference = ladder - sdpa
    return {
        "final_ladder": ladder, "final_sdpa": sdpa, "final_sdpa_other_seed": sdpa_other_seed,
        "seed_spread": spread, "tolerance": tolerance, "difference": difference,
        "relative_difference": difference / sdpa, "passed": abs(difference) <= tolerance,
    }  # fmt: skip


def runs_for(ladders: Sequence[str]) -> list[tuple[str, int]]:
    """(attn_implementation, seed) of every run: each ladder stack, then SDPA at the same and another seed."""
    return [(ladder, SEED) for ladder in ladders] + [(SDPA, SEED), (SDPA, OTHER_SEED)]


def run_label(attn_implementation: str, seed: int) -> str:
    return f"{attn_implementation} seed {seed}"


def write_outputs(out_dir: Path, curves: dict[str, list[float]], summary: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with (out_dir / "losses.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(("step", "run", "loss"))
        for label, losses in curves.items():
            writer.writerows((step, label, loss) for step, loss in enumerate(losses))
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    fig, axis = plt.subplots(figsize=(7, 4.2))
    for (label, losses), style in zip(curves.items(), itertools.cycle(("-", "-.", "--", ":")), strict=False):
        axis.plot(losses, style, linewidth=1.2, label=f"{label} (final {final_loss(losses):.4f})")
    axis.set_xlabel("step")
    axis.set_ylabel("training loss (cross-entropy)")
    axis.set_yscale("log")
    recipe = summary["recipe"]
    axis.set_title(
        f"Llama {recipe['layers']} layers, hidden {recipe['hidden']}, {recipe['heads']}/{recipe['kv_heads']} heads, "
        f"seq {recipe['seqlen']}, batch {recipe['batch']}\n{summary.get('verdict_text', '')}",
        fontsize=8,
    )
    axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "loss.png", dpi=90)
    plt.close(fig)


def run(out_dir: Path, recipe: Recipe, device: str, ladders: Sequence[str] = LADDERS) -> int:
    out_dir.mkdir(parents=True, exist_ok=True)
    curves, failures, seconds = {}, {}, {}
    runs = runs_for(ladders)
    for attn_implementation, seed in runs:
        label = run_label(attn_implementation, seed)
        start = time.perf_counter()
        try:
            curves[label] = train(recipe, attn_implementation, seed, device)
        except Exception as error:  # noqa: BLE001 - a failed run is reported, the others still run
            failures[label] = f"{type(error).__name__}: {error}"[:400]
        seconds[label] = time.perf_counter() - start
        shown = f"final {final_loss(curves[label]):.4f}" if label in curves else f"FAILED {failures[label]}"
        print(f"{label}: {shown} ({seconds[label]:.0f} s)", flush=True)
    summary: dict = {"recipe": asdict(recipe), "seconds": seconds, "failures": failures, "verdicts": {}}
    sdpa, other = (run_label(SDPA, seed) for seed in (SEED, OTHER_SEED))
    if sdpa in curves and other in curves:
        for ladder in ladders:
            label = run_label(ladder, SEED)
            if label in curves:
                summary["verdicts"][ladder] = verdict(*(final_loss(curves[name]) for name in (label, sdpa, other)))
        lines = [verdict_line(ladder, result) for ladder, result in summary["verdicts"].items()]
        summary["verdict_text"] = "\n".join(lines)
        print(summary["verdict_text"])
    write_outputs(out_dir, curves, summary)
    passed = len(summary["verdicts"]) == len(ladders) and all(v["passed"] for v in summary["verdicts"].values())
    return 0 if not failures and passed else 1


def verdict_line(ladder: str, result: dict) -> str:
    return (
        f"{'PASS' if result['passed'] else 'FAIL'} {ladder}: − sdpa = {result['difference']:+.4f} "
        f"({100 * result['relative_difference']:+.2f} %), tolerance {result['tolerance']:.4f} "
        f"(seed spread {result['seed_spread']:.4f}, 1 % = {RELATIVE_TOLERANCE * result['final_sdpa']:.4f})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.train", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/train"), help="output folder")
    parser.add_argument("--steps", type=int, default=Recipe.steps, help="optimiser steps per run")
    parser.add_argument(
        "--ladder", action="append", choices=(*LADDERS, "ladder:auto"),
        help=f"a ladder stack to train (repeatable; default {', '.join(LADDERS)})",
    )  # fmt: skip
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench.train: needs a CUDA GPU (bf16 training of a 4-layer Llama); none found", file=sys.stderr)
        return EXIT_MISSING
    return run(args.out, Recipe(steps=args.steps), "cuda", tuple(args.ladder or LADDERS))


if __name__ == "__main__":
    sys.exit(main())
