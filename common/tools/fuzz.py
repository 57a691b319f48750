"""Fuzzing: random problems per rung against the fp64 reference, each reproducible by its seed, on the GPU.

python -m common.tools.fuzz --impl 'cute/*' --count 40 --out results/h200/fuzz.md
python -m common.tools.fuzz --impl cute/tiled --reproduce 1000017
python -m common.tools.fuzz --backward --impl '*/hopper' --count 20   # the gradients of the rungs with a backward
TRITON_INTERPRET=1 python -m common.tools.fuzz --device cpu --impl 'triton/*' --count 20   # the same seeds, no GPU

On the CPU the Triton rungs run under the interpreter and take what their capability checks accept there (fp16 and
fp32, not bf16); the other stacks refuse, so a seed's skip says what the CPU could not check.
"""

from __future__ import annotations

import argparse
import fnmatch
import math
import os
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

from common.contract.check import check_implementation
from common.contract.dispatch import DECODE_MAX_SEQLEN_Q
from common.contract.problem import CAUSAL_ALIGNMENTS, Problem
from common.contract.registry import Implementation, discover

MAX_SEQLEN = 3000
SEED_STRIDE = 1_000_000
# The head dim a quarter of the draws take last (the decode rungs' widest tiles, D=256's own plans).
WIDE_HEAD_DIM, WIDE_SHARE = 256, 0.25
# A capability check on one problem: (accepted, reason).
Accepts = Callable[[Problem], tuple[bool, str]]
# Page sizes a paged draw takes (FlashAttention's and FlashInfer's range, Problem's MIN_PAGE_SIZE to MAX_PAGE_SIZE).
PAGE_SIZES = (16, 32, 64, 128, 256)
# On the CPU a seed runs only where its problem has at most this many scores (B·H·Sq·Sk): the interpreter takes seconds
# there, and minutes at the GPU draws' largest (2.7 M scores took over 3 minutes in triton/naive's forward).
INTERPRETER_MAX_SCORES = 200_000


def random_features(problem: Problem, rng: random.Random) -> Problem:
    """``problem`` with GQA (kv_heads a random divisor of heads), a random causal alignment,
    per-sequence lengths and the LSE each drawn at random, then a paged cache half the time and D=256 a quarter
    of the time (drawn last, so that a seed keeps the features it drew before these were drawn)."""
    divisors = [d for d in range(1, problem.heads + 1) if problem.heads % d == 0]
    featured = problem.with_(
        kv_heads=rng.choice(divisors),
        causal_alignment=rng.choice(CAUSAL_ALIGNMENTS),
        has_cache_seqlens=rng.random() < 0.5,
        return_lse=rng.random() < 0.5,
    )
    featured = paged(featured, rng.choice(PAGE_SIZES)) if rng.random() < 0.5 else featured
    return featured.with_(head_dim=WIDE_HEAD_DIM) if rng.random() < WIDE_SHARE else featured


