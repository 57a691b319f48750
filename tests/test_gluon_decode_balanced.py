"""gluon/decode's balanced split (``BALANCED_SPLIT``, triton/decode's switch and share plan; off by default).

On the CPU: the switch's default and values, the grid and workspace that the shape fixes (target shares +
B · Hkv CTAs per M tile, triton/decode's target rule on gluon's tiles), a forced target, a bad one refused;
the kernel as the prepared launch binds it ("always") compiled for sm_90a in a child process at D 64, 128
and 256, contiguous and paged, one and 8 tokens: the plan's reductions and the arrival atomic present, no
spills, within a CTA's shared memory. On the GPU (``gpu``): against fp64 (poisoned outputs) on ragged
batches with empty sequences, one very long sequence among short ones (seed 31's MQA row in small), GQA,
MQA, several M tiles, paged and contiguous, causal bottom-right, top-left and none, Sq 1 and 8, the rule's
target and forced ones; 20 launches bit for bit; a CUDA graph replayed with new lengths. The plan itself
(``balanced_plan``) is triton/decode's, whose interpreter tests plant bugs in it.
"""

from __future__ import annotations

import json
from typing import NamedTuple

import pytest
import torch

from common.contract import splits
from common.contract.check import check_on_inputs
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from common.toolchain.releases import triton_release
from tests._helpers import decode_call_inputs, json_from_child
from tests.test_decode import _check_graph_replays, _with_splits, assert_launches_repeat
from triton_impl import decode as triton_decode
from triton_impl.gluon import _decode_balanced
from triton_impl.gluon import decode as gluon_decode

CPU = torch.device("cpu")


def _problem(batch: int, heads: int, kv_heads: int, seqlen_q: int, seqlen_k: int, head_dim: int, **changes) -> Problem:
    alignment = changes.pop("alignment", "bottom_right")
    return Problem(
        batch, heads, seqlen_q, seqlen_k, head_dim, dtype=changes.pop("dtype", torch.bfloat16),
        causal=alignment is not None, kv_heads=kv_heads, causal_alignment=alignment or "top_left",
        has_cache_seqlens=changes.pop("has_cache_seqlens", True), return_lse=True, **changes,
    )  # fmt: skip


def test_balanced_switch_is_triton_decodes_and_on_where_the_rule_splits_a_ragged_batch(
    monkeypatch: pytest.MonkeyPatch,
):
    """The committed "ragged-split-long" (results/h200/decode-balanced-gluon-cute/, decode-long-few-heads/): a
    ragged batch the rule splits, not one sequence, not a batch whose items alone fill the GPU (the rule's one
    split), unless the rule splits past LONG_CHAIN_SPLITS (``test_decode_long_chain.py``'s rows)."""
    assert gluon_decode.BALANCED_SPLIT == "ragged-split-long"
    problem = _problem(3, 8, 2, 1, 4096, 128)
    full, single, many = (
        problem.with_(has_cache_seqlens=False),
        problem.with_(batch=1),
        _problem(64, 64, 64, 1, 4096, 64),
    )
    assert gluon_decode.planned_num_splits(problem, torch.device("cpu")) > 1
    assert gluon_decode.planned_num_splits(many, torch.device("cpu")) == 1
    cases = (
        ("never", False, False, False, False), ("ragged", True, False, True, True),
        ("ragged-split", True, False, False, False), ("ragged-split-long", True, False, False, False),
        ("always", True, True, True, True),
    )  # fmt: skip
    for switch, *expected in cases:
        monkeypatch.setattr(gluon_decode, "BALANCED_SPLIT", switch)
        got = [gluon_decode.balanced_split(p) for p in (problem, full, single, many)]
        assert got == expected, switch


