"""bench/decode_items_model.py without a GPU: its tiles carry the bytes a step must read once where an item's M tiles
share K and V in L2, once per M tile where they do not, and the fluid model's bandwidth is left as it was found."""

from __future__ import annotations

import argparse

import pytest

from bench import decode_items_model, decode_model
from common.measure.decode_sweep import random_cases

# Seed 6007's row 4: B=32 Hkv=32, 128 packed rows (two M tiles an item), ragged lengths.
ROW = random_cases(5, 6007)[4]
M_TILES = 2


def test_the_tiles_carry_the_bytes_once_shared_and_once_per_m_tile_apart() -> None:
    once = ROW.kv_bytes_read / 1e6
    assert sum(decode_items_model.tile_megabytes(ROW, l2_shared=True, longest_first=False)) == pytest.approx(once)
    apart = decode_items_model.tile_megabytes(ROW, l2_shared=False, longest_first=False)
    assert sum(apart) == pytest.approx(M_TILES * once)
    assert len(apart) == M_TILES * ROW.problem.batch * ROW.problem.kv_heads
    longest = decode_items_model.tile_megabytes(ROW, l2_shared=False, longest_first=True)
    assert longest == sorted(apart, reverse=True)


def test_apart_reads_twice_the_bytes_so_it_models_slower_and_the_bandwidth_is_restored() -> None:
    args = argparse.Namespace(read_gbps=3108.0, slots=264, fixed_us=2.0, in_flight=5)
    before = decode_model.READ_GBPS
    shared = decode_items_model.modelled_pct(ROW, args, l2_shared=True, longest_first=False)
    apart = decode_items_model.modelled_pct(ROW, args, l2_shared=False, longest_first=False)
    assert before == decode_model.READ_GBPS
    # Twice the bytes at the same bandwidth: about half the share (the fixed costs and the tail move it a little).
    assert 0.45 < apart / shared < 0.6, (shared, apart)


def test_a_planted_tile_count_that_drops_the_second_m_tile_fails_the_byte_rule(monkeypatch) -> None:
    monkeypatch.setattr(decode_items_model, "BLOCK_M", 128)
    apart = decode_items_model.tile_megabytes(ROW, l2_shared=False, longest_first=False)
    assert sum(apart) != pytest.approx(M_TILES * ROW.kv_bytes_read / 1e6)
