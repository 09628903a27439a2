"""Model: parameter names and layout, the flat buffer and its views, state dicts (also from torch),
dtype conversion, default initialisation, seeding, plan caching and parameter ownership."""
import numpy as np
import pytest
import torch

import treadle as tl
from conftest import CORE_TOL


def _mlp():
    return tl.nn.Sequential(tl.nn.Linear(5, 7), tl.nn.Tanh(), tl.nn.Linear(7, 6), tl.nn.ReLU(), tl.nn.Linear(6, 2))


def _torch_mlp():
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 6), torch.nn.ReLU(),
                               torch.nn.Linear(6, 2))


def test_named_parameters_match_torch_names_order_and_shapes():
    net, ref = _mlp(), _torch_mlp()
    ours = [(n, a.shape) for n, a in net.named_parameters().items()]
    theirs = [(n, tuple(p.shape)) for n, p in ref.named_parameters()]
    assert ours == theirs
    assert net.num_parameters() == sum(p.numel() for p in ref.parameters())
    assert net._compiled().num_parameters >= net.num_parameters()  # slots are padded for alignment


def test_state_dict_keys_in_torch_order():
    # torch orders state_dict keys by module then registration order ("0.weight" before "0.bias",
    # "2.*" before "10.*"); code that zips two state dicts or saves them in order relies on it.
    layers = [tl.nn.Linear(2, 2) for _ in range(11)]
    net = tl.nn.Sequential(*layers)
    ref = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(11)])
    assert list(net.state_dict()) == list(ref.state_dict())
    assert list(net.named_parameters().keys()) == list(ref.state_dict())


def test_parameters_are_views_into_the_flat_buffer(rng):
    net = _mlp()
    flat = net.flat_parameters()
    layout = net._compiled().layout
    params = net.named_parameters()
    for name, shape, offset in layout:
        n = int(np.prod(shape))
        np.testing.assert_array_equal(flat[offset:offset + n].reshape(shape), params[name])
        assert np.shares_memory(params[name], flat)
    x = rng.standard_normal((4, 5)).astype(np.float32)
    before = net.predict(x)
    # A write through a parameter view lands in the flat buffer and changes the predictions.
    params["4.bias"][:] = [10.0, -3.0]
    offset = dict((n, o) for n, _, o in layout)["4.bias"]
    np.testing.assert_array_equal(flat[offset:offset + 2], np.float32([10.0, -3.0]))
    after = net.predict(x)
    assert not np.array_equal(before, after)
    # The last layer is linear, so changing its bias shifts the outputs by exactly the change.
    delta = after - before
    np.testing.assert_allclose(delta, np.broadcast_to(delta[0], delta.shape), rtol=0, atol=1e-5)
    # And the reverse: a write through the flat buffer shows in the view and in the module's weight.
    flat[dict((n, o) for n, _, o in layout)["0.weight"]] = 42.0
    assert params["0.weight"][0, 0] == 42.0
    assert net[0].weight[0, 0] == 42.0


def test_gradient_views_are_views_into_the_flat_gradient_buffer():
    net = _mlp()
    grads = net.named_gradients()
    flat = net.flat_gradients()
    assert [(n, g.shape) for n, g in grads.items()] == [(n, p.shape) for n, p in net.named_parameters().items()]
    for name, shape, offset in net._compiled().layout:
        assert np.shares_memory(grads[name], flat)
        grads[name][...] = 3.0
        assert np.all(flat[offset:offset + int(np.prod(shape))] == 3.0)


def test_state_dict_is_a_copy_and_round_trips(rng):
    net = _mlp()
    state = net.state_dict()
    x = rng.standard_normal((3, 5)).astype(np.float32)
    y0 = net.predict(x)
    for v in state.values():  # a copy: writing it changes nothing in the model
        v[...] = 0.0
    np.testing.assert_array_equal(net.predict(x), y0)
    saved = net.state_dict()
    other = _mlp()
    assert not np.array_equal(other.predict(x), y0)
    other.load_state_dict(saved)
    np.testing.assert_array_equal(other.predict(x), y0)
    for k in saved:
        np.testing.assert_array_equal(other.state_dict()[k], saved[k])
        assert other.state_dict()[k].dtype == np.float32


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_loading_torch_state_dict_gives_torch_predictions(dtype, rng):
    torch.manual_seed(3)
    ref = _torch_mlp()
    net = _mlp()
    if dtype == "float64":
        ref.double()
        net.double()
    net.load_state_dict(ref.state_dict())  # torch tensors, taken as they are
    x = rng.standard_normal((9, 5)).astype(dtype)
    expect = ref(torch.from_numpy(x)).detach().numpy()
    got = net.predict(x)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got, expect, **CORE_TOL[dtype])


