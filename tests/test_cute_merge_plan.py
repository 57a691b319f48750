"""cute/decode's ``MERGE_SLABS_FROM_SPLIT`` (on since bench/cute_merge_plan_ab.sh, results/h200/decode-merge-plan/):
under the balanced split the merge kernel reads each item's (first slab, count), stored by the item's first share,
instead of every thread planning the batch again.

CPU: on by default; off, the configuration, the kernels' arguments and the merge's plan are the earlier ones; on, a bind
allocates the (B·Hkv, 2) int32 item slabs beside the partials (once per bind, as they are: CUDA-graph safe);
bench/cute_merge_plan_ab.py's rows and settings.
Static (sm_90a): on, both kernels compile without spills (balanced; paged and not; causal, LSE; D = 64 and 256;
D=128 in tests/test_cute_decode.py), the split kernel takes the slabs, and the merge kernel no longer plans: it
takes neither q, k, the lengths nor the block table, and divides nothing at runtime (:func:`merge_plans_afresh`; the
committed merge and a planted one that still plans under the knob are caught). GPU (``gpu`` marker;
bench/cute_merge_plan_ab.sh runs them): on, against fp64 on a poisoned output and bit for bit equal to off, on seed
47 row 4's kind shrunk (MQA 128 packed rows at D=256, paged(256), ragged, B=8) and a D=64 GQA one with
an empty sequence and one long enough for the item-share cap; a split kernel that stores one slab too few fails the
check; a CUDA graph replays with new lengths.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("cutlass")

import cutlass

from common.contract.check import run_poisoned
from common.contract.inputs import make_inputs, make_paged_kv
from common.contract.problem import Problem
from common.reporting.static import cubin_resources
from cute_impl import _decode_merge, decode
from tests.test_decode import LONG_AMONG_SHORT, _check_graph_replays
from tests.test_decode_wide import DECODE_IMPLS, check_on_gpu

CPU = torch.device("cpu")
# Index of the item slabs in DecodeKernel.__call__'s arguments (q, k, v, O, LSE, the two partials, the slabs, ...).
ITEM_SLABS_ARGUMENT = 7


def _problem(batch: int, kv_heads: int, group: int, seqlen_q: int, seqlen_k: int, head_dim: int, **changes) -> Problem:
    return Problem(
        batch, kv_heads * group, seqlen_q, seqlen_k, head_dim, dtype=torch.bfloat16, causal=True, kv_heads=kv_heads,
        causal_alignment="bottom_right", has_cache_seqlens=True, return_lse=True, **changes,
    )  # fmt: skip


@pytest.fixture
def balanced(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The balanced split on every call (``BALANCED_SPLIT = "always"``); the knob as each test sets it."""
    monkeypatch.setattr(decode, "BALANCED_SPLIT", "always")
    return monkeypatch


# ----------------------------------------------------------------------------------------------------
# CPU: the configuration and the arguments, off and on
# ----------------------------------------------------------------------------------------------------
def test_on_by_default_and_off_keeps_the_earlier_plan_on_the_balanced_split_only(balanced: pytest.MonkeyPatch):
    assert decode.MERGE_SLABS_FROM_SPLIT is True
    problem = _problem(4, 2, 4, 4, 4096, 64)
    balanced.setattr(decode, "MERGE_SLABS_FROM_SPLIT", False)
    config = decode.compile_plan(problem)
    assert config.balanced_min_blocks and not config.merge_slabs_from_split
    assert decode.DecodeKernel(config).merge_plans
    assert decode.fake_arguments(config)[ITEM_SLABS_ARGUMENT] is None
    balanced.setattr(decode, "MERGE_SLABS_FROM_SPLIT", True)
    config = decode.compile_plan(problem)
    assert config.merge_slabs_from_split and not decode.DecodeKernel(config).merge_plans
    assert decode.fake_arguments(config)[ITEM_SLABS_ARGUMENT] is not None
    # The padded split and the one-split kernel have no item slabs, and a configuration that asks for them is refused.
    balanced.setattr(decode, "BALANCED_SPLIT", "never")
    assert not decode.compile_plan(problem).merge_slabs_from_split
    assert not decode.compile_plan(problem, split=False).merge_slabs_from_split
    with pytest.raises(ValueError, match="only under the balanced split"):
        decode.DecodeKernel(dataclasses.replace(decode.compile_plan(problem), merge_slabs_from_split=True))


