"""Issue #38's packed rows: the decode rungs' ``WIDE_M_TILE`` against their default, in one process.

``WIDE_M_TILE`` (triton/decode, gluon/decode; off by default) gives more than 64 packed rows (group · Sq)
at D <= 128 one CTA of 128 rows on 8 warps instead of a CTA per 64 rows, each of which copies the KV head's
keys into its shared memory again and pays its own fixed costs (gluon: two warpgroups, each its m64 wgmmas,
on one K/V ring). cute/decode has no such tile: its warps split the keys, each holding O for every row of
the tile (128 rows × D=64 would be 256 fp32 registers a thread), so it stays at 64 rows.

Shapes (:func:`packed_cases`): seed 31's four low rows of ``compare.py --decode --decode-random 8
--decode-seed 31`` (B=32 Hkv=32 group 16 Sq=8 D=64 paged ragged, the worst; B=16 MQA Sq=8 D=256 paged
ragged; B=3 Hkv=8 Sq=8 D=128 13k; B=8 Hkv=8 group 4 Sq=4 D=128 8.7k), the paged ones' contiguous twins
(same lengths), and two shapes the switch was not tuned on (B=4 Hkv=8 group 16 Sq=16 D=128 16k: 256 rows,
compute-bound; B=16 Hkv=8 group 8 Sq=16 D=64 in pages of 16, ragged). A setting is timed only where it
changes the rung's plan (rows a CTA takes); each (rung, setting) is checked against fp64 on a poisoned
output, then timed (median, L2 flushed), the settings alternating for ``--rounds`` rounds. Writes
``decode_packed.csv`` and ``decode_packed.md`` under ``--out``: µs, % of the read bandwidth and % of the
roofline (``decode_sweep.roofline_us``: max(bytes / read bandwidth, FLOPs / sustained bf16 GEMM rate)),
both ceilings measured in the same run.

    python -m bench.decode_packed --out runs/decode-packed        # from the project root, on a GPU
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import random
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

from bench import require_gpu
from common.measure.results import CsvLog

SETTINGS = ("default", "wide")
RUNG_MODULES = {"triton/decode": "triton_impl.decode", "gluon/decode": "triton_impl.gluon.decode"}
# compare.py --decode --decode-random 8 --decode-seed 31: its rows below 85 % (worst first).
SEED, SEED_ROWS = 31, (6, 0, 3, 7)
COLUMNS = ("label", "impl", "shape", "setting", "rows_per_cta", "status", "us", "pct_read_bw", "pct_roofline",
           "rel_l2_err", "reason")  # fmt: skip


def packed_cases() -> list[tuple[str, object]]:
    """(label, DecodeCase) in the order timed: first the shapes the switch changes (seed 31's worst row and
    its contiguous twin, two shapes the switch was not tuned on), then seed 31's other low rows and twins,
    which it leaves as they are (timed at the default only), so that a run cut short keeps the A/B."""
    from common.measure.decode_sweep import DecodeCase, decode_problem, random_cases

    drawn = random_cases(max(SEED_ROWS) + 1, SEED)
    seed_rows: list[tuple[str, object]] = []
    for index in SEED_ROWS:
        case = drawn[index]
        seed_rows.append((f"seed31-{index}", case))
        if case.problem.paged:
            seed_rows.append((f"seed31-{index}-contiguous", DecodeCase(case.problem.with_(page_size=0), case.lengths)))
    wide = decode_problem(4, 16384, 8, heads=8 * 16, head_dim=128, seqlen_q=16)
    rng = random.Random(38)
    lengths = tuple(max(16, round(2 ** rng.uniform(4, 16))) for _ in range(16))
    paged = decode_problem(16, 65536, 8, ragged=True, page_size=16, heads=8 * 8, head_dim=64, seqlen_q=16)
    untuned = [("untuned-256rows-d128", DecodeCase(wide)), ("untuned-128rows-d64-paged16", DecodeCase(paged, lengths))]
    return [*seed_rows[:2], *untuned, *seed_rows[2:]]


def rows_per_cta(impl_name: str, problem) -> int:
    """Packed rows one CTA of the rung takes under the current constants (what the switch changes)."""
    module = importlib.import_module(RUNG_MODULES[impl_name])
    return module.block_m_for(problem)


@contextlib.contextmanager
def applied(setting: str, impl_name: str) -> Iterator[None]:
    """``WIDE_M_TILE`` on for ``wide`` in the rung's module, restored after."""
    module = importlib.import_module(RUNG_MODULES[impl_name])
    saved = module.WIDE_M_TILE
    module.WIDE_M_TILE = setting == "wide"
    try:
        yield
    finally:
        module.WIDE_M_TILE = saved


