"""Issue #38's many packed rows in cute/decode: ``WARPS_SPLIT_ROWS`` (and the row split's four-stage D=64 ring,
``_decode_warps.ROW_SPLIT_STAGES``) against the default, in one process.

Seed 41's lowest row (B=16 H=256 Hkv=32 Sq=16 Sk=1024 D=64, 128 packed rows per (batch, KV head)) ran at 30 % of
the read bandwidth in cute/decode (104 µs; triton 41-46 %, gluon 43 %): two 64-row tiles a pair, 1024 CTAs of 4
warps that split the keys, so each warp rescales all 64 rows' O every block (sm_90a: 570 instructions a warp a
block, 255 registers, two CTAs an SM). Settings (``applied``):

* ``default``: as committed;
* ``rows``: ``WARPS_SPLIT_ROWS``, 4 warps of 16 rows × 64 keys (377 instructions, 168 registers, still two CTAs
  an SM: the six-stage ring's 96 KB);
* ``rows-s4``: the same in a four-stage D=64 ring (72 KB): three CTAs an SM.

Shapes (:func:`rows_cases`, in the order timed, :data:`ORDER`): bench.decode_packed's (seed 41's row and its
neighbours, seed 31's paged ragged 128-row row, two long caches that must not regress) and two 32-row rows of seed
41 (2 × 2 warps).
A setting is timed only where it changes the plan; each is checked against fp64 on a poisoned output, then timed
(median, L2 flushed), the settings interleaved for ``--rounds`` rounds. Writes ``cute_decode_rows.csv`` and
``cute_decode_rows.md`` under ``--out``.

    python -m bench.cute_decode_rows --out runs/cute-decode-rows       # from the project root, on a GPU
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from bench import require_gpu
from common.measure.results import CsvLog

SETTINGS = ("default", "rows", "rows-s4")
COLUMNS = ("label", "shape", "setting", "plan", "status", "us", "pct_read_bw", "rel_l2_err", "reason")


# The order timed, so that a run cut short keeps seed 41's row, a ragged and a long control and a 32-row row first.
ORDER = (
    "seed41-1", "seed31-6", "long-128rows-d64-32k", "seed41-3", "128rows-d128-1k", "128rows-d64-4k", "64rows-d64-2k",
    "long-256rows-d128-16k", "64rows-d128-1k", "seed41-4",
)  # fmt: skip


def rows_cases() -> list[tuple[str, object]]:
    """(label, DecodeCase) in :data:`ORDER`: bench.decode_packed's shapes and seed 41's two 32-row rows."""
    from bench.decode_packed import packed_cases
    from common.measure.decode_sweep import random_cases

    seed41 = random_cases(8, 41)
    cases = dict([*packed_cases(), ("seed41-3", seed41[3]), ("seed41-4", seed41[4])])
    return [(label, cases[label]) for label in ORDER]


@contextlib.contextmanager
def applied(setting: str) -> Iterator[None]:
    """cute/decode's switches for ``setting`` (module docstring), restored after."""
    from cute_impl import _decode_warps, decode

    saved = decode.WARPS_SPLIT_ROWS, _decode_warps.ROW_SPLIT_STAGES
    decode.WARPS_SPLIT_ROWS = setting != "default"
    _decode_warps.ROW_SPLIT_STAGES = {64: 4} if setting == "rows-s4" else {}
    try:
        yield
    finally:
        decode.WARPS_SPLIT_ROWS, _decode_warps.ROW_SPLIT_STAGES = saved


def plan_of(problem, device) -> str:
    """Rows a tile x M tiles, warps along M x along the keys, ring stages, splits (or the packed prefill's tiles, which
    the settings here do not touch)."""
    from cute_impl import decode
    from cute_impl._hopper_host import HopperAttentionConfig

    num_splits, slabs, _, config = decode.launch_plan(problem, device)
    if isinstance(config, HopperAttentionConfig):
        return f"packed prefill: {decode.packed_prefill_tiles(problem)} tiles, {num_splits} key splits"
    key_warps = config.shape.num_warps // config.row_warps
    split = f"shares {num_splits}" if slabs else f"splits {num_splits}"
    return (
        f"{config.tile_m}x{decode.m_blocks_for(problem)} w{config.row_warps}x{key_warps} s{config.shape.stages} {split}"
    )


def settings_to_time(problem, device) -> list[str]:
    """``default``, and each other setting where it changes the plan."""
    plans: dict[str, str] = {}
    for setting in SETTINGS:
        with applied(setting):
            plans.setdefault(plan_of(problem, device), setting)
    return list(plans.values())


