"""The Eigen kernel's path for weight gradients of narrow layers (C = A^T B with at most 4 columns
and a long inner dimension): against numpy in float64 and float32, and bitwise the same for any
number of workers (each row of C is summed in one order)."""
import numpy as np
import pytest

import treadle as tl

# (rows of C, columns of C, inner dimension, B stored transposed)
CASES = [(300, 2, 700, False), (513, 3, 64, True), (5, 1, 1000, False), (64, 4, 9, True), (3, 2, 5, False)]


def operands(m, n, k, tb, dtype, rng):
    a = rng.standard_normal((k, m)).astype(dtype)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(dtype)
    return a, b, a.astype(np.float64).T @ (b.astype(np.float64).T if tb else b.astype(np.float64))


@pytest.mark.parametrize("case", CASES, ids=str)
def test_thin_weight_gradient_matches_numpy(case, rng):
    m, n, k, tb = case
    for dtype, rtol in ((np.float64, 1e-12), (np.float32, 2e-5)):
        a, b, ref = operands(m, n, k, tb, dtype, rng)
        (c,), _ = tl._core.run_op("matmul", [a, b], {"trans_a": 1, "trans_b": int(tb)}, None, "eigen")
        scale = np.sqrt(k) * max(1.0, float(np.abs(ref).max()))
        np.testing.assert_allclose(c, ref, rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize("case", CASES[:2], ids=str)
def test_thin_weight_gradient_is_bitwise_the_same_for_any_workers(case, rng):
    m, n, k, tb = case
    a, b, _ = operands(m, n, k, tb, np.float32, rng)
    attrs = {"trans_a": 1, "trans_b": int(tb)}
    (one,), _ = tl._core.run_op("matmul", [a, b], attrs, None, "eigen", True, 0, 1)
    (three,), _ = tl._core.run_op("matmul", [a, b], attrs, None, "eigen", True, 0, 3)
    np.testing.assert_array_equal(one, three)


def test_thin_products_train_through_the_gradcheck(rng):
    """A 2-wide input layer: its weight gradient takes the thin path; finite differences agree."""
    from opcheck import gradcheck
    gradcheck("matmul", [rng.standard_normal((9, 3)), rng.standard_normal((9, 2))], {"trans_a": 1, "trans_b": 0})
    gradcheck("matmul", [rng.standard_normal((7, 2)), rng.standard_normal((3, 7))], {"trans_a": 1, "trans_b": 1})
