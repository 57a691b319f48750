"""cute/backward/hopper's ``rebased_operands`` (``BackwardTiles(rebased_operands=True)``, issue #40): the wgmma
descriptors of the shared-memory boxes a runtime index picks (each warpgroup's K and V, its share of Kᵀ and the
step's dS buffer for dQ) built from the box's own address (``hopper_desc.py``), not from the unindexed tensor's
with the index added to the descriptor, whose k-steps then each redo a 64-bit add with carry.

Without a GPU: the knob's candidates (each head dim's default with it, and the 80-row ``late_dv`` step) compile for
sm_90a with every compile-time feature on without spills, their wgmmas not serialised, the same products per step
as without it; in P1's unmasked step (full MHA) they issue at least half a uniform-datapath (``U*``) instruction
fewer per HGMMA than the same tiles without the knob (sm_90a: 160 → 138 for 32 HGMMA at D=128's 64 rows, 126 →
109 at D=64's 128 rows, 168 → 141 for 34 at 80 rows); a rebase of a box the swizzle period does not align is
refused. With a GPU: the candidates against fp64 by the yardstick rule on ragged, causal (both alignments),
GQA/MQA, two-batch and many-block shapes.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

pytest.importorskip("cutlass")
import cutlass.cute as cute

from common.contract.problem import Problem
from cute_impl.backward import hopper as hopper_backward
from cute_impl.backward import hopper_desc
from tests.test_backward import assert_all_pass
from tests.test_cute_backward import (
    BASE,
    HOPPER_GROUP,
    hopper_gradients_of,
    knob_cases,
    sass_of,
    spilled_bytes,
    unmasked_step,
    wgmma_serialised,
)
from tests.test_cute_backward_gap import BOX_ROWS, compile_dkdv, labels_in_script

# The knob's candidates, each head dim's.
REBASED = {
    head_dim: [t for t in variants if t.rebased_operands] for head_dim, variants in hopper_backward.CANDIDATES.items()
}
# An instruction of the uniform datapath (UIADD3, UIADD3.X, UMOV, ULOP3, ...), predicated or not.
UNIFORM = re.compile(r"^(?:@!?U?P\w+\s+)?U[A-Z0-9]+\b")
# Rebased, the unmasked step issues at least this many uniform instructions fewer per HGMMA.
FEWER_UNIFORM_PER_HGMMA = 0.5


def uniform_per_hgmma(step: list[str]) -> float:
    """Uniform-datapath instructions per HGMMA in one step."""
    uniform = sum(bool(UNIFORM.match(text)) for text in step)
    return uniform / sum("HGMMA." in text for text in step)


def kept_pointer(tensor: cute.Tensor, swizzle: cute.Swizzle, layout: cute.Layout | None = None) -> cute.Tensor:
    """The planted rebase: ``tensor``'s own pointer (the DSL's indexed one) under ``layout``, nothing rebuilt."""
    return cute.make_tensor(tensor.iterator, tensor.layout if layout is None else layout)


def test_rebased_candidates_are_listed_tiles_with_the_knob() -> None:
    """Each head dim lists its staged tiles (``BASE``, last, without it) with the knob, D=128 also its 80-row
    ``late_dv`` step (the non-causal D=128 default), D=64 its default (late_dv with the rebase); each label ends with
    ``_rebase``."""
    assert hopper_backward.DEFAULTS[128, False] in REBASED[128]
    for head_dim, variants in REBASED.items():
        base = BASE[head_dim]
        assert not base.rebased_operands and replace(base, rebased_operands=True) in variants, head_dim
        assert all(tiles.label.endswith("_rebase") for tiles in variants)
    assert sorted(tiles.tile_m for tiles in REBASED[128]) == [64, 80]
    assert hopper_backward.DEFAULTS[64, False] in REBASED[64]


def test_the_ab_script_names_every_knob_candidate_and_no_unknown_label() -> None:
    """``bench/cute_bwd_desc_ab.sh`` and ``bench/cute_bwd_d64_ab.sh`` (D=64 with both knobs) name each knob
    candidate and each head dim's staged base, and every label they pass is a candidate's (no GPU touched).
    Planted: a misspelt label is found."""
    bench = Path(__file__).parents[1] / "bench"
    script = "\n".join((bench / name).read_text() for name in ("cute_bwd_desc_ab.sh", "cute_bwd_d64_ab.sh"))
    for head_dim, variants in REBASED.items():
        labels = {tiles.label for tiles in variants} | {BASE[head_dim].label}
        assert all(label in script for label in labels), head_dim
    assert not labels_in_script(script)
    assert labels_in_script(script.replace("stagedepi_rebase", "stagedepi_rebasd", 1))


@pytest.mark.xdist_group(HOPPER_GROUP)
@pytest.mark.cute_compile
@pytest.mark.static
@pytest.mark.parametrize("head_dim", hopper_backward.HEAD_DIMS, ids=lambda d: f"d{d}")
def test_rebased_operands_compile_to_the_same_products_without_spills(head_dim: int) -> None:
    """Each knob candidate with every compile-time feature on (causal bottom-right, MQA, dLSE): no spills, wgmmas
    not serialised, the products per step of the same tiles without it."""
    for tiles in REBASED[head_dim]:
        dkdv, per_step = compile_dkdv(head_dim, tiles, "causal_bottom_right_mqa_dlse")
        _, without = compile_dkdv(head_dim, replace(tiles, rebased_operands=False), "causal_bottom_right_mqa_dlse")
        assert per_step == without, tiles.label
        assert spilled_bytes(dkdv) == 0, tiles.label
        assert not wgmma_serialised(sass_of(dkdv)), f"{tiles.label}: ptxas serialised the wgmmas"


@pytest.mark.xdist_group(HOPPER_GROUP)
@pytest.mark.cute_compile
@pytest.mark.static
@pytest.mark.parametrize("head_dim", hopper_backward.HEAD_DIMS, ids=lambda d: f"d{d}")
def test_rebased_step_issues_fewer_uniform_instructions_per_hgmma(
    head_dim: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """P1's unmasked step (full MHA) of each knob candidate issues at least ``FEWER_UNIFORM_PER_HGMMA`` uniform
    instructions fewer per HGMMA than the same tiles without the knob. Planted: a rebase that keeps the indexed
    tensor's pointer (the descriptor built from the unindexed base, the index added to it) saves none and fails
    the rule."""
    for tiles in REBASED[head_dim]:
        rebased, _ = compile_dkdv(head_dim, tiles, "full_mha")
        before, _ = compile_dkdv(head_dim, replace(tiles, rebased_operands=False), "full_mha")
        fewer = uniform_per_hgmma(unmasked_step(sass_of(before))) - uniform_per_hgmma(unmasked_step(sass_of(rebased)))
        assert fewer >= FEWER_UNIFORM_PER_HGMMA, (tiles.label, fewer)
    monkeypatch.setattr(hopper_desc, "rebased", kept_pointer)
    tiles = REBASED[head_dim][-1]
    planted, _ = compile_dkdv(head_dim, tiles, "full_mha", planted=True)
    fewer = uniform_per_hgmma(unmasked_step(sass_of(before))) - uniform_per_hgmma(unmasked_step(sass_of(planted)))
    assert fewer < FEWER_UNIFORM_PER_HGMMA


@pytest.mark.cute_compile
@pytest.mark.static
def test_a_rebase_off_the_swizzle_period_is_refused_or_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rebased pointer keeps the alignment its type proves, which must cover the swizzle period (a coarser
    one would mask address bits out of the descriptor); a Kᵀ box inside a swizzle atom (D=64, 64 query rows: the
    second warpgroup's 32 columns start 64 bytes in) is left as it is and the kernel compiles without spills.
    Planted: a swizzle period twice the boxes' alignment refuses the compile."""
    inside_an_atom = hopper_backward.BackwardTiles(64, 64, 2, dq="reduce", rebased_operands=True)
    dkdv, _ = compile_dkdv(64, inside_an_atom, "causal_bottom_right_mqa_dlse")
    assert spilled_bytes(dkdv) == 0
    monkeypatch.setattr(hopper_desc, "SMEM_ALIGN_BYTES", 2 * hopper_desc.SMEM_ALIGN_BYTES)
    with pytest.raises(Exception, match="swizzle period"):
        compile_dkdv(128, REBASED[128][-1], "full_mha", planted=True)


REBASED_CASES = knob_cases(REBASED)


@pytest.mark.gpu
@pytest.mark.parametrize(("case", "prob", "tiles"), REBASED_CASES, ids=[case for case, _, _ in REBASED_CASES])
def test_gpu_rebased_operands_pass_the_rule(case: str, prob: Problem, tiles: hopper_backward.BackwardTiles) -> None:
    """The candidate against fp64 by the rule, from cute/hopper's O and LSE. Planted: dV of the first 64 keys lost
    (as if the first warpgroup's products had read a wrong box and left its accumulator at zero) fails it."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    inputs, (dq, dk, dv) = hopper_gradients_of(prob, 37, tiles)
    assert_all_pass((dq, dk, dv), *inputs, prob)
    planted_dv = dv.clone()
    planted_dv[:, :, :BOX_ROWS] = 0
    with pytest.raises(AssertionError, match="WRONG"):
        assert_all_pass((dq, dk, planted_dv), *inputs, prob)
