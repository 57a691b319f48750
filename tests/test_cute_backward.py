"""cute/backward/tiled beyond the shared backward tests (``tests/test_backward.py``, which also runs its
GPU gradients through cute/tiled, cute/pipelined and cute/hopper and compiles it for sm_90a).

Without a GPU: every kernel variant (D 64 and 128, causal in both alignments and not, GQA, dLSE, both
dtypes) compiles for sm_90a without spills and with the instructions the rung is about; the capability
check refuses what the rung cannot differentiate, each with its reason; a copy taller than its tile is
refused at trace time. With a GPU: gradients against fp64 by the yardstick rule on the shapes that probe
this rung's tiles (query and key tails inside one tile, rows that see no key, one query or key, MQA),
and the returned LSE differentiated too.
"""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("cutlass")

from common import attention
from common.contract import capability
from common.contract.gradients import judge_gradients
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from common.contract.reference import reference_attention
from common.reporting.static import cubin_resources
from cute_impl._host import CUTE_DTYPES
from cute_impl.backward import naive, tiled
from cute_impl.backward._device import row_tile_copy
from tests.test_backward import assert_all_pass, dense_attention, ladder_gradients

# PTX atomics (atom.global.add, red.relaxed.gpu.global.add, ...), not the "red." inside "shared.".
ATOMICS = re.compile(r"(?<![a-z])(atom|red)\.")
# (causal, alignment, kv_heads of 4 heads, d_lse): the canonical MHA problem and the one with every
# compile-time feature on.
VARIANTS = {
    "full_mha": (False, "top_left", 4, False),
    "causal_top_left_gqa": (True, "top_left", 2, False),
    "causal_bottom_right_mqa_dlse": (True, "bottom_right", 1, True),
}


def problem(
    seqlen_q: int,
    seqlen_k: int,
    head_dim: int,
    *,
    causal: bool = False,
    alignment: str = "top_left",
    kv_heads: int = 4,
    dtype: torch.dtype = torch.bfloat16,
) -> Problem:
    """Four query heads, batch 1."""
    return Problem(1, 4, seqlen_q, seqlen_k, head_dim, dtype, causal=causal, kv_heads=kv_heads,
                   causal_alignment=alignment)  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Static: compiles for sm_90a without spills, with the rung's instructions
# ----------------------------------------------------------------------------------------------
@pytest.mark.cute_compile
@pytest.mark.static
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("head_dim", tiled.HEAD_DIMS, ids=lambda d: f"d{d}")
def test_every_kernel_compiles_without_spills(head_dim: int, variant: str) -> None:
    causal, alignment, kv_heads, has_dlse = VARIANTS[variant]
    prob = problem(1000, 1000, head_dim, causal=causal, alignment=alignment, kv_heads=kv_heads)
    binaries = tiled.compile_sm90(prob, has_dlse=has_dlse)
    assert [binary.name.rsplit("_", 1)[-1] for binary in binaries] == ["preprocess", "dkdv", "dq"]
    for binary in binaries:
        for usage in cubin_resources(binary.cubin).values():
            spills = usage["stack_bytes"] + usage["local_bytes"]
            assert spills == 0, f"{binary.name} {prob.describe()}: {usage['registers']} registers, {spills} B spilled"
    for binary in binaries[1:]:
        for instruction in ("mma.sync.aligned.m16n8k16", "ldmatrix.sync.aligned.m8n8.x4.trans", "cp.async.cg"):
            assert instruction in binary.ptx, f"{binary.name}: no {instruction}"
        assert not ATOMICS.search(binary.ptx), f"{binary.name}: dQ by a separate pass needs no atomics"


