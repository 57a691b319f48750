"""Any decode knob A/B in one process: a module constant set to each of its values in turn, on rows of the random
decode sweep (``common.measure.decode_sweep.random_cases``), each value checked against fp64 on a poisoned output,
then timed (L2 flushed, a median a round, the mean over rounds), the values interleaved, their order reversed every
other round (``bench.decode_floor.interleaved_settings``).

A row is ``SEED/INDEX`` (case INDEX of ``random_cases(8, SEED)``, as ``compare.py --decode --decode-seed SEED``
draws it), optionally followed by ``:`` and comma-separated changes: ``full`` (every sequence at the padded
length, given as ``cache_seqlens``), ``ragged`` (``compare.py --decode``'s ragged batch: its eight lengths from 0 to
the padded length, ``decode_sweep.ragged_lengths``, given as ``cache_seqlens``; a batch of 8) or ``FIELD=VALUE`` for a
``Problem`` field (e.g. ``page_size=0``: the same cache contiguous). ``73/3:seqlen_k=32768,head_dim=128,ragged`` is
the default decode sweep's ragged row (B=8 H=32 Hkv=8 Sq=1 D=128 bf16, bottom-right causal). A knob is
``MODULE:NAME`` (e.g. ``common.contract.splits:SHORT_ONE_SPLIT_SKIPS_RAGGED_WAVE``) with its values as Python literals,
read as one list (``--values "{128: 64},{128: 64, 256: 64}"`` is two dicts). Each row's plan under each value
(``bench.decode_ragged_ab.plan_of``; for gluon/decode, whether ``ITEMS_IN_FLIGHT``'s kernel takes it) is printed beside
its time, so a value that changes nothing for a rung reads as the same plan. ``--set MODULE:NAME=LITERAL`` (repeatable)
holds another constant at a value for the whole run, under every value of the knob (a switch that only acts with
another one on: cute/decode's ``PACKED_PREFILL_SPLITS`` under ``PACKED_PREFILL_MIN_ROWS``).
Writes ``knob.csv`` and ``knob.md`` under ``--out`` (the table rewritten after every row).

    python -m bench.decode_knob_ab --knob common.contract.splits:SHORT_ONE_SPLIT_SKIPS_RAGGED_WAVE \\
        --values False,True --rungs gluon/decode --rows 59/6 59/6:full --out runs/knob
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from bench import require_gpu
from bench.decode_ragged_ab import RUNG_MODULES, describe_plan, open_rungs, plan_of, switched
from common.measure.results import CsvLog

COLUMNS = ("row", "impl", "shape", "mb", "setting", "plan", "status", "us", "pct_read_bw", "rel_l2_err", "reason")


def parse_row(text: str) -> tuple[str, object]:
    """(label, DecodeCase) of one ``--rows`` entry (module docstring)."""
    from common.measure.decode_sweep import DecodeCase, ragged_lengths, random_cases

    drawn, _, changes = text.partition(":")
    seed, _, index = drawn.partition("/")
    try:
        case = random_cases(8, int(seed))[int(index)]
    except (ValueError, IndexError) as error:
        raise SystemExit(f"a row is SEED/INDEX with INDEX in 0..7 (then :changes), got {text!r}") from error
    problem, lengths_of = case.problem, None
    for change in filter(None, changes.split(",")):
        if change in ("full", "ragged"):
            lengths_of = change
            continue
        field, equals, value = change.partition("=")
        if not equals:
            raise SystemExit(f"a row's change is 'full', 'ragged' or FIELD=VALUE, got {change!r} in {text!r}")
        problem = problem.with_(**{field: ast.literal_eval(value)})
    if lengths_of is None:
        lengths = case.lengths if problem.has_cache_seqlens else None
        if lengths is not None and len(lengths) != problem.batch:
            raise SystemExit(
                f"the drawn lengths are {len(lengths)}, a batch of {problem.batch} in {text!r}: add 'full'"
            )
        return text, DecodeCase(problem, lengths)
    problem = problem.with_(has_cache_seqlens=True)
    if lengths_of == "full":
        return text, DecodeCase(problem, (problem.seqlen_k,) * problem.batch)
    lengths = ragged_lengths(problem.seqlen_k)
    if problem.batch != len(lengths):
        raise SystemExit(f"'ragged' gives {len(lengths)} sequences, a batch of {problem.batch} in {text!r}")
    return text, DecodeCase(problem, lengths)


@contextlib.contextmanager
def knob_set(module: str, name: str, value: object) -> Iterator[None]:
    with switched({module: {name: value}}):
        yield


def knob_plan(rung: str, case, device) -> str:
    """``rung``'s plan of ``case`` under the current constants (``plan_of``); for gluon/decode, with the CTAs of
    ``ITEMS_IN_FLIGHT``'s kernel where it takes the row (its one split on fewer CTAs, each walking many tiles), or
    ``TWO_CONSUMERS``' two M tiles a CTA."""
    plan = describe_plan(plan_of(rung, case.problem, case.lengths, device))
    if rung == "gluon/decode":
        from triton_impl.gluon import decode as gluon_decode

        if gluon_decode.items_in_flight(case.problem, device):
            return f"{plan}, items kernel on {gluon_decode.items_grid(case.problem, device)} CTAs"
        if gluon_decode.consumers_for(case.problem, device) == 2:
            return f"{plan}, two M tiles a CTA"
    return plan


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--knob", required=True, help="MODULE:NAME of the constant to set")
    parser.add_argument(
        "--values", required=True, help="comma-separated Python literals (a dict's commas too), the default's first"
    )
    parser.add_argument("--rows", nargs="+", required=True, help="SEED/INDEX[:full,FIELD=VALUE...] rows, in order")
    parser.add_argument("--rungs", default=",".join(RUNG_MODULES), help="comma-separated decode rungs (default all)")
    parser.add_argument("--out", type=Path, default=Path("runs/decode-knob"), help="output folder")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the values (default 2)")
    parser.add_argument("--rep", type=float, default=30.0, help="timed ms per measurement (default 30)")
    parser.add_argument(
        "--set", action="append", default=[], help="MODULE:NAME=LITERAL held for the whole run (repeatable)"
    )
    args = parser.parse_args(argv)
    args.held = held_constants(parser, args.set)
    args.module, _, args.name = args.knob.partition(":")
    # One list literal: a value that holds commas ({128: 64, 256: 64}) stays one value.
    args.values = ast.literal_eval(f"[{args.values}]")
    args.rungs = args.rungs.split(",")
    if not args.name or len(args.values) < 2 or not set(args.rungs) <= set(RUNG_MODULES):
        parser.error(f"--knob MODULE:NAME, two or more --values, --rungs among {', '.join(RUNG_MODULES)}")
    return args


