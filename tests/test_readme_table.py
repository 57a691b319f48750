"""The README's results table is exactly what the committed canonical CSV regenerates."""

from __future__ import annotations

from common.readme_table import CANONICAL_DIR, README, regenerate, results_table


def test_readme_table_regenerates_byte_identically():
    current = README.read_text()
    table = results_table(CANONICAL_DIR / "results.csv", CANONICAL_DIR / "env.json")
    assert regenerate(current, table) == current, "run: python -m common.readme_table"
