"""triton/decode's ``LONGEST_FIRST`` (on by default at D=64; gluon/decode's ``ITEMS_LONGEST_FIRST`` is its items
kernel's form): the padded split's grid items, dispatched in z order, take the batch's sequences longest first, so that
a long sequence late in a ragged batch does not run alone at the end.

CPU: on by default; ``order_block`` (0 without ``cache_seqlens``, past ``LONGEST_FIRST_MAX_BATCH``, off or D != 64; else
the batch as a power of two of at least 16) reaches the padded split kernel's constexprs.
Interpreter (CPU-only machines): with it on, against fp64 on ragged batches of one split and of two (the fused merge
reads the remapped item's counter), paged, and tied lengths; ``splits.longest_first_order`` (the host's statement of
the order) against the items ``longest_first_item`` gives each grid index (a kernel of its own); a planted rank without
the tie-break (three tied sequences: two never computed) must fail the check. Static (sm_90a): the build with it on
spills nothing. GPU: 6007/4's shape and a paged ragged batch against fp64 with it on.
"""

from __future__ import annotations

import json

import pytest
import torch
import triton
import triton.language as tl

from common.contract import splits
from common.contract.problem import Problem
from common.measure.decode_sweep import random_cases
from tests._helpers import json_from_child

# The interpreter check of the other packed-row knobs (seed 5, offset 0.5, poisoned output, forced splits).
from tests.test_decode_packed import _interpreter_check
from tests.test_decode_wide import _problem, check_on_gpu, interpreter_only
from triton_impl import decode
from triton_impl._device import longest_first_item

CPU = torch.device("cpu")


def _ragged(batch: int, seqlen_k: int, **changes) -> Problem:
    """B sequences of one KV head, group 4, Sq=2, D=64, fp32 (the interpreter's dtype), with ``cache_seqlens``."""
    return _problem(batch, 1, 4, 2, seqlen_k, 64, dtype=torch.float32, has_cache_seqlens=True, **changes)


def test_on_by_default_and_the_blocks_it_takes(monkeypatch: pytest.MonkeyPatch):
    row = random_cases(8, 6007)[4].problem
    assert decode.LONGEST_FIRST is True and decode.order_block(row) == 32
    monkeypatch.setattr(decode, "LONGEST_FIRST", False)
    assert decode.order_block(row) == 0
    monkeypatch.setattr(decode, "LONGEST_FIRST", True)
    cap = decode.LONGEST_FIRST_MAX_BATCH
    blocks = {batch: decode.order_block(row.with_(batch=batch)) for batch in (1, 16, 17, 32, cap, cap + 1)}
    assert blocks == {1: 16, 16: 16, 17: 32, 32: 32, cap: cap, cap + 1: 0}, blocks
    assert decode.order_block(row.with_(has_cache_seqlens=False)) == 0
    assert decode._split_constexprs(row, split=False)["ORDER_BLOCK_B"] == 32
    # Only the head dims it was timed on: D=128's and D=256's wide builds spill with the rank (Triton 3.8).
    assert [decode.order_block(row.with_(head_dim=head_dim)) for head_dim in (128, 256)] == [0, 0]


def test_longest_first_order_is_a_permutation_longest_first():
    lengths = (40, 77, 40, 3, 77, 0)
    order = splits.longest_first_order(lengths)
    assert order == [1, 4, 0, 2, 3, 5] and sorted(order) == list(range(len(lengths)))


# name -> (problem, lengths, forced splits): every case on the padded split kernel (not the balanced one).
INTERPRETER_CASES = {
    "one-split": (_ragged(5, 77), (3, 77, 40, 0, 61), None),
    "two-splits-fused-merge": (_ragged(5, 77), (3, 77, 40, 0, 61), 2),
    "paged16": (_ragged(4, 96, page_size=16), (17, 96, 50, 1), None),
    "tied": (_ragged(4, 77), (40, 40, 40, 77), None),
}


