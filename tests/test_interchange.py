"""PyTorch interchange: state_dicts both ways, safetensors files written by torch, exact round trips
and a model trained in torch predicting the same in treadle."""
import numpy as np
import pytest

import treadle as tl

torch = pytest.importorskip("torch")
nn = tl.nn


def _pair(dtype="float32", seed=0):
    """The same architecture in both libraries, independently initialised."""
    torch.manual_seed(seed)
    ref = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.GELU(), torch.nn.Linear(32, 32),
                              torch.nn.Softplus(beta=2.0), torch.nn.Dropout(0.1), torch.nn.Linear(32, 2))
    tl.manual_seed(seed + 1)
    net = nn.Sequential(nn.Linear(6, 32), nn.GELU(), nn.Linear(32, 32), nn.Softplus(beta=2.0), nn.Dropout(0.1),
                        nn.Linear(32, 2))
    if dtype == "float64":
        ref.double()
        net.double()
    return net, ref.eval()


def _x(dtype, n=64, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 6)).astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_round_trip_treadle_torch_treadle_is_exact(dtype):
    net, ref = _pair(dtype)
    x = _x(dtype)
    expected = net.predict(x)
    sd = tl.io.to_torch_state_dict(net)
    assert all(isinstance(v, torch.Tensor) for v in sd.values())
    ref.load_state_dict(sd)  # strict: same names and layouts as torch
    _, other = _pair(dtype, seed=5)
    other_net = _pair(dtype, seed=7)[0]
    other.load_state_dict(ref.state_dict())
    back = tl.io.from_torch(other, other_net)
    assert back is other_net
    assert np.array_equal(back.predict(x), expected)
    for k, v in net.state_dict().items():
        assert np.array_equal(back.state_dict()[k], v)


def test_to_torch_state_dict_is_a_copy():
    net, _ = _pair()
    sd = tl.io.to_torch_state_dict(net)
    sd["0.weight"].zero_()
    assert not np.all(net.state_dict()["0.weight"] == 0)


def test_model_trained_in_torch_predicts_the_same():
    net, ref = _pair()
    ref.train()
    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.standard_normal((256, 6)).astype(np.float32))
    y = torch.sin(x[:, :2]) + 0.1 * x[:, 2:4]
    opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    for _ in range(100):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ref(x), y)
        loss.backward()
        opt.step()
    ref.eval()
    tl.io.from_torch(ref, net)
    xt = _x("float32", 128, seed=3)
    with torch.no_grad():
        expected = ref(torch.from_numpy(xt)).numpy()
    np.testing.assert_allclose(net.predict(xt), expected, rtol=1e-6, atol=1e-6)


def test_torch_safetensors_file_loads(tmp_path):
    st_torch = pytest.importorskip("safetensors.torch")
    net, ref = _pair()
    path = tmp_path / "torch.safetensors"
    st_torch.save_file(ref.state_dict(), str(path))
    x = _x("float32")
    with torch.no_grad():
        expected = ref(torch.from_numpy(x)).numpy()
    # Through the C++ loader straight into the model, and through from_torch with a path.
    np.testing.assert_allclose(tl.load(path, model=net).predict(x), expected, rtol=1e-6, atol=1e-6)
    other = tl.io.from_torch(str(path), _pair(seed=9)[0])
    assert np.array_equal(other.predict(x), net.predict(x))
    with pytest.raises(ValueError, match="no architecture description"):
        tl.load(path)


def test_our_files_load_in_torch(tmp_path):
    st_torch = pytest.importorskip("safetensors.torch")
    net, ref = _pair("float64")
    path = tmp_path / "ours.safetensors"
    tl.save(net, path)
    ref.load_state_dict(st_torch.load_file(str(path)))
    x = _x("float64")
    with torch.no_grad():
        np.testing.assert_allclose(ref(torch.from_numpy(x)).numpy(), net.predict(x), rtol=1e-12, atol=1e-13)


def test_half_precision_torch_weights_are_widened():
    net, ref = _pair()
    half = {k: v.to(torch.bfloat16) for k, v in ref.state_dict().items()}
    tl.io.from_torch(half, net)
    for k, v in half.items():
        assert np.array_equal(net.state_dict()[k], v.float().numpy())


def test_mismatched_torch_state_dicts_change_nothing():
    net, _ = _pair()
    before = {k: v.copy() for k, v in net.state_dict().items()}
    wrong = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    with pytest.raises(ValueError):
        tl.io.from_torch(wrong, net)
    bn = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.BatchNorm1d(32))
    with pytest.raises(ValueError):
        tl.io.from_torch(bn, net)
    with pytest.raises(TypeError, match="not a tensor"):
        tl.io.from_torch({"0.weight": "nope"}, net)
    for k, v in net.state_dict().items():
        assert np.array_equal(v, before[k])


def test_non_strict_loading_keeps_the_rest():
    net, ref = _pair()
    sd = {k: v for k, v in ref.state_dict().items() if k.startswith("0.")}
    before = net.state_dict()
    tl.io.from_torch(sd, net, strict=False)
    assert np.array_equal(net.state_dict()["0.weight"], ref.state_dict()["0.weight"].numpy())
    assert np.array_equal(net.state_dict()["5.bias"], before["5.bias"])
