"""cute/backward/hopper's ``late_dv`` (``BackwardTiles(late_dv=True)``, issue #40): FlashAttention-4's order in the
dK/dV step, dV += Pᵀ dO issued once dSᵀ is computed (after the wait for dPᵀ) with Pᵀ converted to 16 bits only
then, instead of between the waits for Sᵀ and dPᵀ; at 80 query rows dSᵀ then reads fp32 Pᵀ, not its 16-bit copy.

Without a GPU: the knob's candidates (each head dim's staged step with it, and the 80-row step) compile for
sm_90a with every compile-time feature on without spills, their wgmmas not serialised, the same products per
step as without it; in the unmasked step the first product with a register operand (dV) comes after the step has
waited for all its products (``DEPBAR.LE gsb0, 0x0``), where the default issues it before any such wait; at 80
rows the step reads no 16-bit Pᵀ back for dSᵀ (no ``F2F``) and is at least 60 instructions shorter. With a
GPU: the candidates against fp64 by the yardstick rule on ragged, causal (both alignments), GQA/MQA, two-batch
and many-block shapes.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

pytest.importorskip("cutlass")

from common.contract.problem import Problem
from cute_impl.backward import hopper as hopper_backward
from cute_impl.backward import hopper_rows
from tests.test_backward import assert_all_pass
from tests.test_cute_backward import (
    BASE,
    DQ_REDUCE_80,
    HOPPER_GROUP,
    VARIANTS,
    hgmma_per_step,
    hopper_binaries,
    hopper_gradients_of,
    knob_cases,
    problem,
    sass_of,
    spilled_bytes,
    unmasked_step,
    wgmma_serialised,
)

# The knob's candidates, each head dim's (those also rebased: tests/test_cute_backward_desc.py; chained by PDL:
# tests/test_cute_backward_short.py).
LATE_DV = {
    head_dim: [t for t in variants if t.late_dv and not t.rebased_operands and not t.dependent_launch]
    for head_dim, variants in hopper_backward.CANDIDATES.items()
}
# dV += Pᵀ dO and dK += dSᵀ Q read their A operand from registers: "HGMMA.64xNx16.F32.BF16 Rd, Ra, gdesc[...]".
REGISTER_A_PRODUCT = re.compile(r"HGMMA\.64x\d+x16\.F32\.\w+ R\d+, R\d+,")
# The step waits until none of its products is in flight.
DRAIN = "WARPGROUP.DEPBAR.LE gsb0, 0x0"
# One fp32 value rounded to 16 bits alone (not packed in pairs): the 80-row step without the knob rounds each Pᵀ
# value so, to read it back (widened by shifts) for dSᵀ, one per value of a thread's two key rows.
ROUND_ONE = re.compile(r"\bF2F\.(BF16|F16)\.F32\b")
ROWS_80 = 80
# The 80-row step with the knob is shorter by at least this many SASS instructions (sm_90a: 602 → 522 at P1).
SHORTER_80 = 60
BOX_ROWS = 64
# A candidate's label as the A/B script names it.
LABEL = re.compile(r"\bm\d+_s\d+_dqreduce\w*")


def dv_after_drain(step: list[str]) -> bool:
    """Whether the step's first register-operand product (dV) is issued after its first full wait."""
    first_rs = next(i for i, text in enumerate(step) if REGISTER_A_PRODUCT.search(text))
    drains = [i for i, text in enumerate(step) if DRAIN in text]
    return bool(drains) and drains[0] < first_rs


def test_late_dv_candidates_are_listed_tiles_with_the_knob() -> None:
    """Each head dim lists the knob on its staged tiles (``BASE``, listed last) and D=128 also on the 80-row step;
    each label ends with ``_latedv``; every default has it."""
    assert all(tiles.late_dv for tiles in hopper_backward.DEFAULTS.values())
    for head_dim, variants in LATE_DV.items():
        assert not BASE[head_dim].late_dv and replace(BASE[head_dim], late_dv=True) in variants, head_dim
        assert all(tiles.label.endswith("_latedv") for tiles in variants)
    assert [tiles.tile_m for tiles in LATE_DV[128]] == [ROWS_80, 64]
    assert replace(DQ_REDUCE_80, staged_epilogue=True, late_dv=True) in LATE_DV[128]


def labels_in_script(script: str) -> set[str]:
    """The candidate labels a bench script names that no candidate of either head dim has."""
    known = {tiles.label for variants in hopper_backward.CANDIDATES.values() for tiles in variants}
    return set(LABEL.findall(script)) - known


def test_the_ab_script_names_every_knob_candidate_and_no_unknown_label() -> None:
    """``bench/cute_bwd_gap_ab.sh`` names each knob candidate and each head dim's staged base, and every label it
    passes to ``bench.backward`` and ``bench.backward_kernels`` is a candidate's (no GPU touched). Planted: a
    misspelt label is found."""
    script = (Path(__file__).parents[1] / "bench" / "cute_bwd_gap_ab.sh").read_text()
    named = set(LABEL.findall(script))
    for head_dim, variants in LATE_DV.items():
        assert {tiles.label for tiles in variants} | {BASE[head_dim].label} <= named
    assert not labels_in_script(script)
    assert labels_in_script(script.replace("_latedv", "_late_dv", 1))


