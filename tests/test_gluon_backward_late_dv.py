"""gluon/backward/hopper's ``late_dv`` (``triton_impl/gluon/backward_late_dv.py``): dPᵀ − D by the wgmma (its
accumulator seeded with −D), LSE₂ read once Sᵀ has retired, dV += Pᵀ dO issued after dSᵀ; with it the dK/dV step
takes 128 query rows at D=64.

On CPU: the knob refuses the overlapped steps and an in-kernel dQ, names itself, and is listed exactly by the
releases that build it without spills (D=64's default there); the A/B (``bench/gluon_bwd_d64_ab.sh``) names real
variants. Static (a child process without the interpreter): at D=64 with 128 query rows, non-causal, no spills and
no serialised wgmmas under every release, m64n128 products and a step of 64 exp2 a thread; causal spill-free where
listed; planted: the same 128-row tiles in the plain order spill, which the rule detects. On the GPU: every late_dv
candidate against fp64 on ragged, causal (both alignments), GQA/MQA, one-query and many-block shapes; planted: the
dK/dV kernel given D = 0 (a lost seed) fails the rule on dK.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from common.toolchain.releases import triton_release
from tests import test_gluon_backward_rows as backward_rows_tests
from tests._helpers import json_from_child
from tests.test_backward import assert_all_pass, problem
from tests.test_gluon_backward_dq import gluon_gradients
from triton_impl.gluon import backward as gluon_backward

LATE_DV = [tiles for tiles in gluon_backward.ALL_CANDIDATES[64] if tiles.late_dv]


def test_late_dv_is_checked_named_and_listed_where_it_builds() -> None:
    """Overlapped steps and an in-kernel dQ are refused; the label says ``late_dv``; 128-row candidates at D=64 only,
    in CANDIDATES (both masks) exactly when the installed release is not among LATE_DV_SPILLS and in
    NON_CAUSAL_CANDIDATES under every release; D=64's default where listed, but not for one query."""
    tiles = gluon_backward.BackwardTiles
    for wrong in ({"overlap": True}, {"dq": "reduce"}):
        with pytest.raises(ValueError, match="late_dv"):
            tiles(128, 3, 64, 3, late_dv=True, **wrong)
    assert tiles(128, 2, 64, 2, tma_rows=True, late_dv=True).label == "dkdv 128x128 s2, dq 128x64 s2 tma_rows late_dv"
    assert LATE_DV and all(t.dkdv_block_m == 128 and t.tma_rows for t in LATE_DV)
    listed = triton_release() not in gluon_backward.LATE_DV_SPILLS
    assert all((t in gluon_backward.CANDIDATES[64]) == listed for t in LATE_DV)
    assert all(t in gluon_backward.NON_CAUSAL_CANDIDATES[64] for t in LATE_DV)
    # D=64's default where it builds spill-free (results/h200/gluon-backward-d64-late-dv/), else the plain step's.
    default = gluon_backward.default_tiles
    assert default(problem(1000, 777, causal=True)).late_dv == listed
    assert default(problem(1000, 777)).late_dv
    assert not default(problem(1, 777)).late_dv
    assert not default(problem(1000, 777, head_dim=128)).late_dv


# The default's dK/dV and dQ kernels for one query (Sq = 1, a constant to Triton) at both head dims and masks, and
# late_dv's there (planted: it spills, which is why the default leaves it for one query).
ONE_QUERY_SCRIPT = """
import json, torch
from common.contract.problem import Problem
from common.reporting.static import cubin_resources
from triton_impl.gluon import backward as gluon_backward
rows = {}
for head_dim in (64, 128):
    for causal in (False, True):
        problem = Problem(1, 4, 1, 300, head_dim, torch.bfloat16, causal=causal)
        chosen = {"default": gluon_backward.default_tiles(problem)}
        if head_dim == 64 and not causal:
            chosen["late_dv"] = gluon_backward.ALL_CANDIDATES[64][0]
        for name, tiles in chosen.items():
            for binary in gluon_backward.compile_sm90(problem, tiles)[1:3]:
                usage = next(iter(cubin_resources(binary.cubin).values()))
                rows[f"{name}|{head_dim}|{causal}|{binary.name}"] = usage["stack_bytes"] + usage["local_bytes"]
print(json.dumps(rows))
"""


@pytest.mark.static
def test_one_query_default_builds_without_spills() -> None:
    """A one-query backward's default kernels spill nothing at D=64 and 128, causal and not; planted: late_dv's
    dK/dV kernel at Sq = 1 spills (144-208 bytes a thread under 3.6 and 3.8), so the rule would catch it."""
    rows = json_from_child(["-c", ONE_QUERY_SCRIPT], timeout=600)
    defaults = {key: spill for key, spill in rows.items() if key.startswith("default|")}
    assert len(defaults) == 8 and not any(defaults.values()), defaults
    assert rows["late_dv|64|False|_dkdv_kernel"] > 0, ("planted: late_dv's one-query spill must be detected", rows)


