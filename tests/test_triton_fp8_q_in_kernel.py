"""triton/fp8 with Q quantised in its kernel (``triton_impl.fp8.QUANTISE_Q_IN_KERNEL``, issue #37): each 64-row
tile, one of Q's scale blocks, is rotated, scaled, divided and cast by the fused quantiser's own device functions
(``fp8_quantiser_kernel.quantise_query_block``), and the quantiser runs for K and V only.

CPU (interpreter): the knob read into the launch (a K/V-only quantiser, ``QUANTISE_Q``), its refusals; on ragged GQA
problems in every mask (cache lengths and the LSE too), Q's e4m3 bytes (the kernel writes them into the quantiser's
buffer), Q's scales, O and the LSE equal the quantiser's path bit for bit; planted: Q rotated by the sign matrix
untransposed differs. Static (sm_90a): the build has no spill and its key loops are the quantiser-Q build's (no
serialised wgmma: Q goes through memory, ``_through_memory``); planted: Q kept in registers as the A operand serialises
them. GPU: FP8_RULE against the emulation of the full quantiser's operands on a P1-like shape and ragged GQA shapes in
every mask, end to end equal to kernel only, Q's bytes and scales and O equal to the quantiser's path; planted: a
wrong rotation fails the rule.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from common.contract.check import check_on_inputs, run_poisoned
from common.contract.fp8 import VARIANTS
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from tests._helpers import MASKS, edge_cache_seqlens, fa3_case, json_from_child
from tests.test_decode import interpreter_only
from triton_impl import fp8
from triton_impl.fp8_quantiser import FusedQuantiser

# Interpreter cases: (batch, heads, kv_heads, Sq, Sk, head dim); fp16 (the interpreter's dots take it).
CPU_CASES = {"ragged-gqa-d64": (3, 4, 2, 100, 77, 64), "short-q-d128": (2, 2, 1, 64, 130, 128)}


def _cpu_case(name: str, mask: str) -> tuple[Problem, tuple[torch.Tensor, ...], torch.Tensor]:
    batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim = CPU_CASES[name]
    causal, alignment = MASKS[mask]
    problem = Problem(
        batch, heads, seqlen_q, seqlen_k, head_dim, dtype=torch.float16, causal=causal, causal_alignment=alignment,
        kv_heads=kv_heads, has_cache_seqlens=True, return_lse=True,
    )  # fmt: skip
    return problem, make_inputs(problem, seed=5, offset=0.5, device="cpu"), edge_cache_seqlens(batch, seqlen_k, "cpu")


def _bound(problem, inputs, lengths, in_kernel: bool, monkeypatch: pytest.MonkeyPatch, by_tma: bool = False):
    monkeypatch.setattr(fp8, "QUANTISE_Q_IN_KERNEL", in_kernel)
    monkeypatch.setattr(fp8, "ROTATION_BY_TMA", by_tma)
    bound = fp8.bind(*inputs, problem, cache_seqlens=lengths)
    assert bound.quantiser.query is not in_kernel and bound.kernel._kwargs["QUANTISE_Q"] is in_kernel
    out, lse = bound()
    operands = bound.quantiser.operands
    return out.clone(), lse.clone(), operands.q8.view(torch.uint8).clone(), operands.q_scale.clone()


def test_the_knob_is_read_when_a_launch_is_built_and_needs_block_scales_with_rotation(
    monkeypatch: pytest.MonkeyPatch,
):
    config = fp8.DEFAULT_CONFIGS[128]
    monkeypatch.setattr(fp8, "QUANTISE_Q_IN_KERNEL", True)
    assert fp8.quantises_q_in_kernel(VARIANTS["block+rotation"], config)
    for variant in ("block", "per-tensor", "rotation"):
        assert not fp8.quantises_q_in_kernel(VARIANTS[variant], config), variant
    assert not fp8.quantises_q_in_kernel(VARIANTS["block+rotation"], fp8.HopperKernelConfig(128, 128, 8, 3))
    monkeypatch.setattr(fp8, "QUANTISE_Q_IN_KERNEL", False)
    assert not fp8.quantises_q_in_kernel(VARIANTS["block+rotation"], config)


def test_the_kernel_takes_q_and_the_rotation_together_in_tiles_of_one_scale_block():
    problem = Problem(1, 2, 64, 64, 64, dtype=torch.float16)
    q, k, _ = make_inputs(problem, seed=0, device="cpu")
    fused = FusedQuantiser(q.shape, k.shape, q.dtype, q.device, VARIANTS["block+rotation"], fp8.VALUE_LAYOUT)
    config = fp8.INTERPRETER_CONFIG
    with pytest.raises(ValueError, match="both given"):
        fp8.Fp8Attention(fused.operands, problem, config, query=q)
    with pytest.raises(ValueError, match="BLOCK_M=32, q_block_rows=64"):
        fp8.Fp8Attention(fused.operands, problem, fp8.HopperKernelConfig(32, 32, 4, 1), query=q,
                         rotation=fused.rotation)  # fmt: skip


@interpreter_only
@pytest.mark.parametrize("by_tma", [False, True], ids=["matrix-loaded", "matrix-by-tma"])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("name", list(CPU_CASES))
def test_q_in_the_kernel_is_the_quantisers_q_bit_for_bit(
    name: str, mask: str, by_tma: bool, monkeypatch: pytest.MonkeyPatch
):
    problem, inputs, lengths = _cpu_case(name, mask)
    quantised = _bound(problem, inputs, lengths, False, monkeypatch)
    in_kernel = _bound(problem, inputs, lengths, True, monkeypatch, by_tma)
    for label, expected, got in zip(("O", "LSE", "Q's e4m3 bytes", "Q's scales"), quantised, in_kernel, strict=True):
        assert torch.equal(got, expected), f"{name} {mask}: {label} differ from the quantiser's path"
    assert torch.isfinite(in_kernel[0]).all()


@interpreter_only
def test_planted_q_rotated_by_the_untransposed_matrix_differs(monkeypatch: pytest.MonkeyPatch):
    problem, inputs, lengths = _cpu_case("ragged-gqa-d64", "causal")
    quantised = _bound(problem, inputs, lengths, False, monkeypatch)
    untransposed = property(lambda self: (self._rotation[0].T.contiguous(), self._rotation[1]))
    monkeypatch.setattr(FusedQuantiser, "rotation", untransposed)
    planted = _bound(problem, inputs, lengths, True, monkeypatch)
    assert not torch.equal(planted[2], quantised[2]) and not torch.equal(planted[0], quantised[0])


@triton.jit
def kept_in_registers(x, X, start_m, seqlen_q, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """The planted ``_through_memory``: Q's e4m3 tile stays in registers."""
    return x


