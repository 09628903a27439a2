"""RNNCell, LSTMCell and GRUCell against torch's: parameter names and shapes, outputs and gradients of
a loop over time in a traced forward, unbatched steps, no initial state, bias=False, relu."""
import numpy as np
import pytest
import torch

import treadle as tl
from opcheck import assert_grads_like_torch

I, H, T, B = 3, 5, 4, 6


def _build(self, nn, kind, **kw):
    self.cell = getattr(nn, kind)(I, H, **kw)
    self.head = nn.Linear(H, 2)


def _forward(self, x, with_state=True):
    """x is (T, B, I); the state starts at None (zeros) or at a state computed from x[0]."""
    lstm = isinstance(self.cell, (torch.nn.LSTMCell, tl.nn.LSTMCell))
    state = None
    for t in range(x.shape[0]):
        state = self.cell(x[t], state)
    h = state[0] if lstm else state
    return self.head(h)


class TorchLoop(torch.nn.Module):
    forward = _forward

    def __init__(self, kind, **kw):
        super().__init__()
        _build(self, torch.nn, kind, **kw)


class TreadleLoop(tl.nn.Module):
    forward = _forward

    def __init__(self, kind, **kw):
        super().__init__()
        _build(self, tl.nn, kind, **kw)


CASES = [("RNNCell", {}), ("RNNCell", {"nonlinearity": "relu"}), ("RNNCell", {"bias": False}), ("LSTMCell", {}),
         ("LSTMCell", {"bias": False}), ("GRUCell", {}), ("GRUCell", {"bias": False})]


def _pair(kind, kw):
    torch.manual_seed(0)
    ref = TorchLoop(kind, **kw).double()
    net = TreadleLoop(kind, **kw).double()
    tl.io.from_torch(ref, net)
    return net, ref


@pytest.mark.parametrize("kind,kw", CASES)
def test_loop_matches_torch(kind, kw):
    net, ref = _pair(kind, kw)
    assert [(n, p.shape) for n, p in net.named_parameters()] == \
        [(n, tuple(p.shape)) for n, p in ref.named_parameters()]
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((T, B, I)), rng.standard_normal((B, 2))
    net.eval()
    np.testing.assert_allclose(net(x), ref(torch.tensor(x)).detach().numpy(), rtol=1e-11, atol=1e-12)
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    trainer.compute_gradients(x, y)
    torch.nn.functional.mse_loss(ref(torch.tensor(x)), torch.tensor(y)).backward()
    assert_grads_like_torch(net, ref)


@pytest.mark.parametrize("kind", ["RNNCell", "LSTMCell", "GRUCell"])
def test_unbatched_step_and_given_state(kind):
    torch.manual_seed(0)
    tcell = getattr(torch.nn, kind)(I, H).double()
    cell = getattr(tl.nn, kind)(I, H, dtype="float64")
    for name, p in tcell.named_parameters():  # written in place: the cell is compiled only inside Step
        getattr(cell, name)[...] = p.detach().numpy()
    lstm = kind == "LSTMCell"

    class Step(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = cell

        def forward(self, x, h, c):
            out = self.cell(x, (h, c) if lstm else h)
            return out[0] + out[1] if lstm else out

    rng = np.random.default_rng(2)
    x, h, c = rng.standard_normal(I), rng.standard_normal(H), rng.standard_normal(H)
    ref = tcell(torch.tensor(x), (torch.tensor(h), torch.tensor(c)) if lstm else torch.tensor(h))
    ref = (ref[0] + ref[1]) if lstm else ref
    np.testing.assert_allclose(Step().eval()(x, h, c), ref.detach().numpy(), rtol=1e-12, atol=1e-13)


def test_training_follows_torch():
    net, ref = _pair("LSTMCell", {})
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((T, B, I)), rng.standard_normal((B, 2))
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=1e-2))
    opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    for _ in range(20):
        ours = trainer.step(x, y)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ref(torch.tensor(x)), torch.tensor(y))
        loss.backward()
        opt.step()
        assert ours == pytest.approx(loss.item(), rel=1e-9)


def test_default_initialisation_is_torchs_range_and_float32():
    cell = tl.nn.GRUCell(4, 16)
    assert cell.weight_ih.shape == (48, 4) and cell.weight_hh.shape == (48, 16) and cell.bias_hh.shape == (48,)
    assert cell.weight_ih.dtype == np.float32
    for _, w in cell.named_parameters():
        assert np.abs(w).max() <= 0.25 and np.abs(w).max() > 0.2 and w.std() > 0.1
    assert tl.nn.RNNCell(2, 3, bias=False).bias_ih is None


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="nonlinearity"):
        tl.nn.RNNCell(2, 3, nonlinearity="sigmoid")
    with pytest.raises(ValueError, match="positive"):
        tl.nn.LSTMCell(0, 3)
    with pytest.raises(TypeError, match="int"):
        tl.nn.GRUCell(2.5, 3)

    class Wrong(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = tl.nn.RNNCell(I, H)

        def forward(self, x):
            return self.cell(x)

    with pytest.raises(ValueError, match=r"expected input of shape \(batch, 3\)"):
        Wrong().eval()(np.zeros((2, I + 1), np.float32))
