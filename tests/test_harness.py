"""The harness itself: problem arithmetic, reference, metrics, registry, validation, runner."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from common.contract.inputs import make_inputs
from common.contract.metrics import FP8_RULE, SDPA_RELATIVE_RULE, EmulationStats, ErrorStats, error_stats
from common.contract.problem import Problem, visible_keys
from common.contract.reference import reference_attention
from common.contract.registry import Implementation, discover, get
from common.contract.validation import is_kernel_addressable, kernel_operand, validate_attention_inputs
from common.measure.peaks import Peaks
from common.measure.runner import TimingOptions, Workload, measure


def _brute_visible(seqlen_q: int, seqlen_k: int) -> int:
    return int(torch.ones(seqlen_q, seqlen_k).tril().sum().item())


# ---------------------------------------------------------------- problem
@pytest.mark.parametrize(("seqlen_q", "seqlen_k"), [(1, 1), (7, 7), (5, 9), (9, 5), (128, 77)])
def test_causal_visible_keys_match_a_brute_force_count(seqlen_q: int, seqlen_k: int):
    assert visible_keys(seqlen_q, seqlen_k, causal=True) == _brute_visible(seqlen_q, seqlen_k)
    assert visible_keys(seqlen_q, seqlen_k, causal=False) == seqlen_q * seqlen_k


def test_flops_and_bytes_of_the_canonical_problem():
    problem = Problem.canonical(8192)
    assert (problem.batch, problem.heads, problem.head_dim) == (2, 16, 128)
    assert problem.flops == 4 * 2 * 16 * 8192 * 8192 * 128
    assert problem.min_bytes == 2 * 2 * 16 * 128 * (4 * 8192)
    causal = problem.with_(causal=True)
    assert causal.flops == 4 * 128 * 2 * 16 * (8192 * 8193 // 2)
    assert Problem.canonical(16384).batch == 1
    assert Problem.canonical(8192, head_dim=64).heads == 32
    assert Problem.canonical(4096).score_buffer_bytes == 4 * 4 * 16 * 4096 * 4096


@pytest.mark.parametrize("field", ["batch", "heads", "seqlen_q", "seqlen_k", "head_dim"])
def test_problem_rejects_non_positive_sizes(field: str):
    sizes = dict(batch=1, heads=1, seqlen_q=1, seqlen_k=1, head_dim=64)
    sizes[field] = 0
    with pytest.raises(ValueError, match=field):
        Problem(**sizes)


@pytest.mark.parametrize(
    "change", [{}, {"kv_heads": 2}, {"causal": True, "causal_alignment": "bottom_right"},
               {"has_cache_seqlens": True, "return_lse": True, "softmax_scale": 0.3}],
)  # fmt: skip
@pytest.mark.parametrize("seqlen_k", [1, 4, 77, 8193])
def test_with_seqlen_k_is_with_and_checks_the_new_length(change: dict, seqlen_k: int):
    """The growing cache's fast copy (``Problem.with_seqlen_k``) gives ``with_``'s problem, equal and of
    equal hash (a plan key's), ``bottom_right`` taken at the new Sk, and refuses what ``with_`` refuses."""
    problem = Problem(batch=2, heads=4, seqlen_q=4, seqlen_k=16, head_dim=64, **change)
    longer, expected = problem.with_seqlen_k(seqlen_k), problem.with_(seqlen_k=seqlen_k)
    assert longer == expected and hash(longer) == hash(expected) and vars(longer) == vars(expected)
    assert longer.bottom_right == expected.bottom_right and problem.seqlen_k == 16
    for bad in (0, -3, True, 9.0):
        with pytest.raises(ValueError, match="seqlen_k must be a positive int"):
            problem.with_seqlen_k(bad)
    paged = Problem(1, 4, 1, 64, 64, has_cache_seqlens=True, page_size=16)
    assert paged.with_seqlen_k(96) == paged.with_(seqlen_k=96)
    with pytest.raises(ValueError, match="whole pages"):
        paged.with_seqlen_k(97)


def test_default_scale_is_inverse_sqrt_head_dim():
    assert Problem(1, 1, 4, 4, 64).scale == pytest.approx(0.125)
    assert Problem(1, 1, 4, 4, 64, softmax_scale=0.3).scale == pytest.approx(0.3)


# ---------------------------------------------------------------- reference
def _formula(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    scores = scale * torch.einsum("bhqd,bhkd->bhqk", q.double(), k.double())
    if causal:
        keep = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, -math.inf)
    weights = scores.exp() / scores.exp().sum(-1, keepdim=True)
    return weights @ v.double()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("seqlen_q", "seqlen_k"), [(1, 1), (5, 5), (3, 8), (8, 3)])