@pytest.mark.parametrize("knob", [False, True], ids=["off", "on"])
def test_bind_allocates_the_item_slabs_with_the_partials(knob: bool, balanced: pytest.MonkeyPatch):
    """``plan_launch`` (once per bind; ``run()`` only launches) passes a (B·Hkv, 2) int32 buffer on, None off."""
    balanced.setattr(decode, "MERGE_SLABS_FROM_SPLIT", knob)
    problem = _problem(3, 2, 4, 2, 512, 128)
    q, k, v = make_inputs(problem, seed=0, device="cpu")
    lengths = torch.tensor([512, 0, 77], dtype=torch.int32)
    launch = decode.plan_launch(q, k, v, problem, cache_seqlens=lengths)
    assert launch.chosen["balanced"] and launch.config.merge_slabs_from_split == knob
    slabs = launch.arguments[ITEM_SLABS_ARGUMENT]
    if knob:
        assert slabs.dtype == torch.int32 and slabs.shape == (3 * 2, 2) and slabs.is_contiguous()
    else:
        assert slabs is None
    assert launch.arguments[ITEM_SLABS_ARGUMENT - 1].dtype == torch.float32  # the partial LSEs before them


def test_ab_times_the_named_rows_with_the_knob_off_and_on():
    """bench/cute_merge_plan_ab.py: seed 47 row 4, seed 43 rows 2 and 0, each balanced as committed; its settings
    turn the knob off and on (the compile key) and restore it; the .sh runs this file's GPU tests, then the A/B."""
    from bench import cute_balanced_ab, cute_merge_plan_ab
    from bench.decode_fewpairs import switched

    committed = decode.MERGE_SLABS_FROM_SPLIT
    rows = cute_balanced_ab.cases(cute_merge_plan_ab.CASES)
    assert [row.describe().split(" bf16")[0] for row in rows] == [
        "B=64 H=8 Hkv=1 Sq=16 Sk=40448 D=256", "B=64 H=128 Hkv=16 Sq=4 Sk=16896 D=64",
        "B=2 H=256 Hkv=32 Sq=4 Sk=22528 D=64",
    ]  # fmt: skip
    assert all(decode.balanced_split(row.problem) for row in rows)
    for name, setting, switches in cute_merge_plan_ab.SETTINGS:
        assert name == "cute/decode"
        with switched(decode, switches):
            assert all(decode.compile_plan(row.problem).merge_slabs_from_split == (setting == "on") for row in rows)
    assert committed is decode.MERGE_SLABS_FROM_SPLIT
    script = (Path(__file__).parents[1] / "bench" / "cute_merge_plan_ab.sh").read_text()
    assert "tests/test_cute_merge_plan.py" in script and "bench.cute_merge_plan_ab" in script
    assert "source_carried_activations" in script


# ----------------------------------------------------------------------------------------------------
# sm_90a: spill-free, and a merge kernel that plans nothing
# ----------------------------------------------------------------------------------------------------
def _entry(ptx: str, kernel: str) -> str:
    """The PTX of ``kernel`` (``split_kernel`` or ``merge_kernel``; the WGMMA tile's split kernel is
    ``wgmma_split_kernel``): its parameters and body."""
    names = (f"kernel_cutlass_{kernel}", f"kernel_cutlass_wgmma_{kernel}")
    return next(e for e in ptx.split(".entry ")[1:] if e.startswith(names))


def _params(ptx: str, kernel: str) -> int:
    entry = _entry(ptx, kernel)
    return entry[: entry.index(")")].count(".param")


