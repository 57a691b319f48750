"""The FP8 rungs (``triton/fp8``, ``gluon/fp8``, ``cute/fp8``) in every quantisation variant, judged by ``FP8_RULE``
against the fp64 emulation of their own quantisation; static checks of every variant's build."""

from __future__ import annotations

import importlib
import importlib.util

import pytest
import torch

from common.contract.check import check_on_inputs, run_poisoned
from common.contract.fp8 import VARIANTS, fa3_inputs
from common.contract.inputs import make_inputs
from common.contract.metrics import FP8_RULE, error_stats
from common.contract.problem import Problem
from common.contract.reference import reference_attention
from tests._helpers import (
    MASKS,
    edge_cache_seqlens,
    fa3_case,
    feature_grid,
    feature_problem,
    json_from_child,
    require_supported,
)

HAS_CUTLASS = importlib.util.find_spec("cutlass") is not None
# The CuTe rung is tested wherever its DSL is installed; a broken import then fails here, not skips.
MODULES = ["triton_impl.fp8", "triton_impl.gluon.fp8", *(["cute_impl.fp8"] if HAS_CUTLASS else [])]
CAUSAL_STACK_BYTES = 8
SEQLENS = [(1, 1), (77, 1000), (1000, 77), (8191, 8191)]
INPUTS = {
    "normal": lambda problem, seed: make_inputs(problem, seed=seed),
    "fa3": lambda problem, seed: fa3_inputs(problem, seed=seed, device="cuda"),
}


def _module(name: str):
    return importlib.import_module(name)


# ----------------------------------------------------------------------------------------------------
# CPU
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("module_name", MODULES)
def test_fp8_rungs_are_judged_against_their_emulation(module_name: str):
    impl = _module(module_name).IMPLEMENTATION
    assert impl.error_rule is FP8_RULE and FP8_RULE.needs_emulation
    assert impl.emulate is not None and impl.prepare_end_to_end is not None and impl.bind is not None
    module = _module(module_name)
    assert module.DEFAULT_QUANTISATION.describe() in impl.notes


