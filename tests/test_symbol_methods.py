"""torch.Tensor's methods on traced symbols: a forward written for torch (view, transpose, chunk,
indexing, /, **, exp, mean(dim), ...) runs unchanged and matches torch's outputs and gradients."""
import numpy as np
import pytest
import torch

import treadle as tl
import treadle.functional as F
from conftest import CORE_TOL
from opcheck import param_grads


def torch_style_forward(self, x):
    """The same body runs on torch tensors and on treadle symbols."""
    b = x.size(0)
    h = self.fc(x.view(b, -1)).view(b, 3, 4)
    h = h.transpose(1, 2).contiguous()                 # (b, 4, 3)
    a, c = h.chunk(2, dim=1)                           # (b, 2, 3) each
    z = (a / (c.abs() + 1.0)) ** 2 + a.exp().log1p() - c.clamp(min=-0.5).sqrt().clamp(max=3)
    z = z.permute(0, 2, 1)[:, -1, ...].unsqueeze(1).squeeze(1)   # (b, 2)
    parts = z.split([1, 1], dim=1)
    w = (2.0 / (z * z + 1.0))[:, :1] - parts[1].pow(3) * 0.1 + z.reshape(b, 2, 1)[..., 0].mean(dim=-1, keepdim=True)
    return w + z.sum(dim=1, keepdim=True) + z.mean() + h[0, 1:3, None, :].sum() + x[:, 1, 2:].sum(1, True)