@interpreter_only
@pytest.mark.parametrize("case", sorted(INTERPRETER_CASES))
def test_against_fp64_under_the_interpreter(case: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(decode, "LONGEST_FIRST", True)
    problem, lengths, num_splits = INTERPRETER_CASES[case]
    assert not decode.balanced_split(problem, CPU), case
    assert decode._split_constexprs(problem, split=False)["ORDER_BLOCK_B"] == 16
    result = _interpreter_check(problem, lengths, num_splits)
    assert result.ok, f"{case}: {result.summary()}"


@triton.jit
def _items_of_grid(Items, CacheSeqlens, kv_heads, batch_size, BLOCK_B: tl.constexpr):
    """Grid index z's item under ``longest_first_item``, stored at Items[z]."""
    z = tl.program_id(0)
    tl.store(Items + z, longest_first_item(z, kv_heads, CacheSeqlens, batch_size, BLOCK_B))


@interpreter_only
def test_device_order_is_the_hosts():
    """``longest_first_item`` maps grid index z = rank · Hkv + KV head to the rank-th longest sequence's item, the
    order ``splits.longest_first_order`` states, ties by index, for a batch short of its block."""
    lengths, kv_heads = (40, 77, 40, 3, 77, 0, 12), 3
    items = torch.full((len(lengths) * kv_heads,), -1, dtype=torch.int32)
    _items_of_grid[(items.numel(),)](items, torch.tensor(lengths, dtype=torch.int32), kv_heads, len(lengths), 16)
    order = splits.longest_first_order(lengths)
    expected = [batch * kv_heads + head for batch in order for head in range(kv_heads)]
    assert items.tolist() == expected


@triton.jit
def _planted_longest_first_item(batch_kv_head, kv_heads, CacheSeqlens, batch_size, BLOCK_B: tl.constexpr):
    # Planted: the rank without the tie-break, so that tied sequences share a rank.
    offs = tl.arange(0, BLOCK_B)
    lengths = tl.load(CacheSeqlens + offs, mask=offs < batch_size, other=-1)
    ranks = tl.sum((lengths[None, :] > lengths[:, None]).to(tl.int32), axis=1)
    batch = tl.sum(tl.where(ranks == batch_kv_head // kv_heads, offs, 0), axis=0)
    return batch * kv_heads + batch_kv_head % kv_heads


@interpreter_only
def test_planted_rank_without_tie_break_fails(monkeypatch: pytest.MonkeyPatch):
    """Three tied sequences of four (40, 40, 40, 77) share rank 1 without the tie-break: rank 1 takes batch 0 + 1 + 2
    = 3 and ranks 2 and 3 batch 0, so batches 1 and 2 are never computed and the poisoned output fails the check (the
    plain rank passes the same case, above)."""
    monkeypatch.setattr(decode, "LONGEST_FIRST", True)
    monkeypatch.setattr(decode, "longest_first_item", _planted_longest_first_item)
    problem, lengths, num_splits = INTERPRETER_CASES["tied"]
    result = _interpreter_check(problem, lengths, num_splits)
    assert not result.ok, "a rank without the tie-break passed the check"


_STATIC = r"""
import json, re
from common.measure.decode_sweep import random_cases
from common.reporting.static import cubin_resources, cubin_sass
from triton_impl import decode

facts = {}
for switch in (False, True):
    decode.LONGEST_FIRST = switch
    binaries = decode.compile_sm90(random_cases(8, 6007)[4].problem)
    binary = next(b for b in binaries if "_split_kernel" in cubin_resources(b.cubin))
    (kernel, usage), = cubin_resources(binary.cubin).items()
    sass = cubin_sass(binary.cubin)
    facts[str(switch)] = {"kernel": kernel, "registers": usage["registers"],
                          "spill_bytes": usage["local_bytes"] + usage["stack_bytes"],
                          "local_ops": len(re.findall(r"\b(?:LDL|STL)\b", sass)), "sass_lines": len(sass.splitlines())}
print(json.dumps(facts))
"""


@pytest.mark.static
def test_build_with_it_on_spills_nothing():
    """6007/4's split kernel (sm_90a, the running Triton release) with it on: no spill, a different build."""
    facts = json_from_child(["-c", _STATIC], timeout=900)
    off, on = facts["False"], facts["True"]
    print(json.dumps(facts))
    assert on["kernel"] == off["kernel"] == "_split_kernel", facts
    assert on["spill_bytes"] == 0 and on["local_ops"] == 0, facts
    assert on["sass_lines"] != off["sass_lines"], facts


GPU_CASES = {
    "6007/4": (random_cases(8, 6007)[4].problem, random_cases(8, 6007)[4].lengths),
    "paged64-ragged": (
        _problem(64, 4, 4, 4, 512, 64, has_cache_seqlens=True, page_size=64),
        tuple(torch.randint(1, 513, (64,), generator=torch.Generator().manual_seed(3)).tolist()),
    ),
}


def test_gpu_cases_stay_on_the_padded_split(monkeypatch: pytest.MonkeyPatch):
    """Each GPU case reaches the switch on a Hopper GPU's 132 SMs (H100 SXM and H200): ordered, one padded split, not
    the balanced split (paged64-ragged at 2048 keys split four ways there and took the balanced split, H100)."""
    monkeypatch.setattr(decode, "LONGEST_FIRST", True)
    monkeypatch.setattr(splits, "sm_count", lambda device: 132)
    cuda = torch.device("cuda")
    for case, (problem, _) in GPU_CASES.items():
        assert decode.order_block(problem) > 0, case
        assert not decode.balanced_split(problem, cuda) and decode.planned_num_splits(problem, cuda) == 1, case


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gpu_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    monkeypatch.setattr(decode, "LONGEST_FIRST", True)
    problem, lengths = GPU_CASES[case]
    assert decode.order_block(problem) > 0 and not decode.balanced_split(problem, torch.device("cuda")), case
    result = check_on_gpu("triton/decode", problem, lengths, seed=len(case))
    assert result.ok, f"triton/decode LONGEST_FIRST {problem.describe()}: {result.summary()}"