@pytest.mark.cute_compile
@pytest.mark.static
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_naive_compiles_without_spills_or_tensor_cores(variant: str) -> None:
    causal, alignment, kv_heads, has_dlse = VARIANTS[variant]
    prob = problem(1000, 1000, 128, causal=causal, alignment=alignment, kv_heads=kv_heads)
    (binary,) = naive.compile_sm90(prob, has_dlse=has_dlse)
    usages = cubin_resources(binary.cubin)
    assert len(usages) == 5, sorted(usages)
    for kernel, usage in usages.items():
        assert usage["stack_bytes"] + usage["local_bytes"] == 0, f"{kernel}: {usage}"
    assert "mma" not in binary.ptx and not ATOMICS.search(binary.ptx)


@pytest.mark.cute_compile
@pytest.mark.static
def test_fp16_compiles_without_spills() -> None:
    prob = problem(1000, 1000, 128, causal=True, dtype=torch.float16)
    for binary in tiled.compile_sm90(prob):
        assert "f16.f16" in binary.ptx or binary.name.endswith("preprocess"), binary.name
        for usage in cubin_resources(binary.cubin).values():
            assert usage["stack_bytes"] + usage["local_bytes"] == 0, binary.name


# ----------------------------------------------------------------------------------------------
# What the rung refuses, and why
# ----------------------------------------------------------------------------------------------
@pytest.fixture
def hopper(monkeypatch: pytest.MonkeyPatch) -> torch.device:
    """A CUDA device that reports sm_90, for the capability check without a GPU."""
    monkeypatch.setattr(capability, "_architecture", lambda device: (9, 0))
    return torch.device("cuda")


def test_supports_every_feature_it_implements(hopper: torch.device) -> None:
    for head_dim in tiled.HEAD_DIMS:
        for dtype in CUTE_DTYPES:
            prob = problem(77, 1000, head_dim, causal=True, alignment="bottom_right", kv_heads=1).with_(dtype=dtype)
            assert tiled.supports(prob, hopper) == (True, "")
            assert tiled.supports(prob.with_(return_lse=True), hopper) == (True, "")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"head_dim": 256}, "head_dim"),
        ({"dtype": torch.float32}, "dtypes"),
        ({"has_cache_seqlens": True}, "cache_seqlens"),
        ({"softmax_scale": -1.0}, "softmax_scale"),
    ],
    ids=["d256", "fp32", "cache_seqlens", "negative_scale"],
)
def test_refuses_what_it_cannot_differentiate(hopper: torch.device, change: dict, reason: str) -> None:
    prob = problem(64, 64, 128).with_(**change)
    ok, why = tiled.BACKWARD.check(prob, hopper)
    assert not ok and reason in why
    if change != {"softmax_scale": -1.0}:  # naive takes any scale: P is masked to 0, not -inf
        ok, why = naive.BACKWARD.check(prob, hopper)
        assert not ok and reason in why


def test_refuses_a_cpu_and_an_old_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    ok, why = tiled.BACKWARD.check(problem(64, 64, 128), torch.device("cpu"))
    assert not ok and "CUDA GPU" in why
    monkeypatch.setattr(capability, "_architecture", lambda device: (7, 5))
    ok, why = tiled.supports(problem(64, 64, 128), torch.device("cuda"))
    assert not ok and "sm_80" in why


def test_gradients_refuse_cpu_tensors_before_any_kernel() -> None:
    prob = problem(8, 8, 64)
    q = torch.zeros(1, 4, 8, 64, dtype=torch.bfloat16)
    lse = torch.zeros(1, 4, 8)
    with pytest.raises(ValueError, match=r"cute/backward/tiled cannot differentiate.*CUDA"):
        tiled.tiled_gradients(q, q, q, q, lse, q, prob)


def test_a_copy_taller_than_its_tile_is_refused() -> None:
    """256 threads copy 16 rows of D=128 per step: an 8-row tile would be overrun (the check runs before
    any MLIR is built; the 16-row tiles the rung uses compile in the static tests)."""
    with pytest.raises(ValueError, match="not multiples of the copy's 16 rows"):
        row_tile_copy(CUTE_DTYPES[torch.bfloat16], 256, 128, (8, 128))


