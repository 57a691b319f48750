"""Ring attention (``common.distributed``): the zig-zag plan, the merge, the sampled float64 check, and
the ring itself over gloo with 2 to 8 CPU processes (torch and Triton-interpreter local kernels), with
random pauses at every ordering point (``ring.Jitter``) and planted bugs the check must catch. GPU: the
same over NCCL on every GPU of the host with the Hopper rungs of the three stacks."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from common.contract.problem import Problem
from common.distributed import ring, zigzag
from common.distributed.check import ChunkedInputs, check_rows, reference_rows, sample_rows
from common.distributed.ring import merge_partial_, ring_attention
from common.distributed.teardown import leaving_process_group
from tests.ring_workers import TORCH_CP_LAYOUT, Case, spawn_cases, torch_kernel

# One xdist worker takes the module, and its worlds of gloo processes (the jitter worlds: 75-100 s) are session-scoped:
# spawned once. The worker runs the group's tests between other modules' tests, and pytest tears a module-scoped
# fixture down at each switch (the jitter worlds were spawned twice a CI leg, 2026-12-01).
pytestmark = pytest.mark.xdist_group("ring-gloo")

# ----------------------------------------------------------------------------------------------
# The zig-zag plan: every visible (query, key) pair computed exactly once, nothing else
# ----------------------------------------------------------------------------------------------


def _pairs_computed(world_size: int, chunk_len: int, causal: bool) -> list[tuple[int, int]]:
    """(query position, key position) of every score the ring's plan computes, over all ranks and steps."""
    local_len = 2 * chunk_len
    pairs = []
    for rank in range(world_size):
        q_pos = zigzag.positions(zigzag.chunk_ids(rank, world_size), chunk_len).tolist()
        for step in range(world_size):
            source = zigzag.source_rank(rank, step, world_size)
            k_pos = zigzag.positions(zigzag.chunk_ids(source, world_size), chunk_len).tolist()
            plan = zigzag.step_plan(rank, step, world_size, causal)
            rows, keys = plan.query_slice(local_len), plan.key_slice(local_len)
            for i, j in itertools.product(range(local_len)[rows], range(local_len)[keys]):
                if not plan.causal or j <= i:
                    pairs.append((q_pos[i], k_pos[j]))
    return pairs


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("causal", [False, True])
def test_plan_computes_every_visible_pair_once(world_size: int, causal: bool) -> None:
    chunk_len = 3
    seqlen = 2 * world_size * chunk_len
    pairs = _pairs_computed(world_size, chunk_len, causal)
    expected = {(i, j) for i in range(seqlen) for j in range(seqlen) if not causal or j <= i}
    assert len(pairs) == len(set(pairs)), "a (query, key) pair is computed twice"
    assert set(pairs) == expected


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_plan_balances_causal_work(world_size: int) -> None:
    """Every rank computes the same number of scores at every step after the first."""
    chunk_len = 4
    per_rank = [
        sum(1 for _ in _pairs_computed_on(rank, world_size, chunk_len, step)) for rank in range(world_size)
        for step in range(1, world_size)
    ]  # fmt: skip
    assert len(set(per_rank)) == 1


def _pairs_computed_on(rank: int, world_size: int, chunk_len: int, step: int):
    plan = zigzag.step_plan(rank, step, world_size, causal=True)
    local_len = 2 * chunk_len
    return itertools.product(range(local_len)[plan.query_slice(local_len)], range(local_len)[plan.key_slice(local_len)])


def test_wrong_layout_is_caught_by_the_pair_count() -> None:
    """The plan's coverage test fails when the layout is not the zig-zag one it assumes."""
    original = zigzag.chunk_ids
    try:
        zigzag.chunk_ids = zigzag.contiguous_chunk_ids
        pairs = _pairs_computed(3, 2, causal=True)
    finally:
        zigzag.chunk_ids = original
    expected = {(i, j) for i in range(12) for j in range(12) if j <= i}
    assert set(pairs) != expected


