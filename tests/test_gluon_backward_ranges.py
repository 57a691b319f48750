"""gluon/backward/hopper's per-consumer block ranges and limit masks (``BackwardTiles(consumer_ranges=True)``,
``BackwardTiles(limit_mask=True)``, ``triton_impl/gluon/backward_ranges.py``; issue #40, the causal backward).

On CPU: the range functions' own source run on Python integers (their ``gl`` swapped for integer min, max
and where, ``as_python``) over every CTA of ragged shapes, both alignments and both head dims' tiles: each
consumer's range holds every (query row, key) pair its keys or rows see, every block it runs unmasked is
visible in full, the lower dK/dV consumer starts where the load warp does and the lower dQ consumer ends at
most one block early (the ring's argument in ``backward_ranges``); planted: a range one block short and a
mask count one short fail. The limit masks' source run on NumPy against the masks they replace, with a
planted off-by-one. Static (a child process without the interpreter): the candidates compile for sm_90a
without spills or serialised wgmmas, the limit mask shortens the masked steps and leaves the unmasked ones,
and the non-causal launches of ``consumer_ranges`` are the default's bytes. On the GPU: every candidate is in
``CANDIDATES`` (``tests/test_backward.py``'s every-candidate test) and, with ``tma_rows``, in
``tests/test_gluon_backward_rows.py``'s shapes; here its own shapes against fp64.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from itertools import product

import numpy as np
import pytest
import torch

from common import attention
from common.contract.inputs import make_inputs
from common.toolchain.releases import triton_release
from tests._helpers import json_from_child
from tests.test_backward import assert_all_pass, problem
from triton_impl.gluon import _device, backward_ranges
from triton_impl.gluon import backward as gluon_backward

RANGES = [(hd, t) for hd, ts in gluon_backward.ALL_CANDIDATES.items() for t in ts if t.consumer_ranges or t.limit_mask]
# Those the installed release lists (under 3.9 the overlapped ones spill, as every overlapped candidate).
LISTED = [(hd, t) for hd, t in RANGES if t in gluon_backward.CANDIDATES[hd]]


class _IntegerGl:
    """The ``gl`` functions the range code calls, on Python integers."""

    minimum = staticmethod(min)
    maximum = staticmethod(max)

    @staticmethod
    def where(condition, a, b):
        return a if condition else b


class _NumpyGl:
    """The ``gl`` functions the mask code calls, on NumPy arrays (layouts ignored)."""

    minimum = staticmethod(np.minimum)
    zeros_like = staticmethod(np.zeros_like)
    where = staticmethod(np.where)

    @staticmethod
    def arange(start, end, layout=None):
        return np.arange(start, end)

    @staticmethod
    def SliceLayout(dim, parent):
        return None


class _Tile(np.ndarray):
    """An array with the ``.type.layout`` the mask code reads."""

    type = types.SimpleNamespace(layout=None)


def as_python(function, gl, **globals_) -> Callable:
    """A ``@gluon.jit`` function's own Python source with ``gl`` (and ``globals_``) swapped in."""
    fn = getattr(function, "fn", function)
    return types.FunctionType(fn.__code__, {**fn.__globals__, "gl": gl, **globals_}, fn.__name__, fn.__defaults__)


QUERY_BLOCKS = as_python(_device.query_blocks, _IntegerGl)
BLOCK_RANGE = as_python(_device.block_range, _IntegerGl)
CONSUMER_QUERY_BLOCKS = as_python(backward_ranges.consumer_query_blocks, _IntegerGl, query_blocks=QUERY_BLOCKS)
CONSUMER_KEY_BLOCKS = as_python(backward_ranges.consumer_key_blocks, _IntegerGl, block_range=BLOCK_RANGE)
WG = 64  # a consumer's keys (dK/dV) or rows (dQ)


