"""F.batch_norm with torch's signature against torch in float64: training steps that update the
running statistics in place (buffers of the module, as torch code keeps them), eval with the running
statistics, a lone weight or bias, no running statistics, gradients; and bad arguments."""
import numpy as np
import pytest
import torch

import treadle as tl
import treadle.functional as F
from opcheck import assert_grads_like_torch

C = 3


class Net(tl.nn.Module):
    def __init__(self, affine="both", tracked=True, momentum=0.1):
        super().__init__()
        self.affine, self.tracked, self.momentum = affine, tracked, momentum
        if affine in ("both", "weight"):
            self.weight = tl.nn.Parameter(np.linspace(0.5, 1.5, C))
        if affine in ("both", "bias"):
            self.bias = tl.nn.Parameter(np.linspace(-0.2, 0.3, C))
        if tracked:
            self.register_buffer("running_mean", np.zeros(C))
            self.register_buffer("running_var", np.ones(C))

    def forward(self, x):
        w = self.weight if self.affine in ("both", "weight") else None
        b = self.bias if self.affine in ("both", "bias") else None
        rm, rv = (self.running_mean, self.running_var) if self.tracked else (None, None)
        return F.batch_norm(x, rm, rv, w, b, training=self.training, momentum=self.momentum, eps=1e-5)


def torch_twin(net):
    ref = torch.nn.Module()
    for name in ("weight", "bias"):
        if name in dict(net.named_parameters()):
            setattr(ref, name, torch.nn.Parameter(torch.tensor(getattr(net, name).copy())))
    rm = torch.zeros(C, dtype=torch.float64) if net.tracked else None
    rv = torch.ones(C, dtype=torch.float64) if net.tracked else None
    return ref, rm, rv


@pytest.mark.parametrize("affine", ["both", "weight", "bias", "none"])
@pytest.mark.parametrize("tracked", [True, False])
def test_training_steps_and_eval_match_torch(affine, tracked):
    net = Net(affine, tracked, momentum=0.3).double()
    ref, rm, rv = torch_twin(net)
    rng = np.random.default_rng(0)
    trainer = tl.Trainer(net.train(), tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    for step in range(3):
        x = rng.standard_normal((4, C, 5)) * 2 + 1
        g = rng.standard_normal(x.shape)
        trainer.zero_grad()
        y = trainer.forward(x)
        trainer.backward(g)
        for p in ref.parameters():
            p.grad = None
        y_ref = torch.nn.functional.batch_norm(torch.tensor(x), rm, rv, getattr(ref, "weight", None),
                                               getattr(ref, "bias", None), True, 0.3, 1e-5)
        y_ref.backward(torch.tensor(g)) if y_ref.requires_grad else None
        np.testing.assert_allclose(y, y_ref.detach().numpy(), rtol=1e-11, atol=1e-12)
    if list(ref.parameters()):
        assert_grads_like_torch(net, ref)
    if tracked:
        np.testing.assert_allclose(net.running_mean, rm.numpy(), rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(net.running_var, rv.numpy(), rtol=1e-12, atol=1e-13)
        x = rng.standard_normal((2, C, 5))
        y_eval = torch.nn.functional.batch_norm(torch.tensor(x), rm, rv, getattr(ref, "weight", None),
                                                getattr(ref, "bias", None), False, 0.3, 1e-5)
        np.testing.assert_allclose(net.eval()(x), y_eval.detach().numpy(), rtol=1e-11, atol=1e-12)


def test_training_true_in_a_prediction_uses_batch_statistics_without_writing():
    net = Net()  # compiled as part of the model below

    class Always(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = net

        def forward(self, x):
            return F.batch_norm(x, self.inner.running_mean, self.inner.running_var, training=True)

    x = np.random.default_rng(1).standard_normal((4, C))
    model = Always().double().eval()
    expected = torch.nn.functional.batch_norm(torch.tensor(x), None, None, training=True).numpy()
    np.testing.assert_allclose(model(x), expected, rtol=1e-11, atol=1e-12)
    np.testing.assert_array_equal(net.running_mean, np.zeros(C))


def test_bad_arguments_are_named():
    class Half(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("rm", np.zeros(C))

        def forward(self, x):
            return F.batch_norm(x, self.rm, None)

    with pytest.raises(ValueError, match="give both running_mean and running_var"):
        Half().double().eval()(np.zeros((2, C)))

    class NoStats(tl.nn.Module):
        def forward(self, x):
            return F.batch_norm(x, None, None)

    with pytest.raises(ValueError, match="training=False needs running_mean and running_var"):
        NoStats().double().eval()(np.zeros((2, C)))