def merge_plans_afresh(ptx: str) -> bool:
    """Whether the merge kernel of ``ptx`` computes an integer division at runtime (``div``/``rem``). The plan does:
    its share size is the items' total key blocks / target_shares, and an item's shares its blocks / that size,
    both divisors runtime values (and the committed merge finds its batch as batch_kv_head / Hkv). The merge
    proper divides nothing: its rows and chunks are counted in compile-time powers of two, its slabs read."""
    return re.search(r"^\s*(?:@%p\d+\s+)?(?:div|rem)\.", _entry(ptx, "merge_kernel"), re.MULTILINE) is not None


# (D, Sq, page size, Hkv of 8 heads): GQA 16 rows at D=64 contiguous and seed 47 row 4's kind at D=256 (MQA, 128
# packed rows, pages of 256: two 64-row M tiles on the WGMMA tile since WGMMA_D256). The default (on) at D=128 paged:
# tests/test_cute_decode.py's balanced compiles (spill-free, the merge taking the slabs); three compiles a shape here,
# so two shapes (CI time).
KNOB_COMPILES = [(64, 8, 0, 4), (256, 16, 256, 1)]


@pytest.mark.cute_compile
@pytest.mark.parametrize(("head_dim", "seqlen_q", "page_size", "kv_heads"), KNOB_COMPILES)
def test_on_compiles_without_spills_and_its_merge_plans_nothing(
    head_dim: int, seqlen_q: int, page_size: int, kv_heads: int, balanced: pytest.MonkeyPatch
):
    """On: two kernels, no spills; the split kernel takes one tensor more than off (the slabs it stores), the merge
    one more than the padded split's (the slabs it reads: not q, k, the lengths and the table), and it divides
    nothing; off, the committed balanced merge plans afresh (the rule is not vacuous)."""
    problem = _problem(2, kv_heads, 8 // kv_heads, seqlen_q, 4096, head_dim, page_size=page_size)
    balanced.setattr(decode, "BALANCED_SPLIT", "never")
    (padded,) = decode.compile_sm90(problem, split=True)
    balanced.setattr(decode, "BALANCED_SPLIT", "always")
    balanced.setattr(decode, "MERGE_SLABS_FROM_SPLIT", False)
    (off,) = decode.compile_sm90(problem, split=True)
    balanced.setattr(decode, "MERGE_SLABS_FROM_SPLIT", True)
    (on,) = decode.compile_sm90(problem, split=True)
    kernels = cubin_resources(on.cubin)
    assert len(kernels) == 2, sorted(kernels)
    for name, usage in kernels.items():
        print(f"MERGE_SLABS_FROM_SPLIT {problem.describe()} {name[:40]}: {usage['registers']} registers")
        assert usage["stack_bytes"] + usage["local_bytes"] == 0, f"{problem.describe()} {name}: {usage}"
    assert _params(on.ptx, "split_kernel") == _params(off.ptx, "split_kernel") + 1
    assert _params(on.ptx, "merge_kernel") == _params(padded.ptx, "merge_kernel") + 1
    assert merge_plans_afresh(off.ptx) and not merge_plans_afresh(on.ptx)
    assert not merge_plans_afresh(padded.ptx)


_REAL_INIT = decode.DecodeKernel.__init__


def _merge_still_plans(self: decode.DecodeKernel, config: decode.DecodeConfig) -> None:
    """Planted: the knob reaches the split kernel (it stores the slabs), but the merge kernel plans as before."""
    _REAL_INIT(self, config)
    self.merge_plans = bool(config.balanced_min_blocks)


@pytest.mark.cute_compile
def test_a_merge_that_still_plans_under_the_knob_is_caught(balanced: pytest.MonkeyPatch):
    balanced.setattr(decode, "MERGE_SLABS_FROM_SPLIT", True)
    balanced.setattr(decode.DecodeKernel, "__init__", _merge_still_plans)
    (planted,) = decode.compile_sm90(_problem(2, 4, 2, 8, 4096, 64), split=True)
    assert merge_plans_afresh(planted.ptx)


# ----------------------------------------------------------------------------------------------------
# GPU: against fp64 and bit for bit against off; a planted store; a CUDA graph
# ----------------------------------------------------------------------------------------------------
# name -> (problem, lengths): seed 47 row 4's kind (B=64 H=8 Hkv=1 Sq=16 D=256 paged(256) ragged 17..33118) at
# B=8; GQA at D=64 with an empty sequence and one of 40000 keys among short ones (its item takes the share cap).
GPU_CASES = {
    "seed47-4-kind-b8": (_problem(8, 1, 8, 16, 9216, 256, page_size=256), (17, 9000, 256, 1, 4100, 77, 2048, 530)),
    "d64-long-among-short": (_problem(8, 2, 8, 4, 40000, 64), LONG_AMONG_SHORT),
}


def _bits(result: torch.Tensor | tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """O and the LSE of a run, each as its raw bits (a NaN equals itself)."""
    tensors = result if isinstance(result, tuple) else (result,)
    return [t.clone().view(torch.int16 if t.element_size() == 2 else torch.int32) for t in tensors]


def _poisoned_bits(problem: Problem, lengths: tuple[int, ...], seed: int) -> list[torch.Tensor]:
    """cute/decode's output bits on a poisoned output, under the module's constants now."""
    q, k, v = make_inputs(problem, seed=seed, device="cuda", offset=0.5)
    extra = {"cache_seqlens": torch.tensor(lengths, dtype=torch.int32, device="cuda")}
    if problem.paged:
        k, v, extra["block_table"] = make_paged_kv(problem, k, v, seed=seed)
    run = decode.decode_attention(q, k, v, problem, **extra)
    assert run.balanced
    return _bits(run_poisoned(run))


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gpu_merge_reading_item_slabs_against_fp64_and_off_bit_for_bit(case: str, balanced: pytest.MonkeyPatch):
    problem, lengths = GPU_CASES[case]
    balanced.setattr(decode, "MERGE_SLABS_FROM_SPLIT", True)
    assert decode.compile_plan(problem).merge_slabs_from_split
    result = check_on_gpu("cute/decode", problem, lengths, seed=len(case))
    assert result.ok, f"MERGE_SLABS_FROM_SPLIT {problem.describe()}: {result.summary()}"
    on = _poisoned_bits(problem, lengths, seed=1)
    balanced.setattr(decode, "MERGE_SLABS_FROM_SPLIT", False)
    off = _poisoned_bits(problem, lengths, seed=1)
    assert all(map(torch.equal, on, off)), f"{problem.describe()}: the knob changes the output bits"


def _one_slab_short(item_slabs, share, split, item_shares, tidx, m_block) -> None:
    """Planted: the count stored is one short (an item of several shares loses its last slab in the merge)."""
    _decode_merge.store_item_slabs(item_slabs, share, split, cutlass.max(item_shares - 1, 1), tidx, m_block)


@pytest.mark.gpu
def test_gpu_planted_short_item_slabs_fail_the_check(balanced: pytest.MonkeyPatch):
    problem, lengths = GPU_CASES["d64-long-among-short"]
    balanced.setattr(decode, "MERGE_SLABS_FROM_SPLIT", True)
    assert check_on_gpu("cute/decode", problem, lengths, seed=2).ok, "the unplanted kernel must pass"
    balanced.setattr(decode.HOST.kernels, "compiled", {})
    balanced.setattr(decode, "store_item_slabs", _one_slab_short)
    result = check_on_gpu("cute/decode", problem, lengths, seed=2)
    assert not result.ok, f"one slab short: the check passed a wrong kernel ({result.summary()})"


@pytest.mark.gpu
def test_gpu_item_slabs_replay_in_a_cuda_graph_with_new_lengths(balanced: pytest.MonkeyPatch):
    """Each replay rewrites every item's slabs before its merge (``test_decode``'s graph check, paged)."""
    balanced.setattr(decode, "MERGE_SLABS_FROM_SPLIT", True)
    _check_graph_replays(DECODE_IMPLS["cute/decode"], paged=True)
