"""cute/backward/hopper's chain by programmatic dependent launch (``BackwardTiles(dependent_launch=True)``, issue #40's
short causal rows): the preprocess signals ``griddepcontrol.launch_dependents`` as each CTA starts; the dK/dV kernel,
launched with programmatic stream serialisation, signals likewise, loads K and V and waits (``griddepcontrol.wait``)
before the ring's Q, dO, LSE₂ and D (its producer), before its first reduce-add into dQaccum (the dQ writer) and
before anything else (the consumers); the postprocess, launched so too, waits before reading dQaccum. A second
switch, ``postprocess_reversed``, has the postprocess take the (batch, head) items last first, where the dK/dV
kernel's last CTAs leave their dQaccum in L2.

Without a GPU: the three candidates are the unchained causal D=128 step (``UNCHAINED_CAUSAL``) with the switch (then
with ``zero_in_preprocess``, then with the reversed postprocess too); the last is the causal D=128 default, no other
default chains; they compile for sm_90a without spills, the dK/dV kernel at the unchained step's registers and within
a few SASS instructions of it; in the PTX each wait sits before the first read of what the previous kernel writes and
after the loads of what it does not (planted: a wait moved below the next read, and waits that emit nothing, fail);
the dK/dV kernel and the postprocess are launched with programmatic stream serialisation exactly with the switch, the
preprocess never; the unchained step's three kernels hold no ``griddepcontrol``. With a GPU: the candidates against
fp64 by the yardstick rule (``knob_cases``: one query or key, rows that see no key, MQA, ragged tails, both causal
alignments, GQA over two batches, many blocks), D, LSE₂ and dQaccum poisoned before each call; dK and dV bit for bit
the unchained step's (no reduce-add there); planted: the dK/dV kernel reading D and LSE₂ before the preprocess wrote
them (what a missing wait may read; the preprocess skipped, deterministic) fails the rule. The race itself is no GPU
test: a missing wait shows only sometimes (``tests/test_fp8_pdl.py``); its placement is what the PTX rules check.
"""

from __future__ import annotations

import functools
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

pytest.importorskip("cutlass")
import cutlass.cute as cute

from common.contract.problem import Problem
from common.reporting.static import cubin_resources
from cute_impl.backward import hopper as hopper_backward
from cute_impl.backward import hopper_rows, tiled
from tests.test_backward import assert_all_pass
from tests.test_cute_backward import (
    GLOBAL_ACCESS,
    HOPPER_GROUP,
    VARIANTS,
    hopper_gradients_of,
    knob_cases,
    problem,
    sass_of,
)
from tests.test_fp8_pdl import PROGRAMMATIC_STREAM_SERIALIZATION, WAIT, _roles, launch_attributes

SIGNAL = "griddepcontrol.launch_dependents;"
TMA_LOAD = re.compile(r"cp\.async\.bulk\.tensor\.\d+d\.shared::cta\.global")
REDUCE_ADD = re.compile(r"cp\.reduce\.async\.bulk\.global")
GLOBAL_LOAD = re.compile(r"\bld\.global\b")
# A SASS instruction other than the NOPs that pad the code.
INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?!\s|NOP\b)[^;]*;")
# Any read or write of global memory by a consumer (loads, TMA stores, plain stores).
CONSUMER_GLOBAL = re.compile(r"\bld\.global\b|\bst\.global\b|cp\.async\.bulk\.tensor\.\d+d\.global")
CHAINED = hopper_backward.CHAINED_CAUSAL
UNCHAINED = hopper_backward.UNCHAINED_CAUSAL  # the unchained build every candidate is compared with
# The K and V boxes the producer loads before its wait: two per warpgroup, a D=128 row of 256 bytes is two
# 128-byte swizzle atoms (two TMA copies each).
KV_LOADS_BEFORE_WAIT = 2 * 2 * 2
# What a chained call's buffers hold before the kernels write them (D, LSE₂, dQaccum): a read before its writer ran
# gives NaN or a far gradient.
POISON = float("nan")


def test_the_candidates_are_the_unchained_step_with_the_switches() -> None:
    """Listed at D=128 beside the defaults; the causal D=128 default is the full chain, no other default chains or
    reverses; both switches need dq="reduce" (the separate pass has no postprocess) and name themselves in the
    label."""
    others = [tiles for key, tiles in hopper_backward.DEFAULTS.items() if key != (128, True)]
    assert hopper_backward.DEFAULTS[128, True] == CHAINED[-1]
    assert not any(t.dependent_launch or t.postprocess_reversed for t in others)
    chained = replace(UNCHAINED, dependent_launch=True)
    zeroed = replace(chained, zero_in_preprocess=True)
    assert (chained, zeroed, replace(zeroed, postprocess_reversed=True)) == CHAINED
    assert all(tiles in hopper_backward.CANDIDATES[128] for tiles in CHAINED)
    assert CHAINED[0].label == UNCHAINED.label + "_pdl"
    assert CHAINED[2].label.endswith("_pdl_postrev")
    for switch in ("dependent_launch", "postprocess_reversed"):
        with pytest.raises(ValueError, match=switch):
            hopper_backward.BackwardTiles(64, 64, 2, **{switch: True})


