"""cute/decode's ``SHORT_CACHE_ONE_SPLIT`` (on at D=64 and 128 since the twenty-sixth stop's A/B,
``bench/cute_decode_short_one_split_ab.sh``; issue #38's seed 5309 row 1: cute/decode 53 % of the read bandwidth on
short paged ragged caches where triton/decode and gluon/decode read 66 %, gluon through the same switch of its own).

CPU: the switch is on at D=64 and 128 only; on, the split rule keeps a short cache whose items fill a wave in one
split, so seed 5309's row 1 leaves the balanced split (528 target shares on 1024 items) for one padded split, as
gluon/decode plans it; the A/B script's rows (timed with the switch at every head dim) are each moved that way but its
last, the full-cache control, whose plan stays; a D=256 row keeps the balanced split (planted: without the head-dim
limit it moves).
"""

from __future__ import annotations

import pytest
import torch

from bench.decode_knob_ab import parse_row
from bench.decode_ragged_ab import plan_of
from cute_impl import decode as cute_decode
from tests._helpers import knob_ab_words

CPU = torch.device("cpu")
SCRIPT, NAME = "cute_decode_short_one_split_ab.sh", "short_one_split"


def _plans(row: str, monkeypatch: pytest.MonkeyPatch) -> tuple[tuple, tuple]:
    """cute/decode's plan of a ``SEED/INDEX`` row with the switch off and on."""
    case = parse_row(row)[1]
    plans = []
    for on in (False, True):
        monkeypatch.setattr(cute_decode, "SHORT_CACHE_ONE_SPLIT", on)
        plans.append(plan_of("cute/decode", case.problem, case.lengths, CPU))
    return plans[0], plans[1]


def _moved(off: tuple, on: tuple) -> bool:
    return off[0] == "balanced" and on == ("padded", 1)


def test_the_switch_is_on_and_takes_seed_5309_row_1_to_gluons_plan(monkeypatch: pytest.MonkeyPatch):
    assert cute_decode.SHORT_CACHE_ONE_SPLIT is True and cute_decode.SHORT_CACHE_ONE_SPLIT_HEAD_DIMS == (64, 128)
    case = parse_row("5309/1")[1]
    assert plan_of("cute/decode", case.problem, case.lengths, CPU) == ("padded", 1)
    off, on = _plans("5309/1", monkeypatch)
    assert off[:2] == ("balanced", 528) and on == ("padded", 1), (off[:2], on)
    case = parse_row("5309/1")[1]
    assert plan_of("gluon/decode", case.problem, case.lengths, CPU) == ("padded", 1)


def test_a_d256_row_keeps_the_balanced_split(monkeypatch: pytest.MonkeyPatch):
    """211/7 (D=256, 1.25x the time in one split): balanced as committed; planted: every head dim moves it."""
    case = parse_row("211/7")[1]
    assert plan_of("cute/decode", case.problem, case.lengths, CPU)[0] == "balanced"
    monkeypatch.setattr(cute_decode, "SHORT_CACHE_ONE_SPLIT_HEAD_DIMS", (64, 128, 256))
    assert plan_of("cute/decode", case.problem, case.lengths, CPU) == ("padded", 1)


def test_the_ab_scripts_rows_move_but_the_control(monkeypatch: pytest.MonkeyPatch):
    """As the A/B ran them: the switch at every head dim."""
    monkeypatch.setattr(cute_decode, "SHORT_CACHE_ONE_SPLIT_HEAD_DIMS", (64, 128, 256))
    words = knob_ab_words(SCRIPT, NAME)
    assert words[1:4] == ["cute_impl.decode:SHORT_CACHE_ONE_SPLIT", "False,True", "cute/decode"], words[:4]
    rows, control = words[4:-1], words[-1]
    assert rows[0] == "5309/1" and len(rows) == 13
    for row in rows:
        off, on = _plans(row, monkeypatch)
        assert _moved(off, on), (row, off[:2], on)
    off, on = _plans(control, monkeypatch)
    assert off == on and not _moved(off, on), (control, off[:2], on[:2])
