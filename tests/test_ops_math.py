"""Elementwise math ops (exp, log, log1p, sqrt, abs, pow, clamp, div): float64 finite differences,
PyTorch forward/backward in float32 and float64, torch's edge semantics, refusals."""
import numpy as np
import pytest
import torch

import treadle as tl
from opcheck import BACKENDS, gradcheck, run, tol, torch_grads

tf = tl.functional


def positive(shape, seed=0, low=0.3, high=3.0):
    return np.asarray(np.random.default_rng(seed).uniform(low, high, shape))


def normal(shape, seed=0, scale=2.0):
    return np.asarray(scale * np.random.default_rng(seed).standard_normal(shape))


def away(x, kinks, gap=0.05):
    for k in kinks:
        near = np.abs(x - k) < gap
        x[near] = k + np.where(x[near] >= k, 2 * gap, -2 * gap)
    return x


# (id, op, attrs, torch function, input maker: shape -> float64 array inside the op's smooth domain)
UNARY = [
    ("exp", "exp", {}, torch.exp, lambda s: normal(s, scale=1.5)),
    ("log", "log", {}, torch.log, positive),
    ("log1p", "log1p", {}, torch.log1p, lambda s: positive(s, low=-0.7, high=3.0)),
    ("sqrt", "sqrt", {}, torch.sqrt, positive),
    ("abs", "abs", {}, torch.abs, lambda s: away(normal(s), [0.0])),
    ("pow_2", "pow", {"exponent": 2}, lambda t: t ** 2, normal),
    ("pow_3", "pow", {"exponent": 3.0}, lambda t: t ** 3, normal),
    ("pow_-1", "pow", {"exponent": -1}, lambda t: t ** -1, positive),
    ("pow_0.5", "pow", {"exponent": 0.5}, lambda t: t ** 0.5, positive),
    ("pow_-2.5", "pow", {"exponent": -2.5}, lambda t: t ** -2.5, positive),
    ("pow_0", "pow", {"exponent": 0}, lambda t: t ** 0, normal),
    ("pow_1", "pow", {"exponent": 1}, lambda t: t ** 1, normal),
    ("clamp_both", "clamp", {"min": -1.0, "max": 1.5}, lambda t: t.clamp(-1.0, 1.5),
     lambda s: away(normal(s), [-1.0, 1.5])),
    ("clamp_min", "clamp", {"min": 0.5}, lambda t: t.clamp(min=0.5), lambda s: away(normal(s), [0.5])),
    ("clamp_max", "clamp", {"max": -0.25}, lambda t: t.clamp(max=-0.25), lambda s: away(normal(s), [-0.25])),
    ("clamp_int_bounds", "clamp", {"min": -1, "max": 1}, lambda t: t.clamp(-1, 1), lambda s: away(normal(s), [-1, 1])),
]
IDS = [c[0] for c in UNARY]
SHAPES = [(5,), (3, 4), (2, 3, 4)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("case", UNARY, ids=IDS)
def test_unary_gradcheck(case, shape, backend):
    _, op, attrs, _, make = case
    gradcheck(op, [make(shape)], attrs, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", UNARY, ids=IDS)
def test_unary_matches_torch(case, dtype, backend):
    _, op, attrs, torch_fn, make = case
    x = make((4, 6)).astype(dtype)
    g = normal((4, 6), seed=1).astype(dtype)
    (y,), (dx,) = run(op, [x], attrs, [g], backend)
    (ty,), tg = torch_grads(torch_fn, [x], [g], [0])
    np.testing.assert_allclose(y, ty, **tol(dtype))
    np.testing.assert_allclose(dx, tg[0], **tol(dtype))
    assert y.dtype == dtype and dx.dtype == dtype


# Inputs where torch defines a value by convention: the domain edges, the kinks themselves, NaN.
EDGES = np.array([-np.inf, -3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, np.inf, np.nan])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", UNARY + [("log1p_edges", "log1p", {}, torch.log1p, None)], ids=IDS + ["log1p_edges"])
def test_edge_values_follow_torch(case, backend):
    """Outputs and gradients at zeros, infinities, NaN, the kinks of abs and clamp (torch: abs'(0) = 0,
    clamp passes the gradient at its bounds) and outside the domain (log of a negative is NaN)."""
    _, op, attrs, torch_fn, _ = case
    g = np.linspace(-1.0, 1.0, EDGES.size)
    with np.errstate(all="ignore"):
        (y,), (dx,) = run(op, [EDGES.copy()], attrs, [g], "eigen" if backend == "cuda" else backend)
    (ty,), tg = torch_grads(torch_fn, [EDGES.copy()], [g], [0])
    np.testing.assert_allclose(y, ty, rtol=1e-15, atol=0, equal_nan=True)
    np.testing.assert_allclose(dx, tg[0], rtol=1e-15, atol=0, equal_nan=True)


def test_clamp_with_min_above_max_is_max_everywhere_as_torch():
    x = normal((3, 4))
    g = normal((3, 4), seed=1)
    (y,), (dx,) = run("clamp", [x], {"min": 1.0, "max": -1.0}, [g])
    (ty,), tg = torch_grads(lambda t: t.clamp(1.0, -1.0), [x], [g], [0])
    np.testing.assert_array_equal(y, ty)
    np.testing.assert_array_equal(dx, tg[0])


BROADCASTS = [((3, 4), (3, 4)), ((3, 1, 4), (2, 1)), ((), (2, 3)), ((2, 3), ()), ((4,), (3, 4))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shapes", BROADCASTS, ids=str)
def test_div_gradcheck(shapes, backend):
    a = normal(shapes[0])
    b = positive(shapes[1], seed=2) * np.where(np.random.default_rng(3).random(shapes[1]) < 0.5, -1, 1)
    gradcheck("div", [a, b], backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shapes", BROADCASTS, ids=str)
def test_div_matches_torch(shapes, dtype, backend):
    a, b = normal(shapes[0]).astype(dtype), positive(shapes[1], seed=2).astype(dtype)
    out_shape = np.broadcast_shapes(shapes[0], shapes[1])
    g = normal(out_shape, seed=4).astype(dtype)
    (y,), (da, db) = run("div", [a, b], {}, [g], backend)
    (ty,), tg = torch_grads(torch.div, [a, b], [g], [0, 1])
    np.testing.assert_allclose(y, ty, **tol(dtype))
    np.testing.assert_allclose(da, tg[0], **tol(dtype))
    np.testing.assert_allclose(db, tg[1], **tol(dtype))


def test_div_by_zero_gives_torch_infinities_and_nan():
    a, b = np.array([1.0, -1.0, 0.0]), np.zeros(3)
    g = np.ones(3)
    with np.errstate(all="ignore"):
        (y,), (da, db) = run("div", [a, b], {}, [g])
    (ty,), tg = torch_grads(torch.div, [a, b], [g], [0, 1])
    np.testing.assert_array_equal(y, ty)
    np.testing.assert_array_equal(da, tg[0])
    np.testing.assert_array_equal(db, tg[1])


@pytest.mark.parametrize("op, inputs, attrs, error, match", [
    ("exp", [np.arange(4)], {}, TypeError, "exp"),
    ("div", [np.ones(3), np.ones(3, np.float32)], {}, (TypeError, ValueError), "div"),
    ("div", [np.ones((2, 3)), np.ones((4,))], {}, ValueError, r"div: shapes \(2, 3\) and \(4,\) cannot be broadcast"),
    ("pow", [np.ones(3)], {}, ValueError, "pow: missing attribute 'exponent'"),
    ("pow", [np.ones(3)], {"exponent": float("nan")}, ValueError, "pow: exponent must be finite"),
    ("pow", [np.ones(3)], {"exponent": float("inf")}, ValueError, "pow: exponent must be finite"),
    ("clamp", [np.ones(3)], {}, ValueError, "clamp: at least one of 'min' and 'max'"),
    ("clamp", [np.ones(3)], {"min": float("nan")}, ValueError, "clamp: min must be a number"),
    ("clamp", [np.ones(3)], {"max": "1"}, TypeError, "max"),
])
def test_bad_input_is_named(op, inputs, attrs, error, match):
    with pytest.raises(error, match=match):
        run(op, inputs, attrs)


def test_functional_spellings():
    """tl.functional's signatures: torch's argument names, scalars, at least one clamp bound."""

    class Fn(tl.nn.Module):
        def forward(self, x):
            return (tf.div(tf.exp(x), 2.0) + tf.pow(tf.abs(x), exponent=3) - tf.clamp(x, max=0.5)
                    + tf.log1p(tf.sqrt(tf.abs(x))) + tf.log(tf.clamp(x, min=0.1)))

    x = normal((3, 4), seed=5)
    t = torch.tensor(x)
    expect = (torch.exp(t) / 2.0 + torch.abs(t) ** 3 - t.clamp(max=0.5) + torch.log1p(torch.sqrt(t.abs()))
              + torch.log(t.clamp(min=0.1)))
    np.testing.assert_allclose(Fn().double().predict(x), expect.numpy(), rtol=1e-14)

    class NoBound(tl.nn.Module):
        def forward(self, x):
            return tf.clamp(x)

    with pytest.raises(ValueError, match="clamp: at least one of min and max"):
        NoBound().predict(np.ones((2, 2), np.float32))
