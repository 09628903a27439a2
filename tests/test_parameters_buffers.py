"""Parameters and buffers a module declares itself (tl.nn.Parameter, register_buffer), weight tying by
assignment and requires_grad_: a torch model using them ports by renaming the import, with torch's
state_dict keys, outputs, gradients and training trajectory."""
import numpy as np
import pytest
import torch

import treadle as tl
import treadle.functional as F
from opcheck import assert_grads_like_torch

T, V, D = 6, 11, 8


def _build(self, nn, tensor):
    """The same little language model in either framework (`tensor`: torch.tensor or np.asarray)."""
    self.embed = nn.Embedding(V, D)
    self.fc = nn.Linear(D, D)
    self.gain = nn.Parameter(tensor(np.linspace(0.5, 1.5, D)))
    self.register_buffer("pos", tensor(np.sin(np.arange(T * D).reshape(T, D) / 7.0)))
    self.register_buffer("mask", tensor(np.tril(np.ones((T, T)))))
    self.register_buffer("offset", tensor(np.full(D, 0.25)), persistent=False)
    self.decoder = nn.Linear(D, V, bias=False)
    self.decoder.weight = self.embed.weight  # weight tying


def _forward(self, idx):
    h = self.embed(idx) + self.pos
    h = self.fc(h).tanh() * self.gain + self.offset
    att = (h @ h.transpose(1, 2)).masked_fill(self.mask.eq(0), -1e9).softmax(-1)
    return self.decoder(att @ h)


class TorchLM(torch.nn.Module):
    forward = _forward

    def __init__(self):
        super().__init__()
        _build(self, torch.nn, lambda a: torch.tensor(a, dtype=torch.float32))


class TreadleLM(tl.nn.Module):
    forward = _forward

    def __init__(self):
        super().__init__()
        _build(self, tl.nn, np.asarray)


def _pair():
    torch.manual_seed(0)
    ref = TorchLM().double()
    net = TreadleLM().double()
    tl.io.from_torch(ref, net)
    return net, ref


def _data(batch=4):
    rng = np.random.default_rng(0)
    return rng.integers(0, V, (batch, T)), rng.integers(0, V, (batch * T,))


def _ce(logits, y):
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), torch.tensor(y))


def _treadle_ce(out, y):
    return F.cross_entropy(F.reshape(out, (-1, V)), y)


def _steps_like_torch(trainer, ref, opt, x, y, steps):
    """`steps` training steps of both frameworks on the same batch; the losses agree at each."""
    for _ in range(steps):
        ours = trainer.step(x, y)
        opt.zero_grad()
        loss = _ce(ref(torch.tensor(x)), y)
        loss.backward()
        opt.step()
        assert ours == pytest.approx(loss.item(), rel=1e-9)


