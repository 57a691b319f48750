"""Regenerate the README's generated blocks from the committed runs, between markers: the prefill run of
the release a fresh install gets (results markers, other releases' runs linked by folder), the decode runs
(decode markers, ``common.reporting.decode_table``) and, in the README only, the generate run (generate
markers, ``common.reporting.generate_table``), the context-parallel run and the backward run. Each block
opens with the sentence that says which stack to use for its workload, read from the same numbers.

python -m common.reporting.readme_table          # rewrite README.md and docs/ladder.md
python -m common.reporting.readme_table --check  # exit 1 if either disagrees with the CSVs
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd

from common.contract.registry import DECODE_RUNGS, RUNGS
from common.measure.results import baseline_stacks, ladder_stacks
from common.reporting import context_parallel, decode_table
from common.reporting.decode_table import DECODE_BEGIN, DECODE_END, DECODE_GLOB, column_order, decode_tables
from common.reporting.generate_table import GENERATE_BEGIN, GENERATE_CSV, GENERATE_END, generate_table

ROOT = Path(__file__).resolve().parents[2]
# The prefill run of the toolchain a fresh `pip install` on the plain package index gets (the README's
# "Tested versions": Triton 3.9, CuTe DSL 4.8.1). The runs of the other releases sit beside it.
CANONICAL_DIR = ROOT / "results" / "h200" / "canonical-triton-3.9"
# The default decode sweep the README shows (the prefill table's GPU); other committed decode runs are named by folder.
DECODE_SHOWN = Path("results") / "h200" / "decode" / "decode.csv"
README = ROOT / "README.md"
LADDER_GUIDE = ROOT / "docs" / "ladder.md"
# Every document that carries the results table between the markers.
DOCUMENTS = (README, LADDER_GUIDE)
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
STACK_TITLES = {"triton": "Triton", "gluon": "Gluon", "cute": "CuTe DSL"}
# Runs of the same suite on another toolchain sit next to the shown run as results/h200/canonical*/;
# the block links them by folder instead of copying their tables.
COMPANION_GLOB = "canonical*"
MISSING = "—"
# compare.py's column for rungs that transform their inputs per call (``common.measure.row_extras``).
END_TO_END = "tflops_end_to_end"


def _end_to_end(row: pd.DataFrame) -> float:
    """The row's end-to-end TFLOP/s (FP8: quantisation and kernel per call), NaN where not measured."""
    return float(row[END_TO_END].iloc[0]) if END_TO_END in row else math.nan


def _speed(frame: pd.DataFrame, impl: str, causal: bool) -> str:
    row = frame[(frame["impl"] == impl) & (frame["causal"] == causal)]
    if row.empty:
        return MISSING
    status, tflops = row["status"].iloc[0], row["tflops"].iloc[0]
    if math.isnan(tflops):
        return status
    # A measured but wrong result keeps its speed, marked, so the table never hides a failed check.
    speed = f"{tflops:.0f}" if status == "ok" else f"{tflops:.0f} ({status})"
    end_to_end = _end_to_end(row)
    return speed if math.isnan(end_to_end) else f"{speed} (e2e {end_to_end:.0f})"


def _ladder(frame: pd.DataFrame) -> list[str]:
    """Rungs in ladder order, one column pair per stack that has rows; '—' where a stack lacks a rung."""
    stacks = [stack for stack in ladder_stacks() if stack in set(frame["stack"])]
    titles = [STACK_TITLES.get(stack, stack) for stack in stacks]
    header = " | ".join(f"{title} | {title} causal" for title in titles)
    lines = [f"| rung | {header} |", "|---|" + "---|" * (2 * len(stacks))]
    for rung in RUNGS:
        cells = [_speed(frame, f"{stack}/{rung}", causal) for stack in stacks for causal in (False, True)]
        lines.append(f"| {rung} | " + " | ".join(cells) + " |")
    return lines


def _variants(frame: pd.DataFrame) -> str:
    """'triton/fp8 block+rotation, cute/fp8 block+rotation' from the variant column, where recorded."""
    if "variant" not in frame:
        return ""
    recorded = frame[frame["variant"].astype("string").fillna("") != ""].drop_duplicates("impl")
    return ", ".join(f"{row['impl']} {row['variant']}" for _, row in recorded.iterrows())