def test_loading_requires_grad_parameters_and_float64_into_float32():
    torch.manual_seed(4)
    ref = _torch_mlp().double()
    net = _mlp()
    net.load_state_dict(dict(ref.named_parameters()))  # tensors that require grad
    for name, p in ref.named_parameters():
        np.testing.assert_array_equal(net.state_dict()[name], p.detach().numpy().astype(np.float32))
    assert net.dtype == "float32"


@pytest.mark.parametrize("case", ["wrong_shape", "missing_key", "unexpected_key", "transposed", "integer"])
def test_bad_state_dict_raises_and_changes_nothing(case):
    net = _mlp()
    flat_before = net.flat_parameters().copy()
    state = {k: torch.from_numpy(v + 1.0) for k, v in net.state_dict().items()}
    if case == "wrong_shape":
        state["2.bias"] = torch.zeros(5)
        err, words = ValueError, ["2.bias", "(5,)", "(6,)"]
    elif case == "missing_key":
        del state["4.weight"]
        err, words = ValueError, ["missing", "4.weight"]
    elif case == "unexpected_key":
        state["5.weight"] = torch.zeros(2, 2)
        err, words = ValueError, ["unexpected", "5.weight"]
    elif case == "transposed":
        state["0.weight"] = state["0.weight"].T.contiguous()
        err, words = ValueError, ["0.weight", "(5, 7)", "(7, 5)"]
    else:
        state["0.bias"] = torch.zeros(7, dtype=torch.int64)
        err, words = TypeError, ["0.bias", "int64"]
    with pytest.raises(err) as info:
        net.load_state_dict(state)
    for w in words:
        assert w in str(info.value), (w, str(info.value))
    # Validation happens before any write: entries that come before the bad one are untouched too.
    np.testing.assert_array_equal(net.flat_parameters(), flat_before)


def test_non_strict_load_accepts_a_partial_state():
    net = _mlp()
    before = net.state_dict()
    net.load_state_dict({"2.bias": np.full(6, 0.5, np.float32)}, strict=False)
    after = net.state_dict()
    np.testing.assert_array_equal(after["2.bias"], np.full(6, 0.5, np.float32))
    for k in before:
        if k != "2.bias":
            np.testing.assert_array_equal(after[k], before[k])


def test_double_converts_parameters_and_predictions(rng):
    net = _mlp()
    x = rng.standard_normal((4, 5))
    f32_params = net.state_dict()
    y32 = net.predict(x.astype(np.float32))
    assert net.double() is net
    assert net.dtype == "float64"
    assert net.flat_parameters().dtype == np.float64 and net.flat_gradients().dtype == np.float64
    for k, v in net.state_dict().items():
        assert v.dtype == np.float64
        np.testing.assert_array_equal(v, f32_params[k].astype(np.float64))
    y64 = net.predict(x)
    assert y64.dtype == np.float64
    np.testing.assert_allclose(y64, y32, rtol=1e-5, atol=1e-6)
    # Views taken after the conversion are views into the new float64 buffer.
    assert np.shares_memory(net.named_parameters()["0.weight"], net.flat_parameters())
    net.float()
    assert net.dtype == "float32"
    np.testing.assert_array_equal(net.predict(x.astype(np.float32)), y32)


def test_default_init_matches_torch_bounds_statistically():
    tl.manual_seed(7)
    fan_in, fan_out = 1024, 1000
    layer = tl.nn.Linear(fan_in, fan_out)
    net = tl.nn.Sequential(layer)
    bound = 1.0 / np.sqrt(fan_in)
    w = net.named_parameters()["0.weight"].astype(np.float64)
    b = net.named_parameters()["0.bias"].astype(np.float64)
    ref = torch.nn.Linear(fan_in, fan_out)  # the same bounds, as torch computes them
    assert float(ref.weight.detach().abs().max()) <= bound and float(ref.bias.detach().abs().max()) <= bound
    n = w.size
    assert w.shape == (fan_out, fan_in) and b.shape == (fan_out,)
    # Uniform on [-bound, bound]: extremes within a hair of the bounds, mean 0, std bound/sqrt(3).
    assert w.min() >= -bound and w.max() <= bound
    assert w.min() < -bound * (1 - 1e-4) and w.max() > bound * (1 - 1e-4)
    sd = bound / np.sqrt(3)
    assert abs(w.mean()) < 6 * sd / np.sqrt(n)
    assert abs(w.std() / sd - 1) < 0.01
    # Fourth moment of a uniform: E[w^4] = bound^4 / 5 (distinguishes it from a normal with that std).
    assert abs(np.mean(w ** 4) / (bound ** 4 / 5) - 1) < 0.02
    assert b.min() >= -bound and b.max() <= bound
    assert b.min() < -0.9 * bound and b.max() > 0.9 * bound  # 1000 draws reach the ends
    assert abs(b.mean()) < 6 * sd / np.sqrt(b.size)
    # The weight rows are not all the same draw (a fresh stream per element).
    assert len(np.unique(w[:, 0])) == fan_out


