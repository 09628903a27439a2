"""Activation fusion: a linear whose only reader is a relu, tanh or sigmoid computes the activation
as its epilogue (attribute "activation"), and the activation node becomes a free view. Checked: the
fused op against finite differences (float64) and PyTorch, fused vs unfused results, which pairs are
fused and which must not be, training through fused layers, and bad attributes."""
import re

import numpy as np
import pytest

import treadle as tl
import treadle.functional as F
from opcheck import BACKENDS, gradcheck, run, tol, torch_grads

ACTIVATIONS = ["relu", "tanh", "sigmoid"]


def linear_inputs(rng, dtype, rows=37, n_in=29, n_out=23, bias=True):
    xs = [rng.standard_normal((rows, n_in)), rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)]
    if bias:
        xs.append(rng.standard_normal(n_out))
    return [x.astype(dtype) for x in xs]


def steps(model):
    """[(op, backend, extras)] of every step of every compiled plan."""
    return re.findall(r"^\d+ (\S+) \[(\w+)\]((?: bf16| \+\w+)*)", model._compiled().describe_plans(), flags=re.M)


@pytest.mark.parametrize("act", ACTIVATIONS)
@pytest.mark.parametrize("bias", [True, False])
def test_fused_linear_gradcheck_float64(act, bias):
    xs = linear_inputs(np.random.default_rng(1), np.float64, bias=bias)
    gradcheck("linear", xs, {"activation": act})


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act", ACTIVATIONS)
def test_fused_linear_matches_torch(backend, dtype, act):
    import torch

    rng = np.random.default_rng(2)
    # large enough for oneDNN's thresholds (2^17 multiply-adds), with a tile remainder
    xs = linear_inputs(rng, dtype, rows=300, n_in=70, n_out=530)
    gy = rng.standard_normal((300, 530)).astype(dtype)
    (y,), grads = run("linear", xs, {"activation": act}, [gy], backend)
    fn = getattr(torch, act)
    (ty,), tgrads = torch_grads(lambda x, w, b: fn(torch.nn.functional.linear(x, w, b)), xs, [gy], [0, 1, 2])
    # gradients are sums of up to 530 products: tolerances relative to each tensor's scale
    for i, (got, ref) in enumerate([(y, ty)] + [(grads[i], tgrads[i]) for i in range(3)]):
        t = tol(dtype)
        np.testing.assert_allclose(got, ref, rtol=t["rtol"], atol=t["rtol"] * np.abs(ref).max(), err_msg=f"{i}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("act", ACTIVATIONS)
def test_fused_equals_linear_then_activation(backend, act):
    rng = np.random.default_rng(3)
    xs = linear_inputs(rng, np.float32, rows=300, n_in=70, n_out=530)
    (fused,), _ = run("linear", xs, {"activation": act}, None, backend)
    (z,), _ = run("linear", xs, {}, None, backend)
    (unfused,), _ = run(act, [z], {}, None, "eigen")
    if act == "relu" and backend == "eigen":
        np.testing.assert_array_equal(fused, unfused)
    else:  # the same functions over differently aligned blocks, or oneDNN's eltwise post-op
        np.testing.assert_allclose(fused, unfused, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_fused_conv_gradcheck_float64(act):
    rng = np.random.default_rng(14)
    xs = [rng.standard_normal((2, 3, 6, 5)), rng.standard_normal((4, 3, 3, 3)) / 5, rng.standard_normal(4)]
    gradcheck("conv", xs, {"padding": [1, 1], "activation": act})


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("act", ACTIVATIONS)
@pytest.mark.parametrize("groups", [1, 2])
def test_fused_conv_matches_torch(backend, act, groups):
    import torch

    rng = np.random.default_rng(15)
    xs = [rng.standard_normal((8, 4, 12, 10)), rng.standard_normal((6, 4 // groups, 3, 3)) / 4,
          rng.standard_normal(6)]
    xs = [x.astype(np.float32) for x in xs]
    gy = rng.standard_normal((8, 6, 12, 10)).astype(np.float32)
    attrs = {"padding": [1, 1], "groups": groups, "activation": act}
    (y,), grads = run("conv", xs, attrs, [gy], backend)
    fn = getattr(torch, act)
    (ty,), tgrads = torch_grads(lambda x, w, b: fn(torch.nn.functional.conv2d(x, w, b, padding=1, groups=groups)),
                                xs, [gy], [0, 1, 2])
    for i, (got, ref) in enumerate([(y, ty)] + [(grads[i], tgrads[i]) for i in range(3)]):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max(), err_msg=f"{i}")


def test_cnn_conv_relu_pairs_are_fused():
    tl.manual_seed(16)
    net = tl.nn.Sequential(tl.nn.Conv2d(1, 4, 3, padding=1), tl.nn.ReLU(), tl.nn.MaxPool2d(2),
                           tl.nn.Conv2d(4, 4, 3, padding=1), tl.nn.BatchNorm2d(4), tl.nn.ReLU(), tl.nn.Flatten(),
                           tl.nn.Linear(64, 3))
    x = np.random.default_rng(17).standard_normal((5, 1, 8, 8)).astype(np.float32)
    fused = net.predict(x)
    ops = steps(net)
    # the first conv absorbs its relu; the second relu follows a batch norm and stays
    assert ("conv", "+relu") in [(op, e.strip()) for op, _, e in ops]
    assert [op for op, _, _ in ops].count("relu") == 1
    net.fusion = False
    np.testing.assert_array_equal(net.predict(x), fused)


@pytest.mark.parametrize("act", ["Tanh", "ReLU", "Sigmoid"])
def test_sequential_pairs_are_fused_and_match_torch(act):
    import torch

    tl.manual_seed(4)
    net = tl.nn.Sequential(tl.nn.Linear(12, 32), getattr(tl.nn, act)(), tl.nn.Linear(32, 32),
                           getattr(tl.nn, act)(), tl.nn.Linear(32, 3))
    x = np.random.default_rng(5).standard_normal((16, 12)).astype(np.float32)
    y = net.predict(x)
    ops = steps(net)
    assert [op for op, _, _ in ops] == ["linear", "fused_activation", "linear", "fused_activation", "linear"]
    assert [b for op, b, _ in ops if op == "fused_activation"] == ["view", "view"]
    assert [e.strip() for op, _, e in ops if op == "linear"] == [f"+{act.lower()}"] * 2 + [""]

    params = {k: torch.tensor(v) for k, v in net.state_dict().items()}
    h = torch.tensor(x)
    fn = getattr(torch, act.lower())
    for i in (0, 2):
        h = fn(torch.nn.functional.linear(h, params[f"{i}.weight"], params[f"{i}.bias"]))
    ref = torch.nn.functional.linear(h, params["4.weight"], params["4.bias"]).numpy()
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


class Observed(tl.nn.Module):
    """The pre-activation is read twice (kept and activated): nothing may be fused."""

    def __init__(self):
        super().__init__()
        self.fc = tl.nn.Linear(6, 8)

    def forward(self, x):
        z = self.fc(x)
        return F.cat([z, F.relu(z)], axis=1)


class PreActivationOut(tl.nn.Module):
    """The pre-activation is itself a model output."""

    def __init__(self):
        super().__init__()
        self.fc = tl.nn.Linear(6, 8)

    def forward(self, x):
        z = self.fc(x)
        return F.tanh(z), z


def test_observable_pre_activations_are_not_fused():
    tl.manual_seed(6)
    x = np.random.default_rng(7).standard_normal((5, 6)).astype(np.float32)
    obs = Observed()
    out = obs.predict(x)
    np.testing.assert_array_equal(out[:, 8:], np.maximum(out[:, :8], 0))
    assert ("relu", "eigen") in [(op, b) for op, b, _ in steps(obs)]
    assert "fused_activation" not in obs._compiled().describe_plans()

    two = PreActivationOut()
    a, z = two.predict(x)
    np.testing.assert_allclose(a, np.tanh(z), rtol=1e-6, atol=1e-7)
    assert "fused_activation" not in two._compiled().describe_plans()


def test_training_through_fused_layers_matches_torch():
    import torch

    tl.manual_seed(8)
    net = tl.nn.Sequential(tl.nn.Linear(10, 24), tl.nn.Tanh(), tl.nn.Linear(24, 24), tl.nn.ReLU(),
                           tl.nn.Linear(24, 24), tl.nn.Sigmoid(), tl.nn.Linear(24, 4)).to("float64")
    ref = torch.nn.Sequential(torch.nn.Linear(10, 24), torch.nn.Tanh(), torch.nn.Linear(24, 24), torch.nn.ReLU(),
                              torch.nn.Linear(24, 24), torch.nn.Sigmoid(), torch.nn.Linear(24, 4)).double()
    ref.load_state_dict({k: torch.tensor(v) for k, v in net.state_dict().items()})
    trainer = tl.Trainer(net, tl.loss.CrossEntropy(), tl.optim.SGD(lr=0.1))
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    rng = np.random.default_rng(9)
    for _ in range(5):
        x, y = rng.standard_normal((32, 10)), rng.integers(0, 4, 32)
        loss = trainer.step(x, y)
        opt.zero_grad()
        tloss = torch.nn.functional.cross_entropy(ref(torch.tensor(x)), torch.tensor(y))
        tloss.backward()
        opt.step()
        assert loss == pytest.approx(tloss.item(), rel=1e-12)
    for k, v in ref.state_dict().items():
        np.testing.assert_allclose(net.state_dict()[k], v.numpy(), rtol=1e-11, atol=1e-12, err_msg=k)
    assert "+tanh" in net._compiled().describe_plans() and "+sigmoid" in net._compiled().describe_plans()


def test_bad_activation_attributes_are_refused():
    xs = linear_inputs(np.random.default_rng(10), np.float32)
    with pytest.raises(ValueError, match="linear: unknown activation 'gelu'"):
        run("linear", xs, {"activation": "gelu"})
    with pytest.raises(TypeError, match="linear: attribute 'activation' must be a string"):
        run("linear", xs, {"activation": 1})


def test_fusion_can_be_turned_off_per_model():
    tl.manual_seed(11)
    net = tl.nn.Sequential(tl.nn.Linear(12, 32), tl.nn.ReLU(), tl.nn.Linear(32, 32), tl.nn.Tanh(),
                           tl.nn.Linear(32, 3))
    x = np.random.default_rng(12).standard_normal((16, 12)).astype(np.float32)
    assert net.fusion
    fused = net.predict(x)
    net.fusion = False
    assert not net.fusion
    plain = net.predict(x)
    ops = [op for op, _, _ in steps(net)]
    assert ops == ["linear", "relu", "linear", "tanh", "linear"]
    np.testing.assert_allclose(fused, plain, rtol=1e-6, atol=1e-7)
    net.fusion = True
    np.testing.assert_array_equal(net.predict(x), fused)
    assert "fused_activation" in [op for op, _, _ in steps(net)]


def test_unfused_anomaly_mode_sees_a_saturated_pre_activation():
    """An Inf pre-activation that tanh saturates to 1 is inside the fused node; unfused, anomaly mode
    names the linear that produced it."""
    tl.manual_seed(13)
    net = tl.nn.Sequential(tl.nn.Linear(4, 8), tl.nn.Tanh(), tl.nn.Linear(8, 2))
    net.fusion = False
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    trainer.detect_anomaly = True
    net.flat_parameters()[0] = np.inf
    x = np.ones((3, 4), np.float32)
    with pytest.raises(ValueError, match=r"check_numerics: node \d+ 'linear' in module '0' \(forward pass\) produced"):
        trainer.step(x, np.zeros((3, 2), np.float32))
