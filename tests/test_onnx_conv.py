"""Convolutional models: tl.save/tl.load rebuild them, and their ONNX export runs in onnxruntime."""
import numpy as np
import pytest

import treadle as tl


def small_cnn(dtype="float32"):
    tl.manual_seed(0)
    net = tl.nn.Sequential(
        tl.nn.Conv2d(1, 4, 3, padding=1), tl.nn.ReLU(), tl.nn.MaxPool2d(2),
        tl.nn.Conv2d(4, 6, 3, stride=2, padding="valid", bias=False), tl.nn.Tanh(),
        tl.nn.AvgPool2d(2, ceil_mode=True, count_include_pad=False),
        tl.nn.ConvTranspose2d(6, 3, 2, stride=2, output_padding=1),
        tl.nn.Conv2d(3, 5, 3, padding="same", dilation=2, groups=1), tl.nn.GlobalAvgPool2d(), tl.nn.Linear(5, 3))
    return net.to(dtype) if dtype != "float32" else net


def test_cnn_save_load_round_trip(tmp_path):
    net = small_cnn()
    x = np.random.default_rng(0).standard_normal((2, 1, 17, 15)).astype(np.float32)
    path = tmp_path / "cnn.safetensors"
    tl.save(net, str(path))
    loaded = tl.load(str(path))
    assert repr(loaded) == repr(net)
    np.testing.assert_array_equal(loaded.predict(x), net.predict(x))


@pytest.mark.parametrize("dtype", ["float32"])  # onnxruntime has no float64 Conv kernel to check against
def test_cnn_onnx_matches_treadle(tmp_path, dtype):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install 'treadle[onnx]')")
    pytest.importorskip("onnx", reason="onnx is not installed (pip install 'treadle[onnx]')")
    net = small_cnn(dtype)
    x = np.random.default_rng(1).standard_normal((3, 1, 17, 15)).astype(dtype)
    path = tmp_path / "cnn.onnx"
    tl.io.export_onnx(net, str(path), input_shape=(None, 1, 17, 15))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {"input": x})[0]
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == "float32" else dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, net.predict(x), **tol)


def test_float64_cnn_export_is_valid_onnx(tmp_path):
    onnx = pytest.importorskip("onnx", reason="onnx is not installed (pip install 'treadle[onnx]')")
    path = tmp_path / "cnn64.onnx"
    tl.io.export_onnx(small_cnn("float64"), str(path), input_shape=(None, 1, 17, 15))
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)


def test_unsupported_pool_export_raises(tmp_path):
    pytest.importorskip("onnx", reason="onnx is not installed")
    net = tl.nn.Sequential(tl.nn.Conv2d(1, 2, 3), tl.nn.AdaptiveAvgPool2d(2), tl.nn.Flatten(), tl.nn.Linear(8, 1))
    with pytest.raises(ValueError, match="output_size 1"):
        tl.io.export_onnx(net, str(tmp_path / "x.onnx"), input_shape=(None, 1, 8, 8))
