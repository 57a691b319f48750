"""gluon/decode's ``ITEMS_IN_FLIGHT`` (issue #38's short items) off against on, in one process: each row of the random
decode sweep (``bench.decode_knob_ab.parse_row``'s spelling) bound under each setting, checked against fp64 on a
poisoned output, then timed (L2 flushed, ``time_cuda``'s medians) once a round, the settings in an order reversed
every other round (``bench.interleaved``); each setting's median over the rounds, and on ÷ off.

    python -m bench.gluon_decode_items_ab --rounds 4 --out runs/gluon-decode-items --rows 151/1 151/5 41/2
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bench import interleaved, require_gpu
from bench.decode_knob_ab import knob_set, parse_row
from common.measure.results import CsvLog

KNOB = ("triton_impl.gluon.decode", "ITEMS_IN_FLIGHT")
SETTINGS = (False, True)
COLUMNS = ("row", "shape", "mb", "setting", "taken", "status", "us", "rounds_us", "pct_read_bw", "rel_l2_err", "reason")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="+", required=True, help="SEED/INDEX[:changes] rows, in order")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds (default 4)")
    parser.add_argument("--rep", type=float, default=30.0, help="timed ms per measurement (default 30)")
    parser.add_argument("--out", type=Path, default=Path("runs/gluon-decode-items"), help="output folder")
    args = parser.parse_args(argv)
    rows = [parse_row(text) for text in args.rows]
    require_gpu("bench.gluon_decode_items_ab")
    return run(args, rows)


def run(args: argparse.Namespace, rows: list) -> int:
    import torch

    from bench.decode_floor import measure
    from bench.decode_ragged_ab import open_rungs
    from common.measure.runner import TimingOptions
    from triton_impl.gluon import decode as gluon_decode

    device, impls, read_gbps = open_rungs(args.out)
    impl, options = impls["gluon/decode"], TimingOptions(25.0, args.rep)
    log, lines, passed = CsvLog(args.out / "items.csv", COLUMNS), [], True
    for label, case in rows:
        workload, _ = case.gpu_workload(device)

        def timed(setting: bool, case=case, workload=workload) -> tuple:
            with knob_set(*KNOB, setting):
                return measure(impl, case, workload, options)

        samples = interleaved({setting: setting for setting in SETTINGS}, args.rounds, timed)
        medians = {}
        for setting, measured in samples.items():
            with knob_set(*KNOB, setting):
                taken = gluon_decode.items_in_flight(case.problem, device)
            status = next((m[0] for m in measured if m[0] != "ok"), "ok")
            passed &= status == "ok"
            us = statistics.median(m[1] for m in measured)
            medians[setting] = us
            record = {
                "row": label, "shape": case.describe(), "mb": round(case.kv_bytes_read / 1e6), "setting": setting,
                "taken": taken, "status": status, "us": us, "rounds_us": " ".join(f"{m[1]:.1f}" for m in measured),
                "pct_read_bw": 100 * case.kv_bytes_read / (us * 1e3) / read_gbps,
                "rel_l2_err": max(m[2] for m in measured), "reason": "; ".join({m[4] for m in measured} - {""}),
            }  # fmt: skip
            log.append(record)
            bandwidth = f"{record['pct_read_bw']:5.1f} %"
            print(f"{label:10s} items={setting!s:5s} taken={taken!s:5s} {status:6s} {us:8.1f} us {bandwidth} "
                  f"rounds {record['rounds_us']} {record['reason']}", flush=True)  # fmt: skip
        lines.append(f"| {label} | {case.describe()} | {medians[False]:.1f} | {medians[True]:.1f} | "
                     f"{medians[True] / medians[False]:.3f} |")  # fmt: skip
        del workload
        torch.cuda.empty_cache()
        # Rewritten after every row, so that a run cut by its time limit keeps the rows it finished.
        table = "| row | shape | off us | on us | on / off |\n|---|---|---|---|---|\n" + "\n".join(lines) + "\n"
        (args.out / "items.md").write_text(table)
    print((args.out / "items.md").read_text() if lines else "no row timed")
    return 0 if passed and lines else 1


if __name__ == "__main__":
    raise SystemExit(main())