def held_constants(parser: argparse.ArgumentParser, texts: list[str]) -> dict[str, dict[str, object]]:
    """``--set`` entries as ``switched`` takes them: {module: {name: value}}."""
    held: dict[str, dict[str, object]] = {}
    for text in texts:
        knob, equals, value = text.partition("=")
        module, _, name = knob.partition(":")
        if not (equals and name):
            parser.error(f"--set takes MODULE:NAME=LITERAL, got {text!r}")
        held.setdefault(module, {})[name] = ast.literal_eval(value)
    return held


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    rows = [parse_row(text) for text in args.rows]
    require_gpu("bench.decode_knob_ab")
    with switched(args.held):
        return run(args, rows)


def run(args: argparse.Namespace, rows: list[tuple[str, object]]) -> int:
    """Every row, each rung, each value; 0 when every value passed its check and every rung was available."""
    import torch

    from bench.decode_floor import interleaved_settings, summary
    from common.measure.runner import TimingOptions

    device, impls, read_gbps = open_rungs(args.out)
    log, records, options = CsvLog(args.out / "knob.csv", COLUMNS), [], TimingOptions(25.0, args.rep)
    settings = [repr(value) for value in args.values]
    apply = dict(zip(settings, args.values, strict=True))
    for label, case in rows:
        workload, extra = case.gpu_workload(device)
        for rung in args.rungs:
            if rung not in impls:
                print(f"{label} {rung}: not available here", flush=True)
                continue
            plans = {}
            for setting in settings:
                with knob_set(args.module, args.name, apply[setting]):
                    plans[setting] = knob_plan(rung, case, device)
            timed = interleaved_settings(
                impls[rung], case, (workload, extra), settings, args.rounds, options,
                lambda setting: knob_set(args.module, args.name, apply[setting]),
            )  # fmt: skip
            for setting, measured in timed.items():
                status, us, err, reason = summary(measured)
                record = {"row": label, "impl": rung, "shape": case.describe(), "mb": round(case.kv_bytes_read / 1e6),
                          "setting": setting, "plan": plans[setting], "status": status, "us": us,
                          "pct_read_bw": 100 * case.kv_bytes_read / (us * 1e3) / read_gbps, "rel_l2_err": err,
                          "reason": reason}  # fmt: skip
                records.append(record)
                log.append(record)
                print(f"{label:14s} {rung:14s} {setting:10s} {status:6s} {us:8.1f} us "
                      f"{record['pct_read_bw']:5.1f} % {record['plan']} {reason}", flush=True)  # fmt: skip
        del workload, extra
        torch.cuda.empty_cache()
        (args.out / "knob.md").write_text(markdown(records, args, read_gbps))
    print((args.out / "knob.md").read_text() if records else "no row timed")
    passed = all(record["status"] == "ok" for record in records)
    return 0 if records and passed and set(args.rungs) <= set(impls) else 1


def markdown(records: list[dict], args: argparse.Namespace, read_gbps: float) -> str:
    """One line per (row, rung): µs (% of the read bandwidth) and plan under each value, and last ÷ first."""
    settings = [repr(value) for value in args.values]
    title = f"{args.knob} A/B (bench/decode_knob_ab.py): µs (% of {read_gbps:.0f} GB/s), plan"
    header = ["row", "shape", "MB", "rung", *settings, f"{settings[-1]} / {settings[0]}"]
    lines = [title, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    cell = {(r["row"], r["impl"], r["setting"]): r for r in records}
    for row, rung in dict.fromkeys((r["row"], r["impl"]) for r in records):
        mine = [cell.get((row, rung, setting)) for setting in settings]
        first = next(r for r in mine if r is not None)
        cells = [f"{r['us']:.1f} ({r['pct_read_bw']:.0f} %), {r['plan']}" if r and r["status"] == "ok"
                 else (r["status"] if r else "—") for r in mine]  # fmt: skip
        ends = mine[0], mine[-1]
        ratio = f"{ends[1]['us'] / ends[0]['us']:.2f}" if all(r and r["status"] == "ok" for r in ends) else ""
        lines.append(f"| {row} | {first['shape']} | {first['mb']} | {rung} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
