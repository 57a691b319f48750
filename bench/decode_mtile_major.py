"""The balanced split's grid axes, ``M_TILE_MAJOR`` of triton/decode, gluon/decode and cute/decode: one process.

ncu on an H200, cute/decode on seed 47's B=64 H=8 Hkv=1 Sq=16 D=256 paged(256) ragged 17..33118 row (213 MB of K/V,
128 packed rows in 4 M tiles of 32): the balanced split kernel's grid (130, 4, 1) has the share on x, so the block
scheduler runs every share of M tile 0, then every share of M tile 1, and so on, and each M tile's pass reads the whole
cache from DRAM again (249 µs at 72.5 % of the DRAM throughput, about 870 MB: 16 % of the read bandwidth counted once).
``on`` puts the M tile on x (``common.contract.splits.balanced_grid``): the M tiles of a share run together, the first
reading each K/V block from DRAM, the others mostly from L2 (each rung's default since this A/B). ``off`` is the
rungs as before.

Shapes (:func:`mtile_cases`, in the order timed): seed 47's row 4 (today's M tiles: cute 4, gluon 2, triton 1, its
128-row ``WIDE_D256`` tile), bench/decode_d256_wide.py's ``64rows-paged`` (B=16 H=32 Hkv=2 Sq=4 D=256 paged(64)
ragged: triton and cute 2 M tiles, gluon 1), and seed 43's row 0 (B=2 H=256 Hkv=32 Sq=4 D=64 paged(64) ragged, 32
rows: one M tile in every rung), the control, where the knob only turns a (slabs, 1) grid into (1, slabs). Each
(rung, setting) is checked against fp64 on a poisoned output, then timed (median, L2 flushed), the settings interleaved
for ``--rounds`` rounds (``bench.decode_floor.interleaved_settings``). Writes ``decode_mtile_major.csv`` and
``decode_mtile_major.md`` under ``--out``: µs and % of the read bandwidth measured in the same run.

    python -m bench.decode_mtile_major --out runs/decode-mtile-major     # from the project root, on a GPU
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

from bench import require_gpu
from common.measure.results import CsvLog

SETTINGS = ("off", "on")
RUNG_MODULES = {"triton/decode": "triton_impl.decode", "gluon/decode": "triton_impl.gluon.decode",
                "cute/decode": "cute_impl.decode"}  # fmt: skip
COLUMNS = ("label", "shape", "impl", "setting", "plan", "status", "us", "pct_read_bw", "rel_l2_err", "reason")


def mtile_cases() -> list[tuple[str, object]]:
    """(label, DecodeCase) in the order timed (module docstring), so that a run cut short keeps seed 47's row."""
    from bench.decode_d256_wide import d256_cases
    from common.measure.decode_sweep import random_cases

    return [
        ("seed47-4", random_cases(8, 47)[4]),
        ("64rows-paged", dict(d256_cases())["64rows-paged"]),
        ("control-seed43-0", random_cases(8, 43)[0]),
    ]


@contextlib.contextmanager
def applied(impl_name: str, setting: str) -> Iterator[None]:
    """The rung's ``M_TILE_MAJOR`` on for ``on``, off for ``off`` (restored after)."""
    module = importlib.import_module(RUNG_MODULES[impl_name])
    saved = module.M_TILE_MAJOR
    module.M_TILE_MAJOR = setting == "on"
    try:
        yield
    finally:
        module.M_TILE_MAJOR = saved


def plan_of(impl_name: str, problem, device) -> str:
    """Whether the rung takes the balanced split for ``problem`` on ``device`` and how many M tiles it cuts a KV
    head's packed rows into: the knob changes the dispatch order only where both hold (``balanced xN``, N > 1)."""
    module = importlib.import_module(RUNG_MODULES[impl_name])
    split = "balanced" if module.balanced_split(problem, device) else "padded"
    return f"{split} x{module.m_blocks_for(problem)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/decode-mtile-major"), help="output folder")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds of the settings (default 1)")
    parser.add_argument("--rep", type=float, default=30.0, help="timed repetitions per variant, ms (default 30)")
    args = parser.parse_args(argv)
    require_gpu("bench.decode_mtile_major")
    import torch

    from bench.decode_floor import interleaved_settings, summary
    from bench.decode_ragged_ab import open_rungs
    from common.measure.decode_sweep import too_large
    from common.measure.runner import TimingOptions

    device, impls, read_gbps = open_rungs(args.out)
    options = TimingOptions(25.0, args.rep)
    rows: list[dict] = []
    log = CsvLog(args.out / "decode_mtile_major.csv", COLUMNS)
    for label, case in mtile_cases():
        if skip := too_large(case, device):
            print(f"{label}: skipped: {skip}", flush=True)
            continue
        workload, extra = case.gpu_workload(device)
        for impl_name in RUNG_MODULES:
            if impl_name not in impls:
                print(f"{label} {impl_name}: not registered here (its stack is missing)", flush=True)
                continue
            plan = plan_of(impl_name, case.problem, device)
            apply = partial(applied, impl_name)
            results = interleaved_settings(impls[impl_name], case, (workload, extra), list(SETTINGS), args.rounds,
                                           options, apply)  # fmt: skip
            for setting, measured in results.items():
                status, us, rel_l2_err, reason = summary(measured)
                record = {
                    "label": label, "shape": case.describe(), "impl": impl_name, "setting": setting, "plan": plan,
                    "status": status, "us": us, "pct_read_bw": 100 * case.kv_bytes_read / (us * 1e3) / read_gbps,
                    "rel_l2_err": rel_l2_err, "reason": reason,
                }  # fmt: skip
                rows.append(record)
                log.append(record)
                print(f"{label:16s} {impl_name:13s} {setting:3s} {plan:12s} {status:6s} {us:8.1f} us "
                      f"{record['pct_read_bw']:5.1f} % BW {reason}", flush=True)  # fmt: skip
        del workload
        torch.cuda.empty_cache()
        # After every shape, so that a run cut short keeps the table of the shapes done.
        (args.out / "decode_mtile_major.md").write_text(markdown(rows, read_gbps))
    print((args.out / "decode_mtile_major.md").read_text())
    return 0 if rows and all(row["status"] == "ok" for row in rows) else 1


def markdown(rows: list[dict], read_gbps: float) -> str:
    """One line per (shape, rung): its plan (``balanced xN``: N M tiles), µs (% of the read bandwidth) off and on,
    and on over off."""
    lines = [
        f"M_TILE_MAJOR A/B (bench/decode_mtile_major.py): µs per step, % of the read bandwidth ({read_gbps:.0f} GB/s); "
        "the knob changes the dispatch order only on 'balanced xN' with N > 1",
        "",
        "| shape | rung | plan | off | on | on / off |",
        "|---|---|---|---|---|---|",
    ]
    for key in dict.fromkeys((row["label"], row["impl"]) for row in rows):
        by = {row["setting"]: row for row in rows if (row["label"], row["impl"]) == key}
        cells = [
            f"{by[s]['us']:.1f} µs ({by[s]['pct_read_bw']:.0f} %)" if by.get(s, {}).get("status") == "ok"
            else by.get(s, {}).get("status", "—")
            for s in SETTINGS
        ]  # fmt: skip
        ok = all(by.get(s, {}).get("status") == "ok" for s in SETTINGS)
        cells.append(f"{by['on']['us'] / by['off']['us']:.2f}" if ok else "—")
        first = next(iter(by.values()))
        lines.append(f"| {key[0]}: {first['shape']} | {key[1]} | {first['plan']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
