"""The balanced split's target rule: ``BALANCED_TARGET`` "per-sm" against "per-slot" (gluon's and cute's default since
this A/B).

``common/contract/splits.py``'s "The target rule". Nsight Compute on an H200
(``results/h200/decode-ncu-2026-11-30-fifth/``) found two of seed 43's ragged rows far below the read bandwidth
because of the per-SM target: B=2 Hkv=32 D=64 paged(64) (264 shares + 64 items = 328 CTAs on 264 CTA slots in
gluon and cute, 1.24 waves, SMs active 59-63 %) and B=64 Hkv=16 D=64 (1024 items, a share longer than most
sequences: triton's 1288 CTAs, SMs active 66 %). "per-slot" reserves the items' rounding where they are few and
takes two shares a slot where they fill a wave.

Rows (:func:`cases`, in the order timed, so that a run cut short keeps the two rows the rule is for): seed 43's
cases 0 and 2, the rows on which four shares an SM lost (``results/h200/decode-ragged-cap/``: seed 43's ragged
cases 1 and 4 and its full caches 3 and 5 given as lengths), seed 37's case 6 (B=16 Hkv=32 D=128 ragged, 512 items:
the model's worst loss in triton/decode, 3 slots an SM), then controls whose plans the rule leaves as they are (seed
43's case 7, seed 47's cases 3 and 7 as drawn: B=1, and a full cache without lengths, not balanced). Each rung is
timed under each setting whose plan (target shares, each item's share count; ``bench.decode_ragged_ab.plan_of``)
differs from the default's ("=" otherwise), checked against fp64 on a poisoned output first, the settings
interleaved (``bench.decode_floor.interleaved_settings``).
Writes ``target.csv`` and ``target.md`` under ``--out`` (the table rewritten after every row). ``--model`` prints
``bench/decode_ragged_model.py``'s prediction of the same rows instead (no GPU).

    python -m bench.decode_target_ab --out runs/decode-target      # from the project root, on a GPU
    python -m bench.decode_target_ab --model --latency-us 2.5      # the model's µs, no GPU
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
from collections.abc import Iterator
from pathlib import Path

from bench import require_gpu
from bench.decode_ragged_ab import RUNG_MODULES, describe_plan, open_rungs, plan_of, switched
from common.measure.results import CsvLog

SETTINGS = ("per-sm", "per-slot")
# Where each rung's BALANCED_TARGET lives (gluon/decode's beside its item-share cap).
TARGET_MODULES = {**RUNG_MODULES, "gluon/decode": "triton_impl.gluon._decode_balanced"}
# (seed, index into random_cases(8, seed), given as full lengths) in the order timed (module docstring).
ROWS = ((43, 0, False), (43, 2, False), (43, 1, False), (43, 4, False), (43, 3, True), (43, 5, True), (37, 6, False),
        (43, 7, False), (47, 3, False), (47, 7, False))  # fmt: skip
COLUMNS = ("label", "impl", "shape", "mb", "setting", "plan", "status", "us", "pct_read_bw", "rel_l2_err", "reason")


def cases() -> list[tuple[str, object]]:
    """(label, DecodeCase) of :data:`ROWS`: "43/3 full" is seed 43's case 3 with every length given as Sk."""
    from common.measure.decode_sweep import DecodeCase, random_cases

    drawn = {seed: random_cases(8, seed) for seed in dict.fromkeys(seed for seed, _, _ in ROWS)}
    result = []
    for seed, index, full in ROWS:
        case = drawn[seed][index]
        if full:
            problem = case.problem.with_(has_cache_seqlens=True)
            case = DecodeCase(problem, (problem.seqlen_k,) * problem.batch)
        result.append((f"{seed}/{index}{' full' if full else ''}", case))
    return result


@contextlib.contextmanager
def applied(rung: str, setting: str) -> Iterator[None]:
    """``rung``'s ``BALANCED_TARGET`` set to ``setting`` inside, restored after."""
    with switched({TARGET_MODULES[rung]: {"BALANCED_TARGET": setting}}):
        yield


def settings_to_time(rung: str, case, device) -> dict[str, tuple]:
    """setting -> plan of the settings to time: the default's, and "per-slot" where its plan differs."""
    plans = {}
    for setting in SETTINGS:
        with applied(rung, setting):
            plan = plan_of(rung, case.problem, case.lengths, device)
        if plan not in plans.values():
            plans[setting] = plan
    return plans


