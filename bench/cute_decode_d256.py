"""Issue #38's D=256 packed rows in cute/decode: ``_decode_warps.ROW_SPLIT_MAX_TILE_M`` {256: 32} (``tile32``, the
default since this A/B) against 16-row D=256 tiles, in one process.

Seed 43's B=16 H=80 Hkv=16 Sq=4 Sk=2048 D=256 row (group 5 x Sq 4 = 20 packed rows, 537 MB) ran at 72 % of the read
bandwidth in cute/decode (169.9 µs; triton and gluon 87 %): D=256's 16-row tile cuts the 20 rows into two M tiles,
so two CTAs stream every (batch, KV head)'s K/V (1074 MB from L2), 512 CTAs at one an SM. ``tile32`` takes them in
one 32-row tile of 2 x 2 warps (the row split), 256 CTAs, every byte once. Settings (``applied``):

* ``default``: D=256's 16-row tiles (``ROW_SPLIT_MAX_TILE_M = {}``, the default this A/B measured against);
* ``tile32``: ``ROW_SPLIT_MAX_TILE_M = {256: 32}`` (with the row split, on by default).

Shapes (:func:`d256_cases`, in the order timed): seed 43's row; seed 43's ragged 20-row D=256 row (the balanced
split); 64 packed rows at D=256 (four 16-row tiles or two 32-row ones); 32 rows paged at full length (balanced);
20 rows on one long sequence (the split rule's splits double as the M tiles halve); and a control whose plan the
knob does not change (seed 43's 16-row MQA paged ragged row: the A/B's noise). Every setting is timed on every
shape, checked against fp64 on a poisoned output first (median, L2 flushed), the settings alternating for
``--rounds`` rounds. Writes ``cute_decode_d256.csv`` and ``cute_decode_d256.md`` under ``--out``.

    python -m bench.cute_decode_d256 --out runs/cute-decode-d256       # from the project root, on a GPU
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from bench import require_gpu
from common.measure.results import CsvLog

SETTINGS = ("default", "tile32")
TILE32 = {256: 32}
COLUMNS = ("label", "shape", "setting", "plan", "status", "us", "pct_read_bw", "rel_l2_err", "reason")


def d256_cases() -> list[tuple[str, object]]:
    """(label, DecodeCase) in the order timed (module docstring), seed 43's row first."""
    from common.measure.decode_sweep import DecodeCase, decode_problem, random_cases

    def full(batch: int, seqlen_k: int, kv_heads: int, group: int, seqlen_q: int, page_size: int = 0) -> DecodeCase:
        problem = decode_problem(batch, seqlen_k, kv_heads, heads=kv_heads * group, head_dim=256, seqlen_q=seqlen_q,
                                 page_size=page_size)  # fmt: skip
        return DecodeCase(problem, (seqlen_k,) * batch if page_size else None)

    seed43 = random_cases(8, 43)
    return [
        ("seed43-6", seed43[6]),
        ("seed43-4-ragged", seed43[4]),
        ("64rows-4k", full(16, 4096, 8, 16, 4)),
        ("32rows-paged-8k", full(8, 8192, 8, 8, 4, page_size=64)),
        ("20rows-long-128k", full(1, 131072, 4, 5, 4)),
        ("control-seed43-1", seed43[1]),
    ]


