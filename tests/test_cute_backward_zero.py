"""cute/backward/hopper's dQaccum zeroed by the preprocess (``BackwardTiles(zero_in_preprocess=True)``): the
fp32 dQ accumulator allocated by ``torch.empty`` and zeroed by ``tiled``'s preprocess, each CTA its 64 rows'
share and the last CTA of a head the layout's padding (``_device.owned_span``), instead of a separate fill.

Without a GPU: the candidates are each head dim's default with the knob on; the shares tile every dQaccum
layout (64, 80 and 128 query rows a block, D 64 and 128, Sq 1 to 700) exactly, each value once (planted: no
padding, no last CTA, one overlap); the preprocess compiles for sm_90a without spills and zeroes by 16-byte
stores only (planted: 4-byte vectors), and the launch passes dQaccum where the compile expects it
(``tests/test_cute_launch_arguments.py``). With a GPU: the preprocess alone leaves every value of a
poisoned dQaccum zero and D, LSE₂ as the default's; the candidates against fp64 by the yardstick rule on
ragged, causal (both alignments), GQA/MQA, one-query (a decode step's Sq ≪ Sk: the rung refuses
``cache_seqlens``), many-block and two-batch shapes, dQaccum poisoned first; planted: a preprocess whose last
CTA zeroes nothing (the last partial block's rows keep the poison) fails the rule, and one without the
padding fails the all-zero check.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import torch

pytest.importorskip("cutlass")
import cutlass

from common.contract.problem import Problem
from common.reporting.static import cubin_resources
from cute_impl._host import CompiledKernels
from cute_impl.backward import _device, hopper_rows, tiled
from cute_impl.backward import hopper as hopper_backward
from cute_impl.backward._device import owned_span
from tests.test_backward import assert_all_pass
from tests.test_cute_backward import (
    BASE,
    DQ_REDUCE_80,
    GLOBAL_ACCESS,
    VARIANTS,
    hopper_gradients_of,
    long_cases,
    problem,
    sass_of,
)

# Each head dim's zeroing candidate (its default with the knob on), and the 80-row layout's (most padding).
ZEROED = {
    head_dim: next(tiles for tiles in variants if tiles.zero_in_preprocess)
    for head_dim, variants in hopper_backward.CANDIDATES.items()
}
ZEROED_80 = replace(DQ_REDUCE_80, zero_in_preprocess=True)
# What the poisoned dQaccum holds before the preprocess: finite, far from any gradient.
POISON = 1.0e3


def test_each_zeroing_candidate_is_its_default_with_the_knob_on() -> None:
    """Listed beside each head dim's staged tiles (``BASE``, the last candidate, which keeps the fill, as every
    default does but the causal D=128 one, the full PDL chain: ``tests/test_cute_backward_short.py``); the knob
    needs dq="reduce" (the separate pass has no dQaccum) and names itself in the label."""
    unchained = [tiles for tiles in hopper_backward.DEFAULTS.values() if not tiles.dependent_launch]
    assert len(unchained) == len(hopper_backward.DEFAULTS) - 1
    assert not any(tiles.zero_in_preprocess for tiles in unchained)
    for head_dim, zeroed in ZEROED.items():
        default = BASE[head_dim]
        assert not default.zero_in_preprocess, default
        assert zeroed == replace(default, zero_in_preprocess=True), zeroed
        assert zeroed.label == default.label + "_zeropre"
    with pytest.raises(ValueError, match="zero_in_preprocess"):
        hopper_backward.BackwardTiles(64, 64, 2, zero_in_preprocess=True)


def test_the_ab_script_names_each_default_and_its_zeroing_candidate() -> None:
    """``bench/cute_bwd_zero_ab.sh`` passes labels to ``bench.backward`` and ``bench.backward_kernels``: each head
    dim's default and zeroing candidate are named there, and a label the shape's head dim lacks is left out
    by the kernels' profile (no GPU touched). Planted: a label no candidate has is not in the script."""
    from bench.backward import SHAPES
    from bench.backward_kernels import variant_backward

    script = (Path(__file__).parents[1] / "bench" / "cute_bwd_zero_ab.sh").read_text()
    for head_dim, zeroed in ZEROED.items():
        for label in (BASE[head_dim].label, zeroed.label):
            assert re.search(rf"\b{label}\b", script), label
    assert not re.search(r"\bm64_s2_dqreduce_tmarows_zeropre\b", script)
    d128 = next(shape for shape in SHAPES if shape[4] == 128)
    assert variant_backward(d128, ZEROED[64].label) is None


