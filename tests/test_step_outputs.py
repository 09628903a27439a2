"""Outputs from a step: step / compute_gradients / evaluate hand back the model's outputs as that
very step computed them (dropout, noise), and the named values a loss returned next to its loss, so
a host never runs a second forward to get them; the host-driven forward/backward take every output
of a multi-output model."""
import numpy as np
import pytest
import torch

import treadle as tl
import treadle.functional as F
from opcheck import param_grads


class Heads(tl.nn.Module):
    def __init__(self, p=0.0):
        super().__init__()
        self.body = tl.nn.Linear(4, 8)
        self.drop = tl.nn.Dropout(p)
        self.a = tl.nn.Linear(8, 3)
        self.b = tl.nn.Linear(8, 2)

    def forward(self, x):
        h = self.drop(F.tanh(self.body(x)))
        return self.a(h), self.b(h)


class TorchHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(4, 8)
        self.a = torch.nn.Linear(8, 3)
        self.b = torch.nn.Linear(8, 2)

    def forward(self, x):
        h = torch.tanh(self.body(x))
        return self.a(h), self.b(h)


def heads_pair(seed):
    """Heads and TorchHeads in float64 with the same weights."""
    torch.manual_seed(seed)
    ref = TorchHeads().double()
    net = Heads().double()
    net.load_state_dict(ref.state_dict())
    return net, ref


def two_term_loss(outputs, y):
    a, b = outputs
    fit = ((a - y) ** 2).mean()
    penalty = 0.1 * (b ** 2).sum()
    return fit + penalty, {"fit": fit, "penalty": penalty}


def test_step_returns_the_outputs_it_trained_on_with_dropout(rng):
    net = Heads(p=0.5).double()
    trainer = tl.Trainer(net, two_term_loss, tl.optim.SGD(lr=0.1), seed=3)
    x, y = rng.standard_normal((16, 4)), rng.standard_normal((16, 3))
    for _ in range(3):
        r = trainer.step(x, y, return_outputs=True)
        a, b = r.outputs
        # The loss recomputed from the returned outputs is the step's loss: they carry its dropout mask.
        np.testing.assert_allclose(r.loss, np.mean((a - y) ** 2) + 0.1 * np.sum(b ** 2), rtol=1e-13)
        np.testing.assert_allclose(r.values["fit"], np.mean((a - y) ** 2), rtol=1e-13)
        np.testing.assert_allclose(r.values["penalty"], 0.1 * np.sum(b ** 2), rtol=1e-13)
        assert r.values["fit"].shape == ()
    eval_a, _ = net.predict(x)
    assert not np.allclose(a, eval_a)  # dropout was on in the step, off in predict


