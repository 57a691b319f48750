"""cute/backward/hopper's dQ finished in its dK/dV kernel (``BackwardTiles(dq_finish_in_kernel=True)``, issue #40): no
postprocess launch; each query block of each head has an int32 counter after its head's dQaccum chunks (zeroed with
them); the dQ writer counts a key block in once its bulk adds into the block have completed (``cp.async.bulk
.wait_group`` without ``.read``, ``fence.proxy.async.global``, a gpu-scope acquire-release add), and the writer that
brings the count to the block's number of key blocks (``_device.query_block_contributors``) acquires, copies the
block's finished fp32 chunks from L2 into its free staging tiles by ``cp.async`` and writes dQ = softmax_scale ·
dQaccum itself.

Without a GPU: the candidates (the causal D=128 default so finished, ``hopper.FINISHED_CAUSAL``, and the D=64 default
so finished, ``hopper.FINISHED_D64``) and the switch's validation; the contributor count equals the number of key
blocks whose ``query_block_range`` holds the block (both alignments, ragged, Sq ≠ Sk; planted: one off fails); the
counters sit after each head's chunks, inside what the preprocess zeroes; the sm_90a builds have two kernels
(preprocess, dK/dV), no spills, the default's registers; in the PTX every counter add follows a completion wait (not
``.read``) and a proxy fence, and every finish's ``cp.async`` follows an acquire (planted: the wait made ``.read``,
the fence dropped, the acquire dropped: each fails). With a GPU: the candidates against fp64 by the yardstick rule
(``knob_cases``: one query or key, rows that see no key, MQA, ragged tails, both causal alignments, GQA over two
batches, many blocks; and B8 H16 S2048 causal), every buffer the call allocates poisoned (NaN) first; dK and dV bit
for bit the unfinished build's; planted: converting one key block early fails the rule.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

pytest.importorskip("cutlass")

from common import attention
from common.contract.problem import Problem
from common.toolchain.arch import SM90A
from cute_impl._host import CompiledKernels
from cute_impl.backward import _device
from cute_impl.backward import hopper as hopper_backward
from tests.test_backward import assert_all_pass
from tests.test_cute_backward import HOPPER_GROUP, gpu_inputs, knob_cases
from tests.test_cute_backward_short import binaries, resources

FINISHED = hopper_backward.FINISHED_CAUSAL
FINISHED_D64 = hopper_backward.FINISHED_D64
KEY_TILE = hopper_backward.KEY_TILE


def test_the_candidates_finish_the_defaults_and_the_switch_is_validated() -> None:
    """FINISHED_CAUSAL is the causal D=128 default without its postprocess (so not reversed) and with the switch;
    FINISHED_D64 the D=64 default with the switch; both listed, no default finishes; the switch needs dq="reduce",
    64 or 128 rows (not the 80-row dQᵀ) and no reversed postprocess, and names itself in the label."""
    default = hopper_backward.DEFAULTS[128, True]
    assert replace(default, postprocess_reversed=False, dq_finish_in_kernel=True) == FINISHED
    assert replace(hopper_backward.DEFAULTS[64, True], dq_finish_in_kernel=True) == FINISHED_D64
    assert FINISHED in hopper_backward.CANDIDATES[128] and FINISHED_D64 in hopper_backward.CANDIDATES[64]
    assert not any(tiles.dq_finish_in_kernel for tiles in hopper_backward.DEFAULTS.values())
    assert FINISHED.label.endswith("_pdl_dqfinish")
    base = hopper_backward.BackwardTiles(64, 64, 2, dq="reduce", tma_rows=True)
    for wrong in (
        replace(base, dq="pass"),
        replace(base, tile_m=80),
        replace(base, dependent_launch=True, postprocess_reversed=True),
    ):
        with pytest.raises(ValueError, match="dq_finish_in_kernel"):
            replace(wrong, dq_finish_in_kernel=True)


def test_the_ab_script_runs_these_tests_then_times_the_finished_candidates() -> None:
    """``bench/cute_bwd_finish_ab.sh`` runs this file's GPU tests before ``bench.cute_bwd_finish_ab``, whose rows are
    each head dim's default and its finished candidate by label, and profiles the finished candidate by a label that
    exists (no GPU touched; planted: a misspelt label is found)."""
    from bench.cute_bwd_finish_ab import cute_rows
    from tests.test_cute_backward_gap import labels_in_script

    script = (Path(__file__).parents[1] / "bench" / "cute_bwd_finish_ab.sh").read_text()
    assert script.index("tests/test_cute_backward_finish.py") < script.index("bench.cute_bwd_finish_ab")
    assert FINISHED.label in script and not labels_in_script(script)
    assert labels_in_script(script.replace("_dqfinish", "_dq_finish"))
    assert cute_rows(128) == {"default": hopper_backward.DEFAULTS[128, True].label, "finish": FINISHED.label}
    assert cute_rows(64) == {"default": hopper_backward.DEFAULTS[64, False].label, "finish": FINISHED_D64.label}


def contributors_by_ranges(m_block: int, tile_m: int, seqlen_q: int, seqlen_k: int, causal: bool, offset: int) -> int:
    """The key blocks whose ``query_block_range`` holds ``m_block``: what the dQ writers count."""
    key_blocks = -(-seqlen_k // KEY_TILE)
    ranges = (_device.query_block_range(n * KEY_TILE, KEY_TILE, tile_m, seqlen_q, seqlen_k, causal, offset)
              for n in range(key_blocks))  # fmt: skip
    return sum(low <= m_block < high for low, _, high in ranges)


def count_mismatches(contributors) -> list[tuple]:
    """Where ``contributors`` differs from the ranges, over lengths around the tiles, both alignments, Sq ≠ Sk."""
    wrong = []
    for seqlen_q in (1, 63, 64, 65, 77, 300, 1000, 1999, 2048):
        for seqlen_k in (1, 77, 128, 129, 300, 1000, 2048):
            for tile_m in (64, 128):
                for causal, bottom_right in ((False, False), (True, False), (True, True)):
                    offset = seqlen_k - seqlen_q if bottom_right else 0
                    for m_block in range(-(-seqlen_q // tile_m)):
                        expected = contributors_by_ranges(m_block, tile_m, seqlen_q, seqlen_k, causal, offset)
                        if contributors(m_block, KEY_TILE, tile_m, seqlen_k, causal, offset) != expected:
                            wrong.append((seqlen_q, seqlen_k, tile_m, causal, bottom_right, m_block))
    return wrong


def test_the_contributor_count_matches_the_key_blocks_query_ranges() -> None:
    """``query_block_contributors`` (plain arithmetic, run here on ints) against the ranges the kernel walks.
    Planted: the causal count one key block short (what finishes a block before its last add) is found."""
    assert count_mismatches(_device.query_block_contributors) == []

    def one_short(m_block, tile_n, tile_m, seqlen_k, causal, offset):
        return _device.query_block_contributors(m_block, tile_n, tile_m, seqlen_k, causal, offset) - int(causal)

    assert count_mismatches(one_short)


def test_the_counters_lie_after_each_heads_chunks_inside_the_zeroed_span() -> None:
    """dQaccum with the switch: a view of a buffer whose heads' spans end in their counters (int32, 16-byte
    aligned); the span the preprocess zeroes (``_whole_span``) covers them; without the switch the buffer is
    dQaccum itself."""
    prob = Problem(2, 3, 1000, 777, 128, torch.bfloat16, causal=True)
    for tiles in (FINISHED, replace(FINISHED, zero_in_preprocess=False)):
        accum = hopper_backward.dq_accumulator(prob, tiles, torch.device("cpu"))
        blocks = -(-prob.seqlen_q // tiles.tile_m)
        assert accum.shape == (2, 3, blocks, 2, tiles.tile_m * 64)
        counters = hopper_backward.dq_counters(accum)
        assert counters.shape == (2, 3, blocks) and counters.dtype == torch.int32
        assert counters.data_ptr() % 16 == 0 and counters.stride(1) % 4 == 0
        span = hopper_backward._whole_span(accum)
        span.fill_(1.0)
        span.zero_()
        assert not counters.any() and not accum.any()
        counters.fill_(7)
        assert (span[:, :, accum[0, 0].numel() :][:, :, :blocks].view(torch.int32) == 7).all()
    plain = hopper_backward.dq_accumulator(prob, hopper_backward.CHAINED_CAUSAL[-1], torch.device("cpu"))
    assert plain.is_contiguous()
    assert hopper_backward._whole_span(plain).shape == (2, 3, plain[0, 0].numel())


# ----------------------------------------------------------------------------------------------
# Static: the sm_90a builds, the order of wait, fence, count, acquire and copies in the PTX
# ----------------------------------------------------------------------------------------------
@pytest.mark.xdist_group(HOPPER_GROUP)
@pytest.mark.cute_compile
@pytest.mark.static
@pytest.mark.parametrize("variant", ["causal_top_left_gqa", "causal_bottom_right_mqa_dlse", "full_mha"])
@pytest.mark.parametrize("tiles", [FINISHED, FINISHED_D64], ids=["d128_causal", "d64"])
def test_finished_kernels_compile_without_spills_at_the_default_registers(variant: str, tiles) -> None:
    """Two kernels, the preprocess and the dK/dV kernel; no spills (the dQ writer's finish runs in the producer
    warpgroup's 24 registers a thread); the dK/dV kernel at the unfinished build's registers."""
    finished = binaries(tiles, variant)
    assert list(finished) == ["preprocess", "dkdv"]
    for name, binary in finished.items():
        usage = resources(binary)
        assert usage["stack_bytes"] + usage["local_bytes"] == 0, f"{tiles.label} {name}: {usage}"
    unfinished = binaries(replace(tiles, dq_finish_in_kernel=False), variant)
    assert resources(finished["dkdv"])["registers"] == resources(unfinished["dkdv"])["registers"]


BULK_WAIT = re.compile(r"cp\.async\.bulk\.wait_group(\.read)?\s+\d+;")
PROXY_FENCE = "fence.proxy.async.global;"
COUNT = re.compile(r"atom\.acq_rel\.gpu\.global\.add\.u32")
ACQUIRE = re.compile(r"ld\.acquire\.gpu\.global\.b32")
FINISH_COPY = re.compile(r"cp\.async\.cg\.shared\.global")
REDUCE_ADD = re.compile(r"cp\.reduce\.async\.bulk\.global")


def finish_in_order(ptx: str) -> list[str]:
    """What breaks the finish's memory-ordering rules in the dK/dV kernel's PTX, [] if nothing: there are counts;
    before each count, the last bulk wait since the last reduce-add is a completion wait (no ``.read``) and a proxy
    fence lies between it and the count; every ``cp.async`` of a finish follows an acquire that follows a count."""
    broken = []
    counts = [match.start() for match in COUNT.finditer(ptx)]
    if not counts:
        broken.append("no counter adds")
    for at in counts:
        adds = [match.start() for match in REDUCE_ADD.finditer(ptx, 0, at)]
        since = adds[-1] if adds else 0
        waits = list(BULK_WAIT.finditer(ptx, since, at))
        if not waits or waits[-1].group(1):
            broken.append(f"count at {at}: no completion wait (without .read) before it")
        elif ptx.find(PROXY_FENCE, waits[-1].end(), at) < 0:
            broken.append(f"count at {at}: no proxy fence between its wait and it")
    for copy in FINISH_COPY.finditer(ptx):
        acquires = [match.start() for match in ACQUIRE.finditer(ptx, 0, copy.start())]
        if not acquires or not any(at < acquires[-1] for at in counts):
            broken.append(f"finish copy at {copy.start()}: no acquire after a count before it")
            break
    return broken


@pytest.mark.xdist_group(HOPPER_GROUP)
@pytest.mark.cute_compile
@pytest.mark.static
def test_each_count_follows_a_completion_wait_and_a_fence_and_each_finish_an_acquire() -> None:
    """The rules of ``finish_in_order`` on the causal D=128 candidate (three counts: in the loop and after it).
    Planted: the completion waits made ``.read`` (the smem reads done, the adds perhaps not), the proxy fence
    dropped, the acquire dropped: each breaks a rule."""
    ptx = binaries(FINISHED)["dkdv"].ptx
    assert finish_in_order(ptx) == []
    assert len(COUNT.findall(ptx)) == 3
    planted = {
        "read": re.sub(r"cp\.async\.bulk\.wait_group(\s)", r"cp.async.bulk.wait_group.read\1", ptx),
        "fence": ptx.replace(PROXY_FENCE, ""),
        "acquire": ACQUIRE.sub("ld.relaxed.gpu.global.b32", ptx),
    }
    for name, text in planted.items():
        assert finish_in_order(text), name


# ----------------------------------------------------------------------------------------------
# GPU: the rule with every allocated buffer poisoned, dK and dV bit for bit, a planted early finish
# ----------------------------------------------------------------------------------------------
POISON = float("nan")
CASES = {case_id: (prob, tiles) for case_id, prob, tiles in knob_cases({128: [FINISHED], 64: [FINISHED_D64]})}
CASES[f"b8_h16_2048_causal-{FINISHED.label}"] = (
    Problem(8, 16, 2048, 2048, 128, torch.bfloat16, causal=True),
    FINISHED,
)


def poisoned_allocations(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every floating-point ``torch.empty`` of the call (dQ, dK, dV, D, LSE₂ and dQaccum with its counters) filled
    with NaN, so that a dQ block never finished, a counter never zeroed or a read before the preprocess shows."""
    empty = torch.empty

    def poisoned(*args, **kwargs):
        tensor = empty(*args, **kwargs)
        return tensor.fill_(POISON) if tensor.is_floating_point() else tensor

    monkeypatch.setattr(torch, "empty", poisoned)


def finished_gradients(
    prob: Problem, tiles: hopper_backward.BackwardTiles, monkeypatch: pytest.MonkeyPatch | None = None
) -> tuple[tuple, tuple]:
    """(q, k, v, dO) and the rung's (dq, dk, dv) at ``tiles`` from cute/hopper's O and LSE; with ``monkeypatch``,
    the backward's allocations poisoned (the forward's left alone)."""
    q, k, v, d_out = gpu_inputs(prob, seed=43)
    with torch.no_grad():
        out, lse = attention(
            q, k, v, causal=prob.causal, causal_alignment=prob.causal_alignment, impl="cute/hopper", return_lse=True
        )
    if monkeypatch is None:
        return (q, k, v, d_out), hopper_backward.hopper_gradients(q, k, v, out, lse, d_out, prob, tiles=tiles)
    with monkeypatch.context() as patch:  # the poison for the backward's allocations only, not the reference's
        poisoned_allocations(patch)
        grads = hopper_backward.hopper_gradients(q, k, v, out, lse, d_out, prob, tiles=tiles)
    return (q, k, v, d_out), grads


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(CASES))
def test_gpu_finished_candidates_pass_the_rule(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The candidate against fp64 by the rule from cute/hopper's O and LSE, its buffers poisoned; dK and dV equal
    the unfinished build's (the same tiles with the postprocess) bit for bit."""
    prob, tiles = CASES[case]
    inputs, grads = finished_gradients(prob, tiles, monkeypatch)
    assert_all_pass(grads, *inputs, prob)
    _, (_, dk, dv) = finished_gradients(prob, replace(tiles, dq_finish_in_kernel=False))
    assert torch.equal(grads[1], dk) and torch.equal(grads[2], dv), "dK or dV differs from the unfinished build's"


PLANTED_CASE = next(case for case in CASES if case.startswith("gqa_causal_bottom_right_ragged"))


@pytest.mark.gpu
def test_gpu_finishing_one_key_block_early_fails_the_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: each block finished at one count fewer (before its last key block's adds, or never where one key
    block adds into it), compiled afresh: the rule fails on dQ."""
    prob, tiles = CASES[PLANTED_CASE]
    count = _device.query_block_contributors
    monkeypatch.setattr(hopper_backward, "query_block_contributors", lambda *args, **kwargs: count(*args, **kwargs) - 1)
    fresh = CompiledKernels(hopper_backward._DKDVKernel, hopper_backward._fake_dkdv_arguments, arch=SM90A)
    monkeypatch.setitem(hopper_backward.KERNELS, "dkdv", fresh)
    inputs, grads = finished_gradients(prob, tiles, monkeypatch)
    with pytest.raises(AssertionError, match="dq WRONG"):
        assert_all_pass(grads, *inputs, prob)
