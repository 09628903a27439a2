"""Noise inside the graph: tl.functional.rand_like / randn_like. Distribution, reproducibility for
a seed, a new draw per step and per node, independence of the executor's chunking, no gradient into
the noise, and the reparameterised gradient against torch given the same noise."""
import concurrent.futures

import numpy as np
import pytest
import torch

import treadle as tl
import treadle.functional as F
from opcheck import run


def draw(distribution, shape, dtype=np.float64, seed=0, workers=1):
    attrs = {"shape": list(shape), "dtype": np.dtype(dtype).name, "distribution": distribution, "stream": 7}
    (y,), _ = tl._core.run_op("random", [], attrs, None, "eigen", True, seed, workers)
    return y


def test_normal_draws_are_standard_normal():
    z = draw("normal", (200_000,))
    assert abs(z.mean()) < 5 * 1 / np.sqrt(z.size)          # 5 standard errors
    assert abs(z.std() - 1) < 5 * np.sqrt(0.5 / z.size)
    # the tails: P(|z| > 2) = 0.0455, P(|z| > 3) = 0.0027
    assert abs(np.mean(np.abs(z) > 2) - 0.0455) < 0.003
    assert abs(np.mean(np.abs(z) > 3) - 0.0027) < 0.0007
    assert np.all(np.isfinite(z))


def test_uniform_draws_cover_zero_to_one():
    u = draw("uniform", (100_000,))
    assert u.min() >= 0 and u.max() < 1
    np.testing.assert_allclose(np.histogram(u, bins=10, range=(0, 1))[0] / u.size, 0.1, atol=0.005)


def test_draws_depend_on_seed_only_not_on_chunking_or_dtype():
    a = draw("normal", (3, 50_000), seed=1)
    np.testing.assert_array_equal(a, draw("normal", (3, 50_000), seed=1, workers=2))
    assert not np.array_equal(a, draw("normal", (3, 50_000), seed=2))
    np.testing.assert_allclose(draw("normal", (3, 50_000), np.float32, seed=1), a, rtol=1e-6, atol=1e-6)


class Noisy(tl.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = tl.nn.Linear(3, 4)

    def forward(self, x):
        h = self.fc(x)
        return h + F.randn_like(h), F.rand_like(h)


def test_each_run_draws_anew_and_a_seed_repeats_the_sequence(rng):
    x = rng.standard_normal((5, 3)).astype(np.float32)
    net = Noisy()
    runs = [net.predict(x, context=ctx) for ctx in (tl.Context(seed=3),) for _ in range(2)]
    assert not np.array_equal(runs[0][0], runs[1][0])
    ctx = tl.Context(seed=3)
    again = [net.predict(x, context=ctx) for _ in range(2)]
    for r, s in zip(runs, again):
        np.testing.assert_array_equal(r[0], s[0])
        np.testing.assert_array_equal(r[1], s[1])
    # two nodes of one graph draw different numbers
    assert not np.allclose(runs[0][0] - net.predict(x, context=tl.Context(seed=99))[0], 0)


def test_pool_executor_gives_the_serial_draws(rng):
    x = rng.standard_normal((4000, 3)).astype(np.float32)
    net = Noisy()
    serial = net.predict(x, context=tl.Context(seed=5))
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        parallel = net.predict(x, context=tl.Context(seed=5, executor=tl.PoolExecutor(pool, 2)))
    np.testing.assert_array_equal(serial[0], parallel[0])
    np.testing.assert_array_equal(serial[1], parallel[1])


class Reparameterised(tl.nn.Module):
    """z = mu + exp(logvar / 2) * eps; outputs z and eps, so the test can replay eps in torch."""

    def __init__(self):
        super().__init__()
        self.mu = tl.nn.Linear(3, 2)
        self.logvar = tl.nn.Linear(3, 2)

    def forward(self, x):
        mu, logvar = self.mu(x), self.logvar(x)
        eps = F.randn_like(mu)
        return mu + (0.5 * logvar).exp() * eps, eps


def test_gradient_flows_through_mu_and_sigma_not_the_noise(rng):
    torch.manual_seed(0)
    tmu, tlogvar = torch.nn.Linear(3, 2).double(), torch.nn.Linear(3, 2).double()
    net = Reparameterised().double()
    net.load_state_dict({**{f"mu.{k}": v for k, v in tmu.state_dict().items()},
                         **{f"logvar.{k}": v for k, v in tlogvar.state_dict().items()}})
    x = rng.standard_normal((6, 3))
    g = rng.standard_normal((6, 2))
    loss = lambda out, y: (out[0] * y).sum()  # noqa: E731  (d loss / dz = g)
    # A fresh context and a fresh trainer with one seed draw the same noise on their first run (the
    # same node of the same trace): predict shows it, the trainer computes the gradients.
    z, eps = net.predict(x, context=tl.Context(seed=4))
    trainer = tl.Trainer(net, loss, tl.optim.SGD(lr=0.1), seed=4)
    trainer.zero_grad()
    trainer.compute_gradients(x, g)
    tx = torch.from_numpy(x)
    tz = tmu(tx) + (0.5 * tlogvar(tx)).exp() * torch.from_numpy(eps)
    np.testing.assert_allclose(z, tz.detach().numpy(), rtol=1e-13)
    tz.backward(torch.from_numpy(g))
    flat = net.flat_gradients()
    grads = {n: flat[o:o + int(np.prod(s))].reshape(s) for n, s, o in net._compiled().layout}
    for name, p in [("mu.weight", tmu.weight), ("mu.bias", tmu.bias), ("logvar.weight", tlogvar.weight),
                    ("logvar.bias", tlogvar.bias)]:
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=1e-12, err_msg=name)


