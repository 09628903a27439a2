"""Convolutions: ops against PyTorch (float32, float64) and float64 finite differences, the modules
(parameters, initialisation, forward), bad input, and a small CNN trained side by side with PyTorch.

Tolerances: float64 as opcheck.tol (~1e-12). float32 forward and gradients use rtol 1e-4 and an
atol of 1e-5 times the largest expected magnitude (at least 1e-5) instead of 1e-5 / 1e-6: a
convolution sums C*k products (N*L for the weight gradient, thousands in the larger cases), and our
GEMM order differs from PyTorch's, so float32 rounding differences grow with the sum length and an
entry that cancels to a small value keeps the absolute error of its large terms.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import treadle as tl
from opcheck import BACKENDS, gradcheck, run, tol, torch_grads

# PyTorch warns that padding='same' with an even kernel copies the input; that is its business.
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same'")


def conv_tol(dtype, expected=None):
    if np.dtype(dtype) != np.float32:
        return tol(dtype)
    scale = 1.0 if expected is None else max(1.0, float(np.abs(expected).max(initial=0.0)))
    return dict(rtol=1e-4, atol=1e-5 * scale)


def assert_close(actual, expected, dtype, what=""):
    np.testing.assert_allclose(actual, expected, **conv_tol(dtype, expected), err_msg=what)


def sample(shape, dtype, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# (id, x shape, w shape, options). Options use PyTorch's names; "padding" may be "same".
CONV_CASES = [
    ("1d_basic", (2, 3, 9), (4, 3, 3), {}),
    ("1d_stride_pad_dil", (2, 3, 11), (4, 3, 3), dict(stride=2, padding=2, dilation=2)),
    ("1d_groups", (2, 4, 8), (6, 2, 3), dict(groups=2, padding=1)),
    ("1d_same_even", (2, 2, 9), (3, 2, 4), dict(padding="same")),
    ("2d_basic", (2, 3, 7, 6), (4, 3, 3, 3), dict(padding=1)),
    ("2d_stride", (2, 3, 9, 8), (5, 3, 3, 3), dict(stride=2, padding=1)),
    ("2d_asym", (2, 2, 9, 7), (3, 2, 3, 2), dict(stride=(2, 1), padding=(1, 0))),
    ("2d_dilation", (1, 2, 9, 9), (3, 2, 3, 3), dict(dilation=(2, 3), padding=(2, 1))),
    ("2d_stride3_pad", (2, 2, 10, 9), (2, 2, 2, 4), dict(stride=3, padding=(1, 2))),
    ("2d_groups", (2, 4, 6, 6), (6, 2, 3, 3), dict(groups=2, padding=1)),
    ("2d_depthwise", (2, 3, 6, 5), (3, 1, 3, 3), dict(groups=3)),
    ("2d_pointwise", (2, 4, 5, 5), (3, 4, 1, 1), {}),
    ("2d_pointwise_stride", (2, 4, 5, 5), (3, 4, 1, 1), dict(stride=2)),
    ("2d_no_bias", (2, 3, 6, 6), (2, 3, 3, 3), dict(bias=False, padding=1)),
    ("2d_same_even", (2, 2, 7, 6), (3, 2, 4, 2), dict(padding="same")),
    ("2d_same_dilated", (1, 2, 8, 7), (2, 2, 3, 4), dict(padding="same", dilation=2)),
    ("2d_kernel_eq_input", (2, 2, 3, 4), (3, 2, 3, 4), {}),
    ("3d_basic", (2, 2, 5, 6, 4), (3, 2, 3, 3, 2), dict(padding=(1, 1, 0))),
    ("3d_stride_dil_groups", (1, 4, 7, 7, 6), (4, 2, 3, 2, 2), dict(stride=(2, 1, 2), dilation=(1, 2, 1),
                                                                        groups=2, padding=1)),
]
# Larger problems for the work split: several im2col tiles per sample (whole rows and rows cut
# mid-way) and more samples than parallel slots. Checked against PyTorch only.
BIG_CASES = [
    ("2d_tiles_rows", (2, 16, 32, 32), (4, 16, 3, 3), dict(padding=1)),
    ("2d_tiles_midrow", (1, 16, 3, 1000), (2, 16, 3, 3), dict(padding=1)),
    ("2d_batch40_groups", (40, 4, 6, 6), (4, 2, 3, 3), dict(groups=2)),
]


def same_padding(w_shape, dilation, nd):
    d = [dilation] * nd if isinstance(dilation, int) else list(dilation)
    total = [di * (k - 1) for di, k in zip(d, w_shape[2:])]
    return [t // 2 for t in total], [t - t // 2 for t in total]


def conv_attrs(x_shape, w_shape, opts):
    nd = len(x_shape) - 2
    a = {k: (list(v) if isinstance(v, tuple) else [v]) for k, v in opts.items()
         if k in ("stride", "padding", "dilation") and v != "same"}
    a["groups"] = opts.get("groups", 1)
    if opts.get("padding") == "same":
        a["padding"], a["padding_end"] = same_padding(w_shape, opts.get("dilation", 1), nd)
    return a


def torch_conv(nd, opts):
    fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    kw = {k: v for k, v in opts.items() if k in ("stride", "padding", "dilation", "groups")}
    return lambda x, w, b=None: fn(x, w, b, **kw)


def conv_inputs(x_shape, w_shape, opts, dtype, seed=0):
    inputs = [sample(x_shape, dtype, seed), sample(w_shape, dtype, seed + 1)]
    if opts.get("bias", True):
        inputs.append(sample((w_shape[0],), dtype, seed + 2))
    return inputs


def check_conv_vs_torch(x_shape, w_shape, opts, dtype, backend):
    inputs = conv_inputs(x_shape, w_shape, opts, dtype)
    attrs = conv_attrs(x_shape, w_shape, opts)
    (y,), _ = run("conv", inputs, attrs, None, backend)
    gy = sample(y.shape, dtype, 7)
    (y,), grads = run("conv", inputs, attrs, [gy], backend)
    wrt = list(range(len(inputs)))
    (yt,), tgrads = torch_grads(torch_conv(len(x_shape) - 2, opts), inputs, [gy], wrt)
    assert_close(y, yt, dtype, "output")
    for i in wrt:
        assert_close(grads[i], tgrads[i], dtype, f"gradient of input {i}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CONV_CASES + BIG_CASES, ids=[c[0] for c in CONV_CASES + BIG_CASES])
def test_conv_matches_torch(case, dtype, backend):
    _, x_shape, w_shape, opts = case
    check_conv_vs_torch(x_shape, w_shape, opts, dtype, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_conv_gradcheck(case, backend):
    _, x_shape, w_shape, opts = case
    inputs = conv_inputs(x_shape, w_shape, opts, np.float64)
    gradcheck("conv", inputs, conv_attrs(x_shape, w_shape, opts), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CONV_CASES[:12:3], ids=[c[0] for c in CONV_CASES[:12:3]])
def test_conv_backward_weight_gradcheck(case, backend):
    """The weight-gradient op's own gradient rule (conv and conv_backward_data): second derivatives."""
    _, x_shape, w_shape, opts = case
    attrs = conv_attrs(x_shape, w_shape, opts)
    x = sample(x_shape, np.float64, 0)
    (y,), _ = run("conv", [x, sample(w_shape, np.float64, 1)], attrs, None, backend)
    attrs["kernel_size"] = list(w_shape[2:])
    gradcheck("conv_backward_weight", [x, sample(y.shape, np.float64, 2)], attrs, backend=backend)


