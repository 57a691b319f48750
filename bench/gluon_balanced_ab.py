"""gluon/decode's balanced split A/B (``BALANCED_SPLIT``, issue #38): "never" (committed) against "always".

On seed 31's B=16 MQA Sq=8 D=256 paged(32) ragged row (23..138969 keys, 453 MB: the split rule gives
gluon/decode 2048 CTAs, 1143 of them without a key) and its B=32 H=512 Hkv=32 Sq=8 D=64 paged(64) ragged
row (22..4186), and on two full caches passed with cache_seqlens (B=8 Hkv=8 8k, B=1 Hkv=8 128k: what
"ragged" would cost where the rule's splits are already even), in one process, it times gluon/decode with
the switch "never" and "always" (shares per SM at most the CTA slots its ring leaves: ``BALANCED_SHARES_BY_SLOTS``),
"always-2/SM" (triton/decode's two shares an SM), and triton/decode as committed (its balanced split on every
call with cache_seqlens), each first checked against fp64 on a poisoned output; ``bench/decode_fewpairs.py``'s
machinery (four timing modes, % of the read bandwidth measured in the same process). Writes
``balanced.csv`` and ``balanced.md`` under ``--out``.

    python -m bench.gluon_balanced_ab --out runs/gluon-balanced     # from the project root, on a GPU
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench import require_gpu
from bench.decode_fewpairs import SEED, emitter, markdown, measure_setting, row, switched

# (rung, setting name, module switches) in the order timed, per shape.
SETTINGS = (
    ("gluon/decode", "never", {"BALANCED_SPLIT": "never"}),
    ("gluon/decode", "always", {"BALANCED_SPLIT": "always"}),
    ("gluon/decode", "always-2/SM", {"BALANCED_SPLIT": "always", "BALANCED_SHARES_BY_SLOTS": False}),
    ("triton/decode", "committed", {}),
)
MODULES = {"gluon/decode": "triton_impl.gluon.decode", "triton/decode": "triton_impl.decode"}
# Seed 31's ragged rows (indices into random_cases(8, seed=31)) and the full caches (batch, Sk, Hkv).
RAGGED_ROWS = (0, 6)
FULL_CACHES = ((8, 8192, 8), (1, 131072, 8))


def cases() -> list:
    """The ragged rows as drawn, then the full caches with cache_seqlens all at Sk."""
    from common.measure.decode_sweep import DecodeCase, decode_problem, random_cases

    drawn = random_cases(8, SEED)
    full = [DecodeCase(decode_problem(b, sk, hkv, ragged=True), (sk,) * b) for b, sk, hkv in FULL_CACHES]
    return [drawn[index] for index in RAGGED_ROWS] + full


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/gluon-balanced"), help="output folder")
    parser.add_argument("--rep", type=float, default=20.0, help="do_bench's timed ms per eager/graph measurement")
    parser.add_argument("--reps", type=int, default=20, help="timed calls per clean-L2 measurement")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    require_gpu("bench.gluon_balanced_ab")
    return run(args)


def run(args: argparse.Namespace) -> int:
    """Every row of the module docstring; 0 when each setting passed its check."""
    import importlib

    import torch

    from common.contract.registry import discover, per_call_inputs
    from common.measure.peaks import measure_read_gbps
    from common.measure.runner import freeze_imports, make_workload

    device = torch.device("cuda")
    impls = {i.name: i for i in discover(include_baselines=False)[0] if i.name in MODULES}
    read_gbps = measure_read_gbps(device)
    print(f"read bandwidth (4 GiB sum, do_bench): {read_gbps:.0f} GB/s", flush=True)
    freeze_imports()
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    with (args.out / "balanced.csv").open("w", newline="") as handle:
        emit = emitter(handle, rows)
        for case in cases():
            print(f"-- {case.describe()}", flush=True)
            workload = make_workload(case.problem, "cuda", case.cache_seqlens(device), on_device=True)
            extra = per_call_inputs(case.problem, workload.cache_seqlens, workload.block_table)
            for name, setting, switches in SETTINGS:
                module = importlib.import_module(MODULES[name])
                with switched(module, switches):
                    status, splits, us, err, reason = measure_setting(impls[name], case, workload, extra, args, None)
                emit(row(name, case, setting, splits, status, us, read_gbps, err, reason))
            del workload, extra
            torch.cuda.empty_cache()
    title = "gluon/decode balanced split A/B (bench/gluon_balanced_ab.py)"
    table = markdown(rows, read_gbps).replace("Few-pair decode A/B (bench/decode_fewpairs.py)", title, 1)
    (args.out / "balanced.md").write_text(table)
    print((args.out / "balanced.md").read_text())
    return 0 if rows and all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
