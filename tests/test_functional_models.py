"""User-defined modules whose forward is ordinary Python over symbolic values: a residual block, two
heads concatenated, several inputs and outputs, tied weights. Each traces, trains, and matches torch."""
import numpy as np
import pytest
import torch

import treadle as tl
import treadle.functional as F
from conftest import CORE_TOL
from opcheck import param_grads


class ResidualTwoHeads(tl.nn.Module):
    """x -> tanh(inp x) = h;  h + tanh(block h) (residual);  cat(head_a h, sigmoid(head_b h))."""

    def __init__(self, n_in=6, width=16):
        super().__init__()
        self.inp = tl.nn.Linear(n_in, width)
        self.block = tl.nn.Linear(width, width)
        self.head_a = tl.nn.Linear(width, 2)
        self.head_b = tl.nn.Linear(width, 3)

    def forward(self, x):
        h = F.tanh(self.inp(x))
        h = h + F.tanh(self.block(h))
        return F.cat([self.head_a(h), F.sigmoid(self.head_b(h))], axis=1)


class TorchResidualTwoHeads(torch.nn.Module):
    def __init__(self, n_in=6, width=16):
        super().__init__()
        self.inp = torch.nn.Linear(n_in, width)
        self.block = torch.nn.Linear(width, width)
        self.head_a = torch.nn.Linear(width, 2)
        self.head_b = torch.nn.Linear(width, 3)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        h = h + torch.tanh(self.block(h))
        return torch.cat([self.head_a(h), torch.sigmoid(self.head_b(h))], dim=1)


class Arithmetic(tl.nn.Module):
    """Scalar and elementwise arithmetic, slicing and a gated (multiplicative) branch."""

    def __init__(self):
        super().__init__()
        self.gate = tl.nn.Linear(5, 8)
        self.value = tl.nn.Linear(5, 8)
        self.out = tl.nn.Linear(4, 3)

    def forward(self, x):
        g = F.sigmoid(self.gate(x))
        v = F.relu(self.value(x))
        mixed = g * v + (1.0 - g) * 0.5 - 0.25 * v
        left = F.slice(mixed, 1, 0, 4)
        right = F.slice(mixed, 1, 4, 8)
        return self.out(left - right) * 2.0 + (-F.slice(left, 1, 0, 3))


class TorchArithmetic(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(5, 8)
        self.value = torch.nn.Linear(5, 8)
        self.out = torch.nn.Linear(4, 3)

    def forward(self, x):
        g = torch.sigmoid(self.gate(x))
        v = torch.relu(self.value(x))
        mixed = g * v + (1.0 - g) * 0.5 - 0.25 * v
        left, right = mixed[:, :4], mixed[:, 4:]
        return self.out(left - right) * 2.0 + (-left[:, :3])


def _pair(tl_cls, torch_cls, dtype, seed=0):
    torch.manual_seed(seed)
    ref = torch_cls()
    net = tl_cls()
    if dtype == "float64":
        ref.double()
        net.double()
    net.load_state_dict(ref.state_dict())
    return net, ref



def test_residual_model_names_match_torch():
    net, ref = ResidualTwoHeads(), TorchResidualTwoHeads()
    assert [(n, a.shape) for n, a in net.named_parameters().items()] == \
           [(n, tuple(p.shape)) for n, p in ref.named_parameters()]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_residual_two_heads_forward_and_gradients_match_torch(dtype, rng):
    net, ref = _pair(ResidualTwoHeads, TorchResidualTwoHeads, dtype)
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    x = rng.standard_normal((9, 6)).astype(dtype)
    g = rng.standard_normal((9, 5)).astype(dtype)
    np.testing.assert_allclose(net.predict(x), ref(torch.from_numpy(x)).detach().numpy(), **CORE_TOL[dtype])
    trainer.zero_grad()
    out = trainer.forward(x, input_grad=True)
    dx = trainer.backward(g, input_grad=True)
    tx = torch.tensor(x, requires_grad=True)
    tout = ref(tx)
    tout.backward(torch.from_numpy(g))
    np.testing.assert_allclose(out, tout.detach().numpy(), **CORE_TOL[dtype])
    np.testing.assert_allclose(dx, tx.grad.numpy(), **CORE_TOL[dtype])
    ours = param_grads(net)
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(ours[name], p.grad.numpy(), err_msg=name, **CORE_TOL[dtype])


def test_residual_two_heads_trains_like_torch(rng):
    net, ref = _pair(ResidualTwoHeads, TorchResidualTwoHeads, "float64", seed=2)
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=5e-3))
    opt = torch.optim.Adam(ref.parameters(), lr=5e-3)
    x = rng.standard_normal((32, 6))
    y = np.concatenate([np.sin(x[:, :2]), 1 / (1 + np.exp(-x[:, 2:5]))], axis=1)
    losses, ref_losses = [], []
    for _ in range(40):
        losses.append(trainer.step(x, y))
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ref(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        ref_losses.append(loss.item())
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-10)
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_arithmetic_and_slicing_model_matches_torch(dtype, rng):
    net, ref = _pair(Arithmetic, TorchArithmetic, dtype, seed=1)
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    x = rng.standard_normal((7, 5)).astype(dtype)
    g = rng.standard_normal((7, 3)).astype(dtype)
    trainer.zero_grad()
    out = trainer.forward(x)
    trainer.backward(g)
    tout = ref(torch.from_numpy(x))
    tout.backward(torch.from_numpy(g))
    np.testing.assert_allclose(out, tout.detach().numpy(), **CORE_TOL[dtype])
    ours = param_grads(net)
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(ours[name], p.grad.numpy(), err_msg=name, **CORE_TOL[dtype])


