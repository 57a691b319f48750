"""README.md and docs/ladder.md carry exactly the blocks the committed CSVs regenerate: the prefill run of
the release a fresh install gets (the other releases linked, not copied), the decode runs and (README only)
the generate, context-parallel and backward runs, each opening with the sentence that picks a stack."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from common.reporting.decode_table import DECODE_BEGIN, DECODE_END, decode_tables
from common.reporting.generate_table import GENERATE_BEGIN, GENERATE_CSV, GENERATE_END, generate_table
from common.reporting.readme_table import (
    BACKWARD_BEGIN,
    BACKWARD_CSV,
    BACKWARD_END,
    BEGIN,
    CANONICAL_DIR,
    CONTEXT_PARALLEL_BEGIN,
    CONTEXT_PARALLEL_END,
    CONTEXT_PARALLEL_GLOB,
    DECODE_GLOB,
    DECODE_SHOWN,
    DOCUMENTS,
    END,
    README,
    ROOT,
    backward_table,
    context_parallel_block,
    decode_block,
    prefill_pick,
    regenerate,
    regenerate_all,
    results_table,
)
from common.toolchain.releases import TESTED_TRITON

NUMBER = r"\b\d+(?:\.\d+)?\b"
README_BLOCKS = (
    (BEGIN, END),
    (DECODE_BEGIN, DECODE_END),
    (GENERATE_BEGIN, GENERATE_END),
    (CONTEXT_PARALLEL_BEGIN, CONTEXT_PARALLEL_END),
    (BACKWARD_BEGIN, BACKWARD_END),
)


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_results_table_regenerates_byte_identically(document):
    current = document.read_text()
    table = results_table(CANONICAL_DIR / "results.csv", CANONICAL_DIR / "env.json")
    assert regenerate(current, table) == current, "run: python -m common.reporting.readme_table"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_decode_table_regenerates_byte_identically(document):
    current = document.read_text()
    assert regenerate(current, decode_block(ROOT), DECODE_BEGIN, DECODE_END) == current, (
        "run: python -m common.reporting.readme_table"
    )
    assert regenerate_all(current) == current


def test_a_stale_decode_figure_is_caught():
    """A hand-edited number between the decode markers no longer matches the generator."""
    current = DOCUMENTS[0].read_text()
    block = current[current.index(DECODE_BEGIN) : current.index(DECODE_END)]
    assert " µs (" in block, "the README's decode block shows no measured cell"
    cell = block[block.index("| ", block.index("|---|")) :].split(" µs")[0].split("| ")[-1]
    edited = current.replace(f"| {cell} µs", f"| {float(cell) + 1:.1f} µs", 1)
    assert regenerate_all(edited) != edited


def _write_run(folder: Path, triton: str, rows: list[tuple[str, str, bool, float]]) -> None:
    folder.mkdir(parents=True)
    records = []
    for impl, status, causal, tflops in rows:
        stack, rung = impl.split("/")
        records.append(
            {"impl": impl, "stack": stack, "rung": rung, "batch": 2, "heads": 16, "seqlen_q": 8192,
             "seqlen_k": 8192, "head_dim": 128, "dtype": "bf16", "causal": causal, "status": status,
             "reason": "", "tflops": tflops, "error_rule": "", "variant": "block+rotation" if rung == "fp8" else ""}
        )  # fmt: skip
    pd.DataFrame.from_records(records).to_csv(folder / "results.csv", index=False)
    peaks = {"bf16_tflops": 788.0, "bf16_sustained_tflops": 678.0, "fp8_tflops": 1300.0, "fp8_sustained_tflops": None}
    (folder / "env.json").write_text(json.dumps({"triton": triton, "nvidia_cutlass_dsl": "4.8.1", "peaks": peaks}))


def test_table_has_a_column_per_stack_dashes_where_a_rung_is_absent_and_fa4_beside_sdpa(tmp_path: Path):
    rows = [
        (impl, "ok", causal, 500.0)
        for impl in ("triton/hopper", "gluon/hopper", "cute/hopper", "cute/fp8", "sdpa/cudnn", "fa4/sm90")
        for causal in (False, True)
    ] + [("flashinfer/decode", "skipped", causal, float("nan")) for causal in (False, True)]
    _write_run(tmp_path / "canonical", "3.6.0", rows[:2])
    _write_run(tmp_path / "canonical-triton-3.9", "3.9.0", rows)
    shown = tmp_path / "canonical-triton-3.9"
    table = results_table(shown / "results.csv", shown / "env.json")
    assert "| rung | Triton | Triton causal | Gluon | Gluon causal | CuTe DSL | CuTe DSL causal |" in table
    assert "| naive | — | — | — | — | — | — |" in table
    assert "| hopper | 500 | 500 | 500 | 500 | 500 | 500 |" in table
    baselines = table[table.index("| baseline |") :].splitlines()
    assert [line.split("|")[1].strip() for line in baselines[2:4]] == ["sdpa/cudnn", "fa4/sm90"]
    # A baseline with no passing row is named below the table, not a row of "skipped".
    assert "| flashinfer/decode |" not in table
    assert "Not run in this run: flashinfer/decode (skipped)." in table
    assert "bf16 GEMM 788 burst / 678 sustained, fp8 GEMM 1300 burst" in table
    # The other release is linked by its folder, its table not copied.
    assert f"Triton 3.6.0, CuTe DSL 4.8.1: `{tmp_path / 'canonical'}/`" in table
    assert table.count("| rung |") == 1 and table.count("| baseline |") == 1
    assert "FP8 quantisation that ran: cute/fp8 block+rotation." in table


def test_fp8_cells_show_end_to_end_beside_the_kernel_where_measured(tmp_path: Path):
    """compare.py's tflops_end_to_end (FP8: quantisation and kernel per call) appears beside the kernel
    figure, with a line saying what it is; rows without it (NaN) keep the kernel figure alone."""
    rows = [(impl, "ok", causal, 800.0) for impl in ("cute/hopper", "cute/fp8") for causal in (False, True)]
    _write_run(tmp_path / "canonical", "3.6.0", rows)
    csv_path = tmp_path / "canonical" / "results.csv"
    frame = pd.read_csv(csv_path)
    frame["tflops_end_to_end"] = [float("nan"), float("nan"), 731.4, 690.0]
    frame.to_csv(csv_path, index=False)
    table = results_table(csv_path, tmp_path / "canonical" / "env.json")
    assert "| hopper | 800 | 800 |" in table
    assert "| fp8 | 800 (e2e 731) | 800 (e2e 690) |" in table
    assert "(e2e N): end to end" in table


def _write_decode_run(folder: Path, records: list[dict]) -> None:
    folder.mkdir(parents=True)
    pd.DataFrame.from_records(records).to_csv(folder / "decode.csv", index=False)
    env = {"gpu": "NVIDIA H100 80GB HBM3", "triton": "3.6.0", "peaks": {"read_gbps": 3087.4, "bf16_tflops": 790.0}}
    (folder / "env.json").write_text(json.dumps(env))


def _decode_record(impl: str, batch: int, seqlen_k: int, status: str = "ok", us: float = 100.0, **extra) -> dict:
    case = f"B={batch} H=32 Hkv=8 Sq=1 Sk={seqlen_k} D=128 bf16 causal(bottom_right)" + extra.pop("suffix", "")
    measured = status in ("ok", "wrong")
    record = {"impl": impl, "case": case, "batch": batch, "heads": 32, "kv_heads": 8, "seqlen_k": seqlen_k}
    record.update(lengths="", status=status, us=us if measured else float("nan"), gbps=float("nan"))
    record.update(pct_read_bw=90.0 if measured else float("nan"), reason="")
    return {**record, **extra}


def test_decode_table_has_a_row_per_case_decode_rungs_first_and_names_what_did_not_run(tmp_path: Path):
    too_large = "needs about 160 GiB, over 80% of the GPU's 79 GiB"
    impls = ("sdpa/cudnn", "flashinfer/decode", "cute/hopper", "triton/decode")
    records = [_decode_record(impl, 1, 4096, us=192.5) for impl in impls]
    records += [_decode_record(impl, 64, 131072, "skipped", reason=too_large) for impl in impls]
    ragged = {"lengths": "32768 983 0", "suffix": " lengths=0..32768"}
    records += [_decode_record("triton/decode", 8, 32768, "wrong", us=247.3, **ragged)]
    records += [_decode_record(impl, 8, 32768, **ragged) for impl in impls[:3]]
    records[-3] = _decode_record("sdpa/cudnn", 8, 32768, "skipped", reason="refuses this problem", **ragged)
    _write_decode_run(tmp_path / "results" / "h100" / "decode", records)
    table = decode_tables(tmp_path)
    assert "Decode on the NVIDIA H100 80GB HBM3, H=32 Sq=1 D=128 bf16, Triton 3.6.0" in table
    assert "(3087 GB/s)" in table and "`results/h100/decode/decode.csv`" in table
    assert "| B | KV heads | cache | triton/decode | cute/hopper | sdpa/cudnn | flashinfer/decode |" in table
    assert "| 1 | 8 | 4k | 192.5 µs (90 %) | 192.5 µs (90 %) | 192.5 µs (90 %) | 192.5 µs (90 %) |" in table
    assert "| 64 | 8 | 128k | skipped | skipped | skipped | skipped |" in table
    # A wrong row keeps its time, marked; the ragged case says its lengths.
    assert (
        "| 8 | 8 | 32k ragged (0..32k) | 247.3 µs (90 %) (wrong) | 100.0 µs (90 %) | skipped | 100.0 µs (90 %) |"
        in table
    )
    assert f"- skipped ({too_large}): B=64, 8 KV heads, 128k: every implementation" in table
    assert "- skipped (refuses this problem): B=8, 8 KV heads, 32k ragged (0..32k): sdpa/cudnn" in table


def test_decode_cells_show_the_share_of_a_same_size_read_where_the_run_timed_one(tmp_path: Path):
    """A run with ``pct_read_floor`` (compare.py since 2026-12-06) shows it in each measured cell and says so in its
    heading; a row without one (NaN) shows the bandwidth share alone."""
    records = [_decode_record("triton/decode", 1, 4096, us=192.5, pct_read_floor=97.4)]
    records += [_decode_record("cute/decode", 1, 4096, us=200.0, pct_read_floor=float("nan"))]
    _write_decode_run(tmp_path / "results" / "h100" / "decode", records)
    table = decode_tables(tmp_path)
    assert "| 1 | 8 | 4k | 192.5 µs (90 %; 97 % of a same-size read) | 200.0 µs (90 %) |" in table
    assert "the share of a plain read of the same bytes timed in the same run." in table


def test_no_decode_run_says_so(tmp_path: Path):
    assert decode_tables(tmp_path) == "_No decode run committed yet._"


def test_decode_case_labels_name_paged_and_ragged_caches() -> None:
    import pandas as pd

    from common.reporting.decode_table import case_label

    base = {"seqlen_k": 32768, "lengths": "", "case": "B=8 H=32 Hkv=8 Sq=1 Sk=32768 D=128 bf16"}
    assert case_label(pd.Series(base)) == "32k"
    ragged = {**base, "lengths": "32768 0 1024"}
    assert case_label(pd.Series(ragged)) == "32k ragged (0..32k)"
    paged = {**ragged, "case": base["case"] + " paged(16) lengths=32768..32768"}
    assert case_label(pd.Series(paged)) == "32k paged (pages of 16)"


def test_generate_table_regenerates_byte_identically():
    current = README.read_text()
    table = generate_table(ROOT / GENERATE_CSV, ROOT)
    assert regenerate(current, table, GENERATE_BEGIN, GENERATE_END) == current, (
        "run: python -m common.reporting.readme_table"
    )


# The full sweep of 2026-11-28 (every stack, eager and static caches, rows that did not run): the
# tampering tests' fixed input, whichever run the README shows.
SWEEP_CSV = Path("results") / "h200" / "generate" / "results.csv"


def _copy_generate_run(root: Path) -> pd.DataFrame:
    """The committed full sweep copied under ``root``; its CSV as a frame to tamper with."""
    folder = root / SWEEP_CSV.parent
    folder.mkdir(parents=True)
    shutil.copy(ROOT / SWEEP_CSV.parent / "env.json", folder / "env.json")
    return pd.read_csv(ROOT / SWEEP_CSV)


def _case(frame: pd.DataFrame, impl: str, batch: int, cache: str) -> pd.Series:
    return (frame["impl"] == impl) & (frame["prompt"] == 8192) & (frame["batch"] == batch) & (frame["cache"] == cache)


def test_a_tampered_generate_csv_value_changes_the_table(tmp_path: Path):
    """The copy regenerates the committed table; doubling one tokens/s moves its cell and its ratio."""
    frame = _copy_generate_run(tmp_path)
    frame.to_csv(tmp_path / SWEEP_CSV, index=False)
    committed = generate_table(ROOT / SWEEP_CSV, ROOT)
    assert generate_table(tmp_path / SWEEP_CSV, tmp_path) == committed
    assert "| ladder:auto | 143 (0.76×) |" in committed
    frame.loc[_case(frame, "ladder:auto", 1, "dynamic"), "tokens_per_s"] *= 2
    frame.to_csv(tmp_path / SWEEP_CSV, index=False)
    tampered = generate_table(tmp_path / SWEEP_CSV, tmp_path)
    assert tampered != committed
    assert "| ladder:auto | 285 (1.53×) |" in tampered
    # The pick sentence above the table follows: sdpa now leads in 2 cases, ladder:auto in one more.
    assert "in 3 of the 4 cases; `ladder:triton` leads at B=8 static (1.42× `sdpa`)." in committed
    assert "in 2 of the 4 cases; `ladder:auto` leads at B=1 dynamic (1.53× `sdpa`); `ladder:triton`" in tampered


def test_a_generate_row_that_did_not_run_is_a_dash_named_under_the_table(tmp_path: Path):
    frame = _copy_generate_run(tmp_path)
    failed = _case(frame, "ladder:gluon", 8, "static")
    frame.loc[failed, ["status", "reason"]] = ["failed", "RuntimeError: planted"]
    frame.loc[failed, ["prefill_ms", "decode_ms_per_token", "tokens_per_s"]] = float("nan")
    frame.to_csv(tmp_path / SWEEP_CSV, index=False)
    table = generate_table(tmp_path / SWEEP_CSV, tmp_path)
    assert "| ladder:gluon | 168 (0.90×) | 108 (0.66×) | 859 (0.61×) | — | 31.8 |" in table
    assert "- ladder:gluon at B=8 static: failed (RuntimeError: planted)" in table
    assert "- eager at B=8 dynamic, B=8 static: skipped (eager's score matrices need about 130 GiB" in table
    assert "- flash in every case: skipped (flash_attention_4: ImportError:" in table
    assert "| flash |" not in table


# ---------------------------------------------------------------- every README block, pick sentences
def test_the_readme_shows_one_prefill_table_from_the_newest_tested_triton():
    """A fresh install gets the newest admitted Triton; the README's one prefill table is that release's run."""
    env = json.loads((CANONICAL_DIR / "env.json").read_text())
    assert env["triton"].rsplit(".", 1)[0] == TESTED_TRITON[-1]
    text = README.read_text()
    assert text.count("| rung | Triton |") == 1
    assert f"from `{(CANONICAL_DIR / 'results.csv').relative_to(ROOT)}`" in text


@pytest.mark.parametrize("markers", README_BLOCKS, ids=lambda pair: pair[0].split()[1].split(":")[0])
@pytest.mark.parametrize("where", ["pick sentence", "first table row"])
def test_a_hand_edited_figure_in_any_readme_block_is_restored(markers, where):
    """Each generated block opens with its pick sentence, which regenerates like its table: the last figure
    of either, changed by one digit, is put back by the generator (and so fails the byte-identity tests)."""
    current = README.read_text()
    begin, end = markers
    start = current.index(begin) + len(begin) + 1
    block = current[start : current.index(end)]
    first_line = block.splitlines()[0]
    assert not first_line.startswith("|"), f"{begin} does not open with its pick sentence"
    if where == "pick sentence":
        line = first_line
    else:
        lines = block.splitlines()
        line = lines[next(i for i, text in enumerate(lines) if text.startswith("|---")) + 1]
    last_digit = list(re.finditer(NUMBER, line))[-1].end() - 1
    edited_line = f"{line[:last_digit]}{(int(line[last_digit]) + 1) % 10}{line[last_digit + 1 :]}"
    edited = current[:start] + block.replace(line, edited_line, 1) + current[start + len(block) :]
    assert edited != current
    assert regenerate_all(edited) == current


def test_prefill_pick_names_the_fastest_rung_per_dtype_and_mask(tmp_path: Path):
    rows = [
        ("gluon/hopper", "ok", False, 700.0),
        ("gluon/hopper", "ok", True, 600.0),
        ("cute/hopper", "ok", False, 650.0),
        ("cute/hopper", "ok", True, 640.0),
        ("cute/fp8", "ok", False, 900.0),
        ("cute/fp8", "wrong", True, 999.0),
        ("gluon/fp8", "ok", True, 800.0),
        ("sdpa/cudnn", "ok", False, 600.0),
        ("sdpa/cudnn", "ok", True, 500.0),
    ]
    _write_run(tmp_path / "run", "3.9.0", rows)
    pick = prefill_pick(pd.read_csv(tmp_path / "run" / "results.csv"))
    assert pick.startswith("Prefill: in bf16 use `gluon/hopper` (700 TFLOP/s) non-causal, `cute/hopper` (640) causal;")
    assert "the fastest baseline is `sdpa/cudnn` (600 TFLOP/s, 500 causal)" in pick
    # A wrong row never wins, however fast it was.
    assert "`cute/fp8` (900 TFLOP/s) non-causal, `gluon/fp8` (800) causal, kernel alone." in pick


def _copy(relative: Path, root: Path) -> Path:
    """The committed file at ``relative`` (and its env.json) copied under ``root``; the copy's path."""
    target = root / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / relative, target)
    if (ROOT / relative.parent / "env.json").exists():
        shutil.copy(ROOT / relative.parent / "env.json", target.parent / "env.json")
    return target