# ---- transposed convolution (the conv_backward_data op run forward) ------------------------------

# (id, x shape, w shape (in, out/groups, *k), options)
TRANSPOSE_CASES = [
    ("2d_basic", (2, 4, 5, 5), (4, 3, 3, 3), {}),
    ("2d_stride_pad_outpad", (2, 4, 4, 5), (4, 2, 3, 3), dict(stride=2, padding=1, output_padding=1)),
    ("2d_dilation_groups", (2, 4, 4, 4), (4, 3, 3, 2), dict(stride=(1, 2), padding=(1, 0), dilation=(2, 1),
                                                            groups=2)),
    ("2d_outpad_ge_stride", (1, 2, 4, 4), (2, 2, 3, 3), dict(dilation=2, output_padding=1)),
    ("2d_no_bias", (2, 3, 3, 4), (3, 2, 2, 2), dict(stride=2, bias=False)),
    ("1d", (2, 3, 6), (3, 2, 4), dict(stride=3, padding=1, output_padding=2)),
    ("3d", (1, 2, 3, 3, 2), (2, 2, 2, 3, 2), dict(stride=2, padding=(0, 1, 0))),
]


def transpose_attrs(x_shape, w_shape, opts):
    nd = len(x_shape) - 2

    def dims(name, default):
        v = opts.get(name, default)
        return list(v) if isinstance(v, tuple) else [v] * nd

    s, p, op, d = dims("stride", 1), dims("padding", 0), dims("output_padding", 0), dims("dilation", 1)
    size = [(i - 1) * s_ - 2 * p_ + d_ * (k - 1) + o + 1
            for i, s_, p_, d_, k, o in zip(x_shape[2:], s, p, d, w_shape[2:], op)]
    return dict(stride=s, padding=p, padding_end=[a - b for a, b in zip(p, op)], dilation=d,
                groups=opts.get("groups", 1), input_size=size)


