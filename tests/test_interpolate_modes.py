"""F.interpolate / nn.Upsample beyond 4-D nearest and bilinear: 3-D nearest, nearest-exact and linear, 5-D
nearest, nearest-exact and trilinear, 4-D nearest-exact and bicubic, area at every rank; values and input gradients against torch in float64."""
import numpy as np
import pytest
import torch

import treadle as tl
import treadle.functional as F

CASES = [
    ((2, 3, 7), "nearest", {"size": 11}), ((2, 3, 7), "nearest", {"scale_factor": 1.7}),
    ((2, 3, 7), "linear", {"size": 12}), ((2, 3, 7), "linear", {"scale_factor": 2.5, "align_corners": True}),
    ((2, 3, 7), "linear", {"size": 4, "align_corners": False}),
    ((1, 2, 3, 4, 5), "nearest", {"size": (5, 6, 7)}), ((1, 2, 3, 4, 5), "nearest", {"scale_factor": 2}),
    ((1, 2, 3, 4, 5), "trilinear", {"size": (4, 7, 6)}),
    ((1, 2, 3, 4, 5), "trilinear", {"scale_factor": (2.0, 1.5, 0.6), "align_corners": True}),
    ((1, 2, 3, 4, 5), "trilinear", {"scale_factor": 1.5, "recompute_scale_factor": True}),
    ((2, 3, 9), "area", {"size": 4}), ((2, 2, 6, 8), "area", {"scale_factor": 0.5}),
    ((1, 2, 6, 5, 7), "area", {"size": (3, 2, 4)}),
    ((2, 3, 7), "nearest-exact", {"size": 11}), ((2, 3, 7), "nearest-exact", {"scale_factor": 0.6}),
    ((2, 2, 5, 6), "nearest-exact", {"scale_factor": (1.5, 0.7)}),
    ((1, 2, 3, 4, 5), "nearest-exact", {"size": (5, 3, 7)}),
    ((2, 2, 4, 5), "bicubic", {"size": (7, 3)}), ((2, 2, 4, 5), "bicubic", {"scale_factor": 1.5, "align_corners": True}),
    ((2, 2, 4, 5), "bicubic", {"scale_factor": 1.7, "recompute_scale_factor": True}),
]


def _ours(shape, mode, kw, x, seed):
    class Net(tl.nn.Module):
        def forward(self, x):
            return F.interpolate(x, mode=mode, **kw)

    trainer = tl.Trainer(Net().double(), tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    out = trainer.forward(x, input_grad=True)
    return out, trainer.backward(seed, input_grad=True)


@pytest.mark.parametrize("shape,mode,kw", CASES)
def test_interpolate_is_torchs(shape, mode, kw):
    x = np.random.default_rng(0).standard_normal(shape)
    tx = torch.tensor(x, requires_grad=True)
    ref = torch.nn.functional.interpolate(tx, mode=mode, **kw)
    seed = np.random.default_rng(1).standard_normal(ref.shape)
    out, grad = _ours(shape, mode, kw, x, seed)
    np.testing.assert_allclose(out, ref.detach().numpy(), rtol=1e-12, atol=1e-13)
    ref.backward(torch.tensor(seed))
    np.testing.assert_allclose(grad, tx.grad.numpy(), rtol=1e-11, atol=1e-12)
    module = tl.nn.Sequential(tl.nn.Upsample(mode=mode, **kw)).double().eval()
    np.testing.assert_allclose(module(x), ref.detach().numpy(), rtol=1e-12, atol=1e-13)


def test_modes_and_ranks_are_checked():
    with pytest.raises(ValueError, match="mode 'bicubic' does not take 3 sizes or factors"):
        tl.nn.Upsample(scale_factor=(2, 2, 2), mode="bicubic")

    class Cubic(tl.nn.Module):
        def forward(self, x):
            return F.interpolate(x, scale_factor=2, mode="bicubic")

    with pytest.raises(ValueError, match="'bicubic' does not take 5-D input"):
        Cubic().eval()(np.zeros((1, 1, 2, 2, 2), np.float32))
    with pytest.raises(ValueError, match="positive"):
        tl.nn.Upsample(size=(2, 0, 3), mode="trilinear")

    class Net(tl.nn.Module):
        def forward(self, x):
            return F.interpolate(x, scale_factor=2, mode="linear")

    with pytest.raises(ValueError, match="'linear' does not take 4-D input"):
        Net().eval()(np.zeros((1, 1, 2, 2), np.float32))
