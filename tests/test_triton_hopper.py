"""Checks specific to the Triton Hopper rungs (triton/hopper, triton/fp8) beyond the shared rung tests."""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.contract.api import attention
from common.contract.devices import triton_interpreting
from common.contract.fp8 import quantise
from common.contract.inputs import make_inputs
from common.contract.metrics import error_stats
from common.contract.problem import Problem
from common.contract.reference import reference_attention
from common.tools.sanitize import HOST_API_ERRORS
from tests._helpers import child_result, json_from_child, scripts_in_one_child
from triton_impl import fp8, hopper
from triton_impl.fp8_quantiser import shared_bytes

ROOT = Path(__file__).resolve().parent.parent
HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
FP8_INTERPRETER_SKIP = (
    "the interpreter's e4m3 cast does not round to nearest, so fp8 accuracy is checked on the GPU only"
)


def _reference_lse(q: torch.Tensor, k: torch.Tensor, problem: Problem) -> torch.Tensor:
    scores = torch.matmul(q.double(), k.double().transpose(-1, -2)) * problem.scale
    if problem.causal:
        hidden = torch.ones(problem.seqlen_q, problem.seqlen_k, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(hidden, -math.inf)
    return torch.logsumexp(scores, dim=-1)


# ----------------------------------------------------------------------------------------------
# Validation and capability checks (CPU)
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("module", [hopper, fp8], ids=["hopper", "fp8"])
def test_unsupported_head_dim_is_refused_with_reason(module):
    # fp16: the interpreter refuses bf16 before the head dim.
    problem = Problem(1, 2, 64, 64, 96, dtype=torch.float16)
    ok, reason = module.supports(problem, torch.device(DEVICE))
    assert not ok
    assert "head_dim" in reason and "96" in reason


@pytest.mark.parametrize("module", [hopper, fp8], ids=["hopper", "fp8"])
def test_unsupported_head_dim_raises_value_error(module):
    q = torch.zeros(1, 2, 16, 96, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match=r"head_dim must be one of \[64, 128, 256\], got 96"):
        module.prepare(q, q, q, Problem(1, 2, 16, 16, 96, dtype=torch.float16))


@pytest.mark.parametrize("module", [hopper, fp8], ids=["hopper", "fp8"])
def test_negative_scale_is_refused(module):
    problem = Problem(1, 2, 16, 16, 64, dtype=torch.float16, softmax_scale=-0.1)
    ok, reason = module.supports(problem, torch.device(DEVICE))
    assert not ok and "softmax_scale >= 0" in reason
    q = torch.zeros(1, 2, 16, 64, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match="softmax_scale must be >= 0"):
        module.prepare(q, q, q, problem)


def test_fp8_refuses_fp32_inputs():
    ok, reason = fp8.supports(Problem(1, 2, 16, 16, 64, dtype=torch.float32), torch.device(DEVICE))
    assert not ok and "fp32" in reason


@pytest.mark.skipif(not triton_interpreting(), reason="bf16 is refused only under the interpreter")
def test_interpreter_refuses_bf16_like_the_other_triton_rungs():
    """Under the interpreter triton/hopper's bf16 is silently wrong (relative error 4e9, issue #38)."""
    ok, reason = hopper.supports(Problem(1, 2, 128, 128, 64, dtype=torch.bfloat16), torch.device("cpu"))
    assert not ok and "bf16 is not exact under the Triton interpreter" in reason
    assert hopper.supports(Problem(1, 2, 128, 128, 64, dtype=torch.float16), torch.device("cpu")) == (True, "")


def test_fp8_refuses_head_dim_256_naming_the_shared_memory(monkeypatch: pytest.MonkeyPatch):
    """At D=256 the fused quantiser needs more shared memory than an sm_90 CTA has: the check refuses it
    with both numbers instead of the launch failing with OutOfResources (issue #38's decode step)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    decode_step = Problem(
        1, 32, 1, 4096, 256, dtype=torch.bfloat16, causal=True, kv_heads=8, causal_alignment="bottom_right"
    )  # fmt: skip
    needed = shared_bytes(256, torch.bfloat16, fp8.DEFAULT_QUANTISATION)
    ok, reason = fp8.supports(decode_step, torch.device("cuda"))
    assert not ok
    assert "fused fp8 quantiser" in reason and f"{needed:,} bytes" in reason and "232,448" in reason
    assert fp8.supports(decode_step.with_(head_dim=128), torch.device("cuda")) == (True, "")


def test_a_kernel_tile_beyond_shared_memory_is_refused():
    """The kernel's own tiles are held to the same budget, from the configuration the launcher uses."""
    problem = Problem(1, 2, 128, 128, 256, dtype=torch.bfloat16)
    too_deep = hopper.HopperKernelConfig(128, 128, 8, 4)
    ok, reason = hopper.kernel_fits("triton/hopper", problem, too_deep, element_bytes=2)
    assert not ok and f"{too_deep.shared_bytes(256, 2):,} bytes" in reason and "128x128 tiles, 4 stages" in reason
    assert hopper.kernel_fits("triton/hopper", problem, hopper.DEFAULT_CONFIGS[256], element_bytes=2) == (True, "")


def test_fp8_refuses_the_overlapped_loop():
    problem = Problem(1, 2, 16, 16, 64, dtype=torch.float16)
    q = torch.zeros(1, 2, 16, 64, dtype=torch.float16, device=DEVICE)
    overlapped = hopper.HopperKernelConfig(64, 32, 4, 1, overlap=True)
    with pytest.raises(ValueError, match="overlap"):
        fp8.Fp8Attention(quantise(q, q, q, fp8.DEFAULT_QUANTISATION), problem, overlapped)


# ----------------------------------------------------------------------------------------------
# Static: warp specialisation shows up in the PTX only with num_warps=4 and BLOCK_M=64 on sm_90
# ----------------------------------------------------------------------------------------------
_WS_PROBE = """
import json, sys
from common.contract.problem import Problem
from common.reporting.static import ptx_features, cubin_resources
from triton_impl import fp8, hopper
rows = {}
for module in (hopper, fp8):
    for warp_specialize in (False, True):
        config = hopper.HopperKernelConfig(64, 64, 4, 2, warp_specialize=warp_specialize)
        binary = module.compile_sm90(Problem.canonical(8192, causal=True), config)[0]
        spills = max(usage["local_bytes"] for usage in cubin_resources(binary.cubin).values())
        rows[f"{module.__name__}/{warp_specialize}"] = [ptx_features(binary.ptx)["setmaxnreg"], spills]
print(json.dumps(rows))
"""


def _compile_probe(code: str) -> dict:
    """Run a compile probe in a process without TRITON_INTERPRET (see common/reporting/static.py);
    its last line is JSON."""
    return json_from_child(["-c", code], timeout=900)


@pytest.fixture(scope="session")
def static_probes() -> dict[str, dict]:
    """The static tests' probes, ``warp-specialised`` (above) and ``fp8-occupancy`` (below), in one child
    process: one import for the two tests (one pytest-xdist group); read one with ``child_result``."""
    probes = {"warp-specialised": (_WS_PROBE, []), "fp8-occupancy": (_FP8_OCCUPANCY_PROBE, [])}
    return scripts_in_one_child(probes, timeout=1800)


@pytest.mark.static
@pytest.mark.release
@pytest.mark.xdist_group("triton-hopper-compile")
def test_warp_specialised_configs_use_setmaxnreg(static_probes: dict[str, dict]):
    rows = child_result(static_probes, "warp-specialised")
    for name, (has_setmaxnreg, spills) in rows.items():
        assert has_setmaxnreg == name.endswith("True"), f"{name}: setmaxnreg present = {has_setmaxnreg}"
        assert spills == 0, f"{name} spills {spills} bytes"


_FP8_OCCUPANCY_PROBE = """
import json
from common.contract.problem import Problem
from common.reporting.static import cubin_resources
from triton_impl import fp8
rows = {}
for head_dim in (64, 128):
    for causal in (False, True):
        binary = fp8.compile_sm90(Problem.canonical(8192, head_dim=head_dim, causal=causal))[0]
        usage = next(iter(cubin_resources(binary.cubin).values()))
        rows[f"D={head_dim} causal={causal}"] = [binary.threads_per_cta, usage["registers"], usage["local_bytes"],
                                                 binary.shared_bytes + usage["static_shared_bytes"]]
print(json.dumps(rows))
"""
# sm_90: 64K registers (allocated per warp in units of 256) and 228 KiB of shared memory per SM,
# of which the driver reserves 1 KiB per CTA.
SM90_REGISTERS = 65536
SM90_SHARED_BYTES = 233_472
CTA_RESERVED_SHARED_BYTES = 1024


@pytest.mark.static
@pytest.mark.release
@pytest.mark.xdist_group("triton-hopper-compile")
def test_fp8_default_configs_fit_two_ctas_per_sm(static_probes: dict[str, dict]):
    # The fp8 defaults rely on two independent one-warpgroup CTAs per SM (triton_impl/fp8.py).
    for name, (threads, registers, spills, shared) in child_result(static_probes, "fp8-occupancy").items():
        registers_per_warp = -(-registers * 32 // 256) * 256
        assert 2 * (threads // 32) * registers_per_warp <= SM90_REGISTERS, f"{name}: {registers} registers"
        assert 2 * (shared + CTA_RESERVED_SHARED_BYTES) <= SM90_SHARED_BYTES, f"{name}: {shared} B shared"
        assert spills == 0, f"{name} spills {spills} bytes"


_FEATURES_PROBE = """
import json
from common.contract.problem import Problem
from common.reporting.static import cubin_resources
from triton_impl import fp8, hopper
rows = {}
for module in (hopper, fp8):
    for head_dim in (64, 128):
        for causal in (False, True):
            problem = Problem(2, 16, 1, 8192, head_dim, causal=causal, kv_heads=4, causal_alignment="bottom_right",
                              has_cache_seqlens=True, return_lse=True)
            binary = module.compile_sm90(problem)[0]
            usage = next(iter(cubin_resources(binary.cubin).values()))
            rows[f"{module.__name__} D={head_dim} causal={causal}"] = usage["local_bytes"]
print(json.dumps(rows))
"""


def test_default_configs_do_not_spill_with_every_feature():
    # GQA, bottom-right, cache lengths and the LSE at the default tiles (the overlapped loop at D=128).
    for name, spills in _compile_probe(_FEATURES_PROBE).items():
        assert spills == 0, f"{name} spills {spills} bytes"


def test_candidate_configs_fit_shared_memory():
    for head_dim in hopper.HEAD_DIMS:
        for config in hopper.candidate_configs(head_dim, torch.bfloat16):
            assert config.shared_bytes(head_dim, 2) <= hopper.SHARED_MEMORY_BUDGET
        fp8_candidates = fp8.candidate_configs(head_dim)
        # The default's tile is a candidate (a release may add ptxas flags to it: common/toolchain/releases.py).
        default_tile = dataclasses.replace(fp8.DEFAULT_CONFIGS[head_dim], ptx_options=None)
        assert default_tile in fp8_candidates or head_dim == 256
        for config in fp8_candidates:
            assert config.shared_bytes(head_dim, 1) <= hopper.SHARED_MEMORY_BUDGET


# ----------------------------------------------------------------------------------------------
# Interpreter (CPU): lse, and the warp-specialised loop structure (one masked loop)
# ----------------------------------------------------------------------------------------------
needs_interpreter = pytest.mark.skipif(not triton_interpreting(), reason="interpreter tests run on CPU-only machines")


@needs_interpreter
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    ("warp_specialize", "overlap"), [(False, False), (True, False), (False, True)],
    ids=["two-loops", "one-masked-loop", "overlapped"],
)  # fmt: skip
@pytest.mark.parametrize(("seqlen_q", "seqlen_k"), [(77, 130), (130, 77), (1, 33)])
def test_interpreter_output_and_lse(causal: bool, warp_specialize: bool, overlap: bool, seqlen_q: int, seqlen_k: int):
    problem = Problem(1, 2, seqlen_q, seqlen_k, 64, dtype=torch.float32, causal=causal, return_lse=True)
    q, k, v = make_inputs(problem, seed=5, device="cpu", offset=0.5)
    config = hopper.HopperKernelConfig(64, 32, 4, 1, warp_specialize=warp_specialize, overlap=overlap)
    out, lse = hopper.prepare(q, k, v, problem, config=config)()
    err = error_stats(out, reference_attention(q, k, v, problem))
    assert err.max_abs_err < 1e-5, err.summary()
    lse_err = (lse.double() - _reference_lse(q, k, problem)).abs().max().item()
    assert lse_err < 1e-5, f"lse max abs error {lse_err:.3e}"


@needs_interpreter
def test_fp8_interpreter_is_skipped_for_a_reason():
    assert not fp8.IMPLEMENTATION.runs_on_cpu
    pytest.skip(FP8_INTERPRETER_SKIP)


# ----------------------------------------------------------------------------------------------
# GPU: lse, strided inputs, fp8 accuracy, memcheck
# ----------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_lse_matches_reference(causal: bool):
    problem = Problem(2, 3, 1000, 777, 128, dtype=torch.bfloat16, causal=causal)
    q, k, v = make_inputs(problem, seed=11)
    out, lse = attention(q, k, v, causal=causal, impl="triton/hopper", return_lse=True)
    ref = reference_attention(q, k, v, problem)
    assert error_stats(out, ref).rel_l2_err < 1e-2
    lse_err = (lse.double() - _reference_lse(q, k, problem)).abs().max().item()
    assert lse_err < 1e-2, f"lse max abs error {lse_err:.3e}"


def test_warp_specialised_configs_are_refused_on_a_gpu_and_not_candidates():
    warp_specialised = hopper.HopperKernelConfig(64, 64, 4, 3, warp_specialize=True)
    with pytest.raises(ValueError, match="left query rows unwritten"):
        hopper.check_launchable(warp_specialised, torch.device("cuda"))
    hopper.check_launchable(warp_specialised, torch.device("cpu"))
    hopper.check_launchable(hopper.default_config(128), torch.device("cuda"))
    assert not any(config.warp_specialize for config in hopper.CANDIDATE_CONFIGS)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    "config", hopper.candidate_configs(128, torch.bfloat16), ids=lambda config: str(config).replace(" ", "")
)
def test_gpu_every_candidate_is_correct(config, causal: bool):
    # The candidates are the tiles a default is chosen from, so each one must be right on its own.
    problem = Problem(1, 3, 300, 555, 128, dtype=torch.bfloat16, causal=causal)
    q, k, v = make_inputs(problem, seed=17)
    ref = reference_attention(q, k, v, problem)
    prepared = hopper.prepare(q, k, v, problem, config=config)
    out = prepared()
    out.fill_(math.nan)
    err = error_stats(prepared(), ref)
    assert err.nonfinite == 0 and err.rel_l2_err < 1e-2, f"{config}: {err.summary()}"


@pytest.mark.gpu
def test_gpu_strided_bshd_inputs():
    # (B, S, H, D) storage viewed as (B, H, S, D): the 4-D descriptors take the strides as they are.
    problem = Problem(2, 4, 333, 333, 64, dtype=torch.float16)
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in make_inputs(problem, seed=3, offset=0.5))
    out = hopper.prepare(q, k, v, problem)()
    err = error_stats(out, reference_attention(q, k, v, problem))
    assert err.rel_l2_err < 1e-2, err.summary()


