"""The decode rungs (flash decoding): triton/decode's split-KV against the fp64 reference under the
interpreter, the split rule, the fused merge (twice in a row, bit for bit the two-launch merge), and
planted bugs (a dropped split, a log2-unit merge, a split reading past its length, an arrival counter
left unreset) that the checks must fail (the padded-Sk split, which a call with ``cache_seqlens`` takes
only with ``BALANCED_SPLIT = "never"``: this file's tests turn it off unless they ask for it); triton/decode's
balanced split (the default for a call with ``cache_seqlens``) against fp64 on wildly ragged lengths,
bit for bit twice, with lengths changed in place, its planted bugs, and its kernel compiled for sm_90a;
gluon/decode compiled for sm_90a from its real launch arguments.

GPU (``gpu`` marker): every registered decode rung (``DECODE_IMPLS``: triton/decode, gluon/decode,
cute/decode, and any rung registered with rung "decode") against fp64 on ragged, GQA/MQA, Sq up to 16,
forced split counts including 1, both alignments, D 64/128/256, fp16/bf16, the LSE and strided inputs,
with poisoned outputs. Every decode rung's ``prepare`` takes ``num_splits=`` and its ``run`` reports
``num_splits``. The balanced split on the GPU, in each rung that has one (``BALANCED_RUNGS``: triton/decode,
cute/decode): fp64 on the ragged cases and on one long sequence among short and empty ones (paged too),
20 launches bit for bit, CUDA-graph replays with new lengths. cute/decode's own checks are in
``tests/test_cute_decode.py``."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import sys
from collections.abc import Callable
from typing import NamedTuple

import pytest
import torch
import triton
import triton.language as tl

from common.contract import splits
from common.contract.check import check_on_inputs, run_poisoned
from common.contract.inputs import make_inputs, make_paged_kv
from common.contract.problem import Problem
from common.contract.registry import Implementation, discover
from common.measure.timing import capture
from common.toolchain.releases import triton_release
from tests._helpers import json_from_child, triton_wide_tile_at_every_head_dim
from triton_impl import _decode_merge, decode
from triton_impl import _device as device
from triton_impl._device import split_key_range
from triton_impl.gluon import decode as gluon_decode

CPU = torch.device("cpu")
interpreter_only = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter tests run on CPU-only machines")
# A padded cache of 300 keys: ragged lengths with a full sequence, an empty one, and one ending mid-block.
SEQLEN_K = 300
LENGTHS = (SEQLEN_K, 0, 131)


# The balanced split's switch as committed (the fixture below turns it off for the padded split's tests).
COMMITTED_BALANCED_SPLIT = decode.BALANCED_SPLIT


# The decode rungs with a balanced split, by module (cute's only where the CuTe DSL imported it).
BALANCED_MODULES = ("triton_impl.decode", "triton_impl.gluon.decode", "cute_impl.decode")


@pytest.fixture(autouse=True)
def padded_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """The padded-Sk split for every call of every decode rung: most tests here force its split counts,
    merge and planted bugs (gluon's and cute's "ragged-split" would take the ragged GPU cases elsewhere);
    the balanced split's tests turn it back on (``balanced``, ``_balanced``)."""
    for name in BALANCED_MODULES:
        if name in sys.modules:
            monkeypatch.setattr(sys.modules[name], "BALANCED_SPLIT", "never")


# Every registered decode rung, for the GPU tests.
DECODE_IMPLS = {impl.name: impl for impl in discover(include_baselines=False)[0] if impl.rung == "decode"}


def _with_splits(num_splits: int, impl: Implementation = decode.IMPLEMENTATION) -> Implementation:
    """A decode rung with the split count forced (the prepare keyword the public API lacks)."""
    prepare = functools.partial(impl.prepare, num_splits=num_splits)
    return dataclasses.replace(impl, prepare=prepare)


def _check(problem: Problem, num_splits: int, *, seed: int = 0, offset: float = 0.5):
    q, k, v = make_inputs(problem, seed=seed, device="cpu", offset=offset)
    lengths = torch.tensor(LENGTHS[: problem.batch], dtype=torch.int32) if problem.has_cache_seqlens else None
    return check_on_inputs(_with_splits(num_splits), q, k, v, problem, cache_seqlens=lengths)


def _decode_problem(seqlen_q: int = 1, kv_heads: int = 2, *, heads: int = 8, **changes) -> Problem:
    fields = dict(
        batch=3, heads=heads, seqlen_q=seqlen_q, seqlen_k=SEQLEN_K, head_dim=64, dtype=torch.float32, causal=True,
        kv_heads=kv_heads, causal_alignment="bottom_right", has_cache_seqlens=True, return_lse=True,
    )  # fmt: skip
    return Problem(**{**fields, **changes})


# ----------------------------------------------------------------------------------------------------
# Against fp64: splits, GQA packing, Sq up to 16, ragged lengths, the LSE
# ----------------------------------------------------------------------------------------------------
# (Sq, kv_heads of 8 heads (4 at Sq = 16, to keep the interpreter fast), forced splits): group 1, 4 and
# 8 (MQA), one token to 16, one split, three and many (more splits than a short sequence has key
# blocks: empty splits); 16 tokens of MQA fill a 64-row M tile.
CASES = [(1, 8, 1), (1, 2, 3), (1, 1, 16), (5, 2, 3), (16, 1, 3), (16, 4, 5)]


@interpreter_only
@pytest.mark.parametrize("case", CASES, ids=[f"sq{q}-hkv{h}-splits{s}" for q, h, s in CASES])
def test_ragged_cache_against_fp64(case: tuple[int, int, int]):
    seqlen_q, kv_heads, num_splits = case
    problem = _decode_problem(seqlen_q, kv_heads, heads=8 if seqlen_q < 16 else 4)
    result = _check(problem, num_splits, seed=seqlen_q + kv_heads)
    assert result.ok, f"{problem.describe()} splits={num_splits}: {result.summary()}"


@interpreter_only
@pytest.mark.parametrize("causal_alignment", ["top_left", "bottom_right", None])
def test_padded_cache_alignments_fp16(causal_alignment: str | None):
    """No cache lengths: the padded Sk for every sequence, fp16, each mask; zero-mean V."""
    problem = _decode_problem(
        4, 2, batch=2, dtype=torch.float16, has_cache_seqlens=False, causal=causal_alignment is not None,
        causal_alignment=causal_alignment or "top_left",
    )  # fmt: skip
    result = _check(problem, 3, offset=0.0)
    assert result.ok, f"{problem.describe()}: {result.summary()}"


@interpreter_only
def test_one_split_writes_o_and_lse_directly_and_many_splits_agree():
    problem = _decode_problem(2, 2)
    q, k, v = make_inputs(problem, seed=3, device="cpu")
    lengths = torch.tensor(LENGTHS, dtype=torch.int32)
    one = decode.prepare(q, k, v, problem, cache_seqlens=lengths, num_splits=1)
    many = decode.prepare(q, k, v, problem, cache_seqlens=lengths, num_splits=7)
    assert (one.num_splits, many.num_splits) == (1, 7)
    assert (one.fused_merge, many.fused_merge) == (False, True)  # one split: O written directly, no counter
    (out_one, lse_one), (out_many, lse_many) = one(), many()
    torch.testing.assert_close(out_many, out_one, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse_many, lse_one, atol=1e-5, rtol=1e-5)
    # The empty sequence: O = 0 and LSE = -inf however many splits.
    assert torch.equal(out_many[1], torch.zeros_like(out_many[1])) and torch.isneginf(lse_many[1]).all()