def _baselines(frame: pd.DataFrame) -> list[str]:
    """SDPA backends and FlashAttention-4, in the registry's stack order; a baseline with no passing row in the
    run (a decode-only one on the prefill problem, one not installed) is named below the table with its reason."""
    rank = {stack: index for index, stack in enumerate(baseline_stacks())}
    rows = frame[frame["stack"].isin(rank)]
    ordered = sorted(rows["impl"].drop_duplicates(), key=lambda impl: (rank[impl.split("/")[0]], impl))
    passing = set(rows.loc[rows["status"] == "ok", "impl"])
    lines = ["| baseline | non-causal | causal |", "|---|---|---|"]
    lines += [
        f"| {impl} | {_speed(frame, impl, False)} | {_speed(frame, impl, True)} |"
        for impl in ordered
        if impl in passing
    ]
    not_run = [f"{impl} ({_first_reason(rows, impl)})" for impl in ordered if impl not in passing]
    return lines + (["", f"Not run in this run: {'; '.join(not_run)}."] if not_run else [])


def _first_reason(rows: pd.DataFrame, impl: str) -> str:
    """The first recorded reason of ``impl``'s rows, else their status."""
    mine = rows[rows["impl"] == impl]
    reasons = [str(reason) for reason in mine["reason"] if isinstance(reason, str) and reason]
    return reasons[0] if reasons else str(mine["status"].iloc[0])


def _peaks(env: dict) -> str:
    peaks = env.get("peaks", {})
    shown = []
    for label, burst_key, sustained_key in (
        ("bf16 GEMM", "bf16_tflops", "bf16_sustained_tflops"),
        ("fp8 GEMM", "fp8_tflops", "fp8_sustained_tflops"),
    ):
        if not peaks.get(burst_key):
            continue
        if sustained_key in peaks:
            sustained = peaks.get(sustained_key)
            tail = f" / {sustained:.0f} sustained" if sustained else ""
            shown.append(f"{label} {peaks[burst_key]:.0f} burst{tail}")
        else:
            # Runs before the burst figure measured one GEMM figure, after a 1.5 s warm-up over 1 s.
            shown.append(f"{label} {peaks[burst_key]:.0f} (1 s sustained)")
    return f"Measured peaks in the same run (TFLOP/s): {', '.join(shown)}." if shown else ""


def _shown(path: Path, root: Path = ROOT) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def _toolchain(env: dict) -> str:
    """'torch 2.11.0+cu130, Triton 3.9.0, CuTe DSL 4.8.1' (torch left out where the run did not record it)."""
    torch = f"torch {env['torch']}, " if env.get("torch") else ""
    return f"{torch}Triton {env.get('triton') or '?'}, CuTe DSL {env.get('nvidia_cutlass_dsl') or '?'}"


def run_table(csv_path: Path, env_path: Path) -> list[str]:
    """One run's tables: the ladder per stack, wrong rows explained, the baselines and the peaks."""
    frame = pd.read_csv(csv_path)
    env = json.loads(env_path.read_text()) if env_path.exists() else {}
    first = frame.iloc[0]
    lines = [
        f"TFLOP/s on the H200, B={first['batch']} H={first['heads']} S={first['seqlen_q']} "
        f"D={first['head_dim']} {first['dtype']}, {_toolchain(env)} (from `{_shown(csv_path)}`; "
        "causal counts unmasked work; — where a stack has no such rung).",
        "",
        *_ladder(frame),
    ]
    variants = _variants(frame)
    if variants:
        lines += ["", f"FP8 quantisation that ran: {variants}."]
    if END_TO_END in frame and frame[END_TO_END].notna().any():
        lines += [
            "",
            "(e2e N): end to end, what a caller holding bf16 tensors gets per call (the rung quantises "
            "Q, K and V and launches the kernel in every call); the figure before it is the kernel alone.",
        ]
    wrong = frame[frame["status"] == "wrong"]
    for _, row in wrong.drop_duplicates("impl").iterrows():
        lines.append(f"\n{row['impl']} is marked wrong by its rule ({row['error_rule']}): {row['reason']}.")
    lines += ["", *_baselines(frame)]
    peaks = _peaks(env)
    return lines + (["", peaks] if peaks else [])


