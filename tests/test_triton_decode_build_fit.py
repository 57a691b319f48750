"""triton/decode's ``BALANCED_BUILD_FIT`` (on since 2026-12-02): the balanced target at most one wave of the CTAs an SM
the launched tile's build holds, where the plan counts more (``BALANCED_BUILD_CTAS_PER_SM``: D=128's default tile of
17-64 packed rows, two an SM against ``CTAS_PER_SM_FIT``'s three) and the items are few (issue #38's seed 127 row 5:
264 target shares and 64 items, 296 working CTAs on 264 slots; on, 200 + 64, gluon/decode's plan).

CPU: on by default; on, the target it gives (slots less the items) and the shapes it
leaves (16-row, D=64, D=256 and wide tiles, many items, forced shares), the build's constexprs and launch options
unchanged; under the interpreter, on 8 SMs, the capped plan against fp64; the rows of seeds 29-127 and of the default
sweep it moves (twelve, no default row); ``bench/triton_decode_build_fit_ab.sh``'s rows parse and the switch moves
exactly its first six. Static (sm_90a): the table's tiles compile to builds that hold that many CTAs an SM (registers
and shared memory), the 16-row tile the three the plan counts. GPU (``gpu``; the A/B script): the changed rows' kind
shrunk, against fp64 on a poisoned output (paged in pages of 256 and 16, contiguous fp16, ragged with an empty
sequence), the bound launch's target; a planted share-boundary bug fails the same check (a fresh process and Triton
cache, so that neither holds the unplanted kernel).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.decode_ragged_ab import plan_of
from common.contract import splits
from common.contract.problem import Problem
from common.measure.decode_sweep import decode_cases, random_cases
from tests._helpers import json_from_child, json_from_child_with_empty_triton_cache, knob_ab_words
from tests.test_decode import interpreter_only
from tests.test_decode_merge_group_triton import _ctas_an_sm
from tests.test_decode_packed import _interpreter_check
from triton_impl import decode

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[1]
SWITCH = "BALANCED_BUILD_FIT"


@pytest.fixture(autouse=True)
def _build_fit_table_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The switch's own table (two CTAs an SM at D=128's 32 and 64 rows): ``ONE_SLOT_ONE_WAVE``'s cap at a config's
    one CTA an SM, which this switch also gates, is test_triton_decode_one_wave.py's."""
    monkeypatch.setattr(decode, "ONE_SLOT_ONE_WAVE", False)


def _problem(group: int, seqlen_q: int, head_dim: int = 128, page_size: int = 0, **changes) -> Problem:
    """A ragged-capable decode step of ``batch`` sequences (4) and ``kv_heads`` KV heads (4) of ``group`` query heads
    (bottom-right causal, ``cache_seqlens``)."""
    kv_heads = changes.pop("kv_heads", 4)
    return Problem(
        changes.pop("batch", 4), kv_heads * group, seqlen_q, changes.pop("seqlen_k", 16384), head_dim,
        dtype=changes.pop("dtype", torch.bfloat16), causal=True, kv_heads=kv_heads, causal_alignment="bottom_right",
        has_cache_seqlens=True, return_lse=True, page_size=page_size,
    )  # fmt: skip


def _target(problem: Problem, on: bool, monkeypatch: pytest.MonkeyPatch, shares: int | None = None) -> int:
    monkeypatch.setattr(decode, SWITCH, on)
    return decode.balanced_target_shares(problem, CPU, shares)


def _moves(problem: Problem, lengths: tuple[int, ...], monkeypatch: pytest.MonkeyPatch) -> bool:
    """Whether the switch changes triton/decode's plan of ``problem`` (``plan_of``: padded splits, or the balanced
    target and each sequence's shares)."""
    monkeypatch.setattr(decode, SWITCH, False)
    off = plan_of("triton/decode", problem, lengths, CPU)
    monkeypatch.setattr(decode, SWITCH, True)
    on = plan_of("triton/decode", problem, lengths, CPU)
    return on != off