class TwoInputsTwoOutputs(tl.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = tl.nn.Linear(3, 4)
        self.b = tl.nn.Linear(5, 4)

    def forward(self, u, v):
        h = self.a(u) + self.b(v)
        return h, F.relu(h)


def test_several_inputs_and_outputs(rng):
    net = TwoInputsTwoOutputs()
    u = rng.standard_normal((6, 3)).astype(np.float32)
    v = rng.standard_normal((6, 5)).astype(np.float32)
    h, r = net.predict([u, v])
    p = net.named_parameters()
    expect = u @ p["a.weight"].T + p["a.bias"] + v @ p["b.weight"].T + p["b.bias"]
    np.testing.assert_allclose(h, expect, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(r, np.maximum(h, 0))
    with pytest.raises(ValueError):
        net.predict([u, u])  # the second input has 3 features where b expects 5


class Tied(tl.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = tl.nn.Linear(4, 4)
        self.dec = self.enc  # the same layer applied twice

    def forward(self, x):
        return self.dec(F.tanh(self.enc(x)))


class TorchTied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = torch.nn.Linear(4, 4)
        self.dec = self.enc

    def forward(self, x):
        return self.dec(torch.tanh(self.enc(x)))


def test_tied_weights_get_the_sum_of_both_gradients(rng):
    torch.manual_seed(0)
    ref = TorchTied().double()
    net = Tied().double()
    net.load_state_dict(dict(ref.named_parameters()))  # torch's deduplicated names
    assert net._compiled().layout == [("enc.weight", (4, 4), 0), ("enc.bias", (4,), 16)]  # stored once
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    x = rng.standard_normal((5, 4))
    g = rng.standard_normal((5, 4))
    trainer.zero_grad()
    trainer.forward(x)
    trainer.backward(g)
    ref(torch.from_numpy(x)).backward(torch.from_numpy(g))
    ours = param_grads(net)
    np.testing.assert_allclose(ours["enc.weight"], ref.enc.weight.grad.numpy(), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(ours["enc.bias"], ref.enc.bias.grad.numpy(), rtol=1e-12, atol=1e-13)


def test_tied_weights_are_counted_once_like_torch():
    ref, net = TorchTied(), Tied()
    assert net.num_parameters() == sum(p.numel() for p in ref.parameters()) == 20
    names = [n for n, _ in net.named_parameters()]
    assert names == [n for n, _ in ref.named_parameters()] == ["enc.weight", "enc.bias"]


def test_tied_weights_load_torch_state_dict(rng):
    """torch's state_dict lists a shared layer under every name ("enc.*" and "dec.*"); loading it
    strictly must work, as it does in torch."""
    torch.manual_seed(0)
    ref = TorchTied()
    net = Tied()
    net.load_state_dict(ref.state_dict())
    x = rng.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(net.predict(x), ref(torch.from_numpy(x)).detach().numpy(), **CORE_TOL["float32"])


def test_forward_is_traced_once_per_signature(rng):
    calls = []

    class Counting(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = tl.nn.Linear(2, 2)

        def forward(self, x):
            calls.append(x.shape)
            assert isinstance(x, tl._core.Symbol)
            return self.lin(x) + x

    net = Counting()
    for _ in range(5):
        net.predict(np.ones((3, 2), np.float32))
    net.predict(np.ones((4, 2), np.float32))
    assert calls == [(3, 2), (4, 2)]