@contextlib.contextmanager
def applied(setting: str) -> Iterator[None]:
    """cute/decode's switches for ``setting`` (module docstring), restored after."""
    from cute_impl import _decode_warps

    saved = _decode_warps.ROW_SPLIT_MAX_TILE_M
    _decode_warps.ROW_SPLIT_MAX_TILE_M = dict(TILE32) if setting == "tile32" else {}
    try:
        yield
    finally:
        _decode_warps.ROW_SPLIT_MAX_TILE_M = saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/cute-decode-d256"), help="output folder")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of the settings (default 2)")
    parser.add_argument("--rep", type=float, default=30.0, help="timed repetitions per variant, ms (default 30)")
    parser.add_argument("--labels", default="", help="comma-separated labels to time (default all, in order)")
    args = parser.parse_args(argv)
    require_gpu("bench.cute_decode_d256")
    import torch

    from bench.cute_decode_rows import plan_of
    from bench.decode_floor import alternating_rounds, summary
    from common.contract.registry import discover
    from common.measure.decode_sweep import too_large
    from common.measure.peaks import measure_read_gbps
    from common.measure.runner import TimingOptions, freeze_imports

    device = torch.device("cuda")
    (impl,) = [impl for impl in discover(include_baselines=False)[0] if impl.name == "cute/decode"]
    wanted = set(filter(None, args.labels.split(",")))
    cases = [(label, case) for label, case in d256_cases() if not wanted or label in wanted]
    args.out.mkdir(parents=True, exist_ok=True)
    read_gbps = measure_read_gbps(device)
    print(f"read {read_gbps:.0f} GB/s", flush=True)
    options = TimingOptions(25.0, args.rep)
    freeze_imports()
    rows: list[dict] = []
    log = CsvLog(args.out / "cute_decode_d256.csv", COLUMNS)
    for label, case in cases:
        if skip := too_large(case, device):
            print(f"{label}: skipped: {skip}", flush=True)
            continue
        workload = case.gpu_workload(device)
        results = alternating_rounds(impl, case, workload, list(SETTINGS), args.rounds, options, applied)
        for setting, measured in results.items():
            with applied(setting):
                plan = plan_of(case.problem, device)
            status, us, rel_l2_err, reason = summary(measured)
            record = {
                "label": label, "shape": case.describe(), "setting": setting, "plan": plan, "status": status,
                "us": us, "pct_read_bw": 100 * case.kv_bytes_read / (us * 1e3) / read_gbps, "rel_l2_err": rel_l2_err,
                "reason": reason,
            }  # fmt: skip
            rows.append(record)
            log.append(record)
            print(f"{label:18s} {setting:8s} {plan:28s} {status:6s} {us:8.1f} us {record['pct_read_bw']:5.1f} % BW "
                  f"{reason}", flush=True)  # fmt: skip
        torch.cuda.empty_cache()
        # After every shape, so that a run cut short keeps the table of the shapes done.
        (args.out / "cute_decode_d256.md").write_text(markdown(rows, read_gbps))
    print((args.out / "cute_decode_d256.md").read_text())
    return 0 if rows and all(row["status"] == "ok" for row in rows) else 1


def markdown(rows: list[dict], read_gbps: float) -> str:
    """One line per shape: µs (% of the read bandwidth; plan) per setting, and tile32 over the default."""
    lines = [
        f"cute/decode ROW_SPLIT_MAX_TILE_M {{256: 32}} A/B (bench/cute_decode_d256.py): µs per step, % of the read "
        f"bandwidth ({read_gbps:.0f} GB/s); plan: rows a tile x M tiles, warps along M x keys, stages, splits",
        "",
        "| shape | default | tile32 | tile32 / default |",
        "|---|---|---|---|",
    ]
    for label in dict.fromkeys(row["label"] for row in rows):
        by = {row["setting"]: row for row in rows if row["label"] == label}
        ok = {setting: row for setting, row in by.items() if row["status"] == "ok"}
        cells = [
            f"{ok[s]['us']:.1f} µs ({ok[s]['pct_read_bw']:.0f} %; {ok[s]['plan']})" if s in ok else by[s]["status"]
            for s in SETTINGS
            if s in by
        ]
        ratio = f"{ok['tile32']['us'] / ok['default']['us']:.2f}" if len(ok) == len(SETTINGS) else "—"
        shape = next(iter(by.values()))["shape"]
        lines.append(f"| {label}: {shape} | " + " | ".join([*cells, ratio]) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
