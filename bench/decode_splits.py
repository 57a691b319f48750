"""The decode split rule against fixed split counts: does ``choose_num_splits`` pick the fastest?

For a few decode shapes (one long sequence; a ragged batch; a large batch; many KV heads on a short
cache) this times every decode rung whose ``bind`` takes a forced ``num_splits`` at 1, 2, 4, ..., 64
splits and at the count its rule chooses. Each variant is first checked against the fp64 reference
(poisoned output, the rung's own rule); times are medians of CUDA-event timings with the L2 flushed
(``common.measure.timing.time_cuda``), reported in µs, GB/s of K and V read and % of the HBM read
bandwidth measured in the same run, and % of the roofline (``decode_sweep.roofline_us``: the bytes at
that bandwidth or the FLOPs at the sustained bf16 GEMM rate, whichever takes longer). Writes
``decode_splits.csv`` and ``decode_splits.md`` (a table per rung: a row per shape, a column per split
count, the fastest in bold) under ``--out``.

    python -m bench.decode_splits --out runs/decode-splits        # from the project root, on a GPU
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import inspect
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from bench import require_gpu

SPLIT_COUNTS = (1, 2, 4, 8, 16, 32, 64)
CHOSEN = "chosen"
COLUMNS = ("impl", "shape", "splits", "num_splits", "status", "us", "gbps", "pct_read_bw", "pct_roofline", "rel_l2_err",
    "reason",
)  # fmt: skip


@dataclass
class SplitRow:
    """One (rung, shape, split count) measurement; ``splits`` is the forced count or ``chosen``."""

    impl: str
    shape: str
    splits: str
    num_splits: int | None
    status: str
    us: float = math.nan
    gbps: float = math.nan
    pct_read_bw: float = math.nan
    pct_roofline: float = math.nan
    rel_l2_err: float = math.nan
    reason: str = ""


def decode_shapes() -> list:
    """The sweep's shapes (``common.measure.decode_sweep``): B=1 Hkv=8 128k, B=8 Hkv=8 32k ragged,
    B=64 Hkv=8 32k and B=1 Hkv=32 4k, 32 query heads, D=128, bf16, one token."""
    from common.measure import decode_sweep as sweep

    ragged = tuple(round(fraction * sweep.RAGGED_SEQLEN_K) for fraction in sweep.RAGGED_FRACTIONS)
    return [
        sweep.DecodeCase(sweep.decode_problem(1, 131072, 8)),
        sweep.DecodeCase(sweep.decode_problem(sweep.RAGGED_BATCH, sweep.RAGGED_SEQLEN_K, 8, ragged=True), ragged),
        sweep.DecodeCase(sweep.decode_problem(64, 32768, 8)),
        sweep.DecodeCase(sweep.decode_problem(1, 4096, 32)),
    ]


def split_implementations(implementations: list) -> list:
    """Decode rungs (not baselines) whose ``bind`` takes a forced ``num_splits``."""
    from common.contract.registry import BASELINE_STACKS, DECODE_RUNGS

    return [
        impl
        for impl in implementations
        if impl.rung in DECODE_RUNGS
        and impl.stack not in BASELINE_STACKS
        and impl.bind is not None
        and "num_splits" in inspect.signature(impl.bind).parameters
    ]


def measure_splits(
    impl, case, workload, splits: int | None, read_gbps: float | None, options, gemm_tflops: float | None = None
) -> SplitRow:
    """Check ``impl`` at ``splits`` (None: its rule) against fp64, then time it; never raises."""
    import torch

    from common.contract.registry import per_call_inputs
    from common.measure.decode_sweep import roofline_us
    from common.measure.runner import judge_on_workload
    from common.measure.timing import time_cuda

    label = CHOSEN if splits is None else str(splits)
    row = SplitRow(impl.name, case.describe(), label, splits, "ok")
    try:
        inputs = (workload.q, workload.k, workload.v)
        run = impl.bind(
            *inputs, case.problem, **per_call_inputs(case.problem, workload.cache_seqlens), num_splits=splits
        )
        row.num_splits = getattr(run, "num_splits", splits)
        ok, reason, err = judge_on_workload(impl, run, workload)
        row.rel_l2_err = err.rel_l2_err
        if not ok:
            row.status, row.reason = "wrong", reason
        timing = time_cuda(run, warmup_ms=options.warmup_ms, rep_ms=options.rep_ms)
    except Exception as error:  # noqa: BLE001 - a variant that fails is a row, the sweep goes on
        row.status, row.reason = "failed", f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        return row
    finally:
        torch.cuda.empty_cache()
    row.us = timing.ms * 1e3
    row.gbps = case.kv_bytes_read / (timing.ms * 1e-3) / 1e9
    row.pct_read_bw = 100 * row.gbps / read_gbps if read_gbps else math.nan
    row.pct_roofline = 100 * roofline_us(case, read_gbps, gemm_tflops) / row.us
    return row


def sweep_case(
    impl, case, workload, skip: str, read_gbps: float | None, options, device, gemm_tflops: float | None = None
) -> list[SplitRow]:
    """Every split count of one rung on one shape: skipped rows with the reason when the shape does not
    fit the GPU or the rung refuses it, else prepared once (validation, compile) and measured per count."""
    from common.contract.registry import per_call_inputs

    counts = (*SPLIT_COUNTS, None)

    def every_count(status: str, reason: str) -> list[SplitRow]:
        labels = [CHOSEN if splits is None else str(splits) for splits in counts]
        return [
            SplitRow(impl.name, case.describe(), label, splits, status, reason=reason)
            for label, splits in zip(labels, counts, strict=True)
        ]

    if skip:
        return every_count("skipped", skip)
    ok, reason = impl.check(case.problem, device)
    if not ok:
        return every_count("skipped", reason)
    try:
        impl.prepare(
            workload.q, workload.k, workload.v, case.problem, **per_call_inputs(case.problem, workload.cache_seqlens)
        )
    except Exception as error:  # noqa: BLE001 - a rung that cannot prepare is a row, the sweep goes on
        return every_count("failed", f"prepare: {type(error).__name__}: {error}")
    return [measure_splits(impl, case, workload, splits, read_gbps, options, gemm_tflops) for splits in counts]


def _cell(row: SplitRow | None, fastest: bool) -> str:
    if row is None:
        return "—"
    if row.status != "ok":
        return row.status
    from common.reporting.decode_table import bandwidth_share

    share = bandwidth_share(row.pct_read_bw, row.pct_roofline)
    text = f"{row.us:.1f} ({share})" if math.isfinite(row.pct_read_bw) else f"{row.us:.1f}"
    return f"**{text}**" if fastest else text


def markdown(rows: list[SplitRow], read_gbps: float | None, gpu: str) -> str:
    """A table per rung: a row per shape, µs (% of read bandwidth; % of the roofline where the FLOPs, not
    the bytes, set it) per split count, the fastest in bold, the rule's choice last with its count, and
    how far it is from the fastest."""
    counts = list(dict.fromkeys(row.splits for row in rows if row.splits != CHOSEN))
    read = f"{read_gbps:.0f} GB/s" if read_gbps else "not measured"
    lines = [
        f"Decode split counts on the {gpu}: µs per step (median, L2 flushed) and % of the HBM read bandwidth "
        f"measured in the same run ({read}); bold: the fastest count of the shape.",
    ]
    for impl in dict.fromkeys(row.impl for row in rows):
        header = " | ".join(f"{count} split{'s' if count != '1' else ''}" for count in counts)
        lines += ["", f"**{impl}**", "", f"| shape | {header} | rule's choice | choice / fastest |"]
        lines.append("|---|" + "---|" * (len(counts) + 2))
        for shape in dict.fromkeys(row.shape for row in rows if row.impl == impl):
            by_splits = {row.splits: row for row in rows if row.impl == impl and row.shape == shape}
            timed = [row for row in by_splits.values() if row.status == "ok"]
            fastest = min(timed, key=lambda row: row.us) if timed else None
            cells = [_cell(by_splits.get(count), by_splits.get(count) is fastest) for count in counts]
            chosen = by_splits.get(CHOSEN)
            choice = _cell(chosen, False)
            if chosen is not None and chosen.num_splits is not None:
                choice = f"{chosen.num_splits}: {choice}"
            ratio = f"{chosen.us / fastest.us:.2f}" if chosen is not None and chosen.status == "ok" and fastest else "—"
            lines.append(f"| {shape} | " + " | ".join(cells) + f" | {choice} | {ratio} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/decode-splits"), help="output folder")
    parser.add_argument("--only", default="*", help="glob on decode rung names (default every one)")
    parser.add_argument("--warmup", type=float, default=50.0, help="warm-up per variant, ms (default 50)")
    parser.add_argument("--rep", type=float, default=200.0, help="timed repetitions per variant, ms (default 200)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    require_gpu("bench.decode_splits")
    import torch

    from common.contract.registry import discover
    from common.measure.decode_sweep import too_large
    from common.measure.peaks import measure_bf16_sustained_tflops, measure_read_gbps
    from common.measure.runner import TimingOptions, make_workload

    device = torch.device("cuda")
    available, _ = discover(include_baselines=False)
    impls = [impl for impl in split_implementations(available) if fnmatch.fnmatch(impl.name, args.only)]
    if not impls:
        print(f"bench.decode_splits: no decode rung with a num_splits keyword matches {args.only!r}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    read_gbps, gemm_tflops = measure_read_gbps(device), measure_bf16_sustained_tflops(device)
    options = TimingOptions(args.warmup, args.rep)
    rows: list[SplitRow] = []
    with (args.out / "decode_splits.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, COLUMNS)
        writer.writeheader()
        for case in decode_shapes():
            skip = too_large(case, device)
            workload = None if skip else make_workload(case.problem, "cuda", case.cache_seqlens(device))
            for impl in impls:
                for row in sweep_case(impl, case, workload, skip, read_gbps, options, device, gemm_tflops):
                    rows.append(row)
                    writer.writerow(asdict(row))
                    handle.flush()
                    print(
                        f"{row.impl:16s} {row.shape:60s} {row.splits:>6s} {row.status:7s} {row.us:9.1f} us {row.reason}"
                    )
            del workload
            torch.cuda.empty_cache()
    (args.out / "decode_splits.md").write_text(markdown(rows, read_gbps, torch.cuda.get_device_name(device)))
    print((args.out / "decode_splits.md").read_text())
    return 1 if any(row.status in ("wrong", "failed") for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
