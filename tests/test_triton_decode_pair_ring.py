"""triton/decode's ``PAIR_DEEP_RING`` (off until ``bench/triton_decode_pair_ring_ab.sh``): the padded split kernel of
the contiguous 16-row tile takes ``PAIR_RING_STAGES``' deeper ring where its grid passes one CTA an SM but fits one
wave of ``SPLIT_CTAS_PER_SM`` (issue #38's seed 131 row 7: B=2 H=4 Hkv=2 169k D=64, 63 splits, 252 CTAs).

CPU: off by default; on, the depth it gives and the shapes it leaves (a grid of one CTA an SM or past a wave of two,
D=128, paged, a 32-row tile, the balanced split, a release of ``PAIR_RING_SPILLS``), the plan and constexprs
unchanged; the rows of seeds 29-131 it moves (D=64 only, no default-sweep row); the A/B script's rows parse, the switch
moves exactly its first rows, and the value of cute/decode's ``BALANCED_SHALLOW_RING`` its second A/B times exactly
its first four. Interpreter, on 8 SMs: the deep ring's grid against fp64, and a planted key-range bug failing the same
check. Static (sm_90a): the deep build holds ``SPLIT_CTAS_PER_SM`` CTAs an SM, spill-free, with three more 16 KB K/V
blocks of ring than the default's (in a release of ``PAIR_RING_SPILLS``: it spills). GPU (``gpu``; the A/B script):
the moved kind against fp64 on a poisoned output (bf16 full, fp16 one sequence with ``cache_seqlens``, top-left causal
Sq=8), the launched depth, and a planted bug in a fresh process and Triton cache.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from bench.decode_ragged_ab import plan_of
from common.contract import splits
from common.contract.problem import Problem
from common.measure.decode_sweep import decode_cases, random_cases
from common.toolchain.releases import triton_release
from tests._helpers import json_from_child
from tests.test_decode import _shift_one_block, interpreter_only
from tests.test_decode_merge_group_triton import _ctas_an_sm
from tests.test_decode_packed import _interpreter_check
from tests.test_decode_shallow_ring import _cute, _cute_stages, needs_cute
from triton_impl import decode

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[1]
SWITCH = "PAIR_DEEP_RING"
ROW_131_7 = random_cases(8, 131)[7].problem
# One 16 KB K/V block (64 keys of K and of V, D=64, bf16): the deep ring's extra blocks are counted in it.
BLOCK_BYTES = 2 * 64 * 64 * 2


def _problem(batch: int, kv_heads: int, group: int, seqlen_q: int, seqlen_k: int, **changes) -> Problem:
    """A D=64 decode step (bottom-right causal unless ``changes`` say otherwise)."""
    changes.setdefault("causal", True)
    changes.setdefault("causal_alignment", "bottom_right")
    return Problem(batch, kv_heads * group, seqlen_q, seqlen_k, 64, kv_heads=kv_heads, **changes)


def _stages(problem: Problem, on: bool, monkeypatch: pytest.MonkeyPatch, num_splits: int | None = None) -> int:
    """The depth the padded split kernel of ``problem`` launches with on this machine's SM count, in any release (the
    release rule, ``PAIR_RING_SPILLS``, is tested apart)."""
    monkeypatch.setattr(decode, SWITCH, on)
    monkeypatch.setattr(decode, "PAIR_RING_SPILLS", ())
    return decode.PaddedBinder(problem, CPU, False, num_splits).split_options["num_stages"]


def _moves(problem: Problem, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Whether the switch changes what triton/decode launches for ``problem``: the padded split kernel's depth (a
    balanced call keeps its kernel, whose options this switch never reads)."""
    if decode.balanced_split(problem, CPU):
        return False
    return _stages(problem, False, monkeypatch) != _stages(problem, True, monkeypatch)


def test_switch_is_off_and_its_table_is_d64s_deep_ring():
    assert decode.PAIR_DEEP_RING is False, "off until bench/triton_decode_pair_ring_ab.sh"
    assert decode.PAIR_RING_STAGES == {64: 6}
    assert decode.PAIR_RING_STAGES[64] > decode.DEFAULT_CONFIGS[64].num_stages
    assert decode.PAIR_RING_SPILLS == ("3.8",)