def test_names_and_state_dict_are_torchs():
    net, ref = _pair()
    assert [n for n, _ in net.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert [n for n, _ in net.named_buffers()] == [n for n, _ in ref.named_buffers()]
    assert list(net.state_dict()) == list(ref.state_dict())  # tied weight under both names, no "offset"
    np.testing.assert_array_equal(net.state_dict()["decoder.weight"], net.state_dict()["embed.weight"])
    assert net.num_parameters() == sum(p.numel() for p in ref.parameters())
    assert len(net.parameters()) == len(list(ref.parameters())) == 4
    np.testing.assert_array_equal(net.offset, np.full(D, 0.25))
    np.testing.assert_array_equal(net.mask, np.tril(np.ones((T, T))))


def test_outputs_and_gradients_match_torch():
    net, ref = _pair()
    x, y = _data()
    net.eval()
    np.testing.assert_allclose(net(x), ref(torch.tensor(x)).detach().numpy(), rtol=1e-11, atol=1e-12)
    trainer = tl.Trainer(net, _treadle_ce, tl.optim.SGD(lr=0.0))
    trainer.compute_gradients(x, y)
    _ce(ref(torch.tensor(x)), y).backward()
    grads = assert_grads_like_torch(net, ref)  # the tied weight's gradient sums both uses
    assert set(grads) == {n for n, _ in ref.named_parameters()}


def test_training_follows_torch_and_keeps_the_tie():
    net, ref = _pair()
    x, y = _data()
    trainer = tl.Trainer(net, _treadle_ce, tl.optim.Adam(lr=1e-2))
    opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    _steps_like_torch(trainer, ref, opt, x, y, 20)
    np.testing.assert_allclose(net.decoder.weight, ref.decoder.weight.detach().numpy(), rtol=1e-9, atol=1e-11)
    assert np.shares_memory(net.decoder.weight, net.embed.weight)
    np.testing.assert_array_equal(net.pos, ref.pos.numpy())  # buffers are not trained


def test_state_round_trips_through_torch():
    net, ref = _pair()
    fresh = TorchLM().double()
    fresh.load_state_dict(tl.io.to_torch_state_dict(net))
    x, _ = _data()
    np.testing.assert_allclose(fresh(torch.tensor(x)).detach().numpy(), ref(torch.tensor(x)).detach().numpy(),
                               rtol=1e-12)
    state = ref.state_dict()
    state["gain"] = state["gain"] * 2
    net.load_state_dict(state)
    np.testing.assert_allclose(net.gain, 2 * np.linspace(0.5, 1.5, D))
    with pytest.raises(ValueError, match="non-persistent buffer"):
        net.load_state_dict({**state, "offset": np.zeros(D)})


def test_float32_model_and_double():
    net = TreadleLM()
    assert net.dtype == "float32" and net.gain.dtype == np.float32 and net.pos.dtype == np.float32
    net.double()
    assert net.gain.dtype == np.float64 and net.mask.dtype == np.float64


def test_requires_grad_freezes_like_torch():
    net, ref = _pair()
    x, y = _data()
    net.fc.requires_grad_(False)
    ref.fc.requires_grad_(False)
    assert [n for n, _ in net.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert net.num_parameters() == sum(p.numel() for p in ref.parameters() if p.requires_grad)
    before = net.fc.weight.copy()
    trainer = tl.Trainer(net, _treadle_ce, tl.optim.SGD(lr=0.1, momentum=0.9))
    opt = torch.optim.SGD([p for p in ref.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
    _steps_like_torch(trainer, ref, opt, x, y, 5)
    np.testing.assert_array_equal(net.fc.weight, before)
    np.testing.assert_allclose(net.gain, ref.gain.detach().numpy(), rtol=1e-10)
    net.fc.requires_grad_(True)
    assert net.num_parameters() == sum(p.numel() for p in ref.parameters())
    np.testing.assert_array_equal(net.fc.weight, before)  # re-packing keeps the values


def test_buffer_assignment_after_compile_copies_in_place():
    net = TreadleLM().double()
    net.eval()
    x, _ = _data()
    first = net(x)
    net.pos = np.zeros((T, D))
    assert not np.allclose(net(x), first)
    with pytest.raises(ValueError, match="shape"):
        net.pos = np.zeros((T + 1, D))


def test_bad_declarations_are_named():
    class Plain(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = tl.nn.Parameter(np.ones(3))

    m = Plain()
    with pytest.raises(TypeError, match="as parameter 'w'"):
        m.w = np.zeros(3)
    with pytest.raises(KeyError, match="without '.'"):
        m.register_buffer("a.b", np.zeros(2))
    with pytest.raises(KeyError, match="already exists"):
        m.register_buffer("w", np.zeros(2))
    with pytest.raises(TypeError, match="float32 or float64"):
        tl.nn.Parameter(np.ones(2), dtype="int32")
    lin, emb = tl.nn.Linear(4, 3), tl.nn.Embedding(5, 4)
    with pytest.raises(ValueError, match="shapes and dtypes must match"):
        lin.weight = emb.weight

    class NoInit(tl.nn.Module):
        def __init__(self):
            self.w = tl.nn.Parameter(np.ones(3))

    with pytest.raises(AttributeError, match="super"):
        NoInit()


def test_parameters_cannot_be_swapped_once_compiled():
    class Scale(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = tl.nn.Parameter(np.ones(3))

        def forward(self, x):
            return x * self.w

    m = Scale().eval()
    np.testing.assert_array_equal(m(np.full((2, 3), 2.0, np.float32)), np.full((2, 3), 2.0))
    with pytest.raises(RuntimeError, match="compiled"):
        m.w = tl.nn.Parameter(np.zeros(3))
    m.w[...] = 3.0  # writing into it is the way
    np.testing.assert_array_equal(m(np.full((2, 3), 2.0, np.float32)), np.full((2, 3), 6.0))