def test_reference_matches_the_textbook_formula_and_sdpa(seqlen_q: int, seqlen_k: int, causal: bool):
    problem = Problem(2, 3, seqlen_q, seqlen_k, 16, dtype=torch.float32, causal=causal)
    q, k, v = make_inputs(problem, seed=3, device="cpu", offset=0.5)
    out, lse = reference_attention(q, k, v, problem, with_lse=True)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, _formula(q, k, v, problem.scale, causal), rtol=1e-12, atol=1e-12)
    sdpa64 = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    torch.testing.assert_close(out, sdpa64, rtol=1e-10, atol=1e-10)
    assert lse.shape == (2, 3, seqlen_q)


def test_reference_chunks_query_rows(monkeypatch: pytest.MonkeyPatch):
    problem = Problem(1, 2, 37, 29, 8, dtype=torch.float32, causal=True)
    q, k, v = make_inputs(problem, seed=4, device="cpu")
    whole = reference_attention(q, k, v, problem)
    monkeypatch.setattr("common.contract.reference.QUERY_CHUNK", 5)
    torch.testing.assert_close(reference_attention(q, k, v, problem), whole, rtol=0, atol=1e-14)


def test_inputs_are_seeded_and_offset():
    problem = Problem(1, 2, 16, 16, 8, dtype=torch.float32)
    first = make_inputs(problem, seed=1, device="cpu")
    again = make_inputs(problem, seed=1, device="cpu")
    other = make_inputs(problem, seed=2, device="cpu")
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(first[0], other[0])
    shifted = make_inputs(problem, seed=1, device="cpu", offset=3.0)
    torch.testing.assert_close(shifted[2] - 3.0, first[2], rtol=0, atol=1e-6)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_inputs_drawn_on_the_device_are_seeded_standard_normal(device: str):
    """compare.py --decode draws its caches on the GPU: still one seed, one set of numbers, standard normal."""
    problem = Problem(2, 4, 1, 4096, 64, dtype=torch.bfloat16, kv_heads=2)
    first = make_inputs(problem, seed=1, device=device, offset=0.5, on_device=True)
    again = make_inputs(problem, seed=1, device=device, offset=0.5, on_device=True)
    other = make_inputs(problem, seed=2, device=device, offset=0.5, on_device=True)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert all(t.device.type == device and t.dtype == torch.bfloat16 for t in first)
    assert not torch.equal(first[1], other[1])
    k, v = first[1].double(), first[2].double()
    assert abs(k.mean().item()) < 0.01 and abs(k.std().item() - 1) < 0.01
    assert abs(v.mean().item() - 0.5) < 0.01


# ---------------------------------------------------------------- metrics and rules
def test_error_stats_of_identical_and_perturbed_outputs():
    ref = torch.randn(2, 2, 8, 4, dtype=torch.float64)
    assert error_stats(ref.float(), ref).max_abs_err < 1e-6
    bumped = ref.clone()
    bumped[0, 0, 0, 0] += 0.5
    stats = error_stats(bumped, ref)
    assert stats.max_abs_err == pytest.approx(0.5)
    assert stats.rel_l2_err == pytest.approx(0.5 / ref.norm().item())


