"""Issue #38's item-share cap of the balanced split (``BALANCED_MAX_ITEM_SHARES``, 0 and off by default).

On the CPU: the host's mirror of the plan (``splits.balanced_item_shares``) keeps every share inside the
grid and every item under the cap; the device plan (``balanced_plan`` of ``triton_impl/_device.py``, which
gluon/decode runs too) gives the mirror's shares CTA by CTA under the interpreter, capped and not;
triton/decode's balanced split with the cap against fp64 under the interpreter, and a planted bug (the cap
in the grid's prefix sum but not in a CTA's own share count) failing it; gluon/decode's constexprs and
cute/decode's compile key follow their switches. On the GPU (``gpu``): each rung with the cap against fp64
on one long sequence among short ones (the shape the cap is for), bit for bit over 20 launches, and a
planted cute bug (its merge kernel reading the uncapped plan). ``bench/decode_ragged_ab.sh``'s cases are the
seed's rows as drawn.
"""

from __future__ import annotations

import importlib
import random

import pytest
import torch
import triton
import triton.language as tl

from common.contract import splits
from common.contract.check import check_on_inputs
from common.contract.inputs import make_inputs, make_paged_kv
from common.contract.problem import Problem
from tests.test_decode import BALANCED_CASES, DECODE_IMPLS, _balanced_check, assert_launches_repeat
from triton_impl import _device as device
from triton_impl import decode

CPU = torch.device("cpu")
# Each rung's cap switch, by the module that holds it.
CAP_MODULES = {
    "triton/decode": "triton_impl.decode",
    "gluon/decode": "triton_impl.gluon._decode_balanced",
    "cute/decode": "cute_impl.decode",
}
# Each rung's BALANCED_SPLIT, by module.
SWITCH_MODULES = {
    "triton/decode": "triton_impl.decode",
    "gluon/decode": "triton_impl.gluon.decode",
    "cute/decode": "cute_impl.decode",
}


def test_each_rung_takes_the_cap_its_ab_measured():
    """results/h200/decode-ragged-cap/: gluon 32 and cute 48 gained on seed 43's ragged D=256 rows; every cap
    lost in triton/decode (its 32-key blocks make long shares slow), which keeps none."""
    assert decode.BALANCED_MAX_ITEM_SHARES == 0
    assert importlib.import_module("triton_impl.gluon._decode_balanced").BALANCED_MAX_ITEM_SHARES == 32
    cute_decode = pytest.importorskip("cute_impl.decode")
    assert cute_decode.BALANCED_MAX_ITEM_SHARES == 48


def test_cute_refuses_a_cap_of_one_share_by_name(monkeypatch: pytest.MonkeyPatch):
    """One share an item fails the CuTe DSL's compile (a static one-share tile; found on the H200): refused
    with the switch named before any compile, as are negative caps; 0 and 2 are taken."""
    cute_decode = pytest.importorskip("cute_impl.decode")
    monkeypatch.setattr(cute_decode, "BALANCED_SPLIT", "always")
    problem = _long_among_short()
    for cap in (1, -3):
        monkeypatch.setattr(cute_decode, "BALANCED_MAX_ITEM_SHARES", cap)
        with pytest.raises(ValueError, match=r"BALANCED_MAX_ITEM_SHARES must be 0 \(no cap\) or at least 2"):
            cute_decode.compile_plan(problem)
    for cap in (0, 2):
        monkeypatch.setattr(cute_decode, "BALANCED_MAX_ITEM_SHARES", cap)
        config = cute_decode.compile_plan(problem)
        assert config.balanced_max_shares == cap * config.merge_runs  # the cap counts a merge run's slabs


