"""cute/fp8's block scales read with 32-bit strides (``fp8.SCALE_INDEX_32BIT``, issue #37; on by default for the causal
mask only since 2026-12-06, results/h100/fp8-scale-index-2026-12-06/).

Nsight Compute of the causal D=64 kernel (results/h100/cute-decode-two-wg-left-2026-12-06/ncu/) found its key-block
step 29 instructions longer than the non-causal one's: ptxas recomputes K's and V's block-scale addresses from the
64-bit batch and head strides every block. With 32-bit strides for the (B, H, blocks) scale tensors the step shrinks.

CPU: on by default, reaching the configuration of causal problems only (``SCALE_INDEX_32BIT_CAUSAL_ONLY``);
``fake_tensor`` refuses a stride width it does not make. Static (sm_90a): causal D=64 and D=128, the key loop at least
15 instructions shorter with no more registers, spills or stack, non-causal no longer; the every-feature causal build
(GQA, cache lengths, the LSE, bottom-right) no more spilled; planted, scale tensors left at 64-bit strides whatever the
knob fail the rule. GPU (``gpu``; bench/fp8_scale_index_ab.sh): O and the LSE bit for bit the knob-off kernel's (the
same arithmetic, other addresses) on ragged GQA shapes with cache lengths, causal and not (the restriction lifted), D=64
and 128; planted, a V scale read one block off fails that equality.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("cutlass")

from common.contract.check import run_poisoned
from common.contract.fp8 import fa3_inputs
from common.contract.problem import Problem
from common.reporting.static import cubin_resources, cubin_sass, loop_census
from cute_impl import _hopper_device, _hopper_host, _host, fp8, hopper
from tests._helpers import edge_cache_seqlens

FEATURES = {"kv_heads": 2, "causal_alignment": "bottom_right", "has_cache_seqlens": True, "return_lse": True}


def test_on_by_default_for_causal_problems_only(monkeypatch: pytest.MonkeyPatch):
    causal = Problem(2, 16, 8192, 8192, 128, dtype=torch.bfloat16, causal=True)
    full = causal.with_(causal=False)
    assert fp8.SCALE_INDEX_32BIT is True and fp8.SCALE_INDEX_32BIT_CAUSAL_ONLY is True
    assert fp8.fp8_config(causal, fp8.DEFAULT_QUANTISATION).scale_index_32
    assert not fp8.fp8_config(full, fp8.DEFAULT_QUANTISATION).scale_index_32
    monkeypatch.setattr(fp8, "SCALE_INDEX_32BIT_CAUSAL_ONLY", False)
    assert fp8.fp8_config(full, fp8.DEFAULT_QUANTISATION).scale_index_32
    monkeypatch.setattr(fp8, "SCALE_INDEX_32BIT", False)
    assert not fp8.fp8_config(causal, fp8.DEFAULT_QUANTISATION).scale_index_32


def test_fake_tensor_refuses_another_stride_width():
    with pytest.raises(ValueError, match="32 or 64 bits, got 16"):
        _host.fake_tensor(torch.float32, 3, 16)


def key_step_build(problem: Problem, **knobs: bool) -> tuple[int, int, int]:
    """(key-step instructions, registers, spilled and stack bytes) of cute/fp8's kernel for ``problem`` with ``knobs``
    replacing fields of its configuration (shared with ``tests/test_cute_fp8_fold_v_scale.py``)."""
    (binary, *_) = fp8.compile_sm90(problem, **knobs)
    usage = next(iter(cubin_resources(binary.cubin).values()))
    spilled = usage["local_bytes"] + usage["stack_bytes"]
    return loop_census(cubin_sass(binary.cubin)).instructions, usage["registers"], spilled


def _build(problem: Problem, on: bool) -> tuple[int, int, int]:
    return key_step_build(problem, scale_index_32=on)


def assert_shorter_causal_step(head_dim: int, batch: int, heads: int) -> None:
    causal = Problem(batch, heads, 8192, 8192, head_dim, dtype=torch.bfloat16, causal=True)
    (off, off_registers, off_spills), (on, on_registers, on_spills) = _build(causal, False), _build(causal, True)
    where = f"D={head_dim} causal key loop: {off} -> {on} instructions, {off_registers} -> {on_registers} registers"
    assert on <= off - 15 and on_registers <= off_registers and on_spills <= off_spills, where
    plain = causal.with_(causal=False)
    assert _build(plain, True)[0] <= _build(plain, False)[0]


@pytest.mark.cute_compile
@pytest.mark.parametrize(("head_dim", "batch", "heads"), [(64, 4, 32), (128, 2, 16)], ids=["d64", "d128"])
def test_on_shortens_the_causal_key_step(head_dim: int, batch: int, heads: int):
    assert_shorter_causal_step(head_dim, batch, heads)


@pytest.mark.cute_compile
@pytest.mark.parametrize("head_dim", [64, 128])
def test_on_spills_no_more_with_every_feature(head_dim: int):
    problem = Problem(2, 8, 1000, 777, head_dim, dtype=torch.bfloat16, causal=True, **FEATURES)
    assert _build(problem, True)[2] <= _build(problem, False)[2]


@pytest.mark.cute_compile
def test_planted_64_bit_scale_strides_fail_the_rule(monkeypatch: pytest.MonkeyPatch):
    real = _hopper_host.fake_tensor
    monkeypatch.setattr(_hopper_host, "fake_tensor", lambda element, rank, bits=64: real(element, rank))
    with pytest.raises(AssertionError):
        assert_shorter_causal_step(64, 4, 32)


def _outputs(problem: Problem, inputs: tuple, cache_seqlens: torch.Tensor, on: bool, planted=None) -> tuple:
    """O and the LSE of cute/fp8 with the knob at ``on`` (its kernel built, with ``planted`` as
    ``BlockScales.value``, and run), on poisoned outputs."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fp8, "SCALE_INDEX_32BIT", on)
        patch.setattr(fp8, "SCALE_INDEX_32BIT_CAUSAL_ONLY", False)
        if planted is not None:
            patch.setattr(_hopper_device.BlockScales, "value", planted)
        return tuple(t.clone() for t in run_poisoned(fp8.prepare(*inputs, problem, cache_seqlens=cache_seqlens)))


def assert_same_outputs(head_dim: int, causal: bool, planted=None) -> None:
    problem = Problem(2, 8, 1000, 777, head_dim, dtype=torch.bfloat16, causal=causal, **FEATURES)
    inputs = fa3_inputs(problem, seed=3, device="cuda")
    cache_seqlens = edge_cache_seqlens(problem.batch, problem.seqlen_k, "cuda")
    off = _outputs(problem, inputs, cache_seqlens, False)
    on = _outputs(problem, inputs, cache_seqlens, True, planted)
    assert all(torch.equal(a, b) for a, b in zip(off, on, strict=True)), problem.describe()


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_on_is_the_off_kernel_bit_for_bit(head_dim: int, causal: bool):
    assert_same_outputs(head_dim, causal)


@pytest.mark.gpu
def test_gpu_planted_value_scale_one_block_off_fails(monkeypatch: pytest.MonkeyPatch):
    """The knob-on kernel built with V's scale read one block off (the knob-off one as it is)."""
    assert_same_outputs(64, True)
    monkeypatch.setattr(hopper.KERNELS, "compiled", {})  # the planted build must not be the cached one
    real = _hopper_device.BlockScales.value
    with pytest.raises(AssertionError):
        assert_same_outputs(64, True, lambda self, n_block: real(self, n_block + 1))
