"""Issue #38's D=256 rows of 64+ packed rows in cute/decode: ``decode.WGMMA_D256`` ((64, 3) since its H200 A/B; None:
off) adds D=256 to
the head dims whose 64-row tiles run on one warpgroup's WGMMA (``cute_impl/_decode_wgmma.py``) instead of 4 warps'
mma.sync (seed 229 row 2, 256 packed rows at D=256: cute 2092.0 us against gluon's 1206.9 on an H200), on a ring of
(keys a block, stages): (64, 3), ``TILE_CONFIGS``' (the one chain a block), or (32, 6) (overlapped).

CPU: (64, 3) by default, None keeping seed 229 row 2 on the mma.sync tile; at (64, 3) its compile key and a paged ragged
shape's gain ``wgmma`` and nothing else of the plan changes (tile, M tiles, split count, slabs); at (32, 6) the ring's
blocks halve, the overlap is on and the balanced split's least share stays 512 keys; the split rule's ask reads one CTA
an SM on both rings, whose Q and ring (224 KB) leave no room for a second; D=64 and D=128 rows and D=256 rows under 64
packed rows keep their plans; other values are refused; bench/cute_decode_wgmma_d256_ab.sh's rows parse and both rings
move exactly the eleven rows of the class. Static (sm_90a): on both rings, seed 229 row 2's padded split and the paged
ragged shape's balanced split compile without spills in at most 255 registers, shared memory for one CTA an SM, and a
key loop of HGMMA with no HMMA and no ldmatrix (the 32-key ring's with the softmax under the wgmmas); off (planted: the
mma.sync tile), the key-loop rule fails. GPU (``gpu`` marker; bench/cute_decode_wgmma_d256_ab.sh): on, against fp64 on
a poisoned output over 64 to 256 packed rows at D=256, Sq 1, 4, 5 and 16, groups 8, 16 and 64, full and ragged, paged
16, 64 and 128, forced splits and the balanced split, both causal alignments, on both rings; the causal mask taking the
packed row as the token must fail the check.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter

import pytest
import torch

pytest.importorskip("cutlass")

from common.measure.decode_sweep import random_cases
from common.reporting.static import cubin_sass, loop_census, sass_loops
from cute_impl import _decode_wgmma, decode
from tests._helpers import knob_ab_problems
from tests.test_cute_decode_rows import RAGGED, _problem
from tests.test_cute_decode_wgmma import (
    _UnpackedMask,
    assert_planted_bug_fails,
    check_gpu_case,
    compile_with_shared_bytes,
)
from tests.test_cute_decode_wgmma_overlap import exp2_under_wgmma
from tests.test_cute_decode_wide_tile import (
    CTA_RESERVED_SHARED_BYTES,
    SM_SHARED_BYTES,
    _ring_and_q_bytes,
    assert_kernels_fit,
)

CPU = torch.device("cpu")
SEED229_ROW2 = random_cases(8, 229)[2].problem  # B=2 H=64 Hkv=4 Sq=16 Sk=290304 D=256: 256 packed rows, full cache
# 128 packed rows (group 16, Sq 8), paged(128) and ragged: the balanced split.
PAGED_RAGGED = _problem(4, 8, 16, 8, 13056, 256, has_cache_seqlens=True, page_size=128)
SHAPES = {"seed229-row2": SEED229_ROW2, "paged128-ragged": PAGED_RAGGED}
CHAIN, OVERLAPPED = (64, 3), (32, 6)  # WGMMA_D256's rings: TILE_CONFIGS' (the one chain a block), and 32-key blocks
RINGS = [CHAIN, OVERLAPPED]


def _plan(problem, ring: tuple[int, int] | None) -> tuple:
    """The launch plan and M tiles with ``WGMMA_D256`` at ``ring``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decode, "WGMMA_D256", ring)
        num_splits, slabs, items, config = decode.launch_plan(problem, CPU)
        return num_splits, slabs, items, config, decode.m_blocks_for(problem)


