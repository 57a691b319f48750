"""Issue #38's few-pair decode rows: where a 164 MB step's ~20 µs beyond the read bandwidth go.

Seed 31's sweep (``results/h200/decode-random-seed31/``) left three rows under 85 % of the read bandwidth
in all three decode rungs: B=3 Hkv=8 Sq=8 13k (164 MB), B=8 Hkv=8 group 4 Sq=4 8.7k (285 MB), B=16 MQA
Sq=8 D=256 paged(32) ragged 23..138969 (453 MB). The default sweep's small-cache rows show the same
excess for every implementation, FlashInfer included (B=1 Hkv=8 32k, 134 MB: 51-66 µs against 30 µs of
bytes), so this run separates what any read of that size costs in this harness from what the kernels add.

For each decode rung (``--impls``) in one process, shape by shape, on those three shapes and two that read
at about 90 % (B=1 Hkv=8 128k, B=64 Hkv=8 32k), it times:

* ``read``: ``torch.sum`` over a flat bf16 buffer of exactly the step's K/V bytes, the same reduction
  ``compare.py`` calibrates the read bandwidth with over 4 GiB: the size-matched floor of this harness;
* each setting of the rung: ``default`` (as committed); ``fewer-waves`` (``FEWER_WAVES = True``:
  ``splits.SplitPolicy.fewer_waves``); for cute/decode ``slots-2`` (``SPLIT_CTAS_PER_SM = 2``, the fifth
  stop's switch its A/B never reached); on seed 31's rows ``quarter``, ``half`` and ``double`` the default's
  split count, forced (the ragged row fewer only: triton/decode's balanced shares; gluon's and cute's
  padded splits, 2048 CTAs there, 1143 of them without a key). A setting is timed only where it changes the
  plan (split count); otherwise its launch is an earlier setting's, bit for bit, and the row says ``same plan``.
  Every timed setting is first checked against fp64 on a poisoned output.

Each in four ways: ``eager`` and ``graph`` (``common.measure.timing.time_cuda``: ``do_bench``, which zeroes
a 256 MB buffer before every run, leaving L2 full of dirty lines that the timed kernel's reads must write
back), and ``eager-clean`` / ``graph-clean`` (the same zeroing, then a read-only sum over another 256 MB
so that L2 holds clean lines, then the timed call between two events; median of ``--reps``). Percentages
are of the read bandwidth measured in the same process (``measure_read_gbps``). Writes ``fewpairs.csv``
and ``fewpairs.md`` under ``--out``.

    python -m bench.decode_fewpairs --out runs/fewpairs     # from the project root, on a GPU
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from unittest import mock

from bench import require_gpu
from common.measure.results import CsvLog

# The rows in the order timed (a run cut short keeps the first): an index into random_cases(8, seed=31)
# (3: B=3 Hkv=8 13k; 7: B=8 Hkv=8 group 4 8.7k; 0: B=16 MQA D=256 paged ragged) or one of the default
# sweep's good rows (batch, seqlen_k, kv_heads), where no setting may lose.
SEED = 31
CASES = (3, 7, (1, 131072, 8), 0, (64, 32768, 8))
RUNG_MODULES = {
    "triton/decode": "triton_impl.decode",
    "gluon/decode": "triton_impl.gluon.decode",
    "cute/decode": "cute_impl.decode",
}
# setting -> module switches; a rung lacking a switch does not take the setting.
SETTINGS = {
    "default": {},
    "fewer-waves": {"FEWER_WAVES": True},
    "slots-2": {"SPLIT_CTAS_PER_SM": 2},
}
# slots-2 is the committed value in triton/decode and gluon/decode; only cute/decode's A/B is open.
SETTING_RUNGS = {"slots-2": ("cute/decode",)}
# Every setting under the balanced split as it was when this A/B ran (seventh stop of 2026-11-29): triton's
# for every call with cache_seqlens, gluon's and cute's off (their "ragged-split" came after, from
# bench/gluon_balanced_ab.py and bench/cute_balanced_ab.py), so that a rerun times what the results say.
BALANCED_AS_TIMED = {"triton/decode": "ragged", "gluon/decode": "never", "cute/decode": "never"}
# Forced split counts around the default's on seed 31's rows (the rule's local optimum; on the ragged row,
# where 1143 of the 2048 CTAs of gluon and cute have no key, fewer only; triton/decode: balanced shares).
FORCED_SPLITS = {
    "quarter": lambda splits: max(1, splits // 4),
    "half": lambda splits: max(1, splits // 2),
    "double": lambda splits: 2 * splits,
}
RAGGED_FORCED = ("quarter", "half")
FLUSH_BYTES = 256 * 2**20
MODES = ("eager", "graph", "eager-clean", "graph-clean")
COLUMNS = ("impl", "shape", "mb", "setting", "num_splits", "status", *(f"{m}_us" for m in MODES),
    *(f"{m}_pct" for m in MODES), "rel_l2_err", "reason",
)  # fmt: skip


def switched(module, switches: dict[str, object]) -> contextlib.AbstractContextManager:
    """``module``'s constants set to ``switches`` inside (none: as committed), restored after."""
    return mock.patch.multiple(module, **switches) if switches else contextlib.nullcontext()