def dkdv_range_errors(seqlen_q: int, seqlen_k: int, bottom_right: bool, block_m: int, ranges=CONSUMER_QUERY_BLOCKS):
    """Where the dK/dV consumers' ranges break the rules (module docstring), over every CTA; and the consumer
    steps run."""
    offset = seqlen_k - seqlen_q if bottom_right else 0
    errors, steps = [], 0
    for n_start in range(0, seqlen_k, 2 * WG):
        first, blocks, masked = QUERY_BLOCKS(n_start, seqlen_q, seqlen_k, offset, CAUSAL=True, BLOCK_M=block_m,
                                             BLOCK_N=2 * WG)  # fmt: skip
        per_consumer = ranges(n_start, seqlen_q, seqlen_k, offset, first, masked, True, block_m, WG)
        if per_consumer[0][0] != 0:
            errors.append(f"n_start {n_start}: the lower consumer skips {per_consumer[0][0]}")
        for index, (skip, own_masked) in enumerate(per_consumer):
            if not (skip >= 0 and skip + own_masked <= blocks):
                errors.append(f"n_start {n_start} consumer {index}: skip {skip} masked {own_masked} of {blocks}")
            steps += blocks - skip
            keys = np.arange(n_start + index * WG, n_start + (index + 1) * WG)
            for block in range(first, first + blocks):
                rows = np.arange(block * block_m, (block + 1) * block_m)
                visible = (keys[:, None] < seqlen_k) & (keys[:, None] <= rows[None, :] + offset)
                seen = visible & (rows[None, :] < seqlen_q)
                if block < first + skip and seen.any():
                    errors.append(f"n_start {n_start} consumer {index}: skipped block {block} has visible pairs")
                if block >= first + skip + own_masked and not visible.all():
                    errors.append(f"n_start {n_start} consumer {index}: block {block} unmasked, not all visible")
    return errors, steps


def dq_range_errors(seqlen_q: int, seqlen_k: int, bottom_right: bool, block_n: int, ranges=CONSUMER_KEY_BLOCKS):
    """Where the dQ consumers' ranges break the rules (module docstring), over every CTA; and the steps run."""
    offset = seqlen_k - seqlen_q if bottom_right else 0
    errors, steps = [], 0
    for start_m in range(0, seqlen_q, 2 * WG):
        _, n_max, masked = BLOCK_RANGE(start_m, seqlen_k, offset, CAUSAL=True, BOTTOM_RIGHT=bottom_right,
                                       BLOCK_M=2 * WG, BLOCK_N=block_n)  # fmt: skip
        per_consumer = ranges(start_m, seqlen_k, offset, n_max, masked, True, bottom_right, WG, block_n)
        if per_consumer[1][0] != n_max:
            errors.append(f"start_m {start_m}: the upper consumer ends at {per_consumer[1][0]}, the CTA at {n_max}")
        for index, (own_max, own_masked) in enumerate(per_consumer):
            if not (0 <= own_masked <= own_max <= n_max and n_max - own_max <= 1):
                errors.append(f"start_m {start_m} consumer {index}: {own_max} blocks, {own_masked} masked of {n_max}")
            steps += own_max
            rows = np.arange(start_m + index * WG, start_m + (index + 1) * WG)
            for block in range(n_max):
                keys = np.arange(block * block_n, (block + 1) * block_n)
                visible = (keys[None, :] < seqlen_k) & (keys[None, :] <= rows[:, None] + offset)
                if block >= own_max and (visible & (rows[:, None] < seqlen_q)).any():
                    errors.append(f"start_m {start_m} consumer {index}: dropped block {block} has visible pairs")
                if block < own_max - own_masked and not visible.all():
                    errors.append(f"start_m {start_m} consumer {index}: block {block} unmasked, not all visible")
    return errors, steps


# (Sq, Sk): equal and ragged, Sq < Sk and Sq > Sk (bottom-right rows that see no key), tails inside a block.
SEQLENS = [(1024, 1024), (77, 333), (300, 1000), (1000, 300), (1, 129), (517, 1), (200, 200)]


@pytest.mark.parametrize(("seqlen_q", "seqlen_k", "bottom_right"), [(*s, br) for s, br in product(SEQLENS, (0, 1))])
def test_consumer_ranges_hold_every_visible_pair_and_mask_every_partial_block(
    seqlen_q: int, seqlen_k: int, bottom_right: int
) -> None:
    """dK/dV at 32- and 64-row query blocks (D=128, D=64), dQ at 64- and 128-key blocks: no error; causal
    square shapes run fewer consumer steps than twice the CTA's."""
    for block_m in (32, 64):
        errors, _ = dkdv_range_errors(seqlen_q, seqlen_k, bool(bottom_right), block_m)
        assert not errors, errors[:5]
    for block_n in (64, 128):
        errors, _ = dq_range_errors(seqlen_q, seqlen_k, bool(bottom_right), block_n)
        assert not errors, errors[:5]