_MEMCHECK_PROBE = """
import torch
from common.contract.check import check_implementation
from common.contract.problem import Problem
from triton_impl import fp8, hopper
for impl in (hopper.IMPLEMENTATION, fp8.IMPLEMENTATION):
    for causal in (False, True):
        result = check_implementation(impl, Problem(1, 2, 77, 130, 64, dtype=torch.bfloat16, causal=causal))
        assert result.ok, result.summary()
"""


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="compute-sanitizer not on PATH")
def test_gpu_memcheck_clean_on_ragged_shape():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    command = ["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "1", HOST_API_ERRORS]
    command += [sys.executable, "-c"]
    done = subprocess.run([*command, _MEMCHECK_PROBE], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]


# ----------------------------------------------------------------------------------------------
# GQA, both causal alignments, per-sequence key lengths and the LSE (shared kernel, every loop)
# ----------------------------------------------------------------------------------------------
# (Sq, Sk, kv_heads, causal alignment or None for full attention, cache lengths or None): MQA and GQA,
# Sq < Sk (decode-like) and Sq > Sk (whose first rows see no key bottom-right), ragged lengths with
# an empty sequence, full attention over a padded cache.
INTERPRETER_FEATURE_CASES = [
    (45, 130, 2, "bottom_right", None),
    (130, 77, 1, "bottom_right", None),
    (77, 130, 4, "top_left", None),
    (21, 130, 1, "bottom_right", (130, 0)),
    (21, 130, 2, None, (77, 1)),
]


def _check_features(problem: Problem, out: torch.Tensor, lse: torch.Tensor, inputs, cache_seqlens) -> None:
    ref, ref_lse = reference_attention(*inputs, problem, cache_seqlens=cache_seqlens, with_lse=True)
    err = error_stats(out, ref)
    assert err.nonfinite == 0 and err.max_abs_err < 1e-5, f"{problem.describe()}: {err.summary()}"
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)), "-inf exactly where a row sees no key"
    finite = torch.isfinite(ref_lse)
    lse_err = (lse.double() - ref_lse)[finite].abs().max().item() if finite.any() else 0.0
    assert lse_err < 1e-5, f"{problem.describe()}: lse max abs error {lse_err:.3e}"


