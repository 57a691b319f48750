"""Issue #38's short prefill: the decode rungs' ``PACKED_OCCUPANCY`` (and gluon's ``WIDE_M_TILE``) against their
default, in one process.

Seed 41's lowest row (``compare.py --decode --decode-random 8 --decode-seed 41``: B=16 H=256 Hkv=32 Sq=16 Sk=1024
D=64, 41 / 43 / 30 % of the read bandwidth in triton / gluon / cute) packs group 8 × Sq 16 = 128 query rows per
(batch, KV head): a small prefill whose key blocks are compute (wgmma and softmax) as much as bytes, on CTAs that
each run one serial chain per warp. ``PACKED_OCCUPANCY`` (off in both Triton-side rungs) puts more CTAs on an SM
so one's softmax runs under another's wgmmas: triton/decode's 128-row tile at D=64 in 32-key blocks under a
128-register cap (two CTAs an SM, not one), gluon/decode's 64-row tiles in shallow rings (D=64: four CTAs an SM,
not two; D=128: three). ``wide``: gluon/decode's two-warpgroup tile (its keys copied once a CTA, not once per 64
rows; lost on seed 31's shapes), timed here where it changes the plan. cute/decode has neither (its warps split
the keys and each holds every row's O).

Shapes (:func:`packed_cases`, in the order timed): seed 41's row and its D=128 twin, 128 rows on a 4k cache, 64
rows at D=64 on 2k and at D=128 on 1k (gluon's knob only), seed 31's worst row (128 rows, paged, ragged), then two
long caches the knob also changes, which must not regress (128 rows at D=64 on 32k; 256 rows at D=128 on 16k). A
setting is timed only where it changes the rung's plan; each (rung, setting) is checked against fp64 on a poisoned
output, then timed (median, L2 flushed), the settings interleaved for ``--rounds`` rounds. Writes
``decode_packed.csv`` and ``decode_packed.md`` under ``--out``: µs, % of the read bandwidth and % of the roofline
(``decode_sweep.roofline_us``: max(bytes / read bandwidth, FLOPs / sustained bf16 GEMM rate)), both ceilings
measured in the same run.

    python -m bench.decode_packed --out runs/decode-packed        # from the project root, on a GPU
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

from bench import require_gpu
from common.measure.results import CsvLog

SETTINGS = ("default", "packed", "wide")
RUNG_MODULES = {"triton/decode": "triton_impl.decode", "gluon/decode": "triton_impl.gluon.decode"}
COLUMNS = ("label", "impl", "shape", "setting", "plan", "status", "us", "pct_read_bw", "pct_roofline", "rel_l2_err",
           "reason")  # fmt: skip


def packed_cases() -> list[tuple[str, object]]:
    """(label, DecodeCase) in the order timed (module docstring), so that a run cut short keeps seed 41's row."""
    from common.measure.decode_sweep import DecodeCase, decode_problem, random_cases

    def full(batch: int, seqlen_k: int, kv_heads: int, group: int, seqlen_q: int, head_dim: int) -> DecodeCase:
        return DecodeCase(decode_problem(batch, seqlen_k, kv_heads, heads=kv_heads * group, head_dim=head_dim,
                                         seqlen_q=seqlen_q))  # fmt: skip

    return [
        ("seed41-1", random_cases(2, 41)[1]),
        ("128rows-d128-1k", full(16, 1024, 32, 8, 16, 128)),
        ("128rows-d64-4k", full(8, 4096, 32, 8, 16, 64)),
        ("64rows-d64-2k", full(16, 2048, 32, 4, 16, 64)),
        ("64rows-d128-1k", full(16, 1024, 32, 8, 8, 128)),
        ("seed31-6", random_cases(7, 31)[6]),
        ("long-128rows-d64-32k", full(2, 32768, 8, 8, 16, 64)),
        ("long-256rows-d128-16k", full(4, 16384, 8, 16, 16, 128)),
    ]


def plan_of(impl_name: str, problem) -> str:
    """What the settings change: rows a CTA takes x M tiles, key block x ring depth, warps."""
    module = importlib.import_module(RUNG_MODULES[impl_name])
    if impl_name == "triton/decode":
        config = module.tile_config(problem)
        depth, warps = config.num_stages, config.num_warps
    else:
        config = module.decode_config(problem)
        depth, warps = config.num_stages, module.num_warps_for(problem)
    return f"{module.block_m_for(problem)}x{module.m_blocks_for(problem)} n{config.block_n}x{depth} w{warps}"


