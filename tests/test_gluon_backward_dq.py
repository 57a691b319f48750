"""gluon/backward/hopper's in-kernel dQ by TMA reduce-adds (``BackwardTiles(dq="reduce")``,
``triton_impl/gluon/backward_dq.py``; issue #40): each dK/dV step's dQᵀ share leaves through an fp32 staging
tile and one ``cp.reduce.async.bulk.tensor`` add into a transposed (B·H, D, Sq) accumulator.

Variants: plain steps (with and without ``tma_rows``) and overlapped ones (``overlap``: each step issues the
previous step's dK and dQᵀ products after its own Sᵀ and dPᵀ, ``backward_dq.previous_dq_t``).

On CPU: the variants' checks and labels, the head-dim refusal, the accumulator's descriptor (bounds at Sq, the
staging tile's layout), under the interpreter the conversion kernel (transpose, scale, padded rows), and the
SASS checker of spills in the step loops on a planted loop. Static (a child process without the interpreter):
the dK/dV kernel compiles for sm_90a without spills (``KNOWN_SPILLS`` aside, none in a step loop), with its
wgmmas not serialised, adding dQ by bulk reduce-adds and by no per-element atomic. On the GPU: the
variants against fp64 on shapes that probe the accumulator (Sq not a multiple of four, a query tail inside a
block, rows that see no key, one query or key, MQA, GQA), and a planted unzeroed accumulator that must fail.
"""

from __future__ import annotations

import re

import pytest
import torch

from common import attention
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from tests import test_gluon_backward_rows as backward_rows_tests
from tests._helpers import json_from_child
from tests.test_backward import assert_all_pass, problem
from triton_impl.gluon import backward as gluon_backward
from triton_impl.gluon import backward_dq

REDUCE = [tiles for tiles in gluon_backward.ALL_CANDIDATES[128] if tiles.dq == "reduce"]


def test_dq_modes_are_checked_and_named() -> None:
    """dq is one of the three modes; the atomic one runs the plain steps only, the reduce one plain or
    overlapped (with two ring slots or more); labels name the mode; no release lists an in-kernel dQ (off by
    default) while ALL_CANDIDATES has reduce variants with tma_rows, plain and overlapped."""
    tiles = gluon_backward.BackwardTiles
    with pytest.raises(ValueError, match="dq is one of"):
        tiles(32, 3, 64, 3, dq="reduced")
    with pytest.raises(ValueError, match="in-kernel dQ"):
        tiles(32, 3, 64, 3, overlap=True, dq="atomic")
    with pytest.raises(ValueError, match="two ring slots"):
        tiles(32, 1, 64, 3, overlap=True, dq="reduce")
    assert tiles(32, 3, 64, 3, dq="reduce", tma_rows=True).label == "dkdv 128x32 s3, dq reduce tma_rows"
    overlapped = tiles(32, 3, 64, 3, overlap=True, dq="reduce", tma_rows=True)
    assert overlapped.label == "dkdv 128x32 s3, dq reduce overlap tma_rows"
    assert tiles(32, 3, 64, 3, dq="atomic").label == "dkdv 128x32 s3, dq atomic"
    assert all(t.dq == "pass" for variants in gluon_backward.CANDIDATES.values() for t in variants)
    assert {(t.overlap, t.tma_rows) for t in REDUCE} >= {(False, True), (True, True)}


def test_reduce_refuses_head_dim_64() -> None:
    """Each consumer's dQᵀ share is D/2 rows, one m64 wgmma only at D=128: D=64 is refused with its reason."""
    with pytest.raises(ValueError, match="dq='reduce' needs head_dim 128"):
        gluon_backward.compile_sm90(problem(77, 333, head_dim=64), REDUCE[0])


def test_accumulator_descriptor_stops_at_sq_in_the_staging_layout() -> None:
    """Sq = 37: the accumulator's head-dim rows are 40 floats apart (16-byte strides), zeroed; the descriptor
    covers (B·H, D, 37), one consumer's (1, 64, 32) share per box, in the layout of the kernel's staging tile
    (fp32, 128-byte swizzle), so a reduce-add clips the query rows past Sq."""
    prob = problem(37, 53, heads=4, kv_heads=2, head_dim=128)
    accum_t = backward_dq.transposed_accumulator(prob, torch.device("cpu"))
    assert accum_t.shape == (4, 128, 40) and not accum_t.any()
    desc = backward_dq.accumulator_descriptor(accum_t, prob, 32)
    assert desc.shape == [4, 128, 37] and desc.strides == [128 * 40, 40, 1] and desc.block_shape == [1, 64, 32]
    assert desc.layout.swizzle_byte_width == 128 and desc.layout.element_bitwidth == 32


def _convert(accum_t: torch.Tensor, prob, padded_q: int) -> torch.Tensor:
    dq = torch.empty((prob.batch, prob.heads, prob.seqlen_q, prob.head_dim))
    kernel, grid, args, options = backward_dq.convert_launch(accum_t, dq, prob)
    args = (*args[:3], padded_q, *args[4:])
    kernel[grid](*args, **options)
    return dq