# sm_90a, in a child process (Triton compiles there): each build's spills and its key loops (a SASS loop holding the
# e4m3 wgmma): instructions and warpgroup arrives. ``PLANT`` replaces ``_through_memory`` by the identity: Q stays a
# register operand.
_PROBE = """
import json, sys
from common.contract.problem import Problem
from common.reporting.static import cubin_resources, cubin_sass, sass_loops
from triton_impl import fp8

if sys.argv[1] == "plant":
    from tests.test_triton_fp8_q_in_kernel import kept_in_registers
    fp8._through_memory = kept_in_registers
rows = {}
for head_dim in (64, 128):
    for kw in ({}, {"causal": True, "causal_alignment": "bottom_right", "kv_heads": 4, "has_cache_seqlens": True}):
        for quantise_q in (False, True):
            binary = fp8.compile_sm90(Problem(2, 16, 8192, 8192, head_dim, **kw), quantise_q=quantise_q)[0]
            loops = [body for _, body in sass_loops(cubin_sass(binary.cubin)) if any("QGMMA" in op for op in body)]
            usage = cubin_resources(binary.cubin).values()
            spills = max(kernel["local_bytes"] + kernel["stack_bytes"] for kernel in usage)
            arrives = [sum(op.startswith("WARPGROUP.ARRIVE") for op in body) for body in loops]
            rows[f"D={head_dim} causal={bool(kw)} quantise_q={quantise_q}"] = [spills, [len(b) for b in loops], arrives]
print(json.dumps(rows))
"""


def _static(plant: bool) -> dict[str, list]:
    return json_from_child(["-c", _PROBE, "plant" if plant else "default"], timeout=900)


