"""triton/decode's ``ONE_SLOT_ONE_WAVE`` (on since bench/triton_decode_mqa256_ab.sh's A/B): ``BALANCED_BUILD_FIT``'s
one-wave cap at the one CTA an SM a tile's config declares (``ctas_per_sm=1``: the D=256 wgmma tile, the wide tiles),
where the items are few (issue #38's seed 137 row 5, B=32 H=5 Hkv=1 Sq=4 D=256 ragged: 264 target shares and 32
items, 296 CTAs on 132 slots; on, 100 + 32, one wave, as gluon/decode and cute/decode plan it).

CPU: on by default; on, 137/5's target is the slots less the items and the build (constexprs, launch options, tile)
is the same; the sweep rows it moves (seeds 1-149: three, all D=256 wgmma tiles) and none of the default sweep; a
two-CTA tile (D=128's 32 rows, BALANCED_BUILD_FIT's own table) and forced shares keep their target; under the
interpreter, on 8 SMs, the capped plan against fp64. GPU (``gpu``; the A/B script): 137/5's kind shrunk (D=256, Sq 4,
group 5, one KV head, ragged with an empty sequence; contiguous and in pages of 64) against fp64 on a poisoned output
with the launch's target checked; a planted share-boundary bug fails the same check (a fresh process and Triton cache).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.decode_ragged_ab import plan_of
from common.contract import splits
from common.measure.decode_sweep import decode_cases, random_cases
from tests._helpers import json_from_child_with_empty_triton_cache, knob_ab_words
from tests.test_decode import interpreter_only
from tests.test_decode_packed import _interpreter_check
from tests.test_triton_decode_build_fit import _problem
from triton_impl import decode

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[1]
SWITCH = "ONE_SLOT_ONE_WAVE"
# (seed, index) rows of random_cases(8, seed) whose plan the switch moves, over the seeds the sweeps drew.
SEEDS = (1, 29, 31, 37, 41, 43, 47, 53, 59, 61, 64, 67, 71, 73, 83, 89, 97, 103, 107, 109, 127, 131, 137, 139, 149)
MOVED_ROWS = {(43, 4), (83, 5), (137, 5)}


def _target(problem, on: bool, monkeypatch: pytest.MonkeyPatch, shares: int | None = None) -> int:
    monkeypatch.setattr(decode, SWITCH, on)
    return decode.balanced_target_shares(problem, CPU, shares)


def _plans(case, monkeypatch: pytest.MonkeyPatch) -> tuple:
    """triton/decode's plan of ``case`` (``plan_of``) with the switch off, then on."""
    plans = []
    for on in (False, True):
        monkeypatch.setattr(decode, SWITCH, on)
        plans.append(plan_of("triton/decode", case.problem, case.lengths, CPU))
    return tuple(plans)


def test_on_by_default():
    assert decode.ONE_SLOT_ONE_WAVE is True, "taken on its A/B (results/h200/triton-decode-one-wave/)"


def test_seed_137_row_5_takes_one_wave_of_its_one_slot_an_sm(monkeypatch: pytest.MonkeyPatch):
    problem = random_cases(8, 137)[5].problem
    assert decode.tile_config(problem) == decode.WGMMA_D256_CONFIG and decode.WGMMA_D256_CONFIG.ctas_per_sm == 1
    slots, items = splits.per_tile(CPU, 1, decode.m_blocks_for(problem)), problem.batch * problem.kv_heads
    assert (slots, items) == (132, 32)
    assert (_target(problem, False, monkeypatch), _target(problem, True, monkeypatch)) == (264, slots - items)
    builds = {}
    for on in (False, True):
        monkeypatch.setattr(decode, SWITCH, on)
        builds[on] = (decode.balanced_constexprs(problem, decode.M_TILE_MAJOR), decode.launch_options(problem),
                      decode.tile_config(problem))  # fmt: skip
    assert builds[True] == builds[False], "only the target, a kernel argument, may change"


def test_a_two_cta_tile_and_forced_shares_keep_their_target(monkeypatch: pytest.MonkeyPatch):
    two_ctas = _problem(4, 8)  # D=128's 32 rows: two CTAs an SM, BALANCED_BUILD_FIT's table
    assert _target(two_ctas, True, monkeypatch) == _target(two_ctas, False, monkeypatch)
    problem = random_cases(8, 137)[5].problem
    assert _target(problem, True, monkeypatch, shares=200) == _target(problem, False, monkeypatch, shares=200) == 200


def test_rows_it_moves_and_none_of_the_default_sweep(monkeypatch: pytest.MonkeyPatch):
    moved = set()
    for seed in SEEDS:
        for index, case in enumerate(random_cases(8, seed)):
            off, on = _plans(case, monkeypatch)
            if on != off:
                moved.add((seed, index))
                assert case.problem.head_dim == 256 and on[1] < off[1], (seed, index, off, on)
    assert moved == MOVED_ROWS
    assert not [case for case in decode_cases() if len(set(_plans(case, monkeypatch))) > 1]


def test_ab_script_rows_parse_and_the_switch_moves_the_first_three(monkeypatch: pytest.MonkeyPatch):
    """bench/triton_decode_mqa256_ab.sh's knob rows: each parses, the switch moves exactly the first three (the moved
    sweep rows), not the two controls: a typo costs a device call."""
    from bench.decode_knob_ab import parse_row

    script = (ROOT / "bench" / "triton_decode_mqa256_ab.sh").read_text()
    assert "gpu_tests 150 tests/test_triton_decode_one_wave.py" in script
    words = knob_ab_words("triton_decode_mqa256_ab.sh", "mqa256")
    assert words[1:4] == [f"triton_impl.decode:{SWITCH}", "False,True", "triton/decode"], words
    moved = [len(set(_plans(parse_row(text)[1], monkeypatch))) > 1 for text in words[4:]]
    assert moved == [True] * 3 + [False] * 2