@contextlib.contextmanager
def applied(setting: str, impl_name: str) -> Iterator[None]:
    """The rung's own constants, with PACKED_OCCUPANCY on for ``packed`` and WIDE_M_TILE on for ``wide`` (restored
    after; triton/decode's wide tile is its default, so ``packed`` keeps it)."""
    module = importlib.import_module(RUNG_MODULES[impl_name])
    saved = module.PACKED_OCCUPANCY, module.WIDE_M_TILE
    module.PACKED_OCCUPANCY = setting == "packed"
    module.WIDE_M_TILE = saved[1] or setting == "wide"
    try:
        yield
    finally:
        module.PACKED_OCCUPANCY, module.WIDE_M_TILE = saved


def settings_to_time(impl_name: str, problem) -> list[str]:
    """``default``, and each other setting where it changes the plan."""
    plans = {}
    for setting in SETTINGS:
        with applied(setting, impl_name):
            plans.setdefault(plan_of(impl_name, problem), setting)
    return list(plans.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/decode-packed"), help="output folder")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the settings (default 2)")
    parser.add_argument("--rep", type=float, default=60.0, help="timed repetitions per variant, ms (default 60)")
    parser.add_argument("--labels", default="", help="comma-separated labels to time (default all, in order)")
    args = parser.parse_args(argv)
    require_gpu("bench.decode_packed")
    import torch

    from bench.decode_floor import interleaved_settings, summary
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
            results = interleaved_settings(
                impl, case, (workload, extra), settings, args.rounds, options,
                apply=partial(applied, impl_name=impl.name),
            )  # fmt: skip
            for setting, measured in results.items():
                with applied(setting, impl.name):
                    plan = plan_of(impl.name, case.problem)
                status, us, rel_l2_err, reason = summary(measured)
                record = {
                    "label": label, "impl": impl.name, "shape": case.describe(), "setting": setting,
                    "plan": plan, "status": status, "us": us,
                    "pct_read_bw": 100 * case.kv_bytes_read / (us * 1e3) / read_gbps,
                    "pct_roofline": 100 * roofline / us, "rel_l2_err": rel_l2_err, "reason": reason,
                }  # fmt: skip
                rows.append(record)
                log.append(record)
                shares = f"{record['pct_read_bw']:5.1f} % BW {record['pct_roofline']:5.1f} % roofline"
                print(
                    f"{label:22s} {impl.name:14s} {setting:7s} {plan:18s} {status:6s} {us:8.1f} us "
                    f"{shares} {record['reason']}",
                    flush=True,
                )
        del workload
        torch.cuda.empty_cache()
        # After every shape, so that a run cut short keeps the table of the shapes done.
        (args.out / "decode_packed.md").write_text(markdown(rows, read_gbps, gemm_tflops))
    print((args.out / "decode_packed.md").read_text())
    return 0 if rows and all(row["status"] == "ok" for row in rows) else 1


def markdown(rows: list[dict], read_gbps: float, gemm_tflops: float | None) -> str:
    """One line per (shape, rung): µs (% of the read bandwidth; % of the roofline where that differs) per
    setting, and each setting's time over the default's."""
    from common.reporting.decode_table import bandwidth_share

    gemm = f"{gemm_tflops:.0f} TFLOP/s" if gemm_tflops else "not measured"
    lines = [
        f"Decode packed rows A/B (bench/decode_packed.py): µs per step, % of the read bandwidth ({read_gbps:.0f} "
        f"GB/s) and of the roofline (bf16 GEMM sustained {gemm}); '—': the setting does not change the plan",
        "",
        "| shape | rung | default | packed | wide | packed / default | wide / default |",
        "|---|---|---|---|---|---|---|",
    ]
    for label in dict.fromkeys(row["label"] for row in rows):
        for impl in dict.fromkeys(row["impl"] for row in rows if row["label"] == label):
            by = {row["setting"]: row for row in rows if row["label"] == label and row["impl"] == impl}
            ok = {setting: row for setting, row in by.items() if row["status"] == "ok"}
            cells = []
            for setting in SETTINGS:
                row = by.get(setting)
                if row is None:
                    cells.append("—")
                elif setting not in ok:
                    cells.append(row["status"])
                else:
                    share = bandwidth_share(row["pct_read_bw"], row["pct_roofline"])
                    cells.append(f"{row['us']:.1f} µs ({share}; {row['plan']})")
            ratios = [
                f"{ok[setting]['us'] / ok['default']['us']:.2f}" if setting in ok and "default" in ok else "—"
                for setting in SETTINGS[1:]
            ]
            shape = next(iter(by.values()))["shape"]
            lines.append(f"| {label}: {shape} | {impl} | " + " | ".join(cells + ratios) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