def test_prefill_sized_problem_is_refused():
    ok, reason = decode.supports(Problem(1, 8, 17, 300, 64, dtype=torch.float16), CPU)
    assert not ok and "use a prefill rung" in reason
    ok, reason = decode.supports(Problem(1, 8, 1, 300, 96, dtype=torch.float16), CPU)
    assert not ok and "head_dim" in reason


# ----------------------------------------------------------------------------------------------------
# The split rule
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("uneven", [False, True], ids=["even", "uneven"])
@pytest.mark.parametrize("ctas_per_split", [1, 8, 32, 64, 256, 2048])
@pytest.mark.parametrize("seqlen_k", [1024, 4096, 32768, 131072])
def test_split_rule_fills_the_waves(ctas_per_split: int, seqlen_k: int, uneven: bool):
    sms, batch = 132, max(1, ctas_per_split // 8)
    chosen = splits.choose_num_splits(ctas_per_split, seqlen_k, sms, uneven, batch)
    most = min(splits.MAX_SPLITS, seqlen_k // splits.MIN_KEYS_PER_SPLIT)
    assert 1 <= chosen <= splits.MAX_SPLITS and (chosen == 1 or seqlen_k // chosen >= splits.MIN_KEYS_PER_SPLIT)
    # Uneven work: at least UNEVEN_MIN_WAVES waves of CTAs, and one sequence's 8 CTAs per split filling
    # a wave (up to UNEVEN_MAX_WAVES waves), where the keys allow that many splits.
    waves = -(-splits.UNEVEN_MIN_WAVES * sms // ctas_per_split)
    alone = min(-(-sms // 8), max(1, splits.UNEVEN_MAX_WAVES * sms // ctas_per_split))
    fewest = min(most, max(waves, alone)) if uneven else 1
    assert chosen >= fewest
    allowed = range(fewest, most + 1)
    best = max(splits.wave_efficiency(ctas_per_split * s, sms) for s in allowed)
    assert splits.wave_efficiency(ctas_per_split * chosen, sms) >= best * (1 - splits.WAVE_TOLERANCE)
    # Never more splits than needed: no smaller count fills the waves as well.
    assert all(
        splits.wave_efficiency(ctas_per_split * s, sms) < best * (1 - splits.WAVE_TOLERANCE)
        for s in range(fewest, chosen)
    )


def test_split_rule_examples(monkeypatch: pytest.MonkeyPatch):
    # One sequence, 8 KV heads, 128k keys: 8 CTAs alone would use 8 of 132 SMs.
    assert splits.wave_efficiency(8 * splits.choose_num_splits(8, 131072, 132), 132) >= 0.95
    # A full batch already fills the GPU: no split, no merge.
    assert splits.choose_num_splits(64 * 32, 131072, 132) == 1
    # A short cache keeps MIN_KEYS_PER_SPLIT keys per split.
    assert splits.choose_num_splits(1, 1024, 132) == 1024 // splits.MIN_KEYS_PER_SPLIT
    # The plan reads the padded Sk, never the cache lengths (bind takes no lengths' values); one
    # sequence's splits are even, with or without its length.
    problem = Problem(1, 32, 1, 131072, 128, kv_heads=8, has_cache_seqlens=True)
    # triton/decode asks for two CTA slots an SM on even work (SPLIT_CTAS_PER_SM): twice the splits.
    assert decode.planned_num_splits(problem, CPU) == 2 * splits.choose_num_splits(8, 131072, splits.DEFAULT_SM_COUNT)
    monkeypatch.setattr(decode, "SPLIT_CTAS_PER_SM", 1)
    assert decode.planned_num_splits(problem, CPU) == splits.choose_num_splits(8, 131072, splits.DEFAULT_SM_COUNT)
    # Eight sequences with their own lengths (the sweep's ragged batch): one sequence's 8 CTAs per split
    # alone fill a wave at 17 splits, and 18 fill the waves best, not the one wave that two splits
    # would fill (results/h100/decode/splits/: 16 splits the fastest or within 1 % of it).
    ragged = Problem(8, 32, 1, 32768, 128, kv_heads=8, has_cache_seqlens=True)
    assert splits.choose_num_splits(64, 32768, 132) == 2
    assert decode.planned_num_splits(ragged, CPU) == 18
    # A large ragged batch stops at UNEVEN_MAX_WAVES waves of (mostly empty) CTAs.
    assert splits.choose_num_splits(64 * 4, 44800, 132, uneven=True, batch=64) == 8
    assert decode.planned_num_splits(ragged.with_(has_cache_seqlens=False), CPU) == 2


def test_forced_split_count_overrides_the_rule_and_must_be_positive():
    problem = Problem(1, 32, 1, 131072, 128, kv_heads=8)
    assert splits.resolve_num_splits(None, problem, 1, CPU) == splits.planned_num_splits(problem, 1, CPU)
    assert splits.resolve_num_splits(3, problem, 1, CPU) == 3
    with pytest.raises(ValueError, match="num_splits must be >= 1, got 0"):
        splits.resolve_num_splits(0, problem, 1, CPU)
    # Every decode rung's bind goes through it, before any launch or allocation.
    with pytest.raises(ValueError, match="num_splits must be >= 1"):
        small = problem.with_(seqlen_k=64)
        decode.bind(*make_inputs(small, seed=0, device="cpu"), small, num_splits=0)


@interpreter_only
@pytest.mark.parametrize("splits_per_step", [1, 8])
def test_merge_reads_the_splits_in_steps(splits_per_step: int, monkeypatch: pytest.MonkeyPatch):
    """The merge reads MERGE_SPLITS_PER_STEP splits a step: 11 splits of a 704-key sequence (one 64-key
    block each, none empty) are 8 + 3 (a masked last step) or one at a time (the merge before issue #38's
    floor, bench/decode_floor.py's "before"); both match fp64 (a mask `split < num_splits - 1` planted in
    the merge fails both: checked by hand)."""
    monkeypatch.setattr(decode, "MERGE_SPLITS_PER_STEP", splits_per_step)
    problem = _decode_problem(1, 2, seqlen_k=704)
    q, k, v = make_inputs(problem, seed=5, device="cpu", offset=0.5)
    lengths = torch.tensor((704, 0, 131), dtype=torch.int32)
    result = check_on_inputs(_with_splits(11), q, k, v, problem, cache_seqlens=lengths)
    assert result.ok, f"{problem.describe()} splits=11, {splits_per_step} a step: {result.summary()}"


# ----------------------------------------------------------------------------------------------------
# The fused merge: the last split of a tile to arrive merges, and resets its arrival counter
# ----------------------------------------------------------------------------------------------------
# 16 tokens of MQA over 8 heads: 128 packed rows, two 64-row M tiles (two counters per sequence; the tests
# turn WIDE_M_TILE's one 128-row tile off), three splits of the ragged LENGTHS (the empty sequence's splits
# all empty, the 131-key one's last empty).
FUSED_PROBLEM = _decode_problem(16, 1)


def _fused_twice_and_two_launches() -> tuple[list, tuple]:
    """Two poisoned calls of one fused runner in a row, and one of the two-launch path (FUSED_MERGE
    off at bind), on FUSED_PROBLEM with three splits: ([first, second], two_launch), each (O, lse)."""
    q, k, v = make_inputs(FUSED_PROBLEM, seed=11, device="cpu", offset=0.5)
    lengths = torch.tensor(LENGTHS, dtype=torch.int32)
    fused = decode.bind(q, k, v, FUSED_PROBLEM, cache_seqlens=lengths, num_splits=3)
    assert fused.fused_merge and decode.m_blocks_for(FUSED_PROBLEM) == 2
    calls = [tuple(t.clone() for t in run_poisoned(fused)) for _ in range(2)]
    decode.FUSED_MERGE = False
    try:
        two_launch = decode.bind(q, k, v, FUSED_PROBLEM, cache_seqlens=lengths, num_splits=3)
    finally:
        decode.FUSED_MERGE = True
    assert not two_launch.fused_merge
    return calls, run_poisoned(two_launch)


@interpreter_only
def test_fused_merge_twice_in_a_row_equals_the_two_launch_merge_bit_for_bit(monkeypatch: pytest.MonkeyPatch):
    """Each call of a fused runner (run_poisoned: two calls each) writes every row, so its counters were
    back to 0 after the call before; the result is the two-launch path's, bit for bit (one merge_splits
    in both), which test_ragged_cache_against_fp64 and test_two_launch_merge_against_fp64 hold to fp64.
    A counter left at its count fails: test_planted_counter_not_reset_fails_the_next_call."""
    monkeypatch.setattr(decode, "WIDE_M_TILE", False)
    calls, two_launch = _fused_twice_and_two_launches()
    for out, lse in (*calls, two_launch):
        assert not out.isnan().any() and not lse.isnan().any(), "a row left unwritten (poisoned)"
    for out, lse in calls:
        assert torch.equal(out, two_launch[0]) and torch.equal(lse, two_launch[1])
    assert not decode.arrival_counters(CPU, 1).any(), "counters left non-zero after the launches"


@triton.jit
def _arrive_without_reset(Counter, num_splits):
    tl.debug_barrier()
    arrived = tl.atomic_add(Counter, 1, sem="acq_rel", scope="gpu")
    return arrived == num_splits - 1


@interpreter_only
def test_planted_counter_not_reset_fails_the_next_call(monkeypatch: pytest.MonkeyPatch):
    """The last CTA merges but leaves its counter at num_splits: the next launch's arrivals (the poisoned
    one of each run_poisoned) count past num_splits - 1, nobody merges, and O stays NaN."""
    monkeypatch.setattr(decode, "_ARRIVAL_COUNTERS", {})  # the dirtied counters go with the test
    monkeypatch.setattr(decode, "WIDE_M_TILE", False)
    monkeypatch.setattr(decode, "last_to_arrive", _arrive_without_reset)
    calls, _ = _fused_twice_and_two_launches()
    assert all(out.isnan().any() for out, _ in calls), "a launch merged although its counters were not reset"


@interpreter_only
def test_two_launch_merge_against_fp64(monkeypatch: pytest.MonkeyPatch):
    """The two-launch path (kept for the A/B, and gluon/decode's merge) against fp64: ragged, GQA, LSE."""
    monkeypatch.setattr(decode, "FUSED_MERGE", False)
    problem = _decode_problem(5, 2)
    result = _check(problem, 3, seed=7)
    assert result.ok, f"{problem.describe()} splits=3, two launches: {result.summary()}"


def test_arrival_counters_grow_for_a_larger_grid_and_stay_per_device(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(decode, "_ARRIVAL_COUNTERS", {})
    small = decode.arrival_counters(CPU, 10)
    assert small.numel() == decode.MIN_ARRIVAL_COUNTERS and small.dtype == torch.int32 and not small.any()
    assert decode.arrival_counters(CPU, decode.MIN_ARRIVAL_COUNTERS) is small
    large = decode.arrival_counters(CPU, 3 * decode.MIN_ARRIVAL_COUNTERS)
    assert large.numel() == 4 * decode.MIN_ARRIVAL_COUNTERS and not large.any()
    assert decode.arrival_counters(CPU, 10) is large


# ----------------------------------------------------------------------------------------------------
# Planted bugs the check must catch
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _drop_split_one(split, num_splits, key_end, BLOCK_N: tl.constexpr):
    key_begin, key_end = split_key_range(split, num_splits, key_end, BLOCK_N)
    return key_begin, tl.where(split == 1, key_begin, key_end)


@triton.jit
def _ignore_cache_seqlens(
    CacheSeqlens, batch, seqlen_q, seqlen_k, HAS_CACHE_SEQLENS: tl.constexpr, BOTTOM_RIGHT: tl.constexpr
):  # fmt: skip
    causal_offset = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0
    return seqlen_k, causal_offset


PLANTED = {
    "dropped split": ("split_key_range", _drop_split_one),
    "merge weighs natural-log LSEs as log2": ("MERGE_LOG2_E", tl.constexpr(1.0)),
    "split reads past its sequence's length": ("seqlen_info", _ignore_cache_seqlens),
}


@interpreter_only
@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_bug_fails_the_check(bug: str, monkeypatch: pytest.MonkeyPatch):
    problem = _decode_problem(1, 2)  # passes unplanted: test_ragged_cache_against_fp64[sq1-hkv2-splits3]
    name, replacement = PLANTED[bug]
    # The merge's constant is _decode_merge's global (merge_splits'), the others decode's.
    monkeypatch.setattr(_decode_merge if name == "MERGE_LOG2_E" else decode, name, replacement)
    result = _check(problem, 3)
    assert not result.ok, f"{bug}: the check passed a wrong kernel ({result.summary()})"


# ----------------------------------------------------------------------------------------------------
# The balanced split (the default for a call with cache_seqlens): equal shares of the valid keys, planned on the device
# ----------------------------------------------------------------------------------------------------
# Wildly different lengths: one long sequence, many short ones, empty ones, one ending mid-block.
BALANCED_LENGTHS = (1000, 0, 5, 64, 1, 0, 130)
# (Sq, kv_heads, D, page size, lengths, forced shares): one token of GQA among many sequences; 4 tokens
# paged (pages of 16 keys); 16 tokens of MQA at D=256 (32-key blocks, a 64-row M tile). Each grid has
# CTAs past the last share. (The host's plan, 264 shares on the interpreter's 132 SMs, would take 10 s.)
BALANCED_CASES = [
    (1, 2, 64, 0, BALANCED_LENGTHS, 12),
    (4, 2, 128, 16, BALANCED_LENGTHS[:4], 5),
    (16, 1, 256, 0, (1000, 3, 0), 4),
]


def _balanced_problem(seqlen_q: int, kv_heads: int, head_dim: int, page_size: int, lengths: tuple) -> Problem:
    heads = 8 if seqlen_q < 16 else 4
    seqlen_k = -(-max(lengths) // page_size) * page_size if page_size else max(lengths)  # paged: whole pages
    return _decode_problem(
        seqlen_q, kv_heads, heads=heads, batch=len(lengths), seqlen_k=seqlen_k, head_dim=head_dim,
        page_size=page_size,
    )  # fmt: skip


def _balanced_check(case: tuple, *, seed: int = 0):
    """``check_on_inputs`` (fp64, poisoned) of the balanced split on ``case``, its shares forced."""
    seqlen_q, kv_heads, head_dim, page_size, lengths, shares = case
    problem = _balanced_problem(seqlen_q, kv_heads, head_dim, page_size, lengths)
    q, k, v = make_inputs(problem, seed=seed, device="cpu", offset=0.5)
    extra = {"cache_seqlens": torch.tensor(lengths, dtype=torch.int32)}
    if page_size:
        k, v, extra["block_table"] = make_paged_kv(problem, k, v, seed=seed)
    return problem, check_on_inputs(_with_splits(shares), q, k, v, problem, **extra)


@pytest.fixture
def balanced(monkeypatch: pytest.MonkeyPatch) -> None:
    """The knob on, and shares of at least one 64-key block (not 512 keys), so that the interpreter's
    short caches are cut into several shares per (batch, KV head)."""
    monkeypatch.setattr(decode, "BALANCED_SPLIT", "always")
    monkeypatch.setattr(decode, "BALANCED_MIN_KEYS", 64)


def test_balanced_split_is_the_default_with_cache_seqlens_and_its_grid_is_fixed_by_the_shape(
    monkeypatch: pytest.MonkeyPatch,
):
    """As committed ("ragged-split-long"), a call with cache_seqlens over several sequences that the split rule
    splits takes the balanced split, and so does any call the rule splits past LONG_CHAIN_SPLITS; one sequence,
    a rule of one split or no cache_seqlens below that the padded-Sk split. The balanced grid follows from the
    shape and the SM count (a CUDA graph keeps it), never from the lengths."""
    monkeypatch.setattr(decode, "BALANCED_SPLIT", COMMITTED_BALANCED_SPLIT)
    assert COMMITTED_BALANCED_SPLIT == "ragged-split-long"
    problem = _balanced_problem(1, 2, 64, 0, (300, 0, 131))
    long = problem.with_(seqlen_k=65536)
    assert decode.planned_num_splits(long, CPU) > 1 and decode.balanced_split(long, CPU)
    for short in (long.with_(has_cache_seqlens=False, seqlen_k=16384), long.with_(batch=1, seqlen_k=16384)):
        assert 1 < decode.planned_num_splits(short, CPU) <= splits.LONG_CHAIN_SPLITS
        assert not decode.balanced_split(short, CPU), short.describe()
        longer = short.with_(seqlen_k=65536)
        assert decode.planned_num_splits(longer, CPU) > splits.LONG_CHAIN_SPLITS
        assert decode.balanced_split(longer, CPU), longer.describe()
    assert decode.balanced_split(problem, CPU) == (decode.planned_num_splits(problem, CPU) > 1)
    monkeypatch.setattr(decode, "BALANCED_SPLIT", "ragged")
    inputs = make_inputs(problem, seed=0, device="cpu")
    lengths = torch.tensor((300, 0, 131), dtype=torch.int32)
    assert decode.bind(*inputs, problem, cache_seqlens=lengths, num_splits=3).balanced is True
    full = problem.with_(has_cache_seqlens=False)
    assert decode.bind(*inputs, full, num_splits=3).balanced is False
    # A 300-key cache: one 512-key share per sequence at most, so 3 sequences x 2 KV heads, not 264.
    assert decode.balanced_target_shares(problem, CPU) == 6
    long = problem.with_(seqlen_k=65536)
    assert decode.balanced_target_shares(long, CPU) == splits.DEFAULT_SM_COUNT * decode.BALANCED_SHARES_PER_SM
    mqa = _decode_problem(16, 1, heads=8).with_(seqlen_k=65536)  # 128 packed rows: one wide M tile
    triton_wide_tile_at_every_head_dim(monkeypatch)  # the default leaves D=64 to 64-row tiles
    # The wide tile holds one CTA an SM (ONE_SLOT_ONE_WAVE): one wave of its slots less the 3 items.
    assert decode.balanced_target_shares(mqa, CPU) == splits.DEFAULT_SM_COUNT - mqa.batch * mqa.kv_heads
    monkeypatch.setattr(decode, "WIDE_M_TILE", False)  # two 64-row M tiles share the SMs
    assert decode.balanced_target_shares(mqa, CPU) == splits.DEFAULT_SM_COUNT * decode.BALANCED_SHARES_PER_SM // 2
    with pytest.raises(ValueError, match="must be >= 1, got 0"):
        decode.bind_balanced(*make_inputs(problem, seed=0, device="cpu"), problem, shares=0)


@interpreter_only
@pytest.mark.parametrize(
    "case", BALANCED_CASES, ids=[f"sq{c[0]}-hkv{c[1]}-d{c[2]}-page{c[3]}-shares{c[5]}" for c in BALANCED_CASES]
)
def test_balanced_split_against_fp64(case: tuple, balanced: None):
    problem, result = _balanced_check(case, seed=case[0] + case[2])
    assert result.ok, f"{problem.describe()} balanced, shares={case[5]}: {result.summary()}"


@interpreter_only
def test_balanced_split_is_deterministic_and_replays_with_new_lengths(balanced: None):
    """One bound runner: two calls give the same bits (every row written: poisoned first), and after the
    lengths change in place (as a CUDA-graph replay sees them) it equals the default path on the new
    lengths, so the plan read them on the device."""
    problem = _balanced_problem(1, 2, 64, 0, BALANCED_LENGTHS)
    q, k, v = make_inputs(problem, seed=21, device="cpu", offset=0.5)
    lengths = torch.tensor(BALANCED_LENGTHS, dtype=torch.int32)
    run = decode.bind(q, k, v, problem, cache_seqlens=lengths, num_splits=6)
    assert run.balanced and run.num_splits == 6
    first = [t.clone() for t in run_poisoned(run)]
    assert not any(t.isnan().any() for t in first), "a row left unwritten (poisoned)"
    assert all(map(torch.equal, first, run()))
    lengths.copy_(torch.tensor((3, 1000, 0, 0, 200, 64, 1), dtype=torch.int32))
    replayed = run_poisoned(run)
    decode.BALANCED_SPLIT = "never"  # restored by the fixture's monkeypatch
    default = run_poisoned(decode.bind(q, k, v, problem, cache_seqlens=lengths, num_splits=3))
    for got, expected in zip(replayed, default, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@triton.jit
def _shift_one_block(split, num_splits, key_end, BLOCK_N: tl.constexpr):
    key_begin, split_end = split_key_range(split, num_splits, key_end, BLOCK_N)
    return tl.minimum(key_begin + BLOCK_N, key_end), tl.minimum(split_end + BLOCK_N, key_end)


@triton.jit
def _one_share_too_many(blocks, chunk):
    return tl.maximum((blocks + chunk - 1) // chunk, 1) + 1


BALANCED_PLANTED = {
    **{bug: PLANTED[bug] for bug in ("dropped split", "split reads past its sequence's length")},
    "every share's keys one block late (an off-by-one in the key range mapping)": ("split_key_range", _shift_one_block),
    "one share per item too many (the merge waits for a share no CTA runs)": ("item_shares_of", _one_share_too_many),
}


@interpreter_only
@pytest.mark.parametrize("bug", sorted(BALANCED_PLANTED))
def test_planted_bug_fails_the_balanced_check(bug: str, balanced: None, monkeypatch: pytest.MonkeyPatch):
    """Each planted bug fails the fp64 check of a case that passes unplanted (the first BALANCED_CASES)."""
    monkeypatch.setattr(decode, "_ARRIVAL_COUNTERS", {})  # counters a bug leaves dirty go with the test
    name, replacement = BALANCED_PLANTED[bug]
    # The plan's helpers are _device's globals (balanced_share's), the others decode's.
    monkeypatch.setattr(device if name == "item_shares_of" else decode, name, replacement)
    _, result = _balanced_check(BALANCED_CASES[0], seed=1)
    assert not result.ok, f"{bug}: the check passed a wrong kernel ({result.summary()})"


# ----------------------------------------------------------------------------------------------------
# GPU: every decode rung at decode sizes
# ----------------------------------------------------------------------------------------------------
class GpuCase(NamedTuple):
    """One GPU decode problem of 4 sequences and 32 query heads. ``alignment`` None: not causal.
    ``ragged``: lengths (Sk, 0, Sk // 3 + 1, 5) through cache_seqlens (5 < Sq leaves the first rows of
    that sequence no key under bottom-right); else every sequence has the padded Sk. ``splits`` None:
    the rung's own rule."""

    seqlen_q: int
    kv_heads: int
    seqlen_k: int
    head_dim: int = 128
    dtype: torch.dtype = torch.bfloat16
    alignment: str | None = "bottom_right"
    splits: int | None = None
    ragged: bool = True
    return_lse: bool = True

    @property
    def name(self) -> str:
        dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}[self.dtype]
        mask = self.alignment or "full"
        splits = f"splits{self.splits}" if self.splits else "rule"
        extras = ("" if self.ragged else "-padded") + ("" if self.return_lse else "-nolse")
        shape = f"sq{self.seqlen_q}-hkv{self.kv_heads}-sk{self.seqlen_k}-d{self.head_dim}"
        return f"{shape}-{dtype}-{mask}-{splits}{extras}"

    def problem(self) -> Problem:
        return Problem(
            4, 32, self.seqlen_q, self.seqlen_k, self.head_dim, dtype=self.dtype, causal=self.alignment is not None,
            kv_heads=self.kv_heads, causal_alignment=self.alignment or "top_left", has_cache_seqlens=self.ragged,
            return_lse=self.return_lse,
        )  # fmt: skip

    def cache_seqlens(self) -> torch.Tensor | None:
        if not self.ragged:
            return None
        lengths = [self.seqlen_k, 0, self.seqlen_k // 3 + 1, 5]
        return torch.tensor(lengths, dtype=torch.int32, device="cuda")


# GQA (group 4), MHA and MQA (16 tokens of 32 heads: 512 packed rows, several M tiles); the split rule
# and forced counts (1: the split kernel writes O and the LSE itself; 7 on short sequences: empty
# splits); an odd Sk; both alignments and no mask; D 64, 128 and 256; fp16 and bf16; no LSE.
GPU_CASES = [
    GpuCase(1, 8, 4096),
    GpuCase(4, 8, 32768, splits=3),
    GpuCase(1, 32, 8192),
    GpuCase(16, 1, 4096, splits=5),
    GpuCase(1, 8, 4096, splits=1),
    GpuCase(3, 4, 1000, head_dim=64, dtype=torch.float16, splits=7),
    GpuCase(16, 32, 2048, dtype=torch.float16, alignment="top_left", splits=2),
    GpuCase(8, 2, 3000, head_dim=256, alignment=None),
    GpuCase(2, 8, 5000, head_dim=64, alignment=None, splits=1, ragged=False, return_lse=False),
    GpuCase(16, 4, 777, head_dim=256, dtype=torch.float16, splits=4),
]


def _gpu_check_or_skip(impl: Implementation, problem: Problem) -> None:
    ok, reason = impl.check(problem, torch.device("cuda"))
    if not ok:
        # A rung may lack a head dim or a feature; it must say so through its capability check.
        pytest.skip(f"{impl.name}: {reason}")


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=[case.name for case in GPU_CASES])
@pytest.mark.parametrize("impl_name", sorted(DECODE_IMPLS))
def test_gpu_decode_against_fp64(impl_name: str, case: GpuCase):
    impl = DECODE_IMPLS[impl_name]
    problem = case.problem()
    _gpu_check_or_skip(impl, problem)
    # Offset inputs and zero-mean ones, alternately.
    offset = 0.5 if GPU_CASES.index(case) % 2 == 0 else 0.0
    q, k, v = make_inputs(problem, seed=GPU_CASES.index(case) + 1, device="cuda", offset=offset)
    forced = impl if case.splits is None else _with_splits(case.splits, impl)
    result = check_on_inputs(forced, q, k, v, problem, cache_seqlens=case.cache_seqlens())
    assert result.ok, f"{impl_name} {problem.describe()} splits={case.splits}: {result.summary()}"


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, 4, 16])
@pytest.mark.parametrize("impl_name", sorted(DECODE_IMPLS))
def test_gpu_empty_sequence_gives_zero_and_minus_inf(impl_name: str, num_splits: int):
    """A sequence of no keys: O = 0 and LSE = -inf however many splits (every split of it is empty);
    the forced split count is the one launched; every other row is finite (poisoned first)."""
    impl = DECODE_IMPLS[impl_name]
    problem = Problem(
        3, 8, 2, 1500, 128, dtype=torch.bfloat16, causal=True, kv_heads=2, causal_alignment="bottom_right",
        has_cache_seqlens=True, return_lse=True,
    )  # fmt: skip
    _gpu_check_or_skip(impl, problem)
    q, k, v = make_inputs(problem, seed=5, device="cuda")
    lengths = torch.tensor([1500, 0, 131], dtype=torch.int32, device="cuda")
    run = impl.prepare(q, k, v, problem, cache_seqlens=lengths, num_splits=num_splits)
    assert run.num_splits == num_splits
    out, lse = run_poisoned(run)
    assert torch.equal(out[1], torch.zeros_like(out[1])) and torch.isneginf(lse[1]).all()
    assert torch.isfinite(out).all() and torch.isfinite(lse[[0, 2]]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("impl_name", sorted(DECODE_IMPLS))
def test_gpu_strided_inputs(impl_name: str):
    """q, k and v as (B, S, H, D) tensors seen as (B, H, S, D): the packed rows of a KV group are not
    one slab of memory, and consecutive keys are H·D elements apart."""
    impl = DECODE_IMPLS[impl_name]
    problem = Problem(
        2, 16, 4, 3000, 128, dtype=torch.float16, causal=True, kv_heads=4, causal_alignment="bottom_right"
    )
    _gpu_check_or_skip(impl, problem)
    generator = torch.Generator(device="cpu").manual_seed(9)

    def draw(heads: int, seqlen: int) -> torch.Tensor:
        shape = (problem.batch, seqlen, heads, problem.head_dim)
        return torch.randn(shape, generator=generator).to("cuda", torch.float16).transpose(1, 2)

    q, k, v = draw(16, 4), draw(4, 3000), draw(4, 3000) + 0.5
    assert not q.is_contiguous() and not k.is_contiguous()
    result = check_on_inputs(_with_splits(3, impl), q, k, v, problem)
    assert result.ok, f"{impl_name} {problem.describe()}: {result.summary()}"


# The lengths a captured decode step replays with: the cache grows by one token per step, and a batch
# slot is refilled with a short prompt (issue #38 item 5: no host sync, no reallocation per step).
GRAPH_LENGTHS = ((3000, 17, 4096, 1), (3001, 18, 4096, 2), (3002, 4000, 9, 0))


# GPU_CASES with forced split counts (several M tiles, empty splits, D 64 to 256, no mask).
FUSED_GPU_CASES = [case for case in GPU_CASES if case.splits and case.splits > 1]


@pytest.mark.gpu
@pytest.mark.parametrize("case", FUSED_GPU_CASES, ids=[case.name for case in FUSED_GPU_CASES])
@pytest.mark.parametrize("impl_name", ["triton/decode", "gluon/decode"])
def test_gpu_fused_merge_is_deterministic_and_equals_two_launches(
    impl_name: str, case: GpuCase, monkeypatch: pytest.MonkeyPatch
):
    """The fused merge on the GPU, where the last CTA to arrive varies from launch to launch: 20 launches
    give the same bits, which are the two-launch path's (triton/decode's merge_splits in both; gluon's
    copy of it does the same operations in the same order)."""
    impl = DECODE_IMPLS[impl_name]
    problem = case.problem()
    _gpu_check_or_skip(impl, problem)
    q, k, v = make_inputs(problem, seed=4, device="cuda", offset=0.5)
    lengths = case.cache_seqlens()
    fused = impl.prepare(q, k, v, problem, cache_seqlens=lengths, num_splits=case.splits)
    assert fused.fused_merge
    first = [t.clone() for t in _as_tuple(run_poisoned(fused))]
    assert not any(t.isnan().any() for t in first), "a row left unwritten (poisoned)"
    for launch in range(20):
        again = _as_tuple(fused())
        assert all(map(torch.equal, first, again)), f"launch {launch + 2} differs from the first"
    monkeypatch.setattr(decode, "FUSED_MERGE", False)
    two_launch = impl.prepare(q, k, v, problem, cache_seqlens=lengths, num_splits=case.splits)
    assert not two_launch.fused_merge
    assert all(map(torch.equal, first, _as_tuple(run_poisoned(two_launch)))), "fused and two launches differ"


def _as_tuple(result: torch.Tensor | tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return result if isinstance(result, tuple) else (result,)


@pytest.mark.gpu
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("impl_name", sorted(DECODE_IMPLS))
def test_gpu_decode_step_replays_in_a_cuda_graph_with_new_lengths(impl_name: str, paged: bool):
    """A decode step captured once in a CUDA graph, replayed after ``cache_seqlens`` changes in place:
    each replay writes (poisoned first) exactly what an eager call with those lengths writes, and the
    lengths change the answer (so a graph that froze them would fail)."""
    _check_graph_replays(DECODE_IMPLS[impl_name], paged)


def _check_graph_replays(impl: Implementation, paged: bool) -> None:
    impl_name = impl.name
    problem = Problem(
        4, 16, 1, 4096, 128, dtype=torch.bfloat16, causal=True, kv_heads=4, causal_alignment="bottom_right",
        has_cache_seqlens=True, page_size=64 if paged else 0,
    )  # fmt: skip
    _gpu_check_or_skip(impl, problem)
    q, k, v = make_inputs(problem, seed=3, device="cuda", offset=0.5)
    extra = {}
    if paged:
        k, v, extra["block_table"] = make_paged_kv(problem, k, v, seed=3)
    lengths = torch.tensor(GRAPH_LENGTHS[0], dtype=torch.int32, device="cuda")
    run = impl.prepare(q, k, v, problem, cache_seqlens=lengths, **extra)
    graph, captured = capture(run)
    answers = []
    for step in GRAPH_LENGTHS:
        lengths.copy_(torch.tensor(step, dtype=torch.int32))
        eager = run().clone()
        captured.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, eager), f"{impl_name}: the replay at lengths {step} differs from an eager call"
        answers.append(eager)
    assert not torch.equal(answers[0], answers[1]) and not torch.equal(answers[1], answers[2])


# The balanced split kernel compiled for sm_90a (a child process without the interpreter) with each problem's
# tile (tile_config): D 64 paged, D 128 at one token and 16 (MQA: 512 packed rows, WIDE_M_TILE's 128-row
# tiles on 8 warps), D 256 at 4 tokens; the cp.async pipeline and the shared
# memory of the default split kernel (its K/V stages kept), the arrival atomic; no spills, except one value
# of the plan that some releases keep on the stack across the key loop (one STL and one LDL in the whole
# kernel; the default kernel needs none), bounded per release (bytes per thread, measured 2026-11-29).
BALANCED_COMPILES = [(64, 2, 64), (128, 1, 0), (128, 16, 0), (256, 4, 0)]
# Spill bytes a release's balanced kernel keeps outside every loop (never inside one: the test counts local accesses in
# the SASS loops), since the two-level merge's runs (BALANCED_MERGE_GROUP = 8): the plan's values across the key loop;
# under 3.6 the D=128 Sq=1 kernel's one key loop (ONE_KEY_LOOP, 128 registers) keeps 16 bytes so.
BALANCED_SPILL_BYTES: dict[tuple[str, tuple[int, int, int]], int] = {
    ("3.6", (256, 4, 0)): 16,
    ("3.6", (128, 1, 0)): 16,
    ("3.8", (64, 2, 64)): 8,
}
_BALANCED_COMPILE_SCRIPT = """
import json, sys, torch
from common.contract.problem import Problem
from common.reporting.static import cubin_resources, cubin_sass, sass_loops
from tests._helpers import triton_balanced_sm90
from triton_impl import decode
results = []
for head_dim, seqlen_q, page_size in json.loads(sys.argv[1]):
    problem = Problem(
        8, 32, seqlen_q, 32768, head_dim, dtype=torch.bfloat16, causal=True, kv_heads=1 if seqlen_q == 16 else 8,
        causal_alignment="bottom_right", has_cache_seqlens=True, return_lse=True, page_size=page_size,
    )
    binary = triton_balanced_sm90(problem)
    (resources,) = cubin_resources(binary.cubin).values()
    loops = sass_loops(cubin_sass(binary.cubin))
    results.append({
        "registers": resources["registers"], "spill_bytes": resources["local_bytes"] + resources["stack_bytes"],
        "shared_bytes": binary.shared_bytes, "default_shared_bytes": decode.compile_sm90(problem)[0].shared_bytes,
        "cp_async": "cp.async" in binary.ptx, "arrival_atomic": "atom.global.gpu.acq_rel.add" in binary.ptx,
        "loop_spills": sum(op.startswith(("STL", "LDL")) for _, body in loops for op in body),
    })
print(json.dumps(results))
"""


@pytest.mark.static
@pytest.mark.release
def test_balanced_split_kernel_compiles_for_sm90_without_spills():
    compiled = json_from_child(["-c", _BALANCED_COMPILE_SCRIPT, json.dumps(BALANCED_COMPILES)], timeout=1200)
    for case, result in zip(BALANCED_COMPILES, compiled, strict=True):
        head_dim, seqlen_q, page_size = case
        where = f"D={head_dim} Sq={seqlen_q} page={page_size}: {result}"
        assert result["loop_spills"] == 0, where
        assert result["spill_bytes"] <= BALANCED_SPILL_BYTES.get((triton_release(), case), 0), where
        assert result["cp_async"] and result["arrival_atomic"], where
        assert result["shared_bytes"] == result["default_shared_bytes"], where


# ----------------------------------------------------------------------------------------------------
# GPU: triton/decode's balanced split (BALANCED_SPLIT "always"): fp64, determinism, a CUDA graph
# ----------------------------------------------------------------------------------------------------
# The ragged GPU_CASES (lengths Sk, 0, Sk // 3 + 1, 5): GQA, MQA at 16 tokens (several M tiles), D 64 to
# 256, fp16 and bf16, both alignments and none; shares forced where the case forces splits.
BALANCED_GPU_CASES = [case for case in GPU_CASES if case.ragged]
# The rungs with a balanced split (a BALANCED_SPLIT switch), by module; imported when a test asks (cute: cutlass).
BALANCED_RUNGS = {"triton/decode": "triton_impl.decode", "cute/decode": "cute_impl.decode"}


def _balanced(impl_name: str, monkeypatch: pytest.MonkeyPatch) -> Implementation:
    """``impl_name`` with its balanced split on for every call (``BALANCED_SPLIT = "always"``)."""
    if impl_name == "cute/decode":
        pytest.importorskip("cutlass")
    monkeypatch.setattr(importlib.import_module(BALANCED_RUNGS[impl_name]), "BALANCED_SPLIT", "always")
    return DECODE_IMPLS[impl_name]


@pytest.mark.gpu
@pytest.mark.parametrize("case", BALANCED_GPU_CASES, ids=[case.name for case in BALANCED_GPU_CASES])
@pytest.mark.parametrize("impl_name", sorted(BALANCED_RUNGS))
def test_gpu_balanced_split_against_fp64_and_deterministic(
    impl_name: str, case: GpuCase, monkeypatch: pytest.MonkeyPatch
):
    """Against fp64 (poisoned), then 20 launches with the same bits: the merging CTA varies on a GPU."""
    impl = _balanced(impl_name, monkeypatch)
    problem = case.problem()
    q, k, v = make_inputs(problem, seed=GPU_CASES.index(case) + 1, device="cuda", offset=0.5)
    forced = impl if case.splits is None else _with_splits(case.splits, impl)
    result = check_on_inputs(forced, q, k, v, problem, cache_seqlens=case.cache_seqlens())
    assert result.ok, f"{impl_name} balanced {problem.describe()} shares={case.splits}: {result.summary()}"
    run = forced.prepare(q, k, v, problem, cache_seqlens=case.cache_seqlens())
    assert run.balanced
    assert_launches_repeat(run)


def assert_launches_repeat(run: Callable[[], object], launches: int = 20) -> None:
    """``run`` on a poisoned output, then ``launches`` more calls, all with the same bits (the CTA that
    merges varies from launch to launch on a GPU; the merge's order must not)."""
    first = [t.clone() for t in _as_tuple(run_poisoned(run))]
    for launch in range(launches):
        assert all(map(torch.equal, first, _as_tuple(run()))), f"launch {launch + 2} differs from the first"


# One very long sequence among short and empty ones (issue #38's ragged rows: most padded splits empty),
# bottom-right: GQA at one token with D 64, MQA at 8 tokens with D 256; contiguous and pages of 32 keys.
LONG_AMONG_SHORT = (23, 0, 40000, 1, 700, 5, 64, 3000)
BALANCED_LONG_CASES = [(1, 8, 2, 64), (8, 1, 1, 256)]  # (Sq, heads, kv_heads, D)


@pytest.mark.gpu
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize(
    "case", BALANCED_LONG_CASES, ids=[f"sq{c[0]}-h{c[1]}-hkv{c[2]}-d{c[3]}" for c in BALANCED_LONG_CASES]
)
@pytest.mark.parametrize("impl_name", sorted(BALANCED_RUNGS))
def test_gpu_balanced_split_one_long_sequence_among_short_ones(
    impl_name: str, case: tuple[int, int, int, int], paged: bool, monkeypatch: pytest.MonkeyPatch
):
    impl = _balanced(impl_name, monkeypatch)
    seqlen_q, heads, kv_heads, head_dim = case
    problem = Problem(
        len(LONG_AMONG_SHORT), heads, seqlen_q, 40960, head_dim, dtype=torch.bfloat16, causal=True,
        kv_heads=kv_heads, causal_alignment="bottom_right", has_cache_seqlens=True, return_lse=True,
        page_size=32 if paged else 0,
    )  # fmt: skip
    q, k, v = make_inputs(problem, seed=head_dim + seqlen_q, device="cuda", offset=0.5)
    table = None
    if paged:
        k, v, table = make_paged_kv(problem, k, v, seed=seqlen_q)
    lengths = torch.tensor(LONG_AMONG_SHORT, dtype=torch.int32, device="cuda")
    result = check_on_inputs(impl, q, k, v, problem, cache_seqlens=lengths, block_table=table)
    assert result.ok, f"{impl_name} balanced {problem.describe()}: {result.summary()}"


@pytest.mark.gpu
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("impl_name", sorted(BALANCED_RUNGS))
def test_gpu_balanced_split_replays_in_a_cuda_graph_with_new_lengths(
    impl_name: str, paged: bool, monkeypatch: pytest.MonkeyPatch
):
    _check_graph_replays(_balanced(impl_name, monkeypatch), paged)


# ----------------------------------------------------------------------------------------------------
# gluon/decode on the CPU: capability, split plan, sm_90a compile of its real launches
# ----------------------------------------------------------------------------------------------------
def test_decode_rungs_are_registered():
    assert {"triton/decode", "gluon/decode", "cute/decode"} <= set(DECODE_IMPLS)
    assert DECODE_IMPLS["gluon/decode"].stack == "gluon" and DECODE_IMPLS["gluon/decode"].bind is not None


@pytest.mark.parametrize(
    "problem, needs",
    [
        (Problem(1, 8, 17, 300, 128, dtype=torch.float16), "use a prefill rung"),
        (Problem(1, 8, 1, 300, 96, dtype=torch.float16), "head_dim"),
        (Problem(1, 8, 1, 300, 128, dtype=torch.float32), "fp32"),
        (Problem(1, 8, 1, 300, 128, dtype=torch.float16, softmax_scale=-0.1), "softmax_scale >= 0"),
        (Problem(1, 8, 1, 300, 128, dtype=torch.float16, kv_heads=2, has_cache_seqlens=True), "CUDA GPU"),
    ],
    ids=["prefill-sq", "head-dim-96", "fp32", "negative-scale", "cpu"],
)
def test_gluon_decode_refuses_with_a_reason(problem: Problem, needs: str):
    ok, reason = gluon_decode.supports(problem, torch.device("cpu"))
    assert not ok and needs in reason and "gluon/decode" in reason, reason


def test_gluon_split_plan_counts_its_own_m_tiles(monkeypatch: pytest.MonkeyPatch):
    # 16 tokens of 32 query heads over one KV head: 512 packed rows, eight 64-row M tiles per sequence, two a CTA
    # (TWO_CONSUMERS at D=128: four CTAs a sequence and split); one a CTA without it.
    mqa = Problem(2, 32, 16, 131072, 128, kv_heads=1)
    assert gluon_decode.m_blocks_for(mqa) == 8 and gluon_decode.consumers_for(mqa, CPU) == 2
    assert gluon_decode.planned_num_splits(mqa, CPU) == splits.choose_num_splits(2 * 4, 131072, splits.DEFAULT_SM_COUNT)
    monkeypatch.setattr(gluon_decode, "TWO_CONSUMERS", {})
    expected = splits.choose_num_splits(2 * 8, 131072, splits.DEFAULT_SM_COUNT)
    assert gluon_decode.planned_num_splits(mqa, CPU) == expected
    # One token of a group of 4: one tile; the rule then matches triton/decode's for the same CTAs and the
    # same CTA slots an SM (gluon's D=128 ring leaves one, triton/decode asks for two).
    gqa = Problem(1, 32, 1, 131072, 128, kv_heads=8, has_cache_seqlens=True)
    monkeypatch.setattr(decode, "SPLIT_CTAS_PER_SM", 1)
    assert gluon_decode.planned_num_splits(gqa, CPU) == decode.planned_num_splits(gqa, CPU)


def test_gluon_ring_needs_two_stages():
    # With one stage, block i would be copied only after step i's own wait for it: a hang, refused.
    with pytest.raises(ValueError, match=r"at least 2 stages, got num_stages=1"):
        gluon_decode.DecodeConfig(128, 1)


# Launches whose kernels compile for sm_90a: D 64, 128 and 256; fp16 and bf16; one token and 16;
# GQA, MQA and MHA; both alignments and none; cache lengths and the LSE; one split (O written
# directly) and several (the fp32 partials); the build Triton specialises for Sq = Sk = 1.
GLUON_LAUNCHES = [
    {"head_dim": 64, "dtype": "float16", "seqlen_q": 1, "kv_heads": 8, "splits": 3},
    {"head_dim": 64, "dtype": "bfloat16", "seqlen_q": 16, "kv_heads": 1, "alignment": "bottom_right",
     "lengths": [1000, 5], "return_lse": True, "splits": 1},
    {"head_dim": 128, "dtype": "bfloat16", "seqlen_q": 1, "kv_heads": 2, "alignment": "bottom_right",
     "lengths": [1000, 0], "return_lse": True, "splits": 4},
    {"head_dim": 128, "dtype": "float16", "seqlen_q": 5, "kv_heads": 2, "alignment": "top_left",
     "return_lse": True, "splits": 1},
    {"head_dim": 128, "dtype": "bfloat16", "seqlen_q": 1, "seqlen_k": 1, "kv_heads": 8, "alignment": "top_left",
     "splits": 1},
    {"head_dim": 256, "dtype": "bfloat16", "seqlen_q": 8, "kv_heads": 4, "splits": 2},
    {"head_dim": 256, "dtype": "float16", "seqlen_q": 1, "kv_heads": 1, "alignment": "bottom_right",
     "lengths": [1000, 3], "return_lse": True, "splits": 1},
]  # fmt: skip

_GLUON_LAUNCH_SCRIPT = """
import json, sys
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import make_backend
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import create_function_from_signature
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from common.reporting.static import cubin_resources, cubin_sass, ptx_features
from triton_impl.gluon import decode
kernel = decode._split_kernel
target = GPUTarget("cuda", 90, 32)
backend = make_backend(target)
binder = create_function_from_signature(kernel.signature, kernel.params, backend)
results = []
for launch in json.loads(sys.argv[1]):
    alignment = launch.get("alignment")
    problem = Problem(
        2, 8, launch["seqlen_q"], launch.get("seqlen_k", 1000), launch["head_dim"],
        dtype=getattr(torch, launch["dtype"]), causal=alignment is not None, kv_heads=launch["kv_heads"],
        causal_alignment=alignment or "top_left", has_cache_seqlens="lengths" in launch,
        return_lse=launch.get("return_lse", False),
    )
    q, k, v = make_inputs(problem, seed=1, device="cpu")
    lengths = torch.tensor(launch["lengths"], dtype=torch.int32) if "lengths" in launch else None
    # The prepared launch's own arguments (CPU tensors: descriptors and buffers, no driver), bound
    # and packed by Triton's JIT as a launch would, then compiled for sm_90a.
    prepared = decode.bind(q, k, v, problem, cache_seqlens=lengths, num_splits=launch["splits"])
    kwargs = {**prepared.split_options, "debug": False}
    bound, specialization, options = binder(*prepared.split_args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    source = GluonASTSource(kernel, signature, constexprs, attrs)
    compiled = triton.compile(source, target=target, options=options.__dict__)
    (resources,) = cubin_resources(compiled.asm["cubin"]).values()
    sass = cubin_sass(compiled.asm["cubin"])
    results.append({
        "registers": resources["registers"],
        "spill_bytes": resources["local_bytes"] + resources["stack_bytes"],
        "shared_bytes": compiled.metadata.shared,
        "features": ptx_features(compiled.asm["ptx"]),
        "one_group_in_flight": "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass,
        "split_form": prepared.split_options["SPLIT"],
        "arrival_atomic": "atom.global.gpu.acq_rel.add" in compiled.asm["ptx"],
        "grid": prepared.split_grid,
    })
print(json.dumps(results))
"""


def _launch_id(launch: dict) -> str:
    mask = launch.get("alignment", "full")
    lengths = "-lengths" if "lengths" in launch else ""
    shape = f"d{launch['head_dim']}-{launch['dtype']}-sq{launch['seqlen_q']}-sk{launch.get('seqlen_k', 1000)}"
    return f"{shape}-hkv{launch['kv_heads']}-{mask}{lengths}-splits{launch['splits']}"


# The shared memory one CTA may use on sm_90 (227 KB).
SM90_SHARED_BYTES = 232_448


@pytest.fixture(scope="session")
def gluon_launches() -> list[dict]:
    """Every GLUON_LAUNCHES entry compiled in one child process without the interpreter (which the CPU
    test session turns on, and which breaks Gluon compilation)."""
    return json_from_child(["-c", _GLUON_LAUNCH_SCRIPT, json.dumps(GLUON_LAUNCHES)], timeout=1200)


@pytest.mark.static
@pytest.mark.release
@pytest.mark.xdist_group("gluon-compile")
@pytest.mark.parametrize("index", range(len(GLUON_LAUNCHES)), ids=[_launch_id(launch) for launch in GLUON_LAUNCHES])
def test_gluon_decode_launches_compile_without_spills(index: int, gluon_launches: list[dict]):
    launch, compiled = GLUON_LAUNCHES[index], gluon_launches[index]
    print(f"gluon/decode {launch}: {compiled['registers']} registers, {compiled['shared_bytes']} B shared")
    assert compiled["spill_bytes"] == 0, f"spills {compiled['spill_bytes']} bytes per thread"
    assert compiled["shared_bytes"] <= SM90_SHARED_BYTES, f"needs {compiled['shared_bytes']} B of shared memory"
    features = compiled["features"]
    for name in ("wgmma.mma_async", "cp.async.bulk.tensor", "mbarrier"):
        assert features[name], f"PTX lacks {name}"
    assert not features["cp.async"], "per-thread cp.async copies instead of TMA"
    # S_i's wait leaves O += P_(i-1) V_(i-1) in flight: the softmax runs under it, not after it.
    assert compiled["one_group_in_flight"], "no wgmma wait leaves a group in flight: serialised wgmmas"
    assert compiled["split_form"] == (launch["splits"] > 1)
    # Several splits: the fused merge's arrival (one gpu-scope acq_rel atomic); one split: no counter.
    assert compiled["arrival_atomic"] == (launch["splits"] > 1)
    assert compiled["grid"][0] == launch["splits"]
