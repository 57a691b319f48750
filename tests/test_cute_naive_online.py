"""cute/naive and cute/online beyond the shared tests: other head dims, strided inputs, refusals."""

from __future__ import annotations

import pytest
import torch

from common.contract.check import check_on_inputs, run_poisoned
from common.contract.inputs import make_inputs
from common.contract.metrics import error_stats
from common.contract.problem import Problem, dtype_name
from common.contract.reference import reference_attention, sdpa
from common.reporting.static import cubin_resources, ptx_features

# Skip only when the CuTe DSL itself is absent: a rung module that fails to import fails the tests.
pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl")

from cute_impl import naive as cute_naive
from cute_impl import online as cute_online
from tests._helpers import check_features, edge_cache_seqlens, feature_grid, feature_problem

RUNGS = {"cute/naive": cute_naive, "cute/online": cute_online}
# Configurations the shared static test (canonical: D=128, bf16, non-causal) does not compile.
EXTRA_COMPILES = [
    ("cute/naive", 32, torch.float16, False),
    ("cute/naive", 256, torch.bfloat16, True),
    ("cute/online", 64, torch.float16, False),
    ("cute/online", 64, torch.bfloat16, True),
    ("cute/online", 128, torch.bfloat16, True),
]


@pytest.mark.cute_compile
@pytest.mark.parametrize(
    ("impl_name", "head_dim", "dtype", "causal"),
    EXTRA_COMPILES,
    ids=[f"{name}-d{d}-{dtype_name(t)}-{'causal' if c else 'full'}" for name, d, t, c in EXTRA_COMPILES],
)
def test_compiles_for_sm90_without_mma_or_spills(impl_name: str, head_dim: int, dtype: torch.dtype, causal: bool):
    problem = Problem(1, 2, 300, 300, head_dim, dtype=dtype, causal=causal)
    for binary in RUNGS[impl_name].compile_sm90(problem):
        features = ptx_features(binary.ptx)
        assert not features["mma.sync"] and not features["wgmma.mma_async"], f"{impl_name} uses tensor cores"
        for kernel, usage in cubin_resources(binary.cubin).items():
            assert usage["local_bytes"] == 0, f"{impl_name} {kernel} spills {usage['local_bytes']} bytes"


# Every problem feature at once: GQA, bottom-right causal, per-sequence lengths, the LSE (and MQA
# with lengths and no mask): the code each feature adds compiles without spills.
EVERY_FEATURE = dict(causal=True, kv_heads=2, causal_alignment="bottom_right", has_cache_seqlens=True, return_lse=True)
MQA_LENGTHS_LSE = dict(causal=False, kv_heads=1, has_cache_seqlens=True, return_lse=True)
FEATURE_COMPILES = [
    ("cute/naive", 128, EVERY_FEATURE),
    ("cute/naive", 256, MQA_LENGTHS_LSE),
    ("cute/online", 64, EVERY_FEATURE),
    ("cute/online", 128, EVERY_FEATURE),
    ("cute/online", 128, MQA_LENGTHS_LSE),
]


@pytest.mark.cute_compile
@pytest.mark.parametrize(
    ("impl_name", "head_dim", "features"),
    FEATURE_COMPILES,
    ids=[f"{name}-d{d}-{'causal' if f['causal'] else 'full'}" for name, d, f in FEATURE_COMPILES],
)
def test_every_feature_compiles_for_sm90_without_mma_or_spills(impl_name: str, head_dim: int, features: dict):
    problem = Problem(2, 4, 300, 500, head_dim, dtype=torch.bfloat16, **features)
    for binary in RUNGS[impl_name].compile_sm90(problem):
        ptx = ptx_features(binary.ptx)
        assert not ptx["mma.sync"] and not ptx["wgmma.mma_async"], f"{impl_name} uses tensor cores"
        for kernel, usage in cubin_resources(binary.cubin).items():
            assert usage["local_bytes"] == 0, f"{impl_name} {kernel} spills {usage['local_bytes']} bytes"


@pytest.mark.parametrize("impl_name", list(RUNGS))
def test_cache_seqlens_come_exactly_with_a_problem_that_has_them(impl_name: str):
    """Refused before anything is validated or compiled, naming cache_seqlens: never silently run
    without the lengths, nor with lengths the problem does not declare."""
    q = torch.zeros(1, 2, 64, 64, dtype=torch.bfloat16)
    problem = Problem(1, 2, 64, 64, 64, causal=True, causal_alignment="bottom_right", has_cache_seqlens=True)
    with pytest.raises(ValueError, match="cache_seqlens"):
        RUNGS[impl_name].prepare(q, q, q, problem)
    with pytest.raises(ValueError, match="cache_seqlens"):
        RUNGS[impl_name].prepare(q, q, q, problem.with_(has_cache_seqlens=False), cache_seqlens=torch.full((1,), 64))


def test_score_buffer_check_states_the_bytes_needed():
    problem = Problem(2, 16, 8192, 8192, 128)
    ok, reason = cute_naive.score_buffer_fits(problem, free_bytes=problem.score_buffer_bytes - 1)
    assert not ok
    assert f"{problem.score_buffer_bytes:,} bytes" in reason
    assert cute_naive.score_buffer_fits(problem, free_bytes=problem.score_buffer_bytes) == (True, "")


@pytest.mark.parametrize("impl_name", list(RUNGS))
def test_refuses_cpu(impl_name: str):
    ok, reason = RUNGS[impl_name].supports(Problem(1, 1, 8, 8, 64), torch.device("cpu"))
    assert not ok and "CUDA" in reason


