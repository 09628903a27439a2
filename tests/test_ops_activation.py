"""Activation ops: float64 finite differences, PyTorch forward/backward in float32 and float64, errors."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import treadle as tl
from opcheck import BACKENDS, gradcheck, run, tol, torch_grads

tf = tl.functional

# (id, op, attrs, torch function, kinks: x where the derivative jumps, kept out of finite differences)
CASES = [
    ("relu", "relu", {}, F.relu, [0.0]),
    ("leaky_relu_default", "leaky_relu", {}, F.leaky_relu, [0.0]),
    ("leaky_relu_0.2", "leaky_relu", {"negative_slope": 0.2}, lambda x: F.leaky_relu(x, 0.2), [0.0]),
    ("leaky_relu_neg", "leaky_relu", {"negative_slope": -0.3}, lambda x: F.leaky_relu(x, -0.3), [0.0]),
    ("elu_default", "elu", {}, F.elu, [0.0]),
    ("elu_0.5", "elu", {"alpha": 0.5}, lambda x: F.elu(x, 0.5), [0.0]),
    ("elu_int_alpha", "elu", {"alpha": 2}, lambda x: F.elu(x, 2.0), [0.0]),
    ("gelu_default", "gelu", {}, F.gelu, []),
    ("gelu_none", "gelu", {"approximate": "none"}, lambda x: F.gelu(x, approximate="none"), []),
    ("gelu_tanh", "gelu", {"approximate": "tanh"}, lambda x: F.gelu(x, approximate="tanh"), []),
    ("silu", "silu", {}, F.silu, []),
    ("tanh", "tanh", {}, torch.tanh, []),
    ("sigmoid", "sigmoid", {}, torch.sigmoid, []),
    ("softplus_default", "softplus", {}, F.softplus, [20.0]),
    ("softplus_b2_t5", "softplus", {"beta": 2.0, "threshold": 5.0}, lambda x: F.softplus(x, 2.0, 5.0), [2.5]),
    ("softplus_b0.5_t1", "softplus", {"beta": 0.5, "threshold": 1}, lambda x: F.softplus(x, 0.5, 1.0), [2.0]),
]
IDS = [c[0] for c in CASES]
SHAPES = [(1, 5), (4, 7), (2, 3, 4)]

# Values reaching every branch: both signs, near zero, saturation, both sides of softplus thresholds.
EDGE_VALUES = [-60.0, -30.0, -10.0, -5.0, -2.6, -1.0, -1e-3, 0.0, 1e-3, 0.5, 1.9, 2.1, 2.4, 2.6,
               5.0, 9.0, 19.5, 20.0, 20.5, 30.0, 60.0]


def away_from(x, points, gap=0.02):
    """Moves entries within `gap` of a kink to 2 * gap beyond it, so central differences stay on one side."""
    for p in points:
        near = np.abs(x - p) < gap
        x[near] = p + np.where(x[near] >= p, 2 * gap, -2 * gap)
    return x


def fd_gradcheck(op, x, attrs, backend):
    """gradcheck with atol raised to the rounding noise of its central differences.

    The numeric gradient differences sum_k go_k * y_k, whose rounding error is ~eps * sum|go * y|;
    divided by 2h = 2e-6 that is ~1e-10 * sum|y| (e.g. 3e-9 for 24 outputs of size 1, 3e-8 for the
    saturated edge values near 60). Ten times that is still far below any real gradient error.
    """
    (y,), _ = run(op, [x], attrs, None, backend)
    gradcheck(op, [x], attrs, atol=max(1e-9, 1e-9 * float(np.abs(y).sum())), backend=backend)


def sample(shape, dtype, seed=0, scale=3.0):
    rng = np.random.default_rng(seed)
    return (scale * rng.standard_normal(shape)).astype(dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_gradcheck(case, shape, backend):
    _, op, attrs, _, kinks = case
    x = away_from(sample(shape, np.float64), kinks)
    fd_gradcheck(op, x, attrs, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_gradcheck_every_branch(case, backend):
    """Finite differences on the edge values too (minus exact kinks), including saturated regions."""
    _, op, attrs, _, kinks = case
    x = away_from(np.array(EDGE_VALUES, dtype=np.float64).reshape(3, 7), kinks + [0.0])
    fd_gradcheck(op, x, attrs, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_matches_torch(case, shape, dtype, backend):
    _, op, attrs, fn, _ = case
    x = sample(shape, dtype, seed=1)
    dy = sample(shape, dtype, seed=2, scale=1.0)
    (y,), (dx,) = run(op, [x], attrs, [dy], backend)
    (ty,), tgrads = torch_grads(fn, [x], [dy], wrt=[0])
    assert y.dtype == dtype and dx.dtype == dtype
    np.testing.assert_allclose(y, ty, **tol(dtype))
    np.testing.assert_allclose(dx, tgrads[0], **tol(dtype))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_edge_values_match_torch(case, dtype, backend):
    """Exact kinks (gradient at 0 follows PyTorch's convention), saturation, thresholds."""
    _, op, attrs, fn, _ = case
    x = np.array(EDGE_VALUES, dtype=dtype).reshape(3, 7)
    dy = sample(x.shape, dtype, seed=3, scale=1.0)
    (y,), (dx,) = run(op, [x], attrs, [dy], backend)
    (ty,), tgrads = torch_grads(fn, [x], [dy], wrt=[0])
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(dx))
    np.testing.assert_allclose(y, ty, **tol(dtype))
    np.testing.assert_allclose(dx, tgrads[0], **tol(dtype))


