"""gluon/backward/hopper's ``tma_rows`` (``triton_impl/gluon/backward_rows.py``): LSE₂ and D of each query block
loaded by TMA with Q and dO into the ring slot instead of read from HBM in every dK/dV step.

On CPU: the preprocess (under the interpreter) writes each head's rows at the padded stride with the values it
writes packed, and the descriptors over them stop at Sq. Static (a child process without the interpreter):
the dK/dV kernel reads no global memory, loads two more 3-D boxes per ring slot and has a shorter unmasked
step than the same tiles reading HBM. On the GPU: every tma_rows candidate against fp64 on the shapes that
probe the padding and the zero-filled rows past Sq (the other GPU shapes: ``tests/test_backward.py``'s
``test_gpu_every_candidate_passes_the_rule``, which runs every candidate).
"""

from __future__ import annotations

import pytest
import torch

from common import attention
from common.contract.inputs import make_inputs
from tests._helpers import json_from_child
from tests.test_backward import assert_all_pass, problem
from triton_impl.backward import tiled as tiled_backward
from triton_impl.gluon import backward as gluon_backward
from triton_impl.gluon import backward_rows

TMA_ROWS = [
    (head_dim, tiles)
    for head_dim, variants in gluon_backward.ALL_CANDIDATES.items()
    for tiles in variants
    if tiles.tma_rows
]


def _preprocess(prob, out, d_out, lse, d_lse, row_align: int) -> tuple[torch.Tensor, torch.Tensor]:
    launch, delta, lse_log2 = tiled_backward.preprocess_launch(out, d_out, lse, d_lse, prob, row_align=row_align)
    kernel, grid, args, options = launch
    kernel[grid](*args, **options)
    return delta, lse_log2


def test_preprocess_pads_each_heads_rows_and_the_descriptors_stop_at_sq() -> None:
    """Sq = 37: each head's D (with a dLSE) and LSE₂ rows start 40 floats apart with the values the packed
    layout holds (+inf LSE₂ where a row sees no key); the 3-D descriptors cover (B, H, Sq) at that stride. Planted: the
    padded vectors read packed (the HBM path's stride) misplace every head after the first."""
    prob = problem(37, 53, heads=4, kv_heads=2).with_(batch=2)
    shape = (prob.batch, prob.heads, prob.seqlen_q)
    generator = torch.Generator().manual_seed(5)
    out, d_out = (torch.randn((*shape, prob.head_dim), generator=generator) for _ in "01")
    lse, d_lse = (torch.randn(shape, generator=generator) for _ in "01")
    lse[1, 2, 5] = float("-inf")
    packed = [t.view(shape) for t in _preprocess(prob, out, d_out, lse, d_lse, 1)]
    padded_vectors = _preprocess(prob, out, d_out, lse, d_lse, backward_rows.ROW_ALIGN.value)
    padded = backward_rows.padded_seqlen(prob.seqlen_q)
    assert padded == 40 and all(t.numel() == prob.batch * prob.heads * padded for t in padded_vectors)
    stored = [t.view(prob.batch, prob.heads, padded)[..., : prob.seqlen_q] for t in padded_vectors]
    for mine, theirs in zip(stored, packed, strict=True):
        assert torch.equal(mine, theirs)
    assert stored[1][1, 2, 5] == float("inf")
    misread = padded_vectors[0][: prob.batch * prob.heads * prob.seqlen_q].view(shape)
    assert not torch.equal(misread, packed[0])

    descriptors = backward_rows.dkdv_rows(*padded_vectors[::-1], prob, 32, True)
    for descriptor, vector in zip(descriptors, padded_vectors[::-1], strict=True):
        assert descriptor.base is vector and descriptor.shape == list(shape)
        assert descriptor.strides == [prob.heads * padded, padded, 1] and descriptor.block_shape == [1, 1, 32]
    assert backward_rows.dkdv_rows(*packed, prob, 32, False) == tuple(packed)
    assert gluon_backward.BackwardTiles(32, 3, 64, 3, tma_rows=True).label == "dkdv 128x32 s3, dq 128x64 s3 tma_rows"


