"""The architecture description format (treadle-architecture/1), read and written by the C++ core for
tl.save / tl.load and the C API alike.

tests/data/architecture_v1/*.safetensors were written by tl.save when the format was still read and
written in Python, with expected.safetensors holding an input and the saved model's output for each:
they must load unchanged, to the same parameter names and shapes and the same outputs."""
import json

import numpy as np
import pytest

import treadle as tl
from treadle import nn

FORMAT = "treadle-architecture/1"
DATA = __import__("pathlib").Path(__file__).parent / "data" / "architecture_v1"
FILES = ["dense", "conv", "sequence", "attention", "embedding"]


@pytest.mark.parametrize("name", FILES)
def test_files_of_the_python_writer_load_unchanged(name):
    path = DATA / f"{name}.safetensors"
    net = tl.load(path)
    tensors = tl.io.load_file(path)
    assert {k: tuple(np.shape(v)) for k, v in net.state_dict().items()} == {k: v.shape for k, v in tensors.items()}
    expected = tl.io.load_file(DATA / "expected.safetensors")
    y = net.predict(expected[f"{name}.x"])
    y = y[0] if isinstance(y, (tuple, list)) else y
    np.testing.assert_allclose(y, expected[f"{name}.y"], rtol=1e-6, atol=1e-6)
    # the core describes the rebuilt model as the Python writer did
    assert tl.io.describe(net) == json.loads(tl.io.read_metadata(path)["treadle.architecture"])


# As the Python writer described these layers (keys and values verbatim).
LEGACY = {"format": FORMAT, "model": {"type": "Sequential", "layers": [
    {"type": "TransformerDecoderLayer", "config": {
        "d_model": 8, "nhead": 2, "dim_feedforward": 16, "dropout": 0.0, "activation": "relu",
        "layer_norm_eps": 1e-05, "batch_first": True, "norm_first": False, "bias": True}},
]}}


def test_a_legacy_description_builds_the_same_model():
    tl.manual_seed(3)
    built = tl.io.build(LEGACY)
    tl.manual_seed(3)
    direct = nn.Sequential(nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True))
    assert [(n, p.shape) for n, p in built.named_parameters()] == [(n, p.shape) for n, p in direct.named_parameters()]
    assert tl.io.describe(built) == LEGACY


def _round_trip(net, x, tmp_path):
    tl.save(net, tmp_path / "m.safetensors")
    back = tl.load(tmp_path / "m.safetensors")
    assert [(n, tuple(np.shape(v))) for n, v in back.state_dict().items()] == \
        [(n, tuple(np.shape(v))) for n, v in net.state_dict().items()]
    first = lambda out: out[0] if isinstance(out, (tuple, list)) else out  # noqa: E731
    np.testing.assert_allclose(first(back.predict(x)), first(net.predict(x)), rtol=1e-6, atol=1e-6)
    return back


@pytest.mark.parametrize("make,shape", [
    (lambda: nn.LSTM(3, 5, proj_size=2, batch_first=True), (2, 4, 3)),
    (lambda: nn.Transformer(8, 2, 1, 1, 16, dropout=0.0, batch_first=True), None),
    (lambda: nn.Conv1d(2, 3, 3, padding="same", padding_mode="circular"), (2, 2, 7)),
    (lambda: nn.AvgPool1d(2, ceil_mode=True), (2, 2, 7)),
    (lambda: nn.AdaptiveAvgPool3d((None, 2, 1)), (1, 2, 3, 4, 4)),
    (lambda: nn.GlobalAvgPool2d(), (2, 3, 4, 4)),
    (lambda: nn.RNN(3, 4, nonlinearity="relu", bidirectional=True), (5, 2, 3)),
    (lambda: nn.GRU(3, 4, bias=False), (5, 2, 3)),
    (lambda: nn.Embedding(6, 3, padding_idx=-1, scale_grad_by_freq=True), None),
])
def test_every_layer_kind_round_trips(tmp_path, make, shape):
    tl.manual_seed(0)
    net = nn.Sequential(make())
    if shape is None and isinstance(net[0], nn.Embedding):
        x = np.array([[0, 5, 2]], np.int64)
    elif shape is None:  # Transformer takes (src, tgt): describe and rebuild only
        back = tl.io.build(tl.io.describe(net))
        assert back[0].config() == net[0].config()
        assert [(n, p.shape) for n, p in back.named_parameters()] == [(n, p.shape) for n, p in net.named_parameters()]
        return
    else:
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    _round_trip(net, x, tmp_path)


def test_described_configs_are_complete_and_checked():
    desc = tl.io.describe(nn.Sequential(nn.Linear(3, 2, dtype="float64"), nn.Dropout(0.25, inplace=True)))
    assert desc == {"format": FORMAT, "model": {"type": "Sequential", "layers": [
        {"type": "Linear", "config": {"in_features": 3, "out_features": 2, "bias": True}},
        {"type": "Dropout", "config": {"p": 0.25}}]}}
    # defaults are the format's: a bare Linear gets bias, a Conv2d every key
    built = tl.io.build({"format": FORMAT, "model": {"type": "Conv2d", "config": {
        "in_channels": 1, "out_channels": 2, "kernel_size": 3}}})
    assert built.config()["padding_mode"] == "zeros" and built.config()["stride"] == [1, 1]


def _desc(node):
    return {"format": FORMAT, "model": node}