def test_the_default_is_the_chain_ring_and_none_is_the_mma_sync_tile(monkeypatch: pytest.MonkeyPatch):
    """(64, 3), as timed (both rings 0.69-0.75x the mma.sync tile's time on the class, level with each other); None
    keeps seed 229 row 2 on the mma.sync tile."""
    assert decode.WGMMA_D256 == CHAIN and set(decode.WGMMA_D256_RINGS) == set(RINGS)
    assert decode.launch_plan(SEED229_ROW2, CPU)[3].wgmma is True
    monkeypatch.setattr(decode, "WGMMA_D256", None)
    assert decode.launch_plan(SEED229_ROW2, CPU)[3].wgmma is False
    assert type(decode.decode_kernel(decode.compile_plan(SEED229_ROW2))) is decode.DecodeKernel


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_on_changes_only_the_tile_mma(shape: str):
    problem = SHAPES[shape]
    off, on = _plan(problem, None), _plan(problem, CHAIN)
    assert on[3].wgmma and not on[3].wgmma_overlap and on[3].tile_m == 64 and on[3].row_warps == 4, on[3]
    assert on[:3] + on[4:] == off[:3] + off[4:] and dataclasses.replace(on[3], wgmma=False) == off[3]
    assert isinstance(decode.decode_kernel(on[3]), _decode_wgmma.WgmmaDecodeKernel)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_32_key_ring_overlaps_and_keeps_the_split(shape: str):
    """(32, 6): the kernel's blocks are 32 keys in 6 stages, overlapped; the split count, the slabs and the M tiles
    stay, and the balanced split's least share is the same 512 keys in twice the blocks."""
    problem = SHAPES[shape]
    chain, overlapped = _plan(problem, CHAIN), _plan(problem, OVERLAPPED)
    config = overlapped[3]
    assert config.wgmma and config.wgmma_overlap and (config.shape.tile_n, config.shape.stages) == OVERLAPPED, config
    assert overlapped[:3] + overlapped[4:] == chain[:3] + chain[4:]
    assert config.balanced_min_blocks * 32 == chain[3].balanced_min_blocks * 64 == (512 if problem.paged else 0)
    unchanged = dataclasses.replace(config, shape=chain[3].shape, wgmma_overlap=False, balanced_min_blocks=0)
    assert unchanged == dataclasses.replace(chain[3], balanced_min_blocks=0)