def test_a_spilling_release_keeps_the_tiles_depth(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(decode, SWITCH, True)
    monkeypatch.setattr(decode, "PAIR_RING_SPILLS", (triton_release(),))
    assert decode.pair_ring_stages(ROW_131_7, 252, CPU) is None
    monkeypatch.setattr(decode, "PAIR_RING_SPILLS", ())
    assert decode.pair_ring_stages(ROW_131_7, 252, CPU) == 6


# ----------------------------------------------------------------------------------------------------
# CPU: the depth it gives and the shapes it leaves
# ----------------------------------------------------------------------------------------------------
# name -> (problem, forced splits, depth on) on 132 SMs; off, every one launches its tile's depth.
DEPTHS = {
    "131/7": (ROW_131_7, None, 6),  # 63 splits, 252 CTAs
    "131/7-forced-40": (ROW_131_7, 40, 6),  # 160 CTAs: still one wave of two
    "131/7-forced-33": (ROW_131_7, 33, 3),  # 132 CTAs: one an SM, DEEP_RING's grid
    "131/7-forced-67": (ROW_131_7, 67, 3),  # 268 CTAs: past a wave of two
    "one-sequence-lengths": (_problem(1, 2, 4, 4, 65536, has_cache_seqlens=True), None, 6),  # B=1: padded
    "many-items": (random_cases(8, 131)[6].problem, None, 3),  # 512 items: past a wave
    "d128": (random_cases(8, 131)[3].problem, None, 3),
    "32-row-tile": (_problem(2, 2, 32, 1, 65536), None, 3),
    "paged-one-sequence": (_problem(1, 2, 4, 4, 65536, has_cache_seqlens=True, page_size=64), None, 5),
}


@pytest.mark.parametrize("name", sorted(DEPTHS))
def test_depths_on_and_off(name: str, monkeypatch: pytest.MonkeyPatch):
    problem, forced, on = DEPTHS[name]
    off = decode.num_stages_for(problem)
    assert _stages(problem, False, monkeypatch, forced) == off, name
    assert _stages(problem, True, monkeypatch, forced) == on, name


def test_plan_and_constexprs_are_unchanged(monkeypatch: pytest.MonkeyPatch):
    lengths = (ROW_131_7.seqlen_k,) * ROW_131_7.batch
    plans, options = {}, {}
    monkeypatch.setattr(decode, "PAIR_RING_SPILLS", ())
    for on in (False, True):
        monkeypatch.setattr(decode, SWITCH, on)
        plans[on] = plan_of("triton/decode", ROW_131_7, lengths, CPU)
        options[on] = dict(decode.PaddedBinder(ROW_131_7, CPU, False).split_options)
    assert plans[True] == plans[False] == ("padded", 63)
    assert options[True].pop("num_stages") == 6 and options[False].pop("num_stages") == 3
    assert options[True] == options[False], "only the depth changes"


def test_balanced_calls_keep_their_kernel(monkeypatch: pytest.MonkeyPatch):
    problem = random_cases(8, 131)[4].problem
    assert decode.balanced_split(problem, CPU)
    built = {}
    for on in (False, True):
        monkeypatch.setattr(decode, SWITCH, on)
        built[on] = decode.BalancedBinder(problem, CPU).options
    assert built[True] == built[False]


# The rows of seeds 29-131 (``random_cases(8, seed)``) whose launch the switch changes: 74, all D=64 contiguous 16-row
# tiles of a padded split; no default-sweep row (D=128).
MOVED_COUNT = 74


def test_rows_it_moves_in_seeds_29_to_131_and_none_of_the_default_sweep(monkeypatch: pytest.MonkeyPatch):
    moved = [
        (seed, index, case.problem)
        for seed in range(29, 132)
        for index, case in enumerate(random_cases(8, seed))
        if _moves(case.problem, monkeypatch)
    ]
    assert len(moved) == MOVED_COUNT
    assert all(problem.head_dim == 64 and not problem.paged for _, _, problem in moved)
    assert {(131, 7), (131, 5), (131, 2), (29, 6)} <= {(seed, index) for seed, index, _ in moved}
    assert not any(_moves(case.problem, monkeypatch) for case in decode_cases())


# The A/B's rows: seven it moves (131/7 first; the few-items rows of 63 and 122 splits, the 282k row, and two large
# rows near the read bandwidth), then controls it leaves (131/3 D=128, 131/6 512 items).
AB_ROWS = ["131/7", "86/7", "118/1", "64/0", "125/6", "29/6", "131/5", "131/3", "131/6"]
MOVED_AB_ROWS = 7


def _script_rows(name: str) -> list[str]:
    """The words of ``knob_ab NAME ...`` in bench/triton_decode_pair_ring_ab.sh, after its name."""
    script = (ROOT / "bench" / "triton_decode_pair_ring_ab.sh").read_text()
    return shlex.split(script.split(f"\nknob_ab {name} ", 1)[1].split("\n\n", 1)[0].replace("\\\n", " "))


def test_ab_script_rows_parse_and_the_switch_moves_the_first_ones(monkeypatch: pytest.MonkeyPatch):
    """bench/triton_decode_pair_ring_ab.sh's triton rows: each parses, 131/7 first, and the switch moves exactly the
    first MOVED_AB_ROWS (the rest are controls): a typo costs a device call."""
    from bench.decode_knob_ab import parse_row

    script = (ROOT / "bench" / "triton_decode_pair_ring_ab.sh").read_text()
    assert "gpu_tests 90 tests/test_triton_decode_pair_ring.py" in script
    words = _script_rows("pair")
    assert words[1:4] == [f"triton_impl.decode:{SWITCH}", "False,True", "triton/decode"], words
    assert words[4:] == AB_ROWS
    rows = [parse_row(text)[1] for text in AB_ROWS]
    assert rows[0].problem == ROW_131_7
    moved = [_moves(case.problem, monkeypatch) for case in rows]
    assert moved == [True] * MOVED_AB_ROWS + [False] * (len(AB_ROWS) - MOVED_AB_ROWS)


# The script's second A/B, cute/decode's BALANCED_SHALLOW_RING at D=128 (an existing switch, a new value): four rows
# whose balanced grid spills past cute's 264 D=128 slots (131/4 first; 90/1 a 64-row tile), then 131/3 (not balanced).
CUTE_VALUES, CUTE_ROWS, CUTE_MOVED_ROWS = ({64: 4}, {64: 4, 128: 2}), ["131/4", "107/1", "128/5", "90/1", "131/3"], 4


@needs_cute
def test_ab_script_cute_rows_parse_and_the_value_moves_the_first_ones(monkeypatch: pytest.MonkeyPatch):
    from bench.decode_knob_ab import parse_row

    cute_decode = _cute()
    words = _script_rows("cuteshallow")
    assert words[1:4] == ["cute_impl.decode:BALANCED_SHALLOW_RING", "{64: 4},{64: 4, 128: 2}", "cute/decode"], words
    assert words[4:] == CUTE_ROWS
    assert CUTE_VALUES[0] == cute_decode.BALANCED_SHALLOW_RING, "the A/B's first value is the default"
    moved = []
    for text in CUTE_ROWS:
        problem = parse_row(text)[1].problem
        stages = []
        for value in CUTE_VALUES:
            monkeypatch.setattr(cute_decode, "BALANCED_SHALLOW_RING", value)
            stages.append(_cute_stages(problem))
        moved.append(stages[0] != stages[1])
    assert moved == [True] * CUTE_MOVED_ROWS + [False] * (len(CUTE_ROWS) - CUTE_MOVED_ROWS)


# ----------------------------------------------------------------------------------------------------
# Interpreter: the deep ring's grid against fp64, and a planted bug
# ----------------------------------------------------------------------------------------------------
# On 8 SMs: B=2 Hkv=2 (four items) on a 2048-key cache takes 4 splits of 512 keys, 16 CTAs: one wave of two an SM.
INTERPRETER_PROBLEM = _problem(2, 2, 2, 1, 2048, dtype=torch.float32)


def _interpreter_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(splits, "DEFAULT_SM_COUNT", 8)
    monkeypatch.setattr(decode, SWITCH, True)
    monkeypatch.setattr(decode, "PAIR_RING_SPILLS", ())
    monkeypatch.setattr(decode, "_ARRIVAL_COUNTERS", {})
    assert decode.PaddedBinder(INTERPRETER_PROBLEM, CPU, False).split_options["num_stages"] == 6


@interpreter_only
def test_deep_ring_grid_against_fp64_under_the_interpreter(monkeypatch: pytest.MonkeyPatch):
    _interpreter_setup(monkeypatch)
    result = _interpreter_check(INTERPRETER_PROBLEM, None)
    assert result.ok, f"triton/decode {SWITCH} {INTERPRETER_PROBLEM.describe()}: {result.summary()}"


@interpreter_only
def test_planted_key_range_bug_fails_under_the_interpreter(monkeypatch: pytest.MonkeyPatch):
    """Every split's keys one block late, on the case above (which passes unplanted)."""
    _interpreter_setup(monkeypatch)
    monkeypatch.setattr(decode, "split_key_range", _shift_one_block)
    result = _interpreter_check(INTERPRETER_PROBLEM, None)
    assert not result.ok, f"the check passed a wrong kernel ({result.summary()})"


# ----------------------------------------------------------------------------------------------------
# sm_90a: the deep build holds SPLIT_CTAS_PER_SM CTAs an SM, spill-free
# ----------------------------------------------------------------------------------------------------
_SCRIPT = r"""
import json, sys
from common.measure.decode_sweep import random_cases
from tests._helpers import triton_decode_sm90_facts
from triton_impl import decode

problem = random_cases(8, 131)[7].problem
results = []
for stages in json.loads(sys.argv[1]):
    # compile_sm90 builds at launch_options' depth: here each depth in turn.
    original = decode.launch_options
    decode.launch_options = lambda problem, deep=False, stages=stages: {**original(problem, deep), "num_stages": stages}
    results.append(triton_decode_sm90_facts(problem, "split")[1])
    decode.launch_options = original
print(json.dumps(results))
"""


@pytest.mark.static
def test_deep_build_holds_two_ctas_an_sm_without_spills():
    """Where this release is not in ``PAIR_RING_SPILLS``; in one that is, the deep build spills (why it is listed)."""
    depths = [decode.DEFAULT_CONFIGS[64].num_stages, decode.PAIR_RING_STAGES[64]]
    default, deep = json_from_child(["-c", _SCRIPT, json.dumps(depths)], timeout=600)
    where = f"Triton {triton_release()}: default {default}, deep {deep}"
    assert default["spill_bytes"] == 0, where
    if triton_release() in decode.PAIR_RING_SPILLS:
        assert deep["spill_bytes"] > 0, f"listed in PAIR_RING_SPILLS but spill-free: {where}"
        return
    assert deep["spill_bytes"] == 0, where
    assert _ctas_an_sm(default) > decode.SPLIT_CTAS_PER_SM, where
    assert _ctas_an_sm(deep) == decode.SPLIT_CTAS_PER_SM, where
    assert deep["shared_bytes"] - default["shared_bytes"] >= 3 * BLOCK_BYTES, f"three more blocks in flight: {where}"


# ----------------------------------------------------------------------------------------------------
# GPU: the moved kind against fp64, the launched depth, a planted bug
# ----------------------------------------------------------------------------------------------------
# name -> (problem, lengths): each a grid of one wave of two CTAs an SM on an H200 (132 SMs): 131/7's kind at 32k (61
# splits, 244 CTAs); one sequence of 30001 keys in a 64k cache given as cache_seqlens, 4 tokens, fp16 (128 splits,
# most past its end); top-left causal Sq=8 (16 packed rows).
GPU_CASES = {
    "131-7-kind-32k": (_problem(2, 2, 2, 1, 32768, dtype=torch.bfloat16), None),
    "one-sequence-fp16": (_problem(1, 2, 4, 4, 65536, dtype=torch.float16, has_cache_seqlens=True), (30001,)),
    "top-left-sq8": (_problem(2, 2, 2, 8, 40000, dtype=torch.bfloat16, causal_alignment="top_left"), None),
}


def _on_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    monkeypatch.setattr(decode, SWITCH, True)


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gpu_pair_ring_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    _on_gpu(monkeypatch)
    from tests.test_decode_wide import check_on_gpu

    problem, lengths = GPU_CASES[case]
    binder = decode.PaddedBinder(problem, torch.device("cuda"), False)
    assert binder.split_options["num_stages"] == decode.PAIR_RING_STAGES[64], (case, binder.num_splits)
    result = check_on_gpu("triton/decode", problem, lengths, seed=len(case))
    assert result.ok, f"triton/decode {SWITCH} {problem.describe()}: {result.summary()}"


@pytest.mark.gpu
def test_gpu_launch_takes_the_deep_ring(monkeypatch: pytest.MonkeyPatch):
    """The bound launch of 131/7's kind: the rule's splits as off, at the deep ring's depth."""
    _on_gpu(monkeypatch)
    from common.contract.inputs import make_inputs

    problem, _ = GPU_CASES["131-7-kind-32k"]
    q, k, v = make_inputs(problem, seed=0, device="cuda")
    run = decode.bind(q, k, v, problem)
    assert not run.balanced and run.num_stages == decode.PAIR_RING_STAGES[64], run.num_stages
    assert run.num_splits == decode.planned_num_splits(problem, torch.device("cuda"))


# The planted bug in a process of its own with an empty Triton cache (as tests/test_triton_decode_build_fit.py's):
# Triton keys a compiled kernel on its callees' source as first seen in the process.
_PLANTED_PROBE = """
import json
import pytest
from tests import test_triton_decode_pair_ring as pair
from tests.test_decode import _shift_one_block
from tests.test_decode_wide import check_on_gpu
from triton_impl import decode
with pytest.MonkeyPatch.context() as patch:
    patch.setattr(decode, "PAIR_DEEP_RING", True)
    patch.setattr(decode, "split_key_range", _shift_one_block)
    problem, lengths = pair.GPU_CASES["131-7-kind-32k"]
    result = check_on_gpu("triton/decode", problem, lengths, seed=len("131-7-kind-32k"))
print(json.dumps({"ok": result.ok, "summary": result.summary()}))
"""


@pytest.mark.gpu
def test_gpu_planted_key_range_bug_fails_the_check():
    """Every split's keys one block late on 131/7's kind, which passes unplanted."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TRITON_CACHE_DIR": cache, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(
            [sys.executable, "-c", _PLANTED_PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
    assert done.returncode == 0, done.stderr[-4000:]
    child = json.loads(done.stdout.strip().splitlines()[-1])
    assert not child["ok"], f"the check passed a wrong kernel ({child['summary']})"
