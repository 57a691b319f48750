"""cute/backward/tiled and cute/backward/hopper beyond the shared backward tests (``tests/test_backward.py``,
which also runs their GPU gradients through cute/tiled, cute/pipelined and cute/hopper and compiles their
defaults for sm_90a).

Without a GPU: every tiled kernel variant (D 64 and 128, causal in both alignments and not, GQA, dLSE,
both dtypes) and the hopper kernels with every feature on compile for sm_90a without spills and with the
instructions the rung is about (hopper: wgmma not serialised by ptxas, read in the SASS); the hopper
rung's MN-major ring layouts are its K-major ones transposed; the capability checks refuse what a rung
cannot differentiate, each with its reason; a copy taller than its tile and an overlapped hopper variant
with one ring slot are refused. With a GPU: gradients against fp64 by the yardstick rule on the shapes
that probe the rungs' tiles (query and key tails inside one tile, rows that see no key, one query or
key, MQA), for every hopper candidate too (the tma_rows ones on every such shape), and the returned LSE
differentiated too.
"""

from __future__ import annotations

import functools
import itertools
import re
from dataclasses import replace

import pytest
import torch

pytest.importorskip("cutlass")
import cutlass
import cutlass.cute as cute

from common import attention
from common.contract import capability
from common.contract.gradients import judge_gradients
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from common.contract.reference import reference_attention
from common.reporting.static import cubin_resources, cubin_sass
from common.toolchain.arch import SM90_SHARED_MEMORY_BYTES
from common.toolchain.compile import compile_cute_sm90
from cute_impl._host import CUTE_DTYPES
from cute_impl.backward import hopper as hopper_backward
from cute_impl.backward import hopper_dq, hopper_rows, naive, tiled
from cute_impl.backward._device import (
    fixed_layout,
    heaviest_first,
    query_block_range,
    row_tile_copy,
    streamed_layouts,
)
from tests.test_backward import assert_all_pass, dense_attention, ladder_gradients

# PTX atomics (atom.global.add, red.relaxed.gpu.global.add, ...), not the "red." inside "shared.".
ATOMICS = re.compile(r"(?<![a-z])(atom|red)\.")
# (causal, alignment, kv_heads of 4 heads, d_lse): the canonical MHA problem and the one with every
# compile-time feature on.
VARIANTS = {
    "full_mha": (False, "top_left", 4, False),
    "causal_top_left_gqa": (True, "top_left", 2, False),
    "causal_bottom_right_mqa_dlse": (True, "bottom_right", 1, True),
}


def problem(
    seqlen_q: int,
    seqlen_k: int,
    head_dim: int,
    *,
    causal: bool = False,
    alignment: str = "top_left",
    kv_heads: int = 4,
    dtype: torch.dtype = torch.bfloat16,
) -> Problem:
    """Four query heads, batch 1."""
    return Problem(1, 4, seqlen_q, seqlen_k, head_dim, dtype, causal=causal, kv_heads=kv_heads,
                   causal_alignment=alignment)  # fmt: skip


# The tests that share hopper_binaries' compiles (here and in the knob files test_cute_backward_gap, _desc and
# _epilogue): one worker, so that each compile is paid once.
HOPPER_GROUP = "cute-backward-hopper"


@functools.cache
def hopper_binaries(prob: Problem, has_dlse: bool, tiles: hopper_backward.BackwardTiles) -> tuple:
    """``hopper_backward.compile_sm90`` of the module as written, once a key: the static tests compile the same
    (problem, dLSE, tiles) in several tests (dq="reduce" and the default candidate with every feature on here; a
    knob's tiles without it and the staged defaults in the knob files); they run on one worker (``xdist_group``),
    so each is compiled once. A planted bug (a patched module) calls ``compile_sm90`` itself, never this."""
    return tuple(hopper_backward.compile_sm90(prob, has_dlse=has_dlse, tiles=tiles))


# ----------------------------------------------------------------------------------------------
# Static: compiles for sm_90a without spills, with the rung's instructions
# ----------------------------------------------------------------------------------------------
@pytest.mark.cute_compile
@pytest.mark.static
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("head_dim", tiled.HEAD_DIMS, ids=lambda d: f"d{d}")
def test_every_kernel_compiles_without_spills(head_dim: int, variant: str) -> None:
    causal, alignment, kv_heads, has_dlse = VARIANTS[variant]
    prob = problem(1000, 1000, head_dim, causal=causal, alignment=alignment, kv_heads=kv_heads)
    binaries = tiled.compile_sm90(prob, has_dlse=has_dlse)
    assert [binary.name.rsplit("_", 1)[-1] for binary in binaries] == ["preprocess", "dkdv", "dq"]
    for binary in binaries:
        for usage in cubin_resources(binary.cubin).values():
            spills = usage["stack_bytes"] + usage["local_bytes"]
            assert spills == 0, f"{binary.name} {prob.describe()}: {usage['registers']} registers, {spills} B spilled"
    for binary in binaries[1:]:
        for instruction in ("mma.sync.aligned.m16n8k16", "ldmatrix.sync.aligned.m8n8.x4.trans", "cp.async.cg"):
            assert instruction in binary.ptx, f"{binary.name}: no {instruction}"
        assert not ATOMICS.search(binary.ptx), f"{binary.name}: dQ by a separate pass needs no atomics"


@pytest.mark.cute_compile
@pytest.mark.static
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_naive_compiles_without_spills_or_tensor_cores(variant: str) -> None:
    causal, alignment, kv_heads, has_dlse = VARIANTS[variant]
    prob = problem(1000, 1000, 128, causal=causal, alignment=alignment, kv_heads=kv_heads)
    (binary,) = naive.compile_sm90(prob, has_dlse=has_dlse)
    usages = cubin_resources(binary.cubin)
    assert len(usages) == 5, sorted(usages)
    for kernel, usage in usages.items():
        assert usage["stack_bytes"] + usage["local_bytes"] == 0, f"{kernel}: {usage}"
    assert "mma" not in binary.ptx and not ATOMICS.search(binary.ptx)


@pytest.mark.cute_compile
@pytest.mark.static
def test_fp16_compiles_without_spills() -> None:
    prob = problem(1000, 1000, 128, causal=True, dtype=torch.float16)
    for binary in tiled.compile_sm90(prob):
        assert "f16.f16" in binary.ptx or binary.name.endswith("preprocess"), binary.name
        for usage in cubin_resources(binary.cubin).values():
            assert usage["stack_bytes"] + usage["local_bytes"] == 0, binary.name


def sass_of(binary) -> str:
    return cubin_sass(binary.cubin)


def wgmma_serialised(sass: str) -> bool:
    """ptxas serialises the wgmmas of a kernel it cannot prove safe: a WARPGROUP.ARRIVE (and a wait) per
    HGMMA instead of one per product of 4-8 k-steps."""
    return sass.count("WARPGROUP.ARRIVE") * 2 > sass.count("HGMMA.")


