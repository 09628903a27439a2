"""examples/mnist_port.py: pytorch/examples' MNIST network with only the imports changed. Against
the same class written with torch: state_dict keys, eval outputs, gradients and a 50-step Adadelta +
StepLR loss curve (float64; dropout off in both, as their random streams differ); and the example's
own training run learns its synthetic digits."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import treadle as tl
from opcheck import assert_grads_like_torch

ROOT = Path(__file__).resolve().parents[1]


def _example():
    spec = importlib.util.spec_from_file_location("mnist_port", ROOT / "examples" / "mnist_port.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TorchNet(torch.nn.Module):  # pytorch/examples' mnist Net
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 32, 3, 1)
        self.conv2 = torch.nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = torch.nn.Dropout(0.25)
        self.dropout2 = torch.nn.Dropout(0.5)
        self.fc1 = torch.nn.Linear(9216, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        x = TF.relu(self.conv2(TF.relu(self.conv1(x))))
        x = self.dropout1(TF.max_pool2d(x, 2))
        x = self.dropout2(TF.relu(self.fc1(torch.flatten(x, 1))))
        return TF.log_softmax(self.fc2(x), dim=1)


def _pair(mnist, dropout=True):
    torch.manual_seed(0)
    ref, net = TorchNet().double(), mnist.Net()
    if not dropout:
        ref.dropout1 = ref.dropout2 = torch.nn.Identity()
        net.dropout1, net.dropout2 = tl.nn.Identity(), tl.nn.Identity()
    net.double()
    tl.io.from_torch(ref, net)
    return net, ref


def test_ported_net_matches_torch():
    mnist = _example()
    net, ref = _pair(mnist)
    assert list(net.state_dict()) == list(ref.state_dict())
    x, y = mnist.synthetic_digits(8, seed=3)
    x = x.astype(np.float64)
    ref.eval()
    np.testing.assert_allclose(net.eval()(x), ref(torch.tensor(x)).detach().numpy(), rtol=1e-10, atol=1e-11)


def test_gradients_and_loss_curve_match_torch():
    mnist = _example()
    net, ref = _pair(mnist, dropout=False)
    x, y = mnist.synthetic_digits(64, seed=4)
    x = x.astype(np.float64)
    optimizer = tl.optim.Adadelta(net.parameters(), lr=1.0)
    trainer = tl.Trainer(net, tl.functional.nll_loss, optimizer)
    scheduler = tl.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    topt = torch.optim.Adadelta(ref.parameters(), lr=1.0)
    tsched = torch.optim.lr_scheduler.StepLR(topt, step_size=1, gamma=0.7)

    trainer.compute_gradients(x[:8], y[:8])
    TF.nll_loss(ref(torch.tensor(x[:8])), torch.tensor(y[:8])).backward()
    assert_grads_like_torch(net, ref, rtol=1e-9)

    for step in range(50):
        batch = slice(8 * (step % 8), 8 * (step % 8) + 8)
        ours = trainer.step(x[batch], y[batch])
        topt.zero_grad()
        loss = TF.nll_loss(ref(torch.tensor(x[batch])), torch.tensor(y[batch]))
        loss.backward()
        topt.step()
        assert ours == pytest.approx(loss.item(), rel=1e-7, abs=1e-10), f"step {step}"
        if step % 10 == 9:  # an "epoch" of ten batches
            scheduler.step()
            tsched.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(topt.param_groups[0]["lr"], rel=1e-15)


def test_example_learns_its_digits(capsys):
    # Measured: 1024 samples, one epoch: test loss 0.08, accuracy 1.0 (seed 1).
    loss, accuracy = _example().main(["--epochs", "1", "--train-size", "1024", "--test-size", "256"])
    assert accuracy > 0.9 and loss < 0.5
    assert "Test set: Average loss" in capsys.readouterr().out
