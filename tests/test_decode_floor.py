"""bench/decode_model.py and bench/decode_floor.py without a GPU: the model's grid layout and merge cost,
the A/B's refusal, its settings (set and restored), its table, and its rounds (the loop every decode A/B times in:
each setting prepared once, then checked and timed once a round, the order reversed every other round)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from bench import decode_floor, decode_model
from common.measure.decode_sweep import DecodeCase, decode_problem, random_cases
from cute_impl import decode as cute_decode
from triton_impl import decode as triton_decode
from triton_impl.gluon import decode as gluon_decode

RAGGED = DecodeCase(decode_problem(3, 4096, 2, ragged=True, heads=8), (4096, 0, 1000))


def _broken_split_keys(length: int, split: int, num_splits: int, block_n: int) -> int:
    """Planted: blocks per split rounded down, so the last blocks of a sequence belong to no split."""
    per_split = -(-length // block_n) // num_splits
    begin = min(split * per_split * block_n, length)
    return min(begin + per_split * block_n, length) - begin


@pytest.mark.parametrize("num_splits", [1, 3, 7])
def test_model_grid_reads_every_key_once(num_splits: int):
    """The modelled CTAs of triton/decode (no padding past a sequence's end) read exactly the bytes a step
    needs, the figure the percentage divides; gluon's TMA reads whole blocks, at least as many."""
    triton, gluon, _ = decode_model.stack_models(128)
    assert sum(decode_model.cta_bytes(RAGGED, triton, num_splits)) == RAGGED.kv_bytes_read
    assert sum(decode_model.cta_bytes(RAGGED, gluon, num_splits)) >= RAGGED.kv_bytes_read
    assert len(decode_model.cta_bytes(RAGGED, triton, num_splits)) == 3 * 2 * num_splits


def test_model_grid_check_fails_a_planted_split_cut(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(decode_model, "split_keys", _broken_split_keys)
    triton = decode_model.stack_models(128)[0]
    assert sum(decode_model.cta_bytes(RAGGED, triton, 7)) < RAGGED.kv_bytes_read


def test_model_merge_steps_and_one_split():
    """One split has no merge; the merge's round trips fall with the splits read a step; cute's merge
    before was unrolled by the compiler (LSE loop 16, O loop 2 a step)."""
    triton, _, cute = decode_model.stack_models(128)
    assert decode_model.merge_us(triton, 1) == 0.0
    assert decode_model.merge_steps(triton, 24) == 25 and decode_model.merge_steps(cute, 24) == 2 + 12
    after = decode_model.stack_models(128, merge_splits_per_step=8)
    assert [decode_model.merge_steps(stack, 24) for stack in after] == [4, 4, 6]
    assert decode_model.merge_us(after[0], 24) < decode_model.merge_us(triton, 24)
    prediction = decode_model.predict(RAGGED, triton, 3)
    assert 0 < prediction.pct < 100 and prediction.busy_ctas == 2 * (3 + 3)


def test_floor_settings_are_applied_then_restored():
    committed = (triton_decode.MERGE_SPLITS_PER_STEP, cute_decode.MERGE_SPLITS_PER_STEP)
    tiles = (gluon_decode.DEFAULT_CONFIGS[128], triton_decode.DEFAULT_CONFIGS[64])
    assert committed == (8, 8)
    with decode_floor.applied("before", "gluon/decode", 128):
        assert (triton_decode.MERGE_SPLITS_PER_STEP, cute_decode.MERGE_SPLITS_PER_STEP) == (1, 0)
        assert gluon_decode.DEFAULT_CONFIGS[128] == tiles[0]
    with pytest.raises(RuntimeError), decode_floor.applied("after+tile", "gluon/decode", 128):
        assert gluon_decode.DEFAULT_CONFIGS[128] == gluon_decode.DecodeConfig(64, 3)
        raise RuntimeError("a failing bind")
    with decode_floor.applied("after+tile", "triton/decode", 64):
        assert triton_decode.DEFAULT_CONFIGS[64].block_n == 128 and gluon_decode.DEFAULT_CONFIGS[128] == tiles[0]
    assert committed == (triton_decode.MERGE_SPLITS_PER_STEP, cute_decode.MERGE_SPLITS_PER_STEP)
    assert tiles == (gluon_decode.DEFAULT_CONFIGS[128], triton_decode.DEFAULT_CONFIGS[64])
    assert not decode_floor.applies("after+tile", "gluon/decode", 64, 0)  # its 64-key tile is the default now
    assert not decode_floor.applies("after+tile", "gluon/decode", 256, 0)
    assert not decode_floor.applies("after+tile", "triton/decode", 128, 0)
    assert not decode_floor.applies("after+tile", "cute/decode", 64, 0)
    with decode_floor.applied("two-launch", "triton/decode", 128):
        assert not triton_decode.FUSED_MERGE and triton_decode.MERGE_SPLITS_PER_STEP == 8
    assert triton_decode.FUSED_MERGE
    assert decode_floor.applies("two-launch", "triton/decode", 64, 0)
    assert not decode_floor.applies("two-launch", "cute/decode", 64, 0)
    assert decode_floor.applies("after+splits", "gluon/decode", 128, 4)
    assert not decode_floor.applies("after+splits", "triton/decode", 128, 4)


def test_floor_table_has_a_column_per_setting():
    shape = RAGGED.describe()
    rows = [
        {"impl": "gluon/decode", "shape": shape, "setting": "before", "num_splits": 4, "status": "ok", "us": 120.0,
         "pct_read_bw": 66.0},
        {"impl": "gluon/decode", "shape": shape, "setting": "after", "num_splits": 4, "status": "wrong", "us": 90.0,
         "pct_read_bw": 88.0},
    ]  # fmt: skip
    table = decode_floor.markdown(rows, 4419.0)
    header = "| shape | rung | splits | before | after | two-launch | after+tile | after+splits |"
    assert "(4419 GB/s)" in table and header in table
    assert f"| {shape} | gluon/decode | 4 | 120.0 µs (66 %) | wrong | — | — | — |" in table


def test_floor_model_splits_name_timed_shapes_and_beat_the_rule_in_the_model():
    """Each forced count of ``after+splits`` names a shape the run times; one is recomputed: B=32 Hkv=32
    ragged, gluon/decode at one split against the rule's two."""
    assert all(index in decode_floor.SHAPES for index, _ in decode_floor.MODEL_SPLITS)
    case = random_cases(5, decode_floor.SEED)[4]
    gluon = decode_model.stack_models(128, merge_splits_per_step=8)[1]
    assert decode_floor.MODEL_SPLITS[4, "gluon/decode"] == 1 and decode_model.rule_splits(case, gluon) == 2
    assert decode_model.predict(case, gluon, 1).pct > decode_model.predict(case, gluon, 2).pct + 3


def test_floor_balanced_settings_turn_the_knob_for_triton_only_and_restore_it():
    committed = (triton_decode.BALANCED_SPLIT, triton_decode.BALANCED_SHARES_PER_SM)
    assert committed == ("ragged-split-long", 2)
    with decode_floor.applied("after", "triton/decode", 128):
        assert triton_decode.BALANCED_SPLIT == "never"
    with decode_floor.applied("balanced-4", "triton/decode", 128):
        assert (triton_decode.BALANCED_SPLIT, triton_decode.BALANCED_SHARES_PER_SM) == ("always", 4)
    with pytest.raises(RuntimeError), decode_floor.applied("balanced", "triton/decode", 128):
        assert (triton_decode.BALANCED_SPLIT, triton_decode.BALANCED_SHARES_PER_SM) == ("always", 2)
        raise RuntimeError("a failing bind")
    assert committed == (triton_decode.BALANCED_SPLIT, triton_decode.BALANCED_SHARES_PER_SM)
    assert decode_floor.applies("balanced", "triton/decode", 64, 0)
    assert not decode_floor.applies("balanced", "gluon/decode", 64, 0)


@pytest.mark.parametrize("target", [1, 5, 64])
def test_model_balanced_grid_reads_every_key_once(target: int):
    """The modelled balanced grid (triton/decode's ``balanced_share`` in Python) holds every share of the
    ragged case in target + B · Hkv CTAs, each item's shares consecutive, and reads each key once."""
    shares = decode_model.balanced_share_keys(RAGGED, 64, target, 64)
    p = RAGGED.problem
    assert len(shares) == target + p.batch * p.kv_heads
    items = [item for item, _ in shares if item >= 0]
    assert items == sorted(items) and set(items) == set(range(p.batch * p.kv_heads))
    bytes_per_key = 2 * p.head_dim * p.dtype.itemsize
    assert sum(keys for _, keys in shares) * bytes_per_key == RAGGED.kv_bytes_read


def test_floor_fifth_settings_set_each_rungs_switches_and_restore_them():
    with pytest.raises(RuntimeError), decode_floor.applied("fifth", "gluon/decode", 128):
        assert gluon_decode.SPLIT_CTAS_PER_SM == 2 and gluon_decode.SHORT_CACHE_TILE
        assert gluon_decode.SHORT_CACHE_ONE_SPLIT and triton_decode.SPLIT_CTAS_PER_SM == 2  # not its rung: as committed
        raise RuntimeError("a failing bind")
    with decode_floor.applied("deep-ring", "triton/decode", 64):
        assert triton_decode.DEEP_RING and not triton_decode.SHORT_CACHE_ONE_SPLIT
    committed = {
        triton_decode: (2, False, False, False),
        gluon_decode: (2, True, None, True),
        cute_decode: (1, True, None, None),
    }
    for module, values in committed.items():
        assert values == tuple(getattr(module, name, None) for name in decode_floor.FIFTH_OFF)
        with decode_floor.applied("after", module.IMPLEMENTATION.name, 128):
            off = tuple(getattr(module, name, None) for name in decode_floor.FIFTH_OFF)
            expected = zip(values, decode_floor.FIFTH_OFF.values(), strict=True)
            assert off == tuple(None if v is None else w for v, w in expected)
    assert not decode_floor.applies("deep-ring", "cute/decode", 64, 0)
    assert not decode_floor.applies("short-tile", "cute/decode", 128, 0)


def test_floor_fifth_settings_time_only_new_plans():
    """Seed 29's B=4 Hkv=2 D=64 276k: triton/decode times slots-2 (32 splits) and deep-ring (16 splits, 6
    stages), not fifth (slots-2's plan again) nor one-split (a long cache); B=32 MHA 1k ragged: gluon/decode
    and triton/decode one-split, short-tile and fifth (both), cute/decode one-split only; triton/decode's
    committed balanced split (ragged) alone and on the short tile."""
    cases = random_cases(8, 29)
    fifth = ["after", *decode_floor.FIFTH_SETTINGS]
    cpu = torch.device("cpu")

    def timed(impl_name: str, case: DecodeCase) -> list[str]:
        settings = [s for s in fifth if decode_floor.applies(s, impl_name, case.problem.head_dim, 0)]
        return decode_floor.fifth_settings_to_time(settings, impl_name, case.problem, cpu)

    assert timed("triton/decode", cases[6]) == ["after", "slots-2", "deep-ring"]
    assert timed("cute/decode", cases[6]) == ["after", "slots-2"]
    assert timed("gluon/decode", cases[7]) == ["after", "one-split", "short-tile", "fifth"]
    assert timed("triton/decode", cases[7]) == [
        "after", "one-split", "short-tile", "fifth", "committed", "balanced+short-tile",
    ]  # fmt: skip
    assert timed("triton/decode", cases[6])[-1] == "deep-ring"  # full cache: the committed split is after's
    assert timed("cute/decode", cases[7]) == ["after", "one-split"]
    with decode_floor.applied("after", "triton/decode", 64):
        after = decode_floor.plan_signature("triton/decode", cases[6].problem, cpu)
    assert after == (16, triton_decode.DEFAULT_CONFIGS[64], 3)
    # As committed (two CTA slots an SM): slots-2's plan.
    assert decode_floor.plan_signature("triton/decode", cases[6].problem, cpu)[0] == 32


def test_model_fifth_variants_match_the_rungs_plans():
    """The model's fifth-stop variants are the plans the rungs' switches make (seed 29's B=4 Hkv=2 D=64 276k:
    32 splits with two slots, five blocks in flight with the deep ring; B=32 MHA 1k ragged: one split, the
    short rings), and the model ranks the triton/decode fix above the committed plan on the first."""
    cases = random_cases(8, 29)
    triton, _, cute = decode_model.stack_models(64, 8)
    variants = decode_model.fifth_variants(cases[6], triton)
    assert variants["slots-2"][1] == 32 and variants["deep-ring"][0].in_flight_blocks == 5
    assert variants["one-split"] is None and variants["short-tile"] is None and variants["fifth"] is None
    after = decode_model.predict(cases[6], *variants["after"]).pct
    assert decode_model.predict(cases[6], *variants["deep-ring"]).pct > after + 20
    assert decode_model.fifth_variants(cases[6], cute)["deep-ring"] is None
    short = decode_model.fifth_variants(cases[7], decode_model.stack_models(128, 8)[1])
    assert short["one-split"][1] == 1 and short["short-tile"][0].occupancy == 2 and short["fifth"][1] == 1


def test_floor_prepare_failure_is_a_row_not_a_crash():
    class Workload:
        q = k = v = None

    class Failing:
        def prepare(self, *args, **kwargs):
            raise RuntimeError("out of shared memory\nmore")

    class Working:
        def prepare(self, *args, **kwargs):
            return None

    failed = decode_floor.prepared(Failing(), Workload(), RAGGED.problem, {})
    assert failed[0] == "failed" and failed[4] == "prepare: RuntimeError: out of shared memory"
    assert decode_floor.prepared(Working(), Workload(), RAGGED.problem, {}) is None


def _rounds_in_one_order(runs: dict, rounds: int, measure) -> dict:
    """Planted: the decode A/B's loop as it was before it called ``bench.interleaved``, every round in one order."""
    samples: dict = {key: [] for key in runs}
    for _ in range(rounds):
        for key, run in runs.items():
            samples[key].append(measure(run))
    return samples


def _floor_rounds(monkeypatch: pytest.MonkeyPatch, rounds: int, failing: tuple[str, ...] = ()) -> tuple[list, dict]:
    """``interleaved_settings`` over settings a, b, c with the prepare and the measurement faked: the events (prepare
    or measure, the setting applied then, the forced split count) in order, and what it returned. A setting in
    ``failing`` fails its prepare."""
    events: list[tuple] = []
    applied: list[str] = []

    @contextlib.contextmanager
    def apply(setting: str):
        applied.append(setting)
        try:
            yield
        finally:
            applied.pop()

    def prepared(impl, workload, problem, extra):
        events.append(("prepare", applied[-1]))
        return ("failed", float("nan"), float("nan"), 0, "prepare: planted") if applied[-1] in failing else None

    def measure(impl, case, workload, options, num_splits=None):
        events.append(("measure", applied[-1], num_splits))
        return "ok", float(len(events)), 0.0, num_splits or 1, ""

    monkeypatch.setattr(decode_floor, "prepared", prepared)
    monkeypatch.setattr(decode_floor, "measure", measure)
    results = decode_floor.interleaved_settings(
        None, RAGGED, (None, {}), ["a", "b", "c"], rounds, None, apply, forced_splits={"b": 4}.get
    )
    return events, results


@pytest.mark.parametrize("loop", ["bench.interleaved", "planted: one order"])
def test_floor_rounds_reverse_the_settings_every_other_round(loop: str, monkeypatch: pytest.MonkeyPatch):
    """The decode A/B loop (decode_floor, decode_knob_ab and the other decode benches) measures each setting once a
    round, the order reversed every other round (``bench.interleaved``); a planted loop that keeps one order fails."""
    if loop.startswith("planted"):
        monkeypatch.setattr(decode_floor, "interleaved", _rounds_in_one_order)
    events, results = _floor_rounds(monkeypatch, 4)
    order = [event[1] for event in events if event[0] == "measure"]
    assert sorted(results) == ["a", "b", "c"] and all(len(rows) == 4 for rows in results.values())
    if loop.startswith("planted"):
        assert order != [*"abc", *"cba", *"abc", *"cba"], order
        return
    assert order == [*"abc", *"cba", *"abc", *"cba"], order


def test_floor_rounds_prepare_each_setting_once_before_its_first_measurement(monkeypatch: pytest.MonkeyPatch):
    """Each setting is prepared (validated, compiled) under its own constants in the first round only, just before its
    first check and timing; a failed prepare is that round's row and the later rounds still measure it; the forced
    split count reaches the measurement."""
    events, results = _floor_rounds(monkeypatch, 3, failing=("c",))
    assert events == [
        ("prepare", "a"), ("measure", "a", None), ("prepare", "b"), ("measure", "b", 4), ("prepare", "c"),
        ("measure", "c", None), ("measure", "b", 4), ("measure", "a", None),
        ("measure", "a", None), ("measure", "b", 4), ("measure", "c", None),
    ]  # fmt: skip
    assert [row[0] for row in results["c"]] == ["failed", "ok", "ok"] and results["c"][0][4] == "prepare: planted"
    assert [row[0] for row in results["a"]] == ["ok"] * 3 and [row[3] for row in results["b"]] == [4] * 3
