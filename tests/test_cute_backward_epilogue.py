"""cute/backward/hopper's staged epilogue (``BackwardTiles(staged_epilogue=True)``, ``hopper_epilogue.py``, the
default since results/h200/backward-staged-epilogue/): dK and dV through the consumers' K and V boxes by
stmatrix and TMA stores, instead of two bytes a store from the accumulators.

Without a GPU: each head dim's default (the staged epilogue; the candidate listed just before it is the same
tiles storing from the accumulators) compiles for sm_90a with every compile-time feature on without spills,
its wgmmas not serialised, the same products per step and the same shared memory as the accumulator store,
and its dK/dV kernel writes global memory only by TMA (no ``STG``), where the accumulator store writes D
two-byte values per thread. With a GPU: the staged defaults against fp64 by the yardstick rule on ragged,
causal (both alignments), GQA/MQA and multi-batch shapes.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import replace

import pytest
import torch

pytest.importorskip("cutlass")

from common.contract.problem import Problem
from common.reporting.static import cubin_resources
from common.toolchain.arch import SM90_SHARED_MEMORY_BYTES
from cute_impl.backward import hopper as hopper_backward
from tests.test_backward import assert_all_pass
from tests.test_cute_backward import (
    GLOBAL_ACCESS,
    GPU_CASES,
    HOPPER_GROUP,
    VARIANTS,
    dkdv_shared_bytes,
    hgmma_per_step,
    hopper_binaries,
    hopper_gradients_of,
    long_cases,
    problem,
    sass_of,
    wgmma_serialised,
)

# Each head dim's staged tiles (its last candidate, the base of the defaults' knobs), and the same tiles storing
# from the accumulators, listed just before it.
STAGED = {head_dim: variants[-1] for head_dim, variants in hopper_backward.CANDIDATES.items()}
ACCUMULATOR_STORE = {head_dim: variants[-2] for head_dim, variants in hopper_backward.CANDIDATES.items()}
# A TMA store to global memory in SASS; a shared-memory store of 8x8 matrices (stmatrix).
TMA_STORE = re.compile(r"\bUTMASTG\b")
STMATRIX = re.compile(r"\bSTSM\b")
# The 128-byte swizzle's box is 64 columns wide: one TMA store per 64 columns of a (64, D) box.
SWIZZLE_COLUMNS = 64
# The keys of one consumer warpgroup's box.
BOX_ROWS = 64


def test_each_default_is_the_accumulator_store_with_the_epilogue_staged() -> None:
    """Every default stages the epilogue; each head dim's last candidate equals the one listed just before it
    but for the epilogue, which stores from the accumulators."""
    assert all(tiles.staged_epilogue for tiles in hopper_backward.DEFAULTS.values())
    for head_dim, staged in STAGED.items():
        assert staged.staged_epilogue, staged
        accumulator_store = ACCUMULATOR_STORE[head_dim]
        assert not accumulator_store.staged_epilogue
        assert staged == replace(accumulator_store, staged_epilogue=True), staged
        assert staged.label == accumulator_store.label + "_stagedepi"


@pytest.mark.xdist_group(HOPPER_GROUP)
@pytest.mark.cute_compile
@pytest.mark.static
@pytest.mark.parametrize("head_dim", hopper_backward.HEAD_DIMS, ids=lambda d: f"d{d}")
def test_staged_epilogue_stores_dk_and_dv_by_tma_only(head_dim: int) -> None:
    """The staged default with every compile-time feature on (causal bottom-right, MQA, dLSE): its dK/dV
    kernel compiles without spills, its wgmmas not serialised, the accumulator store's products per step and
    shared memory (within an sm_90 CTA's), and it writes global memory by TMA only: no ``STG``, one
    ``UTMASTG`` per 64 columns of dK and of dV, and 2 · D/16 more stmatrix (each warp's 16 × D rows of both,
    16 × 16 a stmatrix). Planted: the accumulator store writes dK and dV D ``STG.E.U16`` per thread (two
    bytes a store), and no TMA store."""
    causal, alignment, kv_heads, has_dlse = VARIANTS["causal_bottom_right_mqa_dlse"]
    prob = problem(1000, 777, head_dim, causal=causal, alignment=alignment, kv_heads=kv_heads)
    staged, accumulator = STAGED[head_dim], ACCUMULATOR_STORE[head_dim]
    binaries = hopper_binaries(prob, has_dlse, staged)
    accumulator_binaries = hopper_binaries(prob, has_dlse, accumulator)
    assert hgmma_per_step(binaries) == hgmma_per_step(accumulator_binaries)
    dkdv, accumulator_dkdv = binaries[1], accumulator_binaries[1]
    for usage in cubin_resources(dkdv.cubin).values():
        spills = usage["stack_bytes"] + usage["local_bytes"]
        assert spills == 0, f"{staged.label}: {usage['registers']} registers, {spills} B spilled"
    shared = dkdv_shared_bytes(prob, staged)
    assert shared == dkdv_shared_bytes(prob, accumulator) and shared <= SM90_SHARED_MEMORY_BYTES, shared
    sass, accumulator_sass = sass_of(dkdv), sass_of(accumulator_dkdv)
    assert not wgmma_serialised(sass), "ptxas serialised the wgmmas"
    stores = Counter(match.groups() for match in GLOBAL_ACCESS.finditer(sass) if match.group(1) == "STG")
    assert not stores, f"{staged.label}: stores from registers left: {stores}"
    assert len(TMA_STORE.findall(sass)) == 2 * head_dim // SWIZZLE_COLUMNS
    assert len(STMATRIX.findall(sass)) - len(STMATRIX.findall(accumulator_sass)) == 2 * head_dim // 16
    accumulator_stores = Counter(match.groups() for match in GLOBAL_ACCESS.finditer(accumulator_sass))
    assert accumulator_stores[("STG", "U16")] == head_dim and not TMA_STORE.search(accumulator_sass), accumulator_stores


@pytest.mark.cute_compile
@pytest.mark.static
def test_staged_epilogue_compiles_with_the_separate_dq_pass() -> None:
    """The epilogue also stands without dq="reduce" (no cross-warpgroup barrier needed then: each warpgroup
    alone reads its K box): the deterministic candidate with it on compiles without spills or ``STG`` in its
    dK/dV kernel."""
    causal, alignment, kv_heads, has_dlse = VARIANTS["causal_top_left_gqa"]
    prob = problem(1000, 777, 128, causal=causal, alignment=alignment, kv_heads=kv_heads)
    tiles = replace(hopper_backward.CANDIDATES[128][0], staged_epilogue=True)
    dkdv = hopper_backward.compile_sm90(prob, has_dlse=has_dlse, tiles=tiles)[1]
    for usage in cubin_resources(dkdv.cubin).values():
        assert usage["stack_bytes"] + usage["local_bytes"] == 0, f"{tiles.label}: {usage}"
    sass = sass_of(dkdv)
    assert not any(match.group(1) == "STG" for match in GLOBAL_ACCESS.finditer(sass))
    assert len(TMA_STORE.findall(sass)) == 2 * 128 // SWIZZLE_COLUMNS


def staged_cases() -> dict[str, Problem]:
    """The shapes that probe the tiles (``GPU_CASES``: one query or key, rows that see no key, MQA, ragged
    tails in one block), ragged causal bottom-right GQA both ways and two batches (the TMA store's (head,
    batch) coordinates), and many key blocks per CTA (``long_cases``), at each head dim where it applies."""
    cases = dict(GPU_CASES)
    for head_dim in hopper_backward.HEAD_DIMS:
        for seqlen_q, seqlen_k in ((300, 1000), (1000, 300)):
            cases[f"two_batches_{seqlen_q}x{seqlen_k}_d{head_dim}"] = Problem(
                2, 4, seqlen_q, seqlen_k, head_dim, torch.bfloat16, causal=True, kv_heads=2,
                causal_alignment="bottom_right",
            )  # fmt: skip
        cases.update({f"{name}_d{head_dim}": prob for name, prob in long_cases(head_dim).items()})
    return cases


STAGED_CASES = staged_cases()


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(STAGED_CASES))
def test_gpu_staged_epilogue_passes_the_rule(case: str) -> None:
    """The head dim's staged default against fp64 by the rule, from cute/hopper's O and LSE. Planted: the
    first warpgroup's box of the first key block never stored (its TMA stores dropped: dK and dV rows [0, 64)
    left as torch.empty gave them, here zero; the keys every causal query row sees at bottom-right or
    top-left alike) fails the rule."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    prob = STAGED_CASES[case]
    inputs, (dq, dk, dv) = hopper_gradients_of(prob, 29, STAGED[prob.head_dim])
    assert_all_pass((dq, dk, dv), *inputs, prob)
    planted_dk, planted_dv = dk.clone(), dv.clone()
    planted_dk[:, :, :BOX_ROWS], planted_dv[:, :, :BOX_ROWS] = 0, 0
    with pytest.raises(AssertionError, match="WRONG"):
        assert_all_pass((dq, planted_dk, planted_dv), *inputs, prob)
