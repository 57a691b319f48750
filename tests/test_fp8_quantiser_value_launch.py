"""The fused FP8 quantiser with V in a launch of its own (``QuantiserConfig.value_config``, each binary holding only
its tensors' code) and one tensor's programs alone (``FusedQuantiser(..., only=)``, the bandwidth A/B's K and V
times): on CPU under the Triton interpreter, byte for byte the default configuration's, with planted bugs the
comparisons catch; the sm_90a builds of the A/B's V ring (no spills, two programs an SM, where a binary holding every
tensor's branch fits fewer); on the GPU, every candidate of bench/fp8_kv_quantiser_bw.py and of bench/fp8_kv_d128_ab.sh
(``KV_D128_CANDIDATES``) at P1 and ragged GQA."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from bench.fp8_kv_quantiser_bw import candidates
from bench.fp8_quantiser import KV_D128_CANDIDATES, V_APART_SPILLS
from common.contract import fp8
from common.contract.problem import Problem
from common.toolchain.releases import triton_release
from triton_impl import fp8_quantiser as fused
from triton_impl import fp8_quantiser_kernel as kernel

ROOT = Path(__file__).resolve().parent.parent
NAMES = ("q8", "k8", "vt8", "q_scale", "k_scale", "v_scale")
# Indices in KernelOperands.buffers() of each tensor's bytes and scales.
TENSOR_BUFFERS = {"q": (0, 3), "k": (1, 4), "v": (2, 5)}
LAYOUTS = {
    "triton": fp8.ValueLayout(permuted=False, key_multiple=16),
    "cute": fp8.ValueLayout(permuted=True, key_multiple=16),
    "gluon": fp8.ValueLayout(permuted=True, key_multiple=128),
}
Config = fused.QuantiserConfig
# bench/fp8_kv_quantiser_bw.py's candidates beyond the K/V default (the same names at every head dim).
CANDIDATE_NAMES = [name for name in candidates(128) if name != "default"]
# Interpreted, what changes is the program ranges, the launches and the tiles each program walks (warps, stages and
# register caps only matter compiled; the last is the A/B's ring).
VALUE_CONFIGS = [
    Config(tiles_per_program=3, prefetch=True, value_config=Config(tiles_per_program=2)),
    Config(single_launch=False, value_config=Config(tiles_per_program=3, prefetch=True)),
    Config(tiles_per_program=2, value_config=Config(tiles_per_program=8, num_stages=4, num_warps=16, maxnreg=64)),
]


def _problem(head_dim: int, dtype: torch.dtype, seqlens: tuple[int, int] = (600, 150)) -> Problem:
    """GQA (2 query heads over 1 KV head), two sequences, ragged in every block size: Q's 20 tiles and K's and V's
    4 leave the last program of each tensor short."""
    return Problem(2, 2, *seqlens, head_dim, dtype=dtype, kv_heads=1)


@functools.cache
def _inputs(problem: Problem, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FA3's outlier inputs with an offset on V, drawn once per problem (at P1 the draw takes seconds); callers do
    not modify them."""
    q, k, v = fp8.fa3_inputs(problem, seed=problem.seqlen_q + problem.head_dim, device=device)
    return q, k, v + 0.5


def _written(quantiser: fused.FusedQuantiser, q, k, v, only: str | None = None) -> list[torch.Tensor]:
    """The six buffers after a call into poisoned ones (copies)."""
    quantiser.operands.poison_()
    return [tensor.clone() for tensor in quantiser(q, k, v, only=only).buffers()]


def _poisoned(buffer: torch.Tensor) -> bool:
    return bool(torch.all(buffer == 0x7F)) if buffer.dtype == torch.uint8 else bool(torch.all(buffer.isnan()))