def test_outputs_are_from_before_the_update_and_match_torch(rng):
    net, ref = heads_pair(0)
    trainer = tl.Trainer(net, two_term_loss, tl.optim.SGD(lr=0.1))
    x, y = rng.standard_normal((8, 4)), rng.standard_normal((8, 3))
    r = trainer.step(x, y, return_outputs=True)
    ta, tb = ref(torch.from_numpy(x))
    np.testing.assert_allclose(r.outputs[0], ta.detach().numpy(), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(r.outputs[1], tb.detach().numpy(), rtol=1e-13, atol=1e-15)
    assert not np.allclose(net.predict(x)[0], r.outputs[0])  # the update happened after


def test_compute_gradients_and_evaluate_return_outputs_too(rng):
    net = tl.nn.Sequential(tl.nn.Linear(3, 2)).double()
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    x, y = rng.standard_normal((5, 3)), rng.standard_normal((5, 2))
    expected = net.predict(x)
    for call in (trainer.compute_gradients, trainer.evaluate):
        r = call(x, y, return_outputs=True)
        assert isinstance(r, tl.StepResult) and r.values == {}
        np.testing.assert_allclose(r.outputs, expected, rtol=1e-14)
        np.testing.assert_allclose(r.loss, np.mean((expected - y) ** 2), rtol=1e-13)
    assert isinstance(trainer.step(x, y), float)  # the plain form is unchanged


def test_a_recurrent_state_carried_from_step_to_step(rng):
    """A model returning (prediction, state): the host feeds the state of step k into step k + 1
    from the step's own outputs instead of a second forward."""

    class Cell(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = tl.nn.Linear(6, 3)
            self.head = tl.nn.Linear(3, 1)

        def forward(self, xh):
            h = F.tanh(self.cell(xh))
            return self.head(h), h

    net = Cell().double()
    trainer = tl.Trainer(net, lambda out, y: ((out[0] - y) ** 2).mean(), tl.optim.SGD(lr=0.0))
    h = np.zeros((4, 3))
    for _ in range(3):
        x = rng.standard_normal((4, 3))
        r = trainer.step(np.concatenate([x, h], 1), np.zeros((4, 1)), return_outputs=True)
        _, h_expected = net.predict(np.concatenate([x, h], 1))  # lr 0: the parameters do not move
        np.testing.assert_allclose(r.outputs[1], h_expected, rtol=1e-14)
        h = r.outputs[1]


def test_forward_and_backward_take_every_output_of_a_multi_output_model(rng):
    net, ref = heads_pair(1)
    trainer = tl.Trainer(net, two_term_loss, tl.optim.SGD(lr=0.1))
    x = rng.standard_normal((6, 4))
    g_a, g_b = rng.standard_normal((6, 3)), rng.standard_normal((6, 2))
    ta, tb = ref(torch.from_numpy(x))

    trainer.zero_grad()
    a, b = trainer.forward(x)
    np.testing.assert_allclose(a, ta.detach().numpy(), rtol=1e-13)
    np.testing.assert_allclose(b, tb.detach().numpy(), rtol=1e-13)
    with pytest.raises(ValueError, match="has 2 outputs; got 1 gradient"):
        trainer.backward(g_a)
    trainer.backward((g_a, g_b))
    torch.autograd.backward([ta, tb], [torch.from_numpy(g_a), torch.from_numpy(g_b)])
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(param_grads(net)[name], p.grad.numpy(), rtol=1e-12, atol=1e-14, err_msg=name)

    # None: the loss does not depend on that output (its gradient is zero).
    trainer.zero_grad()
    trainer.forward(x)
    trainer.backward((g_a, None))
    ref.zero_grad()
    ta, _ = ref(torch.from_numpy(x))
    ta.backward(torch.from_numpy(g_a))
    grads = param_grads(net)
    assert not grads["b.weight"].any() and not grads["b.bias"].any()
    for name in ("body.weight", "body.bias", "a.weight", "a.bias"):
        np.testing.assert_allclose(grads[name], dict(ref.named_parameters())[name].grad.numpy(), rtol=1e-12,
                                   atol=1e-14, err_msg=name)
    trainer.forward(x)
    with pytest.raises(ValueError, match="got none"):
        trainer.backward((None, None))


def test_named_values_are_checked(rng):
    net = tl.nn.Sequential(tl.nn.Linear(3, 2)).double()
    x, y = rng.standard_normal((4, 3)), rng.standard_normal((4, 2))
    not_a_symbol = tl.Trainer(net, lambda o, t: (((o - t) ** 2).mean(), {"n": 1.0}), tl.optim.SGD(lr=0.1))
    with pytest.raises(TypeError, match="value named 'n' must be a symbol"):
        not_a_symbol.step(x, y)
    bad_key = tl.Trainer(net, lambda o, t: (((o - t) ** 2).mean(), {1: o.sum()}), tl.optim.SGD(lr=0.1))
    with pytest.raises(TypeError, match="must be strings"):
        bad_key.step(x, y)


def test_backward_takes_a_list_of_arrays_as_one_per_output(rng):
    net = Heads().double()
    trainer = tl.Trainer(net, two_term_loss, tl.optim.SGD(lr=0.1))
    x = rng.standard_normal((2, 4))
    trainer.zero_grad()
    trainer.forward(x)
    trainer.backward([np.ones((2, 3)), None])  # a list of arrays: one per output
    with_list = net.flat_gradients().copy()
    trainer.zero_grad()
    trainer.forward(x)
    trainer.backward((np.ones((2, 3)), None))
    np.testing.assert_array_equal(net.flat_gradients(), with_list)
    with pytest.raises(TypeError, match="expected a numpy array, got list"):
        trainer.forward(x)
        trainer.backward([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])  # a nested list is not an array: named
