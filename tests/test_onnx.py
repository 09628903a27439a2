"""ONNX export: the exported file, run in onnxruntime, reproduces treadle's predictions."""
import numpy as np
import pytest

import treadle as tl

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
nn = tl.nn

MODELS = {
    "mlp_relu": lambda: nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3)),
    "activations": lambda: nn.Sequential(
        nn.Linear(5, 8), nn.LeakyReLU(0.2), nn.Linear(8, 8), nn.ELU(alpha=0.7), nn.Linear(8, 8), nn.GELU(),
        nn.Linear(8, 8), nn.GELU(approximate="tanh"), nn.Linear(8, 8), nn.SiLU(), nn.Linear(8, 8), nn.Sigmoid(),
        nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Softplus(beta=2.0, threshold=1.0), nn.Dropout(0.5),
        nn.Linear(8, 4), nn.Softmax(dim=-1)),
    "log_softmax_no_bias": lambda: nn.Sequential(nn.Sequential(nn.Linear(5, 7, bias=False), nn.Identity()),
                                                 nn.LogSoftmax(dim=1)),
}


def _run_onnx(path, x):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {"input": x})[0]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_exported_model_matches(tmp_path, name):
    tl.manual_seed(0)
    net = MODELS[name]()
    path = tmp_path / "m.onnx"
    proto = tl.io.export_onnx(net, path)
    onnx.checker.check_model(onnx.load(str(path)))
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    for n in (1, 37):  # the batch dimension is dynamic
        x = np.random.default_rng(n).standard_normal((n, 5)).astype(np.float32) * 2
        np.testing.assert_allclose(_run_onnx(path, x), net.predict(x), rtol=1e-5, atol=1e-6)


def test_float64_export(tmp_path):
    tl.manual_seed(1)
    net = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2)).double()
    path = tmp_path / "m.onnx"
    tl.io.export_onnx(net, path)
    x = np.random.default_rng(0).standard_normal((9, 5))
    np.testing.assert_allclose(_run_onnx(path, x), net.predict(x), rtol=1e-12, atol=1e-13)


def test_flatten_and_higher_rank_inputs(tmp_path):
    tl.manual_seed(2)
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 6), nn.ReLU(), nn.Linear(6, 2))
    path = tmp_path / "m.onnx"
    tl.io.export_onnx(net, path, input_shape=(None, 3, 4))
    x = np.random.default_rng(0).standard_normal((4, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(_run_onnx(path, x), net.predict(x), rtol=1e-5, atol=1e-6)
    # A Linear on a rank-3 input (MatMul + Add) and a partial Flatten.
    seq = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Flatten(1, 2), nn.Linear(15, 2))
    tl.io.export_onnx(seq, path, input_shape=(None, 3, 4))
    np.testing.assert_allclose(_run_onnx(path, x), seq.predict(x), rtol=1e-5, atol=1e-6)


def test_loaded_model_exports(tmp_path):
    tl.manual_seed(3)
    net = MODELS["mlp_relu"]()
    tl.save(net, tmp_path / "m.safetensors")
    back = tl.load(tmp_path / "m.safetensors")
    tl.io.export_onnx(back, tmp_path / "m.onnx")
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_allclose(_run_onnx(tmp_path / "m.onnx", x), net.predict(x), rtol=1e-5, atol=1e-6)


def test_unsupported_models_raise(tmp_path):
    class Custom(nn.Module):
        def forward(self, x):
            return x

    with pytest.raises(ValueError, match="custom module"):
        tl.io.export_onnx(nn.Sequential(nn.Linear(2, 2), Custom()), tmp_path / "m.onnx")
    with pytest.raises(ValueError, match="input_shape"):
        tl.io.export_onnx(nn.Sequential(nn.ReLU()), tmp_path / "m.onnx")
    with pytest.raises(ValueError, match="expects 4 input features"):
        tl.io.export_onnx(nn.Sequential(nn.Linear(4, 2)), tmp_path / "m.onnx", input_shape=(None, 3))
    assert not (tmp_path / "m.onnx").exists()