# ----------------------------------------------------------------------------------------------------
# The plan's math: the host mirror, then the device plan against it (interpreter)
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cap", [0, 1, 2, 5, 32])
def test_capped_shares_stay_in_the_grid_and_under_the_cap(cap: int):
    rng = random.Random(cap)
    for _ in range(200):
        batch, kv_heads, target = rng.randint(1, 64), rng.choice((1, 2, 8, 16)), rng.randint(1, 300)
        blocks = [rng.choice((0, 1, rng.randint(0, 50), rng.randint(0, 3000))) for _ in range(batch)]
        shares = splits.balanced_item_shares(blocks, kv_heads, target, 8, cap)
        uncapped = splits.balanced_item_shares(blocks, kv_heads, target, 8)
        assert kv_heads * sum(shares) <= target + batch * kv_heads
        assert all(1 <= n <= (cap or n) for n in shares)
        assert shares == [min(n, cap) if cap else n for n in uncapped]


def test_a_negative_cap_is_refused_and_none_passes_as_more_than_any_grid():
    with pytest.raises(ValueError, match="must be >= 0"):
        splits.balanced_item_shares([3, 1], 1, 4, 1, -1)
    with pytest.raises(ValueError, match="must be >= 0"):
        splits.balanced_plan_sizes(64, 512, -1)
    assert splits.balanced_plan_sizes(64, 512, 0) == (8, splits.NO_ITEM_SHARE_CAP)
    assert splits.balanced_plan_sizes(32, 512, 24) == (16, 24)


@triton.jit
def _plan_probe_kernel(
    Lengths, Out, batch_size, kv_heads, seqlen_k, target_shares, min_share_blocks, max_item_shares,
    BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr,
):  # fmt: skip
    """Each program's ``balanced_share`` (one token, no mask: a sequence's blocks are cdiv(length, BLOCK_N))
    stored as (batch, kv_head, split, item_shares, has_work)."""
    share = tl.program_id(0)
    work = device.balanced_share(
        Lengths, share, batch_size, kv_heads, 1, seqlen_k, target_shares, min_share_blocks, max_item_shares,
        False, False, True, BLOCK_N, BLOCK_B,
    )  # fmt: skip
    for field in tl.static_range(5):
        tl.store(Out + share * 5 + field, work[field].to(tl.int32))


def _device_plan(lengths: tuple, kv_heads: int, target: int, min_blocks: int, cap: int, block_n: int) -> list:
    grid = target + len(lengths) * kv_heads
    out = torch.full((grid, 5), -1, dtype=torch.int32)
    block_b = decode.next_power_of_2(max(len(lengths), decode.MIN_BLOCK_B))
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32)
    sizes = (len(lengths), kv_heads, max(lengths), target, min_blocks, cap or splits.NO_ITEM_SHARE_CAP)
    _plan_probe_kernel[(grid,)](cache_seqlens, out, *sizes, BLOCK_N=block_n, BLOCK_B=block_b)
    return [tuple(row) for row in out.tolist()]


# (lengths, Hkv, target shares, least share in blocks, key block): test_decode's balanced lengths (one
# sequence of 16 blocks among empty and one-block ones), and one long sequence among short ones on the
# interpreter's 132 SMs at two shares an SM (a share of 8 blocks: the long item 79 shares uncapped).
PLAN_CASES = [((1000, 0, 5, 64, 1, 0, 130), 2, 12, 1, 64), ((40000, 23, 700, 5), 1, 264, 8, 64)]