def test_decode_pick_reads_the_spread_of_the_decode_rungs(tmp_path: Path):
    """Slowing one decode rung at one large contiguous cache of the shown run widens the stated spread to match."""
    for path in sorted(ROOT.glob(DECODE_GLOB)):
        _copy(path.relative_to(ROOT), tmp_path)
    copy = tmp_path / DECODE_SHOWN  # the H200 run
    assert decode_block(tmp_path) == decode_block(ROOT)
    stated = re.search(r"within (\d+) % of one another", decode_block(ROOT))
    assert stated, decode_block(ROOT)
    frame = pd.read_csv(copy, dtype={"lengths": str})
    row = (frame["impl"] == "gluon/decode") & (frame["batch"] == 8) & (frame["seqlen_k"] == 131072)
    row &= frame["kv_heads"] == 32
    frame.loc[row, "us"] *= 1.5
    frame.to_csv(copy, index=False)
    rungs = frame["impl"].isin(["triton/decode", "gluon/decode", "cute/decode"])
    times = frame.loc[rungs & (frame["batch"] == 8) & (frame["seqlen_k"] == 131072) & (frame["kv_heads"] == 32), "us"]
    widened = round((times.max() / times.min() - 1) * 100)
    assert widened > int(stated[1]) and f"within {widened} % of one another" in decode_block(tmp_path)


