"""bench/decode_splits.py without a GPU: its refusal, which rungs it sweeps, its shapes and its table."""

from __future__ import annotations

from bench.decode_splits import CHOSEN, SplitRow, decode_shapes, markdown, split_implementations
from common.contract.registry import discover


def test_it_sweeps_the_decode_rungs_that_take_a_forced_split_count_and_no_baseline() -> None:
    available, _ = discover()
    names = [impl.name for impl in split_implementations(available)]
    assert "triton/decode" in names
    assert all(name.endswith("/decode") for name in names)
    assert "flashinfer/decode" not in names


def test_the_shapes_are_the_four_of_the_issue() -> None:
    shapes = [(c.problem.batch, c.problem.kv_heads, c.problem.seqlen_k, c.lengths is not None) for c in decode_shapes()]
    assert shapes == [(1, 8, 131072, False), (8, 8, 32768, True), (64, 8, 32768, False), (1, 32, 4096, False)]
    ragged = decode_shapes()[1]
    assert len(ragged.lengths) == 8 and max(ragged.lengths) == 32768 and min(ragged.lengths) == 0
    assert all(case.problem.heads == 32 and case.problem.seqlen_q == 1 for case in decode_shapes())


def test_table_marks_the_fastest_count_and_compares_the_rules_choice_with_it() -> None:
    shape = "B=1 H=32 Hkv=8 Sq=1 Sk=131072 D=128 bf16 causal(bottom_right)"
    rows = [
        SplitRow("triton/decode", shape, "1", 1, "ok", us=900.0, pct_read_bw=20.0),
        SplitRow("triton/decode", shape, "16", 16, "ok", us=190.0, pct_read_bw=91.0),
        SplitRow("triton/decode", shape, "64", 64, "wrong", us=180.0, pct_read_bw=95.0, reason="planted"),
        SplitRow("triton/decode", shape, CHOSEN, 8, "ok", us=209.0, pct_read_bw=83.0),
    ]
    table = markdown(rows, 3087.0, "NVIDIA H100 80GB HBM3")
    assert "(3087 GB/s)" in table and "NVIDIA H100 80GB HBM3" in table
    assert "| shape | 1 split | 16 splits | 64 splits | rule's choice | choice / fastest |" in table
    # The wrong count is not a candidate for fastest: it shows its status, not a time.
    assert f"| {shape} | 900.0 (20 %) | **190.0 (91 %)** | wrong | 8: 209.0 (83 %) | 1.10 |" in table


def test_table_adds_the_share_of_the_roofline_where_the_flops_set_it() -> None:
    shape = "B=32 H=512 Hkv=32 Sq=16 Sk=4352 D=64 bf16 causal(bottom_right)"
    rows = [
        SplitRow("gluon/decode", shape, "1", 1, "ok", us=200.0, pct_read_bw=30.0, pct_roofline=50.0),
        SplitRow("gluon/decode", shape, CHOSEN, 1, "ok", us=200.0, pct_read_bw=30.0, pct_roofline=30.0),
    ]
    assert f"| {shape} | **200.0 (30 %; 50 % roofline)** | 1: 200.0 (30 %) | 1.00 |" in markdown(rows, 4410.0, "H200")
