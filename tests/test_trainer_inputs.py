"""Models with several inputs train through the trainer: an LSTM over variable-length sequences."""
import numpy as np
import pytest
import torch

import treadle as tl


class LastHidden(tl.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = tl.nn.LSTM(3, 5, num_layers=2, batch_first=True, dtype="float64")
        self.fc = tl.nn.Linear(5, 1, dtype="float64")

    def forward(self, x, lengths):
        _, (h, _) = self.lstm(x, lengths=lengths)
        return self.fc(h[-1])


class TorchLastHidden(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(3, 5, num_layers=2, batch_first=True, dtype=torch.float64)
        self.fc = torch.nn.Linear(5, 1, dtype=torch.float64)

    def forward(self, x, lengths):
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        _, (h, _) = self.lstm(packed)
        return self.fc(h[-1])


def test_lstm_with_lengths_trains_like_torch():
    ref = TorchLastHidden()
    net = LastHidden()
    net.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6, 3))
    lengths = np.array([6, 2, 4, 1], dtype=np.int64)
    y = rng.standard_normal((4, 1))
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(5):
        loss = trainer.step([x, lengths], y)
        opt.zero_grad()
        tloss = torch.nn.functional.mse_loss(ref(torch.tensor(x), torch.tensor(lengths)), torch.tensor(y))
        tloss.backward()
        opt.step()
        assert loss == pytest.approx(tloss.item(), rel=1e-12)
    state = net.state_dict()
    for k, v in ref.state_dict().items():
        np.testing.assert_allclose(state[k], v.numpy(), rtol=1e-11, atol=1e-13, err_msg=k)
    np.testing.assert_allclose(trainer.evaluate((x, lengths), y),
                               torch.nn.functional.mse_loss(ref(torch.tensor(x), torch.tensor(lengths)),
                                                            torch.tensor(y)).item(), rtol=1e-12)


def test_forward_backward_with_two_inputs():
    net = LastHidden()
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    x = np.random.default_rng(1).standard_normal((2, 4, 3))
    out = trainer.forward([x, np.array([4, 3])])
    trainer.backward(np.ones_like(out))
    assert any(np.abs(g).sum() > 0 for g in net.named_gradients().values())
    with pytest.raises(ValueError, match="no inputs"):
        trainer.step([], np.zeros((2, 1)))


def test_wrong_dtype_names_which_input():
    class TwoInputs(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = tl.nn.Linear(3, 2)

        def forward(self, a, b):
            return self.fc(a) + self.fc(b)

    net = TwoInputs()
    a = np.ones((4, 3), np.float32)
    with pytest.raises(TypeError, match="model: expected input 1 of dtype float32 .*got float64"):
        net.predict((a, a.astype(np.float64)))