def test_the_ab_script_runs_these_tests_then_times_every_candidate() -> None:
    """``bench/cute_bwd_short_ab.sh`` runs this file's GPU tests before ``bench.cute_bwd_short_ab``, whose rows are
    the causal default and every candidate by label, and profiles a candidate by a label that exists (no GPU
    touched; planted: a misspelt label is found)."""
    from bench.cute_bwd_short_ab import cute_rows
    from tests.test_cute_backward_gap import labels_in_script

    script = (Path(__file__).parents[1] / "bench" / "cute_bwd_short_ab.sh").read_text()
    assert script.index("tests/test_cute_backward_short.py") < script.index("bench.cute_bwd_short_ab")
    assert CHAINED[-1].label in script and not labels_in_script(script)
    assert labels_in_script(script.replace("_postrev", "_post_rev"))
    labels = list(cute_rows().values())
    assert labels == [UNCHAINED.label, *(tiles.label for tiles in CHAINED)]


def test_only_the_chained_launch_signals_from_the_preprocess() -> None:
    """The preprocess's compile key takes ``launch_dependents`` from the switch alone."""
    prob = problem(1000, 777, 128, causal=True)
    for tiles in (UNCHAINED, *CHAINED):
        config = hopper_backward.preprocess_config(prob, tiles, False)
        assert config.launch_dependents == tiles.dependent_launch
        assert config.zero_dq_accum == tiles.zero_in_preprocess


# ----------------------------------------------------------------------------------------------
# Static: the sm_90a builds, the waits' places in the PTX, the launch attribute
# ----------------------------------------------------------------------------------------------
@functools.cache
def binaries(tiles: hopper_backward.BackwardTiles, variant: str = "causal_bottom_right_mqa_dlse") -> dict:
    """{preprocess, dkdv[, postprocess]: binary} of ``tiles`` with ``variant``'s compile-time features (D=64 where the
    tiles take 128 query rows a step, else D=128)."""
    causal, alignment, kv_heads, has_dlse = VARIANTS[variant]
    head_dim = 64 if tiles.tile_m == 128 else 128
    prob = problem(1000, 777, head_dim, causal=causal, alignment=alignment, kv_heads=kv_heads)
    built = hopper_backward.compile_sm90(prob, has_dlse=has_dlse, tiles=tiles)
    return {binary.name.rsplit("_", 1)[-1]: binary for binary in built}


def resources(binary) -> dict:
    (usage,) = cubin_resources(binary.cubin).values()
    return usage


@pytest.mark.xdist_group(HOPPER_GROUP)
@pytest.mark.cute_compile
@pytest.mark.static
@pytest.mark.parametrize("variant", ["causal_top_left_gqa", "causal_bottom_right_mqa_dlse"])
def test_chained_kernels_compile_without_spills_at_the_unchained_registers(variant: str) -> None:
    """The candidates' three kernels for sm_90a: no spills; the dK/dV kernel at the unchained step's registers and at
    most 16 SASS instructions longer, NOPs left out (a signal and three waits: 1827 -> 1831 at the top-left GQA
    build); the postprocess (items reversed or not) with the unchained step's 16-byte loads and stores."""
    unchained = binaries(UNCHAINED, variant)
    for tiles in CHAINED:
        chained = binaries(tiles, variant)
        assert list(chained) == ["preprocess", "dkdv", "postprocess"]
        for name, binary in chained.items():
            usage = resources(binary)
            assert usage["stack_bytes"] + usage["local_bytes"] == 0, f"{tiles.label} {name}: {usage}"
        assert resources(chained["dkdv"])["registers"] == resources(unchained["dkdv"])["registers"]
        lengths = [len(INSTRUCTION.findall(sass_of(b["dkdv"]))) for b in (unchained, chained)]
        assert 0 < lengths[1] - lengths[0] <= 16, lengths
        accesses = [sorted(GLOBAL_ACCESS.findall(sass_of(b["postprocess"]))) for b in (unchained, chained)]
        assert accesses[0] == accesses[1], f"{tiles.label}: the postprocess's global accesses changed"