def test_nan_is_counted_and_never_passes():
    ref = torch.randn(1, 1, 4, 4, dtype=torch.float64)
    broken = ref.clone()
    broken[0, 0, 1, 1] = math.nan
    stats = error_stats(broken, ref)
    assert stats.nonfinite == 1
    ok, reason = SDPA_RELATIVE_RULE.judge(stats, ErrorStats(1.0, 1.0, 1.0, 0))
    assert not ok and "non-finite" in reason
    assert not FP8_RULE.judge(stats, None)[0]


def test_sdpa_relative_rule_boundaries():
    sdpa = ErrorStats(max_abs_err=1e-3, rmse=1e-4, rel_l2_err=2e-3, nonfinite=0)
    assert SDPA_RELATIVE_RULE.judge(ErrorStats(2e-3, 1e-4, 4e-3, 0), sdpa)[0]
    ok, reason = SDPA_RELATIVE_RULE.judge(ErrorStats(5e-3, 1e-4, 4e-3, 0), sdpa)
    assert not ok and "max_abs" in reason
    ok, reason = SDPA_RELATIVE_RULE.judge(ErrorStats(1e-3, 1e-4, 9e-3, 0), sdpa)
    assert not ok and "rel_l2" in reason


def test_fp8_rule_boundaries_against_the_emulation():
    """Planted bugs through the whole emulation: tests/test_error_rules.py. Here the two limits."""
    emulation = EmulationStats(ErrorStats(0.1, 0.01, 0.05, 0), max_abs_diff=1e-3, max_bound_ratio=0.5)
    limit = (1 + FP8_RULE.emulation_margin) * 0.05 + FP8_RULE.atol
    assert FP8_RULE.judge(ErrorStats(0.1, 0.01, limit * 0.999, 0), None, emulation)[0]
    ok, reason = FP8_RULE.judge(ErrorStats(0.1, 0.01, limit * 1.001, 0), None, emulation)
    assert not ok and "emulation" in reason
    outside = EmulationStats(emulation.error, max_abs_diff=1e-3, max_bound_ratio=1.01)
    ok, reason = FP8_RULE.judge(ErrorStats(0.1, 0.01, 0.05, 0), None, outside)
    assert not ok and "bound" in reason


# ---------------------------------------------------------------- validation
def _qkv(shape_q=(1, 2, 8, 64), shape_kv=(1, 2, 8, 64), dtype=torch.float16):
    return torch.zeros(shape_q, dtype=dtype), torch.zeros(shape_kv, dtype=dtype), torch.zeros(shape_kv, dtype=dtype)


CPU_OK = dict(device_types=("cpu",))


@pytest.mark.parametrize(
    ("mutate", "error", "words"),
    [
        (lambda q, k, v: (q[0], k, v), ValueError, "rank 4"),
        (lambda q, k, v: (q, k[:, :, :4], v), ValueError, "same shape"),
        (lambda q, k, v: (q, k[:1, :1], v[:1, :1]), ValueError, "(batch, heads)"),
        (lambda q, k, v: (q[..., :32], k, v), ValueError, "head_dim"),
        (lambda q, k, v: (q.float(), k, v), TypeError, "one dtype"),
        (lambda q, k, v: (q.double(), k.double(), v.double()), TypeError, "dtype must be one of"),
        (lambda q, k, v: (q[:, :, :0], k, v), ValueError, "empty"),
        (lambda q, k, v: (q.numpy(), k, v), TypeError, "torch.Tensor"),
    ],
)
def test_validation_names_expected_and_given(mutate, error, words):
    q, k, v = mutate(*_qkv())
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        validate_attention_inputs(q, k, v, **CPU_OK)


