"""Eigen's linear and matmul kernels against float64 numpy products, on both sides of their switch to
the register-blocked small_gemm (16 rows and 16 columns, on CPUs with FMA): every transpose
combination, ragged edges (a partial panel, leftover rows, K past its 256-long blocks), float32 and
float64, the linear layer's gradients, and bitwise the same results on 1, 2 and 3 workers."""
import itertools

import numpy as np
import pytest

import treadle as tl

# (m, k, n): C (m x n) = op(A) (m x k) @ op(B) (k x n)
SHAPES = [(17, 5, 16), (33, 300, 37), (130, 64, 24), (15, 40, 40), (40, 40, 15), (300, 20, 200), (6, 600, 70)]


def product_tolerance(dtype, a, b):
    """Per element: a few rounding errors of the sum of |a_ik b_kj| (float32: 1e-6 of it, plus)."""
    bound = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    return (2e-6 if dtype == np.float32 else 1e-14) * bound + 1e-30


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("ta,tb", list(itertools.product([0, 1], repeat=2)))
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_matmul_matches_float64(m, k, n, ta, tb, dtype):
    rng = np.random.default_rng(m * 1000 + k + n)
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(dtype)
    attrs = {"trans_a": ta, "trans_b": tb}
    (c,), _ = tl._core.run_op("matmul", [a, b], attrs, None, "eigen")
    opa, opb = (a.T if ta else a), (b.T if tb else b)
    want = opa.astype(np.float64) @ opb.astype(np.float64)
    assert c.dtype == dtype and c.shape == (m, n)
    err = np.abs(c - want)
    assert np.all(err <= product_tolerance(dtype, opa, opb)), f"max error {err.max():.3g}"
    for workers in (2, 3):
        (cw,), _ = tl._core.run_op("matmul", [a, b], attrs, None, "eigen", True, 0, workers)
        np.testing.assert_array_equal(cw, c, err_msg=f"{workers} workers")


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_linear_and_its_gradients_match_float64(m, k, n, dtype):
    rng = np.random.default_rng(m + 7 * k + 13 * n)
    x = rng.standard_normal((m, k)).astype(dtype)
    w = rng.standard_normal((n, k)).astype(dtype)
    b = rng.standard_normal(n).astype(dtype)
    gy = rng.standard_normal((m, n)).astype(dtype)
    (y,), (gx, gw, gb) = tl._core.run_op("linear", [x, w, b], {}, [gy], "eigen")
    x64, w64, gy64 = (v.astype(np.float64) for v in (x, w, gy))
    bias_rounding = (2e-6 if dtype == np.float32 else 1e-14) * (np.abs(x64 @ w64.T) + np.abs(b))
    np.testing.assert_array_less(np.abs(y - (x64 @ w64.T + b)), product_tolerance(dtype, x, w.T) + bias_rounding)
    np.testing.assert_array_less(np.abs(gx - gy64 @ w64), product_tolerance(dtype, gy, w))
    np.testing.assert_array_less(np.abs(gw - gy64.T @ x64), product_tolerance(dtype, gy.T, x))
    np.testing.assert_allclose(gb, gy64.sum(axis=0), rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-5)
