"""Checks specific to the Gluon rungs (gluon/hopper, gluon/fp8) beyond the shared rung tests.

CPU: every supported variant compiles for sm_90a with the instructions its design claims (TMA,
mbarriers, wgmma, setmaxnreg with the partition budgets) and without spills; capability checks and
input validation. Gluon has no interpreter path, and the interpreter that the CPU test session
turns on breaks Gluon compilation, so the compiles run in a child process without it.
GPU (``gpu`` marker): LSE against the fp64 reference, and the prepared launch reused on new inputs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.inputs import make_inputs
from common.problem import Problem
from common.reference import reference_attention
from common.registry import discover
from triton_impl.gluon import hopper
from triton_impl.gluon._device import LOAD_REGISTERS

ROOT = Path(__file__).resolve().parent.parent
# The compile fixture runs once per variant in one pytest-xdist worker (--dist loadgroup).
pytestmark = pytest.mark.xdist_group("gluon-compile")
HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
# (head_dim, causal, dtype name) variants compiled on the CPU.
VARIANTS = [(128, False, "bf16"), (128, True, "bf16"), (64, False, "fp16"), (64, True, "bf16")]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

_COMPILE_SCRIPT = """
import json, re, sys
import torch
from common.problem import Problem
from common.static import cubin_resources, ptx_features
from triton_impl.gluon import hopper
head_dim, causal, dtype = json.loads(sys.argv[1])
problem = Problem(1, 1, 256, 256, head_dim, dtype=getattr(torch, dtype), causal=causal)
(binary,) = hopper.compile_sm90(problem)
(resources,) = cubin_resources(binary.cubin).values()
print(json.dumps({
    "features": ptx_features(binary.ptx),
    "setmaxnreg": sorted({int(n) for n in re.findall(r"setmaxnreg\\S*\\s+(\\d+)", binary.ptx)}),
    "local_bytes": resources["local_bytes"],
    "head_dim": head_dim,
    "shared_bytes": binary.shared_bytes,
}))
"""


def _compile_in_child(head_dim: int, causal: bool, dtype_name: str) -> dict:
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    torch_dtype = {"bf16": "bfloat16", "fp16": "float16"}[dtype_name]
    done = subprocess.run(
        [sys.executable, "-c", _COMPILE_SCRIPT, json.dumps([head_dim, causal, torch_dtype])],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"sm_90a compile failed:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module", params=VARIANTS, ids=[f"d{d}-{'causal' if c else 'full'}-{t}" for d, c, t in VARIANTS])
def compiled(request: pytest.FixtureRequest) -> dict:
    return _compile_in_child(*request.param)


# ----------------------------------------------------------------------------------------------
# Static compile (CPU)
# ----------------------------------------------------------------------------------------------
def test_ptx_has_tma_barriers_wgmma_and_register_budgets(compiled: dict):
    features = compiled["features"]
    for name in ("wgmma.mma_async", "cp.async.bulk.tensor", "mbarrier", "setmaxnreg"):
        assert features[name], f"PTX lacks {name}"
    assert not features["cp.async"], "PTX uses per-thread cp.async copies instead of TMA"
    # The load warp gives registers up, the consumer warpgroups take them (setmaxnreg per partition).
    assert LOAD_REGISTERS.value in compiled["setmaxnreg"], compiled["setmaxnreg"]
    consumer_registers = hopper.DEFAULT_CONFIGS[compiled["head_dim"]].consumer_registers
    assert consumer_registers in compiled["setmaxnreg"], compiled["setmaxnreg"]


def test_no_spills_and_shared_memory_fits(compiled: dict):
    assert compiled["local_bytes"] == 0, f"spills {compiled['local_bytes']} bytes per thread"
    assert compiled["shared_bytes"] <= 232_448, f"needs {compiled['shared_bytes']} B of shared memory"


# ----------------------------------------------------------------------------------------------
# Registry, capability checks and validation (CPU)
# ----------------------------------------------------------------------------------------------
def test_registry_lists_the_gluon_stack():
    available, missing = discover(include_baselines=False)
    names = {impl.name: impl for impl in available}
    assert names["gluon/hopper"].stack == "gluon"
    assert names["gluon/hopper"].bind is not None
    assert all("gluon" not in m.name or m.name == "gluon/fp8" for m in missing), missing


def test_cpu_is_refused_with_reason():
    ok, reason = hopper.IMPLEMENTATION.check(Problem(1, 2, 64, 64, 128), torch.device("cpu"))
    assert not ok
    assert "GPU" in reason


def test_unsupported_head_dim_is_refused_with_reason():
    ok, reason = hopper.supports(Problem(1, 2, 64, 64, 256), torch.device("cuda"))
    assert not ok
    assert "head_dim" in reason and "256" in reason


def test_fp32_is_refused_with_reason():
    ok, reason = hopper.supports(Problem(1, 2, 64, 64, 128, dtype=torch.float32), torch.device("cuda"))
    assert not ok
    assert "fp32" in reason


def test_bad_dtype_raises_naming_expected_and_given():
    q = torch.zeros(1, 2, 16, 64, dtype=torch.float32, device=DEVICE)
    with pytest.raises(TypeError, match=r"bf16, fp16.*got fp32"):
        hopper.prepare(q, q, q, Problem(1, 2, 16, 16, 64, dtype=torch.float32))


def test_cpu_tensors_raise_naming_the_device():
    q = torch.zeros(1, 2, 16, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"tensors must be on a cuda device, got cpu"):
        hopper.prepare(q, q, q, Problem(1, 2, 16, 16, 64, dtype=torch.float16))


@pytest.mark.gpu
def test_bad_head_dim_raises_naming_expected_and_given():
    q = torch.zeros(1, 2, 16, 96, dtype=torch.float16, device="cuda")
    with pytest.raises(ValueError, match=r"head_dim must be one of \[64, 128\], got 96"):
        hopper.prepare(q, q, q, Problem(1, 2, 16, 16, 96, dtype=torch.float16))


# ----------------------------------------------------------------------------------------------
# GPU
# ----------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlens", [(77, 1000), (1000, 77), (333, 333)], ids=lambda s: f"sq{s[0]}-sk{s[1]}")
def test_gpu_lse_matches_reference(seqlens: tuple[int, int], causal: bool):
    problem = Problem(2, 3, *seqlens, 128, dtype=torch.bfloat16, causal=causal)
    ok, reason = hopper.IMPLEMENTATION.check(problem, torch.device("cuda"))
    if not ok:
        pytest.skip(reason)
    q, k, v = make_inputs(problem, seed=5)
    run = hopper.prepare(q, k, v, problem)
    run.lse.fill_(float("nan"))
    run()
    _, lse_ref = reference_attention(q, k, v, problem, with_lse=True)
    error = (run.lse.double() - lse_ref).abs().max().item()
    assert error < 1e-2, f"max |lse - reference| = {error:.3g}"


@pytest.mark.gpu
def test_gpu_bind_runs_new_inputs_of_a_prepared_signature():
    problem = Problem(1, 2, 500, 700, 64, dtype=torch.float16, causal=True)
    ok, reason = hopper.IMPLEMENTATION.check(problem, torch.device("cuda"))
    if not ok:
        pytest.skip(reason)
    hopper.prepare(*make_inputs(problem, seed=1), problem)
    q, k, v = make_inputs(problem, seed=2)
    out = hopper.bind(q, k, v, problem)()
    expected = reference_attention(q, k, v, problem)
    error = (out.double() - expected).abs().max().item()
    assert error < 2e-2, f"max |O - reference| = {error:.3g}"
