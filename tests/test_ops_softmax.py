"""softmax / log_softmax over any axis: finite differences, PyTorch, numerical stability, errors."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import treadle as tl
from opcheck import BACKENDS, gradcheck, run, tol, torch_grads

OPS = {"softmax": F.softmax, "log_softmax": F.log_softmax}
# (shape, axis) pairs: batch 1, plain 2-D, 3-D over every axis, negative axes, 1-D.
SHAPE_AXES = [((1, 5), -1), ((1, 5), 0), ((4, 7), 1), ((4, 7), 0), ((2, 3, 4), 0), ((2, 3, 4), 1),
              ((2, 3, 4), 2), ((2, 3, 4), -2), ((6,), 0), ((2, 1, 3), 1)]
SA_IDS = [f"{s}-ax{a}" for s, a in SHAPE_AXES]


def sample(shape, dtype, seed=0, scale=2.0):
    return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape, axis", SHAPE_AXES, ids=SA_IDS)
@pytest.mark.parametrize("op", list(OPS))
def test_gradcheck(op, shape, axis, backend):
    gradcheck(op, [sample(shape, np.float64)], {"axis": axis}, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, axis", SHAPE_AXES, ids=SA_IDS)
@pytest.mark.parametrize("op", list(OPS))
def test_matches_torch(op, shape, axis, dtype, backend):
    x = sample(shape, dtype, seed=1)
    dy = sample(shape, dtype, seed=2, scale=1.0)
    (y,), (dx,) = run(op, [x], {"axis": axis}, [dy], backend)
    (ty,), tgrads = torch_grads(lambda t: OPS[op](t, dim=axis), [x], [dy], wrt=[0])
    assert y.dtype == dtype and dx.dtype == dtype
    np.testing.assert_allclose(y, ty, **tol(dtype))
    np.testing.assert_allclose(dx, tgrads[0], **tol(dtype))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", list(OPS))
def test_default_axis_is_last(op, backend):
    x = sample((3, 4, 5), np.float64)
    (y_default,), _ = run(op, [x], {}, None, backend)
    (y_last,), _ = run(op, [x], {"axis": 2}, None, backend)
    np.testing.assert_array_equal(y_default, y_last)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", list(OPS))
def test_large_logits_are_stable(op, dtype, backend):
    """Logits far beyond exp's range (and spread by thousands) stay finite and match PyTorch."""
    x = sample((5, 9), dtype, seed=3, scale=1000.0) + dtype(1e4)
    x[0] = dtype(-1e4)  # a row of equal, hugely negative logits
    dy = sample(x.shape, dtype, seed=4, scale=1.0)
    (y,), (dx,) = run(op, [x], {"axis": 1}, [dy], backend)
    (ty,), tgrads = torch_grads(lambda t: OPS[op](t, dim=1), [x], [dy], wrt=[0])
    assert np.isfinite(y).all() and np.isfinite(dx).all()
    np.testing.assert_allclose(y, ty, **tol(dtype))
    np.testing.assert_allclose(dx, tgrads[0], **tol(dtype))
    if op == "softmax":
        np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-6)
        np.testing.assert_allclose(y[0], 1.0 / 9, rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_large_logits_gradcheck(backend):
    """Finite differences at logits around 750 (where a naive exp overflows in float64).

    rtol is looser here only because x +- 1e-6 is itself rounded at ulp(750) ~ 1e-13.
    """
    x = sample((3, 4), np.float64, seed=5) + 750.0
    for op in OPS:
        gradcheck(op, [x], {"axis": -1}, rtol=1e-6, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_masked_logits(dtype, backend):
    """-inf logits get probability exactly 0 (as in masked attention) and no gradient."""
    x = np.array([[0.0, -np.inf, 1.0, 2.0], [-np.inf, 3.0, -np.inf, 3.0]], dtype=dtype)
    dy = sample(x.shape, dtype, seed=6, scale=1.0)
    (y,), (dx,) = run("softmax", [x], {"axis": 1}, [dy], backend)
    (ty,), tgrads = torch_grads(lambda t: F.softmax(t, dim=1), [x], [dy], wrt=[0])
    assert y[0, 1] == 0 and y[1, 0] == 0 and y[1, 2] == 0
    np.testing.assert_allclose(y, ty, **tol(dtype))
    np.testing.assert_allclose(dx, tgrads[0], **tol(dtype))
    (ly,), _ = run("log_softmax", [x], {"axis": 1}, None, backend)
    np.testing.assert_allclose(ly, F.log_softmax(torch.tensor(x), dim=1).numpy(), **tol(dtype))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("n", [129, 1000])
def test_long_float_rows_match_torch(op, n, backend):
    """float32 last-axis lines take the vectorised exp in blocks: lines longer than a block, spreads
    where exp(x - max) is subnormal or 0, a masked (-inf) entry per row."""
    x = sample((5, n), np.float32, seed=10, scale=30.0)
    x[:, 3] = -np.inf
    x[0, 100:] = x[0].max() - 95.0  # below FLT_MIN after the exp, still > 0
    dy = sample(x.shape, np.float32, seed=11, scale=1.0)
    (y,), (dx,) = run(op, [x], {"axis": 1}, [dy], backend)
    (ty,), tgrads = torch_grads(lambda t: OPS[op](t, dim=1), [x], [dy], wrt=[0])
    np.testing.assert_allclose(y, ty, **tol(np.float32))
    np.testing.assert_allclose(dx, tgrads[0], **tol(np.float32))
    if op == "softmax":
        assert np.all(y[:, 3] == 0.0) and np.all(y[0, 100:] > 0.0)


@pytest.mark.parametrize("op", list(OPS))
def test_predict_into_its_own_input(op):
    """out=x: the output overwrites the logits it is computed from."""
    x = sample((4, 300), np.float32, seed=12, scale=5.0)
    expected = OPS[op](torch.tensor(x), dim=-1).numpy()
    model = traced(lambda v: getattr(tl.functional, op)(v))
    model.predict(x, out=x)
    np.testing.assert_allclose(x, expected, **tol(np.float32))


@pytest.mark.parametrize("backend", BACKENDS)
def test_large_tensor_matches_torch(backend):
    """Many rows (several executor chunks) along inner and outer axes."""
    x = sample((64, 33, 40), np.float64, seed=7)
    dy = sample(x.shape, np.float64, seed=8, scale=1.0)
    for op, fn in OPS.items():
        for axis in (0, 1, 2):
            (y,), (dx,) = run(op, [x], {"axis": axis}, [dy], backend)
            (ty,), tgrads = torch_grads(lambda t: fn(t, dim=axis), [x], [dy], wrt=[0])
            np.testing.assert_allclose(y, ty, **tol(np.float64), err_msg=f"{op} axis {axis}")
            np.testing.assert_allclose(dx, tgrads[0], **tol(np.float64), err_msg=f"{op} axis {axis}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("shape, axis", [((2, 3), 2), ((2, 3), -3), ((4,), 1), ((2, 3, 4), 5)])
def test_axis_out_of_range(op, shape, axis, backend):
    with pytest.raises(ValueError, match=f"{op}: axis {axis} out of range"):
        run(op, [np.zeros(shape)], {"axis": axis}, None, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", list(OPS))
def test_integer_input_is_type_error(op, backend):
    with pytest.raises(TypeError, match=op):
        run(op, [np.zeros((2, 3), dtype=np.int32)], {"axis": 1}, None, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", list(OPS))
def test_backward_op_checks_shapes(op, backend):
    with pytest.raises(ValueError, match=f"{op}_backward: gradient shape"):
        run(f"{op}_backward", [np.zeros((2, 3)), np.zeros((2, 4))], {"axis": 1}, None, backend)


def traced(fn):
    """A parameter-free treadle module whose traced forward applies `fn` (a public op)."""

    class Fn(tl.nn.Module):
        def forward(self, x):
            return fn(x)

    return Fn()


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dim", [0, 1, -1, None])
def test_public_functions(op, dim):
    """ops::softmax / ops::log_softmax record the axis (default: the last)."""
    x = sample((3, 4, 5), np.float32, seed=9)
    fn = getattr(tl.functional, op)
    got = traced(lambda v: fn(v) if dim is None else fn(v, dim)).predict(x)
    expected = OPS[op](torch.tensor(x), dim=-1 if dim is None else dim).numpy()
    np.testing.assert_allclose(got, expected, **tol(np.float32))


def test_public_function_bad_axis():
    with pytest.raises(ValueError, match="softmax: axis 3 out of range for 3-d input"):
        traced(lambda v: tl.functional.softmax(v, 3)).predict(np.zeros((2, 3, 4), dtype=np.float32))