def test_the_decode_block_shows_one_run_and_names_the_others(tmp_path: Path):
    """The shown run's table only; every other committed run by its GPU, Triton and commit; every run's table where
    the shown one is not committed."""
    runs = [_copy(path.relative_to(ROOT), tmp_path) for path in sorted(ROOT.glob(DECODE_GLOB))]
    block = decode_block(tmp_path)
    assert block.count("Decode on the ") == 1 and "Decode on the NVIDIA H200" in block
    assert "NVIDIA H100 80GB HBM3, Triton 3.6.0, commit 0b97fc6: `results/h100/decode/`" in block
    (tmp_path / DECODE_SHOWN).unlink()
    fallback = decode_block(tmp_path)
    assert fallback.count("Decode on the ") == len(runs) - 1 and "The same sweep on other" not in fallback


def test_context_parallel_block_regenerates_and_follows_its_csv(tmp_path: Path):
    current = README.read_text()
    assert regenerate(current, context_parallel_block(ROOT), CONTEXT_PARALLEL_BEGIN, CONTEXT_PARALLEL_END) == current
    runs = [_copy(path.relative_to(ROOT), tmp_path) for path in sorted(ROOT.glob(CONTEXT_PARALLEL_GLOB))]
    copy = runs[0]  # the two-H100 run
    committed = context_parallel_block(ROOT)
    assert context_parallel_block(tmp_path) == committed
    assert "use ring attention with `cute/hopper`" in committed and "at 7 of the 8" in committed
    # gluon/hopper made the fastest everywhere: the pick follows, the cell shows the new figure.
    frame = pd.read_csv(copy)
    gluon = (frame["method"] == "ring") & (frame["impl"] == "gluon/hopper")
    frame.loc[gluon, "tflops_per_gpu"] = 900.0
    frame.to_csv(copy, index=False)
    tampered = context_parallel_block(tmp_path)
    assert "use ring attention with `gluon/hopper`" in tampered and "at 8 of the 8" in tampered
    assert "| ring gluon/hopper | 900 (0.99) |" in tampered
    # A row that failed its check leaves its cell and is named under the table.
    frame.loc[gluon & (frame["tokens_per_gpu"] == 262144) & ~frame["causal"], "status"] = "wrong"
    frame.to_csv(copy, index=False)
    failed = context_parallel_block(tmp_path)
    assert "| ring gluon/hopper | — |" in failed
    assert "Not shown: ring gluon/hopper, full, 262144 tokens per GPU: wrong" in failed