def test_validation_of_scale_causal_device_and_head_dim():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="finite"):
        validate_attention_inputs(q, k, v, softmax_scale=math.inf, **CPU_OK)
    with pytest.raises(TypeError, match="softmax_scale"):
        validate_attention_inputs(q, k, v, softmax_scale="0.1", **CPU_OK)
    with pytest.raises(TypeError, match="causal"):
        validate_attention_inputs(q, k, v, causal=1, **CPU_OK)
    with pytest.raises(ValueError, match="cuda device, got cpu"):
        validate_attention_inputs(q, k, v)
    with pytest.raises(ValueError, match=r"head_dim must be one of \[128\], got 64"):
        validate_attention_inputs(q, k, v, head_dims=(128,), **CPU_OK)
    problem = validate_attention_inputs(q, k[:, :, :5], v[:, :, :5], causal=True, softmax_scale=0.5, **CPU_OK)
    assert (problem.seqlen_q, problem.seqlen_k, problem.causal, problem.scale) == (8, 5, True, 0.5)


def test_strided_views_are_copied_only_when_a_kernel_cannot_address_them():
    bshd = torch.randn(2, 16, 4, 64, dtype=torch.float16)
    view = bshd.transpose(1, 2)  # (B, H, S, D) view with a head stride of 64 elements
    assert is_kernel_addressable(view) and kernel_operand(view) is view
    inner_strided = torch.randn(2, 4, 16, 64, dtype=torch.float16).transpose(2, 3)
    assert not is_kernel_addressable(inner_strided)
    copied = kernel_operand(inner_strided)
    assert copied.is_contiguous() and torch.equal(copied, inner_strided)


# ---------------------------------------------------------------- registry
def test_registry_names_are_unique_and_well_formed():
    available, missing = discover()
    names = [impl.name for impl in available] + [item.name for item in missing]
    assert len(names) == len(set(names))
    assert {"sdpa/flash", "sdpa/cudnn", "sdpa/efficient", "sdpa/math"} <= set(names)
    for impl in available:
        assert impl.name == f"{impl.stack}/{impl.rung}"


@pytest.mark.parametrize("name", ["fa4/sm90", "flashinfer/decode"])
def test_imported_baselines_are_registered_gpu_only(name: str):
    """FA4 and FlashInfer are listed (available, whether or not installed) with a bind and no CPU path."""
    available, _ = discover()
    (row,) = [impl for impl in available if impl.name == name]
    assert row.stack == name.split("/")[0] and row.bind is not None and not row.runs_on_cpu


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"valid names: .*sdpa/math"):
        get("triton/warp-drive")


def test_implementation_rejects_unknown_stack_and_rung():
    with pytest.raises(ValueError, match="stack"):
        Implementation("x/naive", "jax", "naive", prepare=None, supports=None)
    with pytest.raises(ValueError, match="rung"):
        Implementation("triton/x", "triton", "x", prepare=None, supports=None)


# ---------------------------------------------------------------- runner resilience
def _fake(name: str, run_factory) -> Implementation:
    return Implementation(
        name=f"triton/{name}",
        stack="triton",
        rung="naive",
        runs_on_cpu=True,
        prepare=lambda q, k, v, problem: run_factory(q, k, v, problem),
        supports=lambda problem, device: (True, ""),
    )


def _workload() -> Workload:
    problem = Problem(1, 2, 16, 16, 8, dtype=torch.float32)
    q, k, v = make_inputs(problem, device="cpu", seed=5)
    ref = reference_attention(q, k, v, problem)
    return Workload(problem, q, k, v, ref, error_stats(F.scaled_dot_product_attention(q, k, v), ref))


def _good(q, k, v, problem):
    out = torch.empty_like(q)
    return lambda: out.copy_(F.scaled_dot_product_attention(q, k, v))


def _raises(q, k, v, problem):
    raise RuntimeError("kernel exploded")


def _nan(q, k, v, problem):
    return lambda: torch.full_like(q, math.nan)


def _wrong(q, k, v, problem):
    return lambda: torch.zeros_like(q)


