"""README.md and docs/ladder.md carry exactly the table the committed canonical CSV regenerates."""

from __future__ import annotations

import pytest

from common.readme_table import CANONICAL_DIR, DOCUMENTS, regenerate, results_table


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_results_table_regenerates_byte_identically(document):
    current = document.read_text()
    table = results_table(CANONICAL_DIR / "results.csv", CANONICAL_DIR / "env.json")
    assert regenerate(current, table) == current, "run: python -m common.readme_table"