@needs_interpreter
@pytest.mark.parametrize(
    ("warp_specialize", "overlap"), [(False, False), (True, False), (False, True)],
    ids=["two-loops", "one-masked-loop", "overlapped"],
)  # fmt: skip
@pytest.mark.parametrize("case", INTERPRETER_FEATURE_CASES, ids=lambda case: "-".join(map(str, case)))
def test_interpreter_features_in_every_loop(case, warp_specialize: bool, overlap: bool):
    seqlen_q, seqlen_k, kv_heads, alignment, lengths = case
    problem = Problem(
        2, 4, seqlen_q, seqlen_k, 64, dtype=torch.float32, causal=alignment is not None, kv_heads=kv_heads,
        causal_alignment=alignment or "top_left", has_cache_seqlens=lengths is not None, return_lse=True,
    )  # fmt: skip
    q, k, v = make_inputs(problem, seed=seqlen_q + kv_heads, device="cpu", offset=0.5)
    assert k.shape[1] == kv_heads, "K and V come with their KV heads, not repeated"
    cache_seqlens = None if lengths is None else torch.tensor(lengths, dtype=torch.int32)
    config = hopper.HopperKernelConfig(64, 32, 4, 1, warp_specialize=warp_specialize, overlap=overlap)
    run = hopper.prepare(q, k, v, problem, config=config, cache_seqlens=cache_seqlens)
    out, lse = run()
    out.fill_(math.nan)
    lse.fill_(math.nan)
    out, lse = run()
    _check_features(problem, out, lse, (q, k, v), cache_seqlens)


