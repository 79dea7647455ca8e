"""The standard normal of one 32-bit word by segments of the inverse normal CDF: the float draws' normal
(`codegen.noise`; double draws keep Box-Muller).

A word w gives z = ±Φ⁻¹(1 - q/2) with q = (2·(w mod 2^31) + 1)·2^-32 in (0, 1) and the sign from w's top bit:
half the draws on each side, |z| from the tail probability q/2. The odd integer r = 2·(w mod 2^31) + 1 has
e = clz(r) leading zeros (q lies in the octave [2^-(e+1), 2^-e)); shifted left by e, its bit 31 is set and the next
SEGMENT_BITS bits choose the octave's segment j. The bits below make the segment's coordinate t in [-1/2, 1/2)
exactly (a float's mantissa: 1.f - 1.5), and |z| is a cubic in t, by fused multiply-adds:

    |z| = ((c3·t + c2)·t + c1)·t + c0,   (c0, c1, c2, c3) = segments()[e·2^SEGMENT_BITS + j]

Integer operations, one table read, one subtraction and three fmaf: the same bits on the host runner, on any GPU
and in torch. The cubics interpolate |z| (`statistics.NormalDist`'s inverse CDF in double: Python arithmetic over
math.log and math.sqrt; the golden kernel hashes pin the table's literals) at the segment's four Chebyshev points,
their coefficients then rounded to float: within 6 units of 2^-24 of the exact |z| (relative to max(1, |z|); measured
3.7: tests/test_noise.py). q's smallest value 2^-32 gives |z| at most 6.34.
"""
from __future__ import annotations

import functools
import math
from statistics import NormalDist

import numpy as np

__all__ = ["SEGMENT_BITS", "OCTAVES", "segments", "magnitude_at"]

SEGMENT_BITS = 3    # segments per octave: 2^SEGMENT_BITS (one 128-byte line of the table each)
OCTAVES = 32        # e = clz(r) of an odd 32-bit r


def magnitude_at(q: float) -> float:
    """|z| = -Φ⁻¹(q/2), in double."""
    return -NormalDist().inv_cdf(q / 2)


@functools.cache
def segments() -> tuple[tuple[float, ...], ...]:
    """(c0, c1, c2, c3) of each segment, in float, indexed e·2^SEGMENT_BITS + j: the cubic through |z| at the four
    Chebyshev points of x = 2t in [-1, 1], as the Chebyshev sum a0 + a1·T1(x) + a2·T2(x) + a3·T3(x) turned into
    powers of t (T1 = 2t, T2 = 8t² - 1, T3 = 32t³ - 6t)."""
    per_octave = 1 << SEGMENT_BITS
    xs = [math.cos(math.pi * (i + 0.5) / 4) for i in range(4)]
    chebyshev = [[math.cos(k * math.pi * (i + 0.5) / 4) for i in range(4)] for k in range(4)]  # T_k(xs[i])
    table = []
    for e in range(OCTAVES):
        width = math.ldexp(1.0, -(e + 1 + SEGMENT_BITS))
        for j in range(per_octave):
            values = [magnitude_at(math.ldexp(1.0, -(e + 1)) + (j + 0.5 + x / 2) * width) for x in xs]
            a0, a1, a2, a3 = (sum(f * c for f, c in zip(values, row)) / (4 if k == 0 else 2)
                              for k, row in enumerate(chebyshev))
            table.append(tuple(float(np.float32(c)) for c in (a0 - a2, 2 * a1 - 6 * a3, 8 * a2, 32 * a3)))
    return tuple(table)
