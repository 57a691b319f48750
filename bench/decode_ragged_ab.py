"""Issue #38: the balanced split's item-share cap (``BALANCED_MAX_ITEM_SHARES``) on seed 43's ragged rows.

``compare.py --decode --decode-random 8 --decode-seed 43`` (``results/h200/decode-random-seed43/``) left four
ragged rows at 31-69 % of the read bandwidth in the three decode rungs, all four already on the balanced split
(``splits.balanced_split_applies``: the rule splits each). Modelled per CTA (``bench/decode_model.py``'s
fluid model with each rung's plan as committed), two of them end in one CTA merging one item's partials: the
B=8 MQA D=256 paged row gives its 108724-key sequence 155 shares in triton/decode (a merge of 156 dependent
L2 round trips at 2 splits a step), the B=3 D=256 row its 54269-key one 61-63 (gluon, triton). The cap cuts
that chain; ``4/SM`` (``BALANCED_SHARES_PER_SM = 4``, no cap) halves every share instead, for the B=64 D=64 row
whose 2 MB shares of its long sequences start late in the grid.

In one process, row by row (each as drawn: the exact lengths), each rung as committed (``default``) and with
each setting of :func:`settings`, checked against fp64 on a poisoned output, then timed eagerly as
``compare.py`` times (``do_bench``: L2 zeroed before each run), beside a ``torch.sum`` of exactly the step's
bytes (``read``). A setting whose plan (target shares, each item's share count) is the default's is not timed
(``same plan``). The rows: the four ragged ones, then seed 43's two full caches of the same sizes given
with every length at Sk (the balanced split and the cap apply; where the cap binds, a possible loss).
Writes ``ragged.csv`` (each row as it is timed) and ``ragged.md`` under ``--out``.

    python -m bench.decode_ragged_ab --out runs/decode-ragged     # from the project root, on a GPU
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

from bench import require_gpu
from common.measure.results import CsvLog

SEED = 43
# Indices into random_cases(8, 43): the ragged rows (the B=8 MQA D=256 paged row first: the largest
# predicted change), then two full caches given as lengths (B=3 Hkv=2 180k: the cap binds; B=16 Hkv=4 12k).
RAGGED, FULL = (1, 4, 2, 7), (3, 5)
# The item-share caps timed in the Triton-side rungs (a runtime argument: one compile); cute/decode's cap is
# in its compile key, so it times one value (each costs a compile of the shape).
CAPS = (32, 48)
CUTE_CAP = 48
RUNG_MODULES = {
    "triton/decode": "triton_impl.decode",
    "gluon/decode": "triton_impl.gluon.decode",
    "cute/decode": "cute_impl.decode",
}
# Where each rung's switches live: gluon's cap in its balanced module, its shares per SM triton/decode's.
CAP_MODULE = {**RUNG_MODULES, "gluon/decode": "triton_impl.gluon._decode_balanced"}
PER_SM_MODULE = {**RUNG_MODULES, "gluon/decode": "triton_impl.decode"}
COLUMNS = ("impl", "shape", "mb", "setting", "plan", "status", "us", "pct", "rel_l2_err", "reason")


def cases() -> list:
    """The rows in the order timed: seed 43's ragged rows as drawn, then its full caches given as lengths."""
    from common.measure.decode_sweep import DecodeCase, random_cases

    drawn = random_cases(8, SEED)
    full = [
        DecodeCase(
            drawn[i].problem.with_(has_cache_seqlens=True), (drawn[i].problem.seqlen_k,) * drawn[i].problem.batch
        )
        for i in FULL
    ]
    return [drawn[i] for i in RAGGED] + full


def settings() -> list[tuple[str, str, dict[str, dict[str, int]]]]:
    """(rung, setting, {module: {switch: value}}) in the order timed, each rung's default first."""
    result = []
    for rung in RUNG_MODULES:
        caps = (CUTE_CAP,) if rung == "cute/decode" else CAPS
        result.append((rung, "default", {}))
        result += [(rung, f"cap{cap}", {CAP_MODULE[rung]: {"BALANCED_MAX_ITEM_SHARES": cap}}) for cap in caps]
        result.append((rung, "4/SM", {PER_SM_MODULE[rung]: {"BALANCED_SHARES_PER_SM": 4}}))
    return result