def settings_for(impl_name: str, module) -> list[str]:
    """The settings ``impl_name`` takes: each whose switches its module has, within SETTING_RUNGS."""
    return [
        name
        for name, switches in SETTINGS.items()
        if all(hasattr(module, switch) for switch in switches) and impl_name in SETTING_RUNGS.get(name, (impl_name,))
    ]


def setting_switches(impl_name: str, setting: str) -> dict[str, object]:
    """The module switches of ``setting`` (a forced count: the default's) on the balanced split as timed."""
    return {"BALANCED_SPLIT": BALANCED_AS_TIMED[impl_name], **SETTINGS.get(setting, {})}


def split_count(module, problem, device) -> int:
    """The split count ``module``'s rung launches ``problem`` with under its current constants (triton/decode's
    balanced split: its shares per M tile, which a forced ``num_splits`` replaces)."""
    from common.contract.splits import balanced_split_applies

    switch = getattr(module, "BALANCED_SPLIT", "never")
    if balanced_split_applies(switch, problem, lambda: module.planned_num_splits(problem, device)):
        return module.balanced_target_shares(problem, device)
    return module.planned_num_splits(problem, device)


def planned_settings(impl_name: str, module, problem, index: int, device) -> list[tuple[str, int, int | None, str]]:
    """(setting, split count, the count forced or None, the earlier setting of the same plan or "") per
    setting ``impl_name`` takes on the ``index``-th case: its switches' settings, then (the first
    seed 31's rows) the counts of FORCED_SPLITS around the default's."""
    planned: list[tuple[str, int, int | None]] = []
    for setting in settings_for(impl_name, module):
        with switched(module, setting_switches(impl_name, setting)):
            planned.append((setting, split_count(module, problem, device), None))
    if isinstance(CASES[index], int):
        default = planned[0][1]
        names = RAGGED_FORCED if problem.has_cache_seqlens else FORCED_SPLITS
        planned += [(name, FORCED_SPLITS[name](default), FORCED_SPLITS[name](default)) for name in names]
    first: dict[int, str] = {}
    result = []
    for setting, splits, forced in planned:
        result.append((setting, splits, forced, first.get(splits, "")))
        first.setdefault(splits, setting)
    return result


def time_clean(fn: Callable[[], object], reps: int, graph: bool) -> float:
    """Median µs of ``fn`` (replayed from a CUDA graph with ``graph``) between two events, after do_bench's
    zeroing of FLUSH_BYTES and then a read-only sum over another FLUSH_BYTES (L2 left clean)."""
    import torch

    from common.measure.timing import capture

    target = capture(fn)[0].replay if graph else fn
    dirty = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    clean = torch.ones(FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    target()
    for start, end in events:
        dirty.zero_()
        clean.sum()
        start.record()
        target()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events) * 1e3


