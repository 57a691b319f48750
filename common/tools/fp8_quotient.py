"""One Markstein correction divides cute/fp8's Q by its block scale exactly: a proof, checked on the CPU.

    python -m common.tools.fp8_quotient                      # every scale significand, one correction
    python -m common.tools.fp8_quotient --scales 4096         # the first 4096 of them (seconds)
    python -m common.tools.fp8_quotient --corrections 0       # planted: q = x · r alone (must report misses)

What is claimed
---------------
cute/fp8 quantises Q in its kernel (``cute_impl/_fp8_query.py``, step 3) as the fused quantiser does: each rotated
value x (any fp32 number) is divided by its block's scale d, correctly rounded, then cast to e4m3. The division is
the quantiser's reciprocal division: r = RN(1/d) once per block, per element q0 = RN(x · r), then corrections
q = RN(q + RN(x - d q) · r) (in the kernel fma(fma(d, q, -x), -r, q): the same values). The quantiser takes two
(``ROTATED_CORRECTIONS``); ``cute_impl.fp8.Q_QUOTIENT_CORRECTIONS`` = 1 takes one. Claim: one gives RN(x / d) for
every fp32 x and d with no underflow or overflow on the way, so Q's e4m3 bytes stay the quantiser's
(``common.contract.fp8.quantise_with``: (x / scale), clamped, cast) bit for bit.

Why (x, d > 0 by symmetry; both significands in [1, 2) by exact powers of two, so y = x / d is in (1/2, 2); u = 2^-24)
--------------------------------------------------------------------------------------------------------------
Let ε = 1 - d r, |ε| <= d u / 2 < u (r is within half an ulp of 1/d); ulp = ulp(y). If the residual e = x - d q0 is
exact, q0 + e r = y + ε (q0 - y): the correction rounds y moved by δ = ε (q0 - y), and misses only if a rounding
midpoint m of the fp32 grid lies between y and y + δ. Since x is a multiple of 2^-23 and m d of 2^-48 (y < 1) or
2^-47 (y >= 1), a y that is not a midpoint (none is: an odd 25-bit significand times d's cannot have 24 bits) is at
least u ulp / d from every midpoint.
1. q0 faithful (one of y's two fp32 neighbours): e is exact (the remainder of a faithful quotient is representable,
   Boldo and Daumas), and |q0 - y| <= ulp / 2 + |y - m| for the nearest midpoint m; a miss needs |δ| >= |y - m|,
   i.e. d u / 2 (ulp / 2 + |y - m|) >= |y - m| >= u ulp / d, which gives d^2 + d 2^-23 >= 4: impossible for d <= 2 -
   2^-23. This is Markstein's theorem (r within half an ulp of 1/d, q0 within one ulp of y).
2. q0 not faithful (possible: |x r - y| = |ε| y reaches past half an ulp near a binade's top): |q0 - y| < 1.5 ulp,
   and q0 lands past y's neighbour only if y lies within (x - 1) ulp / 2 of an fp32 number, so at least (2 - x) ulp /
   2 from every midpoint. With e rounded too, |δ| < 1.5 u ulp + 1.5 u ulp = 3 u ulp: no midpoint is crossed unless
   2 - x < 6 u, i.e. x's significand is one of the top three (2 - k 2^-23, k = 1, 2, 3).
So the only pairs left to check are those x, against every d: ``edge_pairs`` enumerates x's top significands (8,
with margin) against all 2^23 scale significands. The tool checks the rest too, as a test of the argument itself:
the x closest to a midpoint for every scale (``midpoint_pairs``, where case 1's margin is thinnest), x near d and
near the binade bottom, and random x. The kernel's range keeps every step normal: d in [2^-60, 2^120) (smaller
scales move up by 2^89 first, ``divisor_of``), r normal, and a quotient that is not rounded to e4m3's zero
(|y| >= 2^-10) has a normal, representable residual; a smaller one rounds to ±0 either way.

How (numpy)
-----------
np.float32's +, x and / are correctly rounded (IEEE), so q0 and r are exact emulations. ``fma32`` emulates
``fma.rn.f32``: the product of two fp32 values is exact in fp64 (48 <= 53 bits); their sum with c is rounded to fp64
by *rounding to odd* (TwoSum gives the fp64 sum's exact error; an inexact sum with an even significand steps one fp64
ulp towards the error), and rounding an odd-rounded value of p + 2 or more bits to p bits gives the correctly rounded
value (Boldo and Melquiond, "Emulation of FMA and correctly rounded sums: proved algorithms using rounding to odd",
IEEE TC 2008; 53 >= 24 + 2), so ``astype(np.float32)`` then rounds once, correctly. Plain fp64 sums would round twice
(``tests/test_fp8_quotient.py`` checks ``fma32`` against exact rationals and shows double rounding differ). Each
quotient is compared bit for bit with np.float32's division, and its e4m3 value with torch's reference cast.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import numpy as np
import torch

from common.contract.fp8 import E4M3_MAX

# fp32 significands as integers: a value in [1, 2) is SIGNIFICAND / 2^23.
FRACTION_BITS = 23
ONE = 1 << FRACTION_BITS
TWO = 2 * ONE
# x significands next to 2 that case 2 of the argument leaves to check (three), with margin.
EDGE_SIGNIFICANDS = 8
# Offsets t of the closest pairs to a midpoint: x - m d = t (d's ulp times the quotient grid's half step).
MIDPOINT_OFFSETS = (-5, -3, -1, 1, 3, 5)
# Quotients per scale of ``midpoint_pairs`` where d's significand is even (many midpoints are equally hard).
EVEN_SCALE_SOLUTIONS = 2


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """a · b + c rounded once to fp32 (``fma.rn.f32``), by rounding to odd in fp64 (module docstring)."""
    product = a.astype(np.float64) * b.astype(np.float64)  # exact
    addend = c.astype(np.float64)
    total = product + addend
    # TwoSum: the exact error of the fp64 sum (no overflow in the ranges used here).
    virtual = total - product
    error = (product - (total - virtual)) + (addend - virtual)
    even = (total.view(np.int64) & 1) == 0
    towards = np.where(error > 0, np.inf, -np.inf)
    odd = np.where((error != 0) & even, np.nextafter(total, towards), total)
    return odd.astype(np.float32)


def double_rounded_fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Planted: a · b + c rounded to fp64, then to fp32 (twice): not ``fma.rn.f32``."""
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


