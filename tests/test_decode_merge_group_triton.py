"""triton/decode's two-level merge of the balanced split (``BALANCED_MERGE_GROUP`` in ``triton_impl/decode.py``;
the merge in ``_decode_merge.store_balanced_partials``), gluon/decode's (``tests/test_decode_merge_group.py``) in the
Triton stack; 0 is the one-level merge.

CPU: on by default (8); the arrival counters it needs (two per slab and M tile) and a negative group refused. Under the
interpreter, against fp64 on a poisoned output: runs that split an item's shares with a partial last run and runs of one
(D=64 GQA contiguous, D=128 paged, D=256's 80-row tile merged in 32-row chunks back into its partials), every counter
back at 0 after the launch, and a planted run merge that writes O instead of its first slab failing the check. Static
(sm_90a): the balanced kernel with runs has no spill in a loop (a few bytes outside them under D=64's register cap), two
more acq_rel atomics than one level's one (the run's arrival and the item's) and as many CTAs an SM, but for the rows
and releases ``OCCUPANCY_LOST`` names. GPU (``gpu``): with gluon/decode's, ``test_decode_merge_group.py``'s (the same
runs, the same cases).
"""

from __future__ import annotations

import json

import pytest
import torch
import triton
import triton.language as tl

from common.toolchain.releases import triton_release
from tests._helpers import json_from_child
from tests.test_decode import (
    BALANCED_CASES,
    _balanced_check,
    interpreter_only,
)
from tests.test_decode_d256 import INTERPRETER_CASES as D256_CASES
from tests.test_decode_d256 import _wide_d256
from tests.test_decode_packed import _interpreter_check
from triton_impl import _decode_merge, decode

CPU = torch.device("cpu")
GROUP = 8
# The merge the planted one calls (``_decode_merge.merge_slabs`` as committed, before the test patches it).
MERGE_SLABS = _decode_merge.merge_slabs


def test_on_by_default():
    assert decode.BALANCED_MERGE_GROUP == GROUP, "runs of 8, gluon/decode's measured group (triton_impl/decode.py)"