def timings(fn: Callable[[], object], rep_ms: float, reps: int) -> dict[str, float]:
    """µs of ``fn`` in each of :data:`MODES`."""
    from common.measure.timing import time_cuda

    return {
        "eager": time_cuda(fn, warmup_ms=10, rep_ms=rep_ms).ms * 1e3,
        "graph": time_cuda(fn, warmup_ms=10, rep_ms=rep_ms, cuda_graph=True).ms * 1e3,
        "eager-clean": time_clean(fn, reps, graph=False),
        "graph-clean": time_clean(fn, reps, graph=True),
    }


def cases() -> list:
    """:data:`CASES`: seed 31's low rows and the default sweep's good ones."""
    from common.measure.decode_sweep import DecodeCase, decode_problem, random_cases

    drawn = random_cases(8, SEED)
    return [drawn[entry] if isinstance(entry, int) else DecodeCase(decode_problem(*entry)) for entry in CASES]


def row(impl: str, case, setting: str, splits: int, status: str, us: dict, read_gbps: float, err: float, why: str):
    """One CSV record: µs and % of the read bandwidth per mode."""
    record = {"impl": impl, "shape": case.describe(), "mb": round(case.kv_bytes_read / 1e6, 1), "setting": setting,
        "num_splits": splits, "status": status, "rel_l2_err": err, "reason": why,
    }  # fmt: skip
    for mode in MODES:
        value = us.get(mode, float("nan"))
        record[f"{mode}_us"] = value
        record[f"{mode}_pct"] = 100 * case.kv_bytes_read / (value * 1e3) / read_gbps
    return record


