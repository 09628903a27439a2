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
    # tanh's curvature terms are mul3 nodes (three inputs), and they join the runs too.
    in_runs = {line.split()[1] for line in described.splitlines() if " run=" in line}
    assert {"mul3", "tanh_backward", "add"} <= in_runs, described
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


class _EveryPointwiseOp(tl.nn.Module):
    """A chain through each op that says it is pointwise (OpDef::pointwise): the binary ops, scale,
    pow and every activation of the op table."""

    def forward(self, x):
        h = F.relu(x) + F.leaky_relu(x, 0.1)
        h = h * F.elu(x) - F.silu(x)
        h = h / (2.0 + F.tanh(x)) + F.sigmoid(x)
        return (F.softplus(h) + F.gelu(x)) ** 2 * 0.5


def _every_pointwise_op(fusion, x):
    model = _EveryPointwiseOp()
    model.set_backend("eigen")  # runs are made of Eigen steps
    model.fusion = fusion
    model.to(x.dtype.name)
    return model, model.predict(x)


def test_every_pointwise_op_joins_a_run_and_keeps_its_bits():
    x = np.random.default_rng(2).standard_normal((300, 100)).astype(np.float32)
    model, fused = _every_pointwise_op(True, x)
    described = model._compiled().describe_plans()
    in_runs = {line.split()[1] for line in described.splitlines() if " run=" in line}
    expected = {"relu", "leaky_relu", "add", "elu", "mul", "silu", "sub", "tanh", "div", "sigmoid", "softplus",
                "gelu", "pow", "scale"}
    assert in_runs == expected, described
    _, plain = _every_pointwise_op(False, x)
    np.testing.assert_array_equal(fused, plain)


def test_pointwise_runs_are_right_in_float64():
    # Against numpy: a wrong block offset or a step reading a block another step has not written yet
    # shows here as a wrong value, not only as a change of bits.
    from math import erf, sqrt

    x = np.random.default_rng(3).standard_normal((300, 100))
    _, fused = _every_pointwise_op(True, x)
    sig = 1.0 / (1.0 + np.exp(-x))
    h = np.maximum(x, 0) + np.where(x > 0, x, 0.1 * x)
    h = h * np.where(x > 0, x, np.expm1(x)) - x * sig
    h = h / (2.0 + np.tanh(x)) + sig
    softplus = np.where(h > 20.0, h, np.log1p(np.exp(np.minimum(h, 20.0))))
    gelu = 0.5 * x * (1.0 + np.vectorize(erf)(x / sqrt(2.0)))
    np.testing.assert_allclose(fused, (softplus + gelu) ** 2 * 0.5, rtol=1e-12, atol=1e-14)