def compile_dkdv(head_dim: int, tiles: hopper_backward.BackwardTiles, variant: str, *, planted: bool = False) -> tuple:
    """The dK/dV kernel of ``tiles`` at ``VARIANTS[variant]`` (Sq 1000, Sk 777) and the HGMMAs per step of
    its kernels: from ``hopper_binaries`` (compiled once a key), or, ``planted`` (under a patched module),
    compiled afresh."""
    causal, alignment, kv_heads, has_dlse = VARIANTS[variant]
    prob = problem(1000, 777, head_dim, causal=causal, alignment=alignment, kv_heads=kv_heads)
    if planted:
        binaries = hopper_backward.compile_sm90(prob, has_dlse=has_dlse, tiles=tiles)
    else:
        binaries = hopper_binaries(prob, has_dlse, tiles)
    return binaries[1], hgmma_per_step(binaries)


@pytest.mark.xdist_group(HOPPER_GROUP)
@pytest.mark.cute_compile
@pytest.mark.static
@pytest.mark.parametrize("head_dim", hopper_backward.HEAD_DIMS, ids=lambda d: f"d{d}")
def test_late_dv_issues_dv_after_ds_without_spills(head_dim: int) -> None:
    """Each knob candidate with every compile-time feature on (causal bottom-right, MQA, dLSE): no spills, wgmmas
    not serialised, the products per step of the same tiles without it, and the unmasked step issues dV only
    after waiting for Sᵀ and dPᵀ both. Planted: D=128's staged base issues dV between the two waits (before any
    full wait), which fails that rule. (At 128 rows, D=64, dV waits without the knob too: there it only moves
    Pᵀ's conversion.)"""
    for tiles in LATE_DV[head_dim]:
        dkdv, per_step = compile_dkdv(head_dim, tiles, "causal_bottom_right_mqa_dlse")
        _, without = compile_dkdv(head_dim, replace(tiles, late_dv=False), "causal_bottom_right_mqa_dlse")
        assert per_step == without, tiles.label
        assert spilled_bytes(dkdv) == 0, tiles.label
        sass = sass_of(dkdv)
        assert not wgmma_serialised(sass), f"{tiles.label}: ptxas serialised the wgmmas"
        assert dv_after_drain(unmasked_step(sass)), tiles.label
    if head_dim == 128:
        base, _ = compile_dkdv(head_dim, BASE[head_dim], "causal_bottom_right_mqa_dlse")
        assert not dv_after_drain(unmasked_step(sass_of(base)))


@pytest.mark.xdist_group(HOPPER_GROUP)
@pytest.mark.cute_compile
@pytest.mark.static
def test_late_dv_80_rows_read_fp32_pt_in_a_shorter_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """The 80-row candidate (full MHA, P1's configuration): no Pᵀ value rounded alone to 16 bits (to be read back
    for dSᵀ) in the unmasked step and at least ``SHORTER_80`` SASS instructions fewer than the 80-row step
    without the knob, which rounds every value so (planted contrast: 40 ``F2F`` in its step). Planted: with the
    knob but without LSE₂ seeded in Sᵀ's accumulator (``hopper_rows.lse_in_accumulator``) ptxas serialises the
    wgmmas or spills (it needed 256 registers of the 240)."""
    (late,) = [tiles for tiles in LATE_DV[128] if tiles.tile_m == ROWS_80]
    dkdv, _ = compile_dkdv(128, late, "full_mha")
    before, _ = compile_dkdv(128, replace(late, late_dv=False), "full_mha")
    step, before_step = unmasked_step(sass_of(dkdv)), unmasked_step(sass_of(before))
    assert not any(ROUND_ONE.search(text) for text in step)
    assert sum(bool(ROUND_ONE.search(text)) for text in before_step) == ROWS_80 // 2
    assert len(before_step) - len(step) >= SHORTER_80, (len(before_step), len(step))
    monkeypatch.setattr(hopper_rows, "lse_in_accumulator", lambda tile_m: False)
    planted, _ = compile_dkdv(128, late, "full_mha", planted=True)
    assert spilled_bytes(planted) > 0 or wgmma_serialised(sass_of(planted))


LATE_DV_CASES = knob_cases(LATE_DV)


@pytest.mark.gpu
@pytest.mark.parametrize(("case", "prob", "tiles"), LATE_DV_CASES, ids=[case for case, _, _ in LATE_DV_CASES])
def test_gpu_late_dv_passes_the_rule(case: str, prob: Problem, tiles: hopper_backward.BackwardTiles) -> None:
    """The candidate against fp64 by the rule, from cute/hopper's O and LSE. Planted: dV of the first 64 keys
    lost (the first warpgroup's dV products never issued: its accumulator left at zero) fails it."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    inputs, (dq, dk, dv) = hopper_gradients_of(prob, 31, tiles)
    assert_all_pass((dq, dk, dv), *inputs, prob)
    planted_dv = dv.clone()
    planted_dv[:, :, :BOX_ROWS] = 0
    with pytest.raises(AssertionError, match="WRONG"):
        assert_all_pass((dq, dk, planted_dv), *inputs, prob)
