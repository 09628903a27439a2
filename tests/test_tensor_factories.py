"""tl.zeros / ones / full: numpy arrays outside a forward (buffers built in __init__), constant symbols
inside one (in the model's dtype unless named), as torch code uses torch.zeros in both places."""
import numpy as np
import pytest
import torch

import treadle as tl


def test_outside_a_forward_they_are_arrays():
    assert tl.zeros(2, 3).dtype == np.float32 and tl.zeros((2, 3)).shape == (2, 3)
    np.testing.assert_array_equal(tl.ones(4, dtype=tl.double), np.ones(4))
    np.testing.assert_array_equal(tl.full((2,), 7.5, dtype=torch.float64), np.full(2, 7.5))
    with pytest.raises(TypeError, match="non-negative ints"):
        tl.zeros(2.5)
    with pytest.raises(ValueError, match="backend"):
        tl.zeros(2, device="cuda")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_inside_a_forward_they_are_constants(dtype):
    class Net(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = tl.nn.Linear(3, 2)

        def forward(self, x):
            return self.fc(x) * tl.ones(x.size(0), 2) + tl.full((2,), 0.5) + tl.zeros(2)

    net = Net().to(dtype)
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(dtype)
    ref = x @ net.fc.weight.T + net.fc.bias + 0.5
    out = net.eval()(x)
    assert out.dtype == dtype
    np.testing.assert_allclose(out, ref, rtol=1e-6 if dtype == "float32" else 1e-14)
    trainer = tl.Trainer(net, lambda o, y: (o * y).sum(), tl.optim.SGD(lr=0.0))
    trainer.compute_gradients(x, np.ones((4, 2), dtype))  # constants take no gradient; the weights do
    np.testing.assert_allclose(net.named_gradients()["fc.bias"], np.full(2, 4.0))
