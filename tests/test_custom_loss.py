"""Custom losses: a function of the model's outputs and the target, traced into the training plan.
Losses and gradients match torch; a multi-output model with a built-in loss is refused, not trained
on output 0; misuse names the loss function."""
import numpy as np
import pytest
import torch

import treadle as tl
import treadle.functional as F
from opcheck import param_grads


class TwoHeads(tl.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = tl.nn.Linear(4, 8)
        self.mean = tl.nn.Linear(8, 3)
        self.scale = tl.nn.Linear(8, 3)

    def forward(self, x):
        h = F.tanh(self.body(x))
        return self.mean(h), self.scale(h)


class TorchTwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(4, 8)
        self.mean = torch.nn.Linear(8, 3)
        self.scale = torch.nn.Linear(8, 3)

    def forward(self, x):
        h = torch.tanh(self.body(x))
        return self.mean(h), self.scale(h)


def gaussian_nll(outputs, y):
    """The negative log-likelihood of y under N(mean, exp(log_sigma)**2): the same code runs on
    torch tensors and treadle symbols."""
    mean, log_sigma = outputs
    return (log_sigma + 0.5 * ((y - mean) / log_sigma.exp()) ** 2).mean() + 0.01 * (log_sigma ** 2).sum()


def _pair(seed=0):
    torch.manual_seed(seed)
    ref = TorchTwoHeads().double()
    net = TwoHeads().double()
    net.load_state_dict(ref.state_dict())
    return net, ref



def test_two_output_loss_and_gradients_match_torch(rng):
    net, ref = _pair()
    trainer = tl.Trainer(net, gaussian_nll, tl.optim.SGD(lr=0.1))
    x, y = rng.standard_normal((16, 4)), rng.standard_normal((16, 3))
    trainer.zero_grad()
    loss = trainer.compute_gradients(x, y)
    tloss = gaussian_nll(ref(torch.from_numpy(x)), torch.from_numpy(y))
    tloss.backward()
    np.testing.assert_allclose(loss, tloss.item(), rtol=1e-13)
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(param_grads(net)[name], p.grad.numpy(), rtol=1e-11, atol=1e-13, err_msg=name)
    np.testing.assert_allclose(trainer.evaluate(x, y), tloss.item(), rtol=1e-13)


def test_training_curve_matches_torch(rng):
    net, ref = _pair(seed=3)
    trainer = tl.Trainer(net, tl.loss.Custom(gaussian_nll), tl.optim.Adam(lr=1e-2))
    opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    x = rng.standard_normal((32, 4))
    y = np.sin(x[:, :3]) + 0.1 * rng.standard_normal((32, 3))
    ours, theirs = [], []
    for _ in range(50):
        ours.append(trainer.step(x, y))
        opt.zero_grad()
        loss = gaussian_nll(ref(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        theirs.append(loss.item())
    np.testing.assert_allclose(ours, theirs, rtol=1e-9)
    assert ours[-1] < ours[0] - 0.5


def test_a_built_in_loss_as_a_function_equals_the_loss_object(rng):
    net = tl.nn.Sequential(tl.nn.Linear(5, 4), tl.nn.ReLU(), tl.nn.Linear(4, 3)).double()
    x, labels = rng.standard_normal((10, 5)), rng.integers(0, 3, 10)
    t = rng.standard_normal((10, 3))
    cases = [(tl.loss.CrossEntropy(), lambda out, y: F.cross_entropy(out, y), labels),
             (tl.loss.MSE(reduction="sum"), lambda out, y: F.mse_loss(out, y, reduction="sum"), t),
             (tl.loss.Huber(0.5), lambda out, y: F.huber_loss(out, y, delta=0.5), t),
             (tl.loss.L1(), lambda out, y: F.l1_loss(out, y), t),
             (tl.loss.BCEWithLogits(), lambda out, y: F.binary_cross_entropy_with_logits(out, y), t)]
    for builtin, fn, target in cases:
        a = tl.Trainer(net, builtin, tl.optim.SGD(lr=0.1))
        a.zero_grad()
        la = a.compute_gradients(x, target)
        ga = net.flat_gradients().copy()
        del a
        b = tl.Trainer(net, fn, tl.optim.SGD(lr=0.1))  # an integer target passes through to the loss's ops
        b.zero_grad()
        lb = b.compute_gradients(x, target)
        del b
        assert la == lb, builtin
        np.testing.assert_array_equal(net.flat_gradients(), ga)


def test_each_function_gets_its_own_plan(rng):
    net = tl.nn.Sequential(tl.nn.Linear(3, 2)).double()
    x, y = rng.standard_normal((4, 3)), rng.standard_normal((4, 2))
    once = tl.Trainer(net, lambda out, t: ((out - t) ** 2).sum(), tl.optim.SGD(lr=0.1)).evaluate(x, y)
    twice = tl.Trainer(net, lambda out, t: 2.0 * ((out - t) ** 2).sum(), tl.optim.SGD(lr=0.1)).evaluate(x, y)
    assert twice == 2 * once


def test_a_multi_output_model_with_a_built_in_loss_is_refused(rng):
    net = TwoHeads()
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    before = net.flat_parameters().copy()
    x, y = rng.standard_normal((4, 4)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    with pytest.raises(ValueError, match="mse: the model returns 2 outputs, and a built-in loss takes one; "
                                         r"give the trainer a loss function over all of them \(tl.loss.Custom"):
        trainer.step(x, y)
    np.testing.assert_array_equal(net.flat_parameters(), before)


def _vector_loss(out, y):
    return (out - y) ** 2


def _not_a_symbol(out, y):
    return 1.0


@pytest.mark.parametrize("fn, error, match", [
    (_vector_loss, ValueError, r"loss function _vector_loss: must return a 0-d \(scalar\) symbol, got shape \(4, 2\)"),
    (_not_a_symbol, TypeError, "loss function _not_a_symbol: must return a symbol built from its arguments"),
    (lambda out, y: (out - y[:, :1]).sum(), ValueError, ""),
])
def test_a_bad_loss_function_is_named_and_changes_nothing(fn, error, match, rng):
    net = tl.nn.Sequential(tl.nn.Linear(3, 2)).double()
    before = net.flat_parameters().copy()
    trainer = tl.Trainer(net, fn, tl.optim.SGD(lr=0.1))
    x, y = rng.standard_normal((4, 3)), rng.standard_normal((4, 5))
    if not match:  # a loss that runs: shapes are the function's business
        trainer.step(x, y)
        return
    with pytest.raises(error, match=match):
        trainer.step(x, np.ascontiguousarray(y[:, :2]))
    np.testing.assert_array_equal(net.flat_parameters(), before)


def test_custom_needs_a_function_and_is_not_called_on_arrays():
    with pytest.raises(TypeError, match="Custom: expected a function fn\\(output, target\\), got int"):
        tl.loss.Custom(3)
    loss = tl.loss.Custom(gaussian_nll)
    assert "gaussian_nll" in repr(loss)
    with pytest.raises(TypeError, match="a custom loss runs inside a trainer's plan"):
        loss(np.ones(3), np.ones(3))


class SamplingVAE(tl.nn.Module):
    """A VAE that always samples and also returns its noise, so torch can replay it."""

    def __init__(self):
        super().__init__()
        self.enc = tl.nn.Linear(6, 8)
        self.mu = tl.nn.Linear(8, 2)
        self.logvar = tl.nn.Linear(8, 2)
        self.dec = tl.nn.Linear(2, 6)

    def forward(self, x):
        h = F.tanh(self.enc(x))
        mu, logvar = self.mu(h), self.logvar(h)
        eps = F.randn_like(mu)
        return F.sigmoid(self.dec(mu + (0.5 * logvar).exp() * eps)), mu, logvar, eps


def vae_loss(outputs, x):
    """Written once for torch tensors and treadle symbols: squared error + KL, per sample."""
    recon, mu, logvar = outputs[:3]
    return (((recon - x) ** 2).sum() - 0.5 * (1 + logvar - mu ** 2 - logvar.exp()).sum()) / x.size(0)


def test_vae_loss_and_gradients_match_torch_given_the_same_noise(rng):
    torch.manual_seed(1)
    layers = {name: torch.nn.Linear(i, o).double() for name, i, o in
              [("enc", 6, 8), ("mu", 8, 2), ("logvar", 8, 2), ("dec", 2, 6)]}
    net = SamplingVAE().double()
    net.load_state_dict({f"{n}.{k}": v for n, layer in layers.items() for k, v in layer.state_dict().items()})
    x = rng.random((10, 6))
    # a fresh context and a fresh trainer with one seed draw the same noise on their first run
    eps = net.predict(x, context=tl.Context(seed=7))[3]
    trainer = tl.Trainer(net, vae_loss, tl.optim.SGD(lr=0.1), seed=7)
    trainer.zero_grad()
    loss = trainer.compute_gradients(x, x)

    def torch_vae(tx):
        h = torch.tanh(layers["enc"](tx))
        mu, logvar = layers["mu"](h), layers["logvar"](h)
        return torch.sigmoid(layers["dec"](mu + (0.5 * logvar).exp() * torch.from_numpy(eps))), mu, logvar

    tx = torch.from_numpy(x)
    tloss = vae_loss(torch_vae(tx), tx)
    tloss.backward()
    np.testing.assert_allclose(loss, tloss.item(), rtol=1e-13)
    grads = param_grads(net)
    for n, layer in layers.items():
        for k, p in layer.named_parameters():
            np.testing.assert_allclose(grads[f"{n}.{k}"], p.grad.numpy(), rtol=1e-11, atol=1e-14, err_msg=f"{n}.{k}")


def test_a_loss_with_a_third_parameter_gets_the_input(rng):
    net, ref = _pair(seed=5)
    x, y = rng.standard_normal((8, 4)), rng.standard_normal((8, 3))

    def weighted(outputs, target, inputs):  # a loss weighted by the input's first feature
        mean, _ = outputs
        return ((mean - target) ** 2 * (inputs[:, 0:1] ** 2)).mean()

    trainer = tl.Trainer(net, weighted, tl.optim.SGD(lr=0.1))
    trainer.zero_grad()
    loss = trainer.compute_gradients(x, y)
    tx = torch.from_numpy(x)
    tloss = weighted(ref(tx), torch.from_numpy(y), tx)
    tloss.backward()
    np.testing.assert_allclose(loss, tloss.item(), rtol=1e-13)
    for name, p in ref.named_parameters():
        if p.grad is not None:
            np.testing.assert_allclose(param_grads(net)[name], p.grad.numpy(), rtol=1e-11, atol=1e-13, err_msg=name)


def test_a_third_parameter_with_a_default_is_the_functions_own_option(rng):
    net = tl.nn.Sequential(tl.nn.Linear(3, 2)).double()
    x, y = rng.standard_normal((4, 3)), rng.standard_normal((4, 2))

    def scaled(out, target, factor=3.0):
        return factor * ((out - target) ** 2).sum()

    plain = tl.Trainer(net, lambda out, t: ((out - t) ** 2).sum(), tl.optim.SGD(lr=0.1)).evaluate(x, y)
    assert tl.Trainer(net, scaled, tl.optim.SGD(lr=0.1)).evaluate(x, y) == 3.0 * plain
