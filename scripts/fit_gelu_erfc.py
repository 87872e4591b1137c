#!/usr/bin/python3
"""Fits the polynomial Q of the SIMD GELU kernels (src/kernels/cpu/norm_simd.cpp, Phi).

erfc(z) / 2 = t exp(-z^2) Q(u) with t = 1 / (1 + z / 2) and u = 2.4 t - 1.4, for z in [0, 10]
(t in [1/6, 1], u in [-1, 1]). Q is fitted in relative error by iteratively reweighted least
squares (Lawson's method), which approaches the minimax polynomial, and printed highest degree
first, as the kernel's Horner loop takes it.

Usage: /usr/bin/python3 scripts/fit_gelu_erfc.py [DEGREE]
"""
import math
import sys

import numpy as np


def target(t):
    z = 2 / t - 2
    return np.array([math.erfc(x) * math.exp(x * x) for x in z]) / t / 2


def main():
    degree = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    u = np.cos(np.pi * (np.arange(6000) + 0.5) / 6000)  # Chebyshev nodes
    q = target((u + 1.4) / 2.4)
    w = np.ones_like(u)
    for _ in range(60):
        c, *_ = np.linalg.lstsq(np.vander(u, degree + 1) * (w / q)[:, None], w, rcond=None)
        w *= np.abs(np.polyval(c, u) / q - 1) ** 0.5
        w /= w.max()
    uu = np.linspace(-1, 1, 400001)
    err = np.max(np.abs(np.polyval(c, uu) / target((uu + 1.4) / 2.4) - 1))
    print("degree %d, max relative error %.2e" % (degree, err))
    print(", ".join("%.9ef" % x for x in c))


if __name__ == "__main__":
    main()