def ab_arguments(name: str, argv: list[str] | None, doc: str) -> argparse.Namespace:
    """The options both cute/decode A/Bs take (this one and ``bench.cute_decode_d256``)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(f"runs/{name.replace('_', '-')}"), help="output folder")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the settings (default 2)")
    parser.add_argument("--rep", type=float, default=30.0, help="timed repetitions per variant, ms (default 30)")
    parser.add_argument("--labels", default="", help="comma-separated labels to time (default all, in order)")
    return parser.parse_args(argv)


def time_settings(name: str, args: argparse.Namespace, cases: list, settings_of, applied_setting, markdown_of) -> int:
    """cute/decode's A/B loop: the read bandwidth first, then per case (``args.labels``' only, if given) the
    settings ``settings_of(problem, device)`` interleaved ``args.rounds`` times under ``applied_setting``, each
    checked against fp64 and timed (L2 flushed, median); ``{name}.csv`` row by row and ``{name}.md`` (by
    ``markdown_of(rows, read_gbps)``) after every case, so that a run cut short keeps the cases done. 0 when
    every row is ok."""
    require_gpu(f"bench.{name}")
    import torch

    from bench.decode_floor import interleaved_settings, summary
    from common.contract.registry import discover
    from common.measure.decode_sweep import too_large
    from common.measure.peaks import measure_read_gbps
    from common.measure.runner import TimingOptions, freeze_imports

    device = torch.device("cuda")
    (impl,) = [impl for impl in discover(include_baselines=False)[0] if impl.name == "cute/decode"]
    wanted = set(filter(None, args.labels.split(",")))
    args.out.mkdir(parents=True, exist_ok=True)
    read_gbps = measure_read_gbps(device)
    print(f"read {read_gbps:.0f} GB/s", flush=True)
    options = TimingOptions(25.0, args.rep)
    freeze_imports()
    rows: list[dict] = []
    log = CsvLog(args.out / f"{name}.csv", COLUMNS)
    for label, case in cases:
        if wanted and label not in wanted:
            continue
        if skip := too_large(case, device):
            print(f"{label}: skipped: {skip}", flush=True)
            continue
        settings = settings_of(case.problem, device)
        results = interleaved_settings(impl, case, case.gpu_workload(device), settings, args.rounds, options,
                                       applied_setting)  # fmt: skip
        for setting, measured in results.items():
            with applied_setting(setting):
                plan = plan_of(case.problem, device)
            status, us, rel_l2_err, reason = summary(measured)
            record = {
                "label": label, "shape": case.describe(), "setting": setting, "plan": plan, "status": status,
                "us": us, "pct_read_bw": 100 * case.kv_bytes_read / (us * 1e3) / read_gbps, "rel_l2_err": rel_l2_err,
                "reason": reason,
            }  # fmt: skip
            rows.append(record)
            log.append(record)
            print(f"{label:22s} {setting:8s} {plan:30s} {status:6s} {us:8.1f} us {record['pct_read_bw']:5.1f} % BW "
                  f"{reason}", flush=True)  # fmt: skip
        torch.cuda.empty_cache()
        (args.out / f"{name}.md").write_text(markdown_of(rows, read_gbps))
    print((args.out / f"{name}.md").read_text())
    return 0 if rows and all(row["status"] == "ok" for row in rows) else 1


def main(argv: list[str] | None = None) -> int:
    args = ab_arguments("cute_decode_rows", argv, __doc__)
    return time_settings("cute_decode_rows", args, rows_cases(), settings_to_time, applied, markdown)


def settings_markdown(title: str, settings: tuple[str, ...], rows: list[dict]) -> str:
    """``title``, then one line per shape: µs (% of the read bandwidth; plan) per setting ('—' where a setting
    was not timed, its status where it failed), and each setting after the first over the first."""
    lines = [
        title,
        "",
        "| shape | " + " | ".join(settings) + " | " + " | ".join(f"{s} / {settings[0]}" for s in settings[1:]) + " |",
        "|---|" + "---|" * (2 * len(settings) - 1),
    ]
    for label in dict.fromkeys(row["label"] for row in rows):
        by = {row["setting"]: row for row in rows if row["label"] == label}
        ok = {setting: row for setting, row in by.items() if row["status"] == "ok"}
        cells = []
        for setting in settings:
            row = by.get(setting)
            if row is None or setting not in ok:
                cells.append("—" if row is None else row["status"])
            else:
                cells.append(f"{row['us']:.1f} µs ({row['pct_read_bw']:.0f} %; {row['plan']})")
        ratios = [
            f"{ok[setting]['us'] / ok[settings[0]]['us']:.2f}" if setting in ok and settings[0] in ok else "—"
            for setting in settings[1:]
        ]
        shape = next(iter(by.values()))["shape"]
        lines.append(f"| {label}: {shape} | " + " | ".join(cells + ratios) + " |")
    return "\n".join(lines) + "\n"


def markdown(rows: list[dict], read_gbps: float) -> str:
    """This A/B's table (:func:`settings_markdown`)."""
    title = (
        f"cute/decode WARPS_SPLIT_ROWS A/B (bench/cute_decode_rows.py): µs per step, % of the read bandwidth "
        f"({read_gbps:.0f} GB/s); '—': the setting does not change the plan"
    )
    return settings_markdown(title, SETTINGS, rows)


if __name__ == "__main__":
    sys.exit(main())