@pytest.mark.parametrize("attrs, error, match", [
    ({"shape": [2], "dtype": "float32", "distribution": "gamma", "stream": 0}, ValueError, "distribution must be"),
    ({"shape": [2], "dtype": "int64", "distribution": "normal", "stream": 0}, TypeError, "random"),
    ({"shape": [-2], "dtype": "float32", "distribution": "normal", "stream": 0}, ValueError, "negative dimension"),
    ({"shape": [2], "dtype": "float32", "distribution": "normal"}, ValueError, "missing attribute 'stream'"),
])
def test_bad_attributes_are_named(attrs, error, match):
    with pytest.raises(error, match=match):
        run("random", [], attrs)


def test_noise_like_an_integer_symbol_is_refused():
    class IntNoise(tl.nn.Module):
        def forward(self, x):
            return F.randn_like(x)

    with pytest.raises(TypeError, match="random"):
        IntNoise().predict(np.ones((2, 2), np.int64))


def test_normal_is_the_reparameterised_draw(rng):
    """F.normal(mean, std) = mean + std * randn_like(mean): standard normal once centred and scaled,
    new every step, and gradients into mean and std as the reparameterisation gives them."""
    import treadle.functional as F
    from opcheck import param_grads

    class Noisy(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.mu = tl.nn.Linear(3, 4)
            self.log_sigma = tl.nn.Linear(3, 4)

        def forward(self, x):
            return F.normal(self.mu(x), self.log_sigma(x).exp())

    x = rng.standard_normal((256, 3))
    net = Noisy().double()
    trainer = tl.Trainer(net, lambda out, y: (out ** 2).mean(), tl.optim.SGD(lr=0.1), seed=7)
    p = {k: np.asarray(v) for k, v in net.state_dict().items()}
    mu = x @ p["mu.weight"].T + p["mu.bias"]
    sigma = np.exp(x @ p["log_sigma.weight"].T + p["log_sigma.bias"])
    trainer.zero_grad()
    first = trainer.compute_gradients(x, np.zeros((256, 4)), return_outputs=True)
    z = (first.outputs - mu) / sigma
    assert abs(z.mean()) < 0.1 and abs(z.std() - 1) < 0.1
    g_out = 2 * first.outputs / first.outputs.size
    grads = param_grads(net)
    np.testing.assert_allclose(grads["mu.weight"], g_out.T @ x, rtol=1e-10)
    np.testing.assert_allclose(grads["log_sigma.weight"], (g_out * z * sigma).T @ x, rtol=1e-10)
    second = trainer.compute_gradients(x, np.zeros((256, 4)), return_outputs=True)
    assert not np.allclose(first.outputs, second.outputs)  # new noise every step
