"""pytorch/examples' word_language_model RNNModel, written once for both frameworks (the class body is
torch's; only `nn` and `F` differ): forward(input, hidden) with the state as a tuple, Embedding, LSTM /
GRU, a tied decoder, nn.init. Against torch in float64 (dropout 0, as the two draw differently):
outputs, gradients, and the example's training loop (clip_grad_norm_ on model.parameters(), then a
plain SGD step) for 50 steps."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import treadle as tl
import treadle.functional as F
from opcheck import assert_grads_like_torch

NTOKEN, NINP, NLAYERS, T, B = 13, 8, 2, 6, 3


def _init(self, nn, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5, tie_weights=False):
    self.ntoken = ntoken
    self.drop = nn.Dropout(dropout)
    self.encoder = nn.Embedding(ntoken, ninp)
    self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
    self.decoder = nn.Linear(nhid, ntoken)
    if tie_weights:
        self.decoder.weight = self.encoder.weight
    initrange = 0.1
    nn.init.uniform_(self.encoder.weight, -initrange, initrange)
    nn.init.zeros_(self.decoder.bias)
    nn.init.uniform_(self.decoder.weight, -initrange, initrange)
    self.rnn_type, self.nhid, self.nlayers = rnn_type, nhid, nlayers


def _forward(self, input, hidden, F):
    emb = self.drop(self.encoder(input))
    output, hidden = self.rnn(emb, hidden)
    output = self.drop(output)
    decoded = self.decoder(output)
    decoded = decoded.view(-1, self.ntoken)
    return F.log_softmax(decoded, dim=1), hidden


class TorchRNNModel(torch.nn.Module):
    def __init__(self, *args, **kw):
        super().__init__()
        _init(self, torch.nn, *args, **kw)

    def forward(self, input, hidden):
        return _forward(self, input, hidden, TF)


class TreadleRNNModel(tl.nn.Module):
    def __init__(self, *args, **kw):
        super().__init__()
        _init(self, tl.nn, *args, **kw)

    def forward(self, input, hidden):
        return _forward(self, input, hidden, F)


def _pair(rnn_type):
    torch.manual_seed(0)
    ref = TorchRNNModel(rnn_type, NTOKEN, NINP, NINP, NLAYERS, dropout=0.0, tie_weights=True).double()
    net = TreadleRNNModel(rnn_type, NTOKEN, NINP, NINP, NLAYERS, dropout=0.0, tie_weights=True).double()
    tl.io.from_torch(ref, net)
    return net, ref


def _batch(seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, NTOKEN, (T, B)), rng.integers(0, NTOKEN, (T * B,))


def _hidden(rnn_type, seed=5):
    h = 0.1 * np.random.default_rng(seed).standard_normal((NLAYERS, B, NINP))
    return (h, h.copy()) if rnn_type == "LSTM" else h


def _torch(h):
    return tuple(torch.tensor(a) for a in h) if isinstance(h, tuple) else torch.tensor(h)


def _loss(outputs, targets):
    return F.nll_loss(outputs[0], targets)


@pytest.mark.parametrize("rnn_type", ["LSTM", "GRU"])
def test_outputs_state_and_gradients_match_torch(rnn_type):
    net, ref = _pair(rnn_type)
    assert [n for n, _ in net.named_parameters()] == [n for n, _ in ref.named_parameters()]
    x, y = _batch(1)
    hidden = _hidden(rnn_type)
    ours = net.eval()(x, hidden)
    theirs, state = ref(torch.tensor(x), _torch(hidden))
    np.testing.assert_allclose(ours[0], theirs.detach().numpy(), rtol=1e-11, atol=1e-12)
    flat_state = state if isinstance(state, tuple) else (state,)
    for a, b in zip(ours[1:], flat_state):
        np.testing.assert_allclose(a, b.detach().numpy(), rtol=1e-11, atol=1e-12)
    trainer = tl.Trainer(net, _loss, tl.optim.SGD(net.parameters(), lr=0.0))
    trainer.compute_gradients([x, hidden], y)
    TF.nll_loss(theirs, torch.tensor(y)).backward()
    assert_grads_like_torch(net, ref)


def test_the_examples_training_loop_matches_torch():
    net, ref = _pair("LSTM")
    lr, clip = 5.0, 0.25
    optimizer = tl.optim.SGD(net.parameters(), lr=lr)
    trainer = tl.Trainer(net, _loss, optimizer)
    hidden, t_hidden = _hidden("LSTM"), _torch(_hidden("LSTM"))
    for step in range(50):
        x, y = _batch(100 + step)
        # torch: model.zero_grad(); output, hidden = model(data, hidden); loss.backward();
        # clip_grad_norm_(model.parameters(), clip); p.data.add_(p.grad, alpha=-lr)
        trainer.zero_grad()
        result = trainer.compute_gradients([x, hidden], y, return_outputs=True)
        tl.nn.utils.clip_grad_norm_(net.parameters(), clip)
        optimizer.step()
        hidden = tuple(result.outputs[1:])  # the state carries over (repackage_hidden: no gradient)
        ref.zero_grad()
        output, t_hidden = ref(torch.tensor(x), tuple(h.detach() for h in t_hidden))
        loss = TF.nll_loss(output, torch.tensor(y))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
        with torch.no_grad():
            for p in ref.parameters():
                p.add_(p.grad, alpha=-lr)
        assert result.loss == pytest.approx(loss.item(), rel=1e-9), f"step {step}"
    np.testing.assert_allclose(net.decoder.weight, ref.decoder.weight.detach().numpy(), rtol=1e-8, atol=1e-10)