def torch_conv_transpose(nd, opts):
    fn = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[nd]
    kw = {k: v for k, v in opts.items() if k in ("stride", "padding", "output_padding", "groups", "dilation")}
    return lambda x, w, b=None: fn(x, w, b, **kw)


def transpose_inputs(x_shape, w_shape, opts, dtype):
    inputs = [sample(x_shape, dtype, 0), sample(w_shape, dtype, 1)]
    if opts.get("bias", True):
        inputs.append(sample((w_shape[1] * opts.get("groups", 1),), dtype, 2))
    return inputs


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", TRANSPOSE_CASES, ids=[c[0] for c in TRANSPOSE_CASES])
def test_conv_transpose_matches_torch(case, dtype, backend):
    _, x_shape, w_shape, opts = case
    inputs = transpose_inputs(x_shape, w_shape, opts, dtype)
    attrs = transpose_attrs(x_shape, w_shape, opts)
    (y,), _ = run("conv_backward_data", inputs, attrs, None, backend)
    gy = sample(y.shape, dtype, 7)
    (y,), grads = run("conv_backward_data", inputs, attrs, [gy], backend)
    wrt = list(range(len(inputs)))
    (yt,), tgrads = torch_grads(torch_conv_transpose(len(x_shape) - 2, opts), inputs, [gy], wrt)
    assert_close(y, yt, dtype, "output")
    for i in wrt:
        assert_close(grads[i], tgrads[i], dtype, f"gradient of input {i}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", TRANSPOSE_CASES, ids=[c[0] for c in TRANSPOSE_CASES])
def test_conv_transpose_gradcheck(case, backend):
    _, x_shape, w_shape, opts = case
    inputs = transpose_inputs(x_shape, w_shape, opts, np.float64)
    gradcheck("conv_backward_data", inputs, transpose_attrs(x_shape, w_shape, opts), backend=backend)


# ---- op-level bad input ------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_conv_op_errors(backend):
    x = np.zeros((2, 4, 8, 8))
    with pytest.raises(ValueError, match=r"conv2d: expected input with 3 channels .*\(2, 4, 8, 8\)"):
        run("conv", [x, np.zeros((8, 3, 3, 3))], {}, None, backend)
    with pytest.raises(ValueError, match=r"conv2d: spatial size \(2, 2\) .* too small for kernel \(3, 3\)"):
        run("conv", [np.zeros((1, 3, 2, 2)), np.zeros((8, 3, 3, 3))], {}, None, backend)
    with pytest.raises(ValueError, match=r"conv2d: groups=3 must divide the input channels, got 4"):
        run("conv", [x, np.zeros((6, 1, 3, 3))], {"groups": 3}, None, backend)
    with pytest.raises(ValueError, match=r"conv2d: bias must have shape \(8,\), got \(3,\)"):
        run("conv", [x, np.zeros((8, 4, 3, 3)), np.zeros(3)], {}, None, backend)
    with pytest.raises(ValueError, match=r"conv2d: stride must be >= 1"):
        run("conv", [x, np.zeros((8, 4, 3, 3))], {"stride": [0]}, None, backend)
    with pytest.raises(TypeError, match="conv"):
        run("conv", [x, np.zeros((8, 4, 3, 3), np.float32)], {}, None, backend)


# ---- modules -----------------------------------------------------------------------------------