@pytest.mark.parametrize("description,message", [
    (_desc({"type": "Conv9d"}), r"build: unknown layer type 'Conv9d' at model \(the format knows Sequential, Linear"),
    (_desc({"type": "Linear", "config": {"in_features": 3, "out_features": 2, "bais": True}}),
     r"build: model \(Linear\) has no argument 'bais' \(Linear takes in_features, out_features, bias\)"),
    (_desc({"type": "Linear", "config": {"in_features": "3", "out_features": 2}}),
     r"build: model \(Linear\).in_features must be an integer, got '3'"),
    (_desc({"type": "Linear", "config": {"in_features": 2.5, "out_features": 2}}),
     r"model \(Linear\).in_features must be an integer, got 2.5"),
    (_desc({"type": "Linear", "config": {"in_features": 2 ** 64, "out_features": 2}}),
     r"in_features is 18446744073709551616, outside the range of a 64-bit integer"),
    (_desc({"type": "Linear", "config": {"out_features": 2}}), r"model \(Linear\) needs config.in_features"),
    (_desc({"type": "Dropout", "config": {"p": float("nan")}}), r"holds nan \(not a finite number\) at description.model.config.p"),
    (_desc({"type": "Dropout", "config": {"p": float("inf")}}), r"holds inf"),
    ('{"format": "treadle-architecture/1", "model": {"type": "Dropout", "config": {"p": 1e999}}}',
     r"model \(Dropout\).p is 1e999, outside the range of a finite double"),
    (_desc({"type": "Dropout", "config": {"p": True}}), r"\.p must be a number, got a boolean"),
    (_desc({"type": "GELU", "config": {"approximate": "fast"}}), r"approximate must be 'none' or 'tanh', got 'fast'"),
    (_desc({"type": "Sequential", "layers": [{"type": "ReLU"}, 3]}), r"build: model.1 is not a layer description"),
    (_desc({"type": "Sequential"}), r"model \(Sequential\) has no list of layers"),
    (_desc({"type": "ReLU", "config": []}), r"config of model \(ReLU\) is not an object"),
    ({"format": "treadle-architecture/2", "model": {"type": "ReLU"}},
     r"expected an architecture description of format 'treadle-architecture/1', got \"treadle-architecture/2\""),
    ({"model": {"type": "ReLU"}}, r"expected an architecture description"),
    ("{not json", r"build: .* at byte"),
    (42, r"build: expected an architecture description \(a dict or JSON text\), got int"),
    (_desc({"type": "Linear", "config": {"in_features": 3, "out_features": 2, "dtype": "float64"}}),
     r"has no argument 'dtype'"),
])
def test_bad_descriptions_are_refused_by_name(description, message):
    with pytest.raises(ValueError, match=message):
        tl.io.build(description)


def test_bad_layers_are_not_described():
    with pytest.raises(ValueError, match=r"describe: model.0 \(Softmax\).dim must be an integer, got null"):
        tl.io.describe(nn.Sequential(nn.Softmax()))


def test_registered_layers_keep_their_config_and_cannot_shadow_built_ins():
    class Scaled(nn.Module):
        def __init__(self, factor, names):
            super().__init__()
            self.factor, self.names = factor, names

        def forward(self, x):
            return x * self.factor

    tl.io.register_layer(Scaled, lambda m: {"factor": m.factor, "names": m.names})
    try:
        desc = tl.io.describe(nn.Sequential(Scaled(2.5, ["a", None])))
        assert desc["model"]["layers"][0] == {"type": "Scaled", "config": {"factor": 2.5, "names": ["a", None]}}
        back = tl.io.build(desc)
        assert isinstance(back[0], Scaled) and back[0].factor == 2.5 and back[0].names == ["a", None]
        with pytest.raises(ValueError, match=r"describe: model.0 \(Scaled\).factor is a builtin_function_or_method, "
                           "which an architecture description cannot hold"):
            tl.io.describe(nn.Sequential(Scaled(len, [])))
        with pytest.raises(ValueError, match=r"describe: model \(Scaled\).factor is nan \(not a finite number\)"):
            tl.io.describe(Scaled(float("nan"), []))
    finally:
        del tl.io._LAYERS["Scaled"]
    with pytest.raises(ValueError, match="'Linear' is built in"):
        tl.io.register_layer(Scaled, lambda m: {}, name="Linear")


_C_API_CHILD = r"""
import ctypes, json, sys
import numpy as np
import treadle as tl  # loads libtreadle: the C API is the same library

path = next(line.split()[-1] for line in open("/proc/self/maps") if "/libtreadle.so" in line)
lib = ctypes.CDLL(path)
lib.treadle_last_error.restype = ctypes.c_char_p
data = sys.argv[1]
expected = tl.io.load_file(data + "/expected.safetensors")
model = ctypes.c_void_p()
assert lib.treadle_model_load((data + "/dense.safetensors").encode(), ctypes.byref(model)) == 0, lib.treadle_last_error()
x = np.ascontiguousarray(expected["dense.x"])
y = np.zeros((5, 3), np.float32)
shape = (ctypes.c_int64 * 2)(*x.shape)
assert lib.treadle_model_predict(model, x.ctypes.data_as(ctypes.c_void_p), 2, shape,
                                 y.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(y.size)) == 0, lib.treadle_last_error()
other = ctypes.c_void_p()
status = lib.treadle_model_load((data + "/conv.safetensors").encode(), ctypes.byref(other))
print(json.dumps({"y": y.tolist(), "conv": [status, lib.treadle_last_error().decode()]}))
"""


def test_the_c_api_reads_what_python_writes():
    """One catalog: a file tl.save wrote loads through the C API to the same outputs; a layer that
    only Python composes is refused by name."""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-c", _C_API_CHILD, str(DATA)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    expected = tl.io.load_file(DATA / "expected.safetensors")["dense.y"]
    np.testing.assert_allclose(np.array(out["y"], np.float32), expected, rtol=1e-6, atol=1e-6)
    status, message = out["conv"]
    assert status == 1 and "model.0 (Conv2d) padding_mode 'reflect' is composed by the Python package only" in message