def waits_in_place(ptx: dict[str, str]) -> list[str]:
    """What breaks the chain's rules in the PTX of its three kernels (``ptx``: name -> text), [] if nothing:
    the preprocess signals once, before its first global load, and never waits; the dK/dV kernel signals before
    its roles split; its producer loads exactly K and V (``KV_LOADS_BEFORE_WAIT``) before its first wait and the
    ring after; the dQ writer waits before its first reduce-add; the consumers wait before any global access;
    the postprocess waits before its first global load."""
    broken = []
    pre, dkdv, post = ptx["preprocess"], ptx["dkdv"], ptx["postprocess"]
    load = GLOBAL_LOAD.search(pre)
    if pre.count(SIGNAL) != 1 or WAIT in pre or load is None or pre.index(SIGNAL) > load.start():
        broken.append("preprocess: one signal before its first load, no wait")
    if dkdv.count(SIGNAL) != 1 or dkdv.index(SIGNAL) > dkdv.index("setmaxnreg"):
        broken.append("dkdv: one signal before the roles split")
    producer, consumers = _roles(dkdv)
    first_wait = producer.find(WAIT)
    before = len(TMA_LOAD.findall(producer[: max(first_wait, 0)]))
    if first_wait < 0 or before != KV_LOADS_BEFORE_WAIT or not TMA_LOAD.search(producer, first_wait):
        broken.append(f"dkdv producer: {before} TMA loads before its wait, not K's and V's")
    reduce_add = REDUCE_ADD.search(producer)
    if reduce_add is None or producer.rfind(WAIT, first_wait + 1, reduce_add.start()) < 0:
        broken.append("dkdv dQ writer: no wait of its own before its first reduce-add")
    access = CONSUMER_GLOBAL.search(consumers)
    if WAIT not in consumers or access is None or consumers.index(WAIT) > access.start():
        broken.append("dkdv consumers: a global access before their wait")
    load = GLOBAL_LOAD.search(post)
    if WAIT not in post or load is None or post.index(WAIT) > load.start():
        broken.append("postprocess: reads dQaccum before its wait")
    return broken


def chained_ptx(tiles: hopper_backward.BackwardTiles) -> dict[str, str]:
    return {name: binary.ptx for name, binary in binaries(tiles).items()}


@pytest.mark.xdist_group(HOPPER_GROUP)
@pytest.mark.cute_compile
@pytest.mark.static
@pytest.mark.parametrize("tiles", CHAINED, ids=lambda tiles: tiles.label)
def test_each_wait_sits_before_the_first_read_of_the_previous_kernels_writes(tiles) -> None:
    """The rules of ``waits_in_place`` on each candidate; the unchained step's kernels hold no ``griddepcontrol``."""
    assert waits_in_place(chained_ptx(tiles)) == []
    assert not any("griddepcontrol" in binary.ptx for binary in binaries(UNCHAINED).values())


def _moved_below(text: str, marker: str, pattern: re.Pattern, start: int = 0) -> str:
    """``text`` with the first ``marker`` at or after ``start`` moved to the line after the next match of
    ``pattern`` (a planted bug)."""
    at = text.index(marker, start)
    line_end = text.index("\n", pattern.search(text, at).end())
    return text[:at] + text[at + len(marker) : line_end] + "\n" + marker + text[line_end:]