def _best(frame: pd.DataFrame, keep: pd.Series, causal: bool) -> pd.Series | None:
    """The passing row with the most TFLOP/s among ``keep`` for one mask, None where none passed."""
    rows = frame[keep & (frame["causal"] == causal) & (frame["status"] == "ok")]
    return None if rows.empty else rows.loc[rows["tflops"].idxmax()]


def _fastest(frame: pd.DataFrame, keep: pd.Series) -> str:
    """'`cute/hopper` (677 TFLOP/s, 631 causal)', or one name per mask where they differ."""
    full, causal = _best(frame, keep, False), _best(frame, keep, True)
    if full is None or causal is None:
        return "no passing row"
    if full["impl"] == causal["impl"]:
        return f"`{full['impl']}` ({full['tflops']:.0f} TFLOP/s, {causal['tflops']:.0f} causal)"
    non_causal = f"`{full['impl']}` ({full['tflops']:.0f} TFLOP/s) non-causal"
    return f"{non_causal}, `{causal['impl']}` ({causal['tflops']:.0f}) causal"


def prefill_pick(frame: pd.DataFrame) -> str:
    """The sentence that opens the results block: the fastest rung per dtype, and the fastest baseline."""
    ladder = frame["stack"].isin(ladder_stacks()) & frame["rung"].isin(RUNGS)
    fp8 = frame["rung"] == "fp8"
    return (
        f"Prefill: in bf16 use {_fastest(frame, ladder & ~fp8)}; the fastest baseline is "
        f"{_fastest(frame, frame['stack'].isin(baseline_stacks()))}. With FP8 inside the kernel, "
        f"{_fastest(frame, ladder & fp8)}, kernel alone."
    )


def _other_releases(csv_path: Path) -> str:
    """One line naming the folder and toolchain of every other run of the suite beside ``csv_path``'s."""
    named = []
    for folder in sorted(csv_path.parent.parent.glob(COMPANION_GLOB)):
        if folder != csv_path.parent and (folder / "results.csv").exists():
            env = folder / "env.json"
            toolchain = _toolchain(json.loads(env.read_text())) if env.exists() else folder.name
            named.append(f"{toolchain}: `{_shown(folder)}/`")
    return f"The same suite on the other releases (their tables are in each folder's `report.md`): {'; '.join(named)}."


def results_table(csv_path: Path, env_path: Path) -> str:
    """Markdown for the shown prefill run (its pick sentence, tables and peaks), then the other runs by folder."""
    if not csv_path.exists():
        return "_No canonical run committed yet._"
    lines = [prefill_pick(pd.read_csv(csv_path)), "", *run_table(csv_path, env_path)]
    others = _other_releases(csv_path)
    return "\n".join([*lines, "", others] if "`" in others else lines)


# ----------------------------------------------------------------------------------------------
# Decode: which stack, read from the committed decode runs
# ----------------------------------------------------------------------------------------------
# From this many bytes of K and V a step is long enough for every decode rung to be bandwidth-bound;
# below it launch, merge and the last wave's tail decide (README, "Decoding against a KV cache").
LARGE_CACHE_BYTES = 256 * 2**20
ELEMENT_BYTES = {"bf16": 2, "fp16": 2}


def _cache_bytes(row: pd.Series) -> int:
    """K and V bytes of the case's padded cache, from its description ('... D=128 bf16 ...')."""
    words = str(row["case"]).split()
    head_dim = int(next(word for word in words if word.startswith("D=")).split("=")[1])
    element = next(ELEMENT_BYTES[word] for word in words if word in ELEMENT_BYTES)
    return 2 * int(row["batch"]) * int(row["kv_heads"]) * int(row["seqlen_k"]) * head_dim * element


def _percent(fraction: float) -> str:
    return f"{100 * fraction:.0f} %"


