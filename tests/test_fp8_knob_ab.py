"""``bench.fp8_knob.Fp8KnobAB``'s output check before any timing: bit for bit by default, or within ``max_rel_l2`` for a
knob that reorders fp32 arithmetic (``bench.fp8_fold_v``); NaN is never the same. CPU only."""

from __future__ import annotations

import torch

from bench.fp8_knob import Fp8KnobAB


def _ab(max_rel_l2: float = 0.0) -> Fp8KnobAB:
    return Fp8KnobAB("KNOB", {"off": False, "on": True}, "a knob", "knob", max_rel_l2=max_rel_l2)


def test_bit_for_bit_by_default():
    out = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    assert _ab().same(out, out.clone())
    assert not _ab().same(out * (1 + 1e-6), out)


def test_a_tolerance_takes_rounding_and_refuses_a_wrong_output_and_nan():
    out = torch.randn(4, 64, generator=torch.Generator().manual_seed(1))
    ab = _ab(2e-3)
    assert ab.same(out * (1 + 1e-4), out)
    assert not ab.same(out * 1.01, out)  # a planted wrong scale
    poisoned = out.clone()
    poisoned[0, 0] = float("nan")
    assert not ab.same(poisoned, out)
