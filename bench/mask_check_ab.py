"""The transformers adapter's mask check, before and after, on a GPU: ms to read a prefill mask.

``common.integrations.transformers.mask_pattern`` reads a 4D mask into ``(causal, cache_seqlens)`` once
per mask tensor. A StaticCache's prefill hands it (B, 1, Sq, Sk) booleans, half a GB at B=8 with an 8k
prompt. ``before`` is the check as it was (the mask compared with a built pattern: several temporaries of
the mask's size); ``after`` the committed one (two reductions per row: the kept count and the first
dropped key). Both must give the same verdict; each is timed (median of CUDA-event timings, after a
warm-up) on the bottom-right causal mask of a StaticCache prefill.

    python -m bench.mask_check_ab --out $OUT/mask-check      # writes mask_check_ab.csv and prints it

Without a CUDA GPU it prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from common.integrations.transformers import mask_pattern

EXIT_USAGE = 2
# (batch, prompt, static cache length): the generate benchmark's 8k prompt with 128 new tokens.
SHAPES = ((1, 8192, 8320), (8, 8192, 8320))


def mask_pattern_before(mask: torch.Tensor, batch: int, seqlen_q: int, seqlen_k: int) -> tuple:
    """The check before the fifth stop (bool masks only): the mask compared with built patterns."""
    keep = mask[:, 0]
    lengths = keep[:, -1, :].sum(-1)
    keys = torch.arange(seqlen_k, device=keep.device)
    rows = torch.arange(seqlen_q, device=keep.device)[:, None]
    valid = keys[None, None, :] < lengths[:, None, None]
    causal_keep = valid & (keys[None, None, :] <= rows[None] + lengths[:, None, None] - seqlen_q)
    if torch.equal(keep, causal_keep):
        causal = True
    elif torch.equal(keep, valid.expand_as(keep)):
        causal = False
    else:
        raise ValueError("not a prefix mask")
    if bool((lengths == seqlen_k).all()):
        return causal, None
    return causal, lengths.to(torch.int32).expand(batch).contiguous()


def static_prefill_mask(batch: int, prompt: int, cache: int) -> torch.Tensor:
    """The boolean mask of a StaticCache prefill: bottom-right causal over the prompt's keys, slots past it dropped."""
    keys = torch.arange(cache, device="cuda")
    rows = torch.arange(prompt, device="cuda")[:, None]
    return ((keys < prompt) & (keys <= rows)).expand(batch, 1, prompt, cache).contiguous()


def median_ms(check: Callable[[], object], repeats: int = 9) -> float:
    check()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        check()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/mask-check"))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.mask_check_ab needs a CUDA GPU (none is visible)", file=sys.stderr)
        return EXIT_USAGE
    rows = []
    for batch, prompt, cache in SHAPES:
        mask = static_prefill_mask(batch, prompt, cache)
        before, after = (mask_pattern_before(mask, batch, prompt, cache), mask_pattern(mask, batch, prompt, cache))
        same = before[0] == after[0] and torch.equal(before[1], after[1])
        arguments = (mask, batch, prompt, cache)
        for name, check in (("before", mask_pattern_before), ("after", mask_pattern)):
            ms = median_ms(lambda check=check, arguments=arguments: check(*arguments))
            rows.append({"batch": batch, "prompt": prompt, "cache": cache, "check": name, "ms": ms, "same": same})
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "mask_check_ab.csv").open("w", newline="") as sink:
        writer = csv.DictWriter(sink, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    for row in rows:
        shape = f"B={row['batch']} Sq={row['prompt']} Sk={row['cache']}"
        print(f"{shape} {row['check']:6s} {row['ms']:8.3f} ms same={row['same']}")
    return 0 if all(row["same"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