def test_switch_is_on_and_its_table_names_the_two_fit_tiles():
    assert decode.BALANCED_BUILD_FIT is True, "taken: results/h200/triton-decode-build-fit/"
    assert decode.BALANCED_BUILD_CTAS_PER_SM == {(128, 32): 2, (128, 64): 2}
    assert all(fit < decode.CTAS_PER_SM_FIT[dim] for (dim, _), fit in decode.BALANCED_BUILD_CTAS_PER_SM.items())
    assert decode.balanced_one_wave_target(random_cases(8, 127)[5].problem, CPU) is not None


# ----------------------------------------------------------------------------------------------------
# CPU: the target it gives and the shapes it leaves
# ----------------------------------------------------------------------------------------------------
# name -> (problem, target off, target on) on 132 SMs: the 64- and 32-row D=128 tiles with few items take the build's
# 264 slots less the items; the rest keep the committed target.
TARGETS = {
    "127/5": (random_cases(8, 127)[5].problem, 264, 200),
    "64rows-16items-paged256": (_problem(5, 8, page_size=256), 264, 248),
    "32rows-64items": (_problem(4, 8, batch=16), 264, 200),
    "64rows-88items": (_problem(4, 16, batch=22), 264, 176),
    "64rows-92items": (_problem(4, 16, batch=23), 264, 264),  # past a third of the slots: per-SM, as off
    "64rows-512items": (_problem(4, 16, batch=64, kv_heads=8), 792, 792),  # the many-items branch, as off
    "16rows": (_problem(2, 8), 264, 264),
    "d64-32rows": (_problem(4, 8, head_dim=64, page_size=256), 264, 264),
    "d256-16rows": (_problem(2, 8, head_dim=256), 264, 264),
    "wide-128rows": (_problem(16, 8), 264, 264),  # its own one CTA an SM
}


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_targets_on_and_off(name: str, monkeypatch: pytest.MonkeyPatch):
    problem, off, on = TARGETS[name]
    assert _target(problem, False, monkeypatch) == off, name
    assert _target(problem, True, monkeypatch) == on, name
    if on != off:
        slots, items = 2 * 132, problem.batch * problem.kv_heads
        assert decode.m_blocks_for(problem) == 1 and on == slots - items, "one wave of the build's slots"


def test_forced_shares_and_the_build_are_left(monkeypatch: pytest.MonkeyPatch):
    problem = TARGETS["127/5"][0]
    assert _target(problem, True, monkeypatch, shares=300) == 300, "num_splits= forces the target"
    builds = {}
    for on in (False, True):
        monkeypatch.setattr(decode, SWITCH, on)
        builds[on] = (decode.balanced_constexprs(problem, decode.M_TILE_MAJOR), decode.launch_options(problem),
                      decode.block_m_for(problem), decode.tile_config(problem))  # fmt: skip
    assert builds[True] == builds[False]


@interpreter_only
def test_one_wave_target_against_fp64_under_the_interpreter(monkeypatch: pytest.MonkeyPatch):
    """On 8 SMs the 64-row tile's build holds 16 CTAs; 4 items take 16 - 4 = 12 target shares, not the per-SM 16:
    with shares of one 64-key block at least, 4 and 2 shares a KV head of the two sequences, not 6 and 3, against
    fp64 on a poisoned output."""
    monkeypatch.setattr(splits, "DEFAULT_SM_COUNT", 8)
    monkeypatch.setattr(decode, "BALANCED_SPLIT", "always")
    monkeypatch.setattr(decode, "BALANCED_MIN_KEYS", 64)
    problem = _problem(5, 8, batch=2, kv_heads=2, seqlen_k=2048, dtype=torch.float32)
    assert (_target(problem, False, monkeypatch), _target(problem, True, monkeypatch)) == (16, 12)
    assert plan_of("triton/decode", problem, (2048, 900), CPU) == ("balanced", 12, (4, 2))
    result = _interpreter_check(problem, (2048, 900))
    assert result.ok, f"triton/decode {SWITCH} {problem.describe()}: {result.summary()}"