def test_balanced_grid_and_workspace_follow_the_shape(monkeypatch: pytest.MonkeyPatch):
    """target shares (triton/decode's per-SM rule on gluon's M tiles and key blocks; "per-slot", the default, is
    tests/test_decode_target.py's) + B · Hkv CTAs per M tile, the M tile on x (M_TILE_MAJOR), a slab of group · Sq
    packed rows per CTA; a forced target replaces the rule's, 0 is refused."""
    monkeypatch.setattr(gluon_decode, "BALANCED_SPLIT", "always")
    monkeypatch.setattr(_decode_balanced, "BALANCED_TARGET", "per-sm")
    monkeypatch.setattr(gluon_decode, "BALANCED_SHARES_BY_SLOTS", True)
    # One consumer a CTA: this test's M tiles are the grid's (two a CTA: tests/test_gluon_decode_two_consumers.py).
    monkeypatch.setattr(gluon_decode, "TWO_CONSUMERS", {})
    problem = _problem(3, 32, 2, 8, 65536, 128)  # 128 packed rows: two 64-row M tiles
    q, k, v = make_inputs(problem, seed=0, device="cpu")
    lengths = torch.tensor((65536, 0, 7), dtype=torch.int32)
    run = gluon_decode.bind(q, k, v, problem, cache_seqlens=lengths)
    # D=128's long ring leaves one CTA slot an SM: one share an SM (two with triton/decode's count).
    assert gluon_decode.split_policy(problem).ctas_per_sm == 1
    target = splits.DEFAULT_SM_COUNT // 2
    block_n = gluon_decode.decode_config(problem).block_n
    assert target == splits.balanced_target_shares(problem, CPU, 2, block_n, 1, triton_decode.BALANCED_MIN_KEYS)
    monkeypatch.setattr(gluon_decode, "BALANCED_SHARES_BY_SLOTS", False)
    assert gluon_decode.bind(q, k, v, problem, cache_seqlens=lengths).num_splits == 2 * target
    monkeypatch.setattr(gluon_decode, "BALANCED_SHARES_BY_SLOTS", True)
    assert run.balanced and run.fused_merge and run.num_splits == target
    assert run.split_grid == (2, target + 3 * 2)
    assert run.split_options["BALANCED"] and not run.split_options["SPLIT"] and run.split_options["BLOCK_B"] == 16
    out_partial, lse_partial = run.split_args[6:8]
    assert out_partial.shape == (target + 6, 16 * 8, 128) and lse_partial.shape == (target + 6, 16 * 8)
    min_blocks = -(-triton_decode.BALANCED_MIN_KEYS // block_n)
    assert run.split_args[-4:] == (3, target, min_blocks, _decode_balanced.item_share_cap())
    forced = gluon_decode.bind(q, k, v, problem, cache_seqlens=lengths, num_splits=5)
    assert forced.split_grid == (2, 5 + 6) and forced.num_splits == 5
    with pytest.raises(ValueError, match="must be >= 1, got 0"):
        gluon_decode.bind(q, k, v, problem, cache_seqlens=lengths, num_splits=0)
    monkeypatch.setattr(gluon_decode, "BALANCED_SPLIT", "never")
    default = gluon_decode.bind(q, k, v, problem, cache_seqlens=lengths, num_splits=5)
    assert not default.balanced and default.split_grid == (5, 2, 6) and default.split_args[-4:] == (None,) * 4


# ----------------------------------------------------------------------------------------------------
# sm_90a: the balanced kernel as the prepared launch binds it (a child process: no interpreter)
# ----------------------------------------------------------------------------------------------------
_COMPILE_SCRIPT = """
import json, sys
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import make_backend
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import create_function_from_signature
from common.contract.inputs import make_inputs, make_paged_kv
from common.contract.problem import Problem
from common.reporting.static import cubin_resources
from triton_impl.gluon import decode
decode.BALANCED_SPLIT = "always"
kernel = decode._split_kernel
target = GPUTarget("cuda", 90, 32)
backend = make_backend(target)
binder = create_function_from_signature(kernel.signature, kernel.params, backend)
results = []
for head_dim, seqlen_q, page_size, heads, kv_heads in json.loads(sys.argv[1]):
    problem = Problem(4, heads, seqlen_q, 4096, head_dim, dtype=torch.bfloat16, causal=True, kv_heads=kv_heads,
                      causal_alignment="bottom_right", has_cache_seqlens=True, return_lse=True, page_size=page_size)
    q, k, v = make_inputs(problem, seed=1, device="cpu")
    block_table = None
    if page_size:
        k, v, block_table = make_paged_kv(problem, k, v, seed=1)
    lengths = torch.tensor((4096, 0, 700, 5), dtype=torch.int32)
    prepared = decode.bind(q, k, v, problem, cache_seqlens=lengths, block_table=block_table)
    kwargs = {**prepared.split_options, "debug": False}
    bound, specialization, options = binder(*prepared.split_args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    compiled = triton.compile(GluonASTSource(kernel, signature, constexprs, attrs), target=target,
                              options=options.__dict__)
    (resources,) = cubin_resources(compiled.asm["cubin"]).values()
    ptx = compiled.asm["ptx"]
    results.append({
        "balanced": prepared.balanced,
        "spill_bytes": resources["local_bytes"] + resources["stack_bytes"],
        "shared_bytes": compiled.metadata.shared,
        "arrival_atomic": "atom.global.gpu.acq_rel.add" in ptx,
        "tma": "cp.async.bulk.tensor" in ptx,
    })
print(json.dumps(results))
"""
# (D, Sq, page size, H, Hkv): each head dim contiguous and paged, 1 and 8 tokens, GQA; seed 31's MQA row (H = Hkv
# = 1: Triton makes the sizes equal to 1 constants, and the slab's row count with them).
COMPILES = [
    (64, 1, 0, 16, 2), (64, 8, 64, 16, 2), (128, 8, 0, 16, 2), (128, 1, 16, 16, 2), (256, 8, 0, 16, 2),
    (256, 1, 32, 16, 2), (256, 8, 32, 1, 1),
]  # fmt: skip
# The shared memory one CTA may use on sm_90 (227 KB).
SM90_SHARED_BYTES = 232_448


@pytest.mark.static
def test_balanced_kernel_compiles_for_sm90_as_launched():
    """Every balanced launch without spills; where a release's balanced kernel spills (``BALANCED_SPILLS``:
    Triton 3.9 at D=256, 16-40 bytes) the rung takes the padded split instead (under 3.9 that kernel spills
    8 bytes at D=256 Sq=8 too, found here: the padded split's own matter, not this test's)."""
    compiled = json_from_child(["-c", _COMPILE_SCRIPT, json.dumps(COMPILES)], timeout=1200)
    spilling = gluon_decode.BALANCED_SPILLS.get(triton_release(), ())
    for (head_dim, seqlen_q, page_size, heads, kv_heads), result in zip(COMPILES, compiled, strict=True):
        where = f"balanced D={head_dim} Sq={seqlen_q} page={page_size} H={heads} Hkv={kv_heads}: {result}"
        assert result["balanced"] == (head_dim not in spilling) and result["tma"], where
        if result["balanced"]:
            assert result["arrival_atomic"] and result["spill_bytes"] == 0, where
        assert 0 < result["shared_bytes"] <= SM90_SHARED_BYTES, where


# ----------------------------------------------------------------------------------------------------
# GPU: against fp64, bit for bit over launches, in a CUDA graph
# ----------------------------------------------------------------------------------------------------
class BalancedCase(NamedTuple):
    """A ragged GPU case: (B, H, Hkv, Sq, Sk, D) with ``lengths`` through cache_seqlens; ``shares`` None:
    the rule's target."""

    name: str
    problem: Problem
    lengths: tuple[int, ...] | None  # None: no cache_seqlens, every sequence at Sk
    shares: int | None = None


# One very long sequence among short and empty ones (seed 31's B=16 MQA D=256 pages of 32, at 64k keys);
# GQA at one token on vLLM's pages of 16; GQA of 16 at 8 tokens (128 packed rows, two M tiles), pages of 64;
# forced small targets (an item of many shares, of one share, CTAs past the last share); fp16 D=64 top-left
# and D=128 without a mask, contiguous; no cache_seqlens ("always" takes a call without them too).
LONG = (23, 0, 311, 5, 65536, 1, 0, 4000, 64, 7, 130, 0, 999, 2, 77, 4096)
CASES = [
    BalancedCase("mqa-sq8-d256-page32-one-long", _problem(16, 1, 1, 8, 65536, 256, page_size=32), LONG),
    BalancedCase("gqa-sq1-d128-page16", _problem(4, 32, 8, 1, 4096, 128, page_size=16), (4096, 0, 1366, 5)),
    BalancedCase("gqa16-sq8-d64-page64", _problem(4, 32, 2, 8, 4352, 64, page_size=64), (0, 4352, 1, 77)),
    BalancedCase("gqa-sq8-d128-shares5", _problem(4, 16, 4, 8, 3000, 128), (3000, 0, 1001, 5), shares=5),
    BalancedCase("mqa-sq1-d256-shares3", _problem(3, 8, 1, 1, 20000, 256), (20000, 0, 3), shares=3),
    BalancedCase(
        "gqa-sq8-d64-fp16-topleft",
        _problem(4, 32, 8, 8, 2048, 64, dtype=torch.float16, alignment="top_left"),
        (2048, 0, 700, 5),
    ),
    BalancedCase("gqa-sq1-d128-full-mask", _problem(4, 32, 8, 1, 8192, 128, alignment=None), (8192, 8192, 0, 100)),
    BalancedCase("gqa-sq8-d128-no-lengths", _problem(2, 32, 8, 8, 5000, 128, has_cache_seqlens=False), None),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_gpu_gluon_balanced_split_against_fp64_and_deterministic(case: BalancedCase, monkeypatch: pytest.MonkeyPatch):
    """Against fp64 (poisoned), then 20 launches with the same bits (the merging CTA varies on a GPU)."""
    monkeypatch.setattr(gluon_decode, "BALANCED_SPLIT", "always")
    (q, k, v), extra = decode_call_inputs(case.problem, case.lengths, seed=CASES.index(case) + 1)
    impl = (
        gluon_decode.IMPLEMENTATION if case.shares is None else _with_splits(case.shares, gluon_decode.IMPLEMENTATION)
    )
    result = check_on_inputs(impl, q, k, v, case.problem, **extra)
    assert result.ok, f"gluon balanced {case.problem.describe()} shares={case.shares}: {result.summary()}"
    run = impl.prepare(q, k, v, case.problem, **extra)
    assert run.balanced
    assert_launches_repeat(run)


@pytest.mark.gpu
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_gpu_gluon_balanced_split_replays_in_a_cuda_graph_with_new_lengths(
    paged: bool, monkeypatch: pytest.MonkeyPatch
):  # fmt: skip
    monkeypatch.setattr(gluon_decode, "BALANCED_SPLIT", "always")
    _check_graph_replays(gluon_decode.IMPLEMENTATION, paged)


def test_ab_tool_times_seed31s_ragged_rows_and_full_caches_with_cache_seqlens():
    """bench/gluon_balanced_ab's plan on the CPU: seed 31's two ragged paged rows as drawn, then the full
    caches with every length at Sk; gluon "never", "always" (one share a CTA slot) and "always" with
    triton/decode's two shares an SM; triton/decode as committed."""
    from bench import cute_balanced_ab, gluon_balanced_ab

    described = [case.describe() for case in cute_balanced_ab.cases(gluon_balanced_ab.CASES)]
    assert described[0].startswith("B=16 H=1 Sq=8 Sk=147456 D=256") and "paged(32) lengths=23..138969" in described[0]
    assert described[1].startswith("B=32 H=512 Hkv=32 Sq=8") and "paged(64) lengths=22..4186" in described[1]
    assert "B=8 H=32 Hkv=8 Sq=1 Sk=8192" in described[2] and "lengths=8192..8192" in described[2]
    assert "B=1 H=32 Hkv=8 Sq=1 Sk=131072" in described[3] and "lengths=131072..131072" in described[3]
    settings = [(name, setting, switches) for name, setting, switches in gluon_balanced_ab.SETTINGS]
    assert settings == [
        ("gluon/decode", "never", {"BALANCED_SPLIT": "never"}),
        ("gluon/decode", "always", {"BALANCED_SPLIT": "always"}),
        ("gluon/decode", "always-2/SM", {"BALANCED_SPLIT": "always", "BALANCED_SHARES_BY_SLOTS": False}),
        ("triton/decode", "committed", {}),
    ]


@pytest.mark.gpu
def test_gpu_gluon_balanced_plan_missing_a_sequence_fails_the_check(monkeypatch: pytest.MonkeyPatch):
    """A planted bug: the plan told one sequence fewer than the batch, so the last sequence's rows are never
    written (poisoned), which the fp64 check must catch."""
    monkeypatch.setattr(gluon_decode, "BALANCED_SPLIT", "always")
    planned = gluon_decode.balanced_sizes

    def one_sequence_short(*args):
        batch, *rest = planned(*args)
        return batch - 1, *rest

    monkeypatch.setattr(gluon_decode, "balanced_sizes", one_sequence_short)
    case = CASES[1]
    (q, k, v), extra = decode_call_inputs(case.problem, case.lengths, seed=2)
    result = check_on_inputs(gluon_decode.IMPLEMENTATION, q, k, v, case.problem, **extra)
    assert not result.ok, f"the planted plan passed: {result.summary()}"