def test_init_bound_follows_fan_in():
    for fan_in in (1, 3, 50):
        w = tl.nn.Sequential(tl.nn.Linear(fan_in, 200)).named_parameters()["0.weight"]
        assert np.abs(w).max() <= 1 / np.sqrt(fan_in)
        assert np.abs(w).max() > 0.8 / np.sqrt(fan_in)


def test_manual_seed_gives_reproducible_init():
    tl.manual_seed(11)
    a = _mlp().flat_parameters().copy()
    tl.manual_seed(11)
    b = _mlp().flat_parameters().copy()
    c = _mlp().flat_parameters().copy()  # the stream continues: a different draw
    tl.manual_seed(12)
    d = _mlp().flat_parameters().copy()
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert not np.array_equal(a, d)


def test_plans_are_cached_per_input_shape(rng):
    net = _mlp()
    model = net._compiled()
    assert model.num_plans == 0
    x4 = rng.standard_normal((4, 5)).astype(np.float32)
    for _ in range(5):
        net.predict(x4)
    assert model.num_plans == 1
    net.predict(rng.standard_normal((4, 5)).astype(np.float32))  # same signature, new data
    assert model.num_plans == 1
    net.predict(rng.standard_normal((8, 5)).astype(np.float32))
    assert model.num_plans == 2
    net.predict(x4)
    assert model.num_plans == 2
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.01))
    y4 = rng.standard_normal((4, 2)).astype(np.float32)
    for _ in range(3):
        trainer.step(x4, y4)
    assert model.num_plans == 3  # one training plan for this signature
    trainer.evaluate(x4, y4)
    trainer.evaluate(x4, y4)
    assert model.num_plans == 4  # one eval-loss plan
    net.predict(x4)
    assert model.num_plans == 4


def test_cached_plan_sees_new_weights(rng):
    net = _mlp()
    x = rng.standard_normal((3, 5)).astype(np.float32)
    y0 = net.predict(x)
    net.named_parameters()["4.bias"][:] += 1.0
    np.testing.assert_allclose(net.predict(x), y0 + 1.0, rtol=1e-6, atol=1e-6)
    assert net._compiled().num_plans == 1


def test_a_parameter_belongs_to_one_model():
    shared = tl.nn.Linear(3, 3)
    a = tl.nn.Sequential(shared, tl.nn.Tanh())
    b = tl.nn.Sequential(tl.nn.Linear(3, 3), shared)
    a._compiled()
    with pytest.raises(ValueError, match=r"'1\.weight' already belongs to another model"):
        b._compiled()
    # a still works and b is left uncompiled; its own first layer is not claimed by the failed model.
    np.testing.assert_array_equal(a.predict(np.zeros((1, 3), np.float32)).shape, (1, 3))
    c = tl.nn.Sequential(b[0])
    assert c.predict(np.zeros((2, 3), np.float32)).shape == (2, 3)


def test_a_layer_used_standalone_then_in_a_model_is_rejected():
    layer = tl.nn.Linear(2, 2)
    layer.predict(np.ones((1, 2), np.float32))  # compiles a model around the layer itself
    with pytest.raises(ValueError, match="already belongs to another model"):
        tl.nn.Sequential(layer).predict(np.ones((1, 2), np.float32))


def test_submodules_cannot_change_after_compilation():
    net = _mlp()
    net._compiled()
    with pytest.raises(RuntimeError, match="after the model was compiled"):
        net.extra = tl.nn.Linear(2, 2)


def test_repr_and_indexing():
    net = _mlp()
    assert len(net) == 5
    assert isinstance(net[2], tl.nn.Linear) and net[2].in_features == 7 and net[2].out_features == 6
    assert "Linear(in_features=5, out_features=7, bias=True)" in repr(net)


def test_linear_without_bias_matches_torch(rng):
    torch.manual_seed(5)
    ref = torch.nn.Linear(4, 3, bias=False)
    net = tl.nn.Sequential(tl.nn.Linear(4, 3, bias=False))
    assert list(net.named_parameters().keys()) == ["0.weight"]
    net.load_state_dict({"0." + k: v for k, v in ref.state_dict().items()})
    x = rng.standard_normal((6, 4)).astype(np.float32)
    np.testing.assert_allclose(net.predict(x), ref(torch.from_numpy(x)).detach().numpy(), **CORE_TOL["float32"])


def test_batched_3d_input_like_torch(rng):
    torch.manual_seed(6)
    ref = _torch_mlp()
    net = _mlp()
    net.load_state_dict(ref.state_dict())
    x = rng.standard_normal((2, 3, 5)).astype(np.float32)
    got = net.predict(x)
    assert got.shape == (2, 3, 2)
    np.testing.assert_allclose(got, ref(torch.from_numpy(x)).detach().numpy(), **CORE_TOL["float32"])