# Each late_dv candidate and the same tiles in the plain order, D=64, the anchor shape causal and not and the
# static tests' ragged GQA bottom-right shape causal: spills, serialised wgmmas, the dK/dV step's SASS facts.
STATIC_SCRIPT = """
import dataclasses, json, torch
from common.contract.problem import Problem
from common.reporting.static import cubin_resources, cubin_sass, loop_census
from triton_impl.gluon import backward as gluon_backward
shapes = {"anchor": Problem(4, 32, 8192, 8192, 64, torch.bfloat16),
          "anchor causal": Problem(4, 32, 8192, 8192, 64, torch.bfloat16, causal=True),
          "ragged causal": Problem(2, 16, 1000, 777, 64, torch.bfloat16, kv_heads=4, causal=True,
                                   causal_alignment="bottom_right")}
rows = {}
for tiles in [t for t in gluon_backward.ALL_CANDIDATES[64] if t.late_dv]:
    for name, chosen in (("late_dv", tiles), ("plain", dataclasses.replace(tiles, late_dv=False))):
        for shape, problem in shapes.items():
            if name == "plain" and shape != "anchor":
                continue
            dkdv = gluon_backward.compile_sm90(problem, chosen)[1]
            sass = cubin_sass(dkdv.cubin)
            usage = next(iter(cubin_resources(dkdv.cubin).values()))
            step = loop_census(sass)
            rows[f"{tiles.label}|{name}|{shape}"] = {
                "spill": usage["stack_bytes"] + usage["local_bytes"],
                "serialised": sass.count("WARPGROUP.ARRIVE") * 2 > sass.count("HGMMA."),
                "n128": "HGMMA.64x128x16" in sass, "exp2": step.exp2, "gmma": step.gmma, "step": step.instructions,
            }
print(json.dumps(rows))
"""


@pytest.mark.static
def test_late_dv_builds_128_rows_at_d64_without_spills() -> None:
    """Non-causal (the D=64 anchor): no spills, wgmmas not serialised, Sᵀ and dPᵀ as m64n128 wgmmas and a step of 64
    MUFU.EX2 and 24 HGMMA a thread (measured under 3.6: 438 SASS instructions, two 64-row steps 496). Causal: spill-free
    under the releases that list it. Planted: the same tiles in the plain order spill (304 bytes under 3.6)."""
    rows = json_from_child(["-c", STATIC_SCRIPT], timeout=900)
    listed = triton_release() not in gluon_backward.LATE_DV_SPILLS
    for tiles in LATE_DV:
        anchor = rows[f"{tiles.label}|late_dv|anchor"]
        assert anchor["spill"] == 0 and not anchor["serialised"], (tiles.label, anchor)
        assert anchor["n128"] and anchor["exp2"] == 64 and anchor["gmma"] == 24, (tiles.label, anchor)
        for shape in ("anchor causal", "ragged causal"):
            causal = rows[f"{tiles.label}|late_dv|{shape}"]
            assert not causal["serialised"] and (causal["spill"] == 0 or not listed), (tiles.label, shape, causal)
        plain = rows[f"{tiles.label}|plain|anchor"]
        assert plain["spill"] > 0, ("planted: the plain order's spill must be detected", tiles.label, plain)


# The rows' shapes (padded head rows, query tails inside a block, rows that see no key, one query or key, MQA), a
# causal top-left GQA shape over several 128-row blocks and a non-causal one with Sq > Sk.
GPU_SHAPES = {
    **backward_rows_tests.GPU_SHAPES,
    "sq1000_sk777_gqa_causal": problem(1000, 777, heads=8, kv_heads=2, causal=True),
    "sq700_sk300_mha": problem(700, 300, heads=2, kv_heads=2),
}
GPU_CASES = [pytest.param(name, tiles, id=f"{name}-{tiles.label}") for tiles in LATE_DV for name in GPU_SHAPES]


def _gradients(shape: str, tiles: gluon_backward.BackwardTiles):
    return gluon_gradients(GPU_SHAPES[shape].with_(head_dim=64, dtype=torch.bfloat16), tiles, 29, 11)


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "tiles"), GPU_CASES)
def test_gpu_late_dv_passes_the_rule(shape: str, tiles: gluon_backward.BackwardTiles) -> None:
    """Each late_dv candidate in bf16 against fp64 by the gradient rule, from gluon/hopper's O and LSE."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    grads, operands = _gradients(shape, tiles)
    assert_all_pass(grads, *operands)


@pytest.mark.gpu
def test_gpu_a_lost_delta_seed_fails_the_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: the dK/dV kernel reads D = 0 (dPᵀ's accumulator seeded with nothing), the dQ pass the true D; the
    rule must reject the dK that follows."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    real = gluon_backward.dkdv_rows

    def zero_delta(lse_log2, delta, *args):
        return real(lse_log2, torch.zeros_like(delta), *args)

    monkeypatch.setattr(gluon_backward, "dkdv_rows", zero_delta)
    grads, operands = _gradients("sq1000_sk777_gqa_causal", LATE_DV[0])
    with pytest.raises(AssertionError, match="dk WRONG"):
        assert_all_pass(grads, *operands)


def test_the_ab_names_real_variants() -> None:
    """``bench/gluon_bwd_d64_ab.sh`` runs ``bench.gluon_bwd_causal --set d64``: the plain 64-row step first (D=64's
    default where late_dv spills), then every late_dv candidate and the 128-key dQ pass by their labels, at the D=64
    anchor causal and not."""
    from bench import gluon_bwd_causal

    script = (Path(__file__).parents[1] / "bench" / "gluon_bwd_d64_ab.sh").read_text()
    assert "bench.gluon_bwd_causal --set d64" in script
    head_dim, labels, shapes = gluon_bwd_causal.AB_SETS["d64"]
    chosen = list(gluon_bwd_causal._variants(head_dim, labels).values())
    plain = next(t for t in gluon_backward.ALL_CANDIDATES[64] if not t.late_dv)
    assert chosen[0] == plain and set(LATE_DV) <= set(chosen)
    assert any(t.dq_block_n == 128 and not t.late_dv for t in chosen)
    assert shapes == ("D64 B4 H32", gluon_bwd_causal.D64_CAUSAL[0])
