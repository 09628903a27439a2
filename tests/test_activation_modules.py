"""The pointwise activation modules come from one list in the core (nn::activation_modules): each entry is a
tl.nn class named as in torch.nn, computing what torch's does with the same options (float32, ~1e-6), written
and read by the architecture format with its options, and built by the C++ Activation. A new entry there is a
new module everywhere without another edit."""
import numpy as np
import pytest

import treadle as tl
from treadle import _core

torch = pytest.importorskip("torch")

ENTRIES = _core.activation_modules()


def options(params):
    """Non-default values of each option (so that a dropped option shows), by name."""
    return {name: (default * 1.5 + 0.25 if name != "threshold" else 4.0) for name, default in params}


def test_the_list_has_the_known_activations():
    names = [entry[0] for entry in ENTRIES]
    assert names[:7] == ["ReLU", "LeakyReLU", "ELU", "SiLU", "Tanh", "Sigmoid", "Softplus"]
    assert all(entry[2] for entry in ENTRIES)
    onnx = {entry[0]: entry[4] for entry in ENTRIES}
    assert onnx["LeakyReLU"] == ("LeakyRelu", ["alpha"]) and onnx["ReLU"] == ("Relu", [])
    assert onnx["SiLU"] is None  # composed by treadle.io


@pytest.mark.parametrize("entry", ENTRIES, ids=[e[0] for e in ENTRIES])
def test_each_listed_activation_is_the_torch_module(entry, tmp_path):
    name, op, doc, params, _ = entry
    cls = getattr(tl.nn, name)
    assert name in tl.nn.__all__ and cls.__doc__ == doc
    kwargs = options(params)
    x = np.random.default_rng(3).standard_normal((6, 5)).astype(np.float32) * 4
    net = tl.nn.Sequential(cls(**kwargs))
    want = getattr(torch.nn, name)(**kwargs)(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(net.predict(x), want, rtol=1e-6, atol=1e-6)

    description = tl.io.describe(net)
    assert description["model"]["layers"][0] == {"type": name, "config": kwargs}
    path = tmp_path / "act.safetensors"
    tl.save(net, path)
    assert np.array_equal(tl.load(path).predict(x), net.predict(x))
    assert _core.Activation(op, *[kwargs[p] for p, _ in params]).type_name == op


@pytest.mark.parametrize("entry", ENTRIES, ids=[e[0] for e in ENTRIES])
def test_each_listed_activation_exports_to_onnx(entry, tmp_path):
    # A new entry needs an exporter: its ONNX operator in the list, or a composition in treadle.io.
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    name, _, _, params, _ = entry
    tl.manual_seed(0)
    net = tl.nn.Sequential(tl.nn.Linear(5, 8), getattr(tl.nn, name)(**options(params)), tl.nn.Linear(8, 3))
    tl.io.export_onnx(net, tmp_path / "act.onnx")
    x = np.random.default_rng(4).standard_normal((7, 5)).astype(np.float32) * 3
    session = ort.InferenceSession(str(tmp_path / "act.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"input": x})[0], net.predict(x), rtol=1e-5, atol=1e-6)


def test_an_unknown_kind_names_the_known_ones():
    with pytest.raises(ValueError, match=r"Activation: unknown kind 'swish' \(known: relu, leaky_relu, .*softplus"):
        _core.Activation("swish")