def decode_pick(csv_path: Path, root: Path) -> str:
    """'Decode: any of ...' with how far apart the decode rungs' step times are, large caches and the rest."""
    frame = pd.read_csv(csv_path, dtype={"lengths": str}).fillna({"lengths": ""})
    env_path = csv_path.parent / "env.json"
    gpu = json.loads(env_path.read_text()).get("gpu") if env_path.exists() else None
    rung = frame["impl"].str.split("/").str[1]
    decode = frame[rung.isin(DECODE_RUNGS) & frame["impl"].str.split("/").str[0].isin(ladder_stacks())]
    names = column_order(list(decode["impl"]))
    large, other = [], []
    for _, group in decode[decode["status"] == "ok"].groupby("case", sort=False):
        if len(group) < len(names):
            continue
        first = group.iloc[0]
        spread = group["us"].max() / group["us"].min() - 1
        uniform = first["lengths"] == "" and "paged(" not in first["case"]
        (large if uniform and _cache_bytes(first) >= LARGE_CACHE_BYTES else other).append((spread, group))
    if not large:
        return f"Decode: no case of `{_shown(csv_path, root)}` ran every decode rung at a cache of 256 MiB or more."
    lowest_share = min(group["pct_read_bw"].min() for _, group in large)
    text = (
        f"Decode: use any of {', '.join(f'`{name}`' for name in names)}: on the {gpu or 'unknown GPU'}, at every "
        f"contiguous cache of 256 MiB or more their step times are within {_percent(max(s for s, _ in large))} "
        f"of one another and each reaches {lowest_share:.0f} % or more of the measured read bandwidth"
    )
    if other:
        widest = _percent(max(spread for spread, _ in other))
        text += f"; at smaller caches and in ragged or paged batches they are up to {widest} apart"
    return text + "."


def decode_block(root: Path) -> str:
    """The shown decode run's pick sentence and table (``DECODE_SHOWN``, the GPU of the prefill table), then the
    other committed decode runs by folder with their GPU, Triton and commit; every run's, in path order, where the
    shown one is not committed."""
    shown = root / DECODE_SHOWN
    if not shown.exists():
        runs = sorted(root.glob(DECODE_GLOB))
        return "\n\n".join([*(decode_pick(csv_path, root) for csv_path in runs), decode_tables(root)])
    block = [decode_pick(shown, root), "\n".join(decode_table.run_table(shown, shown.parent / "env.json", root))]
    others = [_decode_run_named(csv_path, root) for csv_path in sorted(root.glob(DECODE_GLOB)) if csv_path != shown]
    if others:
        block.append(
            f"The same sweep on other GPUs or trees (each folder's `report*.md` holds its table): {'; '.join(others)}."
        )
    return "\n\n".join(block)


def _decode_run_named(csv_path: Path, root: Path) -> str:
    """'<GPU>, Triton <release>, commit <short>: `<folder>/`' of one committed decode run."""
    env_path = csv_path.parent / "env.json"
    env = json.loads(env_path.read_text()) if env_path.exists() else {}
    commit = (env.get("git_commit") or "")[:7] or "?"
    gpu, triton = env.get("gpu") or "unknown GPU", env.get("triton") or "?"
    return f"{gpu}, Triton {triton}, commit {commit}: `{_shown(csv_path.parent, root)}/`"


# ----------------------------------------------------------------------------------------------
# Context parallelism (README only): the committed context_parallel runs
# ----------------------------------------------------------------------------------------------
CONTEXT_PARALLEL_GLOB = "results/*/context-parallel/results.csv"
CONTEXT_PARALLEL_BEGIN, CONTEXT_PARALLEL_END = "<!-- context-parallel:begin -->", "<!-- context-parallel:end -->"
MASKS = ("full", "causal")


def _span(values: pd.Series, digits: int) -> str:
    low, high = values.min(), values.max()
    return f"{low:.{digits}f}" if round(low, digits) == round(high, digits) else f"{low:.{digits}f}-{high:.{digits}f}"


def _cp_name(label: str) -> str:
    """'ring cute/hopper' -> 'ring attention with `cute/hopper`'; PyTorch's rows keep their label."""
    return f"ring attention with `{label.removeprefix('ring ')}`" if label.startswith("ring ") else f"`{label}`"