def read_row(case, read_gbps: float, args: argparse.Namespace, device) -> dict:
    """The size-matched read: a ``torch.sum`` over exactly the step's K and V bytes, timed as the settings are."""
    import torch

    flat = torch.ones(case.kv_bytes_read // 2, dtype=torch.bfloat16, device=device)
    return row("read", case, "sum", 0, "ok", timings(flat.sum, args.rep, args.reps), read_gbps, 0.0, "")


def measure_setting(
    impl, case, workload, extra: dict, args, num_splits: int | None
) -> tuple[str, int, dict, float, str]:
    """(status, num_splits, µs per mode, rel. L2 error, reason) of ``impl`` prepared (compiled, warmed up) and
    bound under the current constants, at ``num_splits`` (None: the rule)."""
    from common.measure.runner import judge_on_workload

    inputs = (workload.q, workload.k, workload.v)
    try:
        impl.prepare(*inputs, case.problem, **extra)
        run = impl.bind(*inputs, case.problem, **extra, num_splits=num_splits)
        ok, reason, err = judge_on_workload(impl, run, workload)
        us = timings(run, args.rep, args.reps)
    except Exception as error:  # noqa: BLE001 - a setting that fails is a row, the run goes on
        return "failed", 0, {}, float("nan"), f"{type(error).__name__}: {error}".splitlines()[0]
    return ("ok" if ok else "wrong"), getattr(run, "num_splits", 0), us, err.rel_l2_err, reason


def arguments(argv: list[str] | None) -> argparse.Namespace:
    """The command line (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--impls", default=",".join(RUNG_MODULES), help="comma-separated decode rungs to A/B (default all three)"
    )
    parser.add_argument("--out", type=Path, default=Path("runs/fewpairs"), help="output folder")
    parser.add_argument("--rep", type=float, default=25.0, help="do_bench's timed ms per eager/graph measurement")
    parser.add_argument("--reps", type=int, default=25, help="timed calls per clean-L2 measurement")
    parser.add_argument("--no-read", action="store_true", help="leave out the size-matched read rows")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    if unknown := set(args.impls.split(",")) - set(RUNG_MODULES):
        print(f"--impls takes {', '.join(RUNG_MODULES)}; got {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    require_gpu("bench.decode_fewpairs")
    return run(args)


def run(args: argparse.Namespace) -> int:
    """Every row of the module docstring for ``args.impls``, shape by shape; 0 when each timed setting passed
    its check and every rung asked for was available."""
    import torch

    from common.contract.registry import discover
    from common.measure.peaks import measure_read_gbps
    from common.measure.runner import freeze_imports

    device = torch.device("cuda")
    wanted = args.impls.split(",")
    impls = {i.name: i for i in discover(include_baselines=False)[0] if i.name in wanted}
    for name in set(wanted) - set(impls):
        print(f"{name} is not available here (its toolchain is missing): no rows", flush=True)
    read_gbps = measure_read_gbps(device)
    props = torch.cuda.get_device_properties(device)
    l2_mib = props.L2_cache_size / 2**20
    print(f"read bandwidth (4 GiB sum, do_bench): {read_gbps:.0f} GB/s; {props.multi_processor_count} SMs, "
        f"L2 {l2_mib:.0f} MiB (what do_bench's zeroing leaves dirty)", flush=True)  # fmt: skip
    freeze_imports()
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    emit = emitter(args.out / "fewpairs.csv", rows)
    for index, case in enumerate(cases()):
        print(f"-- {case.describe()}", flush=True)
        if not args.no_read:
            emit(read_row(case, read_gbps, args, device))
        workload, extra = case.gpu_workload(device)
        for name, impl in impls.items():
            module = importlib.import_module(RUNG_MODULES[name])
            for setting, planned, forced, same_as in planned_settings(name, module, case.problem, index, device):
                if same_as:
                    emit(row(name, case, setting, planned, "skip", {}, read_gbps, 0.0, f"same plan as {same_as}"))
                    continue
                with switched(module, setting_switches(name, setting)):
                    status, splits, us, err, reason = measure_setting(impl, case, workload, extra, args, forced)
                emit(row(name, case, setting, splits or planned, status, us, read_gbps, err, reason))
        del workload, extra
        torch.cuda.empty_cache()
    (args.out / "fewpairs.md").write_text(markdown(rows, read_gbps))
    print((args.out / "fewpairs.md").read_text())
    passed = rows and all(r["status"] in ("ok", "skip") for r in rows)
    return 0 if passed and len(impls) == len(set(wanted)) else 1


def emitter(path: Path, rows: list[dict]) -> Callable[[dict], None]:
    """``emit(record)``: the record appended to ``rows``, to the CSV ``path`` (its header first, each row
    flushed, so that a run cut short keeps it) and printed."""
    log = CsvLog(path, COLUMNS)

    def emit(record: dict) -> None:
        rows.append(record)
        log.append(record)
        cells = " ".join(f"{m} {record[f'{m}_us']:7.1f} us {record[f'{m}_pct']:5.1f} %" for m in MODES)
        head = f"{record['impl']:14s} {record['mb']:7.1f} MB {record['setting']:11s}"
        print(f"{head} splits={record['num_splits']:3d} {record['status']:6s} {cells} {record['reason']}", flush=True)

    return emit


def markdown(rows: list[dict], read_gbps: float, source: str = "Few-pair decode A/B (bench/decode_fewpairs.py)") -> str:
    """One table under ``source``'s title: a row per (shape, implementation, setting), µs and % per timing mode."""
    title = f"{source}: µs and % of the read bandwidth ({read_gbps:.0f} GB/s)"
    header = ("shape", "MB", "impl", "setting", "splits", *MODES)
    lines = [title, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = " | ".join("—" if r["status"] != "ok" else f"{r[f'{m}_us']:.1f} ({r[f'{m}_pct']:.0f} %)" for m in MODES)
        note = "" if r["status"] == "ok" else f" {r['status']}: {r['reason']}"
        lines.append(f"| {r['shape']} | {r['mb']} | {r['impl']} | {r['setting']}{note} | {r['num_splits']} | {cells} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