# (seed, index) rows of random_cases(8, seed), seeds 29-127, whose plan the switch moves: D=128, 17-64 packed rows,
# B · Hkv <= 88 items, balanced (ragged, or since BALANCED_SPLIT "ragged-split-long" a long merge chain: the second
# line); no row of the default sweep.
MOVED_ROWS = {
    (48, 3), (55, 2), (66, 5), (67, 5), (68, 2), (70, 1), (77, 2), (81, 7), (84, 7), (117, 4), (121, 1), (127, 5),
    (57, 1), (83, 6), (90, 4), (92, 3), (104, 0), (126, 3),
}  # fmt: skip


def test_rows_it_moves_in_seeds_29_to_127_and_none_of_the_default_sweep(monkeypatch: pytest.MonkeyPatch):
    moved = set()
    for seed in range(29, 128):
        for index, case in enumerate(random_cases(8, seed)):
            lengths = case.lengths or (case.problem.seqlen_k,) * case.problem.batch
            if _moves(case.problem, lengths, monkeypatch):
                moved.add((seed, index))
    assert moved == MOVED_ROWS
    for case in decode_cases():
        lengths = case.lengths or (case.problem.seqlen_k,) * case.problem.batch
        assert not _moves(case.problem, lengths, monkeypatch), case.describe()


# The A/B's rows: six it moves (127/5 first), then the controls: 127/2 (D=64's 32-row tile, which the build holds
# three of against four counted, but the per-SM grid fits them) and 61/0 (D=128's 64-row tile, 96 items: past the
# one-wave branch).
AB_ROWS = ["127/5", "67/5", "68/2", "48/3", "84/7", "81/7", "127/2", "61/0"]


def test_ab_script_rows_parse_and_the_switch_moves_the_first_six(monkeypatch: pytest.MonkeyPatch):
    """bench/triton_decode_build_fit_ab.sh's knob rows: each parses, 127/5 first, and the switch moves exactly the
    first six (the last two are the controls): a typo costs a device call."""
    from bench.decode_knob_ab import parse_row

    script = (ROOT / "bench" / "triton_decode_build_fit_ab.sh").read_text()
    assert "gpu_tests 60 tests/test_triton_decode_build_fit.py" in script
    words = knob_ab_words("triton_decode_build_fit_ab.sh", "fit")
    assert words[:4] == ["85", f"triton_impl.decode:{SWITCH}", "False,True", "triton/decode"], words
    assert words[4:] == AB_ROWS
    rows = [parse_row(text)[1] for text in words[4:]]
    assert rows[0].problem == random_cases(8, 127)[5].problem
    moved = [_moves(case.problem, case.lengths or (case.problem.seqlen_k,) * case.problem.batch, monkeypatch)
             for case in rows]  # fmt: skip
    assert moved == [True] * 6 + [False] * 2


# ----------------------------------------------------------------------------------------------------
# sm_90a: the table's tiles hold the CTAs an SM it says
# ----------------------------------------------------------------------------------------------------
_SCRIPT = r"""
import json, sys
import torch
from common.contract.problem import Problem
from tests._helpers import triton_decode_sm90_facts

results = []
for group, seqlen_q, page_size in json.loads(sys.argv[1]):
    problem = Problem(4, 4 * group, seqlen_q, 4096, 128, dtype=torch.bfloat16, causal=True, kv_heads=4,
                      causal_alignment="bottom_right", has_cache_seqlens=True, page_size=page_size)
    results.append(triton_decode_sm90_facts(problem, "balanced")[1])
print(json.dumps(results))
"""
# (group, Sq, page size) at D=128: 64 rows (127/5's 40 padded) in pages of 256 and 16 and contiguous, 32 rows paged
# and contiguous, and the 16-row tile, which holds CTAS_PER_SM_FIT's three.
BUILDS = [(5, 8, 256), (5, 8, 16), (4, 16, 0), (4, 8, 256), (4, 8, 0), (2, 8, 256)]