# ----------------------------------------------------------------------------------------------------
# CPU (interpreter)
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("config", VALUE_CONFIGS, ids=lambda config: config.describe())
@pytest.mark.parametrize(
    ("variant", "layout", "head_dim", "dtype", "query"),
    [
        ("block+rotation", "cute", 64, torch.bfloat16, False),
        ("block+rotation", "cute", 64, torch.bfloat16, True),
        ("per-tensor", "gluon", 64, torch.float16, True),
        ("block", "triton", 128, torch.float16, True),
    ],
)
def test_v_apart_writes_the_default_configurations_bytes(
    config: fused.QuantiserConfig, variant: str, layout: str, head_dim: int, dtype: torch.dtype, query: bool
):
    """Into poisoned buffers, byte for byte what the default configuration writes, in one launch more than the
    configuration without ``value_config`` (V's); without ``query``, Q's buffers keep their poison."""
    q, k, v = _inputs(_problem(head_dim, dtype))
    quantisation = fp8.quantisation_named(variant)
    default = fused.quantise_fused(q, k, v, quantisation, LAYOUTS[layout]).buffers()
    quantiser = fused.FusedQuantiser(q.shape, k.shape, dtype, "cpu", quantisation, LAYOUTS[layout], config=config,
                                     query=query)  # fmt: skip
    got = _written(quantiser, q, k, v)
    for index, (name, buffer, want) in enumerate(zip(NAMES, got, default, strict=True)):
        if query or index not in TENSOR_BUFFERS["q"]:
            assert torch.equal(buffer, want), f"{config.describe()}: {name} differs from the default configuration's"
        else:
            assert _poisoned(buffer), f"{name} written by a quantiser of K and V only"
    per_pass = (3 if query else 2) if not config.single_launch else 2
    assert quantiser.launches == (per_pass if quantisation.block else 2 * per_pass + 1)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("name", CANDIDATE_NAMES)
def test_the_bandwidth_candidates_write_the_default_configurations_bytes(name: str, head_dim: int):
    """Interpreted (their program ranges, tiles a program and overlap), each candidate of bench/fp8_kv_quantiser_bw.py
    writes K's and V's bytes and scales as the K/V default does, in cute/fp8's layout."""
    q, k, v = _inputs(_problem(head_dim, torch.bfloat16))
    quantisation, layout = fp8.quantisation_named("block+rotation"), LAYOUTS["cute"]
    written = {}
    for key in ("default", name):
        config = candidates(head_dim)[key]
        quantiser = fused.FusedQuantiser(q.shape, k.shape, q.dtype, "cpu", quantisation, layout, config=config,
                                         query=False)  # fmt: skip
        written[key] = _written(quantiser, q, k, v)
    for index in (*TENSOR_BUFFERS["k"], *TENSOR_BUFFERS["v"]):
        assert torch.equal(written[name][index], written["default"][index]), f"{name}: {NAMES[index]} differs"


def _kv_written(config: fused.QuantiserConfig, problem: Problem, device: str) -> list[torch.Tensor]:
    """K's and V's bytes and scales of the K/V-only quantiser (cute/fp8's layout) at ``config`` (poisoned first)."""
    q, k, v = _inputs(problem, device)
    quantiser = fused.FusedQuantiser(q.shape, k.shape, q.dtype, q.device, fp8.quantisation_named("block+rotation"),
                                     LAYOUTS["cute"], config=config, query=False)  # fmt: skip
    written = _written(quantiser, q, k, v)
    return [written[index] for index in (*TENSOR_BUFFERS["k"], *TENSOR_BUFFERS["v"])]


@pytest.mark.parametrize("config", KV_D128_CANDIDATES[1:], ids=lambda config: config.describe())
def test_the_d128_kv_candidates_write_the_default_configurations_bytes(config: fused.QuantiserConfig):
    """Interpreted (V's launch apart, K's tiles by TMA copies; the L2 prefetch is a no-op there), each candidate of
    bench/fp8_kv_d128_ab.sh writes K's and V's bytes and scales as the first (the K/V default under Triton 3.6) does."""
    problem = _problem(128, torch.bfloat16)
    for name, got, want in zip(("k8", "k_scale", "vt8", "v_scale"), _kv_written(config, problem, "cpu"),
                               _kv_written(KV_D128_CANDIDATES[0], problem, "cpu"), strict=True):  # fmt: skip
        assert torch.equal(got, want), f"{config.describe()}: {name} differs from the default configuration's"


