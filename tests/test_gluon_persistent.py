"""gluon/hopper's persistent CTAs (``triton_impl.gluon.hopper.PERSISTENT``, shared by gluon/fp8), issue #37.

CPU: the TileScheduler's own device arithmetic (``_device.persistent_tile_count`` / ``persistent_tile``, run on
Python ints through ``.fn``) deals every tile to exactly one CTA at several shapes, a head's tiles in consecutive
rounds, causal ones longest first; a planted order (the snake without its count) fails that check. The launch grid
with the switch off and on. Static (sm_90a, in a child process): the switch off builds the kernel without the
persistent machinery (no Q-empty barriers, O in the Q buffer for fp16/bf16); on, every build keeps its key-block
loops free of local memory and fits shared memory with O's own buffer, or is refused where the installed Triton's
ptxas spills in a block loop (``_host.PERSISTENT_REFUSED``); a prepared persistent launch compiles through Triton's
JIT binder with its 1-D grid.
GPU (``gpu`` marker): with the switch on, on shapes where every CTA walks several tiles, gluon/hopper against the
fp64 reference by its own rule (poisoned outputs) and gluon/fp8 by FP8_RULE, both causal alignments and not, GQA,
Sq != Sk, cache_seqlens and the LSE; O equal bit for bit to the one-CTA-per-tile kernel's (the per-tile
arithmetic is the same); a tile left unwritten (what a skipped tile leaves) fails both checks.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections import Counter

import pytest
import torch

from common.contract.check import check_on_inputs, run_poisoned
from common.contract.inputs import make_inputs
from common.toolchain.releases import triton_release
from tests._helpers import child_result, edge_cache_seqlens, fa3_case, feature_problem, scripts_in_one_child
from triton_impl.gluon import _device, fp8, hopper
from triton_impl.gluon._host import DEFAULT_SM_COUNT, PERSISTENT_REFUSED, GluonConfig, launch_grid

pytestmark = [pytest.mark.xdist_group("gluon-compile")]
HAS_CUDA = torch.cuda.is_available()


# ----------------------------------------------------------------------------------------------
# The tile order (CPU): the kernel's own arithmetic on Python ints
# ----------------------------------------------------------------------------------------------
def walks(ctas: int, q_tiles: int, heads: int, causal: bool, count=None, tile=None) -> list[list[tuple[int, int]]]:
    """Each CTA's tiles, ``(m_block, batch_head)`` in its order, by the device functions (or planted ones)."""
    count = count or _device.persistent_tile_count.fn
    tile = tile or _device.persistent_tile.fn
    tiles = q_tiles * heads
    return [
        [tile(local, cta, ctas, q_tiles, causal) for local in range(count(cta, ctas, tiles))] for cta in range(ctas)
    ]