def test_counters_one_per_item_or_two_per_slab_with_runs(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(decode, "BALANCED_MERGE_GROUP", 0)
    assert decode.balanced_counter_count(8, 264, 2) == 16
    monkeypatch.setattr(decode, "BALANCED_MERGE_GROUP", GROUP)
    assert decode.balanced_counter_count(8, 264, 2) == 2 * 264 * 2
    monkeypatch.setattr(decode, "BALANCED_MERGE_GROUP", -1)
    with pytest.raises(ValueError, match="BALANCED_MERGE_GROUP must be >= 0"):
        decode.balanced_counter_count(8, 264, 2)


# ----------------------------------------------------------------------------------------------------
# Interpreter: against fp64, counters put back, a planted run merge
# ----------------------------------------------------------------------------------------------------
@pytest.fixture
def balanced_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The balanced split for every call, shares of one 64-key block at least (test_decode's ``balanced``), and a
    fresh counter buffer so that one a planted bug leaves dirty goes with the test."""
    monkeypatch.setattr(decode, "BALANCED_SPLIT", "always")
    monkeypatch.setattr(decode, "BALANCED_MIN_KEYS", 64)
    monkeypatch.setattr(decode, "_ARRIVAL_COUNTERS", {})


def _counters_zero() -> bool:
    return all(not counters.any() for counters in decode._ARRIVAL_COUNTERS.values())


@interpreter_only
@pytest.mark.parametrize("group", [1, 2, 3])
@pytest.mark.parametrize("index", [0, 1], ids=["gqa-sq1-d64", "gqa-sq4-d128-paged"])
def test_runs_against_fp64_and_counters_put_back(
    index: int, group: int, balanced_runs: None, monkeypatch: pytest.MonkeyPatch
):  # fmt: skip
    """BALANCED_CASES[0]: 12 forced shares give the 1000-key sequence 4 shares an item (runs of 3: 3 + 1; of 2: 2 + 2;
    of 1: four runs); [1] (paged, 5 forced shares) gives it 2 (one run of 2 or 3: the one-level path)."""
    monkeypatch.setattr(decode, "BALANCED_MERGE_GROUP", group)
    problem, result = _balanced_check(BALANCED_CASES[index], seed=group + index)
    assert result.ok, f"{problem.describe()} group {group}: {result.summary()}"
    assert _counters_zero(), "a run's or an item's arrival counter was left non-zero"


@interpreter_only
def test_d256_chunked_runs_against_fp64(balanced_runs: None, monkeypatch: pytest.MonkeyPatch):
    """80 packed rows at D=256 in one 128-row tile, merged in 32-row chunks: the run merge stores each chunk back into
    the run's first slab (6 forced shares of at least 64 keys: the 1000-key sequence takes 4, a run of 3 and one of 1;
    the 517-key one 2, one run)."""
    _wide_d256(monkeypatch)
    monkeypatch.setattr(decode, "BALANCED_MERGE_GROUP", 3)
    result = _interpreter_check(*D256_CASES["balanced-ragged"])
    assert result.ok, result.summary()
    assert _counters_zero()


@triton.jit
def _run_merge_writing_o(
    partials, stride, count, outputs, tile, row_ok,
    RETURN_LSE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, SPLITS_PER_STEP: tl.constexpr,
    INTO_PARTIALS: tl.constexpr,
):  # fmt: skip
    """Planted: a run's merge written to O, never back into the run's first slab (``INTO_PARTIALS`` dropped)."""
    MERGE_SLABS(
        partials, stride, count, outputs, tile, row_ok, RETURN_LSE, HEAD_DIM, BLOCK_M, SPLITS_PER_STEP,
        INTO_PARTIALS=False,
    )  # fmt: skip


@interpreter_only
def test_planted_run_merge_into_o_fails_the_check(balanced_runs: None, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(decode, "BALANCED_MERGE_GROUP", 3)
    assert _balanced_check(BALANCED_CASES[0], seed=7)[1].ok, "the unplanted kernel must pass"
    monkeypatch.setattr(_decode_merge, "merge_slabs", _run_merge_writing_o)
    _, result = _balanced_check(BALANCED_CASES[0], seed=7)
    assert not result.ok, f"the planted run merge passed: {result.summary()}"


# ----------------------------------------------------------------------------------------------------
# sm_90a: no spills, the run's atomics present only with runs
# ----------------------------------------------------------------------------------------------------
_COMPILE_SCRIPT = r"""
import json, sys
from common.measure.decode_sweep import random_cases
from common.reporting.static import cubin_sass, sass_loops
from tests._helpers import triton_decode_sm90_facts
from triton_impl import decode

results = []
for seed, index, group in json.loads(sys.argv[1]):
    decode.BALANCED_MERGE_GROUP = group
    binary, facts = triton_decode_sm90_facts(random_cases(8, seed)[index].problem, "balanced")
    loops = sass_loops(cubin_sass(binary.cubin))
    loop_spills = sum(op.startswith(("STL", "LDL")) for _, body in loops for op in body)
    results.append({**facts, "atomics": binary.ptx.count("atom.global.gpu.acq_rel"), "loop_spills": loop_spills})
print(json.dumps(results))
"""
# Spill bytes the kernel may keep outside its loops: under D=64's register cap (80) the runs' merge keeps a few of the
# plan's values in local memory across the key loop (16 bytes under Triton 3.8 at some stage of this work: three
# stores before it, three loads after).
OUTSIDE_LOOP_SPILL_BYTES = 32
SM_REGISTERS, SM_SHARED_BYTES, CTA_RESERVED_SHARED_BYTES, REGISTER_UNIT = 65536, 233472, 1024, 8
# Rows whose kernel with runs holds fewer CTAs an SM than one level's, by release (sm_90a): under Triton 3.8 and 3.9
# seed 43's row 1 takes 174-175 registers against 149-150 (two CTAs, not three); under 3.9 seed 73's row 2 takes 154
# against 128 (three, not four), at any run step. Triton 3.6 (the GPU machine's, where the A/B ran) loses none: there
# the run's half step keeps 73/2 at 157 registers (one level: 158; the full step took 182, and 1.27x the time).
OCCUPANCY_LOST = {"3.8": {(43, 1)}, "3.9": {(43, 1), (73, 2)}}
STATIC_ROWS = ((73, 0), (73, 2), (43, 1))


def _ctas_an_sm(facts: dict) -> int:
    """CTAs an SM holds of a kernel: its registers (in units of 8 a thread) and its shared memory."""
    registers = -(-facts["registers"] // REGISTER_UNIT) * REGISTER_UNIT
    by_registers = SM_REGISTERS // (registers * facts["threads"])
    return min(by_registers, SM_SHARED_BYTES // (facts["shared_bytes"] + CTA_RESERVED_SHARED_BYTES))


@pytest.mark.static
def test_runs_compile_without_loop_spills_and_keep_the_ctas_an_sm():
    """Seed 73's rows 0 (D=64 paged, 16 rows) and 2 (64 rows: the row the full run step made slower) and seed 43's row
    1 (D=256 MQA paged), each with and without runs: no spill in a loop, two more acq_rel atomics with runs, and as
    many CTAs an SM (but where ``OCCUPANCY_LOST`` says)."""
    keys = [[seed, index, group] for seed, index in STATIC_ROWS for group in (0, GROUP)]
    compiled = json_from_child(["-c", _COMPILE_SCRIPT, json.dumps(keys)], timeout=900)
    facts = {(seed, index, group): result for (seed, index, group), result in zip(keys, compiled, strict=True)}
    for (seed, index, group), result in facts.items():
        where = f"triton {seed}/{index} group={group}: {result}"
        assert result["loop_spills"] == 0, where
        assert result["spill_bytes"] <= (OUTSIDE_LOOP_SPILL_BYTES if group else 0), where
        assert result["atomics"] == (3 if group else 1), where
    for row in STATIC_ROWS:
        kept = _ctas_an_sm(facts[(*row, GROUP)]) >= _ctas_an_sm(facts[(*row, 0)])
        where = f"triton {row[0]}/{row[1]}: {facts[(*row, 0)]} -> {facts[(*row, GROUP)]}"
        assert kept != (row in OCCUPANCY_LOST.get(triton_release(), set())), where