@pytest.mark.parametrize("config", [None, VALUE_CONFIGS[0]], ids=["default", "V apart"])
@pytest.mark.parametrize("only", ["q", "k", "v"])
def test_one_tensors_programs_write_its_bytes_and_nothing_else(config: fused.QuantiserConfig | None, only: str):
    """``only``: that tensor's bytes and scales as the full call writes them, every other buffer still poisoned."""
    q, k, v = _inputs(_problem(64, torch.bfloat16))
    quantisation, layout = fp8.quantisation_named("block+rotation"), LAYOUTS["cute"]
    quantiser = fused.FusedQuantiser(q.shape, k.shape, q.dtype, "cpu", quantisation, layout, config=config)
    full = _written(quantiser, q, k, v)
    got = _written(quantiser, q, k, v, only=only)
    for index, (name, buffer, want) in enumerate(zip(NAMES, got, full, strict=True)):
        if index in TENSOR_BUFFERS[only]:
            assert torch.equal(buffer, want), f"only={only}: {name} differs from the full call's"
        else:
            assert _poisoned(buffer), f"only={only}: {name} written"


def test_a_v_launch_whose_binary_lacks_vs_code_is_caught(monkeypatch: pytest.MonkeyPatch):
    """The bytes test fails a planted bug: V's launch built without V's code (its ``holds`` K's), so that V's
    programs run nothing and V's bytes and scales keep their poison."""
    q, k, v = _inputs(_problem(64, torch.bfloat16))
    quantisation, layout = fp8.quantisation_named("block+rotation"), LAYOUTS["cute"]
    default = fused.quantise_fused(q, k, v, quantisation, layout).buffers()
    plans = fused._launch_plans

    def v_launch_holding_k(*args, **kwargs):
        *first, value = plans(*args, **kwargs)
        return (*first, value._replace(holds=(False, True, False)))

    monkeypatch.setattr(fused, "_launch_plans", v_launch_holding_k)
    quantiser = fused.FusedQuantiser(q.shape, k.shape, q.dtype, "cpu", quantisation, layout, config=VALUE_CONFIGS[0])
    got = _written(quantiser, q, k, v)
    assert [torch.equal(a, b) for a, b in zip(got, default, strict=True)] == [True, True, False, True, True, False]


def test_a_call_that_launches_every_tensor_for_only_one_is_caught(monkeypatch: pytest.MonkeyPatch):
    """The ``only`` test fails a planted bug: ``only`` dropped, every tensor launched, so K's buffers are written."""
    q, k, v = _inputs(_problem(64, torch.bfloat16))
    quantiser = fused.FusedQuantiser(q.shape, k.shape, q.dtype, "cpu", fp8.quantisation_named("block+rotation"),
                                     LAYOUTS["cute"])  # fmt: skip
    launch = quantiser._launch

    def every_tensor(tensors, descriptors, step, only=None):
        launch(tensors, descriptors, step)

    monkeypatch.setattr(quantiser, "_launch", every_tensor)
    got = _written(quantiser, q, k, v, only="v")
    assert not _poisoned(got[TENSOR_BUFFERS["k"][0]])


def test_the_bandwidth_ab_judges_each_candidate_and_times_k_v_and_the_copy_in_rounds(monkeypatch: pytest.MonkeyPatch):
    """bench/fp8_kv_quantiser_bw.py at a small shape (interpreted, timings stubbed): every candidate judged against
    the default's bytes, then every run (K+V, K alone, V alone per candidate, the torch copies and the ceilings: the
    Triton stream at two block sizes, the bf16 copy) timed once a round in turn, medians kept, GB/s against the
    copy's and the read bandwidth; ``--only default`` leaves the other candidates out."""
    import argparse
    from types import SimpleNamespace

    import common.measure.timing as timing
    from bench import fp8_kv_quantiser_bw as bench

    _, k, v = _inputs(_problem(64, torch.bfloat16))
    monkeypatch.setitem(bench.SHAPES, "small", tuple(k.shape))
    monkeypatch.setattr(bench, "_inputs", lambda *shape: (torch.empty_like(k), k, v))
    names = [name for name in candidates(64) if name != "default"]  # D=64 has two candidates more
    ceilings = [f"triton stream {block}" for block in bench.STREAM_BLOCKS] + [bench.BF16_COPY]
    calls, runs = [], 3 * (len(names) + 2 + len(ceilings))

    def time_cuda(run, **options):
        run()
        calls.append(run)
        return SimpleNamespace(ms=1e-3 if len(calls) <= runs else 2e-3)  # 1 µs each run the first round, then 2

    monkeypatch.setattr(timing, "time_cuda", time_cuda)
    options = argparse.Namespace(rounds=2, warmup_ms=0, rep_ms=0, only="")
    rows = bench.shape_rows("small", options, read_gbps=1.0)
    assert len(calls) == 2 * runs and calls[:runs] == calls[runs:]
    assert [row.name for row in rows] == ["default", *names, "torch copy (roofline)", *ceilings]
    assert [row.same_bytes for row in rows] == ["first", *["yes"] * len(names), *["-"] * (1 + len(ceilings))]
    assert all(row.kv_us == row.k_us == row.v_us == 1.5 for row in rows)
    copy, stream, bf16_copy = rows[len(names) + 1], rows[len(names) + 2], rows[-1]
    assert copy.of_copy == stream.of_copy == 1.0 and rows[0].of_read == rows[0].gbps
    assert bf16_copy.of_copy == pytest.approx(4 / 3)  # 2 bytes written an element where the e4m3 copy writes 1
    table = bench.markdown(rows, 1.0, "cpu").splitlines()
    assert sum(line.startswith("| small |") for line in table) == len(rows)
    calls.clear()
    only = bench.shape_rows("small", argparse.Namespace(**{**vars(options), "only": "default"}), read_gbps=1.0)
    assert [row.name for row in only] == ["default", "torch copy (roofline)", *ceilings]


