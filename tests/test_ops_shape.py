"""Shape ops (reshape, flatten, concat, slice, slice_backward): PyTorch, finite differences, errors."""
import numpy as np
import pytest
import torch

import treadle as tl
from opcheck import BACKENDS, gradcheck, run, tol, torch_grads

tf = tl.functional


def sample(shape, dtype=np.float64, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def check_against_torch(op, inputs, attrs, fn, backend):
    """Forward and input gradients of `op` vs the PyTorch function `fn`."""
    rng = np.random.default_rng(42)
    (y,), _ = run(op, inputs, attrs, None, backend)
    dy = rng.standard_normal(y.shape).astype(y.dtype)
    (y,), grads = run(op, inputs, attrs, [dy], backend)
    wrt = list(range(len(inputs)))
    (ty,), tgrads = torch_grads(fn, inputs, [dy], wrt=wrt)
    assert y.dtype == inputs[0].dtype
    np.testing.assert_allclose(y, ty, **tol(y.dtype))
    for i in wrt:
        np.testing.assert_allclose(grads[i], tgrads[i], **tol(y.dtype))
    return y, grads


# --- reshape ---------------------------------------------------------------------------------------
RESHAPES = [((2, 3, 4), (6, 4)), ((2, 3, 4), (-1, 4)), ((2, 3, 4), (4, -1, 2)), ((2, 3, 4), (24,)),
            ((2, 3, 4), (1, 24)), ((1, 5), (5,)), ((1, 5), (5, 1)), ((1, 5), (-1,)), ((6,), (2, 1, 3))]
RESHAPE_IDS = [f"{a}->{b}" for a, b in RESHAPES]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("src, dst", RESHAPES, ids=RESHAPE_IDS)
def test_reshape_matches_torch(src, dst, dtype, backend):
    y, _ = check_against_torch("reshape", [sample(src, dtype)], {"shape": list(dst)}, lambda t: t.reshape(dst), backend)
    assert y.shape == np.empty(src).reshape(dst).shape


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("src, dst", RESHAPES, ids=RESHAPE_IDS)
def test_reshape_gradcheck(src, dst, backend):
    gradcheck("reshape", [sample(src)], {"shape": list(dst)}, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("src, dst, match", [
    ((2, 3), (4, 2), r"reshape: cannot reshape \(2, 3\) \(6 elements\) into \(4, 2\) \(8 elements\)"),
    ((2, 3), (-1, 4), r"reshape: cannot reshape \(2, 3\) \(6 elements\) into \(-1, 4\)"),
    ((2, 3), (-1, -1), r"reshape: only one dimension may be -1"),
    ((2, 3), (-2, -3), r"reshape: invalid dimension -2"),
    ((2, 3), (0, -1), r"reshape: cannot reshape \(2, 3\)"),
])
def test_reshape_errors(src, dst, match, backend):
    with pytest.raises(ValueError, match=match):
        run("reshape", [np.zeros(src)], {"shape": list(dst)}, None, backend)


# --- flatten ---------------------------------------------------------------------------------------
FLATTENS = [((2, 3, 4), 1, -1), ((2, 3, 4), 0, 1), ((2, 3, 4), 0, -1), ((2, 3, 4), 1, 1), ((2, 3, 4), -2, -1),
            ((1, 5), 1, -1), ((1, 5), 0, -1), ((2, 2, 3, 2), 1, 2)]
FLATTEN_IDS = [f"{s}-{a}:{b}" for s, a, b in FLATTENS]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, start, end", FLATTENS, ids=FLATTEN_IDS)
def test_flatten_matches_torch(shape, start, end, dtype, backend):
    attrs = {"start_dim": start, "end_dim": end}
    y, _ = check_against_torch("flatten", [sample(shape, dtype)], attrs, lambda t: torch.flatten(t, start, end),
                               backend)
    assert y.shape == torch.flatten(torch.zeros(shape), start, end).shape


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape, start, end", FLATTENS, ids=FLATTEN_IDS)
def test_flatten_gradcheck(shape, start, end, backend):
    gradcheck("flatten", [sample(shape)], {"start_dim": start, "end_dim": end}, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_flatten_defaults_keep_batch(backend):
    (y,), _ = run("flatten", [sample((2, 3, 4))], {}, None, backend)
    assert y.shape == (2, 12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("start, end, match", [
    (2, 1, "flatten: start_dim 2 comes after end_dim 1"),
    (3, -1, "flatten: axis 3 out of range"),
    (0, -4, "flatten: axis -4 out of range"),
])
def test_flatten_errors(start, end, match, backend):
    with pytest.raises(ValueError, match=match):
        run("flatten", [np.zeros((2, 3, 4))], {"start_dim": start, "end_dim": end}, None, backend)


# --- concat ----------------------------------------------------------------------------------------
CONCATS = [([(2, 3), (4, 3)], 0), ([(2, 3), (2, 1), (2, 5)], 1), ([(2, 3), (2, 1), (2, 5)], -1),
           ([(2, 3, 4), (2, 1, 4)], 1), ([(2, 3, 4), (2, 3, 2)], 2), ([(1, 5), (1, 2)], 1), ([(1, 5), (2, 5)], 0),
           ([(3, 4)], 0)]
CONCAT_IDS = [f"{'+'.join(map(str, s))}-ax{a}" for s, a in CONCATS]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shapes, axis", CONCATS, ids=CONCAT_IDS)
def test_concat_matches_torch(shapes, axis, dtype, backend):
    parts = [sample(s, dtype, seed=i) for i, s in enumerate(shapes)]
    check_against_torch("concat", parts, {"axis": axis}, lambda *ts: torch.cat(ts, dim=axis), backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shapes, axis", CONCATS, ids=CONCAT_IDS)
def test_concat_gradcheck(shapes, axis, backend):
    parts = [sample(s, seed=i) for i, s in enumerate(shapes)]
    gradcheck("concat", parts, {"axis": axis}, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_concat_integers(dtype, backend):
    """Shape ops move bytes, so integer tensors (e.g. class labels) work too."""
    a = np.arange(6, dtype=dtype).reshape(2, 3)
    b = np.arange(100, 104, dtype=dtype).reshape(2, 2)
    (y,), _ = run("concat", [a, b], {"axis": 1}, None, backend)
    np.testing.assert_array_equal(y, np.concatenate([a, b], axis=1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_concat_large(backend):
    parts = [sample((300, k), seed=k) for k in (17, 64, 3)]
    (y,), _ = run("concat", parts, {"axis": 1}, None, backend)
    np.testing.assert_array_equal(y, np.concatenate(parts, axis=1))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shapes, axis, err, match", [
    ([(2, 3), (3, 3)], 1, ValueError, r"concat: input 1 has shape \(3, 3\) but input 0 has shape \(2, 3\)"),
    ([(2, 3), (2, 3, 1)], 0, ValueError, r"concat: input 1 has shape \(2, 3, 1\)"),
    ([(2, 3), (2, 3)], 2, ValueError, "concat: axis 2 out of range"),
    ([(2, 3), (2, 3)], -3, ValueError, "concat: axis -3 out of range"),
])
def test_concat_errors(shapes, axis, err, match, backend):
    with pytest.raises(err, match=match):
        run("concat", [np.zeros(s) for s in shapes], {"axis": axis}, None, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_concat_dtype_mismatch(backend):
    with pytest.raises(TypeError, match="concat"):
        run("concat", [np.zeros((2, 3)), np.zeros((2, 3), dtype=np.float32)], {"axis": 0}, None, backend)


# --- slice -----------------------------------------------------------------------------------------
SLICES = [((4, 7), 1, 2, 5), ((4, 7), 0, 0, 1), ((4, 7), 1, -3, -1), ((4, 7), -1, 0, 7), ((2, 3, 4), 2, 1, 3),
          ((2, 3, 4), 1, 1, 2), ((2, 3, 4), 0, 1, 2), ((1, 5), 1, 0, 5), ((1, 5), 1, 4, 5), ((6,), 0, 2, 4)]
SLICE_IDS = [f"{s}-ax{a}[{b}:{c}]" for s, a, b, c in SLICES]


def torch_slice(axis, start, stop):
    def fn(t):
        idx = [slice(None)] * t.dim()
        idx[axis] = slice(start, stop)
        return t[tuple(idx)]
    return fn


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, axis, start, stop", SLICES, ids=SLICE_IDS)
def test_slice_matches_torch(shape, axis, start, stop, dtype, backend):
    attrs = {"axis": axis, "start": start, "stop": stop}
    check_against_torch("slice", [sample(shape, dtype)], attrs, torch_slice(axis, start, stop), backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape, axis, start, stop", SLICES, ids=SLICE_IDS)
def test_slice_gradcheck(shape, axis, start, stop, backend):
    gradcheck("slice", [sample(shape)], {"axis": axis, "start": start, "stop": stop}, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape, axis, start, stop, match", [
    ((4, 7), 1, 2, 8, r"slice: range \[2, 8\) is out of bounds for axis 1 of size 7"),
    ((4, 7), 1, 5, 3, r"slice: range \[5, 3\) is out of bounds"),
    ((4, 7), 0, -5, 2, r"slice: range \[-5, 2\) is out of bounds for axis 0 of size 4"),
    ((4, 7), 2, 0, 1, "slice: axis 2 out of range"),
])
def test_slice_errors(shape, axis, start, stop, match, backend):
    with pytest.raises(ValueError, match=match):
        run("slice", [np.zeros(shape)], {"axis": axis, "start": start, "stop": stop}, None, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_slice_backward_pads_with_zeros(dtype, backend):
    dy = sample((2, 3, 4), dtype) + 5
    attrs = {"axis": 1, "start": 2, "stop": 5, "size": 6}
    (dx,), _ = run("slice_backward", [dy], attrs, None, backend)
    expected = np.zeros((2, 6, 4), dtype=dtype)
    expected[:, 2:5] = dy
    np.testing.assert_array_equal(dx, expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_slice_backward_gradcheck(backend):
    """slice_backward is itself differentiable (its gradient is the slice)."""
    gradcheck("slice_backward", [sample((2, 3, 4))], {"axis": 1, "start": 2, "stop": 5, "size": 6},
              backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_slice_backward_checks_fit(backend):
    with pytest.raises(ValueError, match="slice_backward: gradient of shape"):
        run("slice_backward", [np.zeros((2, 3))], {"axis": 1, "start": 0, "stop": 2, "size": 4}, None, backend)


# --- the public functions (ops::reshape, ...) traced into a model and run by predict ---------------
def traced(fn):
    """A parameter-free treadle module whose traced forward applies `fn` (a public op)."""

    class Fn(tl.nn.Module):
        def forward(self, x):
            return fn(x)

    return Fn()


PUBLIC = [
    ("reshape", lambda v: tf.reshape(v, [4, -1]), lambda a: a.reshape(4, -1)),
    ("flatten_default", tf.flatten, lambda a: a.reshape(2, -1)),
    ("flatten_0_1", lambda v: tf.flatten(v, 0, 1), lambda a: a.reshape(6, 4)),
    ("concat", lambda v: tf.concat([v, tf.slice(v, 2, 0, 1)], 2), lambda a: np.concatenate([a, a[:, :, :1]], 2)),
    ("cat_default_dim_is_torch_0", lambda v: tl.functional.cat([v, v]), lambda a: np.concatenate([a, a], 0)),
    ("concat_default_axis", lambda v: tf.concat([v, v]), lambda a: np.concatenate([a, a], -1)),
    ("slice", lambda v: tf.slice(v, 1, -2, 3), lambda a: a[:, -2:3]),
    ("slice_then_reshape", lambda v: tf.reshape(tf.slice(v, 0, 1, 2), [12]), lambda a: a[1:2].reshape(12)),
]


@pytest.mark.parametrize("name, fn, np_fn", PUBLIC, ids=[c[0] for c in PUBLIC])
def test_public_functions(name, fn, np_fn):
    x = sample((2, 3, 4), np.float32)
    np.testing.assert_array_equal(traced(fn).predict(x), np_fn(x))


@pytest.mark.parametrize("fn, err, match", [
    (lambda v: tf.reshape(v, [5, 5]), ValueError, r"reshape: cannot reshape \(2, 3, 4\)"),
    (lambda v: tf.concat([], 0), ValueError, "concat: expected at least one input"),
    (lambda v: tf.slice(v, 3, 0, 1), ValueError, "slice: axis 3 out of range"),
    (lambda v: tf.flatten(v, 2, 0), ValueError, "flatten: start_dim 2 comes after end_dim 0"),
])
def test_public_function_errors(fn, err, match):
    with pytest.raises(err, match=match):
        traced(fn).predict(sample((2, 3, 4), np.float32))