def reciprocal_division(x: np.ndarray, divisor: np.ndarray, corrections: int, fma=fma32) -> np.ndarray:
    """The kernel's x / d (``_fp8_query.quotient``): r = 1 / d, q = x · r, then ``corrections`` times
    q = fma(fma(d, q, -x), -r, q)."""
    reciprocal = np.float32(1.0) / divisor
    quotient = x * reciprocal
    for _ in range(corrections):
        residual = fma(divisor, quotient, -x)
        quotient = fma(residual, -reciprocal, quotient)
    return quotient


def _inverse_mod_power_of_two(odd: np.ndarray, bits: int) -> np.ndarray:
    """odd^-1 mod 2^bits (bits <= 25) by Newton's iteration, each step doubling the correct low bits (3 to start)."""
    mask = (1 << bits) - 1
    inverse = odd.copy()
    for _ in range(4):
        inverse = (inverse * ((2 - odd * inverse) & mask)) & mask
    return inverse


def midpoint_pairs(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For every scale significand S, the x significands X whose quotient lies closest to a rounding midpoint:
    X 2^k - (2Q + 1) S = t for t in MIDPOINT_OFFSETS (times S's power of two), k = 24 for quotients in [1, 2)
    (X >= S), 25 for (1/2, 1) (X < S), Q a 24-bit quotient significand: 2Q + 1 = -t S^-1 mod 2^k. Returns
    (S, X) pairs (int64)."""
    twos = np.zeros_like(scales)
    odd = scales.copy()
    while (even := (odd & 1) == 0).any():
        odd = np.where(even, odd >> 1, odd)
        twos += even
    inverse = _inverse_mod_power_of_two(odd, 25)
    out_s, out_x = [], []
    for bits in (24, 25):
        modulus = np.int64(1) << (bits - twos)
        for offset in MIDPOINT_OFFSETS:
            residue = (-offset * inverse) % modulus  # 2Q + 1 mod 2^(bits - twos): odd
            # The smallest 2Q + 1 >= 2^24 (Q a 24-bit significand) in that class, and a few more where S is even.
            first = residue + -(-(TWO - residue) // modulus) * modulus
            for n in range(EVEN_SCALE_SOLUTIONS):
                odd_quotient = first + n * modulus
                numerator = odd_quotient * scales + (offset << twos)
                x = numerator >> bits
                low, high = (scales, TWO) if bits == 24 else (ONE, scales)
                keep = (odd_quotient < 2 * TWO) & (numerator % (1 << bits) == 0) & (x >= low) & (x < high)
                if n > 0:
                    keep &= twos > 0
                out_s.append(scales[keep])
                out_x.append(x[keep])
    return np.concatenate(out_s), np.concatenate(out_x)


def edge_pairs(scales: np.ndarray, count: int = EDGE_SIGNIFICANDS) -> tuple[np.ndarray, np.ndarray]:
    """Every scale significand against x's top ``count`` significands (case 2 of the argument), the ``count``
    nearest d's own (quotients next to 1) and the bottom ``count`` (quotients next to 1/2 or 1)."""
    top = np.arange(TWO - count, TWO)
    bottom = np.arange(ONE, ONE + count)
    near = np.arange(-(count // 2), count // 2 + 1)
    s_top, x_top = np.repeat(scales, top.size), np.tile(top, scales.size)
    s_bottom, x_bottom = np.repeat(scales, bottom.size), np.tile(bottom, scales.size)
    s_near = np.repeat(scales, near.size)
    x_near = s_near + np.tile(near, scales.size)
    keep = (x_near >= ONE) & (x_near < TWO)
    return np.concatenate([s_top, s_bottom, s_near[keep]]), np.concatenate([x_top, x_bottom, x_near[keep]])


def random_pairs(scales: np.ndarray, per_scale: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    s = np.repeat(scales, per_scale)
    return s, rng.integers(ONE, TWO, s.size, dtype=np.int64)


def as_float32(significands: np.ndarray) -> np.ndarray:
    """Significands in [2^23, 2^24) as the fp32 values in [1, 2) (exact)."""
    return (significands.astype(np.float32) * np.float32(2.0**-FRACTION_BITS)).astype(np.float32)


def quotient_misses(s: np.ndarray, x: np.ndarray, corrections: int, fma=fma32, signs: bool = False) -> np.ndarray:
    """Where the kernel's division of x by d (significands) is not np.float32's (correctly rounded) quotient; with
    ``signs`` for -x too (every step is odd in x: the argument's symmetry, checked on the random pairs)."""
    divisor, value = as_float32(s), as_float32(x)
    miss = np.zeros(s.size, dtype=bool)
    for signed in (value, -value) if signs else (value,):
        got = reciprocal_division(signed, divisor, corrections, fma)
        miss |= got.view(np.int32) != (signed / divisor).view(np.int32)
    return miss


def e4m3_midpoint_values(scales: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per scale significand, x = RN(m d) and its two fp32 neighbours for one rounding midpoint m of the e4m3 grid
    (chosen at random, both signs, subnormals to 448 and past it): the quotients an ulp off would round to the
    other e4m3 value. Returns fp32 (d, x)."""
    grid = torch.arange(0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    midpoints = np.concatenate([(grid[1:] + grid[:-1]) / 2, [E4M3_MAX + 16.0]]).astype(np.float64)
    rng = np.random.default_rng(seed)
    divisor = as_float32(scales)
    m = midpoints[rng.integers(0, midpoints.size, scales.size)] * rng.choice([-1.0, 1.0], scales.size)
    centre = (m * divisor.astype(np.float64)).astype(np.float32)
    values = [centre, np.nextafter(centre, np.float32(np.inf)), np.nextafter(centre, np.float32(-np.inf))]
    return np.tile(divisor, 3), np.concatenate(values)


def e4m3_misses(divisor: np.ndarray, value: np.ndarray, corrections: int, fma=fma32) -> np.ndarray:
    """Where the kernel's e4m3 value of x / d (fp32) differs from the reference quantiser's
    (``common.contract.fp8.quantise_with``: the division, a clamp to ±448, torch's e4m3 cast)."""
    got = torch.from_numpy(reciprocal_division(value, divisor, corrections, fma))
    want = torch.from_numpy(value) / torch.from_numpy(divisor)

    def e4m3(q: torch.Tensor) -> torch.Tensor:
        return q.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)

    return (e4m3(got) != e4m3(want)).numpy()


FAMILIES = {"midpoint": midpoint_pairs, "edge": edge_pairs}


@dataclass
class Tally:
    """Pairs checked and missed per family (``missed`` keeps the first few (d, x) as fp32 values)."""

    checked: dict[str, int]
    missed: dict[str, int]
    e4m3_checked: int = 0
    e4m3_missed: int = 0
    examples: list[tuple[float, float]] | None = None

    @property
    def ok(self) -> bool:
        return sum(self.missed.values()) == 0 and self.e4m3_missed == 0


def every_scale(count: int = ONE) -> np.ndarray:
    """The first ``count`` scale significands from 2^23 up (all 2^23 by default), int64."""
    return np.arange(ONE, ONE + count, dtype=np.int64)


def check(scales: np.ndarray, corrections: int = 1, *, chunk: int = 1 << 16, random_per_scale: int = 2,
          seed: int = 0, fma=fma32) -> Tally:  # fmt: skip
    """The kernel's division with ``corrections`` for each scale significand of ``scales``: the hard families,
    ``random_per_scale`` random x each (with -x), and the e4m3 values of x next to an e4m3 midpoint times d."""
    tally = Tally(checked={}, missed={}, examples=[])
    for index, block in enumerate(np.array_split(scales, max(1, -(-scales.size // chunk)))):
        families = {name: make(block) for name, make in FAMILIES.items()}
        families["random"] = random_pairs(block, random_per_scale, seed + index)
        for name, (s, x) in families.items():
            miss = quotient_misses(s, x, corrections, fma, signs=name == "random")
            tally.checked[name] = tally.checked.get(name, 0) + s.size
            tally.missed[name] = tally.missed.get(name, 0) + int(miss.sum())
            for d, v in zip(as_float32(s[miss][:3]), as_float32(x[miss][:3]), strict=True):
                if len(tally.examples) < 8:
                    tally.examples.append((float(d), float(v)))
        divisor, value = e4m3_midpoint_values(block, seed + index)
        tally.e4m3_checked += value.size
        tally.e4m3_missed += int(e4m3_misses(divisor, value, corrections, fma).sum())
    return tally


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", type=int, default=ONE, help="scale significands from 2^23 up (all: 2^23)")
    parser.add_argument("--corrections", type=int, default=1)
    parser.add_argument("--random-per-scale", type=int, default=2)
    args = parser.parse_args(argv)
    tally = check(every_scale(args.scales), args.corrections, random_per_scale=args.random_per_scale)
    for name, checked in tally.checked.items():
        print(f"{name:>9}: {checked:>12,} pairs, {tally.missed[name]:,} quotients missed")
    print(f"     e4m3: {tally.e4m3_checked:>12,} x next to an e4m3 midpoint times d, {tally.e4m3_missed:,} missed")
    if tally.examples:
        print("first misses (d, x):", tally.examples)
    print("exact" if tally.ok else "NOT exact")
    return 0 if tally.ok else 1


if __name__ == "__main__":
    sys.exit(main())