# For the first tma_rows candidate of each head dim and the same tiles reading HBM: the dK/dV kernel's SASS
# facts at a ragged GQA causal bottom-right shape.
SASS_SCRIPT = """
import dataclasses, json, re, torch
from common.contract.problem import Problem
from common.reporting.static import cubin_resources, cubin_sass, loop_census
from triton_impl.gluon import backward as gluon_backward
rows = {}
for head_dim, variants in gluon_backward.CANDIDATES.items():
    tiles = next(t for t in variants if t.tma_rows)
    problem = Problem(2, 16, 1000, 777, head_dim, torch.bfloat16, kv_heads=4, causal=True,
                      causal_alignment="bottom_right")
    for name, chosen in (("tma_rows", tiles), ("hbm", dataclasses.replace(tiles, tma_rows=False))):
        dkdv = gluon_backward.compile_sm90(problem, chosen)[1]
        sass = cubin_sass(dkdv.cubin)
        usage = next(iter(cubin_resources(dkdv.cubin).values()))
        rows[f"{head_dim} {name}"] = {
            "global_loads": len(re.findall(r"(?<![A-Z])LDG[.\\s]", sass)),
            "row_boxes": sass.count("UTMALDG.3D"),
            "shared_loads": sass.count("LDS"),
            "step": loop_census(sass).instructions,
            "spill": usage["stack_bytes"] + usage["local_bytes"],
            "serialised": sass.count("WARPGROUP.ARRIVE") * 2 > sass.count("HGMMA."),
        }
print(json.dumps(rows))
"""


@pytest.mark.static
def test_tma_rows_dkdv_kernel_reads_no_global_memory_and_has_a_shorter_step() -> None:
    """tma_rows at D=64 and D=128: no spills, wgmmas not serialised, no load from global memory in the dK/dV
    kernel (LSE₂ and D read from shared memory), two 3-D TMA boxes per ring slot, and an unmasked step at
    least 30 SASS instructions shorter (measured: 238 → 198 at D=128, 383 → 244 at D=64). Planted: the same
    tiles reading HBM issue LDGs, which the rule detects."""
    rows = json_from_child(["-c", SASS_SCRIPT], timeout=600)
    assert {key.split()[0] for key in rows} == {str(head_dim) for head_dim in gluon_backward.CANDIDATES}
    for head_dim in gluon_backward.CANDIDATES:
        mine, hbm = rows[f"{head_dim} tma_rows"], rows[f"{head_dim} hbm"]
        assert mine["spill"] == 0 and not mine["serialised"], (head_dim, mine)
        assert mine["global_loads"] == 0 and mine["row_boxes"] == 2, (head_dim, mine)
        assert mine["shared_loads"] > hbm["shared_loads"], (head_dim, mine, hbm)
        assert hbm["global_loads"] > 0 and hbm["row_boxes"] == 0, ("planted: HBM reads must be detected", hbm)
        assert hbm["step"] - mine["step"] >= 30, (head_dim, mine, hbm)


# Shapes that probe the rows: Sq not a multiple of four (padded head rows) with a query tail inside a block,
# rows that see no key (Sq > Sk bottom-right: LSE₂ +inf through the box), one query row, one key, MQA.
GPU_SHAPES = {
    "sq77_sk333_gqa_causal_bottom_right": problem(77, 333, heads=4, kv_heads=2, causal=True, alignment="bottom_right"),
    "sq1001_sk300_mqa_causal_bottom_right": problem(
        1001, 300, heads=3, kv_heads=1, causal=True, alignment="bottom_right"
    ),
    "sq1_sk129_mha": problem(1, 129, heads=2, kv_heads=2),
    "sq517_sk1_gqa": problem(517, 1, heads=4, kv_heads=2),
}
GPU_CASES = [
    pytest.param(name, head_dim, tiles, id=f"{name}-d{head_dim}-{tiles.label}")
    for head_dim, tiles in TMA_ROWS
    for name in GPU_SHAPES
]


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "head_dim", "tiles"), GPU_CASES)
def test_gpu_tma_rows_pass_the_rule(shape: str, head_dim: int, tiles: gluon_backward.BackwardTiles) -> None:
    """Each tma_rows candidate in bf16 against fp64 by the gradient rule, from gluon/hopper's O and LSE."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    prob = GPU_SHAPES[shape].with_(head_dim=head_dim, dtype=torch.bfloat16)
    q, k, v = make_inputs(prob, seed=21, device="cuda", offset=0.5)
    generator = torch.Generator(device="cuda").manual_seed(8)
    d_out = torch.randn(q.shape, generator=generator, device="cuda").bfloat16()
    with torch.no_grad():
        out, lse = attention(q, k, v, causal=prob.causal, causal_alignment=prob.causal_alignment,
                             impl="gluon/hopper", return_lse=True)  # fmt: skip
    assert_all_pass(gluon_backward.hopper_gradients(q, k, v, out, lse, d_out, prob, tiles=tiles), q, k, v, d_out, prob)
