"""Issue #38: cute/decode's balanced split (``BALANCED_SPLIT``) against its padded split, on the ragged rows.

On seed 31's B=16 MQA Sq=8 D=256 paged(32) ragged row (lengths 23..138969) cute/decode launches 128 padded
splits, 2048 CTAs of which 1143 have no key (190 µs, 55 % of the read bandwidth). The balanced split
(``cute_impl/_decode_plan.py``, triton/decode's plan) gives every CTA an equal share of the valid keys
instead. In one process, shape by shape, this times cute/decode with ``BALANCED_SPLIT = "never"`` (as
committed) and ``"always"``, and triton/decode as committed (its balanced split for calls with lengths),
beside a ``torch.sum`` over exactly the step's bytes (``read``), on:

* seed 31's ragged row above, and seed 37's two ragged rows (B=32 H=10 Hkv=2 Sq=1 D=64 paged(32)
  21..288703; B=16 H=256 Hkv=32 Sq=2 D=128 16..14082);
* two full caches given as lengths (all sequences full), where the balanced split may only lose:
  B=8 Hkv=8 8k and B=1 Hkv=8 128k.

Every setting is checked against fp64 on a poisoned output first, then timed four ways
(``bench.decode_fewpairs``'s ``timings``: do_bench eager and graph, and both with a clean L2). Writes
``balanced.csv`` (each row as it is timed) and ``balanced.md`` under ``--out``.

    python -m bench.cute_balanced_ab --out runs/cute-balanced     # from the project root, on a GPU
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from bench import require_gpu
from bench.decode_fewpairs import emitter, markdown, measure_setting, read_row, row, switched

# (seed, index into random_cases(8, seed)) or a full cache (batch, seqlen_k, kv_heads) given as lengths.
CASES = ((31, 0), (37, 3), (37, 6), (8, 8192, 8), (1, 131072, 8))
# (rung, setting name, module switches): cute/decode both ways, triton/decode as committed.
SETTINGS = (
    ("cute/decode", "never", {"BALANCED_SPLIT": "never"}),
    ("cute/decode", "always", {"BALANCED_SPLIT": "always"}),
    ("triton/decode", "committed", {}),
)
MODULES = {"cute/decode": "cute_impl.decode", "triton/decode": "triton_impl.decode"}


def cases(entries: tuple = CASES) -> list:
    """``entries`` (:data:`CASES`) as DecodeCases (the full caches with every length given, so "ragged" would
    apply); an entry that is a DecodeCase already (a caller's variant of a drawn row) is taken as it is."""
    from common.measure.decode_sweep import DecodeCase, decode_problem, random_cases

    pairs = [entry for entry in entries if not isinstance(entry, DecodeCase) and len(entry) == 2]
    drawn = {seed: random_cases(8, seed) for seed in {entry[0] for entry in pairs}}
    result = []
    for entry in entries:
        if isinstance(entry, DecodeCase):
            result.append(entry)
        elif len(entry) == 2:
            result.append(drawn[entry[0]][entry[1]])
        else:
            batch, seqlen_k, kv_heads = entry
            result.append(DecodeCase(decode_problem(batch, seqlen_k, kv_heads, ragged=True), (seqlen_k,) * batch))
    return result


def arguments(argv: list[str] | None, doc: str = __doc__, out: str = "runs/cute-balanced") -> argparse.Namespace:
    """The command line of this tool (or of the one whose docstring is ``doc``, writing under ``out``)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(out), help="output folder")
    parser.add_argument("--rep", type=float, default=20.0, help="do_bench's timed ms per eager/graph measurement")
    parser.add_argument("--reps", type=int, default=20, help="timed calls per clean-L2 measurement")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    require_gpu("bench.cute_balanced_ab")
    return run(args)


def run(
    args: argparse.Namespace,
    settings: tuple = SETTINGS,
    modules: dict = MODULES,
    entries: tuple = CASES,
    title: str = "Few-pair decode A/B (bench/decode_fewpairs.py)",
) -> int:
    """Every row of the module docstring (or ``settings`` of the rungs in ``modules`` on ``entries``), the
    markdown under ``title`` written and printed last; 0 when each setting passed its check and every rung was
    available."""
    import torch

    from common.contract.registry import discover
    from common.measure.peaks import measure_read_gbps
    from common.measure.runner import freeze_imports

    args.out.mkdir(parents=True, exist_ok=True)
    device, rows = torch.device("cuda"), []
    impls = {i.name: i for i in discover(include_baselines=False)[0] if i.name in modules}
    read_gbps = measure_read_gbps(device)
    print(f"read bandwidth (4 GiB sum, do_bench): {read_gbps:.0f} GB/s", flush=True)
    freeze_imports()
    emit = emitter(args.out / "balanced.csv", rows)
    for case in cases(entries):
        print(f"-- {case.describe()}", flush=True)
        emit(read_row(case, read_gbps, args, device))
        workload, extra = case.gpu_workload(device)
        for name, setting, switches in settings:
            if name not in impls:
                emit(row(name, case, setting, 0, "missing", {}, read_gbps, 0.0, "not available here"))
                continue
            with switched(importlib.import_module(modules[name]), switches):
                status, splits, us, err, why = measure_setting(impls[name], case, workload, extra, args, None)
            emit(row(name, case, setting, splits, status, us, read_gbps, err, why))
        del workload, extra
        torch.cuda.empty_cache()
    table = markdown(rows, read_gbps, title)
    (args.out / "balanced.md").write_text(table)
    print(table)
    return 0 if rows and all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