def settings_to_time(impl_name: str, problem) -> list[str]:
    """``default``, and ``wide`` where it changes the rows a CTA takes."""
    plans = {}
    for setting in SETTINGS:
        with applied(setting, impl_name):
            plans.setdefault(rows_per_cta(impl_name, problem), setting)
    return list(plans.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/decode-packed"), help="output folder")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of the settings (default 2)")
    parser.add_argument("--rep", type=float, default=60.0, help="timed repetitions per variant, ms (default 60)")
    parser.add_argument("--labels", default="", help="comma-separated labels to time (default all, in order)")
    args = parser.parse_args(argv)
    require_gpu("bench.decode_packed")
    import torch

    from bench.decode_floor import alternating_rounds, summary
    from common.contract.registry import discover
    from common.measure.decode_sweep import roofline_us, too_large
    from common.measure.peaks import measure_bf16_sustained_tflops, measure_read_gbps
    from common.measure.runner import TimingOptions, freeze_imports

    device = torch.device("cuda")
    available, _ = discover(include_baselines=False)
    impls = [impl for impl in available if impl.name in RUNG_MODULES]
    wanted = set(filter(None, args.labels.split(",")))
    cases = [(label, case) for label, case in packed_cases() if not wanted or label in wanted]
    args.out.mkdir(parents=True, exist_ok=True)
    read_gbps, gemm_tflops = measure_read_gbps(device), measure_bf16_sustained_tflops(device)
    print(f"read {read_gbps:.0f} GB/s, bf16 GEMM sustained {gemm_tflops or math.nan:.0f} TFLOP/s", flush=True)
    options = TimingOptions(25.0, args.rep)
    freeze_imports()
    rows: list[dict] = []
    log = CsvLog(args.out / "decode_packed.csv", COLUMNS)
    for label, case in cases:
        if skip := too_large(case, device):
            print(f"{label}: skipped: {skip}", flush=True)
            continue
        roofline = roofline_us(case, read_gbps, gemm_tflops)
        workload, extra = case.gpu_workload(device)
        for impl in impls:
            settings = settings_to_time(impl.name, case.problem)
            results = alternating_rounds(
                impl, case, (workload, extra), settings, args.rounds, options,
                apply=partial(applied, impl_name=impl.name),
            )  # fmt: skip
            for setting, measured in results.items():
                with applied(setting, impl.name):
                    rows_cta = rows_per_cta(impl.name, case.problem)
                status, us, rel_l2_err, reason = summary(measured)
                record = {
                    "label": label, "impl": impl.name, "shape": case.describe(), "setting": setting,
                    "rows_per_cta": rows_cta, "status": status, "us": us,
                    "pct_read_bw": 100 * case.kv_bytes_read / (us * 1e3) / read_gbps,
                    "pct_roofline": 100 * roofline / us, "rel_l2_err": rel_l2_err, "reason": reason,
                }  # fmt: skip
                rows.append(record)
                log.append(record)
                shares = f"{record['pct_read_bw']:5.1f} % BW {record['pct_roofline']:5.1f} % roofline"
                print(
                    f"{label:28s} {impl.name:14s} {setting:8s} rows={rows_cta:3d} {status:6s} {us:8.1f} us "
                    f"{shares} {record['reason']}",
                    flush=True,
                )
        del workload
        torch.cuda.empty_cache()
    (args.out / "decode_packed.md").write_text(markdown(rows, read_gbps, gemm_tflops))
    print((args.out / "decode_packed.md").read_text())
    return 0 if rows and all(row["status"] == "ok" for row in rows) else 1


def markdown(rows: list[dict], read_gbps: float, gemm_tflops: float | None) -> str:
    """One line per (shape, rung): µs (% of the read bandwidth; % of the roofline where that differs) per
    setting, and the change."""
    from common.reporting.decode_table import bandwidth_share

    gemm = f"{gemm_tflops:.0f} TFLOP/s" if gemm_tflops else "not measured"
    lines = [
        f"Decode packed rows A/B (bench/decode_packed.py): µs per step, % of the read bandwidth ({read_gbps:.0f} "
        f"GB/s) and of the roofline (bf16 GEMM sustained {gemm}); '—': the switch does not change the plan",
        "",
        "| shape | rung | default | wide | wide / default |",
        "|---|---|---|---|---|",
    ]
    for label in dict.fromkeys(row["label"] for row in rows):
        for impl in dict.fromkeys(row["impl"] for row in rows if row["label"] == label):
            by = {row["setting"]: row for row in rows if row["label"] == label and row["impl"] == impl}
            cells = []
            for setting in SETTINGS:
                row = by.get(setting)
                if row is None:
                    cells.append("—")
                elif row["status"] != "ok":
                    cells.append(row["status"])
                else:
                    share = bandwidth_share(row["pct_read_bw"], row["pct_roofline"])
                    cells.append(f"{row['us']:.1f} µs ({share}; {row['rows_per_cta']} rows)")
            both = [by.get(setting) for setting in SETTINGS]
            ratio = f"{both[1]['us'] / both[0]['us']:.2f}" if all(r and r["status"] == "ok" for r in both) else "—"
            shape = next(iter(by.values()))["shape"]
            lines.append(f"| {label}: {shape} | {impl} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