def _skips_writes(q, k, v, problem):
    """Writes O once, then never again: the poisoned second call must expose it."""
    out = torch.empty_like(q)
    calls = []

    def run():
        if not calls:
            out.copy_(F.scaled_dot_product_attention(q, k, v))
        calls.append(1)
        return out

    return run


@pytest.mark.parametrize(
    ("factory", "status", "words"),
    [
        (_good, "ok", ""),
        (_raises, "failed", "kernel exploded"),
        (_nan, "wrong", "non-finite"),
        (_wrong, "wrong", "max_abs"),
        (_skips_writes, "wrong", "non-finite"),
    ],
)
def test_runner_turns_every_outcome_into_a_status(factory, status, words):
    options = TimingOptions(warmup_ms=1, rep_ms=1)
    row = measure(_fake(factory.__name__, factory), _workload(), torch.device("cpu"), options, Peaks(None, None, None))
    assert row.status == status, row.reason
    assert words in row.reason


def test_runner_records_an_emulation_rules_yardstick_and_the_variant():
    """An FP8-style row keeps the emulation's error (its pass limit) and the quantisation it ran."""
    from common.contract.fp8 import Emulation

    def prepare(q, k, v, problem):
        run = _good(q, k, v, problem)
        run.variant = "block+rotation"
        return run

    def emulate(q, k, v, problem):
        exact = reference_attention(q, k, v, problem)
        return Emulation(exact * 1.01, torch.full_like(exact, 0.1))

    impl = Implementation(
        name="triton/fp8",
        stack="triton",
        rung="fp8",
        runs_on_cpu=True,
        prepare=prepare,
        supports=lambda problem, device: (True, ""),
        error_rule=FP8_RULE,
        emulate=emulate,
    )
    options = TimingOptions(warmup_ms=1, rep_ms=1)
    row = measure(impl, _workload(), torch.device("cpu"), options, Peaks(None, None, None))
    assert row.status == "ok", row.reason
    assert row.variant == "block+rotation"
    assert 9e-3 < row.emulation_rel_l2_err < 1.1e-2


# ---------------------------------------------------------------- isolation (compare.py --isolate)
@pytest.mark.slow
def test_isolated_hang_becomes_a_timeout_row():
    from common.measure.isolation import measure_isolated
    from tests.fakes import HANGS

    problem = Problem(1, 1, 8, 8, 8, dtype=torch.float32)
    options = TimingOptions(warmup_ms=1, rep_ms=1)
    # 8 s: the child is ended by the deadline whether it hangs in the fake's prepare or is still importing (CI time).
    row = measure_isolated("tests.fakes:HANGS", HANGS, problem, "cpu", options, Peaks(None, None, None), 8)
    assert row.status == "timeout" and "8 s" in row.reason


@pytest.mark.slow
def test_isolated_crash_becomes_a_failed_row():
    from common.measure.isolation import measure_isolated
    from tests.fakes import CRASH_EXIT_CODE, CRASHES

    problem = Problem(1, 1, 8, 8, 8, dtype=torch.float32)
    options = TimingOptions(warmup_ms=1, rep_ms=1)
    row = measure_isolated("tests.fakes:CRASHES", CRASHES, problem, "cpu", options, Peaks(None, None, None), 120)
    assert row.status == "failed" and f"exited with {CRASH_EXIT_CODE}" in row.reason


@pytest.mark.slow
def test_isolated_good_implementation_round_trips_its_row():
    from common.measure.isolation import measure_isolated

    problem = Problem(1, 2, 16, 16, 8, dtype=torch.float32)
    options = TimingOptions(warmup_ms=1, rep_ms=1)
    row = measure_isolated("sdpa/math", get("sdpa/math"), problem, "cpu", options, Peaks(None, None, None), 120)
    assert row.status == "ok", row.reason
    assert row.rel_l2_err < 1e-5