@pytest.mark.xdist_group(HOPPER_GROUP)
@pytest.mark.cute_compile
@pytest.mark.static
def test_hopper_compiles_without_spills_to_unserialised_wgmma_and_tma() -> None:
    """The hopper rung's dK/dV and dQ kernels with every compile-time feature on (tests/test_backward.py
    compiles the defaults causal top-left GQA at both head dims), and the overlapped dQ kernel: no spills,
    every product a wgmma (8 per k-step product at D=128: Sᵀ, dPᵀ, S, dP; 4 for dV, dK and dQ at 64 rows
    or keys per step), none serialised, loads by TMA, no mma.sync, no cp.async and no atomics. Planted:
    the one variant ptxas serialises (overlapped dQ with 128 keys per step) fails the rule."""
    causal, alignment, kv_heads, has_dlse = VARIANTS["causal_bottom_right_mqa_dlse"]
    prob = problem(1000, 777, 128, causal=causal, alignment=alignment, kv_heads=kv_heads)
    separate_pass = hopper_backward.CANDIDATES[128][0]
    binaries = list(hopper_binaries(prob, has_dlse, separate_pass))
    assert [binary.name.rsplit("_", 1)[-1] for binary in binaries] == ["preprocess", "dkdv", "dq"]
    overlapped = hopper_backward.BackwardTiles(64, 64, 3, dq_overlap=True)
    binaries += hopper_backward.compile_sm90(prob, tiles=overlapped)[2:]
    # Products per step: masked and unmasked steps each have their own copy of the loop body.
    hgmma_per_step = {"dkdv": 8 + 8 + 4 + 4, "dq": 8 + 8 + 4}
    for binary in binaries[1:]:
        for usage in cubin_resources(binary.cubin).values():
            spills = usage["stack_bytes"] + usage["local_bytes"]
            assert spills == 0, f"{binary.name} {prob.describe()}: {usage['registers']} registers, {spills} B spilled"
        sass = sass_of(binary)
        assert sass.count("HGMMA.") == 2 * hgmma_per_step[binary.name.rsplit("_", 1)[-1]], binary.name
        assert not wgmma_serialised(sass), f"{binary.name}: ptxas serialised the wgmmas"
        for instruction in ("wgmma.mma_async.sync.aligned", "cp.async.bulk.tensor", "setmaxnreg"):
            assert instruction in binary.ptx, f"{binary.name}: no {instruction}"
        assert "mma.sync" not in binary.ptx and not re.search(r"cp\.async\.(ca|cg)", binary.ptx), binary.name
        assert not ATOMICS.search(binary.ptx), f"{binary.name}: dQ by a separate pass needs no atomics"
    (serialised,) = hopper_backward.KERNELS["dq"].binaries(
        hopper_backward.backward_config(prob, hopper_backward.BackwardTiles(64, 128, 3, dq_overlap=True)), "dq"
    )
    assert wgmma_serialised(sass_of(serialised))


# The tiles the knobs were timed against: each head dim's last candidate, staged, neither knob on.
BASE = {head_dim: variants[-1] for head_dim, variants in hopper_backward.CANDIDATES.items()}
DQ_REDUCE = hopper_backward.BackwardTiles(64, 64, 2, dq="reduce")
BULK_REDUCE_ADD = "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32"


