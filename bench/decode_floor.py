"""Issue #38's decode floor: each decode rung before and after, on the random sweep's low shapes, in one process.

Settings, each applied at bind time by module constants the rungs read there:

* ``before``: the merges reading the splits' partials one at a time as they did: triton/decode's
  (fused, and the merge kernel gluon/decode shares) with ``MERGE_SPLITS_PER_STEP = 1``, a chain of one
  L2 round trip per split;
  cute/decode's loops are unrolled as the compiler chooses (``MERGE_SPLITS_PER_STEP = 0``: the committed
  merge's machine code, instruction for instruction);
* ``after``: the rungs as committed (``MERGE_SPLITS_PER_STEP`` splits a step), triton/decode with its
  padded-Sk split (``BALANCED_SPLIT = "never"``, as in every setting but the balanced ones: a call with
  ``cache_seqlens`` takes the balanced split by default since the fifth stop's A/B);
* ``after+tile``: ``after`` with a candidate tile (:data:`TILE_CANDIDATES`, not the defaults) where the
  model (``bench/decode_model.py``) finds the rung's CTAs the limit: gluon/decode at D=64 and 128 with
  64-key blocks (3 stages at D=128, 6 at D=64; 112 and 104 KB of shared memory), so that two CTAs share
  an SM and one CTA's fixed latency (cache length, Q, first block, epilogue) hides under the other's
  stream (modelled +9 to +17 points on the ragged shapes); triton/decode at D=64 with 128-key blocks,
  64 KB in flight per CTA instead of 32 (modelled +15 points on the paged ragged shape, where the long
  sequence's CTAs cannot draw their share of the bandwidth);
* ``two-launch``: ``after`` with the merge as a second kernel (``FUSED_MERGE = False``) in the rungs
  whose split kernel merges by itself (:data:`FUSED_RUNGS`): the one-launch step (issue #38) A/B;
* ``after+splits``: ``after`` with the split count forced to the one the model finds best for that rung
  and shape (:data:`MODEL_SPLITS`, where it beats the rule's count by 3 points or more): whether the
  shared rule should weigh a rung's CTAs (gluon's one CTA per SM prefers fewer splits);
* ``balanced``, ``balanced-4``: triton/decode with its balanced split for every call (``"always"``:
  each CTA an equal share of the valid keys, planned on the device; also without ``cache_seqlens``),
  aiming at 2 (the committed ``BALANCED_SHARES_PER_SM``) or 4 shares per SM.

* issue #38's fifth stop (:data:`FIFTH_SETTINGS`; ``bench/decode_floor5.sh``), each rung's switches of that
  name where it has them, a setting timed only where it changes the rung's plan for the shape (split count,
  ring; :func:`plan_signature`): ``slots-2``, the split rule filling two CTA slots per SM with even work
  (``SPLIT_CTAS_PER_SM = 2``, at most what the rung's rings leave room for); ``one-split``, a short cache
  whose items fill a wave in one split (``SHORT_CACHE_ONE_SPLIT``); ``deep-ring``, triton/decode's
  ``DEEP_RING`` (a grid of at most one CTA per SM takes cute/decode's ring depth); ``short-tile``,
  ``SHORT_CACHE_TILE`` at D=128 for short caches (gluon/decode: a ring two CTAs share an SM with;
  triton/decode: 32-key blocks, five CTAs an SM, not three); ``fifth``, all of them together; for
  triton/decode, whose calls with ``cache_seqlens`` take the balanced split by default (every other setting
  times its padded-Sk split), ``committed`` (that default) and ``balanced+short-tile`` (the balanced
  kernel on the short-cache tile).

``--seed`` and ``--shapes`` time other shapes of the random sweep (``after+splits`` is seed 1's only).

For the low shapes of ``compare.py --decode --decode-random 10 --decode-seed 1``
(``results/h200/decode-random/``) and two good ones, each (rung, setting) is checked against the fp64
reference (poisoned output) and timed (median, L2 flushed), the settings interleaved for ``--rounds``
rounds (their order reversed every other round, ``bench.interleaved``) so that drift hits all alike.
Writes ``decode_floor.csv`` and ``decode_floor.md`` (µs, mean of the rounds' medians, and % of the read
bandwidth measured in the same run, counting each key of each sequence's own length once, as
``compare.py --decode`` does) under ``--out``.

    python -m bench.decode_floor --out runs/decode-floor       # from the project root, on a GPU
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import importlib
import statistics
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

from bench import interleaved, require_gpu
from common.measure.results import CsvLog

# Indices into random_cases(10, seed=1): the low ones (B=8 Hkv=8 D=64 ragged; B=32 Hkv=32 ragged; B=3
# Hkv=32 D=256 paged; B=16 Hkv=4 D=64 paged ragged; B=3 Hkv=2 55k) and two good ones (B=2 Hkv=16 59k;
# B=2 Hkv=4 131k).
SHAPES = (3, 4, 7, 8, 9, 0, 2)
SEED = 1
# Issue #38's fifth stop: setting -> the module switches it sets in each rung that has them.
FIFTH_SETTINGS = {
    "slots-2": {"SPLIT_CTAS_PER_SM": 2},
    "one-split": {"SHORT_CACHE_ONE_SPLIT": True},
    "deep-ring": {"DEEP_RING": True},
    "short-tile": {"SHORT_CACHE_TILE": True},
    "fifth": {"SPLIT_CTAS_PER_SM": 2, "SHORT_CACHE_ONE_SPLIT": True, "DEEP_RING": True, "SHORT_CACHE_TILE": True},
    "committed": {"BALANCED_SPLIT": "ragged"},
    "balanced+short-tile": {"BALANCED_SPLIT": "ragged", "SHORT_CACHE_TILE": True},
}
# The fifth stop's switches off: every setting starts from them (so ``after`` stays the rule before the fifth
# stop, whatever a rung commits), then sets its own.
FIFTH_OFF = {"SPLIT_CTAS_PER_SM": 1, "SHORT_CACHE_ONE_SPLIT": False, "DEEP_RING": False, "SHORT_CACHE_TILE": False}
SETTINGS = ("before", "after", "two-launch", "after+tile", "after+splits", "balanced", "balanced-4", *FIFTH_SETTINGS)
# Each decode rung's module, whose switches the fifth stop's settings set.
RUNG_MODULES = {
    "triton/decode": "triton_impl.decode",
    "gluon/decode": "triton_impl.gluon.decode",
    "cute/decode": "cute_impl.decode",
}
# The balanced settings' shares per SM (triton/decode's BALANCED_SHARES_PER_SM).
BALANCED_SETTINGS = {"balanced": 2, "balanced-4": 4}
# The rungs whose split kernel merges its splits itself unless triton/decode's FUSED_MERGE is False.
FUSED_RUNGS = ("triton/decode", "gluon/decode")
# (index into the shapes, rung) -> the split count bench/decode_model.py predicts best among 1, 2, 3, 4,
# 6, 8, 12, 16, 24, 32, 48 with the merge after (the rule's count, modelled % -> best, modelled %).
MODEL_SPLITS = {
    (3, "gluon/decode"): 3,  # 18: 81 -> 92
    (3, "cute/decode"): 6,  # 18: 89 -> 92
    (4, "gluon/decode"): 1,  # 2: 64 -> 74
    (4, "cute/decode"): 1,  # 2: 76 -> 83
    (7, "triton/decode"): 4,  # 8: 66 -> 74
    (7, "gluon/decode"): 2,  # 8: 59 -> 72
    (7, "cute/decode"): 2,  # 8: 59 -> 74
    (8, "triton/decode"): 48,  # 33: 65 -> 76
    (8, "gluon/decode"): 12,  # 33: 63 -> 85
    (8, "cute/decode"): 24,  # 33: 78 -> 84
}


def tile_candidates() -> dict[tuple[str, int], tuple[object, object]]:
    """(rung, head dim) -> (the rung's DEFAULT_CONFIGS dict, the candidate tile of ``after+tile``)."""
    from triton_impl import decode as triton_decode
    from triton_impl.gluon import decode as gluon_decode

    return {
        ("gluon/decode", 128): (gluon_decode.DEFAULT_CONFIGS, gluon_decode.DecodeConfig(64, 3)),
        ("triton/decode", 64): (triton_decode.DEFAULT_CONFIGS, triton_decode.TileConfig(128, 4, 3)),
    }


COLUMNS = ("impl", "shape", "setting", "num_splits", "status", "us", "pct_read_bw", "rel_l2_err", "reason")


def fifth_switches(setting: str, impl_name: str) -> dict[str, object]:
    """The fifth stop's switches ``impl_name``'s module has, off (:data:`FIFTH_OFF`) but for those fifth-stop
    ``setting`` sets (empty for a rung without a module here)."""
    if impl_name not in RUNG_MODULES:
        return {}
    module = importlib.import_module(RUNG_MODULES[impl_name])
    wanted = {**FIFTH_OFF, **FIFTH_SETTINGS.get(setting, {})}
    return {name: value for name, value in wanted.items() if hasattr(module, name)}


def plan_signature(impl_name: str, problem, device) -> tuple:
    """What the fifth stop's switches may change in ``impl_name``'s launch of ``problem``, read on the host
    under the current constants: the split count, and triton/decode's tile and pipeline depth
    (``SHORT_CACHE_TILE``; ``DEEP_RING``: a grid of at most one CTA per SM) or gluon/decode's ring."""
    from common.contract import splits

    module = importlib.import_module(RUNG_MODULES[impl_name])
    num_splits = module.planned_num_splits(problem, device)
    if impl_name == "triton/decode":
        if module.balanced_split(problem, device):
            return "balanced", module.tile_config(problem), module.num_stages_for(problem)
        ctas = num_splits * module.m_blocks_for(problem) * problem.batch * problem.kv_heads
        deep = module.DEEP_RING and ctas <= splits.sm_count(device)
        return num_splits, module.tile_config(problem), module.num_stages_for(problem, deep)
    if impl_name == "gluon/decode":
        return num_splits, module.decode_config(problem)
    return (num_splits,)


def fifth_settings_to_time(settings: list[str], impl_name: str, problem, device) -> list[str]:
    """``settings`` without the fifth-stop ones that would time a plan already timed: the committed one
    (the switch changes nothing for this shape) or an earlier setting's (``fifth`` where one switch
    decides alone)."""
    if not set(settings) & set(FIFTH_SETTINGS):
        return settings
    with applied("after", impl_name, problem.head_dim):
        seen = {plan_signature(impl_name, problem, device)}
    kept = []
    for setting in settings:
        if setting in FIFTH_SETTINGS:
            with applied(setting, impl_name, problem.head_dim):
                plan = plan_signature(impl_name, problem, device)
            if plan in seen:
                continue
            seen.add(plan)
        kept.append(setting)
    return kept


def applies(setting: str, impl_name: str, head_dim: int, shape_index: int) -> bool:
    if setting == "after+tile":
        return (impl_name, head_dim) in tile_candidates()
    if setting == "after+splits":
        return (shape_index, impl_name) in MODEL_SPLITS
    if setting == "two-launch":
        return impl_name in FUSED_RUNGS
    if setting in BALANCED_SETTINGS:
        return impl_name == "triton/decode"
    if setting in FIFTH_SETTINGS:
        return bool(set(fifth_switches(setting, impl_name)) & set(FIFTH_SETTINGS[setting]))
    return True


@contextlib.contextmanager
def applied(setting: str, impl_name: str, head_dim: int) -> Iterator[None]:
    """The module constants of ``setting`` for ``impl_name``'s binds inside; the committed values
    restored after."""
    from cute_impl import decode as cute_decode
    from triton_impl import decode as triton_decode

    saved_steps = (triton_decode.MERGE_SPLITS_PER_STEP, cute_decode.MERGE_SPLITS_PER_STEP)
    saved_fused = triton_decode.FUSED_MERGE
    saved_balanced = (triton_decode.BALANCED_SPLIT, triton_decode.BALANCED_SHARES_PER_SM)
    configs, candidate = tile_candidates().get((impl_name, head_dim), ({}, None))
    saved_tile = configs.get(head_dim)
    if setting == "before":
        triton_decode.MERGE_SPLITS_PER_STEP, cute_decode.MERGE_SPLITS_PER_STEP = 1, 0
    if setting == "after+tile":
        configs[head_dim] = candidate
    if setting == "two-launch":
        triton_decode.FUSED_MERGE = False
    triton_decode.BALANCED_SPLIT = "never"
    if setting in BALANCED_SETTINGS:
        triton_decode.BALANCED_SPLIT, triton_decode.BALANCED_SHARES_PER_SM = "always", BALANCED_SETTINGS[setting]
    switches = fifth_switches(setting, impl_name)
    module = importlib.import_module(RUNG_MODULES[impl_name]) if switches else None
    saved_switches = {name: getattr(module, name) for name in switches}
    for name, value in switches.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved_switches.items():
            setattr(module, name, value)
        triton_decode.MERGE_SPLITS_PER_STEP, cute_decode.MERGE_SPLITS_PER_STEP = saved_steps
        triton_decode.FUSED_MERGE = saved_fused
        triton_decode.BALANCED_SPLIT, triton_decode.BALANCED_SHARES_PER_SM = saved_balanced
        if saved_tile is not None:
            configs[head_dim] = saved_tile


def prepared(impl, workload, problem, extra: dict) -> tuple[str, float, float, int, str] | None:
    """Validation, the capability check and the compile of ``impl`` under the current constants: None, or
    a failed measurement (a setting that cannot build is a row, the run goes on)."""
    try:
        impl.prepare(workload.q, workload.k, workload.v, problem, **extra)
    except Exception as error:  # noqa: BLE001 - a variant that fails is a row, the run goes on
        return "failed", float("nan"), float("nan"), 0, f"prepare: {type(error).__name__}: {error}".splitlines()[0]
    return None


def measure(impl, case, workload, options, num_splits: int | None = None) -> tuple[str, float, float, int, str]:
    """(status, µs, rel. L2 error, num_splits, reason) of ``impl`` bound under the current constants
    (``num_splits`` forced, or None for the rule): judged against fp64 on a poisoned output, then timed;
    never raises."""
    import torch

    from common.contract.registry import per_call_inputs
    from common.measure.runner import judge_on_workload
    from common.measure.timing import time_cuda

    inputs = (workload.q, workload.k, workload.v)
    extra = per_call_inputs(case.problem, workload.cache_seqlens, workload.block_table)
    try:
        run = impl.bind(*inputs, case.problem, **extra, num_splits=num_splits)
        ok, reason, err = judge_on_workload(impl, run, workload)
        timing = time_cuda(run, warmup_ms=options.warmup_ms, rep_ms=options.rep_ms)
    except Exception as error:  # noqa: BLE001 - a variant that fails is a row, the run goes on
        return "failed", float("nan"), float("nan"), 0, f"{type(error).__name__}: {error}".splitlines()[0]
    finally:
        torch.cuda.empty_cache()
    return ("ok" if ok else "wrong"), timing.ms * 1e3, err.rel_l2_err, getattr(run, "num_splits", 0), reason


def model_splits(setting: str, shape_index: int, impl_name: str) -> int | None:
    """The split count ``setting`` forces: the model's best for ``after+splits``, else None (the rule)."""
    return MODEL_SPLITS[shape_index, impl_name] if setting == "after+splits" else None


def interleaved_settings(
    impl, case, prepared_inputs: tuple, settings: list[str], rounds: int, options,
    apply: Callable[[str], contextlib.AbstractContextManager],
    forced_splits: Callable[[str], int | None] = lambda _: None,
) -> dict[str, list[tuple[str, float, float, int, str]]]:  # fmt: skip
    """setting -> one :func:`measure` a round: each of ``settings`` under ``apply(setting)`` (its constants),
    prepared in the first round (a failed prepare is that round's row), then checked and timed at
    ``forced_splits(setting)`` (None: the rule), in :func:`bench.interleaved`'s rounds (the settings' order
    reversed every other round, so that no setting keeps the place a heated GPU favours or penalises).
    ``prepared_inputs``: the workload and its per-call inputs (``per_call_inputs``)."""
    workload, extra = prepared_inputs
    seen: set[str] = set()

    def once(setting: str) -> tuple[str, float, float, int, str]:
        with apply(setting):
            if setting not in seen:
                seen.add(setting)
                if failed := prepared(impl, workload, case.problem, extra):
                    return failed
            return measure(impl, case, workload, options, forced_splits(setting))

    return interleaved({setting: setting for setting in settings}, rounds, once)


def summary(measured: list[tuple[str, float, float, int, str]]) -> tuple[str, float, float, str]:
    """(status, mean µs, worst rel. L2 error, reasons) of one setting's rounds: a round not ok names the status."""
    status = next((m[0] for m in measured if m[0] != "ok"), "ok")
    reasons = "; ".join({m[4] for m in measured} - {""})
    return status, statistics.mean(m[1] for m in measured), max(m[2] for m in measured), reasons


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/decode-floor"), help="output folder")
    parser.add_argument("--only", default="*/decode", help="glob on decode rung names (default every one)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the settings (default 2)")
    parser.add_argument("--rep", type=float, default=150.0, help="timed repetitions per variant, ms")
    parser.add_argument(
        "--settings", default=",".join(SETTINGS), help=f"comma-separated subset of {','.join(SETTINGS)} (default all)"
    )
    parser.add_argument("--seed", type=int, default=SEED, help=f"the random sweep's seed (default {SEED})")
    parser.add_argument(
        "--shapes",
        default=",".join(map(str, SHAPES)),
        help="comma-separated indices into its shapes (default the floor's)",
    )
    args = parser.parse_args(argv)
    chosen = args.settings.split(",")
    if unknown := set(chosen) - set(SETTINGS):
        parser.error(f"--settings takes {', '.join(SETTINGS)}; got {', '.join(sorted(unknown))}")
    if args.seed != SEED and "after+splits" in chosen:
        parser.error(f"after+splits holds the model's split counts for seed {SEED}'s shapes only")
    shapes = [int(index) for index in args.shapes.split(",")]
    chosen_fifth = set(chosen) & set(FIFTH_SETTINGS)
    require_gpu("bench.decode_floor")
    import torch

    from bench.decode_splits import split_implementations
    from common.contract.registry import discover
    from common.measure.decode_sweep import random_cases, too_large
    from common.measure.peaks import measure_read_gbps
    from common.measure.runner import TimingOptions, freeze_imports

    device = torch.device("cuda")
    available, _ = discover(include_baselines=False)
    impls = [impl for impl in split_implementations(available) if fnmatch.fnmatch(impl.name, args.only)]
    cases = random_cases(max(shapes) + 1, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    read_gbps = measure_read_gbps(device)
    options = TimingOptions(50.0, args.rep)
    freeze_imports()
    rows: list[dict] = []
    log = CsvLog(args.out / "decode_floor.csv", COLUMNS)
    for index in shapes:
        case = cases[index]
        if skip := too_large(case, device):
            print(f"skipped {case.describe()}: {skip}", flush=True)
            continue
        head_dim = case.problem.head_dim
        workload, extra = case.gpu_workload(device)
        for impl in impls:
            ok, reason = impl.check(case.problem, device)
            if not ok:
                print(f"{impl.name:14s} {case.describe()}: refused: {reason}", flush=True)
                continue
            settings = [setting for setting in chosen if applies(setting, impl.name, head_dim, index)]
            settings = fifth_settings_to_time(settings, impl.name, case.problem, device)
            if chosen_fifth and not set(settings) & set(FIFTH_SETTINGS):
                print(f"{impl.name:14s} {case.describe()}: no fifth-stop setting changes its plan", flush=True)
                continue
            results = interleaved_settings(
                impl, case, (workload, extra), settings, args.rounds, options,
                apply=partial(applied, impl_name=impl.name, head_dim=head_dim),
                forced_splits=partial(model_splits, shape_index=index, impl_name=impl.name),
            )  # fmt: skip
            for setting, measured in results.items():
                status, us, rel_l2_err, reason = summary(measured)
                record = {
                    "impl": impl.name, "shape": case.describe(), "setting": setting, "num_splits": measured[0][3],
                    "status": status, "us": us, "pct_read_bw": 100 * case.kv_bytes_read / (us * 1e3) / read_gbps,
                    "rel_l2_err": rel_l2_err, "reason": reason,
                }  # fmt: skip
                rows.append(record)
                log.append(record)
                print(
                    f"{impl.name:14s} {case.describe():96s} {setting:13s} splits={record['num_splits']:3d} "
                    f"{status:6s} {us:8.1f} us {record['pct_read_bw']:5.1f} % {record['reason']}",
                    flush=True,
                )
        del workload
        torch.cuda.empty_cache()
    (args.out / "decode_floor.md").write_text(markdown(rows, read_gbps))
    print((args.out / "decode_floor.md").read_text())
    return 0 if rows and all(row["status"] == "ok" for row in rows) else 1


def markdown(rows: list[dict], read_gbps: float) -> str:
    """One line per (shape, rung): µs (% of the read bandwidth) per setting."""
    lines = [
        f"Decode floor A/B (bench/decode_floor.py): µs per step and % of the read bandwidth ({read_gbps:.0f} GB/s)",
        "",
        "| shape | rung | splits | " + " | ".join(SETTINGS) + " |",
        "|---|---|---|" + "---|" * len(SETTINGS),
    ]
    for shape in dict.fromkeys(row["shape"] for row in rows):
        for impl in dict.fromkeys(row["impl"] for row in rows if row["shape"] == shape):
            by_setting = {row["setting"]: row for row in rows if row["shape"] == shape and row["impl"] == impl}
            cells = [_cell(by_setting.get(setting)) for setting in SETTINGS]
            splits = by_setting.get("after", next(iter(by_setting.values())))["num_splits"]
            lines.append(f"| {shape} | {impl} | {splits} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _cell(row: dict | None) -> str:
    if row is None:
        return "—"
    if row["status"] != "ok":
        return row["status"]
    return f"{row['us']:.1f} µs ({row['pct_read_bw']:.0f} %)"


if __name__ == "__main__":
    sys.exit(main())
