"""bench/decode_seeds.py without a GPU: the lowest share per decode rung over random-sweep runs, from synthetic CSVs.

Each rule of the tool has a row that would break it: a row under the MB threshold (left out of the lowest), a row at
the target (counted), a row whose fp64 check failed (named, and the exit status 1, never dropped), a rung skipped
throughout (left out), a run without env.json (its tree "—"), and a second run whose lower row becomes the rung's
lowest over every run.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from bench import decode_seeds

COLUMNS = ("impl", "case", "status", "us", "gbps", "pct_read_bw", "pct_roofline")


def _run(folder: Path, rows: list[tuple], tree: str | None = "abcdef0123") -> Path:
    folder.mkdir()
    with (folder / "decode.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    if tree is not None:
        (folder / "env.json").write_text(json.dumps({"git_commit": tree}))
    return folder


@pytest.fixture
def runs(tmp_path: Path) -> list[Path]:
    # gbps × us / 1e3 = MB read: 4000 × 100 µs = 400 MB; 4000 × 10 µs = 40 MB (under 128).
    first = _run(tmp_path / "seed1", [
        ("triton/decode", "big-fast", "ok", 100, 4000, 92.0, 92.0),
        ("triton/decode", "big-slow", "ok", 100, 4000, 50.0, 80.0),
        ("triton/decode", "small-slowest", "ok", 10, 4000, 10.0, 10.0),
        ("cute/decode", "big-wrong", "wrong", 100, 4000, 99.0, 99.0),
        ("cute/decode", "big-ok", "ok", 100, 4000, 70.0, ""),
        ("flashinfer/decode", "big-fast", "skipped", "nan", "nan", "nan", "nan"),
        ("sdpa/cudnn", "big-fast", "ok", 100, 4000, 5.0, 5.0),
    ])  # fmt: skip
    second = _run(tmp_path / "seed2", [("triton/decode", "big-slower", "ok", 200, 4000, 40.0, 40.0)], tree=None)
    return [first, second]


def test_each_run_and_rung_counts_only_the_large_rows_and_names_the_failed_ones(runs: list[Path]):
    summaries = {(s.run, s.impl): s for s in decode_seeds.read_run(runs[0], 128.0)}
    assert set(summaries) == {("seed1", "triton/decode"), ("seed1", "cute/decode")}  # no skipped rung, no baseline
    triton = summaries["seed1", "triton/decode"]
    assert (triton.tree, triton.rows, triton.at_target) == ("abcdef0", 2, 1)
    assert (triton.lowest_pct, triton.lowest_roofline_pct, triton.lowest_case) == (50.0, 80.0, "big-slow")
    cute = summaries["seed1", "cute/decode"]
    assert (cute.rows, cute.lowest_case, cute.not_ok) == (1, "big-ok", ("big-wrong: wrong",))
    assert decode_seeds.read_run(runs[1], 128.0)[0].tree == "—"


def test_the_table_gives_the_lowest_over_every_run_and_a_failed_check_fails_the_tool(runs: list[Path], capsys):
    out = runs[0].parent / "table.md"
    assert decode_seeds.main([*map(str, runs), "--out", str(out)]) == 1  # seed1's cute row failed its check
    table = out.read_text()
    assert table == capsys.readouterr().out
    assert "| triton/decode | 40 % (40 %) | seed2 | big-slower |" in table
    assert "| seed1 | abcdef0 | triton/decode | 2 | 1 | 50 % (80 %) | big-slow | — |" in table
    assert "| seed1 | abcdef0 | cute/decode | 1 | 0 | 70 % | big-ok | big-wrong: wrong |" in table
    assert decode_seeds.main([str(runs[1])]) == 0


def test_a_folder_without_a_csv_is_refused_by_name(tmp_path: Path, capsys):
    with pytest.raises(SystemExit) as refused:
        decode_seeds.main([str(tmp_path)])
    assert refused.value.code == 2 and f"expected folders with a decode.csv, got {tmp_path}" in capsys.readouterr().err
