"""torch.nn.utils' clipping on the model's parameters, and a submodule's parameters() and state_dict()
as torch code uses them once the whole model is compiled."""
import numpy as np
import pytest
import torch

import treadle as tl


def _build(self, nn):
    self.base = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
    self.head = nn.Linear(8, 2)


def _forward(self, x):
    return self.head(self.base(x))


class TorchNet(torch.nn.Module):
    forward = _forward

    def __init__(self):
        super().__init__()
        _build(self, torch.nn)


class TreadleNet(tl.nn.Module):
    forward = _forward

    def __init__(self):
        super().__init__()
        _build(self, tl.nn)


def _pair():
    torch.manual_seed(0)
    ref, net = TorchNet().double(), TreadleNet().double()
    tl.io.from_torch(ref, net)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((16, 4)), 10 * rng.standard_normal((16, 2))
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(net.parameters(), lr=0.0))
    trainer.compute_gradients(x, y)
    torch.nn.functional.mse_loss(ref(torch.tensor(x)), torch.tensor(y)).backward()
    return net, ref


@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
def test_clip_grad_norm_is_torchs(norm_type):
    net, ref = _pair()
    ours = tl.nn.utils.clip_grad_norm_(net.head.parameters(), 0.5, norm_type=norm_type)
    theirs = torch.nn.utils.clip_grad_norm_(ref.head.parameters(), 0.5, norm_type=norm_type)
    assert ours == pytest.approx(theirs.item(), rel=1e-12)
    grads = net.named_gradients()
    for name, p in ref.named_parameters():  # the head's clipped, the base's untouched
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=1e-12, atol=1e-15, err_msg=name)


def test_clip_grad_value_is_torchs():
    net, ref = _pair()
    tl.nn.utils.clip_grad_value_(net.parameters(), 0.1)
    torch.nn.utils.clip_grad_value_(ref.parameters(), 0.1)
    grads = net.named_gradients()
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=1e-12, atol=1e-15, err_msg=name)
        assert np.abs(grads[name]).max() == pytest.approx(0.1)  # some entries were clipped


def test_gradient_clippers_refuse_parameters():
    net, _ = _pair()
    before = net.state_dict()
    with pytest.raises(TypeError, match="tl.nn.utils.clip_grad_value_"):
        tl.optim.clip_grad_value_(net.parameters(), 0.1)
    with pytest.raises(TypeError, match="tl.nn.utils.clip_grad_norm_"):
        tl.optim.clip_grad_norm_(net.head.weight, 0.1)
    with pytest.raises(TypeError, match="not a model parameter"):
        tl.nn.utils.clip_grad_norm_([np.zeros(3)], 1.0)
    for name, value in net.state_dict().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)


def test_submodule_parameters_and_state_dict_after_compile():
    net, ref = _pair()
    views = net.head.parameters()
    assert all(np.shares_memory(v, net.flat_parameters()) for v in views)
    assert list(net.head.state_dict()) == list(ref.head.state_dict())
    for name, value in ref.head.state_dict().items():
        np.testing.assert_array_equal(net.head.state_dict()[name], value.numpy())
    net.head.load_state_dict({"weight": np.ones((2, 8)), "bias": np.zeros(2)})
    np.testing.assert_array_equal(net.state_dict()["head.weight"], np.ones((2, 8)))
    with pytest.raises(ValueError, match="shape"):
        net.head.load_state_dict({"weight": np.ones((3, 8)), "bias": np.zeros(2)})
    with pytest.raises(ValueError, match="missing key 'bias'"):
        net.head.load_state_dict({"weight": np.ones((2, 8))})
    np.testing.assert_array_equal(net.head.weight, np.ones((2, 8)))  # refusals wrote nothing


def test_submodule_parameters_before_the_model_compiles():
    net = TreadleNet()
    groups = [{"params": net.base.parameters()}, {"params": net.head.parameters(), "lr": 1e-3}]
    opt = tl.optim.SGD(groups, lr=1e-2)
    tl.Trainer(net, tl.loss.MSE(), opt)  # the root compiles now; the base and head never did alone
    assert [g for _, _, g in opt._native.segments()] == [0, 1]