def test_consumer_ranges_save_steps_on_the_diagonal() -> None:
    """S = 2048 causal at the D=128 tiles: 2.9 % fewer consumer steps in each kernel (the module's figure)."""
    _, dkdv = dkdv_range_errors(2048, 2048, False, 32)
    _, dq = dq_range_errors(2048, 2048, False, 64)
    cta_dkdv = sum(2 * (64 - 4 * n) for n in range(16))
    cta_dq = sum(2 * (2 * m + 2) for m in range(16))
    assert (dkdv, dq) == (cta_dkdv - 32, cta_dq - 16)


@pytest.mark.parametrize("bug", ["skip one more", "one mask fewer"])
def test_the_range_rules_fail_planted_bugs(bug: str) -> None:
    """A consumer range one block short, or with one masked block fewer, breaks its kernel's rule."""

    def dkdv(*args):
        ranges = CONSUMER_QUERY_BLOCKS(*args)
        return tuple((s + 1, m) if bug == "skip one more" else (s, max(m - 1, 0)) for s, m in ranges)

    def dq(*args):
        ranges = CONSUMER_KEY_BLOCKS(*args)
        return tuple((n - 1, min(m, n - 1)) if bug == "skip one more" else (n, max(m - 1, 0)) for n, m in ranges)

    assert dkdv_range_errors(300, 1000, True, 32, ranges=dkdv)[0]
    assert dq_range_errors(300, 1000, True, 64, ranges=dq)[0]


def _masks(limit: bool, causal: bool):
    constants = types.SimpleNamespace(LIMIT_MASK=limit, CAUSAL=causal)
    gl_globals = {
        "transposed_mask": as_python(_device.transposed_mask, _NumpyGl),
        "attention_mask": as_python(_device.attention_mask, _NumpyGl),
    }
    mask_p_t = as_python(backward_ranges.mask_p_t, _NumpyGl, **gl_globals)
    mask_scores = as_python(backward_ranges.mask_scores, _NumpyGl, **gl_globals)
    mask_p = as_python(backward_ranges.mask_p, _NumpyGl, **gl_globals)

    def dkdv(p_t, offs_n, m_start, seqlen_k, offset):
        offs_m = m_start + np.arange(p_t.shape[1])
        return mask_p_t(p_t, offs_n, offs_m, m_start, seqlen_k, offset, constants)

    def dq(scores, offs_m, start_n, seqlen_k, offset):
        masked = mask_scores(scores, offs_m, start_n, seqlen_k, offset, constants)
        return mask_p(np.exp2(masked).view(_Tile), offs_m, start_n, seqlen_k, offset, constants)

    return dkdv, dq


def _mask_mismatches(offset_shift: int = 0) -> list[str]:
    """Where the limit masks differ from ``_device``'s (keys past Sk, the causal diagonal, negative offsets)."""
    rng = np.random.default_rng(4)
    errors = []
    for causal, seqlen_k, offset, start in product((True, False), (77, 200), (-90, 0, 37), (0, 32, 64, 128)):
        plain_dkdv, plain_dq = _masks(False, causal)
        limit_dkdv, limit_dq = _masks(True, causal)
        p_t = rng.random((64, 32)).view(_Tile)
        offs_n = start + np.arange(64)
        expected = plain_dkdv(p_t, offs_n, start, seqlen_k, offset)
        found = limit_dkdv(p_t, offs_n, start, seqlen_k, offset + offset_shift)
        scores = rng.standard_normal((64, 64)).view(_Tile)
        offs_m = start + np.arange(64)
        expected_p = plain_dq(scores, offs_m, start, seqlen_k, offset)
        found_p = limit_dq(scores, offs_m, start, seqlen_k, offset + offset_shift)
        if not (np.array_equal(expected, found) and np.array_equal(expected_p, found_p)):
            errors.append(f"causal {causal} seqlen_k {seqlen_k} offset {offset} start {start}")
    return errors


def test_limit_masks_equal_the_masks_they_replace() -> None:
    """Pᵀ (dK/dV) and P (dQ, masked after the exp instead of before it) equal ``_device``'s masks on every
    element; planted: the diagonal moved by one key differs."""
    assert not _mask_mismatches()
    assert _mask_mismatches(offset_shift=1), "planted: a diagonal off by one must be detected"


