"""tl.nn.init: torch.nn.init's names, arguments and formulas (gains, fans, bounds), in place on a
layer's parameter views, seeded by tl.manual_seed."""
import math

import numpy as np
import pytest
import torch

import treadle as tl

init = tl.nn.init


@pytest.mark.parametrize("name,param", [("linear", None), ("conv2d", None), ("sigmoid", None), ("tanh", None),
                                        ("relu", None), ("leaky_relu", None), ("leaky_relu", 0.2), ("selu", None)])
def test_gain_is_torchs(name, param):
    assert init.calculate_gain(name, param) == pytest.approx(torch.nn.init.calculate_gain(name, param), rel=1e-15)


@pytest.mark.parametrize("shape", [(5, 3), (8, 4, 3), (6, 2, 3, 3), (4, 2, 1, 2, 3)])
def test_fans_are_torchs(shape):
    ours = init._fans(np.zeros(shape), "test")
    assert ours == torch.nn.init._calculate_fan_in_and_fan_out(torch.zeros(shape))


def _bound_and_std(fn, shape, **kw):
    """(largest |value|, std) after fn on a large array, ours."""
    w = np.zeros(shape)
    fn(w, **kw)
    return np.abs(w).max(), w.std()


@pytest.mark.parametrize("fn,kw,expected_bound,expected_std", [
    ("uniform_", {"a": -0.3, "b": 0.3}, 0.3, 0.3 / math.sqrt(3)),
    ("normal_", {"std": 0.02}, None, 0.02),
    ("xavier_uniform_", {"gain": 2.0}, 2.0 * math.sqrt(6 / (400 + 300)), 2.0 * math.sqrt(2 / (400 + 300))),
    ("xavier_normal_", {}, None, math.sqrt(2 / (400 + 300))),
    ("kaiming_uniform_", {"a": math.sqrt(5)}, math.sqrt(3) * math.sqrt(2 / 6) / math.sqrt(300), math.sqrt(2 / 6) / math.sqrt(300)),
    ("kaiming_normal_", {"mode": "fan_out", "nonlinearity": "relu"}, None, math.sqrt(2) / math.sqrt(400)),
])
def test_distributions_have_torchs_scale(fn, kw, expected_bound, expected_std):
    shape = (400, 300)  # fan_in 300, fan_out 400: 120000 draws, std known to ~0.5%
    bound, std = _bound_and_std(getattr(init, fn), shape, **kw)
    t = torch.zeros(shape, dtype=torch.float64)
    getattr(torch.nn.init, fn)(t, **kw)
    assert std == pytest.approx(expected_std, rel=0.02)
    assert std == pytest.approx(t.std().item(), rel=0.03)
    if expected_bound is not None:
        assert expected_bound * 0.999 < bound <= expected_bound


def test_trunc_normal_stays_in_range():
    w = np.zeros((300, 200))
    init.trunc_normal_(w, mean=0.1, std=1.0, a=-1.0, b=0.5)
    assert w.min() >= -1.0 and w.max() <= 0.5
    t = torch.nn.init.trunc_normal_(torch.zeros(300, 200, dtype=torch.float64), mean=0.1, std=1.0, a=-1.0, b=0.5)
    assert w.mean() == pytest.approx(t.mean().item(), abs=0.01)
    assert w.std() == pytest.approx(t.std().item(), rel=0.02)


def test_deterministic_ones_equal_torchs():
    for fn, shape, kw in [("constant_", (3, 4), {"val": 0.7}), ("ones_", (5,), {}), ("zeros_", (2, 3), {}),
                          ("eye_", (3, 5), {}), ("dirac_", (4, 2, 3, 3), {"groups": 2}), ("dirac_", (3, 3, 5), {})]:
        w = np.full(shape, 9.0)
        getattr(init, fn)(w, **kw)
        t = getattr(torch.nn.init, fn)(torch.full(shape, 9.0, dtype=torch.float64), **kw)
        np.testing.assert_array_equal(w, t.numpy(), err_msg=fn)


@pytest.mark.parametrize("shape", [(6, 4), (4, 6), (5, 2, 3)])
def test_orthogonal_is_orthogonal(shape):
    w = np.zeros(shape)
    init.orthogonal_(w, gain=1.5)
    flat = w.reshape(shape[0], -1)
    small = min(flat.shape)
    gram = flat @ flat.T if flat.shape[0] == small else flat.T @ flat
    np.testing.assert_allclose(gram, 2.25 * np.eye(small), atol=1e-12)


def test_writes_into_layer_parameters_and_is_seeded():
    def initialised():
        tl.manual_seed(3)
        net = tl.nn.Sequential(tl.nn.Linear(4, 8), tl.nn.Tanh(), tl.nn.Linear(8, 2))
        for m in net.modules():
            if isinstance(m, tl.nn.Linear):
                init.xavier_uniform_(m.weight, gain=init.calculate_gain("tanh"))
                init.zeros_(m.bias)
        return net

    a, b = initialised(), initialised()
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        np.testing.assert_array_equal(x, y, err_msg=name)
    assert np.all(a[0].bias == 0) and np.abs(a[0].weight).max() <= 5 / 3 * math.sqrt(6 / 12)
    net = a.eval()  # once compiled, parameters() views the flat buffer: init writes through them
    for p in net.parameters():
        init.constant_(p, 0.5)
    np.testing.assert_allclose(net(np.ones((1, 4), np.float32)), np.full((1, 2), 0.5 + 8 * 0.5 * np.tanh(2.5)),
                               rtol=1e-6)
    custom = tl.nn.Parameter(np.zeros(3))
    init.ones_(custom)
    np.testing.assert_array_equal(custom.data, np.ones(3))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        init.xavier_uniform_(np.zeros(4))
    with pytest.raises(TypeError, match="floating"):
        init.normal_(np.zeros(4, np.int64))
    ro = np.zeros(4)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        init.uniform_(ro)
    with pytest.raises(ValueError, match="mode"):
        init.kaiming_normal_(np.zeros((3, 3)), mode="fan_avg")
    with pytest.raises(ValueError, match="Unsupported nonlinearity"):
        init.calculate_gain("swish")
    with pytest.raises(TypeError, match="numpy array"):
        init.zeros_([0.0, 1.0])
