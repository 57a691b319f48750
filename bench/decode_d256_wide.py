"""Issue #38's D=256 packed rows: triton/decode's ``WIDE_D256`` (on by default) against 32-row tiles, in one process.

Seed 47's sweep (``results/h200/decode-random-seed47/``) left triton/decode at 11 % of the read bandwidth on B=64
H=8 Hkv=1 Sq=16 D=256 paged(256) ragged 17..33118 and at 40 % on B=1 H=64 Hkv=4 Sq=4 Sk=71168 D=256: group · Sq =
128 and 64 packed rows, cut into 32-row tiles on 4 warps at D=256, each tile reading the KV head's keys again.
Settings (:data:`SETTINGS`, each timed only where it changes the plan): ``default``, the rung's (``WIDE_D256``:
128-row tiles past 64 rows, 8 warps, 16-key blocks, 3 stages; one CTA an SM); ``narrow``, the knob off (32-row
tiles on 4 warps); ``wide-d256-deep``, the knob's tiles at :data:`DEEP_STAGES` stages (paged: + PAGED_EXTRA_STAGES),
spill-free for sm_90a under Triton 3.6 only (3.8 spills 584-592 bytes), the GPU machine's release. The knob's
first A/B (``results/h200/decode-d256-wide/``) also timed a 64-row tile for 33-64 rows, mixed and not kept.

Shapes (:func:`d256_cases`, in the order timed): seed 47's two rows, a long MQA cache (128 rows on 128k keys) that
must not regress, 128 packed rows on a full 4k cache, 64 rows in pages of 64 over a ragged batch. Every setting is
checked against fp64 on a poisoned output, then timed (median, L2 flushed), interleaved for ``--rounds`` rounds
(``bench.decode_floor.interleaved_settings``, as ``bench/decode_packed.py``). Writes ``decode_d256_wide.csv`` and
``decode_d256_wide.md`` under ``--out``: µs, % of the read bandwidth and of the roofline
(``decode_sweep.roofline_us``), both ceilings measured in the same run.

    python -m bench.decode_d256_wide --out runs/decode-d256-wide        # from the project root, on a GPU
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import sys
from collections.abc import Iterator
from pathlib import Path

from bench import require_gpu
from common.measure.results import CsvLog

SETTINGS = ("default", "narrow", "wide-d256-deep")
DEEP_STAGES = 5
IMPL = "triton/decode"
COLUMNS = ("label", "shape", "setting", "plan", "status", "us", "pct_read_bw", "pct_roofline", "rel_l2_err", "reason")
# The ragged paged neighbour's lengths (16 sequences in pages of 64: empty-ish, full, tails).
RAGGED_LENGTHS = (16384, 17, 9000, 1000, 16384, 77, 4096, 12000, 300, 16384, 2048, 64, 7777, 16000, 5, 8192)


def d256_cases() -> list[tuple[str, object]]:
    """(label, DecodeCase) in the order timed (module docstring), so that a run cut short keeps seed 47's rows."""
    from common.measure.decode_sweep import DecodeCase, decode_problem, random_cases

    def shape(batch: int, seqlen_k: int, kv_heads: int, group: int, seqlen_q: int, **paging) -> object:
        return decode_problem(batch, seqlen_k, kv_heads, heads=kv_heads * group, head_dim=256, seqlen_q=seqlen_q,
                              **paging)  # fmt: skip

    seed47 = random_cases(8, 47)
    return [
        ("seed47-4", seed47[4]),
        ("seed47-6", seed47[6]),
        ("long-mqa-128k", DecodeCase(shape(2, 131072, 1, 8, 16))),
        ("128rows-4k", DecodeCase(shape(8, 4096, 8, 8, 16))),
        ("64rows-paged", DecodeCase(shape(16, 16384, 2, 16, 4, page_size=64), RAGGED_LENGTHS)),
    ]


@contextlib.contextmanager
def applied(setting: str) -> Iterator[None]:
    """triton/decode's constants under ``setting`` (module docstring), restored after."""
    from triton_impl import decode

    saved = decode.WIDE_D256, decode.WIDE_D256_CONFIG
    if setting == "narrow":
        decode.WIDE_D256 = False
    elif setting == "wide-d256-deep":
        decode.WIDE_D256_CONFIG = dataclasses.replace(saved[1], num_stages=DEEP_STAGES)
    try:
        yield
    finally:
        decode.WIDE_D256, decode.WIDE_D256_CONFIG = saved


def plan_of_setting(setting: str, problem) -> str:
    """What the settings change, under ``setting``: rows a CTA takes x M tiles, key block x depth, warps."""
    from bench.decode_packed import plan_of

    with applied(setting):
        return plan_of(IMPL, problem)