def test_consumer_ranges_refuse_an_in_kernel_dq_and_are_named() -> None:
    """An in-kernel dQ exchanges every step's dSᵀ between the consumers: refused. Labels name both knobs. D=128's
    default has both where the release lists the overlapped tiles (results/h200/backward-gluon-causal-ab*/),
    D=64's neither (its knobs untimed)."""
    tiles = gluon_backward.BackwardTiles
    with pytest.raises(ValueError, match="no own ranges"):
        tiles(32, 3, 64, 3, dq="reduce", consumer_ranges=True)
    both = tiles(32, 3, 64, 3, overlap=True, tma_rows=True, heaviest_first=True, consumer_ranges=True, limit_mask=True)
    assert (
        both.label.endswith("heaviest_first consumer_ranges limit_mask") and both in gluon_backward.ALL_CANDIDATES[128]
    )
    overlap_listed = triton_release() not in gluon_backward.OVERLAP_SPILLS
    assert gluon_backward.CANDIDATES[128][0] == (both if overlap_listed else tiles(32, 3, 64, 3, tma_rows=True))
    assert not (gluon_backward.CANDIDATES[64][0].consumer_ranges or gluon_backward.CANDIDATES[64][0].limit_mask)
    assert all(t.dq_stages >= 2 for _, t in RANGES), "the dQ consumer's early end needs two ring slots"


STATIC_SCRIPT = """
import dataclasses, json, re, torch
from common.contract.problem import Problem
from common.reporting.static import _SASS_INSTRUCTION, cubin_resources, cubin_sass
from triton_impl.gluon import backward as gluon_backward

def step_loops(cubin):
    sass = cubin_sass(cubin)
    listing = [(int(m.group(1), 16), m.group(2), m.group(3)) for m in _SASS_INSTRUCTION.finditer(sass)]
    spans = []
    for address, opcode, operands in listing:
        target = re.match(r"\\s*(0x[0-9a-f]+)", operands)
        if opcode.startswith("BRA") and target and int(target.group(1), 16) <= address:
            spans.append((int(target.group(1), 16), address))
    inner = [s for s in spans if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in spans)]
    sizes = []
    for begin, end in inner:
        body = [op for address, op, _ in listing if begin <= address <= end]
        if any(op.startswith("MUFU.EX2") for op in body) and any(op.startswith("HGMMA") for op in body):
            sizes.append(len(body))
    serialised = sass.count("WARPGROUP.ARRIVE") * 2 > sass.count("HGMMA.")
    return sorted(sizes), serialised

rows = {}
for head_dim, variants in gluon_backward.CANDIDATES.items():
    knobs = [t for t in variants if t.consumer_ranges or t.limit_mask]
    for tiles in knobs + [dataclasses.replace(t, consumer_ranges=False, limit_mask=False) for t in knobs]:
        for causal in (True, False):
            problem = Problem(2, 16, 1000, 777, head_dim, torch.bfloat16, kv_heads=4, causal=causal,
                              causal_alignment="bottom_right")
            for binary in gluon_backward.compile_sm90(problem, tiles)[1:]:
                usage = next(iter(cubin_resources(binary.cubin).values()))
                loops, serialised = step_loops(binary.cubin)
                rows[f"{head_dim}|{tiles.label}|{causal}|{binary.name}"] = {
                    "spill": usage["stack_bytes"] + usage["local_bytes"], "serialised": serialised,
                    "loops": loops, "cubin": hash(binary.cubin),
                }
print(json.dumps(rows))
"""


