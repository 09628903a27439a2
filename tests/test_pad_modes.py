"""F.pad's reflect / replicate / circular modes and Conv padding_mode, against torch in float64:
values, input gradients and conv parameter gradients."""
import numpy as np
import pytest
import torch

import treadle as tl
import treadle.functional as F
from opcheck import assert_grads_like_torch

CASES = [((2, 3, 6), (2, 1)), ((2, 3, 6), (0, 3)), ((2, 2, 5, 6), (1, 2, 2, 0)), ((1, 2, 4, 5), (3, 3, 1, 1))]


def _input_grad(forward, x, seed):
    class Net(tl.nn.Module):
        def forward(self, x):
            return forward(x)

    trainer = tl.Trainer(Net().double(), tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    out = trainer.forward(x, input_grad=True)
    return out, trainer.backward(seed, input_grad=True)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("shape,pad", CASES)
def test_pad_modes_are_torchs(mode, shape, pad):
    x = np.random.default_rng(0).standard_normal(shape)
    tx = torch.tensor(x, requires_grad=True)
    ref = torch.nn.functional.pad(tx, pad, mode=mode)
    seed = np.random.default_rng(1).standard_normal(ref.shape)
    out, grad = _input_grad(lambda s: F.pad(s, pad, mode=mode), x, seed)
    np.testing.assert_array_equal(out, ref.detach().numpy())
    ref.backward(torch.tensor(seed))
    np.testing.assert_allclose(grad, tx.grad.numpy(), rtol=1e-14, atol=1e-15)  # sums of copies


def test_pad_mode_refusals():
    class Net(tl.nn.Module):
        def __init__(self, pad, mode):
            super().__init__()
            self.pad, self.mode = pad, mode

        def forward(self, x):
            return F.pad(x, self.pad, mode=self.mode)

    x = np.zeros((1, 2, 4), np.float32)
    with pytest.raises(ValueError, match=r"needs pads in \[0, 3\]"):
        Net((4, 0), "reflect").eval()(x)
    with pytest.raises(ValueError, match="mode must be"):
        Net((1, 1), "symmetric").eval()(x)
    with pytest.raises(ValueError, match="value is for mode 'constant'"):
        F.pad(None, (1, 1), mode="reflect", value=2.0)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("nd,padding", [(1, 2), (2, (1, 2)), (2, "same")])
def test_conv_padding_mode_is_torchs(mode, nd, padding):
    torch.manual_seed(0)
    conv_t = getattr(torch.nn, f"Conv{nd}d")(2, 3, 3, padding=padding, padding_mode=mode).double()
    net = tl.nn.Sequential(getattr(tl.nn, f"Conv{nd}d")(2, 3, 3, padding=padding, padding_mode=mode)).double()
    tl.io.from_torch(torch.nn.Sequential(conv_t), net)
    x = np.random.default_rng(2).standard_normal((2, 2) + (7,) * nd)
    ref = conv_t(torch.tensor(x))
    np.testing.assert_allclose(net.eval()(x), ref.detach().numpy(), rtol=1e-12, atol=1e-13)
    seed = np.random.default_rng(3).standard_normal(ref.shape)
    trainer = tl.Trainer(net, lambda out, y: (out * y).sum(), tl.optim.SGD(lr=0.0))
    trainer.compute_gradients(x, seed)
    (ref * torch.tensor(seed)).sum().backward()
    assert_grads_like_torch(net, conv_t, prefix="0.", rtol=1e-11)
    assert net[0].config()["padding_mode"] == mode


def test_onnx_export_refuses_a_padding_mode(tmp_path):
    pytest.importorskip("onnx")
    net = tl.nn.Sequential(tl.nn.Conv1d(1, 1, 3, padding=1, padding_mode="reflect"))
    with pytest.raises(NotImplementedError, match="padding_mode='reflect'"):
        tl.io.export_onnx(net, str(tmp_path / "m.onnx"), input_shape=(1, 1, 8))
