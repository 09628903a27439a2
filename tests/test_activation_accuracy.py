"""Float32 activation kernels against the float64 ones, over the whole float range.

The Eigen backend's float kernels for tanh, sigmoid, softplus, silu, elu and tanh-GELU are vectorised
(backends/eigen/transcendental.hpp, activation_kernels.cpp); the float64 kernels call the C library
per element and are the reference. Each float32 result must lie within

    k ulp of the float64 result  +  k ulp of the op's scale  +  1e-35

where an ulp is the float32 spacing at that magnitude and the scale term exists only where a float
formula cannot do better: derivatives that cross zero (silu' at x ~ -1.28, GELU' at x ~ -0.75), where
the scale is the largest term's magnitude, and GELU, whose exponent's argument is itself computed
(its rounding moves the result by |argument| x eps). 1e-35 admits results that underflow (float exp
flushes below ~1e-38). The bounds k are the ones docs/activations.md states.
"""
import os

import numpy as np
import pytest

import treadle as tl

F32 = np.float32
SQRT_2_OVER_PI, GELU_CUBIC = 0.79788456080286535588, 0.044715
UNDERFLOW = 1e-35


def _inputs():
    rng = np.random.default_rng(0)
    specials = [0.0, -0.0, 1e-45, -1e-45, 1e-40, -1e-40, 1e-30, -1e-30, 1e-7, -1e-7, 87.3, -87.3, 88.7, -88.7,
                89.5, -89.5, 104.0, -104.0, 1e12, -1e12, 1e30, -1e30, 3.4e38, -3.4e38]
    return np.concatenate([np.linspace(-120, 120, 480001), rng.standard_normal(50000) * 8,
                           np.array(specials)]).astype(F32)


def _sigmoid(z):
    return np.exp(-np.logaddexp(0.0, -z))


def _scale(op, attrs, x, dy, ref):
    """The magnitude of the formula's largest term (float64), for the ops that cancel near a zero,
    times the condition number of exp(arg) where the argument is itself computed (GELU's u or x^2 / 2:
    its rounding, relative eps, moves the result by |arg| eps)."""
    x = x.astype(np.float64)
    if op == "gelu" and attrs["approximate"] == "tanh":
        xc = np.clip(x, -30, 30)
        return np.abs(ref) * (1 + np.abs(2 * SQRT_2_OVER_PI * (xc + GELU_CUBIC * xc ** 3)))
    if op == "gelu":
        return np.abs(ref) * (1 + np.minimum(x * x, 900))
    if op == "silu_backward":
        s = _sigmoid(x)
        return np.abs(dy) * s * (1 + np.abs(x) * (1 - s))
    if op == "gelu_backward" and attrs["approximate"] == "none":
        from math import erfc, pi, sqrt
        cdf = 0.5 * np.vectorize(erfc)(-x / sqrt(2))
        return np.abs(dy) * (cdf + np.abs(x) * np.exp(-0.5 * x * x) / sqrt(2 * pi)) * (1 + np.minimum(x * x, 900))
    if op == "gelu_backward":
        xc = np.clip(x, -30, 30)
        s = _sigmoid(2 * SQRT_2_OVER_PI * (xc + GELU_CUBIC * xc ** 3))
        du = SQRT_2_OVER_PI * (1 + 3 * GELU_CUBIC * xc * xc)
        return np.abs(dy) * (s + 2 * np.abs(xc) * s * (1 - s) * du) * (1 + np.abs(2 * SQRT_2_OVER_PI * (xc + GELU_CUBIC * xc ** 3)))
    return np.zeros_like(ref)  # no second term: k ulp of the result


def _ulp(v):
    """The float32 spacing at |v| (float64 arithmetic: no overflow at FLT_MAX), at least 2^-149."""
    _, e = np.frexp(np.abs(np.asarray(v, np.float64)))
    return np.ldexp(1.0, np.maximum(e - 24, -149))


# (op, attrs, inputs: 1 = (x,), 2 = (x, dy), k)
CASES = [
    ("tanh", {}, 1, 1), ("sigmoid", {}, 1, 2),
    ("softplus", {"beta": 1.0, "threshold": 20.0}, 1, 2), ("softplus", {"beta": 2.0, "threshold": 5.0}, 1, 2),
    ("softplus_backward", {"beta": 1.0, "threshold": 20.0}, 2, 2),
    ("silu", {}, 1, 2), ("silu_backward", {}, 2, 3),
    ("elu", {"alpha": 1.0}, 1, 2), ("elu", {"alpha": 0.3}, 1, 2), ("elu_backward", {"alpha": 1.0}, 2, 2),
    ("gelu", {"approximate": "tanh"}, 1, 3), ("gelu_backward", {"approximate": "tanh"}, 2, 3),
    ("gelu", {"approximate": "none"}, 1, 3), ("gelu_backward", {"approximate": "none"}, 2, 3),
]


