"""Pooling: max (argmax routing, ties, NaN), average (count_include_pad, ceil_mode, divisor_override),
adaptive average and global average, against PyTorch in float32 and float64, float64 finite
differences, the modules, and bad input."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import treadle as tl
from opcheck import BACKENDS, gradcheck, run, tol, torch_grads


def sample(shape, dtype, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def as_list(v, nd):
    return list(v) if isinstance(v, tuple) else [v] * nd


def pool_attrs(nd, opts):
    a = {}
    for name in ("kernel_size", "stride", "padding", "dilation"):
        if name in opts:
            a[name] = as_list(opts[name], nd)
    for name in ("ceil_mode", "count_include_pad"):
        if name in opts:
            a[name] = bool(opts[name])
    if opts.get("divisor_override"):
        a["divisor_override"] = opts["divisor_override"]
    return a


def check_vs_torch(op, x_shape, attrs, torch_fn, dtype, backend, x=None):
    x = sample(x_shape, dtype, 0) if x is None else x
    outs, _ = run(op, [x], attrs, None, backend)
    gy = sample(outs[0].shape, dtype, 1)
    grad_outputs = [gy] + [None] * (len(outs) - 1)
    outs, grads = run(op, [x], attrs, grad_outputs, backend)
    (yt,), tgrads = torch_grads(torch_fn, [x], [gy], [0])
    np.testing.assert_allclose(outs[0], yt, **tol(dtype))
    np.testing.assert_allclose(grads[0], tgrads[0], **tol(dtype))
    return outs


def torch_pool(kind, nd):
    return getattr(F, f"{kind}_pool{nd}d")


# ---- max pooling -------------------------------------------------------------------------------

MAX_CASES = [
    ("1d_basic", (2, 3, 10), dict(kernel_size=2)),
    ("1d_stride_pad_dil", (2, 3, 11), dict(kernel_size=3, stride=2, padding=1, dilation=2)),
    ("1d_ceil", (2, 3, 10), dict(kernel_size=3, stride=2, ceil_mode=True)),
    ("2d_basic", (2, 3, 8, 8), dict(kernel_size=2)),
    ("2d_overlap", (2, 3, 7, 7), dict(kernel_size=3, stride=1)),
    ("2d_pad_ceil", (2, 2, 7, 6), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ("2d_dilation", (1, 2, 9, 9), dict(kernel_size=(2, 3), stride=(2, 1), padding=(1, 1), dilation=(2, 2))),
    ("2d_asym", (2, 2, 9, 7), dict(kernel_size=(3, 2), stride=(2, 3))),
    ("2d_ceil_last_window", (1, 1, 5, 5), dict(kernel_size=2, stride=2, ceil_mode=True)),
    ("3d", (1, 2, 5, 6, 5), dict(kernel_size=2, stride=(1, 2, 2), padding=(1, 0, 1))),
]


def max_torch_fn(nd, opts):
    kw = {k: v for k, v in opts.items()}
    return lambda x: torch_pool("max", nd)(x, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", MAX_CASES, ids=[c[0] for c in MAX_CASES])
def test_max_pool_matches_torch(case, dtype, backend):
    _, shape, opts = case
    nd = len(shape) - 2
    x = sample(shape, dtype, 0)
    outs = check_vs_torch("max_pool", shape, pool_attrs(nd, opts), max_torch_fn(nd, opts), dtype, backend, x)
    _, indices = torch_pool("max", nd)(torch.tensor(x), **opts, return_indices=True)
    assert outs[1].dtype == np.int64
    np.testing.assert_array_equal(outs[1], indices.numpy())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", MAX_CASES, ids=[c[0] for c in MAX_CASES])
def test_max_pool_gradcheck(case, backend):
    _, shape, opts = case
    # Distinct values spaced far beyond the finite-difference step, so no window changes its maximum.
    rng = np.random.default_rng(3)
    x = rng.permutation(np.prod(shape)).reshape(shape).astype(np.float64) * 0.01
    gradcheck("max_pool", [x], pool_attrs(len(shape) - 2, opts), wrt=[0], backend=backend)


def check_max_pool2d_routing(x, opts, dtype, backend):
    """Values and indices equal to torch's max_pool2d exactly, and the gradient routed as its own."""
    attrs = pool_attrs(2, opts)
    gy = sample(run("max_pool", [x], attrs, None, backend)[0][0].shape, dtype, 1)
    outs, grads = run("max_pool", [x], attrs, [gy, None], backend)
    tx = torch.tensor(x, requires_grad=True)
    ty, ti = F.max_pool2d(tx, **opts, return_indices=True)
    ty.backward(torch.tensor(gy))
    np.testing.assert_array_equal(outs[0], ty.detach().numpy())
    np.testing.assert_array_equal(outs[1], ti.numpy())
    np.testing.assert_allclose(grads[0], tx.grad.numpy(), **tol(dtype))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_pool_ties_and_nan_follow_torch(dtype, backend):
    """Ties go to the first maximum in scan order; a NaN wins its window; -inf windows keep an index."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 3, size=(2, 2, 7, 7)).astype(dtype)  # many ties
    x[0, 0, 1, 1] = np.nan
    x[1, 1, :3, :3] = -np.inf
    for opts in (dict(kernel_size=2), dict(kernel_size=3, stride=1, padding=1), dict(kernel_size=3, stride=2)):
        check_max_pool2d_routing(x, opts, dtype, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("opts", [dict(kernel_size=2), dict(kernel_size=2, padding=1),
                                  dict(kernel_size=2, ceil_mode=True)], ids=["plain", "pad", "ceil"])
def test_max_pool_2x2_rows_follow_torch(opts, dtype, backend):
    """2x2 windows at stride 2 over long rows (Eigen's vectorised row path, its vector body and its
    remainder): ties, NaN (several in one window: the last wins, as in PyTorch), -inf and odd widths."""
    rng = np.random.default_rng(7)
    x = rng.integers(-1, 2, size=(2, 3, 9, 71)).astype(dtype)  # many ties
    x[rng.random(x.shape) < 0.05] = np.nan
    x[rng.random(x.shape) < 0.05] = -np.inf
    x[0, 0, 0:2, 0:4] = np.nan
    check_max_pool2d_routing(x, opts, dtype, backend)


# ---- average pooling ---------------------------------------------------------------------------

AVG_CASES = [
    ("1d_basic", (2, 3, 10), dict(kernel_size=3)),
    ("1d_pad_exclude", (2, 3, 9), dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
    ("1d_ceil", (1, 2, 10), dict(kernel_size=4, stride=3, padding=2, ceil_mode=True)),
    ("2d_basic", (2, 3, 8, 8), dict(kernel_size=2)),
    ("2d_pad_include", (2, 2, 7, 6), dict(kernel_size=3, stride=2, padding=1)),
    ("2d_pad_exclude", (2, 2, 7, 6), dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
    ("2d_ceil_include", (2, 2, 7, 7), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ("2d_ceil_exclude", (2, 2, 7, 7), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True,
                                           count_include_pad=False)),
    ("2d_ceil_nopad", (1, 2, 6, 6), dict(kernel_size=4, stride=3, ceil_mode=True)),
    ("2d_overlap_asym", (2, 2, 8, 7), dict(kernel_size=(3, 2), stride=(1, 2), padding=(1, 0))),
    ("2d_divisor", (2, 2, 7, 7), dict(kernel_size=3, stride=2, padding=1, divisor_override=5)),
    ("3d", (1, 2, 5, 6, 5), dict(kernel_size=(2, 3, 2), stride=2, padding=(1, 1, 0), ceil_mode=True)),
]


def avg_torch_fn(nd, opts):
    kw = dict(opts)
    if nd == 1:
        kw.pop("divisor_override", None)
    return lambda x: torch_pool("avg", nd)(x, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", AVG_CASES, ids=[c[0] for c in AVG_CASES])
def test_avg_pool_matches_torch(case, dtype, backend):
    _, shape, opts = case
    nd = len(shape) - 2
    check_vs_torch("avg_pool", shape, pool_attrs(nd, opts), avg_torch_fn(nd, opts), dtype, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", AVG_CASES, ids=[c[0] for c in AVG_CASES])
def test_avg_pool_gradcheck(case, backend):
    _, shape, opts = case
    gradcheck("avg_pool", [sample(shape, np.float64, 0)], pool_attrs(len(shape) - 2, opts), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", AVG_CASES[::3], ids=[c[0] for c in AVG_CASES[::3]])
def test_avg_pool_backward_gradcheck(case, backend):
    """avg_pool_backward's own gradient (avg_pool again): second derivatives."""
    _, shape, opts = case
    attrs = pool_attrs(len(shape) - 2, opts)
    (y,), _ = run("avg_pool", [sample(shape, np.float64, 0)], attrs, None, backend)
    attrs["input_size"] = list(shape[2:])
    gradcheck("avg_pool_backward", [sample(y.shape, np.float64, 1)], attrs, backend=backend)


