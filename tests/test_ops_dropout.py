"""dropout: deterministic counter-based masks, drop rate, scaling, gradient, p range.

The op has two outputs, (y, mask); mask holds 0 or 1 / (1 - p) in x's dtype and dy * mask is the
gradient. p == 1 is accepted as in PyTorch (everything dropped).
"""
import numpy as np
import pytest

from opcheck import BACKENDS, gradcheck, run


def sample(shape, dtype=np.float64, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def dropout(x, p, backend, seed=0, attrs=None, grad=None):
    outs, grads = run("dropout", [x], dict({"p": p}, **(attrs or {})), grad, backend, True, seed)
    return outs, grads


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fixed_seed_is_deterministic(dtype, backend):
    x = sample((64, 33), dtype)
    (y1, m1), _ = dropout(x, 0.3, backend, seed=11)
    (y2, m2), _ = dropout(x, 0.3, backend, seed=11)
    np.testing.assert_array_equal(m1, m2)
    np.testing.assert_array_equal(y1, y2)
    (_, m3), _ = dropout(x, 0.3, backend, seed=12)
    assert not np.array_equal(m1, m3), "a different seed must give a different mask"


@pytest.mark.parametrize("backend", BACKENDS)
def test_mask_same_in_float32_and_float64(backend):
    x = sample((40, 50))
    (_, m64), _ = dropout(x, 0.4, backend, seed=3)
    (_, m32), _ = dropout(x.astype(np.float32), 0.4, backend, seed=3)
    np.testing.assert_array_equal(m64 == 0, m32 == 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mask_does_not_depend_on_size_or_chunking(backend):
    """Element i's draw depends only on (seed, step, stream, i): a prefix of a larger tensor (split into
    more executor chunks) draws the same mask."""
    big = sample((200_000,))
    (_, m_big), _ = dropout(big, 0.5, backend, seed=5)
    (_, m_small), _ = dropout(big[:1000].copy(), 0.5, backend, seed=5)
    np.testing.assert_array_equal(m_big[:1000], m_small)


@pytest.mark.parametrize("backend", BACKENDS)
def test_stream_attribute_names_an_independent_stream(backend):
    x = sample((5000,))
    (_, m0), _ = dropout(x, 0.5, backend, seed=5, attrs={"stream": 0})
    (_, m1), _ = dropout(x, 0.5, backend, seed=5, attrs={"stream": 1})
    agree = np.mean((m0 == 0) == (m1 == 0))
    assert 0.45 < agree < 0.55, f"streams 0 and 1 look correlated: {agree:.3f} agreement"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_drop_fraction_and_scaling(p, dtype, backend):
    n = 400_000
    x = sample((n // 400, 400), dtype, seed=1)
    (y, mask), _ = dropout(x, p, backend, seed=2)
    assert y.dtype == dtype and mask.dtype == dtype and mask.shape == x.shape
    frac = np.mean(mask == 0)
    # Binomial(n, p) fraction: 6 standard deviations (a false alarm has probability ~1e-9).
    assert abs(frac - p) < 6 * np.sqrt(p * (1 - p) / n), f"dropped {frac:.4f}, expected {p}"
    scale = np.asarray(1.0 / (1.0 - p), dtype=dtype)
    kept = mask != 0
    np.testing.assert_array_equal(mask[kept], scale)
    np.testing.assert_array_equal(y, x * mask)
    np.testing.assert_array_equal(y[~kept], 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mean_is_preserved(backend):
    """E[y] = x: the 1 / (1 - p) scaling makes dropout unbiased."""
    x = np.full((500, 400), 2.0)
    (y, _), _ = dropout(x, 0.25, backend, seed=9)
    assert abs(y.mean() - 2.0) < 6 * 2.0 * np.sqrt(0.25 / 0.75 / x.size)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 5), (8, 16), (2, 3, 4)], ids=str)
def test_gradient_is_dy_times_mask(shape, dtype, backend):
    x = sample(shape, dtype, seed=1)
    dy = sample(shape, dtype, seed=2)
    (y, mask), (dx,) = dropout(x, 0.5, backend, seed=4, grad=[dy, None])
    np.testing.assert_array_equal(dx, dy * mask)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(1, 5), (4, 7), (2, 3, 4)], ids=str)
def test_gradcheck(shape, backend):
    """Finite differences with the mask held fixed by the seed (every evaluation uses seed 0)."""
    gradcheck("dropout", [sample(shape)], {"p": 0.4}, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_p_zero_keeps_everything(backend):
    x = sample((10, 10))
    (y, mask), _ = dropout(x, 0.0, backend)
    np.testing.assert_array_equal(mask, 1.0)
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p", [1, 1.0])
def test_p_one_drops_everything(p, backend):
    """As in PyTorch: p == 1 zeroes the output (and so the gradient)."""
    x = sample((10, 10))
    (y, mask), (dx,) = dropout(x, p, backend, grad=[np.ones_like(x), None])
    assert not y.any() and not mask.any() and not dx.any()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p", [-0.1, 1.5, float("nan"), float("inf")])
def test_p_out_of_range(p, backend):
    with pytest.raises(ValueError, match=r"dropout: p must be in \[0, 1\]"):
        dropout(np.zeros((2, 2)), p, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_input_is_type_error(backend):
    with pytest.raises(TypeError, match="dropout"):
        dropout(np.zeros((2, 2), dtype=np.int64), 0.5, backend)


def traced(fn):
    """A parameter-free treadle module whose traced forward applies `fn` (a public op)."""
    import treadle as tl

    class Fn(tl.nn.Module):
        def forward(self, x):
            return fn(x)

    return Fn()


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0])
def test_eval_is_identity(p):
    """predict runs in eval mode: functional.dropout records nothing and returns its input exactly."""
    import treadle as tl

    x = sample((16, 9), np.float32)
    np.testing.assert_array_equal(traced(lambda v: tl.functional.dropout(v, p)).predict(x), x)
    np.testing.assert_array_equal(tl.nn.Sequential(tl.nn.Dropout(0.5)).predict(x), x)


def test_functional_dropout_checks_p_in_eval():
    import treadle as tl

    with pytest.raises(ValueError, match=r"dropout: p must be in \[0, 1\]"):
        traced(lambda v: tl.functional.dropout(v, 1.5)).predict(np.ones((2, 2), dtype=np.float32))