@interpreter_only
def test_one_wave_target_against_fp64_under_the_interpreter(monkeypatch: pytest.MonkeyPatch):
    """On 8 SMs the D=256 wgmma tile holds 8 CTAs; 2 items take 8 - 2 = 6 target shares, not the per-SM 16: against
    fp64 on a poisoned output."""
    monkeypatch.setattr(splits, "DEFAULT_SM_COUNT", 8)
    monkeypatch.setattr(decode, "BALANCED_SPLIT", "always")
    monkeypatch.setattr(decode, "BALANCED_MIN_KEYS", 32)
    problem = _problem(5, 4, 256, batch=2, kv_heads=1, seqlen_k=1024, dtype=torch.float32)
    assert decode.tile_config(problem) == decode.WGMMA_D256_CONFIG
    assert (_target(problem, False, monkeypatch), _target(problem, True, monkeypatch)) == (16, 6)
    result = _interpreter_check(problem, (1024, 300))
    assert result.ok, f"triton/decode {SWITCH} {problem.describe()}: {result.summary()}"


# ----------------------------------------------------------------------------------------------------
# GPU: 137/5's kind, shrunk, against fp64 with the launch's target; a planted bug
# ----------------------------------------------------------------------------------------------------
# name -> (problem, lengths): group 5, Sq 4 (20 packed rows, the wgmma tile padded to 64), one KV head, ragged with an
# empty sequence, few items; contiguous and in pages of 64. Caches long enough that the one-wave cap binds: below
# about (slots - items) · BALANCED_MIN_KEYS keys the minimum share already keeps the target under it, off and on.
GPU_CASES = {
    "contiguous-20rows": (_problem(5, 4, 256, batch=6, kv_heads=1, seqlen_k=32768), (32768, 0, 4099, 17, 24000, 300)),
    "paged64-20rows": (_problem(5, 4, 256, batch=4, kv_heads=1, seqlen_k=40960, page_size=64), (40960, 1000, 0, 65)),
}


def _targets(problem, device: torch.device, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """The balanced target with the switch off, then on (the GPU cases' split as ``_switch_on`` asks it)."""
    monkeypatch.setattr(decode, "BALANCED_SPLIT", "always")
    targets = []
    for on in (False, True):
        monkeypatch.setattr(decode, SWITCH, on)
        targets.append(decode.balanced_target_shares(problem, device))
    return targets[0], targets[1]


@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_the_gpu_cases_are_ones_the_switch_moves(case: str, monkeypatch: pytest.MonkeyPatch):
    """At the H200's 132 SMs each GPU case's target drops to the slots less the items: a case the cap does not bind
    would check the default plan twice (the sixth stop's first cases, 8k and 4k caches, did)."""
    problem = GPU_CASES[case][0]
    slots = splits.per_tile(CPU, 1, decode.m_blocks_for(problem))
    off, on = _targets(problem, CPU, monkeypatch)
    assert slots == 132 and on == slots - problem.batch < off, (case, off, on)


def _switch_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decode, SWITCH, True)
    monkeypatch.setattr(decode, "BALANCED_SPLIT", "always")


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gpu_one_wave_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from tests.test_decode_wide import check_on_gpu

    problem, lengths = GPU_CASES[case]
    device = torch.device("cuda")
    items, sms = problem.batch * problem.kv_heads, torch.cuda.get_device_properties(0).multi_processor_count
    off, on = _targets(problem, device, monkeypatch)
    assert on == sms - items < off, (case, off, on)
    _switch_on(monkeypatch)
    result = check_on_gpu("triton/decode", problem, lengths, seed=len(case))
    assert result.ok, f"triton/decode {SWITCH} {problem.describe()}: {result.summary()}"


# In a process of its own with an empty Triton cache (``json_from_child_with_empty_triton_cache`` says why).
_PLANTED_PROBE = """
import json
import pytest
import torch
from tests import test_triton_decode_one_wave as one_wave
from tests.test_decode import _shift_one_block
from tests.test_decode_wide import check_on_gpu
from triton_impl import decode
with pytest.MonkeyPatch.context() as patch:
    one_wave._switch_on(patch)
    patch.setattr(decode, "split_key_range", _shift_one_block)
    problem, lengths = one_wave.GPU_CASES["contiguous-20rows"]
    result = check_on_gpu("triton/decode", problem, lengths, seed=len("contiguous-20rows"))
    target = decode.balanced_target_shares(problem, torch.device("cuda"))
print(json.dumps({"target": target, "ok": result.ok, "summary": result.summary()}))
"""


@pytest.mark.gpu
def test_gpu_planted_share_boundary_bug_fails_the_check():
    """Every share's keys one block late on the contiguous case, which passes unplanted."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    child = json_from_child_with_empty_triton_cache(_PLANTED_PROBE, timeout=300)
    problem = GPU_CASES["contiguous-20rows"][0]
    assert child["target"] == torch.cuda.get_device_properties(0).multi_processor_count - problem.batch, child
    assert not child["ok"], f"the check passed a wrong kernel ({child['summary']})"