@needs_interpreter
def test_interpreter_api_takes_every_feature():
    from common.contract.api import attention

    q = torch.randn(2, 4, 5, 64)
    k, v = torch.randn(2, 2, 40, 64), torch.randn(2, 2, 40, 64)
    lengths = torch.tensor([40, 9], dtype=torch.int32)
    options = {"causal": True, "causal_alignment": "bottom_right", "cache_seqlens": lengths, "return_lse": True}
    out, lse = attention(q, k, v, impl="triton/hopper", **options)
    problem = Problem(2, 4, 5, 40, 64, dtype=torch.float32, causal=True, kv_heads=2, causal_alignment="bottom_right",
                      has_cache_seqlens=True, return_lse=True)  # fmt: skip
    _check_features(problem, out, lse, (q, k, v), lengths)


def test_both_rungs_claim_every_feature():
    problem = Problem(1, 8, 3, 100, 128, kv_heads=2, causal=True, causal_alignment="bottom_right",
                      has_cache_seqlens=True, return_lse=True)  # fmt: skip
    for module in (hopper, fp8):
        ok, reason = module.IMPLEMENTATION.supports(problem, torch.device("cpu"))
        assert ok or "not implemented" not in reason, reason


@pytest.mark.gpu
@pytest.mark.parametrize("module", [hopper, fp8], ids=["hopper", "fp8"])
@pytest.mark.parametrize("head_dim", [64, 128], ids=["d64", "d128"])
@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
@pytest.mark.parametrize("kv_heads", [1, 4], ids=["mqa", "gqa4"])
@pytest.mark.parametrize(("seqlen_q", "seqlen_k"), [(1, 1000), (300, 4100), (1000, 77)])
def test_gpu_gqa_and_alignment_with_lse(module, head_dim, alignment, kv_heads, seqlen_q, seqlen_k):
    from common.contract.check import check_on_inputs

    problem = Problem(
        2, 8, seqlen_q, seqlen_k, head_dim, dtype=torch.bfloat16, causal=True, kv_heads=kv_heads,
        causal_alignment=alignment, return_lse=True,
    )  # fmt: skip
    q, k, v = make_inputs(problem, seed=seqlen_q + kv_heads, offset=0.5)
    result = check_on_inputs(module.IMPLEMENTATION, q, k, v, problem)
    assert result.ok, f"{module.__name__} {problem.describe()}: {result.summary()}"