class Net(tl.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = tl.nn.Linear(12, 12)

    forward = torch_style_forward


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(12, 12)

    forward = torch_style_forward



@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_torch_forward_matches_torch_with_gradients(dtype, rng):
    torch.manual_seed(0)
    ref, net = TorchNet(), Net()
    if dtype == "float64":
        ref.double()
        net.double()
    net.load_state_dict(ref.state_dict())
    x = rng.standard_normal((5, 3, 4)).astype(dtype)
    g = rng.standard_normal((5, 1)).astype(dtype)
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    trainer.zero_grad()
    out = trainer.forward(x, input_grad=True)
    dx = trainer.backward(g, input_grad=True)
    tx = torch.tensor(x, requires_grad=True)
    tout = ref(tx)
    tout.backward(torch.from_numpy(g))
    np.testing.assert_allclose(out, tout.detach().numpy(), **CORE_TOL[dtype])
    np.testing.assert_allclose(dx, tx.grad.numpy(), **CORE_TOL[dtype])
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(param_grads(net)[name], p.grad.numpy(), err_msg=name, **CORE_TOL[dtype])


def _apply(fn, x):
    """fn traced in a parameter-free float64 module and predicted on x."""

    class Fn(tl.nn.Module):
        def forward(self, v):
            return fn(v)

    return Fn().double().predict(x)


X = np.arange(2 * 3 * 4, dtype=np.float64).reshape(2, 3, 4) - 7.5

INDEXING = [
    lambda v: v[0], lambda v: v[-1, 1], lambda v: v[:, -1], lambda v: v[..., 2], lambda v: v[1, ..., 1:3],
    lambda v: v[None, :, 1], lambda v: v[:, None, :, None, 0], lambda v: v[:, 1:100], lambda v: v[:, -2:],
    lambda v: v[:, 2:1], lambda v: v[1:2, :, ::1], lambda v: v[...], lambda v: v[0, 0, 0],
]


@pytest.mark.parametrize("index", INDEXING, ids=range(len(INDEXING)))
def test_indexing_matches_torch(index):
    expect = index(torch.tensor(X)).numpy()
    got = _apply(index, X)
    assert got.shape == expect.shape
    np.testing.assert_array_equal(got, expect)


SHAPE_METHODS = [
    lambda v: v.view(6, 4), lambda v: v.view((4, -1)), lambda v: v.reshape(-1), lambda v: v.flatten(),
    lambda v: v.flatten(1), lambda v: v.transpose(0, 2), lambda v: v.transpose(-1, -1), lambda v: v.permute(2, 0, 1),
    lambda v: v.permute((1, 2, 0)), lambda v: v.unsqueeze(-1), lambda v: v.unsqueeze(0).squeeze(),
    lambda v: v.squeeze(1), lambda v: v[:, :1].squeeze(1), lambda v: v.split(3, dim=2)[1],
    lambda v: v.split(2, dim=1)[-1], lambda v: v.chunk(3, dim=2)[-1], lambda v: v.chunk(2, 1)[0],
    lambda v: v[0].t(), lambda v: v.sum(), lambda v: v.sum((0, 2)), lambda v: v.mean(dim=[-1, 0], keepdim=True),
    lambda v: v.mean(1), lambda v: v.softmax(-1), lambda v: v.log_softmax(dim=1), lambda v: 3.0 / v,
    lambda v: 2.0 ** (v * 0.1), lambda v: abs(v) ** 0.5, lambda v: v.relu().sigmoid().tanh(),
    lambda v: v / 4.0 - v.clamp(-1, 1) + (v * 0.1).exp().log1p(),
]


@pytest.mark.parametrize("method", SHAPE_METHODS, ids=range(len(SHAPE_METHODS)))
def test_methods_match_torch(method):
    expect = method(torch.tensor(X)).numpy()
    got = _apply(method, X)
    assert got.shape == expect.shape
    np.testing.assert_allclose(got, expect, rtol=1e-14, atol=1e-15)


def test_size_dim_numel():
    seen = {}

    def probe(v):
        seen.update(size=v.size(), size1=v.size(1), dim=v.dim(), numel=v.numel())
        return v

    _apply(probe, X)
    assert seen == {"size": (2, 3, 4), "size1": 3, "dim": 3, "numel": 24}


def test_cat_takes_dim_with_torch_default_and_axis():
    a, b = X, X + 100
    np.testing.assert_array_equal(_apply(lambda v: F.cat([v, v + 100]), X), np.concatenate([a, b], 0))
    np.testing.assert_array_equal(_apply(lambda v: F.cat([v, v + 100], dim=2), X), np.concatenate([a, b], 2))
    np.testing.assert_array_equal(_apply(lambda v: F.cat([v, v + 100], axis=1), X), np.concatenate([a, b], 1))
    with pytest.raises(TypeError, match="cat: give dim or axis, not both"):
        _apply(lambda v: F.cat([v, v], dim=1, axis=1), X)


@pytest.mark.parametrize("fn, error, match", [
    (lambda v: v[0, 0, 0, 0], IndexError, "too many indices for a symbol of 3 dims: 4"),
    (lambda v: v[2], IndexError, "index 2 is out of range for dim 0 of size 2"),
    (lambda v: v[:, -4], IndexError, "index -4 is out of range for dim 1 of size 3"),
    (lambda v: v[::2], ValueError, "only step 1 is supported, got a step of 2 in dim 0"),
    (lambda v: v[..., ...], IndexError, "single ellipsis"),
    (lambda v: v[0.5], TypeError, "indices must be integers, slices, None or ..., got float"),
    (lambda v: v[v], TypeError, "indexing with a symbol is not supported"),
    (lambda v: v.view(2, 2.5), TypeError, "view: sizes must be integers, got float"),
    (lambda v: v.view(5, -1), ValueError, r"reshape: cannot reshape \(2, 3, 4\)"),
    (lambda v: v ** v, TypeError, r"\*\*: the exponent must be a Python number"),
    (lambda v: (-2.0) ** v, ValueError, "needs a positive base"),
    (lambda v: v / "a", TypeError, "expected a symbol or a Python number, got str"),
    (lambda v: v.split([1, 1], dim=1), ValueError, r"split: sizes \(1, 1\) sum to 2, but dimension 1 has size 3"),
    (lambda v: v.split(0, dim=1), ValueError, "split: split_size must be positive, got 0"),
    (lambda v: v.chunk(0), ValueError, "chunk: chunks must be positive, got 0"),
    (lambda v: v.sum((0, 0)), ValueError, r"sum: dim 0 appears more than once"),
    (lambda v: v.sum(3), ValueError, "sum"),
    (lambda v: v.mean(dim=[]), ValueError, "mean: dim is an empty sequence"),
    (lambda v: v.transpose(0, 3), ValueError, "transpose"),
    (lambda v: v.unsqueeze(4), ValueError, "unsqueeze"),
    (lambda v: v.permute(0, 1), ValueError, "permute"),
    (lambda v: v.t(), ValueError, "t: expects a symbol of at most 2 dims, got 3"),
])
def test_misuse_is_named(fn, error, match):
    with pytest.raises(error, match=match):
        _apply(fn, X)