@triton.jit
def _back_to_back_kernel(OUT, T, TILE_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    tl.store(OUT, kernel._tiles_back_to_back(T, TILE_ROWS, HEAD_DIM).to(tl.int32))


def _back_to_back(x: torch.Tensor, tensor: int, layout: fp8.ValueLayout) -> bool:
    """``_tiles_back_to_back`` of tensor ``tensor`` (0 Q, 1 K, 2 V) of a quantiser whose inputs are all ``x``."""
    quantisation = fp8.quantisation_named("block+rotation")
    geometry = fused._geometries(tuple(x.shape), tuple(x.shape), quantisation, layout)[tensor]
    scratch = torch.zeros(1, dtype=torch.float32)
    out = torch.zeros(1, dtype=torch.int32)
    arguments = geometry.arguments(x, torch.zeros(1, dtype=torch.uint8), scratch, scratch, scratch)
    _back_to_back_kernel[(1,)](out, arguments, TILE_ROWS=fused._tile_rows_of(quantisation), HEAD_DIM=x.shape[-1])
    return bool(out.item())


def test_the_l2_prefetch_asks_only_where_tile_t_starts_t_tiles_in():
    """``l2_prefetch`` addresses tile t as t tiles from the tensor's start (no division): true for contiguous inputs
    whose S is a multiple of the tile, K and V (keys padded to 16) alike; false (no prefetch) for a ragged S, a
    transposed (B, S, H, D) view, or V's keys padded past S (a layout of 256-key multiples at S = 128)."""
    contiguous = torch.zeros(2, 2, 256, 64, dtype=torch.bfloat16)
    assert _back_to_back(contiguous, 1, LAYOUTS["cute"]) and _back_to_back(contiguous, 2, LAYOUTS["cute"])
    assert not _back_to_back(torch.zeros(2, 2, 200, 64, dtype=torch.bfloat16), 1, LAYOUTS["cute"])
    assert not _back_to_back(torch.zeros(2, 256, 2, 64, dtype=torch.bfloat16).transpose(1, 2), 1, LAYOUTS["cute"])
    short = torch.zeros(2, 2, 128, 64, dtype=torch.bfloat16)
    assert not _back_to_back(short, 2, fp8.ValueLayout(permuted=True, key_multiple=256))


def test_a_guard_that_forgets_vs_padded_keys_is_caught(monkeypatch: pytest.MonkeyPatch):
    """The guard test fails a planted bug: the check of V's padded keys dropped, so that a tile past S's last would
    be asked for at t tiles in (another head's rows)."""

    @triton.jit
    def without_padding_check(T, TILE_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
        rows = (T.stride_d == 1) & (T.stride_s == HEAD_DIM) & (T.seqlen % TILE_ROWS == 0)
        return rows & (T.stride_h == T.seqlen * HEAD_DIM) & (T.stride_b == T.heads * T.seqlen * HEAD_DIM)

    monkeypatch.setattr(kernel, "_tiles_back_to_back", without_padding_check)
    short = torch.zeros(2, 2, 128, 64, dtype=torch.bfloat16)
    assert _back_to_back(short, 2, fp8.ValueLayout(permuted=True, key_multiple=256))


def test_value_config_and_only_refuse_what_they_cannot_run():
    with pytest.raises(ValueError, match="value_config launches V on its own by program ranges"):
        Config(value_config=Config(programs_per_sm=1))
    with pytest.raises(ValueError, match="value_config launches V on its own by program ranges"):
        Config(interleave=True, value_config=Config())
    with pytest.raises(ValueError, match="value_config launches V on its own by program ranges"):
        Config(value_config=Config(value_config=Config()))
    shapes = ((2, 2, 64, 64), (2, 1, 64, 64), torch.bfloat16, "cpu")
    tensors = (torch.zeros(2, 2, 64, 64, dtype=torch.bfloat16), *(torch.zeros(2, 1, 64, 64, dtype=torch.bfloat16),) * 2)
    kv_only = fused.FusedQuantiser(*shapes, fp8.quantisation_named("block"), LAYOUTS["cute"], query=False)
    with pytest.raises(ValueError, match=r"only= takes one of \('k', 'v'\)"):
        kv_only(*tensors, only="q")
    per_tensor = fused.FusedQuantiser(*shapes, fp8.quantisation_named("per-tensor"), LAYOUTS["cute"])
    with pytest.raises(ValueError, match="with block scales and program ranges, got 'k' with per-tensor"):
        per_tensor(*tensors, only="k")
    persistent = fused.FusedQuantiser(*shapes, fp8.quantisation_named("block"), LAYOUTS["cute"],
                                      config=Config(programs_per_sm=1))  # fmt: skip
    with pytest.raises(ValueError, match="with block scales and program ranges"):
        persistent(*tensors, only="v")


# ----------------------------------------------------------------------------------------------------
# sm_90a builds (no GPU needed)
# ----------------------------------------------------------------------------------------------------
_BUILD_PROBE = r"""
import dataclasses, json, re
import torch
from bench.fp8_kv_quantiser_bw import candidates
from bench.fp8_quantiser import KV_D128_CANDIDATES
from common.contract import fp8
from common.reporting.static import cubin_resources, cubin_sass
from triton_impl import fp8_quantiser as fused
from triton_impl import fp8_quantiser_kernel as kernel

def facts(binary):
    (usage,) = cubin_resources(binary.cubin).values()
    return {"registers": usage["registers"], "spills": usage["local_bytes"] + usage["stack_bytes"],
            "shared": binary.shared_bytes, "threads": binary.threads_per_cta,
            "wgmma": bool(re.search(r"wgmma\.mma_async", binary.ptx)),
            "cp_async": bool(re.search(r"cp\.async\.cg\.shared\.global", binary.ptx)),
            "l2_prefetches": len(re.findall(r"cp\.async\.bulk\.prefetch\.L2\.global", binary.ptx)),
            "register_a": bool(re.search(r"wgmma\.mma_async[^;]*\}\s*,\s*\{", binary.ptx)),
            "loop_membars": rotation_loop_membars(cubin_sass(binary.cubin))}

# MEMBARs in the loops (a backward branch and what it spans) that hold the rotation's HGMMA; -1: no such loop.
def rotation_loop_membars(sass):
    listing = re.findall(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);", sass)
    listing = [(int(at, 16), op, rest) for at, op, rest in listing]
    counts = []
    for end, (at, op, rest) in enumerate(listing):
        target = re.match(r"\s*0x([0-9a-f]+)", rest)
        if op.startswith("BRA") and target and int(target.group(1), 16) < at:
            body = [o for a, o, _ in listing[: end + 1] if a >= int(target.group(1), 16)]
            if any(o.startswith("HGMMA") for o in body):
                counts.append(sum(o.startswith("MEMBAR") for o in body))
    return max(counts, default=-1)

quantisation, layout = fp8.VARIANTS["block+rotation"], fp8.ValueLayout(True, 16)
ring = candidates(128)["V ring 2x warps, 4 stages"]
built = [facts(b) for b in fused.compile_sm90(128, torch.bfloat16, quantisation, layout, config=ring, query=False)]
# Planted: V's ring in a binary that holds every tensor's branch (no value_config).
planted = [facts(b) for b in fused.compile_sm90(128, torch.bfloat16, quantisation, layout, config=ring.value_config,
                                                query=False)]
# The L2 prefetch at P1 and D=64 (one launch, every tensor's branch), and the default without it.
l2 = [facts(b) for d in (128, 64) for b in fused.compile_sm90(d, torch.bfloat16, quantisation, layout,
                                                               config=candidates(d)["L2 prefetch"], query=False)]
plain = [facts(b) for b in fused.compile_sm90(128, torch.bfloat16, quantisation, layout, query=False)]
# KV_D128_CANDIDATES' K ring read into registers (helper kchain), and the same ring whose wgmma reads shared memory.
kchain = KV_D128_CANDIDATES[-1]
register = [facts(b) for b in fused.compile_sm90(128, torch.bfloat16, quantisation, layout, config=kchain, query=False)]
ring = [facts(b) for b in fused.compile_sm90(128, torch.bfloat16, quantisation, layout,
                                             config=dataclasses.replace(kchain, register_operand=False), query=False)]
print(json.dumps({"built": built, "planted": planted, "l2": l2, "plain": plain, "register": register, "ring": ring}))
"""


@functools.cache
def _build_report() -> dict:
    """The build probe's facts, compiled once in a process without the interpreter."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", _BUILD_PROBE], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


# Shared memory and registers of one SM of sm_90, and what the hardware reserves per CTA.
SM90_SHARED_MEMORY_PER_SM, SHARED_MEMORY_PER_CTA_RESERVED, SM90_REGISTERS_PER_SM = 233_472, 1024, 65_536


def _programs_an_sm(facts: dict) -> int:
    by_shared = SM90_SHARED_MEMORY_PER_SM // (facts["shared"] + SHARED_MEMORY_PER_CTA_RESERVED)
    return min(by_shared, SM90_REGISTERS_PER_SM // (facts["registers"] * facts["threads"]))


@pytest.mark.static
def test_the_value_ring_builds_two_spill_free_binaries_that_fit_two_programs_an_sm():
    """The A/B's ring at P1 (D = 128, K and V only): K's binary (the wgmma rotation) and V's (cp.async, no wgmma),
    neither spilling, each fitting two programs an SM; the same V configuration in a binary that holds every tensor's
    branch fits fewer (the rule's planted counterpart: the branches' shared memory adds up, 256 KB under Triton 3.8)."""
    report = _build_report()
    keys, values = report["built"]
    assert keys["wgmma"] and not values["wgmma"] and values["cp_async"], report
    for facts in (keys, values):
        assert facts["spills"] == 0 and _programs_an_sm(facts) >= 2, facts
    (planted,) = report["planted"]
    assert _programs_an_sm(planted) < 2, planted


@pytest.mark.static
def test_the_l2_prefetch_builds_spill_free_with_a_bulk_prefetch_in_each_tensors_loop():
    """``l2_prefetch`` at P1 and D=64 (the K/V launch's binary, Q's, K's and V's branches): one bulk L2 prefetch in each
    branch, no spills, as many programs an SM as the default's; the default has none (the rule's counterpart)."""
    report = _build_report()
    (plain,) = report["plain"]
    assert plain["l2_prefetches"] == 0, plain
    for facts in report["l2"]:
        assert facts["l2_prefetches"] == 3 and facts["spills"] == 0, facts
    assert _programs_an_sm(report["l2"][0]) == _programs_an_sm(plain), report


@pytest.mark.static
def test_the_register_operand_ring_feeds_ks_wgmma_from_registers_with_no_fence_in_its_loop():
    """``register_operand`` in KV_D128_CANDIDATES' K ring (3 cp.async stages, V apart): K's binary issues the rotation's
    wgmma with A in registers, no MEMBAR (the proxy fence) in its loop, no spills, two programs an SM. Its counterparts:
    the same ring with the wgmma reading shared memory needs a copy of the tile beside the ring (one program an SM),
    and the K/V default fences in its rotation loop. V's binary (V apart, the register prefetch) spills under the
    releases of ``V_APART_SPILLS`` alone."""
    report = _build_report()
    keys, values = report["register"]
    assert keys["register_a"] and keys["loop_membars"] == 0 and keys["spills"] == 0, keys
    v_spills = triton_release() in V_APART_SPILLS
    assert _programs_an_sm(keys) >= 2 and (values["spills"] > 0) == v_spills, report["register"]
    ring_keys, _ = report["ring"]
    assert not ring_keys["register_a"] and _programs_an_sm(ring_keys) < 2, ring_keys
    (plain,) = report["plain"]
    assert not plain["register_a"] and plain["loop_membars"] >= 1, plain


# ----------------------------------------------------------------------------------------------------
# GPU
# ----------------------------------------------------------------------------------------------------
# P1 (the A/B's shape, tiles back to back) for every candidate; the ragged GQA shape (S = 777: no L2 prefetch, a
# partial last tile) for those that change the default's launch itself.
GPU_CASES = [((2, 16, 16, 8192, 8192, 128), name) for name in CANDIDATE_NAMES] + [
    ((2, 8, 2, 1000, 777, 128), name) for name in ("L2 prefetch", "L2 prefetch, V 2x warps", "V 2x warps")
]


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "name"), GPU_CASES, ids=str)
def test_gpu_the_bandwidth_candidates_write_the_default_configurations_bytes(shape: tuple, name: str):
    """Compiled, each candidate of bench/fp8_kv_quantiser_bw.py (K and V only, cute/fp8's layout) writes K's and V's
    bytes and scales as the K/V default does, into poisoned buffers, and K alone and V alone (``only``) write theirs."""
    batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim = shape
    problem = Problem(batch, heads, seqlen_q, seqlen_k, head_dim, dtype=torch.bfloat16, kv_heads=kv_heads)
    q, k, v = _inputs(problem, "cuda")
    quantisation, layout = fp8.quantisation_named("block+rotation"), LAYOUTS["cute"]
    configs = candidates(head_dim)
    built = {
        key: fused.FusedQuantiser(
            q.shape, k.shape, q.dtype, q.device, quantisation, layout, config=configs[key], query=False
        )
        for key in ("default", name)
    }
    default = _written(built["default"], q, k, v)
    got = _written(built[name], q, k, v)
    for index in (*TENSOR_BUFFERS["k"], *TENSOR_BUFFERS["v"]):
        assert torch.equal(got[index], default[index]), f"{name}: {NAMES[index]} differs from the default's"
    for only in ("k", "v"):
        alone = _written(built[name], q, k, v, only=only)
        for index, buffer in enumerate(alone):
            if index in TENSOR_BUFFERS[only]:
                assert torch.equal(buffer, default[index]), f"{name} only={only}: {NAMES[index]} differs"
            else:
                assert _poisoned(buffer), f"{name} only={only}: {NAMES[index]} written"


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 16, 16, 8192, 8192, 128), (2, 8, 2, 1000, 777, 128)], ids=str)
@pytest.mark.parametrize("config", KV_D128_CANDIDATES[1:], ids=lambda config: config.describe())
def test_gpu_the_d128_kv_candidates_write_the_default_configurations_bytes(shape: tuple, config: fused.QuantiserConfig):
    """Compiled, each candidate of bench/fp8_kv_d128_ab.sh writes K's and V's bytes and scales as the K/V default does
    (into poisoned buffers), at P1 (V's tiles back to back: the L2 prefetch runs) and a ragged GQA shape (S = 777: K's
    last TMA box filled past S with zeros, no L2 prefetch)."""
    batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim = shape
    problem = Problem(batch, heads, seqlen_q, seqlen_k, head_dim, dtype=torch.bfloat16, kv_heads=kv_heads)
    for name, got, want in zip(("k8", "k_scale", "vt8", "v_scale"), _kv_written(config, problem, "cuda"),
                               _kv_written(None, problem, "cuda"), strict=True):  # fmt: skip
        assert torch.equal(got, want), f"{config.describe()}: {name} differs from the K/V default's"


@pytest.mark.gpu
def test_gpu_v_apart_with_q_writes_the_default_configurations_bytes():
    """The full quantiser (Q, K, V) with V's ring apart: all six buffers as the default's, at a ragged GQA shape."""
    problem = Problem(2, 8, 1000, 777, 128, dtype=torch.bfloat16, kv_heads=2)
    q, k, v = _inputs(problem, "cuda")
    quantisation, layout = fp8.quantisation_named("block+rotation"), LAYOUTS["gluon"]
    default = [t.clone() for t in fused.quantise_fused(q, k, v, quantisation, layout).buffers()]
    config = dataclasses.replace(fused.default_config(128, quantisation), value_config=VALUE_CONFIGS[2].value_config)
    quantiser = fused.FusedQuantiser(q.shape, k.shape, q.dtype, q.device, quantisation, layout, config=config)
    for name, got, want in zip(NAMES, _written(quantiser, q, k, v), default, strict=True):
        assert torch.equal(got, want), f"{name} differs from the default configuration's"