def context_parallel_pick(frame: pd.DataFrame, env: dict) -> str:
    """The implementation with the most TFLOP/s per GPU at the most (mask, shard length) points, and where
    another one wins."""
    ok = frame[frame["status"] == "ok"]
    if ok.empty:
        return "One sequence over several GPUs: no row of the committed run passed its check."
    winners = ok.loc[ok.groupby(["mask", "tokens_per_gpu"], sort=False)["tflops_per_gpu"].idxmax()]
    top = winners["label"].value_counts().index[0]
    best = ok[ok["label"] == top]
    text = (
        f"One sequence over several GPUs: use {_cp_name(top)}: on {env.get('world_size')} × "
        f"{env.get('gpu') or 'unknown GPU'} it gives the most TFLOP/s per GPU at {(winners['label'] == top).sum()} "
        f"of the {len(winners)} shard lengths and masks measured ({_span(best['tflops_per_gpu'], 0)}, "
        f"{_span(best['efficiency'], 2)} of its speed on one GPU)"
    )
    others = winners[winners["label"] != top]
    if not others.empty:
        text += "; " + ", ".join(
            f"{_cp_name(row['label'])} at {row['mask']} {row['tokens_per_gpu'] // 1024}k"
            for _, row in others.iterrows()
        )
    torch_cp = ok[ok["method"] == "torch-cp"]
    if not torch_cp.empty:
        text += f"; PyTorch's `context_parallel` with SDPA gives {_span(torch_cp['tflops_per_gpu'], 0)}"
    return text + "."


