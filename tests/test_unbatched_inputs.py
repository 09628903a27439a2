"""Unbatched inputs, as torch takes them: RNN/GRU/LSTM on (L, H_in) with (num_layers, H) states,
MultiheadAttention on (L, E) with an (S,) padding mask, TransformerEncoderLayer on (S, E); outputs and
every parameter gradient against torch in float64. Also TransformerEncoderLayer's torch activation forms."""
import numpy as np
import pytest
import torch

import treadle as tl
import treadle.functional as F
from opcheck import assert_grads_like_torch

L, E = 5, 4


def _compare(tmod, mod, inputs, run_t, run_tl):
    """Copies tmod's weights into mod inside a wrapper and compares output and parameter gradients of
    sum(output * seed)."""
    class Wrap(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = mod

        def forward(self, *xs):
            return run_tl(self.m, *xs)

    net = Wrap().double()
    for name, p in tmod.named_parameters():
        dict(net.named_parameter_objects())["m." + name].data[...] = p.detach().numpy()
    t_out = run_t(tmod, *[torch.tensor(x) for x in inputs])
    seed = np.random.default_rng(9).standard_normal(t_out.shape)
    net.eval()
    np.testing.assert_allclose(net(*inputs), t_out.detach().numpy(), rtol=1e-11, atol=1e-12)
    trainer = tl.Trainer(net, lambda out, y: (out * y).sum(), tl.optim.SGD(lr=0.0))
    trainer.compute_gradients(list(inputs) if len(inputs) > 1 else inputs[0], seed)
    (t_out * torch.tensor(seed)).sum().backward()
    assert_grads_like_torch(net, tmod, prefix="m.")


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_recurrent_unbatched(kind, batch_first):
    torch.manual_seed(0)
    kw = dict(num_layers=2, batch_first=batch_first)
    tmod = getattr(torch.nn, kind)(3, E, **kw).double()
    mod = getattr(tl.nn, kind)(3, E, dtype="float64", **kw)
    rng = np.random.default_rng(1)
    x, h = rng.standard_normal((L, 3)), rng.standard_normal((2, E))
    lstm = kind == "LSTM"

    def run(m, x, h):
        out, state = m(x, (h, h * 0.5) if lstm else h)
        last = state[0] + state[1] if lstm else state
        return out.sum(0) + last.sum(0) if isinstance(out, torch.Tensor) else F.sum(out, 0) + F.sum(last, 0)

    _compare(tmod, mod, [x, h], run, run)


@pytest.mark.parametrize("batch_first", [False, True])
def test_attention_unbatched(batch_first):
    torch.manual_seed(0)
    tmod = torch.nn.MultiheadAttention(E, 2, batch_first=batch_first).double()
    mod = tl.nn.MultiheadAttention(E, 2, batch_first=batch_first, dtype="float64")
    rng = np.random.default_rng(2)
    q, kv = rng.standard_normal((L, E)), rng.standard_normal((L + 2, E))
    mask = np.zeros(L + 2)
    mask[-1] = -np.inf  # additive float mask, as treadle takes masks

    def run(m, q, kv, mask):
        out, weights = m(q, kv, kv, key_padding_mask=mask)
        return out + weights[:, :E]

    _compare(tmod, mod, [q, kv, mask], run, run)


def test_encoder_layer_unbatched_and_torch_activation_forms():
    torch.manual_seed(0)
    tmod = torch.nn.TransformerEncoderLayer(E, 2, 8, dropout=0.0, activation=torch.nn.functional.gelu).double()
    mod = tl.nn.TransformerEncoderLayer(E, 2, 8, dropout=0.0, activation=F.gelu, dtype="float64")
    x = np.random.default_rng(3).standard_normal((L, E))
    _compare(tmod, mod, [x], lambda m, x: m(x), lambda m, x: m(x))
    assert tl.nn.TransformerEncoderLayer(E, 2, 8, activation=tl.nn.ReLU()).config()["activation"] == "relu"
    with pytest.raises(ValueError, match="relu or gelu"):
        tl.nn.TransformerEncoderLayer(E, 2, 8, activation=F.tanh)


def test_lengths_need_batched_input():
    class Net(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = tl.nn.GRU(3, E)

        def forward(self, x, lengths):
            return self.rnn(x, lengths=lengths)[0]

    with pytest.raises(ValueError, match="lengths needs batched input"):
        Net().eval()(np.zeros((L, 3), np.float32), np.array([2]))