@pytest.mark.static
def test_builds_hold_the_ctas_an_sm_of_the_table():
    compiled = json_from_child(["-c", _SCRIPT, json.dumps(BUILDS)], timeout=900)
    for (group, seqlen_q, page_size), facts in zip(BUILDS, compiled, strict=True):
        fit = decode.BALANCED_BUILD_CTAS_PER_SM.get((128, facts["block_m"]), decode.CTAS_PER_SM_FIT[128])
        where = f"D=128 {group * seqlen_q} rows, pages of {page_size}: {facts}"
        # Spills are the default tile's own (Triton 3.9's contiguous 64-row build keeps 16 bytes): not this switch's.
        assert _ctas_an_sm(facts) == fit, where


# ----------------------------------------------------------------------------------------------------
# GPU: the changed rows' kind, shrunk, against fp64; the launch's target; a planted bug
# ----------------------------------------------------------------------------------------------------
# name -> (problem, lengths): 40 rows (127/5's group and Sq) in pages of 256, 64 rows in pages of 16 (66/5's and
# 117/4's pages), 32 rows contiguous in fp16; each ragged with an empty sequence, few items (the one-wave branch).
GPU_CASES = {
    "paged256-40rows": (_problem(5, 8, page_size=256), (16384, 0, 9001, 300)),
    "paged16-64rows": (_problem(4, 16, page_size=16, batch=3, seqlen_k=8192), (8192, 4099, 0)),
    "contiguous-32rows-fp16": (_problem(4, 8, batch=4, kv_heads=2, seqlen_k=8192, dtype=torch.float16),
                               (8000, 0, 8192, 65)),
}  # fmt: skip


def _switch_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decode, SWITCH, True)
    monkeypatch.setattr(decode, "BALANCED_SPLIT", "always")


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gpu_build_fit_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from tests.test_decode_wide import check_on_gpu

    problem, lengths = GPU_CASES[case]
    _switch_on(monkeypatch)
    assert decode.balanced_one_wave_target(problem, torch.device("cuda")) is not None, case
    result = check_on_gpu("triton/decode", problem, lengths, seed=len(case))
    assert result.ok, f"triton/decode {SWITCH} {problem.describe()}: {result.summary()}"


@pytest.mark.gpu
def test_gpu_launch_takes_one_wave_of_the_builds_slots(monkeypatch: pytest.MonkeyPatch):
    """The bound launch of the pages-of-256 case: the target the device's slots less the items (on an H200: 248)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from common.contract.inputs import make_inputs, make_paged_kv

    problem, lengths = GPU_CASES["paged256-40rows"]
    _switch_on(monkeypatch)
    q, k, v = make_inputs(problem, seed=0, device="cuda")
    k, v, block_table = make_paged_kv(problem, k, v, seed=0)
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    run = decode.bind(q, k, v, problem, cache_seqlens=cache_seqlens, block_table=block_table)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert run.balanced and run.num_splits == 2 * sms - problem.batch * problem.kv_heads, run.num_splits


# The planted bug in a process of its own with an empty Triton cache (``json_from_child_with_empty_triton_cache``
# says why).
_PLANTED_PROBE = """
import json
import pytest
import torch
from tests import test_triton_decode_build_fit as fit
from tests.test_decode import _shift_one_block
from tests.test_decode_wide import check_on_gpu
from triton_impl import decode
with pytest.MonkeyPatch.context() as patch:
    fit._switch_on(patch)
    patch.setattr(decode, "split_key_range", _shift_one_block)
    problem, lengths = fit.GPU_CASES["paged256-40rows"]
    result = check_on_gpu("triton/decode", problem, lengths, seed=len("paged256-40rows"))
    one_wave = decode.balanced_one_wave_target(problem, torch.device("cuda"))
print(json.dumps({"one_wave": one_wave, "ok": result.ok, "summary": result.summary()}))
"""


@pytest.mark.gpu
def test_gpu_planted_share_boundary_bug_fails_the_check():
    """Every share's keys one block late (``test_decode``'s planted balanced bug) on the pages-of-256 case, which
    passes unplanted (``test_gpu_build_fit_against_fp64[paged256-40rows]``)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    child = json_from_child_with_empty_triton_cache(_PLANTED_PROBE, timeout=300)
    assert child["one_wave"] is not None, child
    assert not child["ok"], f"the check passed a wrong kernel ({child['summary']})"
