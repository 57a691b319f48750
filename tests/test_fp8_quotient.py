"""cute/fp8's Q quotient with one Markstein correction (``cute_impl.fp8.Q_QUOTIENT_CORRECTIONS`` = 1): the numpy
emulation of ``common/tools/fp8_quotient.py`` checked against exact rationals, the proof's enumeration (every scale
significand: slow; a sample: fast) and planted divisions that the same check must fail."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from common.tools import fp8_quotient as tool

# The fast sample: scale significands at random over [1, 2) and the top 64 (d near 2: case 1's thinnest margin).
SAMPLE_SCALES = np.unique(
    np.concatenate([np.random.default_rng(1).integers(tool.ONE, tool.TWO, 4096), np.arange(tool.TWO - 64, tool.TWO)])
)


def _round_to_float32(value: Fraction) -> np.float32:
    """``value`` rounded to nearest fp32, ties to even, by integer arithmetic (normal range)."""
    if value == 0:
        return np.float32(0.0)
    sign, magnitude = (-1 if value < 0 else 1), abs(value)
    exponent = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    if Fraction(2) ** exponent > magnitude:
        exponent -= 1
    scaled = magnitude / Fraction(2) ** (exponent - tool.FRACTION_BITS)  # in [2^23, 2^24)
    whole, rest = divmod(scaled.numerator, scaled.denominator)
    if 2 * rest > scaled.denominator or (2 * rest == scaled.denominator and whole % 2):
        whole += 1
    return np.float32(sign * whole * 2.0 ** (exponent - tool.FRACTION_BITS))


def _exact_fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    triples = zip(a.tolist(), b.tolist(), c.tolist(), strict=True)
    return np.array([_round_to_float32(Fraction(x) * Fraction(y) + Fraction(z)) for x, y, z in triples], np.float32)


def _f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


# a · b = 2^-24 - 2^-70 and c = 1 + 2^-23: the exact sum lies just below the fp32 midpoint 1 + 3 · 2^-24, but its
# fp64 rounding is that midpoint, which fp32 then rounds to even (1 + 2^-22): a double rounding.
DOUBLE_ROUNDING_CASE = (_f32(2.0**-24 * (1 + 2.0**-23)), _f32(1 - 2.0**-23), _f32(1 + 2.0**-23))


def test_fma32_is_the_correctly_rounded_fma():
    """``fma32`` against exact rational arithmetic: random triples, the kernel's own residuals and corrections, and
    a sum that fp64 rounds onto an fp32 midpoint; the plain fp64 sum (rounded twice) misses that one."""
    rng = np.random.default_rng(0)
    size = 2000
    a = (rng.standard_normal(size) * 2.0 ** rng.integers(-30, 30, size)).astype(np.float32)
    b = (rng.standard_normal(size) * 2.0 ** rng.integers(-30, 30, size)).astype(np.float32)
    c = (rng.standard_normal(size) * 2.0 ** rng.integers(-30, 30, size)).astype(np.float32)
    # The kernel's correction: q + residual · (-r), the residual ~2^-24 q.
    divisor = tool.as_float32(rng.integers(tool.ONE, tool.TWO, size))
    x = tool.as_float32(rng.integers(tool.ONE, tool.TWO, size))
    reciprocal = np.float32(1.0) / divisor
    q = x * reciprocal
    residual = tool.fma32(divisor, q, -x)
    cases = [(a, b, c), (divisor, q, -x), (residual, -reciprocal, q), DOUBLE_ROUNDING_CASE]
    for operands in cases:
        assert np.array_equal(tool.fma32(*operands).view(np.int32), _exact_fma(*operands).view(np.int32))
    assert tool.fma32(*DOUBLE_ROUNDING_CASE)[0] == np.float32(1 + 2.0**-23)
    assert tool.double_rounded_fma32(*DOUBLE_ROUNDING_CASE)[0] == np.float32(1 + 2.0**-22)


def test_midpoint_pairs_are_the_closest_to_a_rounding_midpoint():
    """Each pair's quotient y = X / S lies next to a midpoint m of the fp32 grid, |X 2^k - m' S| = |t| 2^j <= 5 2^j
    (m = m' / 2^k, k = 24 for y >= 1, else 25; 2^j the power of two in S): the family on which the argument's case 1
    is tightest, checked in exact rationals."""
    s, x = tool.midpoint_pairs(SAMPLE_SCALES[:64])
    assert s.size >= 64
    for d, v in zip(s[:300].tolist(), x[:300].tolist(), strict=True):
        y = Fraction(v, d)
        bits = 24 if y >= 1 else 25
        odd = 2 * (y * (1 << (bits - 1))).__floor__() + 1  # the midpoint below the next grid point, times 2^bits
        twos = (d & -d).bit_length() - 1
        assert 0 < abs(v * (1 << bits) - odd * d) <= max(map(abs, tool.MIDPOINT_OFFSETS)) << twos


def test_one_correction_divides_a_sample_of_scales_exactly():
    """The proof's check on 4160 scale significands: every quotient correctly rounded, every e4m3 value the
    reference's."""
    tally = tool.check(SAMPLE_SCALES, corrections=1)
    assert tally.ok, (tally.missed, tally.e4m3_missed, tally.examples)
    assert min(tally.checked.values()) > 8000 and tally.e4m3_checked > 12000


@pytest.mark.parametrize("planted", ["no correction", "double-rounded fma"])
def test_a_planted_wrong_division_fails_the_same_check(planted: str):
    """q = x · (1 / d) alone misses quotients in every family and e4m3 values; one correction whose fmas round twice
    misses quotients of the midpoint family (the targeted x, not random ones, find it)."""
    kwargs = {"corrections": 0} if planted == "no correction" else {"fma": tool.double_rounded_fma32}
    tally = tool.check(SAMPLE_SCALES, **kwargs)
    assert not tally.ok
    if planted == "no correction":
        assert all(tally.missed.values()) and tally.e4m3_missed > 0, tally
    else:
        assert tally.missed["midpoint"] > 0 and tally.missed["random"] == 0, tally


def test_the_cli_reports_a_planted_division():
    assert tool.main(["--scales", "256"]) == 0
    assert tool.main(["--scales", "256", "--corrections", "0"]) == 1


@pytest.mark.slow
def test_one_correction_divides_every_scale_exactly():
    """The proof's enumeration: every scale significand (2^23) against its midpoint pairs, x's edge significands
    (case 2's three with margin) and random x; every e4m3 value the reference's. About 70 s on one core."""
    tally = tool.check(tool.every_scale(), corrections=1)
    assert tally.ok, (tally.missed, tally.e4m3_missed, tally.examples)