@pytest.mark.static
def test_static_the_build_keeps_the_quantiser_q_builds_key_loops_without_spills():
    rows = _static(plant=False)
    for name, (spills, lengths, arrives) in rows.items():
        assert spills == 0, f"{name}: {spills} bytes spilled"
        if name.endswith("quantise_q=True"):
            base_lengths, base_arrives = rows[name.replace("quantise_q=True", "quantise_q=False")][1:]
            assert arrives == base_arrives, f"{name}: warpgroup arrives {arrives} against {base_arrives}"
            assert all(abs(n - m) <= 8 for n, m in zip(lengths, base_lengths, strict=True)), (name, lengths)


@pytest.mark.static
def test_static_planted_q_in_registers_serialises_the_key_loops_wgmmas():
    rows = _static(plant=True)
    name = "D=128 causal=False quantise_q"
    assert sum(rows[f"{name}=True"][2]) > sum(rows[f"{name}=False"][2]), rows


# GPU: the cute/fp8 knob's shapes (tests/test_fp8_rungs.py), bf16 D=128, FA3's inputs.
GPU_SHAPES = {"p1-like": (2, 8, 8, 4096, 4096), "ragged-gqa": (2, 8, 2, 1000, 777), "short-q": (2, 8, 2, 77, 1000)}


@pytest.mark.gpu
@pytest.mark.parametrize("by_tma", [False, True], ids=["matrix-loaded", "matrix-by-tma"])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", list(GPU_SHAPES))
def test_gpu_q_in_kernel_meets_the_rule_and_is_the_quantisers_q(
    shape: str, mask: str, by_tma: bool, monkeypatch: pytest.MonkeyPatch
):
    """Kernel only (poisoned outputs) by FP8_RULE against the emulation of the full quantiser's operands; end to end
    equal to kernel only; Q's e4m3 bytes and scales and O equal the quantiser's path bit for bit (the same k16
    groups of the rotation in the same order, the same divisions)."""
    problem, (q, k, v) = fa3_case(GPU_SHAPES[shape], mask, seed=3)
    monkeypatch.setattr(fp8, "QUANTISE_Q_IN_KERNEL", True)
    monkeypatch.setattr(fp8, "ROTATION_BY_TMA", by_tma)
    result = check_on_inputs(fp8.IMPLEMENTATION, q, k, v, problem)
    assert result.ok, f"{problem.describe()}: {result.summary()}"
    in_kernel = fp8.prepare(q, k, v, problem)
    assert in_kernel.quantiser.query is False
    out = in_kernel().clone()
    q8, q_scale = in_kernel.quantiser.operands.q8.view(torch.uint8).clone(), in_kernel.quantiser.operands.q_scale
    assert torch.equal(run_poisoned(fp8.prepare_end_to_end(q, k, v, problem)), out)
    monkeypatch.setattr(fp8, "QUANTISE_Q_IN_KERNEL", False)
    quantised = fp8.prepare(q, k, v, problem)
    assert torch.equal(q_scale, quantised.quantiser.operands.q_scale), "Q's scales differ from the quantiser's"
    differing = (q8 != quantised.quantiser.operands.q8.view(torch.uint8)).sum().item()
    assert differing == 0, f"{differing} of Q's e4m3 bytes differ from the quantiser's"
    assert torch.equal(quantised(), out), "O differs from the quantiser's path"


@pytest.mark.gpu
def test_gpu_planted_wrong_rotation_of_q_fails_the_rule(monkeypatch: pytest.MonkeyPatch):
    """Q rotated by the sign matrix untransposed while K keeps the quantiser's rotation: the rule must fail it."""
    problem, (q, k, v) = fa3_case(GPU_SHAPES["ragged-gqa"], "causal", seed=3)
    monkeypatch.setattr(fp8, "QUANTISE_Q_IN_KERNEL", True)
    monkeypatch.setattr(FusedQuantiser, "rotation", property(lambda self: (self._rotation[0].T.contiguous(),
                                                                            self._rotation[1])))  # fmt: skip
    result = check_on_inputs(fp8.IMPLEMENTATION, q, k, v, problem)
    assert not result.ok, f"a wrong rotation of Q passed: {result.summary()}"