@contextlib.contextmanager
def switched(switches: dict[str, dict[str, int]]) -> Iterator[None]:
    """Each module's constants set to its switches inside, restored after."""
    with contextlib.ExitStack() as stack:
        for module, values in switches.items():
            stack.enter_context(mock.patch.multiple(importlib.import_module(module), **values))
        yield


def plan_of(rung: str, problem, lengths: tuple[int, ...] | None, device) -> tuple:
    """What the rung launches under its current constants: ("padded", splits), ("balanced", target shares,
    each sequence's item shares by ``splits.balanced_item_shares``; a full cache, ``lengths`` None, is B full
    sequences) or, cute/decode's and gluon/decode's ``PACKED_PREFILL_MIN_ROWS``, ("packed-prefill", tiles), with
    cute's key splits (``PACKED_PREFILL_SPLITS``) ("packed-prefill", tiles, splits), to tell settings of the same
    plan."""
    from common.contract import splits

    lengths = lengths or (problem.seqlen_k,) * problem.batch

    module = importlib.import_module(RUNG_MODULES[rung])
    packed_splits = None
    if rung == "cute/decode":
        packed_splits = module.packed_prefill_splits(problem, device)
    elif rung == "gluon/decode" and module.packed_prefill(problem, device):
        packed_splits = 1
    if packed_splits is not None:
        tiles = module.packed_prefill_tiles(problem)
        return ("packed-prefill", tiles) if packed_splits == 1 else ("packed-prefill", tiles, packed_splits)
    if not module.balanced_split(problem, device):
        return ("padded", module.planned_num_splits(problem, device))
    if rung == "cute/decode":
        target, _, _, config = module.launch_plan(problem, device)
        block_n, min_keys, cap = config.shape.tile_n, module.BALANCED_MIN_KEYS, config.balanced_max_shares
    elif rung == "gluon/decode":
        from triton_impl.gluon import _decode_balanced

        # The plan's own ring and target shares (two consumers a CTA where ``consumers_for`` says so).
        _, config, target = module.seqlen_k_decisions(problem, device)
        block_n = config.block_n
        min_keys, cap = (
            importlib.import_module("triton_impl.decode").BALANCED_MIN_KEYS,
            _decode_balanced.item_share_cap(),
        )
    else:
        block_n, target = module.tile_config(problem).block_n, module.balanced_target_shares(problem, device)
        min_keys, cap = module.BALANCED_MIN_KEYS, module.BALANCED_MAX_ITEM_SHARES
    blocks = [-(-length // block_n) for length in lengths]
    min_blocks = splits.balanced_min_share_blocks(block_n, min_keys)
    return ("balanced", target, tuple(splits.balanced_item_shares(blocks, problem.kv_heads, target, min_blocks, cap)))


def describe_plan(plan: tuple) -> str:
    if plan[0] == "packed-prefill":
        splits = f", {plan[2]} key splits and the merge" if len(plan) > 2 else ""
        return f"the stack's prefill kernel (cute/hopper, gluon/hopper), {plan[1]} packed tiles{splits}"
    if plan[0] == "padded":
        return f"{plan[1]} padded splits"
    return f"{plan[1]} target, most shares an item {max(plan[2])}"


def measure(impl, case, workload, extra: dict, rep_ms: float) -> tuple[str, float, float, str]:
    """(status, µs, rel. L2 error, reason) of ``impl`` prepared (compiled, warmed up) and bound under the current
    constants: the fp64 check on a poisoned output, then eager ``do_bench``."""
    from common.measure.runner import judge_on_workload
    from common.measure.timing import time_cuda

    inputs = (workload.q, workload.k, workload.v)
    try:
        impl.prepare(*inputs, case.problem, **extra)
        run = impl.bind(*inputs, case.problem, **extra)
        ok, reason, err = judge_on_workload(impl, run, workload)
        us = time_cuda(run, warmup_ms=10, rep_ms=rep_ms).ms * 1e3
    except Exception as error:  # noqa: BLE001 - a setting that fails is a row, the run goes on
        return "failed", float("nan"), float("nan"), f"{type(error).__name__}: {error}".splitlines()[0]
    return ("ok" if ok else "wrong"), us, err.rel_l2_err, reason


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/decode-ragged"), help="output folder")
    parser.add_argument("--rep", type=float, default=20.0, help="do_bench's timed ms per measurement")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    require_gpu("bench.decode_ragged_ab")
    return run(args)


def open_rungs(out: Path) -> tuple[object, dict, float]:
    """The decode A/Bs' start on the GPU: (device, the rungs of RUNG_MODULES that load, by name, the read bandwidth
    measured in this process), imports frozen, ``out`` made."""
    import torch

    from common.contract.registry import discover
    from common.measure.peaks import measure_read_gbps
    from common.measure.runner import freeze_imports

    device = torch.device("cuda")
    impls = {i.name: i for i in discover(include_baselines=False)[0] if i.name in RUNG_MODULES}
    read_gbps = measure_read_gbps(device)
    print(f"read bandwidth (4 GiB sum, do_bench): {read_gbps:.0f} GB/s", flush=True)
    freeze_imports()
    out.mkdir(parents=True, exist_ok=True)
    return device, impls, read_gbps


def run(args: argparse.Namespace) -> int:
    """Every row of the module docstring; the markdown table written and printed last; 0 when every timed
    setting passed its check and every rung was available."""
    import torch

    from common.measure.timing import time_cuda

    device, impls, read_gbps = open_rungs(args.out)
    log, rows = CsvLog(args.out / "ragged.csv", COLUMNS), []

    def emit(impl: str, case, setting: str, plan: str, status: str, us: float, err: float, why: str) -> None:
        pct = 100 * case.kv_bytes_read / (us * 1e3) / read_gbps
        record = {"impl": impl, "shape": case.describe(), "mb": round(case.kv_bytes_read / 1e6), "setting": setting,
            "plan": plan, "status": status, "us": us, "pct": pct, "rel_l2_err": err, "reason": why}  # fmt: skip
        rows.append(record)
        log.append(record)
        print(
            f"{impl:14s} {record['mb']:5d} MB {setting:9s} {status:6s} {us:8.1f} us {pct:5.1f} % {plan} {why}",
            flush=True,
        )

    for case in cases():
        print(f"-- {case.describe()}", flush=True)
        flat = torch.ones(case.kv_bytes_read // 2, dtype=torch.bfloat16, device=device)
        emit("read", case, "sum", "", "ok", time_cuda(flat.sum, warmup_ms=10, rep_ms=args.rep).ms * 1e3, 0.0, "")
        del flat
        workload, extra = case.gpu_workload(device)
        defaults: dict[str, tuple] = {}
        for rung, setting, switches in settings():
            if rung not in impls:
                emit(rung, case, setting, "", "missing", float("nan"), float("nan"), "not available here")
                continue
            with switched(switches):
                plan = plan_of(rung, case.problem, case.lengths, device)
                if setting != "default" and plan == defaults.get(rung):
                    emit(rung, case, setting, describe_plan(plan), "skip", float("nan"), float("nan"), "same plan")
                    continue
                defaults.setdefault(rung, plan)
                emit(rung, case, setting, describe_plan(plan), *measure(impls[rung], case, workload, extra, args.rep))
        del workload, extra
        torch.cuda.empty_cache()
    table = markdown(rows, read_gbps)
    (args.out / "ragged.md").write_text(table)
    print(table)
    timed = [r for r in rows if r["status"] != "skip"]
    return 0 if timed and all(r["status"] == "ok" for r in timed) and len(impls) == len(RUNG_MODULES) else 1


def markdown(rows: list[dict], read_gbps: float) -> str:
    """One line per shape: µs (% of the read bandwidth) per rung and setting; "=" where the plan is the default's."""
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    columns = [("read", "sum"), *((rung, setting) for rung, setting, _ in settings())]
    cell = {(r["shape"], r["impl"], r["setting"]): r for r in rows}
    title = f"Item-share cap A/B (bench/decode_ragged_ab.py): µs (% of {read_gbps:.0f} GB/s), eager as compare.py"
    header = ["shape", "MB", *(f"{rung.split('/')[0]} {setting}" for rung, setting in columns)]
    lines = [title, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for shape in shapes:
        cells = []
        for rung, setting in columns:
            r = cell.get((shape, rung, setting))
            if r is None:
                cells.append("")
            elif r["status"] == "skip":
                cells.append("=")
            elif r["status"] != "ok":
                cells.append(r["status"])
            else:
                cells.append(f"{r['us']:.1f} ({r['pct']:.0f} %)")
        mb = next(r["mb"] for r in rows if r["shape"] == shape)
        lines.append(f"| {shape} | {mb} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