@pytest.mark.parametrize("op,attrs,nin,k", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_float32_within_its_ulp_bound_of_float64(op, attrs, nin, k):
    x = _inputs()
    dy = np.random.default_rng(1).standard_normal(x.size).astype(F32)
    ins = [x] if nin == 1 else [x, dy]
    (got,), _ = tl._core.run_op(op, ins, attrs, None, "eigen")
    (ref,), _ = tl._core.run_op(op, [a.astype(np.float64) for a in ins], attrs, None, "eigen")
    assert got.dtype == F32 and ref.dtype == np.float64
    assert np.array_equal(np.isnan(got), np.isnan(ref)), f"{op}: NaN where the reference has none (or not)"
    finite = ~np.isnan(ref)
    assert np.array_equal(got[finite & np.isinf(ref)], ref[finite & np.isinf(ref)].astype(F32))
    check = finite & np.isfinite(ref)
    g, r = got[check].astype(np.float64), ref[check]
    scale = _scale(op, attrs, x[check], dy[check].astype(np.float64), r)
    allowed = k * _ulp(r) + k * _ulp(scale) + UNDERFLOW
    err = np.abs(g - r)
    worst = int(np.argmax(err / allowed))
    assert err[worst] <= allowed[worst], (
        f"{op} {attrs}: {err[worst]:.3g} off at x = {x[check][worst]!r} (float64 {r[worst]!r}, float32 {g[worst]!r}), "
        f"more than {k} ulp")


def test_checks_the_kernels_asked_for():
    # The portable build carries a kernel set per instruction set; tests/test_wheel.py runs this file
    # under each with TREADLE_EIGEN_KERNELS, so every CPU checks the sets it can run.
    want = os.environ.get("TREADLE_EIGEN_KERNELS")
    got = tl.info()["eigen.kernels"]
    assert got == want if want else got in ("built-in", "baseline", "x86-64-v3", "x86-64-v4")


def test_large_inputs_saturate_without_nan():
    # torch gives NaN for GELU' at |x| >= 1e30 (x^3 overflows); these kernels give the limits.
    x = np.array([1e30, -1e30, 3e38, -3e38], F32)
    dy = np.ones_like(x)
    (y,), _ = tl._core.run_op("gelu_backward", [x, dy], {"approximate": "tanh"}, None, "eigen")
    np.testing.assert_array_equal(y, [1, 0, 1, 0])
    for op, attrs in [("gelu", {"approximate": "tanh"}), ("softplus", {"beta": 1.0, "threshold": 20.0}),
                      ("silu", {}), ("elu", {"alpha": 1.0})]:
        (y,), _ = tl._core.run_op(op, [x], attrs, None, "eigen")
        expected = np.where(x > 0, x, -1.0 if op == "elu" else 0.0).astype(F32)
        np.testing.assert_array_equal(y, expected, err_msg=op)


def test_elu_within_its_ulp_bound_around_its_formula_switch_and_toward_zero():
    """ELU's float expm1 (transcendental.hpp) switches from a series to exp(x) - 1 at -ln 2: every
    float within 0.01 of the switch, and 10^6 log-spaced arguments from -1e-38 to -100 (both signs
    of zero too), within ELU's 2 ulp (docs/activations.md) of the float64 result (measured: 1.001)."""
    lo, hi = np.float32(-0.7032), np.float32(-0.6832)
    bits = np.arange(np.float32(hi).view(np.uint32), np.float32(lo).view(np.uint32) + 1, dtype=np.uint32)
    around = bits.view(F32)
    tail = -np.logspace(-38, 2, 1_000_000).astype(F32)
    x = np.concatenate([around, tail, np.array([0.0, -0.0], F32)])
    (got,), _ = tl._core.run_op("elu", [x], {"alpha": 1.0}, None, "eigen")
    ref = np.expm1(x.astype(np.float64))
    err = np.abs(got.astype(np.float64) - ref) / _ulp(ref)
    worst = int(np.argmax(err))
    assert err[worst] <= 2.0, f"elu: {err[worst]:.2f} ulp at x = {x[worst]!r}"
    assert np.signbit(got[-1]) and not np.signbit(got[-2]), "elu(-0.0) is -0.0, elu(0.0) is 0.0"
