"""Elementwise runs (core/plan_elementwise.cpp): consecutive elementwise Eigen steps over values of
one shape run block by block, every step on a block before the next block. Results must be those
of the step-by-step run bit for bit, for any number of lent workers, and the runs must be there
(a double-backward graph is mostly such chains)."""
import concurrent.futures

import numpy as np
import pytest

import treadle as tl

F = tl.functional


def _pinn(fusion, width=64, executor=None):
    """The PINN of the benchmark (u_t - 0.1 u_xx residual and a misfit), three tanh layers."""
    tl.manual_seed(0)
    net = tl.nn.Sequential(tl.nn.Linear(2, width), tl.nn.Tanh(), tl.nn.Linear(width, width), tl.nn.Tanh(),
                           tl.nn.Linear(width, width), tl.nn.Tanh(), tl.nn.Linear(width, 1))
    net.fusion = fusion

    def loss(u, y, xt):
        (du,) = F.grad(u, xt, F.ones_like(u))
        (d2u,) = F.grad(du[:, 0:1], xt, F.ones_like(u))
        residual = du[:, 1:2] - 0.1 * d2u[:, 0:1]
        return (residual ** 2).mean() + ((u - y) ** 2).mean()

    return net, tl.Trainer(net, loss, tl.optim.Adam(lr=1e-3), executor=executor)


def _data(batch=1024):
    rng = np.random.default_rng(0)
    xt = rng.uniform(-1, 1, (batch, 2)).astype(np.float32)
    return xt, np.sin(xt[:, :1]).astype(np.float32)


def _train(fusion, steps=4, executor=None):
    net, trainer = _pinn(fusion, executor=executor)
    x, y = _data()
    losses = [trainer.step(x, y) for _ in range(steps)]
    return net, losses, {k: np.array(v) for k, v in net.state_dict().items()}


def test_the_pinn_step_runs_its_elementwise_chains_in_runs():
    net, _, _ = _train(True, steps=1)
    described = net._compiled().describe_plans()
    runs = {line.split(" run=")[1].split()[0] for line in described.splitlines() if " run=" in line}
    assert len(runs) >= 5, described
    off, _, _ = _train(False, steps=1)
    assert " run=" not in off._compiled().describe_plans()


def test_runs_are_bitwise_the_step_by_step_run():
    _, fused_losses, fused = _train(True)
    _, plain_losses, plain = _train(False)
    assert fused_losses == plain_losses
    for name in plain:
        np.testing.assert_array_equal(fused[name], plain[name], err_msg=name)


@pytest.mark.parametrize("workers", [2, 3])
def test_runs_split_over_lent_workers_give_the_same_bits(workers):
    _, serial_losses, serial = _train(True)
    with concurrent.futures.ThreadPoolExecutor(workers - 1) as pool:
        _, losses, params = _train(True, executor=tl.PoolExecutor(pool, workers))
    assert losses == serial_losses
    for name in serial:
        np.testing.assert_array_equal(params[name], serial[name], err_msg=name)


def test_runs_with_a_value_written_over_a_dead_one():
    # y = ((x * 2 + 1) * x - x) * 3: the memory plan reuses the bytes of values that died inside the
    # chain; float64 against numpy.
    class Chain(tl.nn.Module):
        def forward(self, x):
            return ((x * 2.0 + 1.0) * x - x) * 3.0

    x = np.random.default_rng(1).standard_normal((300, 100))
    model = Chain()
    model.to("float64")
    np.testing.assert_allclose(model.predict(x), ((x * 2.0 + 1.0) * x - x) * 3.0, rtol=1e-15, atol=0)
