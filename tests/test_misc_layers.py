"""Small layers: Upsample (nearest, nearest-exact, bilinear, bicubic), OutputTransform, Unflatten, Identity.

Ops against PyTorch (forward and gradients, float32 and float64) and float64 finite differences;
layers through models (predict, training-mode forward/backward) against torch; bad input.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import treadle as tl
from opcheck import BACKENDS, gradcheck, run, tol, torch_grads

DTYPES = [np.float32, np.float64]
DT_IDS = ["f32", "f64"]


def sample(shape, dtype, seed=0, scale=1.0):
    return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(dtype)


def layer_grads(mod, x, gy):
    """Training-mode forward and input gradient of a treadle layer (through a Trainer's host-driven phases)."""
    trainer = tl.Trainer(mod, tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    y = trainer.forward(x, input_grad=True)
    return y, trainer.backward(gy, input_grad=True)


def scaled_tol(dtype, ref, mode):
    """tol(dtype), but in float32 bicubic the absolute tolerance scales with the largest reference
    value: each output (and each gradient element) sums 16 taps with weights of both signs (the cubic's
    negative lobes), so rounding error follows the values' magnitude, not the element's; it also
    depends on the compiler's FMA contraction (native and portable builds differ by ~1e-6)."""
    t = tol(dtype)
    if mode == "bicubic" and np.dtype(dtype) == np.float32:
        t["atol"] = max(t["atol"], 1e-5 * float(np.abs(ref).max()))
    return t


def check_parameter_free_layer(mod, tfn, x, dtype, mode=None):
    """predict, training forward and input gradient against a torch function."""
    mod.to(np.dtype(dtype).name)  # parameter-free: the model's dtype is float32 unless converted
    xt = torch.tensor(x, requires_grad=True)
    yt = tfn(xt)
    np.testing.assert_allclose(mod.predict(x), yt.detach().numpy(), **scaled_tol(dtype, yt.detach().numpy(), mode),
                               err_msg="predict")
    gy = sample(yt.shape, dtype, 9)
    yt.backward(torch.tensor(gy))
    y, dx = layer_grads(mod, x, gy)
    np.testing.assert_allclose(y, yt.detach().numpy(), **scaled_tol(dtype, yt.detach().numpy(), mode),
                               err_msg="training forward")
    np.testing.assert_allclose(dx, xt.grad.numpy(), **scaled_tol(dtype, xt.grad.numpy(), mode), err_msg="input gradient")


# ------------------------------------------------------------------------------------------------- Upsample
# (id, input shape, mode, size, scale_factor, align_corners)
UP_CASES = [
    ("nearest_x2", (2, 3, 3, 4), "nearest", None, 2, None),
    ("nearest_x3", (1, 2, 3, 3), "nearest", None, 3, None),
    ("nearest_x1.5", (1, 2, 4, 5), "nearest", None, 1.5, None),
    ("nearest_x2x3", (1, 2, 3, 4), "nearest", None, (2, 3), None),
    ("nearest_size", (2, 2, 3, 4), "nearest", (5, 7), None, None),
    ("nearest_down", (1, 2, 5, 7), "nearest", (2, 3), None, None),
    ("bilinear_x2", (2, 3, 3, 4), "bilinear", None, 2, False),
    ("bilinear_x2_ac", (2, 3, 3, 4), "bilinear", None, 2, True),
    ("bilinear_x1.7", (1, 2, 4, 5), "bilinear", None, 1.7, None),
    ("bilinear_size", (2, 2, 3, 4), "bilinear", (5, 7), None, False),
    ("bilinear_size_ac", (2, 2, 3, 4), "bilinear", (5, 7), None, True),
    ("bilinear_down", (1, 2, 5, 7), "bilinear", (2, 3), None, False),
    ("bilinear_to_1x1_ac", (1, 2, 3, 4), "bilinear", (1, 1), None, True),
    ("bilinear_size_1_row", (1, 1, 1, 4), "bilinear", (3, 6), None, False),
    ("nearest_exact_x1.5", (1, 2, 4, 5), "nearest-exact", None, 1.5, None),
    ("nearest_exact_size", (2, 2, 3, 4), "nearest-exact", (5, 7), None, None),
    ("nearest_exact_down", (1, 2, 5, 7), "nearest-exact", (2, 3), None, None),
    ("bicubic_x2", (2, 3, 3, 4), "bicubic", None, 2, False),
    ("bicubic_x2_ac", (2, 3, 3, 4), "bicubic", None, 2, True),
    ("bicubic_x1.7", (1, 2, 4, 5), "bicubic", None, 1.7, None),
    ("bicubic_size_ac", (2, 2, 3, 4), "bicubic", (5, 7), None, True),
    ("bicubic_down", (1, 2, 5, 7), "bicubic", (2, 3), None, False),
    ("bicubic_same_size", (1, 2, 4, 5), "bicubic", (4, 5), None, False),
    ("bicubic_size_1_row", (1, 1, 1, 4), "bicubic", (3, 6), None, False),
]
# Scale factors whose ratio of sizes differs from the factor: recompute_scale_factor changes the result.
RECOMPUTE_CASES = [("nearest", (1, 2, 4, 5), 1.7, None), ("bilinear", (1, 2, 4, 5), 1.7, False),
                   ("bilinear", (2, 1, 3, 7), (2.5, 0.6), False)]
UP_IDS = [c[0] for c in UP_CASES]


def pair(v):
    return None if v is None else (tuple(v) if isinstance(v, tuple) else (v, v))


def up_attrs(case, x_shape):
    """The op's attributes as the Upsample layer derives them (torch's output size: floor(in * scale))."""
    _, _, mode, size, scale, ac = case
    s = pair(scale)
    out = list(pair(size)) if size is not None else [int(np.floor(x_shape[2] * s[0])), int(np.floor(x_shape[3] * s[1]))]
    attrs = {"size": out, "mode": mode, "align_corners": bool(ac)}
    if s is not None:
        attrs.update(scale_h=float(s[0]), scale_w=float(s[1]))
    return attrs


def torch_up(case):
    _, _, mode, size, scale, ac = case
    return lambda x: F.interpolate(x, size=pair(size), scale_factor=pair(scale), mode=mode, align_corners=ac)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("case", UP_CASES, ids=UP_IDS)
def test_upsample_op_vs_torch(case, dtype, backend):
    x = sample(case[1], dtype)
    attrs = up_attrs(case, x.shape)
    (y,), _ = run("upsample2d", [x], attrs, None, backend)
    gy = sample(y.shape, dtype, 1)
    (y,), (dx,) = run("upsample2d", [x], attrs, [gy], backend)
    (ref,), ref_grads = torch_grads(torch_up(case), [x], [gy], [0])
    np.testing.assert_allclose(y, ref, **scaled_tol(dtype, ref, case[2]))
    np.testing.assert_allclose(dx, ref_grads[0], **scaled_tol(dtype, ref_grads[0], case[2]))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", UP_CASES, ids=UP_IDS)
def test_upsample_gradcheck(case, backend):
    x = sample(case[1], np.float64)
    gradcheck("upsample2d", [x], up_attrs(case, x.shape), backend=backend)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("case", UP_CASES, ids=UP_IDS)
def test_upsample_layer_vs_torch(case, dtype):
    _, shape, mode, size, scale, ac = case
    layer = tl.nn.Upsample(size=size, scale_factor=scale, mode=mode, align_corners=ac)
    torch_layer = torch.nn.Upsample(size=size, scale_factor=scale, mode=mode, align_corners=ac)
    check_parameter_free_layer(layer, torch_layer, sample(shape, dtype), dtype, mode)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("case", RECOMPUTE_CASES, ids=str)
def test_upsample_recompute_scale_factor(case, dtype):
    mode, shape, scale, ac = case
    layer = tl.nn.Upsample(scale_factor=scale, mode=mode, align_corners=ac, recompute_scale_factor=True)
    ref = torch.nn.Upsample(scale_factor=scale, mode=mode, align_corners=ac, recompute_scale_factor=True)
    check_parameter_free_layer(layer, ref, sample(shape, dtype), dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "bilinear", "bicubic"])
def test_upsample_many_chunks_vs_torch(mode, backend):
    x = sample((3, 4, 70, 90), np.float64)
    case = ("large", x.shape, mode, None, 2, None)
    attrs = up_attrs(case, x.shape)
    gy = sample((3, 4, 140, 180), np.float64, 1)
    (y,), (dx,) = run("upsample2d", [x], attrs, [gy], backend)
    (ref,), ref_grads = torch_grads(torch_up(case), [x], [gy], [0])
    np.testing.assert_allclose(y, ref, **tol(np.float64))
    np.testing.assert_allclose(dx, ref_grads[0], **tol(np.float64))


def test_upsample_errors():
    with pytest.raises(ValueError, match="Upsample: give exactly one of size and scale_factor"):
        tl.nn.Upsample(size=4, scale_factor=2)
    with pytest.raises(ValueError, match="Upsample: give exactly one of size and scale_factor"):
        tl.nn.Upsample()
    with pytest.raises(ValueError, match="align_corners can only be set with mode 'bilinear' or 'bicubic'"):
        tl.nn.Upsample(scale_factor=2, align_corners=True)
    with pytest.raises(ValueError, match="align_corners can only be set with mode 'bilinear' or 'bicubic'"):
        tl.nn.Upsample(scale_factor=2, mode="nearest-exact", align_corners=False)
    with pytest.raises(ValueError, match="Upsample: mode must be 'nearest', 'nearest-exact', 'bilinear' or 'bicubic' "
                                         "for 4-D input, got 'lanczos'"):
        tl.nn.Upsample(scale_factor=2, mode="lanczos")
    with pytest.raises(ValueError, match="scale_factor must be positive"):
        tl.nn.Upsample(scale_factor=0)
    with pytest.raises(ValueError, match=r"interpolate: mode 'nearest' does not take 2-D input"):
        tl.nn.Upsample(scale_factor=2).predict(np.zeros((2, 3), np.float32))  # 3- to 5-D: test_interpolate_modes
    with pytest.raises(ValueError, match=r"Upsample: output size \(0, 1\) is empty for input of shape \(1, 1, 1, 3\)"):
        tl.nn.Upsample(scale_factor=0.5).predict(np.zeros((1, 1, 1, 3), np.float32))
    with pytest.raises(ValueError, match=r"upsample2d: expected input of shape \(N, C, H, W\)"):
        run("upsample2d", [np.zeros((3, 4))], {"size": [2, 2], "mode": "nearest"})


# ------------------------------------------------------------------------------------------ OutputTransform
ACTS = {"identity": lambda t: t, "softplus": F.softplus, "sigmoid": torch.sigmoid, "tanh": torch.tanh}
CODES = {"identity": 0, "softplus": 1, "sigmoid": 2, "tanh": 3}

# (id, input shape, activations, scale/shift length D or 1)
OT_CASES = [
    ("per_output", (6, 4), ["identity", "softplus", "sigmoid", "tanh"], 4),
    ("one_activation", (6, 3), ["softplus"], 3),
    ("shared_scale", (5, 4), ["tanh", "sigmoid", "identity", "softplus"], 1),
    ("3d_input", (2, 3, 4), ["sigmoid", "softplus", "tanh", "identity"], 4),
    ("single_output", (7, 1), ["sigmoid"], 1),
]


def ot_inputs(case, dtype):
    _, shape, acts, n = case
    x = sample(shape, dtype, 0, 4.0)
    x.reshape(-1)[:4] = [25.0, 19.0, -30.0, 21.0][: x.size]  # both sides of softplus's threshold (20)
    return [x, sample((n,), dtype, 1, 2.0), sample((n,), dtype, 2)], {"activations": [CODES[a] for a in acts]}


def torch_ot(acts):
    def fn(x, scale, shift):
        d = x.shape[-1]
        cols = [ACTS[acts[j if len(acts) > 1 else 0]](x[..., j]) for j in range(d)]
        return torch.stack(cols, dim=-1) * scale + shift
    return fn


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("case", OT_CASES, ids=[c[0] for c in OT_CASES])
def test_output_transform_vs_torch(case, dtype, backend):
    inputs, attrs = ot_inputs(case, dtype)
    gy = sample(inputs[0].shape, dtype, 3)
    (y,), grads = run("output_transform", inputs, attrs, [gy], backend)
    (ref,), ref_grads = torch_grads(torch_ot(case[2]), inputs, [gy], [0, 1, 2])
    np.testing.assert_allclose(y, ref, **tol(dtype))
    for i in range(3):
        np.testing.assert_allclose(grads[i], ref_grads[i], **tol(dtype), err_msg=f"gradient of input {i}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", OT_CASES, ids=[c[0] for c in OT_CASES])
def test_output_transform_gradcheck(case, backend):
    inputs, attrs = ot_inputs(case, np.float64)
    (y,), _ = run("output_transform", inputs, attrs, None, backend)
    gradcheck("output_transform", inputs, attrs, atol=max(1e-9, 1e-9 * float(np.abs(y).sum())), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_output_transform_many_chunks_vs_torch(backend):
    case = ("large", (9000, 4), ["identity", "softplus", "sigmoid", "tanh"], 4)
    inputs, attrs = ot_inputs(case, np.float64)
    gy = sample(inputs[0].shape, np.float64, 3)
    (y,), grads = run("output_transform", inputs, attrs, [gy], backend)
    (ref,), ref_grads = torch_grads(torch_ot(case[2]), inputs, [gy], [0, 1, 2])
    np.testing.assert_allclose(y, ref, **tol(np.float64))
    for i in range(3):
        np.testing.assert_allclose(grads[i], ref_grads[i], **tol(np.float64), err_msg=f"gradient of input {i}")


def test_output_transform_layer_fixed_and_trains_the_rest():
    """The layer as the last stage of a model: predict and training steps equal torch's model with the
    same transform; scale and shift are saved but never trained."""
    scale, shift, acts = [2.0, 0.5, 3.0], [-1.0, 0.0, 1.0], ["sigmoid", "softplus", "tanh"]
    net = tl.nn.Sequential(tl.nn.Linear(5, 3, dtype="float64"), tl.nn.OutputTransform(scale, shift, acts,
                                                                                      dtype="float64"))
    assert sorted(net.state_dict()) == ["0.bias", "0.weight", "1.scale", "1.shift"]
    np.testing.assert_array_equal(net[1].scale, scale)
    lin = torch.nn.Linear(5, 3).double()
    net.load_state_dict({**{"0." + k: v for k, v in lin.state_dict().items()},
                         "1.scale": np.array(scale), "1.shift": np.array(shift)})
    ref = lambda x: torch_ot(acts)(lin(x), torch.tensor(scale), torch.tensor(shift))  # noqa: E731
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.2, weight_decay=0.0))
    topt = torch.optim.SGD(lin.parameters(), lr=0.2)
    rng = np.random.default_rng(0)
    for _ in range(4):
        x, y = rng.standard_normal((8, 5)), rng.standard_normal((8, 3))
        loss = trainer.step(x, y)
        topt.zero_grad()
        tloss = F.mse_loss(ref(torch.tensor(x)), torch.tensor(y))
        tloss.backward()
        topt.step()
        np.testing.assert_allclose(loss, tloss.item(), **tol(np.float64))
    np.testing.assert_allclose(net[0].weight, lin.weight.detach().numpy(), **tol(np.float64))
    np.testing.assert_array_equal(net[1].scale, scale)
    np.testing.assert_array_equal(net[1].shift, shift)
    with torch.no_grad():
        np.testing.assert_allclose(net.predict(x), ref(torch.tensor(x)).numpy(), **tol(np.float64))