@pytest.mark.static
def test_candidates_compile_and_the_limit_mask_shortens_only_the_masked_steps() -> None:
    """Every listed candidate with either knob, causal and not, at a ragged GQA bottom-right shape: no spills, wgmmas
    not serialised. Each against the same tiles without the knobs. ``limit_mask``: the longest step (masked) of
    each causal kernel and of the non-causal dQ pass shorter than the knob-less tiles' by 10 SASS instructions or
    more (measured under 3.8, D=128 causal: dQ 493 → 332, dK/dV 268 → 249), the shortest (unmasked) at most 5
    longer (Triton 3.9 schedules D=64's 6 shorter); the non-causal dK/dV steps unchanged.
    ``consumer_ranges`` alone: the non-causal kernels are the knob-less tiles' bytes (the knob enters causal launches
    only); planted: its causal dK/dV kernel differs, which the comparison detects."""
    rows = json_from_child(["-c", STATIC_SCRIPT], timeout=600)
    for key, row in rows.items():
        assert row["spill"] == 0 and not row["serialised"], (key, row)
    assert LISTED, "the installed release lists none of them"
    for head_dim, tiles in LISTED:
        default = dataclasses.replace(tiles, consumer_ranges=False, limit_mask=False).label
        for causal, kernel in product((True, False), ("_dkdv_kernel", "_dq_kernel")):
            mine, base = (rows[f"{head_dim}|{label}|{causal}|{kernel}"] for label in (tiles.label, default))
            if tiles.limit_mask and (causal or kernel == "_dq_kernel"):
                assert max(base["loops"]) - max(mine["loops"]) >= 10, (head_dim, tiles.label, causal, kernel)
                assert min(mine["loops"]) - min(base["loops"]) <= 5, (head_dim, tiles.label, causal, kernel)
            elif not causal:
                # The non-causal key tail's mask is a predicate per key row already: the dK/dV kernel keeps it.
                assert mine["loops"] == base["loops"], (head_dim, tiles.label, kernel)
                if not tiles.limit_mask:
                    assert mine["cubin"] == base["cubin"], (head_dim, tiles.label, kernel)
            elif kernel == "_dkdv_kernel":
                assert mine["cubin"] != base["cubin"], "planted: a different kernel must be detected"


# Shapes that probe the ranges on the GPU: several query heads per KV head (a consumer's skips between heads'
# streams), bottom-right offsets not a multiple of 64, rows that see no key, upper consumers with no valid key.
GPU_SHAPES = {
    "gqa_causal_bottom_right": problem(300, 1000, heads=8, kv_heads=2, causal=True, alignment="bottom_right"),
    "gqa_causal_top_left_ragged": problem(333, 333, heads=4, kv_heads=2, causal=True),
    "mqa_causal_bottom_right_sq_gt_sk": problem(1000, 300, heads=3, kv_heads=1, causal=True, alignment="bottom_right"),
    "mha_causal_sk_tail": problem(129, 70, heads=2, kv_heads=2, causal=True, alignment="bottom_right"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(
    ("shape", "head_dim", "tiles"),
    [pytest.param(name, hd, t, id=f"{name}-d{hd}-{t.label}") for hd, t in LISTED for name in GPU_SHAPES],
)
def test_gpu_ranges_and_limit_masks_pass_the_rule(
    shape: str, head_dim: int, tiles: gluon_backward.BackwardTiles, dtype: torch.dtype
) -> None:
    """Each candidate with either knob against fp64 by the gradient rule, from gluon/hopper's O and LSE."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    prob = GPU_SHAPES[shape].with_(head_dim=head_dim, dtype=dtype)
    q, k, v = make_inputs(prob, seed=23, device="cuda", offset=0.5)
    d_out = torch.randn(q.shape, generator=torch.Generator(device="cuda").manual_seed(9), device="cuda").to(dtype)
    with torch.no_grad():
        out, lse = attention(q, k, v, causal=prob.causal, causal_alignment=prob.causal_alignment,
                             impl="gluon/hopper", return_lse=True)  # fmt: skip
    assert_all_pass(gluon_backward.hopper_gradients(q, k, v, out, lse, d_out, prob, tiles=tiles), q, k, v, d_out, prob)


def test_the_ab_names_real_variants() -> None:
    """``bench/gluon_bwd_causal.py`` times the knob-less tiles and the three candidates with a knob (one of them
    the default), by their labels."""
    from bench import gluon_bwd_causal

    chosen = gluon_bwd_causal._variants(128)
    assert list(chosen) == list(gluon_bwd_causal.VARIANTS)
    knobless = chosen[gluon_bwd_causal.VARIANTS[0]]
    assert not (knobless.consumer_ranges or knobless.limit_mask)
    assert gluon_backward.ALL_CANDIDATES[128][0] in chosen.values()
    assert {tiles for _, tiles in RANGES if tiles.dkdv_block_m == 32} == set(list(chosen.values())[1:])
