"""LSTM with proj_size > 0 (torch's LSTMP) against torch in float64: parameter names and shapes, outputs,
final states and every parameter's gradient, with stacked and bidirectional layers, initial states,
batch_first, no bias, unbatched input, packed lengths, dropout off in eval; saving; bad arguments."""
import numpy as np
import pytest
import torch

import treadle as tl
from opcheck import assert_grads_like_torch

CASES = [  # (LSTM keyword arguments, input shape, give initial states, lengths)
    (dict(input_size=3, hidden_size=5, proj_size=2), (4, 2, 3), False, None),
    (dict(input_size=3, hidden_size=5, proj_size=2, num_layers=2, bidirectional=True), (4, 2, 3), True, None),
    (dict(input_size=3, hidden_size=5, proj_size=3, batch_first=True, bias=False), (2, 4, 3), True, None),
    (dict(input_size=3, hidden_size=5, proj_size=2, num_layers=2), (4, 3), True, None),  # unbatched
    (dict(input_size=3, hidden_size=4, proj_size=2, batch_first=True, bidirectional=True), (3, 5, 3), False,
     [5, 2, 3]),
    (dict(input_size=2, hidden_size=4, proj_size=1, num_layers=2, dropout=0.3), (3, 2, 2), False, None),
]


class Net(tl.nn.Module):
    def __init__(self, kw, packed):
        super().__init__()
        self.lstm, self.packed = tl.nn.LSTM(**kw, dtype="float64"), packed

    def forward(self, x, *rest):
        out, (h, c) = self.lstm(x, None, rest[0]) if self.packed else self.lstm(x, tuple(rest) if rest else None)
        return out, h, c


def torch_run(ref, kw, x, hx, lengths):
    if lengths is None:
        return ref(x, hx)
    first = kw.get("batch_first", False)
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor(lengths), batch_first=first, enforce_sorted=False)
    out, state = ref(packed)
    out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=first, total_length=x.shape[1 if first else 0])
    return out, state


@pytest.mark.parametrize("kw,shape,with_states,lengths", CASES, ids=[str(i) for i in range(len(CASES))])
def test_projected_lstm_is_torchs(kw, shape, with_states, lengths):
    torch.manual_seed(0)
    ref = torch.nn.LSTM(**kw, dtype=torch.float64).eval()  # eval: dropout off on both sides
    net = Net(kw, lengths is not None).double()
    assert [n for n, _ in net.named_parameters()] == ["lstm." + n for n, _ in ref.named_parameters()]
    for name, p in ref.named_parameters():
        mine = getattr(net.lstm, name)
        assert mine.shape == tuple(p.shape), name
        mine[...] = p.detach().numpy()
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape)
    layers = kw.get("num_layers", 1) * (2 if kw.get("bidirectional") else 1)
    batch = () if len(shape) == 2 else (shape[0] if kw.get("batch_first") else shape[1],)
    hx = (rng.standard_normal((layers, *batch, kw["proj_size"])),
          rng.standard_normal((layers, *batch, kw["hidden_size"]))) if with_states else None
    tx = torch.tensor(x)
    out, (h, c) = torch_run(ref, kw, tx, None if hx is None else tuple(torch.tensor(s) for s in hx), lengths)
    inputs = [x] + (list(hx) if hx else []) + ([np.array(lengths, np.int64)] if lengths else [])
    got = net.eval()(*inputs) if len(inputs) > 1 else net.eval()(x)
    for mine, theirs in zip(got, (out, h, c)):
        np.testing.assert_allclose(mine, theirs.detach().numpy(), rtol=1e-12, atol=1e-13)
    seeds = [rng.standard_normal(t.shape) for t in (out, h, c)]
    sum((t * torch.tensor(s)).sum() for t, s in zip((out, h, c), seeds)).backward()
    net.lstm.dropout = 0.0  # the reference ran in eval mode: no dropout between layers
    trainer = tl.Trainer(net.train(), tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    trainer.forward(inputs if len(inputs) > 1 else x)
    trainer.backward(tuple(seeds))
    assert_grads_like_torch(net, ref, prefix="lstm.")


def test_initialisation_bounds_and_repr():
    layer = tl.nn.LSTM(4, 16, proj_size=3)
    assert type(layer).__name__ == "ProjectedLSTM" and "proj_size=3" in repr(layer)
    bound = 1 / 4.0  # 1 / sqrt(hidden_size), every weight and bias
    for name, p in layer.named_parameters():
        assert np.abs(p).max() <= bound and np.abs(p).max() > 0.5 * bound, name
    assert layer.weight_hr_l0.shape == (3, 16) and layer.weight_hh_l0.shape == (64, 3)


def test_saved_and_loaded(tmp_path):
    net = tl.nn.Sequential(tl.nn.LSTM(3, 5, proj_size=2, num_layers=2, batch_first=True))
    x = np.random.default_rng(2).standard_normal((2, 4, 3)).astype(np.float32)
    tl.save(net, tmp_path / "lstmp.treadle")
    back = tl.load(tmp_path / "lstmp.treadle")
    assert back[0].proj_size == 2 and back[0].num_layers == 2
    for mine, theirs in zip(back.eval()(x), net.eval()(x)):
        np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize("kw,message", [
    (dict(proj_size=5), r"proj_size must be between 1 and hidden_size - 1 \(4\)"),
    (dict(proj_size=-1), "proj_size must be between"),
    (dict(proj_size=2, dropout=1.5), r"dropout must be in \[0, 1\]"),
])
def test_bad_arguments_are_named(kw, message):
    with pytest.raises(ValueError, match=message):
        tl.nn.LSTM(3, 5, **kw)


def test_bad_state_shapes_are_named():
    class M(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = tl.nn.LSTM(3, 5, proj_size=2)

        def forward(self, x, h, c):
            return self.lstm(x, (h, c))[0]

    with pytest.raises(ValueError, match=r"expected h_0 of shape \(1, 2, 2\), got \(1, 2, 5\)"):
        M().eval()(np.zeros((4, 2, 3), np.float32), np.zeros((1, 2, 5), np.float32), np.zeros((1, 2, 5), np.float32))