def test_shard_and_unshard_round_trip() -> None:
    full = torch.arange(2 * 3 * 12).reshape(1, 2, 12, 3)
    shards = [zigzag.shard(full, rank, 3) for rank in range(3)]
    assert shards[0][0, 0, :, 0].tolist() == [0, 3, 30, 33]  # chunks 0 and 5 (positions 0-1 and 10-11)
    assert torch.equal(zigzag.unshard(shards), full)


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: zigzag.chunk_length(10, 3), "multiple of 6"),
        (lambda: zigzag.chunk_ids(3, 3), "rank must lie in"),
        (lambda: zigzag.shard(torch.zeros(1, 1, 10, 2), 0, 3), "multiple of 6"),
    ],
)
def test_zigzag_refuses_bad_arguments(call, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        call()


# ----------------------------------------------------------------------------------------------
# The merge
# ----------------------------------------------------------------------------------------------


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 attention and LSE (no mask, scale 0.3)."""
    scores = (q @ k.transpose(-1, -2)) * 0.3
    return torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores, dim=-1)


def test_merge_of_parts_equals_attention_over_all_keys() -> None:
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=generator, dtype=torch.float64) for _ in range(3))
    whole_out, whole_lse = _attend(q, k, v)
    out = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full(q.shape[:3], -math.inf, dtype=torch.float64)
    for keys in (slice(0, 2), slice(2, 3), slice(3, 5)):
        merge_partial_(out, lse, *_attend(q, k[:, :, keys], v[:, :, keys]))
    torch.testing.assert_close(out, whole_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, whole_lse, rtol=0, atol=1e-12)


def test_merge_is_safe_for_rows_without_keys() -> None:
    out = torch.zeros(1, 1, 3, 2)
    lse = torch.full((1, 1, 3), -math.inf)
    block = torch.tensor([[[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]]])
    merge_partial_(out, lse, block, torch.tensor([[[0.0, -math.inf, 2.0]]]))
    merge_partial_(out, lse, torch.zeros_like(block), torch.full((1, 1, 3), -math.inf))
    assert lse.tolist() == [[[0.0, -math.inf, 2.0]]]
    assert out.tolist() == [[[[1.0, 2.0], [0.0, 0.0], [5.0, 6.0]]]]
    assert torch.isfinite(out).all()


def test_merge_propagates_nan() -> None:
    out = torch.zeros(1, 1, 1, 2)
    lse = torch.zeros(1, 1, 1)
    merge_partial_(out, lse, torch.full((1, 1, 1, 2), math.nan), torch.zeros(1, 1, 1))
    assert torch.isnan(out).all()


# ----------------------------------------------------------------------------------------------
# The sampled check on its own: the reference, the row sample, and a planted error it must catch
# ----------------------------------------------------------------------------------------------


def test_reference_rows_match_the_full_reference() -> None:
    from common.contract.reference import reference_attention

    problem = Problem(2, 4, 24, 24, 8, dtype=torch.float32, causal=True, kv_heads=2)
    inputs = ChunkedInputs(problem, 4, torch.device("cpu"))
    q, k, v = (inputs.full(name) for name in ("q", "k", "v"))
    full_out, full_lse = reference_attention(q, k, v, problem, with_lse=True)
    rows = torch.tensor([0, 5, 13, 23])
    out, lse = reference_rows(q[:, :, rows], rows, k, v, problem, key_block=7)
    torch.testing.assert_close(out, full_out[:, :, rows], rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, full_lse[:, :, rows], rtol=0, atol=1e-12)


def test_sample_rows_keeps_chunk_edges() -> None:
    rows = sample_rows(100, 8, seed=3).tolist()
    assert len(rows) == 8 and rows == sorted(set(rows))
    assert {0, 49, 50, 99} <= set(rows)
    assert sample_rows(6, 10).tolist() == list(range(6))


def test_chunked_inputs_rebuild_the_same_numbers() -> None:
    problem = Problem(1, 2, 16, 16, 4, dtype=torch.float16)
    inputs = ChunkedInputs(problem, 4, torch.device("cpu"), seed=5)
    assert torch.equal(inputs.local("k", (3, 0)), torch.cat([inputs.chunk("k", 3), inputs.chunk("k", 0)], dim=2))
    assert not torch.equal(inputs.chunk("k", 1), inputs.chunk("v", 1))
    with pytest.raises(ValueError, match="chunks must divide"):
        ChunkedInputs(problem, 5, torch.device("cpu"))


@pytest.mark.parametrize("planted", ["none", "one_row_off", "nan", "lse_shifted"])
def test_check_rows_catches_a_planted_error(planted: str) -> None:
    problem = Problem(1, 2, 16, 16, 8, dtype=torch.float32, causal=True)
    inputs = ChunkedInputs(problem, 2, torch.device("cpu"))
    q, k, v = (inputs.full(name) for name in ("q", "k", "v"))
    out, lse = torch_kernel(q, k, v, causal=True, softmax_scale=problem.scale)
    if planted == "one_row_off":
        out[:, :, 7] += 0.05
    elif planted == "nan":
        out[0, 1, 3, 0] = math.nan
    elif planted == "lse_shifted":
        lse[:, :, 9] += 1e-3
    verdict = check_rows(out, lse, q, torch.arange(16), inputs, torch.arange(16))
    assert verdict.ok == (planted == "none"), verdict.summary()


# ----------------------------------------------------------------------------------------------
# Input validation (before any communication)
# ----------------------------------------------------------------------------------------------


def _qkv(local_len: int = 8, kv_heads: int = 2) -> tuple[torch.Tensor, ...]:
    kv_shape = (1, kv_heads, local_len, 16)
    return torch.zeros(1, 2, local_len, 16), torch.zeros(kv_shape), torch.zeros(kv_shape)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "words"),
    [
        (_qkv(), {"impl": 3}, TypeError, "implementation name or a callable"),
        ((torch.zeros(1, 2, 8, 16), torch.zeros(1, 2, 6, 16), torch.zeros(1, 2, 6, 16)), {}, ValueError, "same local"),
        (_qkv(local_len=7), {}, ValueError, "must be even"),
        (_qkv(kv_heads=3), {}, ValueError, "must divide"),
        ((torch.zeros(1, 2, 8, 16, dtype=torch.int32),) * 3, {}, TypeError, "dtype must be one of"),
        ((*_qkv()[:2], torch.zeros(1, 2, 8, 16, dtype=torch.float16)), {}, TypeError, "share one dtype"),
        ((torch.zeros(2, 8, 16),) * 3, {}, ValueError, "rank 4"),
    ],
)
def test_ring_refuses_bad_inputs(args, kwargs, error, words: str) -> None:
    options = {"causal": True, "impl": torch_kernel, **kwargs}
    with pytest.raises(error, match=words):
        ring_attention(*args, **options)


def test_ring_refuses_grad_and_uninitialised_distributed() -> None:
    q, k, v = _qkv()
    with pytest.raises(NotImplementedError, match="forward-only"):
        ring_attention(q.requires_grad_(), k, v, causal=True, impl=torch_kernel)
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    with pytest.raises(RuntimeError, match=r"torch\.distributed initialised"):
        ring_attention(q.detach(), k, v, causal=True, impl=torch_kernel)


@pytest.mark.parametrize(
    ("backend", "device_type", "expected"),
    [("nccl", "cuda", "nccl"), ("gloo", "cpu", "gloo"), ("gloo", "cuda", None), ("cpu:gloo,cuda:nccl", "cuda", "nccl"),
     ("cpu:gloo,cuda:nccl", "cpu", "gloo"), ("cpu:gloo", "cuda", None)],
)  # fmt: skip
def test_backend_for_each_device(monkeypatch, backend: str, device_type: str, expected: str | None) -> None:
    monkeypatch.setattr(dist, "get_backend", lambda group=None: backend)
    assert ring._backend_for(device_type, None) == expected


def test_ring_refuses_an_impl_that_cannot_run_a_step(tmp_path: Path) -> None:
    """A capability refusal names the step before any transfer (one-process gloo group)."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    with leaving_process_group():
        q, k, v = _qkv()
        with pytest.raises(ValueError, match="triton/hopper cannot run the ring step"):
            ring_attention(q, k, v, causal=True, impl="triton/hopper")
        with pytest.raises(ValueError, match="unknown implementation"):
            ring_attention(q, k, v, causal=True, impl="triton/nope")
        out, lse = ring_attention(q, k, v, causal=True, impl=torch_kernel)
        assert out.shape == q.shape and lse.shape == q.shape[:3]
    assert not dist.is_initialized()


# ----------------------------------------------------------------------------------------------
# The ring over gloo: 2 and 4 CPU processes, each case judged on every rank against float64. One
# spawn per world size runs all its cases (process start-up dominates); the Triton rungs run under
# the interpreter in the 2-process spawn only (each process imports the whole registry).
# ----------------------------------------------------------------------------------------------

GQA = {"heads": 4, "kv_heads": 2}
WORLD2_CASES = [
    Case("causal"),
    Case("full", causal=False),
    Case("causal_gqa_batch2", batch=2, **GQA),
    Case("full_gqa_fp16", causal=False, dtype="fp16", **GQA),
    Case("triton_tiled_causal_gqa", kernel="triton/tiled", head_dim=32, **GQA),
    Case("triton_pipelined_full", kernel="triton/pipelined", head_dim=32, causal=False),
    Case("local_only", causal=False, communicate=False),
    Case("bug_merge_twice", bug="merge_twice"),
    Case("bug_skip_shard", bug="skip_shard"),
    Case("bug_contiguous_layout", bug="contiguous_layout"),
    Case("bug_swapped_chunks", bug="swapped_chunks"),
]
WORLD4_CASES = [
    Case("causal", local_len=8),
    Case("full", causal=False, local_len=8),
    Case("causal_gqa_sampled", local_len=24, rows=9, **GQA),
    Case("bug_merge_twice", local_len=8, bug="merge_twice"),
    Case("bug_skip_shard", local_len=8, bug="skip_shard"),
    Case("bug_contiguous_layout", local_len=8, bug="contiguous_layout"),
    Case("bug_swapped_chunks", local_len=8, bug="swapped_chunks"),
    Case("bug_reversed_ring", local_len=8, bug="reversed_ring"),
    Case("bug_skip_shard_full", local_len=8, causal=False, bug="skip_shard"),
]


# Every world size from 3 on reuses a receive slot or holds one shard per step in flight: 3, 4, 5 and 8
# ranks with random pauses at every ordering point (sends, receives, local kernels), and a planted
# missing wait that must fail under them.
JITTER_MS = 2.0
JITTER_CASES = [
    Case("causal_jitter", local_len=8, jitter_ms=JITTER_MS),
    Case("full_jitter", causal=False, local_len=8, jitter_ms=JITTER_MS),
    Case("causal_gqa_batch2_jitter", batch=2, local_len=12, jitter_ms=JITTER_MS, **GQA),
    Case("full_mqa_bf16_jitter", causal=False, dtype="bf16", heads=4, kv_heads=1, jitter_ms=JITTER_MS),
    Case("causal_transfer_first_jitter", local_len=8, jitter_ms=JITTER_MS, transfer_first=True),
    # Only the senders pause: each rank reads its shard at once, mostly before it has arrived.
    Case("bug_no_arrival_wait", local_len=8, jitter_ms=10.0, jitter_points=("send",), bug="no_arrival_wait"),
]
JITTER_WORLD_SIZES = (3, 4, 5, 8)


@pytest.fixture(scope="session")
def jitter_worlds(tmp_path_factory) -> dict[int, dict[str, list[dict]]]:
    return {
        size: spawn_cases(JITTER_CASES, size, "gloo", tmp_path_factory.mktemp(f"ring{size}_jitter"))
        for size in JITTER_WORLD_SIZES
    }


@pytest.mark.slow
@pytest.mark.parametrize("case", JITTER_CASES, ids=lambda case: case.name)
@pytest.mark.parametrize("world_size", JITTER_WORLD_SIZES)
def test_ring_with_jitter_on_gloo_processes(jitter_worlds, world_size: int, case: Case) -> None:
    _assert_verdicts(jitter_worlds[world_size][case.name], case.bug)


def test_jitter_refuses_unknown_points() -> None:
    with pytest.raises(ValueError, match="jitter points must be among"):
        ring.Jitter(seed=0, points=("kernel", "allreduce"))


@pytest.fixture(scope="session")
def world2(tmp_path_factory) -> dict[str, list[dict]]:
    return spawn_cases(WORLD2_CASES, 2, "gloo", tmp_path_factory.mktemp("ring2"))


@pytest.fixture(scope="session")
def world4(tmp_path_factory) -> dict[str, list[dict]]:
    return spawn_cases(WORLD4_CASES, 4, "gloo", tmp_path_factory.mktemp("ring4"))


def _assert_verdicts(verdicts: list[dict], bug: str | None) -> None:
    errors = [verdict["error"] for verdict in verdicts if "error" in verdict]
    assert not errors, errors
    if bug is None:
        assert all(verdict["ok"] for verdict in verdicts), [verdict["summary"] for verdict in verdicts]
    else:
        assert not all(verdict["ok"] for verdict in verdicts), f"planted {bug} passed: {verdicts}"


@pytest.mark.parametrize("case", WORLD2_CASES, ids=lambda case: case.name)
def test_ring_on_two_gloo_processes(world2, case: Case) -> None:
    _assert_verdicts(world2[case.name], case.bug)


@pytest.mark.parametrize("case", WORLD4_CASES, ids=lambda case: case.name)
def test_ring_on_four_gloo_processes(world4, case: Case) -> None:
    _assert_verdicts(world4[case.name], case.bug)


@pytest.mark.parametrize("world", ["world2", "world4", pytest.param("gpu_ring", marks=pytest.mark.gpu)])
def test_torch_cp_layout_is_the_zigzag_one(world: str, request) -> None:
    """The PyTorch baseline draws its shards from the token positions its context_parallel hands each
    rank: head-tail (= zig-zag) chunks when causal, contiguous ones otherwise."""
    layouts = request.getfixturevalue(world)[TORCH_CP_LAYOUT]
    assert not any("error" in layout for layout in layouts), layouts
    size = len(layouts)
    assert [tuple(layout["causal"]) for layout in layouts] == [zigzag.chunk_ids(r, size) for r in range(size)]
    assert [tuple(layout["full"]) for layout in layouts] == [zigzag.contiguous_chunk_ids(r, size) for r in range(size)]


def test_merge_twice_and_skip_fail_on_the_ranks_they_touch(world4) -> None:
    """Step 1 (merged twice) and the last step (skipped) give every rank a wrong row somewhere."""
    for name in ("bug_merge_twice", "bug_skip_shard_full"):
        assert not any(verdict["ok"] for verdict in world4[name]), name


# ----------------------------------------------------------------------------------------------
# GPU: NCCL between every GPU of the host (4 on a 4-GPU host: from 3 ranks on, receive slots are reused
# and one shard per step is in flight), every implementation the sweep uses, with jitter, and the two
# planted orderings that must fail: a shard read before it arrives, and the receive slots allocated
# in the middle of the ring (the bug that made the ring wrong on 4 GPUs and right on 2).
# ----------------------------------------------------------------------------------------------

BF16_D128 = {"head_dim": 128, "dtype": "bf16"}
GPU_JITTER_MS = 3.0
GPU_CASES = [
    Case("triton_hopper_causal_gqa", kernel="triton/hopper", heads=4, kv_heads=2, local_len=512, **BF16_D128),
    Case("triton_hopper_full_fp16", kernel="triton/hopper", local_len=384, head_dim=64, dtype="fp16", causal=False),
    Case("gluon_hopper_causal", kernel="gluon/hopper", heads=4, local_len=1024, rows=64, **BF16_D128),
    Case("gluon_hopper_full_jitter", kernel="gluon/hopper", heads=4, local_len=1024, rows=64, causal=False,
         jitter_ms=GPU_JITTER_MS, **BF16_D128),
    Case("cute_hopper_causal_mqa", kernel="cute/hopper", heads=4, kv_heads=1, local_len=1024, **BF16_D128),
    Case("cute_hopper_full", kernel="cute/hopper", heads=4, local_len=768, causal=False, **BF16_D128),
    Case("cute_hopper_causal_jitter", kernel="cute/hopper", heads=4, local_len=2048, rows=64,
         jitter_ms=GPU_JITTER_MS, **BF16_D128),
    Case("triton_hopper_causal_transfer_first_jitter", kernel="triton/hopper", heads=4, local_len=1024, rows=64,
         jitter_ms=GPU_JITTER_MS, transfer_first=True, **BF16_D128),
    Case("triton_hopper_full_jitter", kernel="triton/hopper", heads=4, local_len=2048, rows=64, causal=False,
         jitter_ms=GPU_JITTER_MS, **BF16_D128),
    Case("bug_skip_shard", kernel="triton/hopper", heads=2, local_len=256, bug="skip_shard", **BF16_D128),
    Case("bug_swapped_chunks", kernel="triton/hopper", local_len=256, bug="swapped_chunks", **BF16_D128),
    # Paused at the sends alone (as on CPUs): a pause before the reading kernel let the shard land first and hid
    # the early read on two H200s (2026-11-30); rank 0's first send waits 2.0 ms, far longer than a step's kernel.
    Case("bug_no_arrival_wait", kernel="triton/hopper", heads=4, local_len=2048, rows=64, causal=False,
         jitter_ms=GPU_JITTER_MS, jitter_points=("send",), bug="no_arrival_wait", **BF16_D128),
    # Paused before the merges alone: the slot allocated mid-ring is the previous step's partial output, freed by the
    # host while its merge is queued; with every point paused the merge ran before the receive landed and the bug
    # passed on four H200s (2026-11-30).
    Case("bug_late_receive_buffer", kernel="triton/hopper", heads=4, kv_heads=4, local_len=2048, rows=64, causal=False,
         jitter_ms=GPU_JITTER_MS, jitter_points=("merge",), bug="late_receive_buffer", **BF16_D128),
]  # fmt: skip
# Needs three ranks at least: with two, no receive slot is ever reused and the late buffer is harmless.
NEEDS_THREE_RANKS = {"bug_late_receive_buffer"}


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda case: case.name)
def test_ring_over_nccl(gpu_ring, case: Case) -> None:
    if case.kernel == "cute/hopper":
        pytest.importorskip("cutlass", reason="cute/hopper needs the CuTe DSL")
    if case.name in NEEDS_THREE_RANKS and torch.cuda.device_count() < 3:
        pytest.skip(f"{case.name} shows only from 3 ranks on; this host has {torch.cuda.device_count()} GPUs")
    _assert_verdicts(gpu_ring[case.name], case.bug)


@pytest.fixture(scope="session")
def gpu_ring(tmp_path_factory) -> dict[str, list[dict]]:
    """Every case on every GPU of the host, one spawn."""
    gpus = torch.cuda.device_count()
    if gpus < 2:
        pytest.skip(f"needs 2 CUDA GPUs, found {gpus}")
    import importlib.util

    cases = [case for case in GPU_CASES if case.kernel != "cute/hopper" or importlib.util.find_spec("cutlass")]
    return spawn_cases(cases, gpus, "nccl", tmp_path_factory.mktemp("ring_nccl"))
