"""Elementwise arithmetic (add, sub, mul with broadcasting, scale), sum_to over every reduction the core
allows, and dropout's mask on every backend against the Eigen reference: PyTorch / numpy forward and
gradients, finite differences."""
import numpy as np
import pytest
import torch

from opcheck import BACKENDS, assert_close_f32, gradcheck, run, tol, torch_grads


def sample(shape, dtype=np.float64, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def assert_close(got, ref, dtype, what):
    """Against PyTorch; float32 gradients of broadcasting are sums, measured against their scale."""
    if dtype == np.float32 and ref.size:
        assert_close_f32(got, ref, what)
    else:
        np.testing.assert_allclose(got, ref, **tol(dtype), err_msg=what)


# --- add, sub, mul ----------------------------------------------------------------------------------
# Operand shapes reaching every layout: same shape, a bias row either side, a 0-d operand, size-1
# dimensions on both sides, a broadcast middle dimension, alternating broadcast dimensions, rank 6.
BROADCASTS = [((4, 7), (4, 7)), ((4, 7), (7,)), ((7,), (4, 7)), ((), (3, 4)), ((3, 4), ()), ((5,), (1,)),
              ((3, 1, 5), (1, 4, 1)), ((2, 3, 4), (3, 1)), ((2, 1, 3, 1, 2), (1, 4, 1, 5, 1)),
              ((2, 3, 1, 4, 1, 2), (3, 5, 1, 2, 1)), ((1, 1), (1,)), ((300, 65), (300, 1)),
              ((0, 5), (5,))]
BROADCAST_IDS = [f"{a}x{b}" for a, b in BROADCASTS]
TORCH_BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("a_shape, b_shape", BROADCASTS, ids=BROADCAST_IDS)
@pytest.mark.parametrize("op", list(TORCH_BINARY))
def test_binary_matches_torch(op, a_shape, b_shape, dtype, backend):
    a, b = sample(a_shape, dtype, 1), sample(b_shape, dtype, 2)
    (y,), _ = run(op, [a, b], {}, None, backend)
    dy = sample(y.shape, dtype, 3)
    (y,), grads = run(op, [a, b], {}, [dy], backend)
    (ty,), tgrads = torch_grads(TORCH_BINARY[op], [a, b], [dy], wrt=[0, 1])
    assert y.shape == ty.shape and y.dtype == dtype
    np.testing.assert_allclose(y, ty, **tol(dtype))
    for i in (0, 1):
        assert grads[i].shape == (a_shape, b_shape)[i]
        assert_close(grads[i], tgrads[i], dtype, f"{op}: gradient of input {i}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("a_shape, b_shape", BROADCASTS[:9], ids=BROADCAST_IDS[:9])
@pytest.mark.parametrize("op", list(TORCH_BINARY))
def test_binary_gradcheck(op, a_shape, b_shape, backend):
    gradcheck(op, [sample(a_shape, seed=1), sample(b_shape, seed=2)], {}, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("alpha", [-1.0, 0.37, 3])
def test_scale_matches_torch(alpha, dtype, backend):
    x = sample((5, 6, 7), dtype)
    dy = sample(x.shape, dtype, 1)
    (y,), (dx,) = run("scale", [x], {"alpha": float(alpha)}, [dy], backend)
    (ty,), tgrads = torch_grads(lambda t: t * alpha, [x], [dy], wrt=[0])
    np.testing.assert_allclose(y, ty, **tol(dtype))
    np.testing.assert_allclose(dx, tgrads[0], **tol(dtype))


@pytest.mark.parametrize("backend", BACKENDS)
def test_scale_gradcheck(backend):
    gradcheck("scale", [sample((3, 4))], {"alpha": -2.5}, backend=backend)


# --- mul3: alpha * a * b * c over one shape (the activations' curvature terms) -----------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("alpha", [-2.0, 0.37, 1])
def test_mul3_matches_torch(alpha, dtype, backend):
    a, b, c = sample((5, 6, 7), dtype, 1), sample((5, 6, 7), dtype, 2), sample((5, 6, 7), dtype, 3)
    dy = sample(a.shape, dtype, 4)
    (y,), grads = run("mul3", [a, b, c], {"alpha": float(alpha)}, [dy], backend)
    (ty,), tgrads = torch_grads(lambda p, q, r: p * q * r * alpha, [a, b, c], [dy], wrt=[0, 1, 2])
    np.testing.assert_allclose(y, ty, **tol(dtype))
    for i in range(3):
        np.testing.assert_allclose(grads[i], tgrads[i], **tol(dtype), err_msg=f"mul3: gradient of input {i}")


def test_mul3_keeps_the_bits_of_mul_mul_scale():
    # tanh's curvature was scale(mul(mul(dy, g), y), -2): mul3 rounds in the same order.
    a, b, c = (sample((300, 70), np.float32, s) for s in (5, 6, 7))
    (y,), _ = run("mul3", [a, b, c], {"alpha": -2.0}, None, "eigen")
    (ab,), _ = run("mul", [a, b], {}, None, "eigen")
    (abc,), _ = run("mul", [ab, c], {}, None, "eigen")
    (ref,), _ = run("scale", [abc], {"alpha": -2.0}, None, "eigen")
    np.testing.assert_array_equal(y, ref)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mul3_gradcheck(backend):
    gradcheck("mul3", [sample((3, 4), seed=s) for s in (1, 2, 3)], {"alpha": -2.0}, backend=backend)


def test_mul3_refuses_broadcasting():
    a = sample((3, 4))
    with pytest.raises(ValueError, match=r"mul3: input 2 has shape \(4,\)"):
        run("mul3", [a, a, sample((4,))], {"alpha": 1.0}, None, "eigen")


# --- sum_to -----------------------------------------------------------------------------------------
# (x shape, target): column sums (the bias gradient), row sums, middle and alternating dimensions,
# everything to a scalar, long sums (one block per output), an empty x (zeros), a copy.
SUM_TOS = [((8, 5), (5,)), ((8, 5), (1, 5)), ((2, 3, 5), (5,)), ((6, 4), (6, 1)), ((3, 4, 5), (4, 1)),
           ((3, 4, 5), (3, 1, 5)), ((3, 4, 5), ()), ((3, 4, 5), (1, 1, 1)), ((2, 3, 4, 5), (3, 1, 5)),
           ((2, 3, 4, 5), (2, 1, 4, 1)), ((4, 3000), (4, 1)), ((3000, 3), (3000, 1)), ((70, 3, 50), (3, 1)),
           ((1200, 7), (7,)), ((0, 5), (5,)), ((3, 0, 2), (1, 1, 2)), ((3, 4), (3, 4))]
SUM_TO_IDS = [f"{a}->{b}" for a, b in SUM_TOS]


def numpy_sum_to(x, target):
    """x summed in float64 over the dimensions where `target` (right-aligned) is 1 or absent."""
    lead = x.ndim - len(target)
    axes = tuple(range(lead)) + tuple(lead + i for i, t in enumerate(target) if t == 1 and x.shape[lead + i] != 1)
    return np.sum(x.astype(np.float64), axis=axes, keepdims=True).reshape(target)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("src, dst", SUM_TOS, ids=SUM_TO_IDS)
def test_sum_to_matches_numpy(src, dst, dtype, backend):
    x = sample(src, dtype)
    dy = sample(dst, dtype, 1)
    # The gradient of an empty x is an empty broadcast (a constant of no elements): forward only.
    (y,), (dx,) = run("sum_to", [x], {"shape": list(dst)}, [dy] if x.size else None, backend)
    ref = numpy_sum_to(x, dst)
    assert y.shape == tuple(dst) and y.dtype == dtype
    # float32 terms summed in any fixed order: error grows with the sum of magnitudes, not the result
    scale = max(1.0, float(np.max(numpy_sum_to(np.abs(x), dst)))) if x.size else 1.0
    rtol, atol = (1e-6, 1e-6 * scale) if dtype == np.float32 else (1e-12, 1e-12 * scale)
    np.testing.assert_allclose(y, ref, rtol=rtol, atol=atol)
    if x.size:
        np.testing.assert_array_equal(dx, np.broadcast_to(dy, src))  # the gradient broadcasts dy back


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("src, dst", [s for s in SUM_TOS if 0 not in s[0] and np.prod(s[0]) < 100])
def test_sum_to_gradcheck(src, dst, backend):
    gradcheck("sum_to", [sample(src)], {"shape": list(dst)}, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("src, dst", [((8, 5), (5,)), ((3, 4, 5), (4, 1)), ((4, 3000), (4, 1))])
def test_sum_to_is_repeatable(src, dst, backend):
    x = sample(src, np.float32)
    (y1,), _ = run("sum_to", [x], {"shape": list(dst)}, None, backend)
    (y2,), _ = run("sum_to", [x], {"shape": list(dst)}, None, backend)
    np.testing.assert_array_equal(y1, y2)


# --- dropout: every backend draws the reference's mask ------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p", [0.1, 0.5, 1.0])
@pytest.mark.parametrize("stream", [0, 7])
def test_dropout_mask_equals_reference(p, stream, backend):
    """The mask is a pure function of (seed, RNG counter, stream, element index): a backend must draw
    the Eigen kernel's mask bit for bit, and y and the gradient follow from it exactly."""
    if backend == "eigen":
        pytest.skip("eigen is the reference")
    x = sample((300, 37), np.float32)
    dy = sample(x.shape, np.float32, 1)
    attrs = {"p": p, "stream": stream}
    (y, m), (dx,) = run("dropout", [x], attrs, [dy, None], backend, True, 9)
    (ry, rm), (rdx,) = run("dropout", [x], attrs, [dy, None], "eigen", True, 9)
    np.testing.assert_array_equal(m, rm)
    np.testing.assert_array_equal(y, ry)
    np.testing.assert_array_equal(dx, rdx)