def model_table(latency_us: float, merge_step_us: float) -> str:
    """A markdown row per (row, rung): ``bench/decode_ragged_model.py``'s µs (% of the read bandwidth) and target
    under each setting ("not balanced": the rung's split rule, which the target does not touch)."""
    import torch

    from bench import decode_model, decode_ragged_model

    decode_model.LATENCY_US, decode_model.MERGE_STEP_US = latency_us, merge_step_us
    title = f"Modelled (latency {latency_us} µs, merge step {merge_step_us} µs): µs (% of the read bandwidth), target"
    lines = [title, "", "| row | rung | " + " | ".join(SETTINGS) + " |", "|---|---|" + "---|" * len(SETTINGS)]
    for label, case in cases():
        ideal = case.kv_bytes_read / (decode_model.READ_GBPS * 1e3)
        for rung in RUNG_MODULES:
            cells = []
            for setting in SETTINGS:
                with applied(rung, setting):
                    if plan_of(rung, case.problem, case.lengths, torch.device("cpu"))[0] != "balanced":
                        cells.append("not balanced")
                        continue
                    plan = decode_ragged_model.rung_plan(rung, case.problem, case.lengths)
                us, _ = decode_ragged_model.step_us(plan, case.problem, case.lengths)
                cells.append(f"{us:.0f} ({100 * ideal / us:.0f} %), {plan.target}")
            lines.append(f"| {label} | {rung} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/decode-target"), help="output folder")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds of the settings (default 1)")
    parser.add_argument("--rep", type=float, default=30.0, help="timed ms per measurement (default 30)")
    parser.add_argument("--model", action="store_true", help="print the model's prediction of the rows (no GPU)")
    parser.add_argument("--latency-us", type=float, default=1.75, help="--model: a CTA's load latency, µs")
    parser.add_argument("--merge-step-us", type=float, default=0.45, help="--model: a merge step's µs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    if args.model:
        print(model_table(args.latency_us, args.merge_step_us), end="")
        return 0
    require_gpu("bench.decode_target_ab")
    return run(args)


def run(args: argparse.Namespace) -> int:
    """Every row of the module docstring, the table written after each and printed last; 0 when every timed
    setting passed its check and every rung was available."""
    import torch

    from bench.decode_floor import interleaved_settings, summary
    from common.measure.runner import TimingOptions

    device, impls, read_gbps = open_rungs(args.out)
    log, rows, options = CsvLog(args.out / "target.csv", COLUMNS), [], TimingOptions(25.0, args.rep)
    for label, case in cases():
        workload, extra = case.gpu_workload(device)
        for rung in RUNG_MODULES:
            if rung not in impls:
                print(f"{label} {rung}: not available here", flush=True)
                continue
            plans = settings_to_time(rung, case, device)
            apply = functools.partial(applied, rung)
            results = interleaved_settings(
                impls[rung], case, (workload, extra), list(plans), args.rounds, options, apply
            )
            for setting, measured in results.items():
                status, us, err, reason = summary(measured)
                record = {"label": label, "impl": rung, "shape": case.describe(),
                          "mb": round(case.kv_bytes_read / 1e6), "setting": setting,
                          "plan": describe_plan(plans[setting]), "status": status, "us": us,
                          "pct_read_bw": 100 * case.kv_bytes_read / (us * 1e3) / read_gbps, "rel_l2_err": err,
                          "reason": reason}  # fmt: skip
                rows.append(record)
                log.append(record)
                print(f"{label:10s} {rung:14s} {setting:8s} {status:6s} {us:8.1f} us {record['pct_read_bw']:5.1f} % "
                      f"{record['plan']} {reason}", flush=True)  # fmt: skip
        del workload, extra
        torch.cuda.empty_cache()
        (args.out / "target.md").write_text(markdown(rows, read_gbps))
    print((args.out / "target.md").read_text() if rows else "no row timed")
    return 0 if rows and all(r["status"] == "ok" for r in rows) and len(impls) == len(RUNG_MODULES) else 1


def markdown(rows: list[dict], read_gbps: float) -> str:
    """One line per row: each rung's µs (% of the read bandwidth) under "per-sm", under "per-slot" ("=": the
    same plan) and their ratio, and "per-slot"'s plan."""
    title = f"BALANCED_TARGET A/B (bench/decode_target_ab.py): µs (% of {read_gbps:.0f} GB/s); '=': the same plan"
    header = ["row", "MB", *(f"{rung.split('/')[0]} {s}" for rung in RUNG_MODULES for s in (*SETTINGS, "ratio"))]
    lines = [title, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    cell = {(r["label"], r["impl"], r["setting"]): r for r in rows}
    for label in dict.fromkeys(r["label"] for r in rows):
        mb = next(r["mb"] for r in rows if r["label"] == label)
        cells = []
        for rung in RUNG_MODULES:
            off, on = cell.get((label, rung, "per-sm")), cell.get((label, rung, "per-slot"))
            cells.append(_cell(off))
            cells.append("=" if off is not None and on is None else _cell(on))
            timed = off and on and off["status"] == on["status"] == "ok"
            cells.append(f"{on['us'] / off['us']:.2f} ({on['plan']})" if timed else "")
        lines.append(f"| {label} | {mb} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _cell(row: dict | None) -> str:
    if row is None:
        return "—"
    return f"{row['us']:.1f} ({row['pct_read_bw']:.0f} %)" if row["status"] == "ok" else row["status"]


if __name__ == "__main__":
    sys.exit(main())