@pytest.mark.parametrize("backend", BACKENDS)
def test_large_tensor_matches_torch(backend):
    """Several executor-sized chunks of elements."""
    x = sample((300, 257), np.float64, seed=4)
    dy = sample(x.shape, np.float64, seed=5, scale=1.0)
    for _, op, attrs, fn, _ in CASES:
        (y,), (dx,) = run(op, [x], attrs, [dy], backend)
        (ty,), tgrads = torch_grads(fn, [x], [dy], wrt=[0])
        np.testing.assert_allclose(y, ty, **tol(np.float64), err_msg=op)
        np.testing.assert_allclose(dx, tgrads[0], **tol(np.float64), err_msg=op)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_propagates(backend):
    x = np.array([[np.nan, -1.0, 1.0]])
    for _, op, attrs, fn, _ in CASES:
        (y,), _ = run(op, [x], attrs, None, backend)
        assert np.isnan(y[0, 0]), op
        assert np.isfinite(y[0, 1:]).all(), op


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["relu", "leaky_relu", "elu", "gelu", "silu", "tanh", "sigmoid", "softplus"])
def test_backward_op_shape_mismatch(op, backend):
    with pytest.raises(ValueError, match=f"{op}_backward"):
        run(f"{op}_backward", [np.zeros((2, 3)), np.zeros((3, 2))], {}, None, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["relu", "gelu", "softplus"])
def test_integer_input_is_type_error(op, backend):
    with pytest.raises(TypeError, match=op):
        run(op, [np.arange(6, dtype=np.int64).reshape(2, 3)], {}, None, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op, attrs, match", [
    ("gelu", {"approximate": "fast"}, "approximate"),
    ("gelu", {"approximate": 1}, "approximate"),
    ("softplus", {"beta": 0.0}, "beta"),
    ("elu", {"alpha": float("nan")}, "alpha"),
    ("leaky_relu", {"negative_slope": float("inf")}, "negative_slope"),
])
def test_bad_attributes(op, attrs, match, backend):
    with pytest.raises((ValueError, TypeError), match=match):
        run(op, [np.ones((2, 2))], attrs, None, backend)


def traced(fn):
    """A parameter-free treadle module whose traced forward applies `fn` (a public op)."""

    class Fn(tl.nn.Module):
        def forward(self, x):
            return fn(x)

    return Fn()


PUBLIC = [
    ("relu", tf.relu, F.relu),
    ("leaky_relu", lambda v: tf.leaky_relu(v, 0.2), lambda t: F.leaky_relu(t, 0.2)),
    ("elu", lambda v: tf.elu(v, 0.5), lambda t: F.elu(t, 0.5)),
    ("gelu", tf.gelu, F.gelu),
    ("gelu_tanh", lambda v: tf.gelu(v, "tanh"), lambda t: F.gelu(t, approximate="tanh")),
    ("silu", tf.silu, F.silu),
    ("tanh", tf.tanh, torch.tanh),
    ("sigmoid", tf.sigmoid, torch.sigmoid),
    ("softplus", lambda v: tf.softplus(v, 2.0, 5.0), lambda t: F.softplus(t, 2.0, 5.0)),
]


@pytest.mark.parametrize("name, fn, torch_fn", PUBLIC, ids=[c[0] for c in PUBLIC])
def test_public_functions(name, fn, torch_fn):
    """The ops:: functions record the op with the right attributes (traced and run by predict)."""
    x = np.array(EDGE_VALUES, dtype=np.float32).reshape(3, 7)
    np.testing.assert_allclose(traced(fn).predict(x), torch_fn(torch.tensor(x)).numpy(), **tol(np.float32))