# ---- adaptive and global average pooling -------------------------------------------------------

ADAPTIVE_CASES = [
    ("1d", (2, 3, 10), (4,)),
    ("2d_uneven", (2, 3, 7, 9), (3, 4)),
    ("2d_even", (2, 2, 6, 6), (2, 3)),
    ("2d_global", (2, 4, 5, 7), (1, 1)),
    ("2d_upsample", (1, 2, 3, 3), (5, 4)),
    ("3d", (1, 2, 5, 4, 6), (2, 3, 4)),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", ADAPTIVE_CASES, ids=[c[0] for c in ADAPTIVE_CASES])
def test_adaptive_avg_pool_matches_torch(case, dtype, backend):
    _, shape, size = case
    nd = len(shape) - 2
    fn = getattr(F, f"adaptive_avg_pool{nd}d")
    check_vs_torch("adaptive_avg_pool", shape, {"output_size": list(size)}, lambda x: fn(x, size), dtype, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ADAPTIVE_CASES, ids=[c[0] for c in ADAPTIVE_CASES])
def test_adaptive_avg_pool_gradcheck(case, backend):
    _, shape, size = case
    gradcheck("adaptive_avg_pool", [sample(shape, np.float64, 0)], {"output_size": list(size)}, backend=backend)
    (y,), _ = run("adaptive_avg_pool", [sample(shape, np.float64, 0)], {"output_size": list(size)}, None, backend)
    gradcheck("adaptive_avg_pool_backward", [sample(y.shape, np.float64, 1)], {"input_size": list(shape[2:])},
              backend=backend)


# ---- modules -----------------------------------------------------------------------------------

MODULES = [
    ("MaxPool1d", dict(kernel_size=3, stride=2, padding=1), (3, 4, 11)),
    ("MaxPool2d", dict(kernel_size=2), (3, 4, 8, 9)),
    ("MaxPool2d", dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2), ceil_mode=True),
     (2, 3, 9, 8)),
    ("MaxPool3d", dict(kernel_size=2, padding=1), (2, 2, 5, 4, 5)),
    ("AvgPool1d", dict(kernel_size=4, stride=3, padding=2, ceil_mode=True, count_include_pad=False), (2, 3, 10)),
    ("AvgPool2d", dict(kernel_size=3, stride=2, padding=1), (2, 3, 9, 8)),
    ("AvgPool2d", dict(kernel_size=3, stride=2, padding=1, divisor_override=4), (2, 3, 9, 8)),
    ("AvgPool3d", dict(kernel_size=2), (2, 2, 4, 4, 6)),
    ("AdaptiveAvgPool1d", dict(output_size=3), (2, 3, 10)),
    ("AdaptiveAvgPool2d", dict(output_size=(3, None)), (2, 3, 7, 5)),
    ("AdaptiveAvgPool2d", dict(output_size=1), (2, 3, 7, 5)),
    ("AdaptiveAvgPool3d", dict(output_size=(2, 1, 3)), (1, 2, 5, 4, 7)),
]
MODULE_IDS = [f"{name}-{i}" for i, (name, _, _) in enumerate(MODULES)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", MODULES, ids=MODULE_IDS)
def test_module_forward_matches_torch(case, dtype):
    name, kwargs, shape = case
    x = sample(shape, dtype, 0)
    expected = getattr(torch.nn, name)(**kwargs)(torch.tensor(x)).numpy()
    m = getattr(tl.nn, name)(**kwargs).to(np.dtype(dtype).name)
    np.testing.assert_allclose(m.predict(x), expected, **tol(dtype))
    unbatched = getattr(tl.nn, name)(**kwargs).to(np.dtype(dtype).name).predict(x[0])  # (C, *spatial) as PyTorch allows
    np.testing.assert_allclose(unbatched, expected[0], **tol(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_global_avg_pool(dtype):
    x = sample((3, 5, 6, 7), dtype, 0)
    out = tl.nn.GlobalAvgPool2d().to(np.dtype(dtype).name).predict(x)
    assert out.shape == (3, 5)
    expected = torch.flatten(torch.nn.AdaptiveAvgPool2d(1)(torch.tensor(x)), 1).numpy()
    np.testing.assert_allclose(out, expected, **tol(dtype))


# ---- bad input ---------------------------------------------------------------------------------

def test_input_too_small_names_layer_and_shapes():
    with pytest.raises(ValueError, match=r"MaxPool2d: input \(1, 2, 1, 5\) is too small for kernel_size \(2, 2\)"
                                         r".*at least \(2, 2\)"):
        tl.nn.MaxPool2d(2).predict(np.zeros((1, 2, 1, 5), np.float32))
    with pytest.raises(ValueError, match=r"AvgPool1d: input \(2, 3, 2\) is too small for kernel_size \(3,\)"):
        tl.nn.AvgPool1d(3).predict(np.zeros((2, 3, 2), np.float32))
    with pytest.raises(ValueError, match=r"max_pool2d: input \(1, 1, 2, 2\) is too small for kernel_size \(3, 3\)"):
        run("max_pool", [np.zeros((1, 1, 2, 2))], {"kernel_size": [3]}, None)


def test_wrong_rank_names_layer_and_shapes():
    with pytest.raises(ValueError, match=r"MaxPool2d: expected input of shape \(N, C, H, W\) or \(C, H, W\), "
                                         r"got \(4, 4\)"):
        tl.nn.MaxPool2d(2).predict(np.zeros((4, 4), np.float32))
    with pytest.raises(ValueError, match=r"AdaptiveAvgPool2d: expected input of shape \(N, C, H, W\)"):
        tl.nn.AdaptiveAvgPool2d(2).predict(np.zeros((1, 2, 3, 4, 5), np.float32))
    with pytest.raises(ValueError, match=r"GlobalAvgPool2d: expected input of shape \(N, C, H, W\), got \(2, 3, 4\)"):
        tl.nn.GlobalAvgPool2d().predict(np.zeros((2, 3, 4), np.float32))


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"MaxPool2d: padding should be at most half of kernel size"):
        tl.nn.MaxPool2d(3, padding=2)
    with pytest.raises(ValueError, match=r"AvgPool2d: divisor_override must be positive"):
        tl.nn.AvgPool2d(2, divisor_override=0)
    assert tl.nn.MaxPool2d(2, return_indices=True).return_indices  # supported: tests/test_max_unpool.py
    with pytest.raises(ValueError, match=r"AdaptiveAvgPool2d: output_size must be an int or a tuple of 2 ints"):
        tl.nn.AdaptiveAvgPool2d((1, 2, 3))
    with pytest.raises(ValueError, match=r"avg_pool2d: kernel_size must be >= 1"):
        run("avg_pool", [np.zeros((1, 1, 4, 4))], {"kernel_size": [0]}, None)