MODULES = [
    ("Conv1d", dict(in_channels=4, out_channels=6, kernel_size=3, stride=2, padding=1, groups=2)),
    ("Conv2d", dict(in_channels=3, out_channels=8, kernel_size=(3, 2), padding="same", dilation=2)),
    ("Conv2d", dict(in_channels=3, out_channels=4, kernel_size=3, padding="valid", bias=False)),
    ("Conv3d", dict(in_channels=2, out_channels=4, kernel_size=(2, 3, 3), stride=(1, 2, 2), padding=1)),
    ("ConvTranspose1d", dict(in_channels=4, out_channels=2, kernel_size=3, stride=2, output_padding=1)),
    ("ConvTranspose2d", dict(in_channels=4, out_channels=6, kernel_size=3, stride=2, padding=1, output_padding=1,
                             groups=2)),
    ("ConvTranspose2d", dict(in_channels=3, out_channels=2, kernel_size=(2, 3), dilation=(1, 2), bias=False)),
    ("ConvTranspose3d", dict(in_channels=2, out_channels=3, kernel_size=2, stride=2)),
]
MODULE_IDS = [f"{name}-{i}" for i, (name, _) in enumerate(MODULES)]
INPUT_SPATIAL = {1: (11,), 2: (9, 8), 3: (5, 6, 6)}


def nd_of(name):
    return int(name[-2])


def pair(name, kwargs, dtype="float64"):
    """A treadle module and a PyTorch module with the same parameters."""
    tm = getattr(torch.nn, name)(**kwargs).to(getattr(torch, dtype))
    m = getattr(tl.nn, name)(**kwargs, dtype=dtype)
    m.load_state_dict(tm.state_dict())
    return m, tm


@pytest.mark.parametrize("case", MODULES, ids=MODULE_IDS)
def test_module_parameters_match_torch(case):
    name, kwargs = case
    m, tm = getattr(tl.nn, name)(**kwargs), getattr(torch.nn, name)(**kwargs)
    ours = {k: v.shape for k, v in m.state_dict().items()}
    assert ours == {k: tuple(v.shape) for k, v in tm.state_dict().items()}
    assert m.weight.shape == tuple(tm.weight.shape)
    assert (m.bias is None) == (tm.bias is None)


@pytest.mark.parametrize("case", MODULES, ids=MODULE_IDS)
def test_module_default_init(case):
    """U(-1/sqrt(fan_in), +) for weight and bias, fan_in = weight.shape[1] * prod(kernel) as in PyTorch."""
    name, kwargs = case
    tl.manual_seed(0)
    m = getattr(tl.nn, name)(**kwargs)
    w = m.weight
    bound = 1.0 / np.sqrt(w.shape[1] * np.prod(w.shape[2:]))
    assert w.dtype == np.float32
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.5 * bound
    if m.bias is not None:
        assert np.abs(m.bias).max() <= bound
    big = getattr(tl.nn, name)(**{**kwargs, "in_channels": 32, "out_channels": 32})
    np.testing.assert_allclose(big.weight.std(), 1.0 / np.sqrt(3.0 * big.weight.shape[1] *
                                                              np.prod(big.weight.shape[2:])), rtol=0.1)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", MODULES, ids=MODULE_IDS)
def test_module_forward_matches_torch(case, dtype):
    name, kwargs = case
    m, tm = pair(name, kwargs, dtype)
    x = sample((3, kwargs["in_channels"]) + INPUT_SPATIAL[nd_of(name)], dtype, 5)
    with torch.no_grad():
        expected = tm(torch.tensor(x)).numpy()
    np.testing.assert_allclose(m.predict(x), expected, **conv_tol(dtype))


def test_unbatched_input():
    m, tm = pair("Conv2d", dict(in_channels=2, out_channels=3, kernel_size=3, padding=1))
    x = sample((2, 6, 5), np.float64, 0)
    with torch.no_grad():
        expected = tm(torch.tensor(x)).numpy()
    out = m.predict(x)
    assert out.shape == (3, 6, 5)
    np.testing.assert_allclose(out, expected, **tol(np.float64))