def order_problems(ctas: int, q_tiles: int, heads: int, causal: bool, **planted) -> list[str]:
    """What is wrong with the walks: tiles dealt twice, missed or out of range; a head's tiles not in consecutive
    rounds; causal tiles of a head not longest (largest m_block) first."""
    per_cta = walks(ctas, q_tiles, heads, causal, **planted)
    dealt = Counter(t for walk in per_cta for t in walk)
    expected = {(m, bh) for m in range(q_tiles) for bh in range(heads)}
    problems = [f"tile {t} dealt {n} times" for t, n in dealt.items() if n != 1]
    problems += [f"tile {t} out of range" for t in dealt if t not in expected]
    problems += [f"tile {t} missed" for t in expected - set(dealt)]
    # The rounds (a CTA's local index: the CTAs run their rounds side by side) in which each head's tiles run.
    by_head: dict[int, dict[int, list[int]]] = {}
    for walk in per_cta:
        for local, (m, bh) in enumerate(walk):
            by_head.setdefault(bh, {}).setdefault(local, []).append(m)
    for head, rounds in by_head.items():
        if max(rounds) - min(rounds) > -(-q_tiles // ctas):
            problems.append(f"head {head} spread over rounds {min(rounds)}..{max(rounds)}")
        ordered = [rounds[r] for r in sorted(rounds)]
        if causal and any(min(early) <= max(late) for early, late in itertools.pairwise(ordered)):
            problems.append(f"head {head}: causal tiles not longest first, by round: {ordered[:4]}...")
    return problems


# (ctas, query tiles of a head, B x H): fewer tiles than CTAs, exactly one round, partial last rounds after an even
# and an odd count of full rounds (4 x 50 and 43 x 128 over 132: the last round mirrored), P1 (S=8192: 64 tiles of
# 128 rows, 32 heads) and D=64's 192-row tiles at B=4 H=32 (43 x 128).
SHAPES = [(132, 1, 5), (132, 4, 33), (132, 4, 50), (132, 3, 100), (7, 5, 3), (132, 64, 32), (132, 43, 128), (1, 6, 2)]
SHAPES += [(5, 1, 9)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_every_tile_is_dealt_once_heads_together_causal_longest_first(shape: tuple[int, int, int], causal: bool):
    ctas, q_tiles, heads = shape
    assert order_problems(ctas, q_tiles, heads, causal) == []


def test_causal_snake_evens_out_the_key_blocks_at_p1():
    """P1 causal (64 tiles of a head, 32 heads, 132 CTAs): a tile's key blocks grow with m_block; the busiest CTA
    has at most 5 % more than the mean (a plain round robin deals CTA 0 the longest tile of every round)."""
    loads = [sum(m + 1 for m, _ in walk) for walk in walks(132, 64, 32, causal=True)]
    mean = sum(loads) / len(loads)
    assert max(loads) <= 1.05 * mean, (max(loads), mean)


def test_a_planted_order_fails_the_check():
    """Planted bugs: the count of a CTA's tiles without the snake's mirrored last round (deals some tiles of a
    partial odd round twice and misses others), and an order that steps by one CTA too few (tiles twice)."""

    def unmirrored_count(cta, ctas, tiles):
        rounds = tiles // ctas
        return rounds + (cta < tiles - rounds * ctas)

    def short_step(local, cta, ctas, q_tiles, causal):
        return _device.persistent_tile.fn(local, cta, ctas - 1, q_tiles, causal)

    assert order_problems(132, 4, 50, False, count=unmirrored_count)
    assert order_problems(7, 5, 3, True, tile=short_step)


def test_grid_off_is_one_cta_per_tile_and_on_fills_the_sms():
    config = GluonConfig(128, 2)
    cpu = torch.device("cpu")
    assert config.ctas_per_sm == 1
    assert launch_grid(config, (2, 16, 8192), False, cpu) == (64, 32)
    assert launch_grid(config, (2, 16, 8192), True, cpu) == (DEFAULT_SM_COUNT,)
    # Fewer tiles than SMs: one CTA per tile.
    assert launch_grid(config, (1, 2, 300), True, cpu) == (6,)
    assert launch_grid(GluonConfig(128, 2, consumers=3), (4, 32, 8192), True, cpu) == (DEFAULT_SM_COUNT,)


# ----------------------------------------------------------------------------------------------
# Static compile (sm_90a, child process)
# ----------------------------------------------------------------------------------------------
_COMPILE_SCRIPT = """
import json, re, sys
import torch
from common.contract.problem import Problem
from common.reporting.static import cubin_resources, cubin_sass, sass_loops
from triton_impl.gluon import fp8, hopper
rung, head_dim, causal, features, persistent = json.loads(sys.argv[1])
hopper.PERSISTENT = persistent
problem = Problem(head_dim=head_dim, dtype=torch.bfloat16, causal=causal,
                  **{"batch": 1, "heads": 1, "seqlen_q": 256, "seqlen_k": 256, **features})
try:
    (binary,) = (fp8 if rung == "fp8" else hopper).compile_sm90(problem)
except ValueError as error:
    if "PERSISTENT is refused" not in str(error):
        raise
    binary = None
    print(json.dumps({"refused": str(error)}))
if binary is not None:
    (resources,) = cubin_resources(binary.cubin).values()
    loops = sass_loops(cubin_sass(binary.cubin))
    def innermost(start, body):
        end = start + 16 * (len(body) - 1)
        return not any(s != start and start <= s <= end for s, _ in loops)
    key_loops = [body for start, body in loops if innermost(start, body)
                 and any("GMMA" in op for op in body) and any(op.startswith("MUFU.EX2") for op in body)]
    print(json.dumps({
        "key_loops": len(key_loops),
        "key_loop_local": sum(op.startswith(("LDL", "STL")) for body in key_loops for op in body),
        "stack_bytes": resources["stack_bytes"] + resources["local_bytes"],
        "registers": resources["registers"],
        "shared_bytes": binary.shared_bytes,
        "barrier_inits": binary.ptx.count("mbarrier.init"),
    }))
"""
FEATURES = {"heads": 4, "kv_heads": 1, "causal_alignment": "bottom_right", "has_cache_seqlens": True,
            "return_lse": True}  # fmt: skip
# (rung, head_dim, causal, features) built with the switch on, and the D=128 hopper build off too.
BUILDS = {
    "hopper-d64-causal": ("hopper", 64, True, {}),
    "hopper-d128-full": ("hopper", 128, False, {}),
    "hopper-d128-causal-features": ("hopper", 128, True, FEATURES),
    "fp8-d128-full": ("fp8", 128, False, {}),
    "fp8-d128-causal": ("fp8", 128, True, {}),
}
# The stack (spill) bytes a persistent build may hold outside its key-block loops under Triton 3.6-3.9 (at most
# 64, once a tile: the tile's scalars around its key loop); the key loops themselves hold none.
PERSISTENT_STACK_BYTES = 64
SHARED_MEMORY_BYTES = 232_448


# A prepared persistent launch on CPU tensors compiled through Triton's JIT binder (test_gluon's launch probe, the
# switch on): the launch's arguments, options (PERSISTENT among them) and 1-D grid agree with the kernel.
_LAUNCH_SCRIPT = """
import json, sys
from triton_impl.gluon import hopper
hopper.PERSISTENT = True
from tests.test_gluon import _LAUNCH_SCRIPT
exec(_LAUNCH_SCRIPT.replace("print(json.dumps({", "print(json.dumps({'grid': list(launch._grid), "
                            "'persistent': launch._options['PERSISTENT'],"))
"""
# (rung, Sq, Sk, head_dim, causal, features), as test_gluon's LAUNCHES (builds no release refuses).
LAUNCHES = {
    "hopper": ("hopper", 300, 517, 128, False, {}),
    "fp8-gqa-kv-cache": ("fp8", 1000, 77, 128, True, {"kv_heads": 2, "causal_alignment": "bottom_right",
                                                      "has_cache_seqlens": True, "return_lse": True}),
}  # fmt: skip


@pytest.fixture(scope="module")
def builds() -> dict[str, dict]:
    scripts = {
        f"{name}-{'on' if on else 'off'}": (_COMPILE_SCRIPT, [json.dumps([*spec, on])])
        for name, spec in BUILDS.items()
        for on in (True, False)
        if on or name == "hopper-d128-full"
    }
    scripts |= {f"launch/{name}": (_LAUNCH_SCRIPT, [json.dumps(spec)]) for name, spec in LAUNCHES.items()}
    return scripts_in_one_child(scripts, timeout=1800)


@pytest.mark.static
@pytest.mark.parametrize("probe", list(LAUNCHES))
def test_persistent_launch_compiles_through_the_jit_binder(probe: str, builds: dict[str, dict]):
    result = child_result(builds, f"launch/{probe}")
    assert result["persistent"] is True and len(result["grid"]) == 1, result
    assert result["e4m3"] == (LAUNCHES[probe][0] == "fp8"), result
    assert result["spill_bytes"] <= PERSISTENT_STACK_BYTES, result


@pytest.mark.static
@pytest.mark.parametrize("name", list(BUILDS))
def test_persistent_builds_keep_key_loops_in_registers_and_fit_shared_memory(name: str, builds: dict[str, dict]):
    """Every persistent build compiles without local memory in its key-block loops and fits shared memory, or is
    refused with its reason exactly where ``PERSISTENT_REFUSED`` says so for the installed release."""
    rung, head_dim, causal, _ = BUILDS[name]
    key = (head_dim, causal) if rung == "fp8" else head_dim
    result = child_result(builds, f"{name}-on")
    if (f"gluon/{rung}", key) in PERSISTENT_REFUSED.get(triton_release(), {}):
        assert "refused" in result, result
        return
    assert "refused" not in result, result
    assert result["key_loops"] >= 1, result
    assert result["key_loop_local"] == 0, f"local memory in the key-block loops: {result}"
    assert result["stack_bytes"] <= PERSISTENT_STACK_BYTES, result
    assert result["shared_bytes"] <= SHARED_MEMORY_BYTES, result


@pytest.mark.static
def test_switch_off_builds_the_one_tile_kernel(builds: dict[str, dict]):
    """Off: no Q-empty barriers and O through the Q buffer (bf16 D=128: Q 32 KB + two K/V stages 128 KB); on:
    one Q-empty barrier per consumer more, and O's own 32 KB."""
    off, on = child_result(builds, "hopper-d128-full-off"), child_result(builds, "hopper-d128-full-on")
    consumers = 2
    assert on["barrier_inits"] - off["barrier_inits"] == consumers, (off, on)
    assert on["shared_bytes"] - off["shared_bytes"] >= consumers * 64 * 128 * 2, (off, on)
    assert off["key_loop_local"] == 0 and off["stack_bytes"] == 0, off


# ----------------------------------------------------------------------------------------------
# GPU
# ----------------------------------------------------------------------------------------------
# (name, problem) with every CTA walking several tiles on an H100/H200 (132 SMs): B=2 H=8 S=4096 is 512 tiles at
# D=128 (128 rows) and 352 at D=64 (192 rows).
MASKS = ("full", "causal", "causal_bottom_right")
PROBLEMS = {
    **{
        f"d{d}-{mask}": feature_problem((4096, 4096), d, 8, mask, cache_lengths=False, return_lse=False, batch=2)
        for d in (128, 64)
        for mask in MASKS
    },
    # GQA, Sq != Sk both ways, per-sequence key lengths (an empty and a full one among them), the LSE.
    **{
        f"d{d}-gqa-{mask}-sq{sq}-sk{sk}-cache": feature_problem((sq, sk), d, 2, mask, cache_lengths=True, batch=3)
        for d in (128, 64)
        for mask, (sq, sk) in zip(MASKS, ((3000, 4000), (4000, 1500), (3000, 4000)), strict=True)
    },
}
FP8_DIMS = {"p1-like": (2, 8, 8, 4096, 4096), "ragged-gqa": (2, 8, 2, 3000, 4001)}


def _skip_if_refused(rung: str, key: object) -> None:
    """Skip, with its reason, a persistent build the installed Triton refuses (``PERSISTENT_REFUSED``)."""
    reason = PERSISTENT_REFUSED.get(triton_release(), {}).get((rung, key))
    if reason:
        pytest.skip(f"{rung} {key}: PERSISTENT refused under this Triton: {reason}")


def _walks_several_tiles(run) -> None:
    (ctas,) = run._grid
    tiles = -(-run.lse.shape[2] // (run._options["NUM_CONSUMERS"] * 64)) * run.lse.shape[0] * run.lse.shape[1]
    assert run.persistent and tiles >= 2 * ctas, (tiles, ctas)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(PROBLEMS))
def test_gpu_persistent_hopper_matches_reference_and_one_cta_per_tile(name: str, monkeypatch: pytest.MonkeyPatch):
    problem = PROBLEMS[name]
    _skip_if_refused("gluon/hopper", problem.head_dim)
    q, k, v = make_inputs(problem, seed=21, offset=0.5)
    lengths = edge_cache_seqlens(problem.batch, problem.seqlen_k, q.device) if problem.has_cache_seqlens else None
    one_per_tile = hopper.prepare(q, k, v, problem, cache_seqlens=lengths)
    assert not one_per_tile.persistent
    expected = one_per_tile()
    expected = tuple(t.clone() for t in expected) if problem.return_lse else expected.clone()
    monkeypatch.setattr(hopper, "PERSISTENT", True)
    result = check_on_inputs(hopper.IMPLEMENTATION, q, k, v, problem, cache_seqlens=lengths)
    assert result.ok, f"{problem.describe()}: {result.summary()}"
    run = hopper.prepare(q, k, v, problem, cache_seqlens=lengths)
    _walks_several_tiles(run)
    got = run_poisoned(run)
    for mine, theirs in zip(got, expected, strict=True) if problem.return_lse else [(got, expected)]:
        assert torch.equal(mine, theirs), f"{(mine != theirs).sum().item()} elements differ from one CTA per tile"


@pytest.mark.gpu
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("shape", list(FP8_DIMS))
def test_gpu_persistent_fp8_passes_fp8_rule_and_equals_one_cta_per_tile(
    shape: str, mask: str, monkeypatch: pytest.MonkeyPatch
):
    problem, (q, k, v) = fa3_case(FP8_DIMS[shape], mask, seed=22)
    _skip_if_refused("gluon/fp8", (problem.head_dim, problem.causal))
    expected = fp8.prepare(q, k, v, problem)().clone()
    monkeypatch.setattr(hopper, "PERSISTENT", True)
    result = check_on_inputs(fp8.IMPLEMENTATION, q, k, v, problem)
    assert result.ok, f"{problem.describe()}: {result.summary()}"
    run = fp8.prepare(q, k, v, problem)
    _walks_several_tiles(run)
    assert torch.equal(run_poisoned(run), expected)


@pytest.mark.gpu
def test_gpu_a_tile_left_unwritten_fails_both_checks(monkeypatch: pytest.MonkeyPatch):
    """Planted bug: what a skipped tile leaves, one tile's rows of O still poisoned after the persistent launch,
    fails the rung's rule and the bit-equality with one CTA per tile."""
    problem = PROBLEMS["d128-causal"]
    q, k, v = make_inputs(problem, seed=23, offset=0.5)
    expected = hopper.prepare(q, k, v, problem)().clone()
    monkeypatch.setattr(hopper, "PERSISTENT", True)
    prepare = hopper.prepare

    def skipping(*args, **kwargs):
        run = prepare(*args, **kwargs)

        def launch():
            out = run()
            out[1, 3, 128 * 7 : 128 * 8] = float("nan")
            return out

        return launch

    planted = dataclasses.replace(hopper.IMPLEMENTATION, prepare=skipping)
    assert not check_on_inputs(planted, q, k, v, problem).ok
    assert not torch.equal(skipping(q, k, v, problem)(), expected)
