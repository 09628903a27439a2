"""End to end against PyTorch: the same network with the same initial weights, trained on the same
batches with the same optimizer, follows the same loss curve and ends with the same weights."""
import numpy as np
import pytest
import torch

import treadle as tl

STEPS = 200
# Rounding differs between the two implementations and 200 Adam steps carry it forward; measured
# drift is ~3e-7 relative in float32 and ~1e-15 in float64, so these bounds leave room without hiding bugs.
CURVE_TOL = {"float32": dict(rtol=1e-5, atol=1e-7), "float64": dict(rtol=1e-10, atol=1e-13)}
WEIGHT_TOL = {"float32": dict(rtol=1e-5, atol=1e-6), "float64": dict(rtol=1e-10, atol=1e-12)}


def _regression_data(dtype, n=256, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (n, 8))
    y = np.sin(x[:, :1] * 2) * np.cos(x[:, 1:2]) + 0.3 * x[:, 2:3] * x[:, 3:4] - 0.2 * x[:, 4:5]
    return x.astype(dtype), y.astype(dtype)


def _batches(n, batch, steps, seed=1):
    """Fixed mini-batch index sets (both frameworks see the same batches in the same order)."""
    rng = np.random.default_rng(seed)
    return [rng.choice(n, batch, replace=False) for _ in range(steps)]


def _train_both(net, ref, loss, ref_loss_fn, make_opt, ref_opt, x, y, batches):
    trainer = tl.Trainer(net, loss, make_opt)
    ours, theirs = [], []
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    for idx in batches:
        ours.append(trainer.step(x[idx], y[idx]))
        ref_opt.zero_grad()
        value = ref_loss_fn(ref(tx[idx]), ty[idx])
        value.backward()
        ref_opt.step()
        theirs.append(value.item())
    return np.array(ours), np.array(theirs), trainer


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_mlp_regression_adam_matches_torch(mlp_pair, dtype):
    net, ref = mlp_pair((8, 32, 32, 1), act="tanh", dtype=dtype, seed=0)
    x, y = _regression_data(dtype)
    ours, theirs, trainer = _train_both(
        net, ref, tl.loss.MSE(), torch.nn.functional.mse_loss, tl.optim.Adam(lr=1e-3),
        torch.optim.Adam(ref.parameters(), lr=1e-3), x, y, _batches(len(x), 32, STEPS))
    np.testing.assert_allclose(ours, theirs, **CURVE_TOL[dtype])
    assert trainer.steps == STEPS
    assert ours[-20:].mean() < 0.5 * ours[:20].mean()  # it learned something
    for name, p in ref.state_dict().items():
        np.testing.assert_allclose(net.state_dict()[name], p.numpy(), err_msg=name, **WEIGHT_TOL[dtype])
    # And the trained models agree on fresh inputs.
    xt, _ = _regression_data(dtype, n=50, seed=9)
    np.testing.assert_allclose(net.predict(xt), ref(torch.from_numpy(xt)).detach().numpy(), **WEIGHT_TOL[dtype])


def _classification_data(dtype, n=300, seed=3):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 4))
    centers = np.array([[1.5, 0, 0, 0], [-1.5, 1, 0, 0], [0, -1.5, 1, 0]])
    labels = np.argmin(((x[:, None, :] - centers[None]) ** 2).sum(-1), axis=1).astype(np.int64)
    return x.astype(dtype), labels


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_classifier_cross_entropy_matches_torch(mlp_pair, dtype):
    net, ref = mlp_pair((4, 32, 32, 3), act="tanh", dtype=dtype, seed=5)
    x, labels = _classification_data(dtype)
    ours, theirs, trainer = _train_both(
        net, ref, tl.loss.CrossEntropy(), torch.nn.functional.cross_entropy, tl.optim.Adam(lr=3e-3),
        torch.optim.Adam(ref.parameters(), lr=3e-3), x, labels, _batches(len(x), 30, STEPS, seed=4))
    np.testing.assert_allclose(ours, theirs, **CURVE_TOL[dtype])
    accuracy = np.mean(np.argmax(net.predict(x), axis=1) == labels)
    assert accuracy > 0.9
    assert trainer.evaluate(x, labels) < 0.5 * ours[0]


def test_relu_classifier_sgd_momentum_matches_torch(mlp_pair):
    net, ref = mlp_pair((4, 24, 3), act="relu", dtype="float64", seed=8)
    x, labels = _classification_data("float64", seed=6)
    ours, theirs, _ = _train_both(
        net, ref, tl.loss.CrossEntropy(), torch.nn.functional.cross_entropy,
        tl.optim.SGD(lr=0.05, momentum=0.9), torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9),
        x, labels, _batches(len(x), 25, 100, seed=7))
    np.testing.assert_allclose(ours, theirs, **CURVE_TOL["float64"])


def test_fit_reaches_the_torch_loss(mlp_pair):
    """fit with shuffle=False and full batches is the same computation as torch's loop."""
    net, ref = mlp_pair((8, 32, 32, 1), dtype="float64", seed=2)
    x, y = _regression_data("float64", n=64)
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=1e-2))
    hist = trainer.fit(x, y, epochs=50, batch_size=64, shuffle=False)
    opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    curve = []
    for _ in range(50):
        opt.zero_grad()
        value = torch.nn.functional.mse_loss(ref(torch.from_numpy(x)), torch.from_numpy(y))
        value.backward()
        opt.step()
        curve.append(value.item())
    np.testing.assert_allclose(hist["loss"], curve, **CURVE_TOL["float64"])