def test_output_transform_bounds():
    """sigmoid maps into (shift, shift + scale), softplus into (shift, inf)."""
    t = tl.nn.OutputTransform(scale=[4.0, 1.0], shift=[-2.0, 3.0], activations=["sigmoid", "softplus"])
    y = t.predict(sample((100, 2), np.float32, 0, 3.0))
    assert (y[:, 0] > -2).all() and (y[:, 0] < 2).all() and (y[:, 1] > 3).all()
    scalar = tl.nn.OutputTransform(scale=2.0, shift=1.0, activations="tanh")  # one setting for every output
    np.testing.assert_allclose(scalar.predict(np.zeros((3, 5), np.float32)), np.ones((3, 5)))


def test_output_transform_errors():
    with pytest.raises(ValueError, match="OutputTransform: unknown activation 'relu'"):
        tl.nn.OutputTransform(1.0, 0.0, "relu")
    with pytest.raises(ValueError, match="OutputTransform: scale, shift and activations must have length 1 or 3"):
        tl.nn.OutputTransform([1.0, 2.0, 3.0], [0.0, 1.0], "identity")
    with pytest.raises(ValueError, match=r"OutputTransform: expected input of shape \(N, 3\), got \(2, 4\)"):
        tl.nn.OutputTransform([1.0, 2.0, 3.0], 0.0, "identity").predict(np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match="scale must be finite"):
        tl.nn.OutputTransform([np.inf], 0.0, "identity")
    with pytest.raises(ValueError, match=r"output_transform: scale of shape \(3,\) does not match input of shape"):
        run("output_transform", [np.zeros((2, 4)), np.ones(3), np.ones(4)], {"activations": [0]})
    with pytest.raises(ValueError, match="output_transform: activation code 7"):
        run("output_transform", [np.zeros((2, 4)), np.ones(4), np.ones(4)], {"activations": [7]})