@pytest.mark.gpu
@pytest.mark.parametrize("module", [hopper, fp8], ids=["hopper", "fp8"])
@pytest.mark.parametrize("head_dim", [64, 128], ids=["d64", "d128"])
@pytest.mark.parametrize("alignment", [None, "bottom_right"], ids=["full", "bottom_right"])
@pytest.mark.parametrize("seqlen_q", [1, 300])
def test_gpu_ragged_cache_seqlens_with_lse(module, head_dim, alignment, seqlen_q):
    from common.contract.check import check_on_inputs

    problem = Problem(
        4, 8, seqlen_q, 4100, head_dim, dtype=torch.bfloat16, causal=alignment is not None, kv_heads=2,
        causal_alignment=alignment or "top_left", has_cache_seqlens=True, return_lse=True,
    )  # fmt: skip
    q, k, v = make_inputs(problem, seed=seqlen_q + head_dim, offset=0.5)
    # A full cache, an empty one, one shorter than Sq, and one ending inside a key block.
    lengths = torch.tensor([4100, 0, 200, 1777], dtype=torch.int32, device="cuda")
    result = check_on_inputs(module.IMPLEMENTATION, q, k, v, problem, cache_seqlens=lengths)
    assert result.ok, f"{module.__name__} {problem.describe()} {lengths.tolist()}: {result.summary()}"