def test_other_rings_are_refused(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(decode, "WGMMA_D256", (64, 4))  # 288 KB: past an SM's shared memory
    with pytest.raises(ValueError, match="WGMMA_D256"):
        decode.launch_plan(SEED229_ROW2, CPU)


@pytest.mark.parametrize("ring", RINGS)
def test_on_asks_the_one_cta_an_sm_that_fits(ring: tuple[int, int], monkeypatch: pytest.MonkeyPatch):
    """The WGMMA tile asks ``WGMMA_SPLIT_CTAS_PER_SM`` (2), which the split rule caps at ``CTAS_PER_SM_FIT``: D=256's
    Q and ring fit one CTA an SM's shared memory and not two, so the ask reads one (D=128's two)."""
    monkeypatch.setattr(decode, "WGMMA_D256", ring)
    config = decode.launch_plan(SEED229_ROW2, CPU)[3]
    cta_bytes = _ring_and_q_bytes(config) + CTA_RESERVED_SHARED_BYTES
    assert cta_bytes <= SM_SHARED_BYTES < 2 * cta_bytes, cta_bytes
    assert decode.WGMMA_SPLIT_CTAS_PER_SM == 2 and decode.split_policy(SEED229_ROW2).ctas_per_sm == 1
    d128 = random_cases(8, 107)[0].problem  # 256 packed rows at D=128
    assert decode.split_policy(d128).ctas_per_sm == decode.CTAS_PER_SM_FIT[128] == 2


# Problems the switch leaves: D=128's and D=64's rows of the class (their WGMMA tile already), D=256 rows under 64
# packed rows (the 32-row and the 16-row mma.sync tiles).
LEFT = {
    "d128-256rows": random_cases(8, 107)[0].problem,
    "d64-128rows": _problem(2, 4, 8, 16, 32768, 64),
    "d256-32rows": random_cases(8, 229)[3].problem,
    "d256-16rows-paged": random_cases(8, 43)[1].problem,
}


@pytest.mark.parametrize("ring", RINGS)
@pytest.mark.parametrize("case", sorted(LEFT))
def test_on_leaves_other_plans(case: str, ring: tuple[int, int]):
    assert _plan(LEFT[case], ring) == _plan(LEFT[case], None)


def test_ab_script_rows_parse_and_the_switch_moves_the_first_eleven():
    """bench/cute_decode_wgmma_d256_ab.sh's knob rows: each parses, seed 229 row 2 first, and the switch changes the
    compile key of exactly the first eleven (128-256 packed rows at D=256) on either ring; the last two are the
    controls."""
    from pathlib import Path

    script = (Path(__file__).parents[1] / "bench" / "cute_decode_wgmma_d256_ab.sh").read_text()
    assert "gpu_tests 120 tests/test_cute_decode_wgmma_d256.py" in script
    head, rows = knob_ab_problems("cute_decode_wgmma_d256_ab.sh", "wgmma_d256")
    assert head == ["180", "cute_impl.decode:WGMMA_D256", "None,(64,3),(32,6)", "cute/decode"], head
    assert rows[0] == SEED229_ROW2 and all(problem.head_dim == 256 for problem in rows)
    for ring in RINGS:
        assert [_plan(problem, ring) != _plan(problem, None) for problem in rows] == [True] * 11 + [False] * 2


# ----------------------------------------------------------------------------------------------------
# sm_90a: on, no spills, one CTA an SM, a key loop of HGMMA; off (planted), the rule fails
# ----------------------------------------------------------------------------------------------------
def assert_hgmma_key_loop(sass: str, config: decode.DecodeConfig, label: str) -> None:
    """The split kernel's key loop runs on WGMMA: a block's S is D/16 wgmma of 64 x tile_n x 16, its P V tile_n/16 of
    64 x D x 16 (two blocks an iteration overlapped), and nothing in the kernel uses mma.sync or ldmatrix."""
    census = loop_census(sass)
    blocks = 2 if config.wgmma_overlap else 1
    expected = blocks * (config.head_dim // 16 + config.shape.tile_n // 16)
    assert census is not None and census.gmma == expected, (label, census)
    loop = min((body for _, body in sass_loops(sass) if any(op.startswith("HGMMA") for op in body)), key=len)
    print(f"WGMMA_D256 {label}: {census}, {dict(Counter(op.split('.')[0] for op in loop))}")
    assert not re.search(r"\bHMMA\.|\bLDSM\b", sass), f"{label}: the split kernel's tile must not use mma.sync"


@pytest.mark.cute_compile
@pytest.mark.parametrize("ring", RINGS)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_on_compiles_spill_free_on_hgmma(shape: str, ring: tuple[int, int], monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(decode, "WGMMA_D256", ring)
    problem = SHAPES[shape]
    config = decode.compile_plan(problem, split=True)
    assert config.wgmma and config.wgmma_overlap == (ring == OVERLAPPED), config
    assert bool(config.balanced_min_blocks) == problem.paged, config  # the padded split and the balanced one
    binary, shared = compile_with_shared_bytes(problem, monkeypatch)
    label = f"{ring} {problem.describe()}"
    assert shared == _ring_and_q_bytes(config), (label, shared)
    assert_kernels_fit(binary, decode.CTAS_PER_SM_FIT[256], f"WGMMA_D256 {label}", shared)
    sass = cubin_sass(binary.cubin)
    assert_hgmma_key_loop(sass, config, label)
    if config.wgmma_overlap:  # as tests/test_cute_decode_wgmma_overlap.py: two waits a step and the drain
        under, total, waits = exp2_under_wgmma(sass)
        print(f"WGMMA_D256 {label}: {under} of {total} exp2 under a wgmma, {waits} waits")
        assert waits == 5 and 2 * under >= total, (label, under, total, waits)


@pytest.mark.cute_compile
def test_planted_mma_sync_tile_fails_the_key_loop_rule(monkeypatch: pytest.MonkeyPatch):
    """Off (None), seed 229 row 2 compiles the mma.sync tile (HMMA.16816 and LDSM in its key loop): the rule must
    fail."""
    monkeypatch.setattr(decode, "WGMMA_D256", None)
    config = decode.compile_plan(SEED229_ROW2, split=True)
    assert not config.wgmma
    (binary,) = decode.compile_sm90(SEED229_ROW2, split=True)
    with pytest.raises(AssertionError):
        assert_hgmma_key_loop(cubin_sass(binary.cubin), config, "planted: the mma.sync tile")


# ----------------------------------------------------------------------------------------------------
# GPU: on, against fp64; a planted mask bug
# ----------------------------------------------------------------------------------------------------
# name -> (problem, lengths, forced splits, BALANCED_SPLIT); every case has 64+ packed rows at D=256.
GPU_CASES = {
    "256rows-g16-sq16-full-split": (_problem(2, 2, 16, 16, 2048, 256), None, 3, "never"),
    "128rows-g8-sq16-ragged-split": (_problem(4, 2, 8, 16, 1024, 256, has_cache_seqlens=True), RAGGED, 2, "never"),
    "64rows-g16-sq4-paged16-balanced": (_problem(4, 2, 16, 4, 1024, 256, has_cache_seqlens=True, page_size=16), RAGGED,
                                        None, "always"),
    "128rows-g8-sq16-paged64-split": (_problem(4, 2, 8, 16, 1024, 256, has_cache_seqlens=True, page_size=64), RAGGED,
                                      3, "never"),
    "256rows-g16-sq16-paged128-balanced": (_problem(4, 2, 16, 16, 1024, 256, has_cache_seqlens=True, page_size=128),
                                           RAGGED, None, "always"),
    "80rows-g16-sq5-paged16-split": (_problem(4, 2, 16, 5, 1024, 256, has_cache_seqlens=True, page_size=16), RAGGED,
                                     3, "never"),
    "64rows-g64-sq1-full": (_problem(2, 1, 64, 1, 1000, 256), None, None, "never"),
    "64rows-g16-sq4-top-left": (_problem(2, 2, 16, 4, 1000, 256).with_(causal_alignment="top_left"), None, 2, "never"),
}  # fmt: skip


# The 32-key overlapped ring's cases: blocks of 32 keys under pages of 16, ragged lengths (splits of few blocks: the
# first, masked and last steps only), Sq 5, both causal alignments, and the balanced split's shares in its blocks.
OVERLAPPED_CASES = (
    "64rows-g16-sq4-paged16-balanced", "80rows-g16-sq5-paged16-split", "128rows-g8-sq16-ragged-split",
    "256rows-g16-sq16-full-split", "64rows-g16-sq4-top-left",
)  # fmt: skip
SWITCHED_CASES = [(name, CHAIN) for name in sorted(GPU_CASES)] + [(name, OVERLAPPED) for name in OVERLAPPED_CASES]


@pytest.mark.gpu
@pytest.mark.parametrize(("case", "ring"), SWITCHED_CASES)
def test_gpu_d256_wgmma_tile_against_fp64(case: str, ring: tuple[int, int], monkeypatch: pytest.MonkeyPatch):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("WGMMA needs sm_90")
    check_gpu_case(case, GPU_CASES[case], monkeypatch, ("WGMMA_D256", ring), "wgmma")


@pytest.mark.gpu
def test_gpu_planted_unpacked_mask_fails_the_check(monkeypatch: pytest.MonkeyPatch):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("WGMMA needs sm_90")
    planted = (_decode_wgmma, "AttentionMask", _UnpackedMask)
    case = GPU_CASES["80rows-g16-sq5-paged16-split"]
    assert_planted_bug_fails(case, monkeypatch, ("WGMMA_D256", CHAIN), planted, "the unpacked mask")