@pytest.mark.parametrize("impl_name", list(RUNGS))
def test_rejects_unsupported_dtype_naming_expected_and_given(impl_name: str):
    q = torch.zeros(1, 1, 8, 64, dtype=torch.float32)
    with pytest.raises(TypeError, match=r"bf16, fp16.*got fp32"):
        RUNGS[impl_name].prepare(q, q, q, Problem(1, 1, 8, 8, 64, dtype=torch.float32))


# ---- on the GPU ----


def _check(impl_name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem) -> None:
    """Run poisoned, compare with the fp64 reference, judged like the shared tests (vs SDPA)."""
    impl = RUNGS[impl_name].IMPLEMENTATION
    ok, reason = impl.check(problem, q.device)
    assert ok, reason
    ref = reference_attention(q, k, v, problem)
    err = error_stats(run_poisoned(impl.prepare(q, k, v, problem)), ref)
    sdpa_err = error_stats(sdpa(q, k, v, problem), ref)
    passed, why = impl.error_rule.judge(err, sdpa_err)
    assert passed, f"{impl_name} {problem.describe()}: {why}; {err.summary()} | sdpa {sdpa_err.summary()}"


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [32, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_naive_other_head_dims(head_dim: int, causal: bool):
    problem = Problem(2, 3, 77, 200, head_dim, dtype=torch.bfloat16, causal=causal)
    _check("cute/naive", *make_inputs(problem, seed=head_dim, offset=0.5), problem)


@pytest.mark.gpu
@pytest.mark.parametrize("impl_name", list(RUNGS))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_strided_inputs_and_custom_scale(impl_name: str, causal: bool):
    """(B, S, H, D) storage seen through transpose(1, 2): strides the kernel must honour."""
    problem = Problem(2, 3, 130, 77, 64, dtype=torch.float16, causal=causal, softmax_scale=0.3)
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in make_inputs(problem, seed=5, offset=0.5))
    assert not q.is_contiguous()
    _check(impl_name, q, k, v, problem)


@pytest.mark.gpu
def test_online_refuses_head_dim_256_with_reason():
    ok, reason = cute_online.supports(Problem(1, 1, 64, 64, 256), torch.device("cuda"))
    assert not ok and "head_dim" in reason and "256" in reason


@pytest.mark.gpu
@pytest.mark.parametrize("impl_name", list(RUNGS))
def test_prepare_rejects_unsupported_head_dim(impl_name: str):
    q = torch.zeros(1, 1, 8, 48, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match=r"head_dim must be one of .* got 48"):
        RUNGS[impl_name].prepare(q, q, q, Problem(1, 1, 8, 8, 48))


@pytest.mark.gpu
def test_naive_refuses_score_buffer_larger_than_free_memory():
    problem = Problem(64, 64, 65536, 65536, 64)
    ok, reason = cute_naive.supports(problem, torch.device("cuda"))
    assert not ok and f"{problem.score_buffer_bytes:,} bytes" in reason


# ---- problem features on the GPU: GQA, both alignments, per-sequence lengths, the LSE ----
@feature_grid(seqlens=((77, 1000), (1000, 77)))
@pytest.mark.parametrize("impl_name", list(RUNGS))
def test_gqa_alignments_cache_seqlens_and_lse(
    impl_name: str, head_dim: int, kv_heads: int, seqlens: tuple[int, int], mask: str, cache_lengths: bool
):
    """8 query heads over 1 or 4 KV heads (each KV head its own values), both causal alignments with
    Sq != Sk (bottom-right with Sq > Sk leaves rows that see no key: O = 0, LSE = -inf), key lengths
    Sk, 0 and ragged; O against the fp64 reference by the rung's rule and the LSE by the contract's
    LSE rule, on poisoned outputs."""
    problem = feature_problem(seqlens, head_dim, kv_heads, mask, cache_lengths)
    check_features(RUNGS[impl_name].IMPLEMENTATION, problem, seed=19)


@pytest.mark.gpu
@pytest.mark.parametrize("impl_name", list(RUNGS))
def test_empty_sequence_and_rows_before_the_diagonal_see_no_key(impl_name: str):
    """A cache length of 0 and bottom-right rows i < Sq - Sk: O exactly 0 and LSE -inf, no NaN; an
    fp16 GQA problem over (B, S, Hkv, D) storage, so K and V are read through their strides."""
    problem = Problem(
        3, 4, 200, 130, 64, dtype=torch.float16, causal=True, kv_heads=2, causal_alignment="bottom_right",
        has_cache_seqlens=True, return_lse=True,
    )  # fmt: skip
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in make_inputs(problem, seed=23, offset=0.5))
    cache_seqlens = edge_cache_seqlens(problem.batch, problem.seqlen_k, "cuda")
    out, lse = run_poisoned(RUNGS[impl_name].prepare(q, k, v, problem, cache_seqlens=cache_seqlens))
    assert torch.all(out[1] == 0) and torch.all(lse[1] == -torch.inf)
    for b, length in enumerate(cache_seqlens.tolist()):
        blind_rows = max(problem.seqlen_q - length, 0)  # row i sees keys j <= i + length - Sq
        assert torch.all(out[b, :, :blind_rows] == 0) and torch.all(lse[b, :, :blind_rows] == -torch.inf)
        assert torch.isfinite(lse[b, :, blind_rows:]).all() and torch.isfinite(out[b]).all()
    result = check_on_inputs(RUNGS[impl_name].IMPLEMENTATION, q, k, v, problem, cache_seqlens=cache_seqlens)
    assert result.ok, f"{impl_name} {problem.describe()}: {result.summary()}"