def paged(problem: Problem, page_size: int) -> Problem:
    """``problem`` reading its K and V from a page pool (FlashAttention's layout, a shuffled block table): the
    capacity rounded up to whole pages, and per-sequence lengths, which a block table does not hold."""
    capacity = -(-problem.seqlen_k // page_size) * page_size
    return problem.with_(page_size=page_size, seqlen_k=capacity, has_cache_seqlens=True)


def plain(problem: Problem) -> Problem:
    """``problem`` without the features of :func:`random_features` (what every rung runs)."""
    return problem.with_(
        kv_heads=problem.heads, causal_alignment="top_left", has_cache_seqlens=False, return_lse=False, page_size=0
    )


def fitted(
    impl: Implementation, problem: Problem, device: torch.device, accepts: Accepts | None = None
) -> Problem | None:
    """The drawn ``problem`` as ``impl`` takes it, or None where it takes none of these: a decode rung's Sq folded
    into its 1..``DECODE_MAX_SEQLEN_Q`` (a prefill-sized Sq is another rung's problem), then, where the rung
    refuses, the same problem on a contiguous cache, then the plain problem, and where it refuses all three at
    D=256, the same at D=128. ``accepts``: the capability check (default: the rung's forward check)."""
    accepts = accepts or (lambda candidate: impl.check(candidate, device))
    if impl.rung == "decode" and problem.seqlen_q > DECODE_MAX_SEQLEN_Q:
        problem = problem.with_(seqlen_q=1 + (problem.seqlen_q - 1) % DECODE_MAX_SEQLEN_Q)
    # A rung without D=256 takes the same problem at D=128.
    shapes = (problem, problem.with_(head_dim=128)) if problem.head_dim == WIDE_HEAD_DIM else (problem,)
    for shape in shapes:
        for candidate in (shape, shape.with_(page_size=0), plain(shape)):
            if accepts(candidate)[0]:
                return candidate
    return None


def backward_fitted(impl: Implementation, problem: Problem, device: torch.device) -> Problem | None:
    """The drawn ``problem`` as ``impl``'s forward and backward both take it through autograd: without the features
    ``attention()``'s autograd path does not carry (cache lengths, pages, the LSE as an output), keeping GQA and the
    causal alignment where the backward takes them, else the plain problem; None where neither."""
    from common.measure.backward import capability

    forward_only = problem.with_(has_cache_seqlens=False, return_lse=False, page_size=0)
    return fitted(impl, forward_only, device, accepts=lambda candidate: capability(impl, candidate, device))


def random_problem(seed: int) -> tuple[Problem, float]:
    """A problem and a V offset drawn from ``seed``: lengths log-uniform in [1, MAX_SEQLEN]; GQA,
    the causal alignment, per-sequence lengths and the LSE drawn after them, so a seed's plain
    problem and offset are those it drew before these features existed."""
    rng = random.Random(seed)

    def length() -> int:
        return max(1, int(math.exp(rng.uniform(0, math.log(MAX_SEQLEN)))))

    problem = Problem(
        batch=rng.randint(1, 3),
        heads=rng.randint(1, 4),
        seqlen_q=length(),
        seqlen_k=length(),
        head_dim=rng.choice([64, 128]),
        dtype=rng.choice([torch.float16, torch.bfloat16]),
        causal=rng.random() < 0.5,
        softmax_scale=rng.choice([None, rng.uniform(0.02, 0.3)]),
    )
    offset = rng.uniform(-1.0, 1.0)
    return random_features(problem, rng), offset


@dataclass
class FuzzSummary:
    impl: str
    ran: int = 0
    skipped: int = 0
    oversized: int = 0
    mismatches: list[str] = field(default_factory=list)

    def counts(self) -> tuple[int, int, int]:
        """(ran, oversized, mismatches) so far: what ``seed_outcome`` compares a seed's end with."""
        return self.ran, self.oversized, len(self.mismatches)


def drawn_for(
    seed: int, summary: FuzzSummary, fit: Callable[[Problem], Problem | None], max_scores: int | None = None
) -> tuple[Problem, float] | None:
    """``seed``'s problem as ``fit`` gives it to the rung, and its V offset, counted in ``summary`` as run; None,
    counted as skipped, where the rung takes none of the problem's forms, or as oversized where the form it takes has
    more than ``max_scores`` scores (B·H·Sq·Sk)."""
    drawn, offset = random_problem(seed)
    problem = fit(drawn)
    if problem is None:
        summary.skipped += 1
        return None
    if max_scores is not None and scores(problem) > max_scores:
        summary.oversized += 1
        return None
    summary.ran += 1
    return problem, offset


def scores(problem: Problem) -> int:
    """B·H·Sq·Sk: the attention scores a problem computes, what an interpreted rung's time grows with."""
    return problem.batch * problem.heads * problem.seqlen_q * problem.seqlen_k


def size_cap(device: str) -> int | None:
    """The most scores a seed may have on ``device``: none on a GPU, ``INTERPRETER_MAX_SCORES`` on the CPU."""
    return INTERPRETER_MAX_SCORES if torch.device(device).type == "cpu" else None


def fuzz_one(impl: Implementation, seed: int, summary: FuzzSummary, device: str = "cuda") -> None:
    """``seed``'s problem (``fitted``) on ``impl`` against float64, a mismatch or a crash recorded with its seed."""
    fit = partial(fitted, impl, device=torch.device(device))
    if (draw := drawn_for(seed, summary, fit, size_cap(device))) is None:
        return
    problem, offset = draw
    try:
        result = check_implementation(impl, problem, device=device, seed=seed, offset=offset)
    except Exception as error:  # noqa: BLE001 - a crash is a finding, with its seed
        summary.mismatches.append(f"seed {seed}: {problem.describe()}: raised {type(error).__name__}: {error}")
        return
    if not result.ok:
        summary.mismatches.append(f"seed {seed}: {problem.describe()} offset={offset:.2f}: {result.summary()}")


def fuzz_backward_one(impl: Implementation, seed: int, summary: FuzzSummary, device: str = "cuda") -> None:
    """The gradients of ``seed``'s problem (``backward_fitted``) by ``attention()``'s autograd, each of dQ, dK and dV
    judged against float64 by the rung's rule with SDPA's own gradient error as the yardstick
    (``common.measure.backward.checked_row``, as ``compare.py --backward``)."""
    from common.contract.gradients import backward_inputs, sdpa_gradients
    from common.measure.backward import checked_row, reference_gradients_by_head

    fit = partial(backward_fitted, impl, device=torch.device(device))
    if (draw := drawn_for(seed, summary, fit, size_cap(device))) is None:
        return
    problem, offset = draw
    inputs = backward_inputs(problem, seed=seed, device=device, offset=offset)
    judged_against = (reference_gradients_by_head(*inputs, problem), sdpa_gradients(*inputs, problem))
    row, _ = checked_row(impl, problem, inputs, judged_against)
    if row["status"] != "ok":
        summary.mismatches.append(f"seed {seed}: {problem.describe()} offset={offset:.2f}: {row['reason']}")


def seed_outcome(seed: int, before: tuple[int, int, int], summary: FuzzSummary) -> str:
    """What ``seed`` did to ``summary``, given its ``counts()`` before: its mismatch line, "passed", or why skipped."""
    ran, oversized, mismatches = summary.counts()
    if mismatches > before[2]:
        return summary.mismatches[-1]
    if ran > before[0]:
        return f"seed {seed}: passed"
    if oversized > before[1]:
        return f"seed {seed}: skipped (over the interpreter's {INTERPRETER_MAX_SCORES} scores)"
    return f"seed {seed}: skipped (capability)"


def summary_markdown(
    summaries: list[FuzzSummary], count: int, base_seed: int, backward: bool = False, device: str = "cuda"
) -> str:
    what = (
        "Gradients (dQ, dK, dV by `attention()`'s autograd, each against float64 by the rung's rule with SDPA's "
        "gradient error as the yardstick) of the rungs with a backward, on problems without cache lengths, pages or "
        "the LSE. "
        if backward
        else ""
    )
    where = "GPU" if device == "cuda" else "CPU (Triton interpreter)"
    lines = [
        f"# {where} fuzz summary{' (backward)' if backward else ''}",
        "",
        what
        + f"{count} random problems per rung (seeds {base_seed}..; B 1-3, H 1-4, Sq/Sk log-uniform in 1..{MAX_SEQLEN}, "
        f"D 64/128 ({WIDE_HEAD_DIM} for a quarter), fp16/bf16, causal or not, default or random scale, V offset in "
        "[-1, 1]; kv_heads a random divisor of H, either causal alignment, per-sequence key lengths and the LSE at "
        f"random, half the problems on a paged cache (pages of {', '.join(map(str, PAGE_SIZES))} keys); a decode "
        f"rung's Sq folded into 1..{DECODE_MAX_SEQLEN_Q}; where a rung refuses, the same problem on a contiguous "
        f"cache, then the plain one, then the same at D=128).",
        "",
        "| impl | ran | skipped (capability) | skipped (size) | mismatches |",
        "|---|---|---|---|---|",
    ]
    if size_cap(device) is not None:
        lines[2] += f" On the CPU a seed runs where its problem has at most {size_cap(device)} scores (B·H·Sq·Sk)."
    lines += [f"| {s.impl} | {s.ran} | {s.skipped} | {s.oversized} | {len(s.mismatches)} |" for s in summaries]
    for summary in summaries:
        lines += [f"- {summary.impl} {line}" for line in summary.mismatches]
    return "\n".join(lines) + "\n"


def missing_device(device: str) -> str | None:
    """What the fuzzer lacks to run a rung on ``device`` (a CUDA GPU; the Triton interpreter for "cpu"), or None."""
    if device == "cuda" and not torch.cuda.is_available():
        return (
            "common.tools.fuzz needs a CUDA GPU, and torch sees none (torch.cuda.is_available() is False); "
            "--device cpu runs the Triton rungs under TRITON_INTERPRET=1"
        )
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return (
            "common.tools.fuzz --device cpu runs the Triton rungs under the interpreter and needs TRITON_INTERPRET=1, "
            f"got {os.environ.get('TRITON_INTERPRET')!r}"
        )
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", default="*", help="glob on implementation names")
    parser.add_argument("--count", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--reproduce", type=int, help="run the single problem of this seed")
    parser.add_argument("--out", type=Path, help="write the markdown summary here")
    parser.add_argument(
        "--backward", action="store_true", help="fuzz the gradients (dQ, dK, dV) of the rungs with a backward instead"
    )
    parser.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the Triton rungs under TRITON_INTERPRET=1"
    )
    args = parser.parse_args()
    missing = missing_device(args.device)
    if missing:
        # Without its device every rung would only be skipped: say so instead of a table of skips.
        print(missing, file=sys.stderr)
        sys.exit(2)
    available, _ = discover(include_baselines=False)
    chosen = [impl for impl in available if fnmatch.fnmatch(impl.name, args.impl)]
    if args.backward:
        chosen = [impl for impl in chosen if impl.backward is not None]
    fuzz = fuzz_backward_one if args.backward else fuzz_one
    summaries = []
    for impl in chosen:
        summary = FuzzSummary(impl.name)
        seeds = (
            [args.reproduce]
            if args.reproduce is not None
            else range(args.seed * SEED_STRIDE, args.seed * SEED_STRIDE + args.count)
        )
        for seed in seeds:
            before = summary.counts()
            fuzz(impl, seed, summary, device=args.device)
            # Each seed's outcome as it ends: a run cut by its time limit still shows what it reached and found.
            print(f"{impl.name} {seed_outcome(seed, before, summary)}", flush=True)
        print(
            f"{impl.name:18s} ran {summary.ran:4d} skipped {summary.skipped:4d} (size {summary.oversized}) "
            f"mismatches {len(summary.mismatches)}"
        )
        summaries.append(summary)
    text = summary_markdown(summaries, args.count, args.seed * SEED_STRIDE, args.backward, args.device)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