@pytest.mark.xdist_group(HOPPER_GROUP)
@pytest.mark.cute_compile
@pytest.mark.static
def test_the_wait_rules_catch_a_late_or_missing_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: the producer's wait below its next TMA load (the ring's Q); the consumers' below their first global
    access; the postprocess's below its first load; the preprocess's signal below its first load; and the chain
    built with ``griddepcontrol_wait`` emitting nothing (its launches still PDL): each breaks a rule."""
    ptx = chained_ptx(CHAINED[0])
    producer, consumers = _roles(ptx["dkdv"])
    planted = {
        "producer": {**ptx, "dkdv": ptx["dkdv"].replace(producer, _moved_below(producer, WAIT, TMA_LOAD))},
        "consumers": {
            **ptx,
            "dkdv": ptx["dkdv"].replace(consumers, _moved_below(consumers, WAIT, CONSUMER_GLOBAL)),
        },
        "postprocess": {**ptx, "postprocess": _moved_below(ptx["postprocess"], WAIT, GLOBAL_LOAD)},
        "preprocess": {**ptx, "preprocess": _moved_below(ptx["preprocess"], SIGNAL, GLOBAL_LOAD)},
    }
    for name, texts in planted.items():
        assert waits_in_place(texts), name
    monkeypatch.setattr(cute.arch, "griddepcontrol_wait", lambda **_: None)
    prob = problem(1000, 777, 128, causal=True, alignment="bottom_right", kv_heads=1)
    unguarded = hopper_backward.compile_sm90(prob, has_dlse=True, tiles=CHAINED[0])
    broken = waits_in_place({binary.name.rsplit("_", 1)[-1]: binary.ptx for binary in unguarded})
    assert len(broken) == 4, broken  # the producer, the dQ writer, the consumers, the postprocess


@pytest.mark.xdist_group(HOPPER_GROUP)
@pytest.mark.cute_compile
@pytest.mark.parametrize("tiles", [UNCHAINED, CHAINED[0]], ids=["unchained", "chained"])
def test_launched_with_programmatic_stream_serialisation_exactly_with_the_switch(tiles) -> None:
    """The TVM-FFI host functions of the dK/dV kernel and the postprocess set
    cudaLaunchAttributeProgrammaticStreamSerialization to 1 exactly with the switch (the unchained step is the planted
    bug of the chained rule: the attribute there, its value 0); the preprocess, launched after whatever came
    before, never sets it to 1."""
    prob = problem(1000, 777, 128, causal=True, kv_heads=2)
    config = hopper_backward.backward_config(prob, tiles)
    for name in ("dkdv", "postprocess"):
        attributes = launch_attributes(str(hopper_backward.KERNELS[name].kernel(config).ir_module))
        assert attributes.get(PROGRAMMATIC_STREAM_SERIALIZATION) == int(tiles.dependent_launch), (name, attributes)
    preprocess = tiled.KERNELS["preprocess"].kernel(hopper_backward.preprocess_config(prob, tiles, False))
    assert launch_attributes(str(preprocess.ir_module)).get(PROGRAMMATIC_STREAM_SERIALIZATION, 0) == 0


# ----------------------------------------------------------------------------------------------
# GPU: the rule, dK and dV bit for bit, the buffers poisoned first
# ----------------------------------------------------------------------------------------------
CASES = {case_id: (prob, tiles) for case_id, prob, tiles in knob_cases({128: list(CHAINED)})}


def poisoned_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    """D, LSE₂ and dQaccum filled with :data:`POISON` as each call allocates them (the fill, where the candidate
    keeps it, zeroes dQaccum after this), so that a read before the preprocess ran cannot pass as stale memory."""
    row_vectors, dq_accumulator = hopper_rows.row_vectors, hopper_backward.dq_accumulator

    def poisoned_rows(prob: Problem, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(t.fill_(POISON) for t in row_vectors(prob, device))

    def poisoned_accumulator(prob: Problem, tiles, device: torch.device) -> torch.Tensor:
        accum = dq_accumulator(prob, tiles, device)
        return accum if not tiles.zero_in_preprocess else accum.fill_(POISON)

    monkeypatch.setattr(hopper_rows, "row_vectors", poisoned_rows)
    monkeypatch.setattr(hopper_backward, "dq_accumulator", poisoned_accumulator)


def _needs_gpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(CASES))
def test_gpu_chained_candidates_pass_the_rule(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The candidate against fp64 by the rule from cute/hopper's O and LSE, its buffers poisoned; dK and dV equal
    the unchained step's (the same tiles without the switch) bit for bit."""
    _needs_gpu()
    prob, tiles = CASES[case]
    poisoned_buffers(monkeypatch)
    inputs, grads = hopper_gradients_of(prob, 41, tiles)
    assert_all_pass(grads, *inputs, prob)
    _, (_, dk, dv) = hopper_gradients_of(prob, 41, replace(tiles, dependent_launch=False))
    assert torch.equal(grads[1], dk) and torch.equal(grads[2], dv), "dK or dV differs from the unchained build's"


PLANTED_CASE = next(case for case in CASES if case.startswith("gqa_causal_bottom_right_ragged"))


@pytest.mark.gpu
def test_gpu_reading_before_the_preprocess_fails_the_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: the preprocess skipped, so the dK/dV kernel reads the poisoned D and LSE₂ (what it may read without
    its wait, deterministically): the rule fails."""
    _needs_gpu()
    prob, tiles = CASES[PLANTED_CASE]
    poisoned_buffers(monkeypatch)
    skipped = type("Skipped", (), {"kernel": staticmethod(lambda config: lambda *arguments: None)})()
    monkeypatch.setitem(tiled.KERNELS, "preprocess", skipped)
    inputs, grads = hopper_gradients_of(prob, 41, tiles)
    with pytest.raises(AssertionError, match="WRONG"):
        assert_all_pass(grads, *inputs, prob)