def settings_to_time(problem) -> list[str]:
    """``default``, and each other setting whose plan no earlier setting has."""
    plans: dict[str, str] = {}
    for setting in SETTINGS:
        plans.setdefault(plan_of_setting(setting, problem), setting)
    return list(plans.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/decode-d256-wide"), help="output folder")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the settings (default 2)")
    parser.add_argument("--rep", type=float, default=60.0, help="timed repetitions per variant, ms (default 60)")
    args = parser.parse_args(argv)
    require_gpu("bench.decode_d256_wide")
    import torch

    from bench.decode_floor import interleaved_settings, summary
    from common.contract.registry import discover
    from common.measure.decode_sweep import roofline_us, too_large
    from common.measure.peaks import measure_bf16_sustained_tflops, measure_read_gbps
    from common.measure.runner import TimingOptions, freeze_imports

    device = torch.device("cuda")
    impl = next(impl for impl in discover(include_baselines=False)[0] if impl.name == IMPL)
    args.out.mkdir(parents=True, exist_ok=True)
    read_gbps, gemm_tflops = measure_read_gbps(device), measure_bf16_sustained_tflops(device)
    print(f"read {read_gbps:.0f} GB/s, bf16 GEMM sustained {gemm_tflops or math.nan:.0f} TFLOP/s", flush=True)
    options = TimingOptions(25.0, args.rep)
    freeze_imports()
    rows: list[dict] = []
    log = CsvLog(args.out / "decode_d256_wide.csv", COLUMNS)
    for label, case in d256_cases():
        if skip := too_large(case, device):
            print(f"{label}: skipped: {skip}", flush=True)
            continue
        roofline = roofline_us(case, read_gbps, gemm_tflops)
        workload, extra = case.gpu_workload(device)
        settings = settings_to_time(case.problem)
        results = interleaved_settings(impl, case, (workload, extra), settings, args.rounds, options, applied)
        for setting, measured in results.items():
            status, us, rel_l2_err, reason = summary(measured)
            record = {
                "label": label, "shape": case.describe(), "setting": setting,
                "plan": plan_of_setting(setting, case.problem), "status": status, "us": us,
                "pct_read_bw": 100 * case.kv_bytes_read / (us * 1e3) / read_gbps, "pct_roofline": 100 * roofline / us,
                "rel_l2_err": rel_l2_err, "reason": reason,
            }  # fmt: skip
            rows.append(record)
            log.append(record)
            shares = f"{record['pct_read_bw']:5.1f} % BW {record['pct_roofline']:5.1f} % roofline"
            print(f"{label:14s} {setting:9s} {record['plan']:18s} {status:6s} {us:8.1f} us {shares} {reason}")
        del workload
        torch.cuda.empty_cache()
        # After every shape, so that a run cut short keeps the table of the shapes done.
        (args.out / "decode_d256_wide.md").write_text(markdown(rows, read_gbps, gemm_tflops))
    print((args.out / "decode_d256_wide.md").read_text())
    return 0 if rows and all(row["status"] == "ok" for row in rows) else 1


def markdown(rows: list[dict], read_gbps: float, gemm_tflops: float | None) -> str:
    """One line per shape: µs (% of the read bandwidth; % of the roofline where that differs; plan) per setting,
    and each setting's time over the default's ('—': the setting does not change the plan)."""
    from common.reporting.decode_table import bandwidth_share

    gemm = f"{gemm_tflops:.0f} TFLOP/s" if gemm_tflops else "not measured"
    knobs = SETTINGS[1:]
    lines = [
        f"triton/decode WIDE_D256 A/B (bench/decode_d256_wide.py): µs per step, % of the read bandwidth "
        f"({read_gbps:.0f} GB/s) and of the roofline (bf16 GEMM sustained {gemm}); '—': the setting does not "
        "change the plan",
        "",
        "| shape | " + " | ".join(SETTINGS) + " | " + " | ".join(f"{knob} / default" for knob in knobs) + " |",
        "|---|" + "---|" * (len(SETTINGS) + len(knobs)),
    ]
    for label in dict.fromkeys(row["label"] for row in rows):
        by = {row["setting"]: row for row in rows if row["label"] == label}
        ok = {setting: row for setting, row in by.items() if row["status"] == "ok"}
        cells = []
        for setting in SETTINGS:
            row = by.get(setting)
            if row is None or setting not in ok:
                cells.append(row["status"] if row else "—")
            else:
                share = bandwidth_share(row["pct_read_bw"], row["pct_roofline"])
                cells.append(f"{row['us']:.1f} µs ({share}; {row['plan']})")
        ratios = [
            f"{ok[knob]['us'] / ok['default']['us']:.2f}" if knob in ok and "default" in ok else "—" for knob in knobs
        ]
        lines.append(f"| {label}: {next(iter(by.values()))['shape']} | " + " | ".join(cells + ratios) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