def hgmma_per_step(binaries: list) -> dict[str, int]:
    """HGMMA instructions per step of each kernel after the preprocess (the masked and unmasked steps are
    two copies of the loop body)."""
    return {binary.name.rsplit("_", 1)[-1]: sass_of(binary).count("HGMMA.") // 2 for binary in binaries[1:]}


@pytest.mark.xdist_group(HOPPER_GROUP)
@pytest.mark.cute_compile
@pytest.mark.static
@pytest.mark.parametrize("head_dim", hopper_backward.HEAD_DIMS, ids=lambda d: f"d{d}")
def test_hopper_dq_reduce_computes_dq_in_the_dkdv_kernel(head_dim: int) -> None:
    """dq="reduce" with every compile-time feature on: after the preprocess, the dK/dV kernel with dQ and
    the postprocess, no spills. Per step the dK/dV kernel runs five products in wgmma, 64 · 64 · D
    multiply-adds each per warpgroup (Sᵀ and dPᵀ: D/16 k-steps; dV and dK: 4; dQ = dS K over both
    warpgroups' 128 keys at D/2 columns: 2 · 4), none serialised, dS shared by stmatrix, dQ leaving by one
    bulk reduce-add per warpgroup and no atomics; the postprocess has no product. Planted: the default
    runs four products per step in its dK/dV kernel and three more in its dQ kernel."""
    causal, alignment, kv_heads, has_dlse = VARIANTS["causal_bottom_right_mqa_dlse"]
    prob = problem(1000, 777, head_dim, causal=causal, alignment=alignment, kv_heads=kv_heads)
    binaries = hopper_binaries(prob, has_dlse, DQ_REDUCE)
    assert [binary.name.rsplit("_", 1)[-1] for binary in binaries] == ["preprocess", "dkdv", "postprocess"]
    k_steps = head_dim // 16
    assert hgmma_per_step(binaries) == {"dkdv": 2 * k_steps + 4 + 4 + 2 * 4, "postprocess": 0}
    dkdv, postprocess = binaries[1:]
    assert sass_of(dkdv).count(f"HGMMA.64x{head_dim // 2}x16") == 2 * 2 * 4 + 2 * 2 * k_steps * (head_dim == 128)
    for binary in (dkdv, postprocess):
        for usage in cubin_resources(binary.cubin).values():
            spills = usage["stack_bytes"] + usage["local_bytes"]
            assert spills == 0, f"{binary.name} {prob.describe()}: {usage['registers']} registers, {spills} B spilled"
        assert not ATOMICS.search(binary.ptx), f"{binary.name}: dQ is added by bulk reduce-adds, not atomics"
    assert not wgmma_serialised(sass_of(dkdv)), "ptxas serialised the wgmmas"
    assert dkdv.ptx.count(BULK_REDUCE_ADD) == hopper_dq.CONSUMER_WARPGROUPS and "stmatrix" in dkdv.ptx
    default = hopper_binaries(prob, has_dlse, hopper_backward.CANDIDATES[head_dim][0])
    assert hgmma_per_step(default) == {"dkdv": 2 * k_steps + 4 + 4, "dq": hgmma_per_step(default)["dq"]}
    assert not any(BULK_REDUCE_ADD in binary.ptx for binary in default)


def schedule_errors(rule) -> list[tuple]:
    """Where ``rule`` (``query_block_range``'s signature) misplans a key block's query blocks: a block
    outside [m_block_min, m_block_max) whose rows see one of the keys, or a block from m_block_unmasked on
    with a (row < Sq, key) pair the mask would have hidden (a key past Sk, or past the causal diagonal)."""
    errors = []
    tile_n = 128
    for seqlen_q, seqlen_k, causal, bottom_right, tile_m in itertools.product(
        (1, 37, 64, 77, 300, 1000), (1, 37, 128, 300, 1000), (False, True), (False, True), (32, 64, 80, 128)
    ):
        offset = seqlen_k - seqlen_q if bottom_right else 0
        for n_start in range(0, seqlen_k, tile_n):
            low, unmasked, high = rule(n_start, tile_n, tile_m, seqlen_q, seqlen_k, causal, offset)
            for m_block in range(-(-seqlen_q // tile_m)):
                first_row, last_row = m_block * tile_m, min((m_block + 1) * tile_m, seqlen_q) - 1
                last_key = n_start + tile_n - 1
                any_visible = not causal or n_start <= last_row + offset
                all_visible = last_key < seqlen_k and (not causal or last_key <= first_row + offset)
                if (any_visible and not low <= m_block < high) or (unmasked <= m_block < high and not all_visible):
                    errors.append((seqlen_q, seqlen_k, causal, bottom_right, tile_m, n_start, m_block))
    return errors


# The tma_rows candidates, once each (a variant of both head dims is one value).
TMA_ROWS = list(
    dict.fromkeys(tiles for variants in hopper_backward.CANDIDATES.values() for tiles in variants if tiles.tma_rows)
)
# A load from global memory in SASS (LDG.E...), not a TMA load (UTMALDG).
GLOBAL_LOAD = re.compile(r"(?<![A-Z])LDG\.")


@pytest.mark.xdist_group(HOPPER_GROUP)
@pytest.mark.cute_compile
@pytest.mark.static
@pytest.mark.parametrize("head_dim", hopper_backward.HEAD_DIMS, ids=lambda d: f"d{d}")
def test_hopper_tma_rows_load_lse_and_d_by_tma_only(head_dim: int) -> None:
    """tma_rows with every compile-time feature on: the dK/dV kernel compiles without spills, its wgmmas
    not serialised, the same products per step as dq="reduce"; its only loads from global memory are TMA
    (two more 3-D boxes per ring slot, LSE₂ and D), the step reads them from shared memory, and its
    unmasked step is at least 100 SASS instructions shorter. Planted: dq="reduce" alone reads LSE₂ and D
    from HBM in every step (LDG in its loop), which fails the rule."""
    causal, alignment, kv_heads, has_dlse = VARIANTS["causal_bottom_right_mqa_dlse"]
    prob = problem(1000, 777, head_dim, causal=causal, alignment=alignment, kv_heads=kv_heads)
    tiles = next(tiles for tiles in TMA_ROWS if tiles.stages == 2)
    binaries = hopper_binaries(prob, has_dlse, tiles)
    default = hopper_binaries(prob, has_dlse, DQ_REDUCE)
    assert hgmma_per_step(binaries) == hgmma_per_step(default)
    dkdv, default_dkdv = binaries[1], default[1]
    for usage in cubin_resources(dkdv.cubin).values():
        assert usage["stack_bytes"] + usage["local_bytes"] == 0, f"{dkdv.name} {prob.describe()}: {usage}"
    sass, default_sass = sass_of(dkdv), sass_of(default_dkdv)
    assert not wgmma_serialised(sass), "ptxas serialised the wgmmas"
    assert not GLOBAL_LOAD.search(sass), "LSE₂ and D still read from global memory"
    assert sass.count("UTMALDG.3D") == 2 and default_sass.count("UTMALDG.3D") == 0
    assert "LDS.64" in sass
    assert GLOBAL_LOAD.search(default_sass), "planted: the HBM reads are what the rule detects"
    assert len(unmasked_step(default_sass)) - len(unmasked_step(sass)) >= 100


def unmasked_step(sass: str) -> list[str]:
    """The SASS instructions of the shortest loop holding HGMMAs: the unmasked dK/dV step."""
    instructions = [(int(at, 16), text) for at, text in re.findall(r"/\*([0-9a-f]{4,})\*/\s+(\S[^;]*);", sass)]
    loops = [
        (int(target.group(1), 16), at)
        for at, text in instructions
        if (target := re.search(r"\bBRA\s+0x([0-9a-f]+)", text)) and int(target.group(1), 16) < at
    ]
    bodies = [[text for at, text in instructions if start <= at <= end] for start, end in loops]
    return min((body for body in bodies if any("HGMMA" in text for text in body)), key=len)


DRAIN = "WARPGROUP.DEPBAR.LE gsb0, 0x0"


@pytest.mark.cute_compile
@pytest.mark.static
def test_hopper_dq_reduce_overlaps_dk_with_the_next_step_at_d64_only() -> None:
    """dq="reduce" with dkdv_overlap (the D=64 tma_rows candidate), every compile-time feature on: no
    spills, wgmmas not serialised, and the unmasked step never waits for all its wgmmas (no drain in its
    loop): its dK retires under the next step's Sᵀ and dPᵀ. Planted: the non-overlapped variant drains
    every step; the same kernel at D=128 is serialised by ptxas (why it is a D=64 candidate only)."""
    causal, alignment, kv_heads, has_dlse = VARIANTS["causal_bottom_right_mqa_dlse"]
    (overlapped,) = [tiles for tiles in TMA_ROWS if tiles.dkdv_overlap]
    assert overlapped in hopper_backward.CANDIDATES[64] and overlapped not in hopper_backward.CANDIDATES[128]
    sass = {}
    for head_dim, tiles in ((64, overlapped), (64, replace(overlapped, dkdv_overlap=False)), (128, overlapped)):
        prob = problem(1000, 777, head_dim, causal=causal, alignment=alignment, kv_heads=kv_heads)
        dkdv = hopper_backward.compile_sm90(prob, has_dlse=has_dlse, tiles=tiles)[1]
        sass[head_dim, tiles.dkdv_overlap] = sass_of(dkdv)
        if head_dim == 64:
            for usage in cubin_resources(dkdv.cubin).values():
                assert usage["stack_bytes"] + usage["local_bytes"] == 0, f"{tiles.label}: {usage}"
    assert not wgmma_serialised(sass[64, True]) and DRAIN not in " ".join(unmasked_step(sass[64, True]))
    assert DRAIN in " ".join(unmasked_step(sass[64, False]))
    assert wgmma_serialised(sass[128, True])


# FlashAttention-3's D=64 step: 128 query rows, dQ in the dK/dV kernel (the only 128-row candidate).
(DQ_REDUCE_128,) = [
    tiles
    for tiles in TMA_ROWS
    if tiles.tile_m == 128 and not (tiles.heaviest_first or tiles.staged_epilogue or tiles.zero_in_preprocess)
]


def spilled_bytes(binary) -> int:
    return sum(usage["stack_bytes"] + usage["local_bytes"] for usage in cubin_resources(binary.cubin).values())


@pytest.mark.xdist_group(HOPPER_GROUP)
@pytest.mark.cute_compile
@pytest.mark.static
def test_hopper_dq_reduce_128_rows_at_d64(monkeypatch: pytest.MonkeyPatch) -> None:
    """dq="reduce" at 128 query rows per step (D=64 only), every compile-time feature on: no spills, wgmmas
    not serialised, five products per step in 32 HGMMAs (Sᵀ and dPᵀ m64n128 over D/16 k-steps, dV and dK
    over 8, each warpgroup's dQ m64n64 over 2 × 4: its 64 query rows, every column), each warpgroup's dQ
    tile leaving by one bulk reduce-add; at D=128 it is refused. Planted:
    LSE₂ and D held in registers for all 32 of a thread's columns (``hopper_rows.HELD_COLUMNS``) spill."""
    causal, alignment, kv_heads, has_dlse = VARIANTS["causal_bottom_right_mqa_dlse"]
    prob = problem(1000, 777, 64, causal=causal, alignment=alignment, kv_heads=kv_heads)
    assert DQ_REDUCE_128 in hopper_backward.CANDIDATES[64] and DQ_REDUCE_128 not in hopper_backward.CANDIDATES[128]
    binaries = hopper_binaries(prob, has_dlse, DQ_REDUCE_128)
    assert hgmma_per_step(binaries) == {"dkdv": 2 * 4 + 8 + 8 + 2 * 4, "postprocess": 0}
    dkdv = binaries[1]
    sass = sass_of(dkdv)
    assert sass.count("HGMMA.64x128x16") == 2 * 2 * 4
    assert [spilled_bytes(binary) for binary in binaries[1:]] == [0, 0]
    assert not wgmma_serialised(sass), "ptxas serialised the wgmmas"
    assert dkdv.ptx.count(BULK_REDUCE_ADD) == hopper_dq.CONSUMER_WARPGROUPS and not ATOMICS.search(dkdv.ptx)
    with pytest.raises(ValueError, match="D=64 only"):  # its shared memory would not fit at D=128
        hopper_backward.compile_sm90(problem(300, 300, 128), tiles=DQ_REDUCE_128)
    monkeypatch.setattr(hopper_rows, "HELD_COLUMNS", 32)
    planted = hopper_backward.compile_sm90(prob, has_dlse=has_dlse, tiles=DQ_REDUCE_128)[1]
    assert spilled_bytes(planted) > 0 or wgmma_serialised(sass_of(planted))


# FlashAttention-4's non-causal D=128 step: 80 query rows, dQ transposed (the only 80-row candidate).
(DQ_REDUCE_80,) = [tiles for tiles in TMA_ROWS if tiles.tile_m == 80 and not tiles.late_dv]


@pytest.mark.cute_compile
@pytest.mark.static
@pytest.mark.parametrize("variant", ["full_mha", "causal_bottom_right_mqa_dlse"])
def test_hopper_dq_reduce_80_rows_at_d128(monkeypatch: pytest.MonkeyPatch, variant: str) -> None:
    """dq="reduce" at 80 query rows per step (D=128 only), without and with every compile-time feature: no
    spills, wgmmas not serialised, five products per step in 34 HGMMAs (Sᵀ and dPᵀ m64n80 over D/16 k-steps,
    dV and dK m64n128 over 80/16, each warpgroup's dQᵀ m64n80 over 2 × 4: its 64 rows of D, every query),
    each warpgroup's dQᵀ tile leaving by one bulk reduce-add; at D=64 it is refused. Planted: without LSE₂
    in Sᵀ's accumulator and dSᵀ from the 16-bit Pᵀ (``hopper_rows.lse_in_accumulator``) ptxas serialises the
    wgmmas or spills."""
    causal, alignment, kv_heads, has_dlse = VARIANTS[variant]
    prob = problem(1000, 777, 128, causal=causal, alignment=alignment, kv_heads=kv_heads)
    assert DQ_REDUCE_80 in hopper_backward.CANDIDATES[128] and DQ_REDUCE_80 not in hopper_backward.CANDIDATES[64]
    binaries = hopper_backward.compile_sm90(prob, has_dlse=has_dlse, tiles=DQ_REDUCE_80)
    assert hgmma_per_step(binaries) == {"dkdv": 8 + 8 + 5 + 5 + 2 * 4, "postprocess": 0}
    dkdv = binaries[1]
    sass = sass_of(dkdv)
    assert sass.count("HGMMA.64x80x16") == 2 * (8 + 8 + 2 * 4) and sass.count("HGMMA.64x128x16") == 2 * (5 + 5)
    assert [spilled_bytes(binary) for binary in binaries[1:]] == [0, 0]
    assert not wgmma_serialised(sass), "ptxas serialised the wgmmas"
    assert dkdv.ptx.count(BULK_REDUCE_ADD) == hopper_dq.CONSUMER_WARPGROUPS and not ATOMICS.search(dkdv.ptx)
    with pytest.raises(ValueError, match="D=128 only"):
        hopper_backward.compile_sm90(problem(300, 300, 64), tiles=DQ_REDUCE_80)
    monkeypatch.setattr(hopper_rows, "lse_in_accumulator", lambda tile_m: False)
    planted = hopper_backward.compile_sm90(prob, has_dlse=has_dlse, tiles=DQ_REDUCE_80)[1]
    assert spilled_bytes(planted) > 0 or wgmma_serialised(sass_of(planted))


# A global-memory access in SASS and its width suffix (LDG.E.128, STG.E.U16, ...).
GLOBAL_ACCESS = re.compile(r"(?<![A-Z])(LDG|STG)\.E(?:\.(\w+))?")


@pytest.mark.cute_compile
@pytest.mark.static
@pytest.mark.parametrize("head_dim", hopper_backward.HEAD_DIMS, ids=lambda d: f"d{d}")
def test_hopper_dq_postprocess_moves_16_bytes_an_access(head_dim: int) -> None:
    """The causal default's postprocess (``hopper_dq.store_quad_rows``) reads dQaccum and writes dQ in 16-byte
    accesses only: per thread, columns / 32 (quad, vector) groups of four loads and two row stores (columns =
    64 for both defaults). At D=128 the 80-row candidate's transposed one (``hopper_dq.store_transposed``)
    too: its 10 vectors of the dQᵀ fragment loaded, 5 transposed stmatrix, 5 row pieces read back from shared
    memory and stored. Planted: a kernel storing through the MMA's partition (the dK/dV kernel without the
    staged epilogue; the postprocess's way before store_quad_rows, 139 µs against FlashAttention-4's 49 at B=8
    S=2048, results/h200/backward-kernels-2026-11-30/) writes two bytes a store."""
    prob = problem(1000, 777, head_dim, causal=True)
    postprocess = hopper_backward.compile_sm90(prob, tiles=hopper_backward.default_tiles(head_dim, prob.causal))[-1]
    accesses = [match.groups() for match in GLOBAL_ACCESS.finditer(sass_of(postprocess))]
    groups = hopper_dq.dq_columns(head_dim, hopper_backward.default_tiles(head_dim, prob.causal).tile_m) // 32
    assert sorted(accesses) == [("LDG", "128")] * 4 * groups + [("STG", "128")] * 2 * groups
    if head_dim == 128:
        transposed = sass_of(hopper_backward.compile_sm90(prob, tiles=DQ_REDUCE_80)[-1])
        accesses = [match.groups() for match in GLOBAL_ACCESS.finditer(transposed)]
        assert sorted(accesses) == [("LDG", "128")] * 10 + [("STG", "128")] * 5
        assert transposed.count("STSM.16.MT88.4") == 5 and transposed.count("LDS.128") == 5
    accumulator_store = hopper_backward.CANDIDATES[head_dim][-2]
    assert not accumulator_store.staged_epilogue
    planted = hopper_backward.compile_sm90(prob, tiles=accumulator_store)[1]
    assert ("STG", "U16") in {match.groups() for match in GLOBAL_ACCESS.finditer(sass_of(planted))}


@pytest.mark.cute_compile
@pytest.mark.static
def test_hopper_dq_reduce_80_rows_fit_an_sm90_cta() -> None:
    """At 80 query rows the dK/dV kernel's shared memory (two ring slots of Q, dO, LSE₂ and D; K and V; the
    dS buffers and the dQᵀ staging) fits what an sm_90 CTA may use. Planted: a third ring slot does not."""
    prob = problem(1000, 777, 128)
    fits, third_slot = (dkdv_shared_bytes(prob, tiles) for tiles in (DQ_REDUCE_80, replace(DQ_REDUCE_80, stages=3)))
    assert fits <= SM90_SHARED_MEMORY_BYTES < third_slot, (fits, third_slot)


def dkdv_shared_bytes(prob: Problem, tiles: hopper_backward.BackwardTiles) -> int:
    """The dynamic shared memory the dK/dV kernel of ``tiles`` asks for at launch (sized while it is traced)."""
    config = hopper_backward.backward_config(prob, tiles)
    kernel = hopper_backward._DKDVKernel(config)
    fakes = hopper_backward._fake_dkdv_arguments(config)
    compile_cute_sm90(kernel, *fakes, name="dkdv", threads=kernel.threads_per_cta, options=(cute.EnableTVMFFI,))
    return kernel.shared_storage.size_in_bytes()


def _heaviest_first_order(rule, grid: tuple[int, int, int], wave_ctas: int) -> list[tuple[int, int, int]]:
    """The (block, head, batch) each CTA takes under ``rule``, in the launch order (block fastest)."""
    blocks, heads, batches = grid
    return [
        rule(block, head, batch, wave_ctas, grid)
        for batch in range(batches)
        for head in range(heads)
        for block in range(blocks)
    ]


def _heaviest_first_errors(rule) -> list[str]:
    """Where ``rule`` (``heaviest_first``'s signature) is no bijection of the grid, or does not launch each
    group of items (the power of two that first fills the wave) block-major, on Python ints."""
    errors = []
    for grid in ((5, 3, 3), (8, 2, 1), (1, 4, 2), (7, 1, 5), (64, 16, 2), (16, 16, 8)):
        for wave in (1, 10, 16, 132):
            order = _heaviest_first_order(rule, grid, wave)
            if sorted(order) != sorted(itertools.product(range(grid[0]), range(grid[1]), range(grid[2]))):
                errors.append(f"grid {grid}, wave {wave}: not a bijection")
                continue
            size, items = 1 << (-(-wave // grid[0]) - 1).bit_length(), grid[1] * grid[2]
            for first in range(0, items, size):
                launched = order[first * grid[0] : min(first + size, items) * grid[0]]
                if [block for block, _, _ in launched] != sorted(block for block, _, _ in launched):
                    errors.append(f"grid {grid}, wave {wave}: items {first}.. not block-major")
    return errors


def _heaviest_first_full_groups_only(block, head, batch, wave_ctas, grid):
    """A planted bug: the last group sized as a full one (its blocks then land on items past the grid)."""
    blocks, heads, _ = grid
    size = 1 << (-(-wave_ctas // blocks) - 1).bit_length()
    linear = block + blocks * (head + heads * batch)
    first = linear // (size * blocks) * size
    within = linear - first * blocks
    item = first + within % size
    return within // size, item % heads, item // heads


def test_heaviest_first_is_a_block_major_bijection_of_the_grid() -> None:
    """``heaviest_first`` (on Python ints) maps every grid onto itself and launches each group of items
    block-major, groups of the power of two of items that first fills a wave: four items of 64 key blocks at
    P1 on 132 SMs, one item where its blocks fill the wave alone (the grid's own order). Planted: a rule that
    sizes the last group as a full one fails."""
    assert _heaviest_first_errors(heaviest_first) == []
    assert _heaviest_first_order(heaviest_first, (5, 3, 2), 5) == [
        (block, head, batch) for batch in range(2) for head in range(3) for block in range(5)
    ]
    p1 = _heaviest_first_order(heaviest_first, (64, 16, 2), 132)
    assert p1[:5] == [(0, 0, 0), (0, 1, 0), (0, 2, 0), (0, 3, 0), (1, 0, 0)]
    assert _heaviest_first_order(heaviest_first, (132, 3, 1), 132)[:2] == [(0, 0, 0), (1, 0, 0)]
    assert _heaviest_first_errors(_heaviest_first_full_groups_only)


@pytest.mark.cute_compile
@pytest.mark.static
def test_hopper_heaviest_first_remaps_only_the_causal_launch() -> None:
    """The heaviest-first candidates compile without spills; causal, the dK/dV kernel reads the grid's size
    (``%nctaid``: the remap), not where every block's work is the same (non-causal: the default's order)."""
    for head_dim in hopper_backward.HEAD_DIMS:
        causal_default = hopper_backward.default_tiles(head_dim, causal=True)
        ordered = replace(
            causal_default, heaviest_first=True, staged_epilogue=False, late_dv=False, rebased_operands=False,
            zero_in_preprocess=False, dependent_launch=False, postprocess_reversed=False,
        )  # fmt: skip
        assert ordered in hopper_backward.CANDIDATES[head_dim]
        for causal in (True, False):
            prob = problem(1000, 777, head_dim, causal=causal, alignment="bottom_right", kv_heads=2)
            (dkdv,) = [b for b in hopper_backward.compile_sm90(prob, tiles=ordered) if b.name.endswith("dkdv")]
            assert ("nctaid" in dkdv.ptx) == causal, (head_dim, causal)
            for usage in cubin_resources(dkdv.cubin).values():
                assert usage["stack_bytes"] + usage["local_bytes"] == 0, f"{dkdv.name}: {usage}"


def test_hopper_dkdv_query_blocks_cover_every_visible_pair_and_mask_where_needed() -> None:
    """The dK/dV kernel's query blocks per key block (``query_block_range``, on Python ints), against the
    definition, over ragged lengths, both alignments and Sq ≷ Sk. Planted: one block too few, and one
    diagonal block left unmasked, both fail."""
    assert schedule_errors(query_block_range) == []

    def one_block_short(*args):
        low, unmasked, high = query_block_range(*args)
        return low + 1, max(unmasked, low + 1), high

    def diagonal_unmasked(*args):
        low, unmasked, high = query_block_range(*args)
        return low, max(unmasked - 1, low), high

    assert schedule_errors(one_block_short) and schedule_errors(diagonal_unmasked)


@cute.jit
def _transposed_layout_strings(rows: cutlass.Constexpr, head_dim: cutlass.Constexpr, found: cutlass.Constexpr):
    k_major, mn_major = streamed_layouts(cutlass.BFloat16, rows, head_dim, 2)
    found.append((str(k_major.inner), str(cute.select(k_major.outer, mode=[1, 0, 2]))))
    found.append((str(mn_major.inner), str(mn_major.outer)))
    found.append((str(k_major.inner), str(k_major.outer)))


@pytest.mark.parametrize("head_dim", hopper_backward.HEAD_DIMS, ids=lambda d: f"d{d}")
def test_hopper_reads_one_ring_tile_through_two_layouts_of_the_same_bytes(head_dim: int) -> None:
    """sQt, sdOt and sKt are the MN-major layouts over the K-major tiles' bytes: exactly the K-major
    layout with its two modes swapped, swizzle included (else a B operand would read other elements)."""
    for rows in {tiles.tile_m for tiles in hopper_backward.CANDIDATES[head_dim]} | {64, 128}:
        found: list = []
        _transposed_layout_strings(rows, head_dim, found)
        assert found[0] == found[1], (rows, head_dim, found)
        # Planted: the K-major layout without the swap is not the MN-major one.
        assert found[2] != found[1], (rows, head_dim, found)


@cute.jit
def _dq_layout_strings(head_dim: cutlass.Constexpr, tile_m: cutlass.Constexpr, found: cutlass.Constexpr):
    """(written with its modes swapped, read, written as is) for the dS buffers, then for the K tiles."""
    written, read = hopper_dq.ds_layouts(cutlass.BFloat16, tile_m)
    keys = fixed_layout(cutlass.BFloat16, head_dim, hopper_dq.CONSUMER_WARPGROUPS)
    keys_t = hopper_dq.keys_mn_major(cutlass.BFloat16, head_dim)
    for layout, transposed in ((written, read), (keys, keys_t)):
        found.append((str(layout.inner), str(cute.select(layout.outer, mode=[1, 0, 2]))))
        found.append((str(transposed.inner), str(transposed.outer)))
        found.append((str(layout.inner), str(layout.outer)))


@pytest.mark.parametrize("tile_m", [64, 80, 128], ids=lambda m: f"m{m}")
@pytest.mark.parametrize("head_dim", hopper_backward.HEAD_DIMS, ids=lambda d: f"d{d}")
def test_hopper_dq_reduce_reads_ds_and_k_through_transposed_layouts_of_the_same_bytes(
    head_dim: int, tile_m: int
) -> None:
    """dq="reduce": the dS buffers (64 keys × 64, 80 or 128 queries) are written as dSᵀ and read as dS, the K
    tiles loaded for Sᵀ = K Qᵀ read as dQ's MN-major B operand: each read layout is its written layout
    with the modes swapped, swizzle included. Planted: the written layouts without the swap are not the
    read ones."""
    found: list = []
    _dq_layout_strings(head_dim, tile_m, found)
    for swapped, read, unswapped in (found[:3], found[3:]):
        assert swapped == read, (head_dim, found)
        assert unswapped != read, (head_dim, found)


# ----------------------------------------------------------------------------------------------
# What the rung refuses, and why
# ----------------------------------------------------------------------------------------------
@pytest.fixture
def hopper(monkeypatch: pytest.MonkeyPatch) -> torch.device:
    """A CUDA device that reports sm_90, for the capability check without a GPU."""
    monkeypatch.setattr(capability, "_architecture", lambda device: (9, 0))
    return torch.device("cuda")


def test_supports_every_feature_it_implements(hopper: torch.device) -> None:
    for head_dim in tiled.HEAD_DIMS:
        for dtype in CUTE_DTYPES:
            prob = problem(77, 1000, head_dim, causal=True, alignment="bottom_right", kv_heads=1).with_(dtype=dtype)
            assert tiled.supports(prob, hopper) == (True, "")
            assert tiled.supports(prob.with_(return_lse=True), hopper) == (True, "")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"head_dim": 256}, "head_dim"),
        ({"dtype": torch.float32}, "dtypes"),
        ({"has_cache_seqlens": True}, "cache_seqlens"),
        ({"softmax_scale": -1.0}, "softmax_scale"),
    ],
    ids=["d256", "fp32", "cache_seqlens", "negative_scale"],
)
def test_refuses_what_it_cannot_differentiate(hopper: torch.device, change: dict, reason: str) -> None:
    prob = problem(64, 64, 128).with_(**change)
    ok, why = tiled.BACKWARD.check(prob, hopper)
    assert not ok and reason in why
    if change != {"softmax_scale": -1.0}:  # naive takes any scale: P is masked to 0, not -inf
        ok, why = naive.BACKWARD.check(prob, hopper)
        assert not ok and reason in why


def test_refuses_a_cpu_and_an_old_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    ok, why = tiled.BACKWARD.check(problem(64, 64, 128), torch.device("cpu"))
    assert not ok and "CUDA GPU" in why
    monkeypatch.setattr(capability, "_architecture", lambda device: (7, 5))
    ok, why = tiled.supports(problem(64, 64, 128), torch.device("cuda"))
    assert not ok and "sm_80" in why


def test_hopper_supports_sm90_only_with_every_feature_it_implements(monkeypatch: pytest.MonkeyPatch) -> None:
    """On an sm_90 device (faked) it takes fp16/bf16, D 64 and 128, GQA/MQA, both alignments and the LSE;
    it refuses what tiled refuses (cache_seqlens, D=256, fp32, a negative scale), sm_80 and the CPU."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(capability, "_architecture", lambda device: (9, 0))
    cuda = torch.device("cuda")
    for head_dim in hopper_backward.HEAD_DIMS:
        for dtype in CUTE_DTYPES:
            prob = problem(77, 1000, head_dim, causal=True, alignment="bottom_right", kv_heads=1).with_(dtype=dtype)
            assert hopper_backward.supports(prob.with_(return_lse=True), cuda) == (True, "")
    refusals = {"head_dim": 256, "dtype": torch.float32, "has_cache_seqlens": True, "softmax_scale": -1.0}
    reasons = {
        "head_dim": "head_dim",
        "dtype": "dtypes",
        "has_cache_seqlens": "cache_seqlens",
        "softmax_scale": "softmax_scale",
    }
    for field, value in refusals.items():
        ok, why = hopper_backward.BACKWARD.check(problem(64, 64, 128).with_(**{field: value}), cuda)
        assert not ok and reasons[field] in why, why
    ok, why = hopper_backward.supports(problem(64, 64, 128), torch.device("cpu"))
    assert not ok and "CUDA" in why, why
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    ok, why = hopper_backward.supports(problem(64, 64, 128), cuda)
    assert not ok and "sm_90" in why, why


def test_hopper_overlapped_tiles_refuse_a_single_ring_slot() -> None:
    """Overlapped steps free a slot one step late: with one slot the producer would wait forever."""
    for overlap in ({"dkdv_overlap": True}, {"dq_overlap": True}):
        with pytest.raises(ValueError, match="two ring slots"):
            hopper_backward.BackwardTiles(64, 64, 1, **overlap)
        assert hopper_backward.BackwardTiles(64, 64, 2, **overlap).label.endswith("overlap")
    assert hopper_backward.BackwardTiles(64, 64, 1).label == "m64_dqn64_s1"


def test_hopper_dq_reduce_refuses_what_it_is_not_built_for() -> None:
    """dq="reduce" takes 64, 80 or 128 query rows per step (one or two m64 dQ tiles, or at 80 rows dQᵀ) and
    no dQ kernel to overlap (its dK may overlap the next step); an unknown dq mode is refused, and 80 rows
    without dq="reduce" and tma_rows. Its label names the mode, not the unused dQ kernel's tile."""
    for tiles in ({"tile_m": 32}, {"tile_m": 96}, {"dq_overlap": True}):
        with pytest.raises(ValueError, match="dq='reduce'"):
            hopper_backward.BackwardTiles(**({"tile_m": 64, "dq_tile_n": 64, "stages": 2} | tiles), dq="reduce")
    with pytest.raises(ValueError, match="'pass' or 'reduce'"):
        hopper_backward.BackwardTiles(64, 64, 2, dq="atomic")
    # 80 rows seed Sᵀ with the staged LSE₂ and compute dQᵀ: dq="reduce" with tma_rows, not overlapped, only.
    for tiles in ({"dq": "pass"}, {"tma_rows": False}, {"dkdv_overlap": True}):
        with pytest.raises(ValueError, match="80 query rows"):
            hopper_backward.BackwardTiles(**({"tile_m": 80, "dq_tile_n": 64, "stages": 2, "dq": "reduce",
                                              "tma_rows": True} | tiles))  # fmt: skip
    assert DQ_REDUCE_80.label == "m80_s2_dqreduce_tmarows"
    assert DQ_REDUCE.label == "m64_s2_dqreduce"
    overlapped = hopper_backward.BackwardTiles(64, 64, 3, dkdv_overlap=True, dq="reduce")
    assert overlapped.label == "m64_s3_dqreduce_dkdvoverlap"
    assert all(DQ_REDUCE in variants for variants in hopper_backward.CANDIDATES.values())
    assert all(variants[0].dq == "pass" for variants in hopper_backward.CANDIDATES.values())


def test_hopper_tma_rows_is_the_default_and_the_deterministic_switch_leaves_it() -> None:
    """The measured defaults (results/h200/backward-cute-tma-rows/, backward-cute-d64-m128/,
    backward-staged-epilogue/): LSE₂ and D by TMA, at D=64 128 query rows a step, dK and dV by TMA stores;
    under deterministic algorithms the separate dQ pass, without."""
    assert {tiles.label for tiles in TMA_ROWS} == {
        "m64_s2_dqreduce_tmarows",
        "m128_s2_dqreduce_tmarows",
        "m64_s3_dqreduce_dkdvoverlap_tmarows",
        "m80_s2_dqreduce_tmarows",
        "m64_s2_dqreduce_tmarows_heaviestfirst",
        "m128_s2_dqreduce_tmarows_heaviestfirst",
        "m128_s2_dqreduce_tmarows_stagedepi",
        "m64_s2_dqreduce_tmarows_heaviestfirst_stagedepi",
        "m128_s2_dqreduce_tmarows_stagedepi_zeropre",
        "m64_s2_dqreduce_tmarows_heaviestfirst_stagedepi_zeropre",
        "m128_s2_dqreduce_tmarows_stagedepi_latedv",
        "m80_s2_dqreduce_tmarows_stagedepi_latedv",
        "m64_s2_dqreduce_tmarows_heaviestfirst_stagedepi_latedv",
        "m128_s2_dqreduce_tmarows_stagedepi_rebase",
        "m128_s2_dqreduce_tmarows_stagedepi_latedv_rebase",
        "m80_s2_dqreduce_tmarows_stagedepi_latedv_rebase",
        "m64_s2_dqreduce_tmarows_heaviestfirst_stagedepi_rebase",
        "m64_s2_dqreduce_tmarows_heaviestfirst_stagedepi_latedv_pdl",
        "m64_s2_dqreduce_tmarows_heaviestfirst_stagedepi_zeropre_latedv_pdl",
        "m64_s2_dqreduce_tmarows_heaviestfirst_stagedepi_zeropre_latedv_pdl_postrev",
    }
    defaults = {key: hopper_backward.default_tiles(*key).label for key in hopper_backward.DEFAULTS}
    assert defaults == {
        (64, False): "m128_s2_dqreduce_tmarows_stagedepi_latedv_rebase",
        (64, True): "m128_s2_dqreduce_tmarows_stagedepi_latedv_rebase",
        (128, False): "m80_s2_dqreduce_tmarows_stagedepi_latedv_rebase",
        (128, True): "m64_s2_dqreduce_tmarows_heaviestfirst_stagedepi_zeropre_latedv_pdl_postrev",
    }
    assert all(tiles in hopper_backward.CANDIDATES[key[0]] for key, tiles in hopper_backward.DEFAULTS.items())
    torch.use_deterministic_algorithms(True)
    try:
        assert all(hopper_backward.default_tiles(*key).dq == "pass" for key in hopper_backward.DEFAULTS)
    finally:
        torch.use_deterministic_algorithms(False)
    assert hopper_backward.BackwardTiles(64, 64, 2, tma_rows=True).label == "m64_dqn64_s2_tmarows"


def test_hopper_rows_start_every_staged_slot_tma_aligned() -> None:
    """tma_rows: each ring slot's LSE₂ and D box starts 128-byte aligned in shared memory (a TMA
    destination), at every candidate's tile_m, and covers the slot's tile_m values. Planted: 80 values a
    slot packed back to back would start slot 1 320 bytes in."""
    for tile_m in {tiles.tile_m for tiles in TMA_ROWS}:
        stride = hopper_rows.stage_stride(tile_m)
        assert stride >= tile_m and stride * hopper_rows.FLOAT_BYTES % hopper_rows.TMA_SMEM_ALIGN_BYTES == 0
    assert 80 * hopper_rows.FLOAT_BYTES % hopper_rows.TMA_SMEM_ALIGN_BYTES != 0


@pytest.mark.parametrize("seqlen_q", [1, 77, 80, 1000])
def test_row_vectors_give_every_head_a_tma_aligned_row(seqlen_q: int) -> None:
    """LSE₂ and D are (B, H, Sq) views whose head rows start 16 bytes apart or a multiple of it (a TMA
    source's outer strides); the two never share storage. Planted: a contiguous (B, H, 77) tensor's
    head stride, 308 bytes, is not a multiple of 16."""
    prob = Problem(2, 3, seqlen_q, 64, 64, torch.bfloat16)
    lse2, delta = hopper_rows.row_vectors(prob, torch.device("cpu"))
    for vector in (lse2, delta):
        assert vector.shape == (2, 3, seqlen_q) and vector.dtype == torch.float32 and vector.stride(2) == 1
        assert all(stride * 4 % hopper_rows.TMA_STRIDE_BYTES == 0 for stride in vector.stride()[:2])
        assert vector.stride(1) - seqlen_q < hopper_rows.TMA_STRIDE_BYTES // 4
    assert lse2.untyped_storage().data_ptr() != delta.untyped_storage().data_ptr()
    assert torch.empty(2, 3, 77).stride(1) * 4 % hopper_rows.TMA_STRIDE_BYTES != 0


@pytest.mark.parametrize("head_dim", hopper_backward.HEAD_DIMS, ids=lambda d: f"d{d}")
def test_hopper_default_adds_dq_by_reduce_unless_deterministic_algorithms_are_on(head_dim: int) -> None:
    """The default is dq="reduce"; under torch.use_deterministic_algorithms it is the first candidate,
    the separate dQ pass (planted: a default that ignores the switch fails the second assertion)."""
    prob = problem(300, 1000, head_dim, causal=True, alignment="bottom_right", kv_heads=2)
    assert hopper_backward.backward_config(prob).tiles.dq == "reduce"
    was_on = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        deterministic = hopper_backward.backward_config(prob).tiles
    finally:
        torch.use_deterministic_algorithms(was_on)
    assert deterministic == hopper_backward.CANDIDATES[head_dim][0] and deterministic.dq == "pass"


def test_gradients_refuse_cpu_tensors_before_any_kernel() -> None:
    prob = problem(8, 8, 64)
    q = torch.zeros(1, 4, 8, 64, dtype=torch.bfloat16)
    lse = torch.zeros(1, 4, 8)
    with pytest.raises(ValueError, match=r"cute/backward/tiled cannot differentiate.*CUDA"):
        tiled.tiled_gradients(q, q, q, q, lse, q, prob)


def test_a_copy_taller_than_its_tile_is_refused() -> None:
    """256 threads copy 16 rows of D=128 per step: an 8-row tile would be overrun (the check runs before
    any MLIR is built; the 16-row tiles the rung uses compile in the static tests)."""
    with pytest.raises(ValueError, match="not multiples of the copy's 16 rows"):
        row_tile_copy(CUTE_DTYPES[torch.bfloat16], 256, 128, (8, 128))


# ----------------------------------------------------------------------------------------------
# GPU: gradients against fp64 on the shapes that probe this rung's tiles
# ----------------------------------------------------------------------------------------------
GPU_CASES = {
    # Sq > Sk bottom-right: the first 16 rows see no key (LSE -inf, P = 0); MQA sums 4 heads.
    "mqa_causal_bottom_right_sq_gt_sk_d64": problem(53, 37, 64, causal=True, alignment="bottom_right", kv_heads=1),
    # One query row against many keys, and many against one key.
    "one_query_causal_bottom_right_d128": problem(1, 77, 128, causal=True, alignment="bottom_right", kv_heads=2),
    "one_key_full_d128": problem(77, 1, 128, kv_heads=2),
    # Several key and query blocks, both tails ragged, the diagonal off the tile grid.
    "gqa_causal_top_left_ragged_d64": problem(150, 290, 64, causal=True, kv_heads=2),
    "gqa_causal_bottom_right_ragged_d128": problem(290, 150, 128, causal=True, alignment="bottom_right", kv_heads=2),
}


def gpu_inputs(prob: Problem, seed: int) -> tuple[torch.Tensor, ...]:
    q, k, v = make_inputs(prob, seed=seed, device="cuda", offset=0.5)
    generator = torch.Generator(device="cuda").manual_seed(seed + 1)
    return q, k, v, torch.randn(q.shape, generator=generator, device="cuda").to(prob.dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(GPU_CASES))
@pytest.mark.parametrize("forward", ["cute/naive", "cute/tiled", "cute/hopper"])
def test_gpu_gradients_pass_the_rule(forward: str, case: str) -> None:
    """Each backward rung through its forward, bf16 (tests/test_backward.py runs fp16 too, and pairs
    cute/pipelined with the tiled rung); cute/hopper's backward is the hopper rung."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    prob = GPU_CASES[case]
    q, k, v, d_out = gpu_inputs(prob, seed=21)
    assert_all_pass(ladder_gradients(forward, prob, q, k, v, d_out), q, k, v, d_out, prob)


@pytest.mark.gpu
@pytest.mark.parametrize("forward", ["cute/naive", "cute/tiled", "cute/hopper"])
def test_gpu_the_returned_lse_is_differentiable_too(forward: str) -> None:
    """loss = ⟨O, dO⟩ + ⟨LSE, dLSE⟩, against fp64 autograd; yardstick: dense torch in bf16."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    # Every row sees a key (dense_attention, the yardstick, has no guard for a row that sees none).
    prob = GPU_CASES["gqa_causal_top_left_ragged_d64"]
    q, k, v, d_out = gpu_inputs(prob, seed=22)
    d_lse = torch.randn(q.shape[:3], generator=torch.Generator(device="cuda").manual_seed(5), device="cuda")

    def grads_of(attend, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        out, lse = attend(*leaves)
        loss = (out.to(dtype) * d_out.to(dtype)).sum() + (lse.to(dtype) * d_lse.to(dtype)).sum()
        return torch.autograd.grad(loss, leaves)

    reference = grads_of(lambda *t: reference_attention(*t, prob, with_lse=True), torch.float64)
    yardstick = grads_of(lambda *t: dense_attention(*t, prob), prob.dtype)
    mine = grads_of(
        lambda *t: attention(*t, causal=True, impl=forward, return_lse=True),
        prob.dtype,
    )
    failed = [check.summary() for check in judge_gradients(mine, reference, yardstick) if not check.ok]
    assert not failed, "\n".join(failed)


@pytest.mark.gpu
@pytest.mark.parametrize("forward", ["cute/tiled", "cute/hopper"])
def test_gpu_gradients_are_deterministic(forward: str) -> None:
    """Under torch.use_deterministic_algorithms, two backward passes give bit-identical gradients: dQ by
    a separate pass, no atomics (cute/hopper's default otherwise, dq="reduce", adds dQ in no fixed order:
    test_gpu_dq_reduce_keeps_dk_and_dv_deterministic)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    prob = GPU_CASES["gqa_causal_top_left_ragged_d64"]
    q, k, v, d_out = gpu_inputs(prob, seed=23)
    was_on = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        first = ladder_gradients(forward, prob, q, k, v, d_out)
        second = ladder_gradients(forward, prob, q, k, v, d_out)
    finally:
        torch.use_deterministic_algorithms(was_on)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("head_dim", "tiles"),
    [(head_dim, tiles) for head_dim, variants in hopper_backward.CANDIDATES.items() for tiles in variants],
    ids=lambda value: value.label if isinstance(value, hopper_backward.BackwardTiles) else f"d{value}",
)
@pytest.mark.parametrize("case", ["ragged", "sq_gt_sk"])
def test_gpu_every_hopper_candidate_passes_the_rule(
    head_dim: int, tiles: hopper_backward.BackwardTiles, case: str
) -> None:
    """Each variant ``bench.backward --candidates --rung cute`` may make the default, bf16, GQA, causal
    bottom-right over several key and query blocks with ragged tails (Sq < Sk: key blocks without a
    query block; Sq > Sk: query CTAs whose rows see no key), from cute/hopper's O and LSE."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    seqlen_q, seqlen_k = (300, 1000) if case == "ragged" else (1000, 300)
    prob = problem(seqlen_q, seqlen_k, head_dim, causal=True, alignment="bottom_right", kv_heads=2)
    q, k, v, d_out = gpu_inputs(prob, seed=24)
    with torch.no_grad():
        out, lse = attention(q, k, v, causal=True, causal_alignment="bottom_right", impl="cute/hopper", return_lse=True)
    grads = hopper_backward.hopper_gradients(q, k, v, out, lse, d_out, prob, tiles=tiles)
    assert_all_pass(grads, q, k, v, d_out, prob)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", hopper_backward.HEAD_DIMS, ids=lambda d: f"d{d}")
def test_gpu_dq_reduce_keeps_dk_and_dv_deterministic(head_dim: int) -> None:
    """dq="reduce": dK and dV still come from registers (bit-identical over two runs); dQ's fp32 adds
    land in no fixed order, so it is only held to the rule, every run (full attention, several key blocks
    per query row: every block's dQ is added)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    prob = problem(300, 1000, head_dim, kv_heads=2)
    q, k, v, d_out = gpu_inputs(prob, seed=25)
    with torch.no_grad():
        out, lse = attention(q, k, v, impl="cute/hopper", return_lse=True)
    runs = [hopper_backward.hopper_gradients(q, k, v, out, lse, d_out, prob, tiles=DQ_REDUCE) for _ in range(2)]
    for grads in runs:
        assert_all_pass(grads, q, k, v, d_out, prob)
    assert torch.equal(runs[0][1], runs[1][1]) and torch.equal(runs[0][2], runs[1][2])


TMA_ROWS_CASES = [
    (case, tiles)
    for case, prob in GPU_CASES.items()
    for tiles in TMA_ROWS
    if tiles in hopper_backward.CANDIDATES[prob.head_dim]
]


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("case", "tiles"), TMA_ROWS_CASES, ids=[f"{case}-{tiles.label}" for case, tiles in TMA_ROWS_CASES]
)
def test_gpu_tma_rows_pass_the_rule(case: str, tiles: hopper_backward.BackwardTiles) -> None:
    """tma_rows on the shapes that probe the tiles: query tails inside a block (rows past Sq zero-filled by
    the box, so P = 1 there), Sq not a multiple of four (the padded head rows), rows that see no key,
    one query or key, MQA; from cute/hopper's O and LSE."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    prob = GPU_CASES[case]
    inputs, grads = hopper_gradients_of(prob, 26, tiles)
    assert_all_pass(grads, *inputs, prob)


def hopper_gradients_of(prob: Problem, seed: int, tiles: hopper_backward.BackwardTiles) -> tuple[tuple, tuple]:
    """``gpu_inputs`` (q, k, v, dO) and the hopper rung's (dq, dk, dv) at ``tiles`` from cute/hopper's O and LSE."""
    q, k, v, d_out = gpu_inputs(prob, seed=seed)
    with torch.no_grad():
        out, lse = attention(
            q, k, v, causal=prob.causal, causal_alignment=prob.causal_alignment, impl="cute/hopper", return_lse=True
        )
    return (q, k, v, d_out), hopper_backward.hopper_gradients(q, k, v, out, lse, d_out, prob, tiles=tiles)


def long_cases(head_dim: int) -> dict[str, Problem]:
    """Many key and query blocks per CTA at ``head_dim`` (at lengths fp64 can judge), GQA; 1999 queries end
    inside a 64-, 80- or 128-row block."""
    return {
        "gqa_full_2048": problem(2048, 2048, head_dim, kv_heads=2),
        "gqa_causal_top_left_2048": problem(2048, 2048, head_dim, causal=True, kv_heads=2),
        "gqa_causal_bottom_right_ragged": problem(
            1999, 2100, head_dim, causal=True, alignment="bottom_right", kv_heads=2
        ),
    }


def knob_cases(variants: dict[int, list]) -> list[tuple[str, Problem, hopper_backward.BackwardTiles]]:
    """(id, problem, tiles) for every candidate of ``variants`` (head dim -> candidates with a knob) on the shapes
    that probe the tiles of its head dim (``GPU_CASES``: one query or key, rows that see no key, MQA, ragged tails
    in one block), ragged causal bottom-right GQA over two batches both ways, and many blocks per CTA
    (``long_cases``)."""
    cases = []
    for head_dim, tiles_list in variants.items():
        shapes = {name: prob for name, prob in GPU_CASES.items() if prob.head_dim == head_dim}
        for seqlen_q, seqlen_k in ((300, 1000), (1000, 300)):
            shapes[f"two_batches_{seqlen_q}x{seqlen_k}"] = Problem(
                2, 4, seqlen_q, seqlen_k, head_dim, torch.bfloat16, causal=True, kv_heads=2,
                causal_alignment="bottom_right",
            )  # fmt: skip
        shapes.update(long_cases(head_dim))
        cases += [(f"{name}-{tiles.label}", prob, tiles) for name, prob in shapes.items() for tiles in tiles_list]
    return cases


# D=64: the anchor's head dim (128 rows a step); D=128: the 80-row step's.
LONG_D64_CASES = long_cases(64)


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(LONG_D64_CASES))
def test_gpu_dq_reduce_128_rows_pass_the_rule_over_many_blocks(case: str) -> None:
    """dq="reduce" at 128 query rows per step (m128_s2_dqreduce_tmarows) against fp64 by the rule, from
    cute/hopper's O and LSE, with 16 or more key blocks adding into each query block's dQ. Planted: each
    128-row block's dQ rows [64, 128) added to its rows [0, 64) and lost (what a wrong ``hopper_dq.dq_box``,
    both warpgroups on the first rows, gives) fails the rule."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    prob = LONG_D64_CASES[case]
    inputs, (dq, dk, dv) = hopper_gradients_of(prob, 27, DQ_REDUCE_128)
    assert_all_pass((dq, dk, dv), *inputs, prob)
    planted = dq.clone()
    blocks = planted[:, :, : prob.seqlen_q // 128 * 128].unflatten(2, (-1, 2, 64))  # a view of planted
    blocks[:, :, :, 0] += blocks[:, :, :, 1]
    blocks[:, :, :, 1] = 0
    with pytest.raises(AssertionError, match="dq WRONG"):
        assert_all_pass((planted, dk, dv), *inputs, prob)


LONG_D128_CASES = long_cases(128)


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(LONG_D128_CASES))
def test_gpu_dq_reduce_80_rows_pass_the_rule_over_many_blocks(case: str) -> None:
    """dq="reduce" at 80 query rows per step (m80_s2_dqreduce_tmarows: LSE₂ in Sᵀ's accumulator, dSᵀ from
    the 16-bit Pᵀ, dQᵀ per warpgroup) against fp64 by the rule, from cute/hopper's O and LSE, with 16 or
    more key blocks adding into each query block's dQ. Planted: dQ's columns [64, 128) added to its columns
    [0, 64) and lost (what a wrong ``hopper_dq.dq_box``, both warpgroups on the first half of D, gives)
    fails the rule."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    prob = LONG_D128_CASES[case]
    inputs, (dq, dk, dv) = hopper_gradients_of(prob, 28, DQ_REDUCE_80)
    assert_all_pass((dq, dk, dv), *inputs, prob)
    planted = dq.clone()
    planted[..., :64] += planted[..., 64:]
    planted[..., 64:] = 0
    with pytest.raises(AssertionError, match="dq WRONG"):
        assert_all_pass((planted, dk, dv), *inputs, prob)