# ------------------------------------------------------------------------------------- Unflatten, Identity
UNFLATTEN_CASES = [((2, 12), 1, (3, 4)), ((2, 12), -1, (2, -1, 3)), ((2, 6, 5), 1, (2, 3)), ((6, 5), 0, (3, 2))]


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("case", UNFLATTEN_CASES, ids=str)
def test_unflatten_vs_torch(case, dtype):
    shape, dim, sizes = case
    check_parameter_free_layer(tl.nn.Unflatten(dim, sizes), torch.nn.Unflatten(dim, sizes), sample(shape, dtype), dtype)


def test_unflatten_and_identity_in_models():
    net = tl.nn.Sequential(tl.nn.Identity(), tl.nn.Linear(6, 12), tl.nn.Unflatten(1, (3, 4)), tl.nn.Identity())
    x = sample((5, 6), np.float32)
    y = net.predict(x)
    w, b = net[1].weight, net[1].bias
    np.testing.assert_allclose(y, (x @ w.T + b).reshape(5, 3, 4), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"Unflatten: sizes \(5, 2\) do not fit dimension 1 of size 12 "
                                         r"\(input of shape \(5, 12\)\)"):
        tl.nn.Sequential(tl.nn.Linear(6, 12), tl.nn.Unflatten(1, (5, 2))).predict(x)
    with pytest.raises(ValueError, match=r"Unflatten: dim 3 out of range for input of shape \(5, 6\)"):
        tl.nn.Unflatten(3, (2, 3)).predict(x)
    with pytest.raises(ValueError, match="Unflatten: only one size may be -1"):
        tl.nn.Unflatten(1, (-1, -1))