def test_functional_pools_in_a_forward():
    """tl.functional.max_pool2d / avg_pool2d / adaptive_avg_pool2d inside a custom module's forward."""
    w = sample((4, 2, 3, 3), np.float64, 1)

    class Net(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = tl.nn.Conv2d(2, 4, 3, dtype="float64")

        def forward(self, x):
            y = self.conv(x)
            f = tl.functional
            return f.adaptive_avg_pool2d(f.avg_pool2d(f.max_pool2d(y, 2, stride=1), 2, padding=1), (2, None))

    net = Net()
    net.load_state_dict({"conv.weight": w, "conv.bias": np.zeros(4)})
    x = sample((2, 2, 8, 8), np.float64, 0)
    t = F.max_pool2d(F.conv2d(torch.tensor(x), torch.tensor(w)), 2, stride=1)
    expected = F.adaptive_avg_pool2d(F.avg_pool2d(t, 2, padding=1), (2, None)).numpy()
    np.testing.assert_allclose(net.predict(x), expected, **tol(np.float64))


class TwoInputs(tl.nn.Module):
    """forward(x, w) -> a functional op of both: exercises tl.functional.conv*d on symbolic inputs."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x, w):
        return self.fn(x, w)


@pytest.mark.parametrize("name, x_shape, w_shape, kwargs", [
    ("conv1d", (2, 4, 9), (6, 2, 3), dict(stride=2, padding=1, groups=2)),
    ("conv2d", (2, 3, 7, 6), (4, 3, 4, 3), dict(padding="same", dilation=(1, 2))),
    ("conv2d", (2, 3, 7, 6), (4, 3, 3, 3), dict(padding="valid", stride=(2, 1))),
    ("conv3d", (1, 2, 4, 5, 5), (3, 2, 2, 3, 3), dict(padding=(0, 1, 1))),
    ("conv_transpose2d", (2, 4, 4, 5), (4, 3, 3, 3), dict(stride=2, padding=1, output_padding=1)),
])
def test_functional_conv_matches_torch(name, x_shape, w_shape, kwargs):
    x, w = sample(x_shape, np.float64, 0), sample(w_shape, np.float64, 1)
    ours = getattr(tl.functional, name)
    net = TwoInputs(lambda a, b: ours(a, b, **kwargs)).to("float64")
    expected = getattr(F, name)(torch.tensor(x), torch.tensor(w), **kwargs).numpy()
    np.testing.assert_allclose(net.predict([x, w]), expected, **tol(np.float64))


def test_functional_errors():
    net = TwoInputs(lambda a, b: tl.functional.conv2d(a, b, stride=2, padding="same")).to("float64")
    with pytest.raises(ValueError, match="conv2d: padding='same' is not supported for strided convolutions"):
        net.predict([np.zeros((1, 2, 5, 5)), np.zeros((2, 2, 3, 3))])
    net = TwoInputs(lambda a, b: tl.functional.conv2d(a, b)).to("float64")
    with pytest.raises(ValueError, match=r"conv2d: expected a batched input with 2 spatial dimensions"):
        net.predict([np.zeros((2, 5, 5)), np.zeros((2, 2, 3, 3))])


# ---- module-level bad input ---------------------------------------------------------------------

def test_wrong_channel_count_names_layer_and_shapes():
    m = tl.nn.Conv2d(3, 8, 3)
    with pytest.raises(ValueError, match=r"Conv2d: expected input of shape \(N, 3, H, W\), got \(2, 4, 8, 8\)"):
        m.predict(np.zeros((2, 4, 8, 8), np.float32))
    with pytest.raises(ValueError, match=r"Conv1d: expected input of shape \(N, 2, L\) or \(2, L\), got \(2, 2, 3, 4\)"):
        tl.nn.Conv1d(2, 2, 3).predict(np.zeros((2, 2, 3, 4), np.float32))
    with pytest.raises(ValueError, match=r"ConvTranspose2d: expected input of shape \(N, 4, H, W\), got \(1, 3, 5, 5\)"):
        tl.nn.ConvTranspose2d(4, 2, 3).predict(np.zeros((1, 3, 5, 5), np.float32))


def test_spatial_too_small_names_layer_and_shapes():
    with pytest.raises(ValueError, match=r"Conv2d: input \(1, 3, 4, 4\) is too small for kernel_size \(5, 5\)"
                                         r".*at least \(5, 5\)"):
        tl.nn.Conv2d(3, 8, 5).predict(np.zeros((1, 3, 4, 4), np.float32))
    with pytest.raises(ValueError, match=r"Conv3d: input \(1, 1, 2, 9, 9\) is too small.*at least \(3, 1, 1\)"):
        tl.nn.Conv3d(1, 1, 3, padding=(0, 1, 1)).predict(np.zeros((1, 1, 2, 9, 9), np.float32))


def test_bad_construction():
    with pytest.raises(ValueError, match=r"Conv2d: in_channels must be divisible by groups, got in_channels=5, groups=2"):
        tl.nn.Conv2d(5, 4, 3, groups=2)
    with pytest.raises(ValueError, match=r"Conv2d: out_channels must be divisible by groups, got out_channels=5"):
        tl.nn.Conv2d(4, 5, 3, groups=2)
    with pytest.raises(ValueError, match=r"ConvTranspose2d: in_channels must be divisible by groups"):
        tl.nn.ConvTranspose2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="padding='same' is not supported for strided convolutions"):
        tl.nn.Conv2d(2, 2, 3, stride=2, padding="same")
    with pytest.raises(ValueError, match="padding must be an int, a tuple, 'same' or 'valid'"):
        tl.nn.Conv2d(2, 2, 3, padding="full")
    with pytest.raises(ValueError, match="padding_mode must be 'zeros', 'reflect', 'replicate' or 'circular'"):
        tl.nn.Conv2d(2, 2, 3, padding_mode="symmetric")
    with pytest.raises(ValueError, match=r"Conv2d: kernel_size must be an int or a tuple of 2 ints"):
        tl.nn.Conv2d(2, 2, (3, 3, 3))
    with pytest.raises(ValueError, match=r"ConvTranspose2d: output_padding must be smaller than either stride or "
                                         r"dilation"):
        tl.nn.ConvTranspose2d(2, 2, 3, stride=2, output_padding=2)


# ---- a small CNN trained side by side with PyTorch -----------------------------------------------

def small_cnn(lib, dtype):
    nn = lib.nn
    kw = {"dtype": dtype}
    layers = [nn.Conv2d(1, 4, 3, padding=1, **kw), nn.ReLU(), nn.MaxPool2d(2),
              nn.Conv2d(4, 8, 3, padding=1, **kw), nn.ReLU(), nn.MaxPool2d(2),
              nn.Flatten(), nn.Linear(8 * 3 * 3, 5, **kw)]
    return nn.Sequential(*layers)


@pytest.mark.parametrize("optimizer", ["SGD", "Adam"])
def test_small_cnn_trains_like_torch(optimizer):
    if not hasattr(tl, "optim") or not hasattr(tl.optim, optimizer):
        pytest.skip(f"tl.optim.{optimizer} is not available in this build")
    torch.manual_seed(0)
    tmodel = small_cnn(torch, torch.float64)
    model = small_cnn(tl, "float64")
    model.load_state_dict(tmodel.state_dict())
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 1, 12, 12))
    y = rng.integers(0, 5, size=16)
    lr = 0.05 if optimizer == "SGD" else 1e-3
    topt = getattr(torch.optim, optimizer)(tmodel.parameters(), lr=lr)
    trainer = tl.Trainer(model, tl.loss.CrossEntropy(), getattr(tl.optim, optimizer)(lr=lr))
    tx, ty = torch.tensor(x), torch.tensor(y)
    ours, theirs = [], []
    for _ in range(100):
        topt.zero_grad()
        loss = F.cross_entropy(tmodel(tx), ty)
        loss.backward()
        topt.step()
        theirs.append(loss.item())
        ours.append(trainer.step(x, y))
    np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-12)
    assert theirs[-1] < theirs[0]


def test_parallel_executor_gives_bitwise_serial_results():
    """Work split over a host's workers (conv slots, pool planes) must not change a single bit."""
    from concurrent.futures import ThreadPoolExecutor

    def run(executor):
        tl.manual_seed(3)
        nn = tl.nn
        model = nn.Sequential(nn.Conv2d(2, 8, 3, padding=1, groups=2), nn.ReLU(), nn.MaxPool2d(2),
                              nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1), nn.ReLU(),
                              nn.AvgPool2d(3, stride=2, padding=1), nn.GlobalAvgPool2d(), nn.Linear(4, 3))
        trainer = tl.Trainer(model, tl.loss.CrossEntropy(), tl.optim.Adam(lr=1e-2), executor=executor)
        rng = np.random.default_rng(0)
        x = rng.standard_normal((24, 2, 10, 10)).astype(np.float32)
        y = rng.integers(0, 3, 24)
        losses = [trainer.step(x, y) for _ in range(5)]
        return losses, model.flat_parameters().copy()

    serial = run(None)
    with ThreadPoolExecutor(4) as pool:
        parallel = run(tl.PoolExecutor(pool, 4))
    assert serial[0] == parallel[0]
    np.testing.assert_array_equal(serial[1], parallel[1])