@pytest.mark.parametrize("cap", [0, 1, 2, 3, 16])
@pytest.mark.parametrize("case", PLAN_CASES, ids=["balanced-lengths", "long-among-short"])
def test_device_plan_gives_the_mirrors_shares_cta_by_cta(case: tuple, cap: int):
    """CTA by CTA: item (b, h)'s shares are consecutive CTAs with splits 0..n-1 and n the mirror's count,
    items in (batch, KV head) order; every CTA after them has no work (split 1 of 1 of item (0, 0))."""
    lengths, kv_heads, target, min_blocks, block_n = case
    blocks = [-(-length // block_n) for length in lengths]
    shares = splits.balanced_item_shares(blocks, kv_heads, target, min_blocks, cap)
    expected = [(b, h, s, n, 1) for b, n in enumerate(shares) for h in range(kv_heads) for s in range(n)]
    expected += [(0, 0, 1, 1, 0)] * (target + len(lengths) * kv_heads - len(expected))
    assert _device_plan(lengths, kv_heads, target, min_blocks, cap, block_n) == expected
    uncapped = splits.balanced_item_shares(blocks, kv_heads, target, min_blocks)
    assert max(shares) == (min(cap, max(uncapped)) if cap else max(uncapped))


@triton.jit
def _offset_probe_kernel(
    Lengths, Out, batch_size, kv_heads, seqlen_k, target_shares, stride_b, stride_h, PLANTED_INT32: tl.constexpr,
    BLOCK_B: tl.constexpr,
):  # fmt: skip
    """Each program's K offset from ``balanced_share``'s indices as the balanced kernel forms it
    (``item_offset``), or with ``PLANTED_INT32`` as it was before the fix (``batch · stride_b + kv_head · stride_h``
    on the plan's int32 indices)."""
    share = tl.program_id(0)
    batch, kv_head, _, _, has_work = device.balanced_share(
        Lengths, share, batch_size, kv_heads, 1, seqlen_k, target_shares, 1, splits.NO_ITEM_SHARE_CAP,
        False, False, True, 64, BLOCK_B,
    )  # fmt: skip
    if PLANTED_INT32:
        offset = (batch * stride_b + kv_head * stride_h).to(tl.int64)
    else:
        offset = device.item_offset(batch, kv_head, stride_b, stride_h)
    tl.store(Out + share, tl.where(has_work, offset, -1))


def _k_offsets(planted: bool) -> tuple[list[int], list[int]]:
    """(the probe's offsets, the expected ones) of 24 sequences x 2 KV heads whose K strides put the last
    sequences past 2^31 elements (seed 61's B=32 MHA 47616-key row read before K on an H200 in int32)."""
    lengths, kv_heads, target, stride_b, stride_h = (100,) * 24, 2, 48, 2**27, 2**26
    out = torch.full((target + len(lengths) * kv_heads,), -7, dtype=torch.int64)
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32)
    sizes = (len(lengths), kv_heads, max(lengths), target, stride_b, stride_h)
    _offset_probe_kernel[(out.numel(),)](cache_seqlens, out, *sizes, PLANTED_INT32=planted, BLOCK_B=32)
    expected = [b * stride_b + h * stride_h for b in range(len(lengths)) for h in range(kv_heads)]
    return out.tolist()[: len(expected)], expected


def test_balanced_kernel_forms_k_offsets_past_two_to_the_31_in_int64():
    got, expected = _k_offsets(planted=False)
    assert max(expected) > 2**31 and got == expected
    got, expected = _k_offsets(planted=True)
    assert got != expected, "planted: the plan's int32 indices overflow the offset past 2^31"


# ----------------------------------------------------------------------------------------------------
# triton/decode with the cap against fp64 (interpreter), and a planted bug
# ----------------------------------------------------------------------------------------------------
@pytest.fixture
def capped(monkeypatch: pytest.MonkeyPatch) -> None:
    """test_decode's balanced fixture (the split for every call, shares of one 64-key block at least)."""
    monkeypatch.setattr(decode, "BALANCED_SPLIT", "always")
    monkeypatch.setattr(decode, "BALANCED_MIN_KEYS", 64)
    monkeypatch.setattr(decode, "_ARRIVAL_COUNTERS", {})  # counters a planted bug leaves dirty go with the test


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter tests run on CPU-only machines")
@pytest.mark.parametrize("cap", [1, 2, 3])
@pytest.mark.parametrize("index", [0, 1], ids=["gqa-sq1-d64", "gqa-sq4-d128-paged"])
def test_capped_balanced_split_against_fp64(index: int, cap: int, capped: None, monkeypatch: pytest.MonkeyPatch):
    """BALANCED_CASES[0]: 12 forced shares give the 1000-key sequence 4 shares an item, so each cap binds;
    [1] (paged, 5 forced shares) gives it 2: cap 1 binds, 2 and 3 leave the plan as it was."""
    monkeypatch.setattr(decode, "BALANCED_MAX_ITEM_SHARES", cap)
    problem, result = _balanced_check(BALANCED_CASES[index], seed=cap + index)
    assert result.ok, f"{problem.describe()} cap {cap}: {result.summary()}"


@triton.jit
def _cap_only_in_the_prefix(
    lengths, offs_b, share, sizes, CAUSAL: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, BLOCK_N: tl.constexpr
):  # fmt: skip
    """``balanced_plan`` with the cap in the prefix sum over the items but not in a CTA's own share count:
    a capped item's CTAs take the uncapped count, so its later KV heads are never attended."""
    batch_size, kv_heads, seqlen_q, target_shares, min_share_blocks, max_item_shares = sizes
    in_batch = offs_b < batch_size
    causal_offsets = lengths - seqlen_q if BOTTOM_RIGHT else lengths * 0
    blocks = (device.attended_keys(lengths, causal_offsets, seqlen_q, CAUSAL) + BLOCK_N - 1) // BLOCK_N
    chunk = tl.maximum((kv_heads * tl.sum(blocks, axis=0) + target_shares - 1) // target_shares, min_share_blocks)
    capped_shares = tl.where(in_batch, kv_heads * device.capped_item_shares(blocks, chunk, max_item_shares), 0)
    batch = tl.sum((tl.cumsum(capped_shares, axis=0) <= share).to(tl.int32), axis=0)
    has_work = batch < batch_size
    local = share - tl.sum(tl.where(offs_b < batch, capped_shares, 0), axis=0)
    uncapped = tl.sum(tl.where(offs_b == batch, device.item_shares_of(blocks, chunk), 0), axis=0)
    item_shares = tl.where(has_work, uncapped, 1)
    kv_head, split = tl.where(has_work, local // item_shares, 0), tl.where(has_work, local % item_shares, 1)
    return tl.where(has_work, batch, 0), kv_head, split, item_shares, has_work


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter tests run on CPU-only machines")
def test_planted_cap_outside_a_ctas_share_count_fails_the_check(capped: None, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(decode, "BALANCED_MAX_ITEM_SHARES", 2)
    assert _balanced_check(BALANCED_CASES[0], seed=5)[1].ok, "the unplanted kernel must pass"
    monkeypatch.setattr(decode, "_ARRIVAL_COUNTERS", {})
    monkeypatch.setattr(device, "balanced_plan", _cap_only_in_the_prefix)
    _, result = _balanced_check(BALANCED_CASES[0], seed=5)
    assert not result.ok, f"the planted plan passed: {result.summary()}"


# ----------------------------------------------------------------------------------------------------
# gluon/decode's launch and cute/decode's compile key carry the switch
# ----------------------------------------------------------------------------------------------------
def _long_among_short(batch: int = 4, head_dim: int = 128) -> Problem:
    return Problem(
        batch, 16, 1, 40960, head_dim, dtype=torch.bfloat16, causal=True, kv_heads=2,
        causal_alignment="bottom_right", has_cache_seqlens=True, return_lse=True,
    )  # fmt: skip


def test_gluon_balanced_launch_takes_the_cap_and_the_padded_one_does_not(monkeypatch: pytest.MonkeyPatch):
    from triton_impl.gluon import _decode_balanced
    from triton_impl.gluon import decode as gluon_decode

    problem = _long_among_short()
    q, k, v = make_inputs(problem, seed=0, device="cpu")
    lengths = torch.tensor((40960, 0, 7, 300), dtype=torch.int32)
    monkeypatch.setattr(gluon_decode, "BALANCED_SPLIT", "always")
    monkeypatch.setattr(_decode_balanced, "BALANCED_MERGE_GROUP", 0)
    assert gluon_decode.bind(q, k, v, problem, cache_seqlens=lengths).split_args[-1] == 32
    monkeypatch.setattr(_decode_balanced, "BALANCED_MAX_ITEM_SHARES", 0)
    assert gluon_decode.bind(q, k, v, problem, cache_seqlens=lengths).split_args[-1] == splits.NO_ITEM_SHARE_CAP
    monkeypatch.setattr(_decode_balanced, "BALANCED_MAX_ITEM_SHARES", 24)
    assert gluon_decode.bind(q, k, v, problem, cache_seqlens=lengths).split_args[-1] == 24
    monkeypatch.setattr(_decode_balanced, "BALANCED_MERGE_GROUP", 8)
    assert gluon_decode.bind(q, k, v, problem, cache_seqlens=lengths).split_args[-1] == 24 * 8, "the cap counts runs"
    monkeypatch.setattr(gluon_decode, "BALANCED_SPLIT", "never")
    assert gluon_decode.bind(q, k, v, problem, cache_seqlens=lengths, num_splits=4).split_args[-1] is None


def test_cute_compile_key_carries_the_cap_where_the_split_is_balanced(monkeypatch: pytest.MonkeyPatch):
    cute_decode = pytest.importorskip("cute_impl.decode")
    problem = _long_among_short()
    monkeypatch.setattr(cute_decode, "BALANCED_SPLIT", "always")
    monkeypatch.setattr(cute_decode, "BALANCED_MAX_ITEM_SHARES", 0)
    off = cute_decode.compile_plan(problem)
    monkeypatch.setattr(cute_decode, "BALANCED_MAX_ITEM_SHARES", 24)
    capped = cute_decode.compile_plan(problem)  # the cap counts a merge run's slabs (BALANCED_MERGE_RUNS)
    assert off.balanced_max_shares == 0 and capped.balanced_max_shares == 24 * capped.merge_runs
    assert off != cute_decode.compile_plan(problem), "a cap that leaves the compile key as it was"
    monkeypatch.setattr(cute_decode, "BALANCED_SPLIT", "never")
    assert cute_decode.compile_plan(problem).balanced_max_shares == 0


@pytest.mark.cute_compile
@pytest.mark.parametrize(("head_dim", "page_size"), [(256, 0), (64, 32)])
def test_cute_capped_balanced_split_compiles_for_sm90_without_spills(
    head_dim: int, page_size: int, monkeypatch: pytest.MonkeyPatch
):
    """Both kernels with the cap in their plan (a min in each loop over the lengths), spill-free."""
    pytest.importorskip("cutlass")
    from common.reporting.static import cubin_resources
    from cute_impl import decode as cute_decode

    monkeypatch.setattr(cute_decode, "BALANCED_SPLIT", "always")
    monkeypatch.setattr(cute_decode, "BALANCED_MAX_ITEM_SHARES", 24)
    problem = _long_among_short(head_dim=head_dim).with_(seqlen_q=8, page_size=page_size)
    config = cute_decode.compile_plan(problem)
    assert config.balanced_max_shares == 24 * config.merge_runs  # the cap counts a merge run's slabs
    (binary,) = cute_decode.compile_sm90(problem, split=True)
    kernels = cubin_resources(binary.cubin)
    assert len(kernels) == 2, sorted(kernels)
    for name, usage in kernels.items():
        assert usage["stack_bytes"] + usage["local_bytes"] == 0, f"{problem.describe()} {name}: {usage}"


def test_ab_tool_reproduces_seed43s_rows_and_times_each_cap_where_it_changes_the_plan():
    """bench/decode_ragged_ab's plan on the CPU: seed 43's four ragged rows as drawn, its two full caches given
    as lengths; each rung's default, caps and 4/SM; the caps change the plan where one item holds many shares
    (the D=256 rows, the full 180k cache), not on the B=64 D=64 row (at most 3 shares an item)."""
    from bench import decode_ragged_ab

    cases = decode_ragged_ab.cases()
    described = [case.describe() for case in cases]
    assert "B=8 H=16 Hkv=1 Sq=1 Sk=197632 D=256" in described[0] and "paged(128) lengths=38..108724" in described[0]
    assert "B=3 H=20 Hkv=4 Sq=4 Sk=250624 D=256" in described[1] and "lengths=58..54269" in described[1]
    assert "B=64 H=128 Hkv=16 Sq=4 Sk=16896 D=64" in described[2] and "lengths=17..16666" in described[2]
    assert "B=32 H=8 Sq=1 Sk=16640 D=128" in described[3] and "paged(32) lengths=17..9659" in described[3]
    assert "B=3 H=10 Hkv=2 Sq=1 Sk=179712" in described[4] and "lengths=179712..179712" in described[4]
    assert "B=16 H=32 Hkv=4 Sq=1 Sk=11776" in described[5] and "lengths=11776..11776" in described[5]
    settings = decode_ragged_ab.settings()
    assert [s for r, s, _ in settings if r == "triton/decode"] == ["default", "cap32", "cap48", "4/SM"]
    assert [s for r, s, _ in settings if r == "cute/decode"] == ["default", "cap48", "4/SM"]
    gluon_cap = next(switches for r, s, switches in settings if r == "gluon/decode" and s == "cap32")
    assert gluon_cap == {"triton_impl.gluon._decode_balanced": {"BALANCED_MAX_ITEM_SHARES": 32}}
    for index, binds in ((0, True), (1, True), (2, False), (4, True)):
        case = cases[index]
        default = decode_ragged_ab.plan_of("triton/decode", case.problem, case.lengths, CPU)
        with decode_ragged_ab.switched({"triton_impl.decode": {"BALANCED_MAX_ITEM_SHARES": 24}}):
            capped = decode_ragged_ab.plan_of("triton/decode", case.problem, case.lengths, CPU)
        assert default[0] == "balanced" and (capped != default) == binds, (described[index], default, capped)
        assert max(capped[2]) <= 24


def test_model_sees_the_long_items_merge_and_the_cap_shortening_it():
    """bench/decode_ragged_model on the paged MQA D=256 row: triton/decode's committed plan gives the 108724-key
    sequence 155 shares (a merge of 156 round trips at 2 splits a step); cap 48 leaves 48 (50 round trips)."""
    from bench import decode_model, decode_ragged_ab, decode_ragged_model

    case = decode_ragged_ab.cases()[0]
    plan = decode_ragged_model.rung_plan("triton/decode", case.problem, case.lengths)
    assert max(plan.shares) == 155 and plan.merge_per_step == 2
    assert decode_ragged_model.merge_us(plan, 155) == pytest.approx(decode_model.MERGE_STEP_US * 156)
    with decode_ragged_ab.switched({"triton_impl.decode": {"BALANCED_MAX_ITEM_SHARES": 48}}):
        capped = decode_ragged_model.rung_plan("triton/decode", case.problem, case.lengths)
    assert max(capped.shares) == 48 and capped.target == plan.target


# ----------------------------------------------------------------------------------------------------
# GPU: each rung with the cap, one long sequence among short ones
# ----------------------------------------------------------------------------------------------------
LONG_AMONG_SHORT = (23, 0, 40000, 1, 700, 5, 64, 3000)


def _capped_rung(impl_name: str, cap: int, monkeypatch: pytest.MonkeyPatch):
    if impl_name == "cute/decode":
        pytest.importorskip("cutlass")
    monkeypatch.setattr(importlib.import_module(SWITCH_MODULES[impl_name]), "BALANCED_SPLIT", "always")
    monkeypatch.setattr(importlib.import_module(CAP_MODULES[impl_name]), "BALANCED_MAX_ITEM_SHARES", cap)
    return DECODE_IMPLS[impl_name]


# (cap, D, paged): one share an item (no merge at all), and 7 of the long item's 79 shares (264 target shares).
GPU_CAP_CASES = [(1, 64, False), (7, 64, True), (7, 256, True)]


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("cap", "head_dim", "paged"), GPU_CAP_CASES, ids=[f"cap{c}-d{d}-paged{p}" for c, d, p in GPU_CAP_CASES]
)
@pytest.mark.parametrize("impl_name", sorted(CAP_MODULES))
def test_gpu_capped_balanced_split_against_fp64_and_deterministic(
    impl_name: str, cap: int, head_dim: int, paged: bool, monkeypatch: pytest.MonkeyPatch
):
    impl = _capped_rung(impl_name, cap, monkeypatch)
    problem = _long_among_short(len(LONG_AMONG_SHORT), head_dim).with_(page_size=32 if paged else 0)
    if impl_name == "cute/decode" and cap == 1:  # refused by name (test_cute_refuses_a_cap_of_one_share_by_name)
        with pytest.raises(ValueError, match="at least 2"):
            impl.prepare(
                *make_inputs(problem, seed=0, device="cuda"),
                problem,
                cache_seqlens=torch.tensor(LONG_AMONG_SHORT, dtype=torch.int32, device="cuda"),
            )
        return
    q, k, v = make_inputs(problem, seed=cap + head_dim, device="cuda", offset=0.5)
    extra = {"cache_seqlens": torch.tensor(LONG_AMONG_SHORT, dtype=torch.int32, device="cuda")}
    if paged:
        k, v, extra["block_table"] = make_paged_kv(problem, k, v, seed=cap)
    result = check_on_inputs(impl, q, k, v, problem, **extra)
    assert result.ok, f"{impl_name} cap {cap} {problem.describe()}: {result.summary()}"
    assert_launches_repeat(impl.prepare(q, k, v, problem, **extra))


@pytest.mark.gpu
def test_gpu_planted_cute_merge_reading_the_uncapped_plan_fails_the_check(monkeypatch: pytest.MonkeyPatch):
    """The merge kernel finds an item's slabs by the uncapped share count while the split kernel stored
    the capped one's: the fp64 check must fail. The merge that plans (``MERGE_SLABS_FROM_SPLIT`` off); by default
    it reads the slabs the split kernel stored (tests/test_cute_merge_plan.py plants a short one)."""
    impl = _capped_rung("cute/decode", 7, monkeypatch)
    from cute_impl import _decode_plan
    from cute_impl import decode as cute_decode

    monkeypatch.setattr(cute_decode, "MERGE_SLABS_FROM_SPLIT", False)

    problem = _long_among_short(len(LONG_AMONG_SHORT))
    q, k, v = make_inputs(problem, seed=3, device="cuda", offset=0.5)
    lengths = torch.tensor(LONG_AMONG_SHORT, dtype=torch.int32, device="cuda")
    assert check_on_inputs(impl, q, k, v, problem, cache_seqlens=lengths).ok, "the unplanted kernel must pass"

    uncapped_slabs = _decode_plan.BalancedPlan.item_slabs

    def item_slabs(plan, batch, kv_head):
        return uncapped_slabs(plan._replace(max_item_shares=0), batch, kv_head)

    monkeypatch.setattr(_decode_plan.BalancedPlan, "item_slabs", item_slabs)
    monkeypatch.setattr(cute_decode.HOST.kernels, "compiled", {})
    result = check_on_inputs(impl, q, k, v, problem, cache_seqlens=lengths)
    assert not result.ok, f"the planted plan passed: {result.summary()}"