# ----------------------------------------------------------------------------------------------
# The shares: every dQaccum value zeroed exactly once (Python ints)
# ----------------------------------------------------------------------------------------------
def coverage_errors(rule) -> list[tuple]:
    """Where ``rule`` (``owned_span``'s signature) does not tile a head's dQaccum, (query blocks · tile_m · D)
    values, with the preprocess's ceil(Sq / 64) CTAs: a gap, an overlap, a span past the end, or a bound
    that is no multiple of the 16-byte store's four values."""
    errors = []
    share_rows = tiled.ROWS_TILE_M
    for seqlen_q, tile_m, head_dim in itertools.product(range(1, 701), (64, 80, 128), (64, 128)):
        extent = -(-seqlen_q // tile_m) * tile_m * head_dim
        blocks = -(-seqlen_q // share_rows)
        spans = [rule(block, blocks, share_rows * head_dim, extent) for block in range(blocks)]
        covered = 0
        for start, stop in spans:
            if start != covered or stop <= start or start % 4 or stop % 4:
                errors.append((seqlen_q, tile_m, head_dim, start, stop, covered))
            covered = max(covered, stop)
        if covered != extent:
            errors.append((seqlen_q, tile_m, head_dim, "ends at", covered, extent))
    return errors


# Planted rules, plain arithmetic as ``owned_span`` (they also run in the kernel, ``planted_preprocess``).
def _no_padding(block, blocks, share, extent):
    """Planted: each CTA its rows' share only (the 80- and 128-row layouts' padding past them left)."""
    return block * share, cutlass.min((block + 1) * share, extent)


def _is_last(block, blocks):
    return 1 - cutlass.min(1, blocks - 1 - block)


def _last_cta_idle(block, blocks, share, extent):
    """Planted: the last CTA (the last partial block's rows, and the padding) zeroes nothing."""
    start, stop = owned_span(block, blocks, share, extent)
    return start, stop - _is_last(block, blocks) * (stop - start)


def _one_share_too_long(block, blocks, share, extent):
    """Planted: a share of 65 rows (each CTA but the last runs into the next's first row)."""
    start, stop = owned_span(block, blocks, share, extent)
    return start, stop + (1 - _is_last(block, blocks)) * (share // tiled.ROWS_TILE_M)


def test_owned_spans_zero_every_dq_accum_value_exactly_once() -> None:
    """``owned_span`` over Sq 1..700 at 64, 80 and 128 query rows a block, D 64 and 128: the CTAs' spans are
    contiguous, non-empty, 16-byte aligned and end at the layout's end. Planted: no padding, an idle last
    CTA and overlapping shares each fail."""
    assert coverage_errors(owned_span) == []
    for planted in (_no_padding, _last_cta_idle, _one_share_too_long):
        assert coverage_errors(planted), planted.__name__


# ----------------------------------------------------------------------------------------------
# Static: the preprocess with the zeroing, for sm_90a
# ----------------------------------------------------------------------------------------------
def preprocess_binary(head_dim: int, tiles: hopper_backward.BackwardTiles):
    """The preprocess as the rung compiles it for ``tiles``, every compile-time feature on (dLSE too)."""
    causal, alignment, kv_heads, has_dlse = VARIANTS["causal_bottom_right_mqa_dlse"]
    prob = problem(1000, 777, head_dim, causal=causal, alignment=alignment, kv_heads=kv_heads)
    (binary,) = tiled.KERNELS["preprocess"].binaries(hopper_backward.preprocess_config(prob, tiles, has_dlse), "pre")
    return binary


def ctas_per_sm(registers: int) -> int:
    """The preprocess's CTAs an SM that its registers allow (65536 a multiprocessor, allocated 8 a thread at a time)."""
    return 65536 // (-(-registers // 8) * 8 * tiled.ROWS_THREADS)


def global_stores(sass: str) -> Counter:
    return Counter(match.group(2) for match in GLOBAL_ACCESS.finditer(sass) if match.group(1) == "STG")


@pytest.mark.cute_compile
@pytest.mark.static
@pytest.mark.parametrize("head_dim", hopper_backward.HEAD_DIMS, ids=lambda d: f"d{d}")
def test_preprocess_zeroes_by_16_byte_stores(head_dim: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The zeroing preprocess compiles without spills and holds as many CTAs an SM as the default (its
    stores come before the loads), or more; beside the default's stores (D and LSE₂, 4 bytes a row) it adds one store,
    ``STG.E.128`` of zeros, in its loop, and the same 16-byte loads of O and dO. Planted: zeros stored four
    bytes at a time (``_device.ZERO_VECTOR`` = 1) add a 4-byte store instead."""
    zeroing = preprocess_binary(head_dim, ZEROED[head_dim])
    default = preprocess_binary(head_dim, BASE[head_dim])
    (usage,), (default_usage,) = cubin_resources(zeroing.cubin).values(), cubin_resources(default.cubin).values()
    assert usage["stack_bytes"] + usage["local_bytes"] == 0, usage
    assert ctas_per_sm(usage["registers"]) >= ctas_per_sm(default_usage["registers"]), (usage, default_usage)
    sass, default_sass = sass_of(zeroing), sass_of(default)
    added = global_stores(sass) - global_stores(default_sass)
    assert added == Counter({"128": 1}) and re.search(r"STG\.E\.128 desc\[\w+\]\[R\d+\.64\], RZ", sass), added
    loads = Counter(match.groups() for match in GLOBAL_ACCESS.finditer(sass) if match.group(1) == "LDG")
    assert loads == Counter(match.groups() for match in GLOBAL_ACCESS.finditer(default_sass) if match.group(1) == "LDG")
    monkeypatch.setattr(_device, "ZERO_VECTOR", 1)
    planted = global_stores(sass_of(preprocess_binary(head_dim, ZEROED[head_dim]))) - global_stores(default_sass)
    assert "128" not in planted and planted, planted


def loads_before_stores(sass: str) -> bool:
    """Whether no global load follows the first global store in ``sass``'s program order."""
    kinds = [match.group(1) for match in GLOBAL_ACCESS.finditer(sass)]
    return "STG" not in kinds or "LDG" not in kinds[kinds.index("STG") :]


@pytest.mark.cute_compile
@pytest.mark.static
@pytest.mark.parametrize("head_dim", hopper_backward.HEAD_DIMS, ids=lambda d: f"d{d}")
def test_preprocess_loads_everything_before_its_first_store(head_dim: int) -> None:
    """Each row's LSE and dLSE are loaded with its O and dO, before any store: read after the row's D was stored
    (which may alias them), every LSE load waited for the one before it, eight DRAM latencies in series at each
    CTA's end (43.3 -> 36.5 µs at B=8 H=16 S=2048 D=128, results/h200/backward-preprocess-lse-ahead/). Planted:
    the build's first load moved after its last store fails the check (as the kernel before that change does)."""
    sass = sass_of(preprocess_binary(head_dim, BASE[head_dim]))
    assert loads_before_stores(sass)
    lines = sass.splitlines()
    first_load = next(i for i, line in enumerate(lines) if "LDG.E" in line)
    last_store = max(i for i, line in enumerate(lines) if "STG.E" in line)
    planted = (
        lines[:first_load] + lines[first_load + 1 : last_store + 1] + [lines[first_load]] + lines[last_store + 1 :]
    )
    assert not loads_before_stores("\n".join(planted))


@pytest.mark.cute_compile
@pytest.mark.static
def test_only_the_preprocess_changes() -> None:
    """The knob is the preprocess's alone: the zeroing candidate's dK/dV kernel and postprocess are the
    default's instruction for instruction (D=64, the cheaper compile)."""
    prob = problem(1000, 777, 64, causal=True, alignment="bottom_right", kv_heads=2)
    zeroed = hopper_backward.compile_sm90(prob, tiles=ZEROED[64])
    default = hopper_backward.compile_sm90(prob, tiles=BASE[64])
    assert [b.name for b in zeroed] == [b.name for b in default]

    def instructions(binary) -> list[str]:
        return re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", sass_of(binary))

    assert [instructions(b) for b in zeroed[1:]] == [instructions(b) for b in default[1:]]
    assert instructions(zeroed[0]) != instructions(default[0])


# ----------------------------------------------------------------------------------------------
# GPU: every value zeroed, and the gradients against fp64, dQaccum poisoned first
# ----------------------------------------------------------------------------------------------
def poisoned_accumulator(monkeypatch: pytest.MonkeyPatch) -> None:
    """``hopper.dq_accumulator`` filled with :data:`POISON` (what ``torch.empty`` may leave, made sure)."""
    allocate = hopper_backward.dq_accumulator

    def poisoned(problem: Problem, tiles: hopper_backward.BackwardTiles, device: torch.device) -> torch.Tensor:
        return allocate(problem, tiles, device).fill_(POISON)

    monkeypatch.setattr(hopper_backward, "dq_accumulator", poisoned)


def planted_preprocess(monkeypatch: pytest.MonkeyPatch, rule) -> None:
    """The rung's preprocess recompiled with ``rule`` as its CTAs' spans (a fresh compile cache)."""
    monkeypatch.setattr(tiled, "owned_span", rule)
    planted = CompiledKernels(tiled._PreprocessKernel, tiled._fake_preprocess_arguments)
    monkeypatch.setitem(tiled.KERNELS, "preprocess", planted)


def run_preprocess(prob: Problem, tiles: hopper_backward.BackwardTiles, seed: int) -> tuple[torch.Tensor, ...]:
    """The preprocess alone on a poisoned dQaccum (``tiles`` with the knob on, and off: the default's), from
    random O, dO and LSE: (dQaccum, D, LSE₂, the default's D, the default's LSE₂)."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    shape = (prob.batch, prob.heads, prob.seqlen_q, prob.head_dim)
    out, d_out = (torch.randn(shape, generator=generator, device="cuda").to(prob.dtype) for _ in "01")
    lse = torch.randn(shape[:3], generator=generator, device="cuda")
    device = torch.device("cuda")
    accum = hopper_backward.dq_accumulator(prob, tiles, device).fill_(POISON)
    found = []
    for knob, target in ((True, accum.view(prob.batch, prob.heads, -1)), (False, None)):
        delta, lse_log2 = hopper_rows.row_vectors(prob, device)
        config = hopper_backward.preprocess_config(prob, replace(tiles, zero_in_preprocess=knob), False)
        tiled.KERNELS["preprocess"].kernel(config)(out, d_out, lse, None, lse_log2, delta, target)
        found += [delta, lse_log2]
    torch.cuda.synchronize()
    return accum, *found


def zero_cases() -> dict[str, tuple[Problem, hopper_backward.BackwardTiles]]:
    """(problem, candidate): each layout at lengths that end inside a 64-row CTA, on a CTA's edge and
    inside the layout's padding, one query row (a decode step), MQA, two batches."""
    cases = {}
    shapes = {  # name: (Sq, Sk, problem's keywords)
        "ragged_300x1000_gqa_causal_br": (300, 1000, {"causal": True, "alignment": "bottom_right", "kv_heads": 2}),
        "ragged_1000x300_gqa_causal_tl": (1000, 300, {"causal": True, "kv_heads": 2}),
        "one_query_1000_keys_mqa_causal_br": (1, 1000, {"causal": True, "alignment": "bottom_right", "kv_heads": 1}),
        "sq192_full_gqa": (192, 333, {"kv_heads": 2}),
        "sq65_mqa_causal_tl": (65, 65, {"causal": True, "kv_heads": 1}),
    }
    for (name, (seqlen_q, seqlen_k, keywords)), (head_dim, tiles) in itertools.product(
        shapes.items(), ((64, ZEROED[64]), (128, ZEROED[128]), (128, ZEROED_80))
    ):
        cases[f"{name}_d{head_dim}_{tiles.label}"] = (problem(seqlen_q, seqlen_k, head_dim, **keywords), tiles)
    for head_dim in hopper_backward.HEAD_DIMS:
        cases[f"two_batches_d{head_dim}"] = (
            Problem(2, 4, 333, 1000, head_dim, torch.bfloat16, causal=True, kv_heads=2,
                    causal_alignment="bottom_right"),
            ZEROED[head_dim],
        )  # fmt: skip
        long = long_cases(head_dim)["gqa_causal_bottom_right_ragged"]
        cases[f"long_1999x2100_d{head_dim}"] = (long, ZEROED[head_dim])
    return cases


ZERO_CASES = zero_cases()


def _needs_gpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(ZERO_CASES))
def test_gpu_preprocess_zeroes_every_dq_accum_value(case: str) -> None:
    """The preprocess alone: every value of the poisoned dQaccum (padding, heads, batches) is 0 after it, and
    D and LSE₂ are bit for bit the default preprocess's."""
    _needs_gpu()
    prob, tiles = ZERO_CASES[case]
    accum, delta, lse_log2, default_delta, default_lse_log2 = run_preprocess(prob, tiles, seed=31)
    assert torch.count_nonzero(accum).item() == 0, f"{torch.count_nonzero(accum).item()} of {accum.numel()} left"
    assert torch.equal(delta, default_delta) and torch.equal(lse_log2, default_lse_log2)


@pytest.mark.gpu
def test_gpu_preprocess_without_the_padding_fails_the_zero_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: each CTA its own rows only: the 128-row layout's padding (Sq = 192: two blocks of 128 rows,
    three CTAs of 64) keeps the poison in its last 64 rows' values, which the all-zero check finds (the fp64
    rule cannot: padding rows are never stored)."""
    _needs_gpu()
    planted_preprocess(monkeypatch, _no_padding)
    prob, tiles = ZERO_CASES[f"sq192_full_gqa_d64_{ZEROED[64].label}"]
    assert tiles.tile_m == 128
    accum = run_preprocess(prob, tiles, seed=32)[0]
    assert torch.count_nonzero(accum).item() == prob.batch * prob.heads * (256 - 192) * prob.head_dim


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(ZERO_CASES))
def test_gpu_zeroing_candidates_pass_the_rule(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The candidate against fp64 by the rule, from cute/hopper's O and LSE, its dQaccum poisoned before the
    preprocess (so that a value the preprocess missed cannot pass as ``torch.empty``'s zero)."""
    _needs_gpu()
    prob, tiles = ZERO_CASES[case]
    poisoned_accumulator(monkeypatch)
    inputs, grads = hopper_gradients_of(prob, 33, tiles)
    assert_all_pass(grads, *inputs, prob)


# One case per layout (64, 128 and 80 query rows a block): Sq = 1000, whose last CTA holds rows 960-999.
IDLE_LAST_CTA_CASES = [case for case in ZERO_CASES if case.startswith("ragged_1000x300")]


@pytest.mark.gpu
@pytest.mark.parametrize("case", IDLE_LAST_CTA_CASES)
def test_gpu_an_idle_last_cta_fails_the_rule(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: a preprocess whose last CTA zeroes nothing leaves the poison under the last partial block's
    dQ rows (960-999, which see every key), which fails the fp64 rule on dQ."""
    _needs_gpu()
    prob, tiles = ZERO_CASES[case]
    poisoned_accumulator(monkeypatch)
    planted_preprocess(monkeypatch, _last_cta_idle)
    inputs, grads = hopper_gradients_of(prob, 33, tiles)
    with pytest.raises(AssertionError, match="dq WRONG"):
        assert_all_pass(grads, *inputs, prob)