def _context_parallel_run(csv_path: Path, root: Path) -> list[str]:
    frame = context_parallel.read_rows(csv_path)
    env_path = csv_path.parent / "env.json"
    env = json.loads(env_path.read_text()) if env_path.exists() else {}
    ok = frame[frame["status"] == "ok"]
    first = frame.iloc[0]
    panels = {
        mask: (context_parallel.pivot(ok, "tflops_per_gpu", mask), context_parallel.pivot(ok, "efficiency", mask))
        for mask in MASKS
    }
    columns = [(mask, column) for mask, (speed, _) in panels.items() for column in speed.columns[1:]]
    labels = list(dict.fromkeys(ok["label"]))
    lines = [
        context_parallel_pick(frame, env),
        "",
        f"Ring attention on {env.get('world_size')} × {env.get('gpu') or 'unknown GPU'}, B={first['batch']} "
        f"H={first['heads']} D={first['head_dim']} {first['dtype']}: TFLOP/s per GPU and, in brackets, the scaling "
        "efficiency, that divided by the same implementation's TFLOP/s on one GPU at the same tokens per GPU "
        f"(from `{_shown(csv_path, root)}`).",
        "",
        "| implementation | " + " | ".join(f"{mask} {column.removesuffix('/GPU')}" for mask, column in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for label in labels:
        cells = []
        for mask, column in columns:
            speed, efficiency = (table.set_index("implementation") for table in panels[mask])
            present = label in speed.index and pd.notna(speed.loc[label, column])
            cells.append(
                f"{speed.loc[label, column]:.0f} ({efficiency.loc[label, column]:.2f})" if present else MISSING
            )
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    absent = frame[frame["status"] != "ok"]
    lines += [
        f"\nNot shown: {row['label']}, {row['mask']}, {row['tokens_per_gpu']} tokens per GPU: "
        f"{row['status']} ({row['reason']})."
        for _, row in absent.iterrows()
    ]
    return lines


def context_parallel_block(root: Path) -> str:
    runs = sorted(root.glob(CONTEXT_PARALLEL_GLOB))
    if not runs:
        return "_No context-parallel run committed yet._"
    return "\n\n".join("\n".join(_context_parallel_run(csv_path, root)) for csv_path in runs)


# ----------------------------------------------------------------------------------------------
# Backward (README only): the committed compare.py --backward run (bench/backward.py's results.csv reads too)
# ----------------------------------------------------------------------------------------------
BACKWARD_CSV = Path("results") / "h200" / "backward-anchors-2026-12-04-chained" / "backward.csv"
BACKWARD_BEGIN, BACKWARD_END = "<!-- backward:begin -->", "<!-- backward:end -->"


def backward_pick(frame: pd.DataFrame) -> str:
    """Which backward to train with: the ladder's best against the fastest baseline, per shape, as a share of the
    baseline's TFLOP/s, and at how many shapes each leads."""
    ok = frame[frame["status"] == "ok"]
    stack = ok["impl"].str.split("/").str[0]
    baselines, ladder = ok[stack.isin(baseline_stacks())], ok[stack.isin(ladder_stacks())]
    if baselines.empty or ladder.empty:
        return "Training: the committed backward run lacks a passing ladder or baseline row."
    fastest = baselines.loc[baselines.groupby("shape", sort=False)["bwd_tflops"].idxmax()].set_index("shape")
    ours = ladder.groupby("shape", sort=False)["bwd_tflops"].max()
    shares = ours / fastest["bwd_tflops"].reindex(ours.index)
    names = ", ".join(f"`{impl}`" for impl in fastest["impl"].unique())
    best = ladder.loc[ladder.groupby("shape", sort=False)["bwd_tflops"].idxmax(), "impl"]
    leaders = ", ".join(f"`{impl}`" for impl in dict.fromkeys(best))
    span = f"{shares.min():.2f}-{shares.max():.2f}×"
    ahead = int((shares >= 1).sum())
    if ahead == len(shares):
        return f"Training: for speed use {leaders}; it runs at {span} the fastest baseline's ({names}) TFLOP/s."
    if ahead == 0:
        return f"Training: for speed use {names}; the ladder's fastest backward ({leaders}) runs at {span} its TFLOP/s."
    return (
        f"Training: the ladder's fastest backward ({leaders}) runs at {span} the fastest baseline's ({names}) "
        f"TFLOP/s, ahead at {ahead} of {len(shares)} shapes."
    )


def _backward_shape(row: pd.Series) -> str:
    """A compare.py --backward row's problem, as the table's row label."""
    causal = " causal" if str(row["causal"]) == "True" else ""
    return f"B={row['batch']} H={row['heads']} S={row['seqlen_q']} D={row['head_dim']}{causal}"


def backward_table(csv_path: Path, root: Path) -> str:
    """The pick sentence, then TFLOP/s of the backward alone per shape (rows) and implementation (columns)."""
    if not csv_path.exists():
        return "_No backward run committed yet._"
    frame = pd.read_csv(csv_path, dtype={"reason": str}).fillna({"reason": ""})
    if "shape" not in frame.columns:
        frame["shape"] = frame.apply(_backward_shape, axis=1)
    impls = column_order(list(frame["impl"]))
    lines = [
        backward_pick(frame),
        "",
        "TFLOP/s of the backward alone (2.5 × the forward's FLOPs, halved when causal; from "
        f"`{_shown(csv_path, root)}`).",
        "",
        "| shape | " + " | ".join(impls) + " |",
        "|---|" + "---|" * len(impls),
    ]
    for shape, rows in frame.groupby("shape", sort=False):
        by_impl = rows.set_index("impl")
        cells = []
        for impl in impls:
            row = by_impl.loc[impl] if impl in by_impl.index else None
            cells.append(
                MISSING if row is None else f"{row['bwd_tflops']:.0f}" if row["status"] == "ok" else str(row["status"])
            )
        lines.append(f"| {shape} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def regenerate(readme_text: str, table: str, begin: str = BEGIN, end: str = END) -> str:
    """``readme_text`` with ``table`` between the markers ``begin`` and ``end``."""
    if begin not in readme_text or end not in readme_text:
        raise ValueError(f"the document lacks the markers {begin} ... {end}")
    head, rest = readme_text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{table}\n{end}{tail}"


def regenerate_all(text: str, root: Path = ROOT) -> str:
    """Every generated block of a document: the prefill results and the decode runs (every document), and,
    where the document carries their markers (the README), the generate, context-parallel and backward runs."""
    canonical = root / CANONICAL_DIR.relative_to(ROOT)
    text = regenerate(text, results_table(canonical / "results.csv", canonical / "env.json"))
    text = regenerate(text, decode_block(root), DECODE_BEGIN, DECODE_END)
    optional = (
        (GENERATE_BEGIN, GENERATE_END, lambda: generate_table(root / GENERATE_CSV, root)),
        (CONTEXT_PARALLEL_BEGIN, CONTEXT_PARALLEL_END, lambda: context_parallel_block(root)),
        (BACKWARD_BEGIN, BACKWARD_END, lambda: backward_table(root / BACKWARD_CSV, root)),
    )
    for begin, end, block in optional:
        if begin in text:
            text = regenerate(text, block(), begin, end)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    stale = []
    for document in DOCUMENTS:
        current = document.read_text()
        wanted = regenerate_all(current)
        if wanted == current:
            continue
        if args.check:
            stale.append(document.name)
        else:
            document.write_text(wanted)
    if stale:
        print(
            f"stale results tables in {', '.join(stale)}: run python -m common.reporting.readme_table", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