def test_backward_block_regenerates_and_follows_its_csv(tmp_path: Path):
    current = README.read_text()
    assert regenerate(current, backward_table(ROOT / BACKWARD_CSV, ROOT), BACKWARD_BEGIN, BACKWARD_END) == current
    copy = _copy(BACKWARD_CSV, tmp_path)
    committed = backward_table(ROOT / BACKWARD_CSV, ROOT)
    assert backward_table(copy, tmp_path) == committed
    assert "| B=8 H=16 S=2048 D=128 causal | 291 | 387 | 451 | 220 | 402 | 465 |" in committed
    pick = (
        "fastest backward (`cute/hopper`) runs at 0.97-1.02× the fastest baseline's (`fa4/sm90`) TFLOP/s, "
        "ahead at 3 of 4"
    )
    assert pick in committed
    frame = pd.read_csv(copy)
    frame.loc[frame["impl"] == "triton/hopper", "bwd_tflops"] *= 2
    frame.loc[(frame["impl"] == "cute/hopper") & ~frame["causal"], "status"] = "failed"
    frame.to_csv(copy, index=False)
    tampered = backward_table(copy, tmp_path)
    assert "| B=2 H=16 S=8192 D=128 | 755 | 469 | failed | 303 | 530 | 602 |" in tampered
    assert "for speed use `triton/hopper`; it runs at 1.25-1.28× the fastest baseline's" in tampered
    # The ladder behind everywhere: the pick names the baseline.
    frame.loc[frame["impl"] == "triton/hopper", "bwd_tflops"] /= 4
    frame.loc[frame["impl"] == "cute/hopper", "bwd_tflops"] *= 0.9
    frame.to_csv(copy, index=False)
    behind = backward_table(copy, tmp_path)
    assert (
        "for speed use `fa4/sm90`; the ladder's fastest backward (`gluon/hopper`, `cute/hopper`) runs at 0.74-0.92×"
        in behind
    )
    # bench/backward.py's results.csv (named shapes) reads too.
    bench_run = backward_table(ROOT / "results" / "h200" / "backward" / "results.csv", ROOT)
    assert "| P1 | 380 | 377 | 419 | 169 | 169 | 535 | 303 | failed |" in bench_run