def test_value_operand_is_transposed_padded_and_permuted():
    """V as cute/fp8 and gluon/fp8 read it (``common.contract.fp8.value_operand``)."""
    fp8 = _module("common.contract.fp8")
    assert sorted(fp8.PERMUTED_KEY_ORDER) == list(range(fp8.KEY_GROUP))
    seqlen_k, head_dim = 37, 64
    v8 = torch.randn(2, 3, seqlen_k, head_dim).to(torch.float8_e4m3fn)
    vt = fp8.value_operand(v8).view(torch.uint8)
    padded = 48
    assert vt.shape == (2, 3, head_dim, padded) and vt.stride(-1) == 1
    source = v8.view(torch.uint8)
    for slot in range(padded):
        key = (slot // fp8.KEY_GROUP) * fp8.KEY_GROUP + fp8.PERMUTED_KEY_ORDER[slot % fp8.KEY_GROUP]
        expected = source[:, :, key] if key < seqlen_k else torch.zeros_like(source[:, :, 0])
        assert torch.equal(vt[:, :, :, slot], expected), f"slot {slot} should hold key {key}"
    # Padded to whole 64-key blocks (gluon/fp8): the extra slots are zeros.
    wide = fp8.value_operand(v8, key_multiple=64).view(torch.uint8)
    assert wide.shape == (2, 3, head_dim, 64) and torch.equal(wide[..., :padded], vt)
    assert not wide[..., padded:].any()
    with pytest.raises(ValueError, match="multiple of 16"):
        fp8.value_operand(v8, key_multiple=24)


def _d64_candidates() -> list:
    """(rung as bench.gluon_sweep names it, configuration, causal) of every D=64 FP8 candidate."""
    mask = {False: "full", True: "causal"}
    gluon = _module("triton_impl.gluon.fp8").D64_CANDIDATES
    tiles = "{0.block_n}n{0.num_stages}s{0.consumers}c".format
    cands = [
        pytest.param("fp8", cfg, causal, id=f"gluon-{mask[causal]}-{tiles(cfg)}" + "-pp" * cfg.pingpong)
        for causal in gluon
        for cfg in gluon[causal]
    ]
    if HAS_CUTLASS:
        cute = _module("cute_impl.fp8").D64_CANDIDATES
        cands += [
            pytest.param("cute/fp8", knobs, causal, id=f"cute-{mask[causal]}-{name}")
            for causal in cute
            for name, knobs in cute[causal].items()
        ]
    return cands


@pytest.mark.skipif(not HAS_CUTLASS, reason="needs nvidia-cutlass-dsl")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cute_d64_candidates_are_distinct_configurations_with_matching_scales(causal: bool):
    """Each knob set names real fields, differs from the default and from the others, and its
    quantisation's K/V blocks match its key blocks (``fp8_config`` refuses otherwise). No compile:
    ``python -m bench.gluon_sweep static --cands fp8-d64`` gives their registers and spills."""
    fp8 = _module("cute_impl.fp8")
    problem = Problem(4, 32, 8192, 8192, 64, causal=causal)
    configs = [fp8.fp8_config(problem, fp8.DEFAULT_QUANTISATION)]
    for knobs in fp8.D64_CANDIDATES[causal].values():
        configs.append(fp8.fp8_config(problem, fp8.candidate_quantisation(knobs), **knobs))
    assert len(set(configs)) == len(configs), "two D=64 candidates (or one and the default) are the same kernel"


@pytest.mark.skipif(not HAS_CUTLASS, reason="needs nvidia-cutlass-dsl")
def test_cute_block_scales_must_match_its_tiles():
    fp8 = _module("cute_impl.fp8")
    odd = VARIANTS["block"].__class__(block=True, rotation=False, q_block_rows=128, kv_block_rows=128)
    with pytest.raises(ValueError, match="must match its tiles"):
        fp8.fp8_config(Problem(1, 1, 64, 64, 128), odd)
    with pytest.raises(ValueError, match="block scales exactly when"):
        fp8.fp8_config(Problem(1, 1, 64, 64, 128), fp8.DEFAULT_QUANTISATION, block_scales=False)


@pytest.mark.cute_compile
@pytest.mark.skipif(not HAS_CUTLASS, reason="needs nvidia-cutlass-dsl")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("variant", ["per-tensor", "block"])
def test_cute_fp8_variants_compile_to_e4m3_wgmma(variant: str, head_dim: int, causal: bool):
    from common.reporting.static import cubin_resources, ptx_features

    fp8 = _module("cute_impl.fp8")
    binary = fp8.compile_sm90(Problem(2, 16, 8192, 8192, head_dim, causal=causal), VARIANTS[variant])[0]
    assert ptx_features(binary.ptx)["e4m3 mma"], "no e4m3 wgmma in the PTX"
    stack = max(usage["stack_bytes"] for usage in cubin_resources(binary.cubin).values())
    print(f"cute/fp8 {variant} D={head_dim} causal={causal}: {stack} stack bytes")
    # The causal per-tensor build had an 8-byte stack frame before block scales existed; no more.
    assert stack <= (CAUSAL_STACK_BYTES if causal else 0), f"{stack} bytes of stack"


@pytest.mark.cute_compile
@pytest.mark.skipif(not HAS_CUTLASS, reason="needs nvidia-cutlass-dsl")
@pytest.mark.parametrize("knobs", [{}, {"pingpong": True}, {"rotate_ahead": True}], ids=["alone", "pingpong", "ahead"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cute_fp8_q_in_kernel_compiles_to_the_rotation_wgmma_without_spills(causal: bool, knobs: dict):
    """``quantise_q`` at P1 (GQA and bottom-right too when causal): the rotation's bf16 wgmma beside the e4m3
    ones, the reciprocal division's fmas instead of 64 IEEE divisions a thread (IEEE division only for the
    scale and its reciprocal), no stack, alone, with ping-pong and with the rotation issued ahead
    (bench/fp8_q_in_kernel.py times all three; ahead and causal, one value a tile goes to local memory, as
    in the other causal FP8 builds, and so does causal ping-pong (off by default) since the causal default reads the
    block scales through 32-bit strides, ``fp8.SCALE_INDEX_32BIT``: 0 bytes with 64-bit ones); the canonical build
    (knob off) is unchanged, which the fingerprint shows."""
    from common.reporting.static import cubin_resources, ptx_features

    fp8 = _module("cute_impl.fp8")
    problem = Problem(2, 16, 8192, 8192, 128, dtype=torch.bfloat16, causal=causal, kv_heads=4 if causal else 16,
                      causal_alignment="bottom_right" if causal else "top_left")  # fmt: skip
    binary = fp8.compile_sm90(problem, quantise_q=True, **knobs)[0]
    assert ptx_features(binary.ptx)["e4m3 mma"], "no e4m3 wgmma in the PTX"
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16" in binary.ptx, "no bf16 rotation wgmma"
    assert 2 <= binary.ptx.count("div.rn.f32") < 8, "the scale and its reciprocal by IEEE division, no other"
    assert binary.ptx.count("fma.rn.f32") >= 4 * 64, "the reciprocal division's two Markstein steps an element"
    stack = max(usage["stack_bytes"] for usage in cubin_resources(binary.cubin).values())
    framed = causal and (knobs.get("rotate_ahead") or knobs.get("pingpong"))
    assert stack <= (CAUSAL_STACK_BYTES if framed else 0), f"{stack} bytes of stack"


@pytest.mark.skipif(not HAS_CUTLASS, reason="needs nvidia-cutlass-dsl")
def test_cute_fp8_lean_q_store_puts_every_rotated_column_in_place():
    """A model of ``lean_quantise_q``'s store for each lane t of a quad: the accumulator's e4m3 pair k holds columns
    8 (k // 2) + 2t + b (b = 0, 1) of row half k % 2 (wgmma's C layout); stmatrix stores element e + 2r + 4m of the
    16-bit fragment at 16-bit column 8m + 2t + e of row half r, e4m3 columns 16m + 4t + 2e + b. With the sign matrix's
    columns in ``paired_columns``' order, accumulator column c holds rotated column ``paired_columns(D)[c]``: every
    value must land on its own column. Planted: the default order, and ``PERMUTED_KEY_ORDER`` uninverted, do not."""
    from common.contract.fp8 import KEY_GROUP, PERMUTED_KEY_ORDER
    from cute_impl._fp8_query import fragment_pair, paired_columns

    head_dim = 128

    def misplaced(order: list[int]) -> int:
        wrong = 0
        for t in range(4):
            for element in range(head_dim // 4):  # ((2, 2, D/16), 1, 1) 16-bit elements a thread
                e, r, m = element % 2, element // 2 % 2, element // 4
                pair = fragment_pair(element)
                assert pair % 2 == r, "a fragment element must keep its row half"
                for b in range(2):
                    wrong += order[8 * (pair // 2) + 2 * t + b] != 16 * m + 4 * t + 2 * e + b
        return wrong

    order = paired_columns(head_dim)
    assert sorted(order) == list(range(head_dim))
    assert sorted(fragment_pair(i) for i in range(head_dim // 4)) == list(range(head_dim // 4))
    assert misplaced(order) == 0
    assert misplaced(list(range(head_dim))) > 0
    assert misplaced([c - c % KEY_GROUP + PERMUTED_KEY_ORDER[c % KEY_GROUP] for c in range(head_dim)]) > 0


def _tile_work(sass: str) -> int:
    """SASS instructions of the consumers' tile loop (the longest loop with the rotation's wgmma) outside the
    key-block loops in it (those with e4m3 wgmma and exp2), as ``common.reporting.static.sass_loops`` finds them."""
    from common.reporting.static import sass_loops

    loops = sass_loops(sass)
    start, tile = max(((at, body) for at, body in loops if any(op.startswith("HGMMA") for op in body)),
                      key=lambda loop: len(loop[1]))  # fmt: skip

    def key_block_step(at: int, body: list[str]) -> bool:
        ops = ("QGMMA", "MUFU.EX2")
        return start < at and len(body) < len(tile) and all(any(op.startswith(o) for op in body) for o in ops)

    return len(tile) - sum(len(body) for at, body in loops if key_block_step(at, body))


@pytest.mark.cute_compile
@pytest.mark.skipif(not HAS_CUTLASS, reason="needs nvidia-cutlass-dsl")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cute_fp8_lean_q_quantisation_runs_fewer_instructions_a_tile(causal: bool):
    """``lean_quantise_q`` at P1 (Q in the kernel): four stmatrix a consumer thread instead of 32 two-byte shared
    stores, the same registers and at least 150 SASS instructions fewer a tile outside the key-block steps (P1 causal
    2418 -> 2256, non-causal 2328 -> 2174, of which 454 the path of a block of tiny values, never taken at P1); causal,
    one value a tile to local memory (8 bytes of stack, as the other causal FP8 builds that carry one more value),
    non-causal none. Knob off, the fingerprint of the default build is unchanged (checked when it was written)."""
    from common.reporting.static import cubin_resources, cubin_sass

    fp8 = _module("cute_impl.fp8")
    problem = Problem(2, 16, 8192, 8192, 128, dtype=torch.bfloat16, causal=causal)
    built = {}
    for lean in (False, True):
        binary = fp8.compile_sm90(problem, quantise_q=True, lean_quantise_q=lean)[0]
        (usage,) = cubin_resources(binary.cubin).values()
        sass = cubin_sass(binary.cubin)
        built[lean] = (usage["registers"], usage["stack_bytes"], sass.count("STSM"), sass.count("STS.U16"),
                       _tile_work(sass))  # fmt: skip
    default_registers, _, default_stsm, default_sts, default_work = built[False]
    registers, stack, stsm, sts, work = built[True]
    assert registers == default_registers and stack <= (CAUSAL_STACK_BYTES if causal else 0), built
    assert (stsm, sts) == (default_stsm + 4, default_sts - 32), built
    assert work <= default_work - 150, built


@pytest.mark.cute_compile
@pytest.mark.skipif(not HAS_CUTLASS, reason="needs nvidia-cutlass-dsl")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cute_fp8_one_quotient_correction_runs_fewer_instructions_a_tile(causal: bool):
    """``q_quotient_corrections`` = 1 at P1 (Q in the kernel, lean, as launched): two fmas fewer for each of a consumer
    thread's 64 Q values in both copies of the division loop (the usual one and the tiny-block one), so 256 fewer
    ``fma.rn.f32`` in the PTX, FFMA in the SASS and instructions of the tile outside the key-block steps (P1 causal
    2256 -> 2000, non-causal 2174 -> 1918); registers not above the default's, no spill, the stack the default's."""
    from common.reporting.static import cubin_resources, cubin_sass

    fp8 = _module("cute_impl.fp8")
    problem = Problem(2, 16, 8192, 8192, 128, dtype=torch.bfloat16, causal=causal)
    built = {}
    for corrections in (fp8.ROTATED_CORRECTIONS, 1):
        binary = fp8.compile_sm90(problem, quantise_q=True, lean_quantise_q=True, q_quotient_corrections=corrections)[0]
        (usage,) = cubin_resources(binary.cubin).values()
        sass = cubin_sass(binary.cubin)
        built[corrections] = (usage["registers"], usage["stack_bytes"], usage["local_bytes"],
                              binary.ptx.count("fma.rn.f32"), sass.count("FFMA"), _tile_work(sass))  # fmt: skip
    default_registers, default_stack, _, default_fma, default_ffma, default_work = built[fp8.ROTATED_CORRECTIONS]
    registers, stack, spills, fma, ffma, work = built[1]
    assert registers <= default_registers and stack == default_stack and spills == 0, built
    fewer = 2 * 2 * 64  # two fmas, two loop copies, 64 values a thread
    assert (fma, ffma, work) == (default_fma - fewer, default_ffma - fewer, default_work - fewer), built


@pytest.mark.skipif(not HAS_CUTLASS, reason="needs nvidia-cutlass-dsl")
def test_cute_fp8_quotient_corrections_are_one_or_the_quantisers():
    fp8 = _module("cute_impl.fp8")
    problem, quantisation = Problem(1, 1, 64, 64, 128), VARIANTS["block+rotation"]
    with pytest.raises(ValueError, match=r"once or twice \(q_quotient_corrections in \(1, 2\)\), got 3"):
        fp8.fp8_config(problem, quantisation, quantise_q=True, q_quotient_corrections=3)
    with pytest.raises(ValueError, match=r"q_quotient_corrections\) only with quantise_q"):
        fp8.fp8_config(problem, quantisation, q_quotient_corrections=1)
    assert fp8.fp8_config(problem, quantisation, quantise_q=True, q_quotient_corrections=1).q_quotient_corrections == 1


@pytest.mark.skipif(not HAS_CUTLASS, reason="needs nvidia-cutlass-dsl")
def test_cute_q_in_kernel_needs_block_scales_and_rotation():
    fp8 = _module("cute_impl.fp8")
    with pytest.raises(ValueError, match="quantises Q in its kernel only with block scales and rotation, got block"):
        fp8.fp8_config(Problem(1, 1, 64, 64, 128), VARIANTS["block"], quantise_q=True)
    with pytest.raises(ValueError, match="rotation ahead \\(rotate_ahead\\) only with quantise_q"):
        fp8.fp8_config(Problem(1, 1, 64, 64, 128), VARIANTS["block+rotation"], rotate_ahead=True)
    with pytest.raises(ValueError, match="lean \\(lean_quantise_q\\) only with quantise_q"):
        fp8.fp8_config(Problem(1, 1, 64, 64, 128), VARIANTS["block+rotation"], lean_quantise_q=True)


_TRITON_PROBE = """
import json
from common.contract.fp8 import VARIANTS
from common.contract.problem import Problem
from common.reporting.static import cubin_resources, ptx_features
from triton_impl import fp8
rows = {}
for variant in ("per-tensor", "block"):
    for head_dim in (64, 128, 256):
        for causal in (False, True):
            problem = Problem.canonical(8192, head_dim=head_dim, causal=causal)
            binary = fp8.compile_sm90(problem, quantisation=VARIANTS[variant])[0]
            spills = max(usage["local_bytes"] for usage in cubin_resources(binary.cubin).values())
            rows[f"{variant} D={head_dim} causal={causal}"] = [ptx_features(binary.ptx)["e4m3 mma"], spills]
print(json.dumps(rows))
"""


@pytest.mark.static
@pytest.mark.release
def test_triton_fp8_variants_compile_to_e4m3_wgmma_without_spills():
    """The interpreter's e4m3 cast does not round to nearest, so on a CPU the Triton rung is checked
    by compiling every variant for sm_90a (in a process without TRITON_INTERPRET)."""
    for name, (has_e4m3, spills) in json_from_child(["-c", _TRITON_PROBE], timeout=900).items():
        assert has_e4m3 and spills == 0, f"{name}: e4m3 wgmma {has_e4m3}, {spills} bytes spilled"


# ----------------------------------------------------------------------------------------------------
# GPU
# ----------------------------------------------------------------------------------------------------
def _check(module_name: str, problem: Problem, inputs: str, variant: str, seed: int):
    module = _module(module_name)
    impl = module.IMPLEMENTATION
    require_supported(impl, problem, "cuda")
    quantisation = VARIANTS[variant]
    variant_impl = impl.__class__(
        **{
            **impl.__dict__,
            "prepare": lambda q, k, v, p: module.prepare(q, k, v, p, quantisation),
            "emulate": lambda q, k, v, p: module.emulate(q, k, v, p, quantisation),
        }
    )
    result = check_on_inputs(variant_impl, *INPUTS[inputs](problem, seed), problem)
    print(f"{impl.name} {variant} {inputs} {problem.describe()}: {result.summary()}")
    return result


@pytest.mark.gpu
@pytest.mark.parametrize("inputs", sorted(INPUTS))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("seqlens", SEQLENS, ids=str)
@pytest.mark.parametrize("module_name", MODULES)
def test_gpu_fp8_default_variant_meets_its_rule(module_name: str, seqlens, head_dim: int, causal: bool, inputs: str):
    batch, heads = (1, 2) if max(seqlens) > 4096 else (2, 3)
    problem = Problem(batch, heads, *seqlens, head_dim, dtype=torch.bfloat16, causal=causal)
    module = _module(module_name)
    result = _check(module_name, problem, inputs, module.DEFAULT_QUANTISATION.name, seed=sum(seqlens) + head_dim)
    assert result.ok, result.summary()


@pytest.mark.gpu
@pytest.mark.parametrize("seqlens", [(77, 1000), (1000, 77), (1008, 1232)], ids=str)
@pytest.mark.parametrize(("rung", "config", "causal"), _d64_candidates())
def test_gpu_fp8_d64_candidates_meet_the_rule(rung: str, config, causal: bool, seqlens):
    """Every D=64 candidate of issue #37's A/B (a possible default) judged by FP8_RULE against the
    emulation of its own key blocks and quantisation, O poisoned first; 4 x 8 heads of 1000+ rows
    give more query tiles than SMs, so persistent candidates loop."""
    from bench import gluon_sweep

    problem = Problem(4, 8, *seqlens, 64, dtype=torch.bfloat16, causal=causal)
    q, k, v = make_inputs(problem, seed=sum(seqlens), offset=0.5)
    out = run_poisoned(gluon_sweep.runner(rung, q, k, v, problem, config))
    ok, reason = gluon_sweep.judge(rung, out, q, k, v, problem, config)
    assert ok, f"{rung} {config} {problem.describe()}: {reason}"


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlens", [(77, 1000), (1000, 1000)], ids=str)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("module_name", MODULES)
def test_gpu_fp8_every_variant_meets_its_rule(module_name: str, variant: str, seqlens, causal: bool):
    problem = Problem(2, 3, *seqlens, 128, dtype=torch.float16, causal=causal)
    result = _check(module_name, problem, "fa3", variant, seed=3)
    assert result.ok, result.summary()


@pytest.mark.gpu
@pytest.mark.parametrize("module_name", MODULES)
def test_gpu_fp8_block_quantisation_and_rotation_lower_the_error(module_name: str):
    """FA3's Table 3 in small: on its outlier inputs both techniques together cut the error."""
    module = _module(module_name)
    problem = Problem(1, 4, 2048, 2048, 128, dtype=torch.bfloat16)
    q, k, v = fa3_inputs(problem, seed=9, device="cuda")
    ref = reference_attention(q, k, v, problem)
    rmse = {
        name: error_stats(run_poisoned(module.prepare(q, k, v, problem, VARIANTS[name])), ref).rmse
        for name in ("per-tensor", "block+rotation")
    }
    print(f"{module_name}: {rmse}")
    assert rmse["block+rotation"] < 0.7 * rmse["per-tensor"], rmse


@pytest.mark.gpu
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("module_name", MODULES)
def test_gpu_fp8_end_to_end_equals_kernel_only_and_records_its_variant(module_name: str, variant: str):
    module = _module(module_name)
    problem = Problem(2, 3, 333, 517, 64, dtype=torch.bfloat16, causal=True)
    q, k, v = fa3_inputs(problem, seed=4, device="cuda")
    kernel_only = module.prepare(q, k, v, problem, VARIANTS[variant])
    end_to_end = module.prepare_end_to_end(q, k, v, problem, VARIANTS[variant])
    assert kernel_only.variant == end_to_end.variant == variant
    assert torch.equal(run_poisoned(end_to_end), run_poisoned(kernel_only).clone())


@pytest.mark.gpu
@pytest.mark.parametrize("module_name", MODULES)
def test_gpu_fp8_attention_runs_the_fused_quantiser_in_every_call(module_name: str):
    """``attention(impl=...)`` from bf16: the first call plans, the later ones bind (new buffers, the
    fused quantiser, the kernel). Each call's O equals the prepared kernel's on that call's inputs
    (the same fused operands) and is its own tensor, untouched by the next call."""
    from common import attention, clear_plan_cache, plan_cache_info

    module = _module(module_name)
    problem = Problem(2, 4, 700, 900, 128, dtype=torch.bfloat16, causal=True, kv_heads=2)
    require_supported(module.IMPLEMENTATION, problem, "cuda")
    clear_plan_cache()
    inputs = [fa3_inputs(problem, seed=seed, device="cuda") for seed in (1, 2, 3)]
    outs = [attention(q, k, v, causal=True, impl=module.IMPLEMENTATION.name) for q, k, v in inputs]
    assert plan_cache_info().hits == 2
    assert len({out.data_ptr() for out in outs}) == len(outs)
    for (q, k, v), out in zip(inputs, outs, strict=True):
        assert torch.equal(out, module.prepare(q, k, v, problem)())


# cute/fp8's problem features (GQA, both alignments, per-sequence lengths, the LSE), judged against
# the emulation of its own quantisation, which takes the same mask and key lengths and bounds the LSE.
@pytest.mark.skipif(not HAS_CUTLASS, reason="needs nvidia-cutlass-dsl")
@feature_grid(seqlens=((77, 1000), (1000, 77)))
def test_gpu_cute_fp8_gqa_alignments_cache_seqlens_and_lse(
    head_dim: int, kv_heads: int, seqlens: tuple[int, int], mask: str, cache_lengths: bool
):
    """8 query heads over 1 or 4 KV heads, both alignments with Sq != Sk (bottom-right with Sq > Sk
    leaves rows that see no key: O = 0, LSE = -inf), key lengths Sk, 0 and ragged; O and the LSE
    judged by FP8_RULE against the emulation, on poisoned outputs."""
    fp8 = _module("cute_impl.fp8")
    problem = feature_problem(seqlens, head_dim, kv_heads, mask, cache_lengths)
    q, k, v = make_inputs(problem, seed=17, offset=0.5)
    cache_seqlens = edge_cache_seqlens(problem.batch, problem.seqlen_k, "cuda") if cache_lengths else None
    assert fp8.supports(problem, q.device) == (True, "")
    result = check_on_inputs(fp8.IMPLEMENTATION, q, k, v, problem, cache_seqlens=cache_seqlens)
    assert result.ok, f"{problem.describe()}: {result.summary()}"
    assert result.lse is not None


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUTLASS, reason="needs nvidia-cutlass-dsl")
def test_gpu_cute_fp8_end_to_end_takes_cache_seqlens_and_returns_the_lse():
    """prepare_end_to_end passes the key lengths to every bind and returns (O, lse) like prepare."""
    fp8 = _module("cute_impl.fp8")
    problem = feature_problem((333, 517), 64, 2, "causal_bottom_right", True)
    q, k, v = make_inputs(problem, seed=5)
    cache_seqlens = edge_cache_seqlens(problem.batch, problem.seqlen_k, "cuda")
    kernel_only = fp8.prepare(q, k, v, problem, cache_seqlens=cache_seqlens)
    end_to_end = fp8.prepare_end_to_end(q, k, v, problem, cache_seqlens=cache_seqlens)
    out, lse = (t.clone() for t in kernel_only())
    out_e2e, lse_e2e = end_to_end()
    assert torch.equal(out_e2e, out) and torch.equal(lse_e2e, lse)
    assert torch.all(out[1] == 0) and torch.all(lse[1] == -torch.inf)  # the empty sequence


# cute/fp8 with Q quantised in its kernel (``QUANTISE_Q_IN_KERNEL``, issue #37): a P1-like shape and ragged GQA
# shapes, every mask, judged by FP8_RULE against the emulation of the full quantiser's operands (the rule is
# unchanged); then, apart, whether the kernel's Q is the quantiser's bit for bit (its scales, and so its O).
Q_IN_KERNEL_SHAPES = {
    # 512 query tiles: every persistent CTA of an H200 (132 SMs) walks several, so Q boxes are reloaded and requantised.
    "p1-like": (2, 8, 8, 4096, 4096),
    "ragged-gqa": (2, 8, 2, 1000, 777),
    "ragged-gqa-short-q": (2, 8, 2, 77, 1000),
}


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUTLASS, reason="needs nvidia-cutlass-dsl")
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", list(Q_IN_KERNEL_SHAPES))
def test_gpu_cute_fp8_q_in_kernel_meets_the_rule(shape: str, mask: str, monkeypatch: pytest.MonkeyPatch):
    """Kernel only (poisoned outputs) by FP8_RULE, and end to end (the K/V-only quantiser, then the kernel
    reading bf16 Q) equal to kernel only."""
    _check_q_in_kernel(shape, mask, 128, monkeypatch)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUTLASS, reason="needs nvidia-cutlass-dsl")
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", list(Q_IN_KERNEL_SHAPES))
def test_gpu_cute_fp8_q_in_kernel_at_d64_meets_the_rule(shape: str, mask: str, monkeypatch: pytest.MonkeyPatch):
    """The same at D=64 (three consumer warpgroups, each quantising its own 64-row box), the default without the
    causal mask, which causal D=64 leaves to the quantiser (``QUANTISE_Q_CAUSAL_HEAD_DIMS``: its A/B,
    ``bench/fp8_q_in_kernel_ab.sh``)."""
    monkeypatch.setattr(_module("cute_impl.fp8"), "QUANTISE_Q_CAUSAL_HEAD_DIMS", (64, 128))
    _check_q_in_kernel(shape, mask, 64, monkeypatch)


def _check_q_in_kernel(shape: str, mask: str, head_dim: int, monkeypatch: pytest.MonkeyPatch) -> None:
    fp8 = _module("cute_impl.fp8")
    problem, (q, k, v) = fa3_case(Q_IN_KERNEL_SHAPES[shape], mask, seed=3, head_dim=head_dim)
    monkeypatch.setattr(fp8, "QUANTISE_Q_IN_KERNEL", True)
    result = check_on_inputs(fp8.IMPLEMENTATION, q, k, v, problem)
    assert result.ok, f"{problem.describe()}: {result.summary()}"
    kernel_only = fp8.prepare(q, k, v, problem)
    assert kernel_only.quantiser.query is False
    out = kernel_only().clone()
    assert torch.equal(run_poisoned(fp8.prepare_end_to_end(q, k, v, problem)), out)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUTLASS, reason="needs nvidia-cutlass-dsl")
@pytest.mark.parametrize("mask", list(MASKS))
def test_gpu_cute_fp8_q_in_kernel_is_the_quantisers_q(mask: str, monkeypatch: pytest.MonkeyPatch):
    """The same rotation sums (k16 groups in order on the tensor cores), amax, IEEE divisions and rounding as
    the fused quantiser: Q's scales equal bit for bit, and so does O (the kernel is otherwise the same)."""
    fp8 = _module("cute_impl.fp8")
    problem, (q, k, v) = fa3_case(Q_IN_KERNEL_SHAPES["ragged-gqa"], mask, seed=3)
    monkeypatch.setattr(fp8, "QUANTISE_Q_IN_KERNEL", True)
    in_kernel = fp8.prepare(q, k, v, problem)
    out, q_scale = in_kernel().clone(), in_kernel.quantiser.operands.q_scale.clone()
    monkeypatch.setattr(fp8, "QUANTISE_Q_IN_KERNEL", False)
    quantised = fp8.prepare(q, k, v, problem)
    expected_scale = quantised.quantiser.operands.q_scale
    assert torch.equal(q_scale, expected_scale), f"{(q_scale != expected_scale).sum()} Q scales differ"
    differing = (out != quantised()).sum().item()
    assert differing == 0, f"{differing} of {out.numel()} outputs differ from the quantiser's path"


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUTLASS, reason="needs nvidia-cutlass-dsl")
@pytest.mark.parametrize("shape", ["p1-like", "ragged-gqa"])
def test_gpu_cute_fp8_q_in_kernel_rotated_ahead_is_the_same(shape: str, monkeypatch: pytest.MonkeyPatch):
    """``rotate_ahead`` (the next tile's rotation issued under a tile's epilogue) changes only when the product
    runs: Q's scales and O equal the knob's without it, bit for bit. P1-like: every persistent CTA walks
    several tiles (rotations issued ahead); ragged GQA: one tile a CTA (only the one after the last tile)."""
    import functools

    fp8 = _module("cute_impl.fp8")
    problem, (q, k, v) = fa3_case(Q_IN_KERNEL_SHAPES[shape], "causal", seed=3)
    monkeypatch.setattr(fp8, "QUANTISE_Q_IN_KERNEL", True)
    plain = fp8.prepare(q, k, v, problem)
    out, q_scale = plain().clone(), plain.quantiser.operands.q_scale.clone()
    monkeypatch.setattr(fp8, "fp8_config", functools.partial(fp8.fp8_config, rotate_ahead=True))
    ahead = fp8.prepare(q, k, v, problem)
    assert torch.equal(run_poisoned(ahead), out)
    assert torch.equal(ahead.quantiser.operands.q_scale, q_scale)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUTLASS, reason="needs nvidia-cutlass-dsl")
def test_gpu_cute_fp8_q_in_kernel_with_a_wrong_rotation_fails_the_rule(monkeypatch: pytest.MonkeyPatch):
    """Planted bug: the kernel rotates Q by the sign matrix untransposed (diag(s) H instead of H diag(s)), while K
    keeps the quantiser's rotation: the rule must fail it."""
    from common.contract.fp8 import random_hadamard

    fp8 = _module("cute_impl.fp8")
    problem, (q, k, v) = fa3_case(Q_IN_KERNEL_SHAPES["ragged-gqa"], "causal", seed=3)
    monkeypatch.setattr(fp8, "QUANTISE_Q_IN_KERNEL", True)

    def untransposed(head_dim, seed, dtype, device, paired=False):
        return torch.sign(random_hadamard(head_dim, seed, device)).to(dtype).contiguous()

    monkeypatch.setattr(fp8, "sign_matrix_transposed", untransposed)
    result = check_on_inputs(fp8.IMPLEMENTATION, q, k, v, problem)
    assert not result.ok, f"a wrong rotation of Q passed: {result.summary()}"


# cute/fp8 with its Q quantised lean (``LEAN_Q_QUANTISATION``, issue #37, the default): the amax before x c and the
# e4m3 box written by stmatrix from a rotation with reordered columns change how Q's e4m3 bytes are computed and
# written, not their values: Q's scales and O equal the full quantisation's bit for bit, besides FP8_RULE.
LEAN_SHAPES = {"p1-like": Q_IN_KERNEL_SHAPES["p1-like"], "ragged-gqa": Q_IN_KERNEL_SHAPES["ragged-gqa"]}


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUTLASS, reason="needs nvidia-cutlass-dsl")
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", list(LEAN_SHAPES))
def test_gpu_cute_fp8_lean_q_quantisation_is_the_full_ones(shape: str, mask: str, monkeypatch: pytest.MonkeyPatch):
    """Kernel only (poisoned outputs) by FP8_RULE; Q's scales and O equal the full quantisation's bit for bit, kernel
    only and end to end."""
    fp8 = _module("cute_impl.fp8")
    problem, (q, k, v) = fa3_case(LEAN_SHAPES[shape], mask, seed=7)
    monkeypatch.setattr(fp8, "QUANTISE_Q_IN_KERNEL", True)
    monkeypatch.setattr(fp8, "LEAN_Q_QUANTISATION", False)
    full = fp8.prepare(q, k, v, problem)
    assert not full.config.lean_quantise_q
    out, q_scale = full().clone(), full.quantiser.operands.q_scale.clone()
    monkeypatch.setattr(fp8, "LEAN_Q_QUANTISATION", True)
    result = check_on_inputs(fp8.IMPLEMENTATION, q, k, v, problem)
    assert result.ok, f"{problem.describe()}: {result.summary()}"
    lean = fp8.prepare(q, k, v, problem)
    assert lean.config.lean_quantise_q
    differing = (run_poisoned(lean) != out).sum().item()
    assert differing == 0, f"{differing} of {out.numel()} outputs differ from the full quantisation's"
    assert torch.equal(lean.quantiser.operands.q_scale, q_scale)
    assert torch.equal(run_poisoned(fp8.prepare_end_to_end(q, k, v, problem)), out)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUTLASS, reason="needs nvidia-cutlass-dsl")