def test_conversion_transposes_scales_and_skips_the_padding() -> None:
    """Under the interpreter: dQ = softmax_scale · the accumulator's transpose over its first Sq = 77 rows
    (two 64-row programs, a tail in the second), the padding (filled with NaN here) never read. Planted: the
    accumulator read at a packed stride (Sq) misplaces every head-dim row after the first."""
    prob = problem(77, 53, heads=3, kv_heads=1, head_dim=128)
    accum_t = backward_dq.transposed_accumulator(prob, torch.device("cpu"))
    accum_t.normal_(generator=torch.Generator().manual_seed(3))
    accum_t[..., prob.seqlen_q :] = float("nan")
    expected = (accum_t[..., : prob.seqlen_q].transpose(1, 2) * prob.scale).reshape(1, 3, 77, 128)
    assert torch.equal(_convert(accum_t, prob, accum_t.shape[-1]), expected)
    assert not torch.equal(_convert(accum_t, prob, prob.seqlen_q), expected)


def step_loop_spills(sass: str) -> int:
    """Local loads and stores (LDL, STL: spills) inside the innermost loops of ``sass`` that issue wgmmas (the
    step loops): a loop is a backward branch's address range, innermost when it holds no other such range."""
    code = [(int(m[1], 16), m[2]) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    loops = []
    for address, text in code:
        branch = re.search(r"\bBRA\s+0x([0-9a-f]+)", text)
        if branch and int(branch[1], 16) < address:
            loops.append((int(branch[1], 16), address))
    wgmma = [(lo, hi) for lo, hi in loops if any(lo <= a <= hi and "HGMMA." in text for a, text in code)]
    inner = [
        (lo, hi) for lo, hi in wgmma if not any((lo, hi) != (l2, h2) and lo <= l2 and h2 <= hi for l2, h2 in wgmma)
    ]
    spills = [a for a, text in code if re.search(r"(^|\s)(LDL|STL)(\.\S+)?\s", text + " ")]
    return sum(any(lo <= a <= hi for lo, hi in inner) for a in spills)


# A step loop in SASS (a backward branch around a wgmma) with spills before it, and the same with one inside.
_LOOP_SASS = """
        /*0100*/                   STL [R1], R3 ;                            /* 0x0000000301007387 */
        /*0110*/                   HGMMA.64x32x16.F32.BF16 R24, gdesc[UR4], RZ ;  /* 0x0 */
        /*0120*/                   {inside}
        /*0130*/              @!P0 BRA 0x110 ;                               /* 0xfffffffc00f08947 */
        /*0140*/                   LDL R5, [R1] ;                            /* 0x0000000001057983 */
        /*0150*/              @!P1 BRA 0x150 ;                               /* 0xfffffffc00f08947 */
"""


def test_step_loop_spills_finds_spills_inside_the_wgmma_loops_only() -> None:
    """The checker counts no spill before or after a step loop (nor a branch-to-self without wgmmas);
    planted: an LDL inside the loop is counted."""
    assert step_loop_spills(_LOOP_SASS.format(inside="FADD R2, R2, R3 ;")) == 0
    assert step_loop_spills(_LOOP_SASS.format(inside="LDL R20, [R1+0x4] ;")) == 1


# Triton 3.6 (the H200's) and 3.7 spill in the overlapped reduce variant's causal dK/dV kernels (16 bytes per
# thread at the ragged GQA shape, 8 at P1), in the consumers' prologue and epilogue (once per CTA or head), none
# in the step loops; Triton 3.8 spills none (3.9: ``backward_dq.IN_KERNEL_DQ_SPILLS``).
KNOWN_SPILLS = {
    (release, "dkdv 128x32 s3, dq reduce overlap tma_rows", shape)
    for release in ("3.6", "3.7")
    for shape in ("ragged causal", "P1 causal")
}

# The reduce variants' dK/dV kernel at ragged GQA shapes (non-causal, causal bottom-right) and at P1 (and
# causal), and the atomic variant (the plant: per-element atomics, no bulk reduce) at the ragged causal one.
SASS_SCRIPT = """
import json, re, torch
from common.contract.problem import Problem
from common.reporting.static import cubin_resources, cubin_sass
from common.toolchain.releases import triton_release
from tests.test_gluon_backward_dq import step_loop_spills
from triton_impl.gluon import backward as gluon_backward
shapes = {
    "ragged": Problem(2, 16, 1000, 777, 128, torch.bfloat16, kv_heads=4),
    "ragged causal": Problem(2, 16, 1000, 777, 128, torch.bfloat16, kv_heads=4, causal=True,
                             causal_alignment="bottom_right"),
    "P1": Problem(2, 16, 8192, 8192, 128, torch.bfloat16),
    "P1 causal": Problem(2, 16, 8192, 8192, 128, torch.bfloat16, causal=True),
}
chosen = [(t, name) for t in gluon_backward.ALL_CANDIDATES[128] if t.dq == "reduce" for name in shapes]
chosen.append((next(t for t in gluon_backward.ALL_CANDIDATES[128] if t.dq == "atomic"), "ragged causal"))
rows = []
for tiles, name in chosen:
    binaries = gluon_backward.compile_sm90(shapes[name], tiles)
    dkdv = binaries[1]
    sass = cubin_sass(dkdv.cubin)
    usage = next(iter(cubin_resources(dkdv.cubin).values()))
    rows.append({
        "tiles": tiles.label, "shape": name, "launches": [b.name for b in binaries],
        "spill": usage["stack_bytes"] + usage["local_bytes"], "loop_spills": step_loop_spills(sass),
        "release": triton_release(), "shared": dkdv.shared_bytes,
        "serialised": sass.count("WARPGROUP.ARRIVE") * 2 > sass.count("HGMMA."),
        "bulk_adds": len(re.findall(r"cp\\.reduce\\.async\\.bulk\\.tensor\\.3d\\S*\\.add", dkdv.ptx)),
        "atomics": len(re.findall(r"\\b(?:red|atom)\\.global", dkdv.ptx)),
    })
print(json.dumps(rows))
"""


@pytest.mark.static
def test_reduce_dkdv_kernel_adds_dq_by_bulk_reduce_without_spills() -> None:
    """Each reduce variant at each shape: three launches (preprocess, dK/dV, the transposed conversion), no
    spills (``KNOWN_SPILLS`` aside, and none of those in a step loop; not checked under the releases of
    ``IN_KERNEL_DQ_SPILLS``, where every in-kernel dQ spills and no release lists it), within the H200's
    shared memory per block, wgmmas not serialised, dQ added by 3-D bulk reduce-adds and by no per-element
    atomic. Planted: the atomic variant, whose per-element atomics the rule detects (and which has no bulk add)."""
    rows = json_from_child(["-c", SASS_SCRIPT], timeout=600)
    *mine, planted = rows
    assert len(mine) == 4 * len(REDUCE)
    for row in mine:
        assert row["launches"][1:] == ["_dkdv_kernel", "_dq_transposed_convert_kernel"], row
        known = (row["release"], row["tiles"], row["shape"]) in KNOWN_SPILLS
        if row["release"] not in backward_dq.IN_KERNEL_DQ_SPILLS:
            assert (row["spill"] == 0 or known) and row["loop_spills"] == 0, row
        assert not row["serialised"] and row["shared"] <= 232_448, row
        assert row["bulk_adds"] > 0 and row["atomics"] == 0, row
    assert planted["atomics"] > 0 and planted["bulk_adds"] == 0, ("planted: atomics must be detected", planted)


# Shapes that probe the accumulator: the rows' shapes (Sq not a multiple of four, padded head-dim rows, with a
# query tail inside a block; rows that see no key; one query row; one key; MQA) and a non-causal GQA shape over
# several key blocks.
GPU_SHAPES = {**backward_rows_tests.GPU_SHAPES, "sq1000_sk777_gqa": problem(1000, 777, heads=8, kv_heads=2)}
GPU_CASES = [pytest.param(name, tiles, id=f"{name}-{tiles.label}") for tiles in REDUCE for name in GPU_SHAPES]


def gluon_gradients(prob: Problem, tiles: gluon_backward.BackwardTiles, seed: int, d_out_seed: int):
    """``tiles``' gradients of ``prob`` in bf16 from gluon/hopper's O and LSE, with the operands the rule needs."""
    q, k, v = make_inputs(prob, seed=seed, device="cuda", offset=0.5)
    generator = torch.Generator(device="cuda").manual_seed(d_out_seed)
    d_out = torch.randn(q.shape, generator=generator, device="cuda").bfloat16()
    with torch.no_grad():
        out, lse = attention(q, k, v, causal=prob.causal, causal_alignment=prob.causal_alignment,
                             impl="gluon/hopper", return_lse=True)  # fmt: skip
    grads = gluon_backward.hopper_gradients(q, k, v, out, lse, d_out, prob, tiles=tiles)
    return grads, (q, k, v, d_out, prob)


def _gradients(shape: str, tiles: gluon_backward.BackwardTiles):
    return gluon_gradients(GPU_SHAPES[shape].with_(head_dim=128, dtype=torch.bfloat16), tiles, 23, 9)


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "tiles"), GPU_CASES)
def test_gpu_reduce_passes_the_rule(shape: str, tiles: gluon_backward.BackwardTiles) -> None:
    """Each reduce variant in bf16 against fp64 by the gradient rule, from gluon/hopper's O and LSE."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    grads, operands = _gradients(shape, tiles)
    assert_all_pass(grads, *operands)


@pytest.mark.gpu
def test_gpu_an_unzeroed_accumulator_fails_the_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: the accumulator starts at 1 instead of 0; the rule must reject the dQ that follows."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    real = backward_dq.transposed_accumulator
    monkeypatch.setattr(gluon_backward, "transposed_accumulator", lambda prob, device: real(prob, device) + 1)
    grads, operands = _gradients("sq1000_sk777_gqa", REDUCE[0])
    with pytest.raises(AssertionError, match="dq"):
        assert_all_pass(grads, *operands)
