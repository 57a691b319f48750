"""The static half of the tradeoff table: code-line counting and the side-by-side pairing."""

from __future__ import annotations

import math

import pandas as pd

from common.reporting.static import PTX_FEATURES, StaticRow, ptx_features
from common.reporting.tradeoffs import code_lines, side_by_side

SOURCE = '''"""Module docstring,
over two lines."""

import math  # a comment


def area(radius: float) -> float:
    """Docstring."""
    # a comment line
    return math.pi * (
        radius**2
    )
'''


def test_code_lines_skip_blanks_comments_and_docstrings():
    assert code_lines(SOURCE) == 5


def test_ptx_features_recognise_the_ladder_instructions():
    ptx = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {...};\ncp.async.cg.shared.global [a], [b], 16;"
    found = ptx_features(ptx)
    assert found["mma.sync"] and found["cp.async"]
    assert not found["wgmma.mma_async"] and not found["cp.async.bulk.tensor"]
    assert ptx_features("wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {...};")["e4m3 mma"]


def test_side_by_side_pairs_stacks_per_rung_with_ratio():
    table = pd.DataFrame(
        [
            {"impl": "triton/tiled", "stack": "triton", "rung": "tiled", "loc": 100, "tflops": 300.0},
            {"impl": "cute/tiled", "stack": "cute", "rung": "tiled", "loc": 250, "tflops": 90.0},
        ]
    )
    pairs = side_by_side(table).set_index(["rung", "metric"])
    assert pairs.loc[("tiled", "loc"), "cute/triton"] == 2.5
    assert math.isclose(pairs.loc[("tiled", "tflops"), "cute/triton"], 0.3)
    assert ("naive", "loc") not in pairs.index


def test_static_row_features_cover_every_family():
    row = StaticRow("cute/hopper", 1, 0.5, 168, 0, 1024, 384, dict.fromkeys(PTX_FEATURES, False))
    assert set(row.features) == set(PTX_FEATURES)


def test_side_by_side_has_a_column_per_stack_and_nan_where_a_stack_lacks_the_rung():
    table = pd.DataFrame(
        [
            {"impl": "triton/tiled", "stack": "triton", "rung": "tiled", "loc": 100, "tflops": 300.0},
            {"impl": "cute/tiled", "stack": "cute", "rung": "tiled", "loc": 250, "tflops": 90.0},
            {"impl": "triton/hopper", "stack": "triton", "rung": "hopper", "loc": 200, "tflops": 500.0},
            {"impl": "gluon/hopper", "stack": "gluon", "rung": "hopper", "loc": 300, "tflops": 600.0},
            {"impl": "cute/hopper", "stack": "cute", "rung": "hopper", "loc": 400, "tflops": 650.0},
        ]
    )
    pairs = side_by_side(table)
    assert list(pairs.columns) == ["rung", "metric", "triton", "gluon", "cute", "gluon/triton", "cute/triton"]
    pairs = pairs.set_index(["rung", "metric"])
    tiled = pairs.loc[("tiled", "tflops")]
    assert math.isnan(tiled["gluon"]) and math.isnan(tiled["gluon/triton"])
    assert math.isclose(pairs.loc[("hopper", "tflops"), "gluon/triton"], 1.2)
