"""bench/decode_fewpairs.py's plan on the CPU (132 SMs): which settings it times on which rows, that a
setting whose plan an earlier one already has is not timed again, and that each switch is restored."""

from __future__ import annotations

import importlib

import pytest
import torch

from bench import decode_fewpairs

CPU = torch.device("cpu")


def _plans(impl_name: str) -> list[dict[str, tuple[int, int | None, str]]]:
    module = importlib.import_module(decode_fewpairs.RUNG_MODULES[impl_name])
    return [
        {setting: (splits, forced, same) for setting, splits, forced, same in decode_fewpairs.planned_settings(
            impl_name, module, case.problem, index, CPU)}
        for index, case in enumerate(decode_fewpairs.cases())
    ]  # fmt: skip


def test_cases_are_seed_31s_low_rows_and_the_two_controls():
    described = [case.describe() for case in decode_fewpairs.cases()]
    assert [d.split(" D=")[0] for d in described] == [
        "B=3 H=8 Sq=8 Sk=13312", "B=8 H=32 Hkv=8 Sq=4 Sk=8704", "B=1 H=32 Hkv=8 Sq=1 Sk=131072",
        "B=16 H=1 Sq=8 Sk=147456", "B=64 H=32 Hkv=8 Sq=1 Sk=32768",
    ]  # fmt: skip
    assert "paged(32)" in described[3]


@pytest.mark.parametrize("impl_name", list(decode_fewpairs.RUNG_MODULES))
def test_each_plan_is_timed_once_and_the_switches_are_restored(impl_name: str):
    module = importlib.import_module(decode_fewpairs.RUNG_MODULES[impl_name])
    committed = {name: getattr(module, name) for name in ("FEWER_WAVES", "SPLIT_CTAS_PER_SM")}
    for plans in _plans(impl_name):
        timed = [splits for splits, _, same in plans.values() if not same]
        assert len(timed) == len(set(timed)), plans
        for splits, _, same in plans.values():
            assert not same or (plans[same][0] == splits and not plans[same][2]), plans
    assert {name: getattr(module, name) for name in committed} == committed


def test_fewer_waves_and_forced_counts_where_expected():
    gluon, cute, triton = (_plans(name) for name in ("gluon/decode", "cute/decode", "triton/decode"))
    # B=3 Hkv=8 13k: 11 splits by the rule, 5 with fewer_waves (cute; gluon's default since the A/B);
    # triton's 264 slots keep 11.
    assert gluon[0]["default"][0] == 5 and gluon[0]["fewer-waves"] == (5, None, "default")
    assert cute[0]["default"][0] == 11 and cute[0]["fewer-waves"] == (5, None, "")
    assert triton[0]["fewer-waves"] == (11, None, "default")
    # cute's slots-2 changes B=8 group 4 (2 -> 4) and the 128k control (16 -> 32).
    assert (cute[1]["slots-2"][0], cute[2]["slots-2"][0]) == (4, 32)
    # Forced counts on seed 31's rows only; the ragged row fewer only, triton's from its balanced shares.
    assert set(gluon[3]) == {"default", "fewer-waves", "quarter", "half"} and gluon[3]["quarter"][1] == 32
    assert triton[3]["default"][0] == 264 and triton[3]["half"][1] == 132
    assert "double" not in triton[2] and "double" not in triton[4]