def test_gpu_cute_fp8_lean_q_with_the_default_column_order_fails_the_rule(monkeypatch: pytest.MonkeyPatch):
    """Planted bug: the lean store from a rotation in the default column order (``paired`` ignored), which puts
    rotated columns where stmatrix stores other ones: the rule must fail it."""
    fp8 = _module("cute_impl.fp8")
    problem, (q, k, v) = fa3_case(LEAN_SHAPES["ragged-gqa"], "causal", seed=7)
    unpaired = fp8.sign_matrix_transposed
    monkeypatch.setattr(fp8, "QUANTISE_Q_IN_KERNEL", True)
    monkeypatch.setattr(fp8, "LEAN_Q_QUANTISATION", True)
    monkeypatch.setattr(
        fp8,
        "sign_matrix_transposed",
        lambda head_dim, seed, dtype, device, paired=False: unpaired(head_dim, seed, dtype, device),
    )
    result = check_on_inputs(fp8.IMPLEMENTATION, q, k, v, problem)
    assert not result.ok, f"a misplaced Q passed: {result.summary()}"


# cute/fp8 with one Markstein correction of each Q value's quotient (``Q_QUOTIENT_CORRECTIONS`` = 1, the default since
# issue #37's A/B): ``common/tools/fp8_quotient.py`` proves the quotient the quantiser's two corrections give, so Q's
# scales and O must equal two corrections' bit for bit, kernel only and end to end, besides FP8_RULE.
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUTLASS, reason="needs nvidia-cutlass-dsl")
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", list(LEAN_SHAPES))
def test_gpu_cute_fp8_one_quotient_correction_is_two_corrections(
    shape: str, mask: str, monkeypatch: pytest.MonkeyPatch
):
    """Kernel only (poisoned outputs) by FP8_RULE; Q's scales and O equal two corrections' bit for bit, kernel only
    and end to end."""
    fp8 = _module("cute_impl.fp8")
    problem, (q, k, v) = fa3_case(LEAN_SHAPES[shape], mask, seed=11)
    monkeypatch.setattr(fp8, "QUANTISE_Q_IN_KERNEL", True)
    monkeypatch.setattr(fp8, "Q_QUOTIENT_CORRECTIONS", fp8.ROTATED_CORRECTIONS)
    two = fp8.prepare(q, k, v, problem)
    assert two.config.q_quotient_corrections == fp8.ROTATED_CORRECTIONS
    out, q_scale = two().clone(), two.quantiser.operands.q_scale.clone()
    monkeypatch.setattr(fp8, "Q_QUOTIENT_CORRECTIONS", 1)
    result = check_on_inputs(fp8.IMPLEMENTATION, q, k, v, problem)
    assert result.ok, f"{problem.describe()}: {result.summary()}"
    one = fp8.prepare(q, k, v, problem)
    assert one.config.q_quotient_corrections == 1
    differing = (run_poisoned(one) != out).sum().item()
    assert differing == 0, f"{differing} of {out.numel()} outputs differ from two corrections'"
    assert torch.equal(one.quantiser.operands.q_scale, q_scale)
    assert torch.equal(run_poisoned(fp8.prepare_end_to_end(q, k, v, problem)), out)