# ----------------------------------------------------------------------------------------------
# GPU: gradients against fp64 on the shapes that probe this rung's tiles
# ----------------------------------------------------------------------------------------------
GPU_CASES = {
    # Sq > Sk bottom-right: the first 16 rows see no key (LSE -inf, P = 0); MQA sums 4 heads.
    "mqa_causal_bottom_right_sq_gt_sk_d64": problem(53, 37, 64, causal=True, alignment="bottom_right", kv_heads=1),
    # One query row against many keys, and many against one key.
    "one_query_causal_bottom_right_d128": problem(1, 77, 128, causal=True, alignment="bottom_right", kv_heads=2),
    "one_key_full_d128": problem(77, 1, 128, kv_heads=2),
    # Several key and query blocks, both tails ragged, the diagonal off the tile grid.
    "gqa_causal_top_left_ragged_d64": problem(150, 290, 64, causal=True, kv_heads=2),
    "gqa_causal_bottom_right_ragged_d128": problem(290, 150, 128, causal=True, alignment="bottom_right", kv_heads=2),
}


def gpu_inputs(prob: Problem, seed: int) -> tuple[torch.Tensor, ...]:
    q, k, v = make_inputs(prob, seed=seed, device="cuda", offset=0.5)
    generator = torch.Generator(device="cuda").manual_seed(seed + 1)
    return q, k, v, torch.randn(q.shape, generator=generator, device="cuda").to(prob.dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(GPU_CASES))
@pytest.mark.parametrize("forward", ["cute/naive", "cute/tiled"])
def test_gpu_gradients_pass_the_rule(forward: str, case: str) -> None:
    """Each backward rung through its forward, bf16 (tests/test_backward.py runs fp16 too, and pairs
    cute/pipelined and cute/hopper with the tiled rung)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    prob = GPU_CASES[case]
    q, k, v, d_out = gpu_inputs(prob, seed=21)
    assert_all_pass(ladder_gradients(forward, prob, q, k, v, d_out), q, k, v, d_out, prob)


@pytest.mark.gpu
@pytest.mark.parametrize("forward", ["cute/naive", "cute/tiled"])
def test_gpu_the_returned_lse_is_differentiable_too(forward: str) -> None:
    """loss = ⟨O, dO⟩ + ⟨LSE, dLSE⟩, against fp64 autograd; yardstick: dense torch in bf16."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    # Every row sees a key (dense_attention, the yardstick, has no guard for a row that sees none).
    prob = GPU_CASES["gqa_causal_top_left_ragged_d64"]
    q, k, v, d_out = gpu_inputs(prob, seed=22)
    d_lse = torch.randn(q.shape[:3], generator=torch.Generator(device="cuda").manual_seed(5), device="cuda")

    def grads_of(attend, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        out, lse = attend(*leaves)
        loss = (out.to(dtype) * d_out.to(dtype)).sum() + (lse.to(dtype) * d_lse.to(dtype)).sum()
        return torch.autograd.grad(loss, leaves)

    reference = grads_of(lambda *t: reference_attention(*t, prob, with_lse=True), torch.float64)
    yardstick = grads_of(lambda *t: dense_attention(*t, prob), prob.dtype)
    mine = grads_of(
        lambda *t: attention(*t, causal=True, impl=forward, return_lse=True),
        prob.dtype,
    )
    failed = [check.summary() for check in judge_gradients(mine, reference, yardstick) if not check.ok]
    assert not failed, "\n".join(failed)


@pytest.mark.gpu
def test_gpu_gradients_are_deterministic() -> None:
    """dQ by a separate pass (no atomics): two backward passes give bit-identical gradients."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    prob = GPU_CASES["gqa_causal_top_left_ragged_d64"]
    q, k, v, d_out = gpu_inputs(prob, seed=23)
    first = ladder_gradients("cute/tiled", prob, q, k, v, d_out)
    second = ladder_gradients("cute/tiled", prob, q, k, v, d_out)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
