"""Model files (tl.save / tl.load) and training checkpoints (tl.save_checkpoint / tl.load_checkpoint):
rebuilt models predict identically, a resumed run continues bit for bit, and files that do not fit
raise ValueError without changing anything. Also a C++ host saving and loading without Python."""
import json
import os
import shutil
import struct
import subprocess

import numpy as np
import pytest

import treadle as tl
from treadle import _core

nn = tl.nn


# -- helpers ---------------------------------------------------------------------------------------

def _fnv1a64(data, h=0xcbf29ce484222325):
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def _file_bytes(tensors, metadata, checksum=True):
    """A safetensors file built here, with the checksum computed from the documented canonical form
    (so tests can write files the C++ writer refuses to, e.g. mislabelled dtypes)."""
    codes = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64", np.dtype(np.int64): "I64",
             np.dtype(np.int32): "I32"}
    header, payload, canon = {}, b"", b""
    for name, a in tensors.items():
        a = np.asarray(a, order="C")
        begin, payload = len(payload), payload + a.tobytes()
        header[name] = {"dtype": codes[a.dtype], "shape": list(a.shape), "data_offsets": [begin, len(payload)]}
    meta = dict(metadata)
    for k in sorted(meta):
        canon += k.encode() + b"\0" + meta[k].encode() + b"\0"
    for name, e in header.items():  # payload order = insertion order here (no empty tensors)
        canon += b"\0".join([name.encode(), e["dtype"].encode(), ",".join(map(str, e["shape"])).encode(),
                             str(e["data_offsets"][0]).encode(), str(e["data_offsets"][1]).encode()]) + b"\0"
    if checksum:
        meta["treadle.checksum"] = f"fnv1a64:{_fnv1a64(canon + payload):016x}"
    h = json.dumps({"__metadata__": meta, **header}).encode()
    return struct.pack("<Q", len(h)) + h + payload


def _mlp(seed=0, dtype="float32", dropout=0.0):
    tl.manual_seed(seed)
    layers = [nn.Linear(4, 16), nn.Tanh()]
    if dropout:
        layers.append(nn.Dropout(dropout))
    layers += [nn.Linear(16, 3)]
    net = nn.Sequential(*layers)
    return net.double() if dtype == "float64" else net


def _params(net):
    return {k: v.copy() for k, v in net.state_dict().items()}


def _same_params(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


# -- model files -----------------------------------------------------------------------------------

ARCHITECTURES = {
    "mlp": lambda: nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3)),
    "activations": lambda: nn.Sequential(
        nn.Linear(4, 8), nn.LeakyReLU(0.2), nn.Linear(8, 8), nn.ELU(alpha=0.7), nn.Linear(8, 8), nn.GELU(),
        nn.Linear(8, 8), nn.GELU(approximate="tanh"), nn.Linear(8, 8), nn.SiLU(), nn.Linear(8, 8), nn.Sigmoid(),
        nn.Linear(8, 8), nn.Softplus(beta=2.0, threshold=5.0), nn.Dropout(0.25), nn.Linear(8, 3),
        nn.LogSoftmax(dim=-1)),
    "nested": lambda: nn.Sequential(nn.Sequential(nn.Linear(4, 6), nn.Tanh()), nn.Identity(),
                                    nn.Sequential(nn.Linear(6, 3, bias=False), nn.Softmax(dim=1))),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_load_returns_a_ready_model(tmp_path, arch, dtype):
    tl.manual_seed(1)
    net = ARCHITECTURES[arch]()
    if dtype == "float64":
        net.double()
    path = tmp_path / "model.safetensors"
    tl.save(net, path, metadata={"experiment": "42"})
    tl.manual_seed(99)  # the loaded model must not depend on the initialisation
    back = tl.load(path)
    assert repr(back) == repr(net) and back.dtype == dtype
    assert _same_params(_params(back), _params(net))
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(dtype)
    assert np.array_equal(back.predict(x), net.predict(x))
    meta = tl.io.read_metadata(path)
    assert meta["experiment"] == "42" and meta["treadle.kind"] == "model" and meta["treadle.dtype"] == dtype
    assert tl.io.describe(back) == json.loads(meta["treadle.architecture"])


def test_layer_catalog_round_trips(tmp_path):
    """Normalisation and shape layers (nn_layers.py), trained a little so running statistics differ."""
    names = ["LayerNorm", "BatchNorm1d", "RMSNorm", "Unflatten", "GroupNorm", "OutputTransform", "Embedding"]
    if not all(hasattr(nn, n) for n in names):
        pytest.skip("the layer catalog is not built in")
    tl.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8, eps=1e-4), nn.Linear(8, 6), nn.BatchNorm1d(6, momentum=0.2),
                        nn.RMSNorm([6], eps=1e-3), nn.Unflatten(1, (2, 3)), nn.GroupNorm(1, 2), nn.Flatten(),
                        nn.Linear(6, 2), nn.OutputTransform([1.0, 2.0], [0.0, 1.0], ["sigmoid", "identity"]))
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    x = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32)
    for _ in range(3):
        trainer.step(x, np.ones((16, 2), np.float32))
    tl.save(net, tmp_path / "m.safetensors")
    back = tl.load(tmp_path / "m.safetensors")
    assert repr(back) == repr(net) and _same_params(_params(back), _params(net))
    assert np.array_equal(back.predict(x), net.predict(x))

    emb = nn.Sequential(nn.Embedding(10, 4, padding_idx=0), nn.Flatten(), nn.Linear(12, 2))
    tl.save(emb, tmp_path / "e.safetensors")
    back = tl.load(tmp_path / "e.safetensors")
    idx = np.array([[1, 2, 0], [3, 4, 9]], np.int64)
    assert back[0].padding_idx == 0 and np.array_equal(back.predict(idx), emb.predict(idx))


def test_flatten_dims_are_described():
    for start, end in [(1, -1), (2, -1), (1, 2), (-3, -2), (0, -1), (2, 2)]:
        desc = tl.io.describe(nn.Sequential(nn.Flatten(start, end)))
        layer = desc["model"]["layers"][0]
        x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
        rebuilt = tl.io.build(desc)
        assert rebuilt.predict(x).shape == nn.Sequential(nn.Flatten(start, end)).predict(x).shape, layer


def test_loading_into_an_existing_model(tmp_path):
    net, other = _mlp(0), _mlp(1)
    path = tmp_path / "m.safetensors"
    tl.save(net, path)
    assert tl.load(path, model=other) is other
    assert _same_params(_params(other), _params(net))


def test_loading_float64_weights_into_a_float32_model_converts(tmp_path):
    net = _mlp(0, "float64")
    path = tmp_path / "m.safetensors"
    tl.save(net, path)
    target = tl.load(path, model=_mlp(1))
    assert target.dtype == "float32"
    for k, v in net.state_dict().items():
        assert np.array_equal(target.state_dict()[k], v.astype(np.float32))


class _Custom(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 2)

    def forward(self, x):
        return self.b(tl.functional.tanh(self.a(x)))


def test_custom_modules_need_the_model_to_load_into(tmp_path):
    tl.manual_seed(0)
    net = _Custom()
    path = tmp_path / "custom.safetensors"
    tl.save(net, path)
    with pytest.raises(ValueError, match=r"custom module .*_Custom.*tl\.load\(path, model=net\)"):
        tl.load(path)
    tl.manual_seed(5)
    back = tl.load(path, model=_Custom())
    x = np.ones((2, 4), np.float32)
    assert np.array_equal(back.predict(x), net.predict(x))
    with pytest.raises(ValueError, match="custom module"):
        tl.io.describe(net)


def test_registered_layers_are_rebuilt(tmp_path):
    class Scaled(nn.Module):
        def __init__(self, factor):
            super().__init__()
            self.factor = factor

        def forward(self, x):
            return x * self.factor

        def config(self):
            return {"factor": self.factor}

    tl.io.register_layer(Scaled)
    try:
        net = nn.Sequential(nn.Linear(3, 2), Scaled(2.5))
        path = tmp_path / "m.safetensors"
        tl.save(net, path)
        back = tl.load(path)
        assert isinstance(back[1], Scaled) and back[1].factor == 2.5
        x = np.ones((1, 3), np.float32)
        assert np.array_equal(back.predict(x), net.predict(x))
    finally:
        del tl.io._LAYERS["Scaled"]
    with pytest.raises(ValueError, match="unknown layer type 'Scaled'"):
        tl.load(path)


def test_reserved_metadata_keys(tmp_path):
    with pytest.raises(ValueError, match="reserved"):
        tl.save(_mlp(), tmp_path / "m.safetensors", metadata={"treadle.kind": "x"})
    with pytest.raises(TypeError):
        tl.save(_mlp(), tmp_path / "m.safetensors", metadata={"k": 3})


def test_wrong_architecture_changes_nothing(tmp_path):
    path = tmp_path / "m.safetensors"
    tl.save(_mlp(0), path)
    tl.manual_seed(3)
    wrong = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3), nn.Tanh(), nn.Linear(3, 3))
    before = _params(wrong)
    with pytest.raises(ValueError, match=r"does not match the model's architecture: '0.weight' has shape \(16, 4\) "
                                         r"in the file but \(8, 4\) in the model.*missing '4.weight'"):
        tl.load(path, model=wrong)
    assert _same_params(_params(wrong), before)


def test_bad_dtypes_are_rejected(tmp_path):
    net = _mlp(0)
    before = _params(net)
    state = {k: v.astype(np.float64) for k, v in before.items()}
    cases = {
        "declared float32, holds float64": (_file_bytes(state, {"treadle.kind": "model", "treadle.dtype": "float32"}),
                                            "is float64 but the file declares float32"),
        "integer parameters": (_file_bytes({**before, "0.bias": np.zeros(16, np.int64)}, {"treadle.kind": "model"}),
                               "holds int64 data"),
        "unknown declared dtype": (_file_bytes(before, {"treadle.kind": "model", "treadle.dtype": "float8"}),
                                   "declares dtype 'float8'"),
        "half precision": (None, "F16 is not supported"),
    }
    for name, (data, match) in cases.items():
        path = tmp_path / "bad.safetensors"
        if data is None:
            st = pytest.importorskip("safetensors.numpy")
            st.save_file({k: v.astype(np.float16) for k, v in before.items()}, str(path))
        else:
            path.write_bytes(data)
        with pytest.raises(ValueError, match=match):
            tl.load(path, model=net)
        assert _same_params(_params(net), before), name


def test_handmade_file_with_valid_checksum_loads(tmp_path):
    """The documented checksum form is what the loader verifies."""
    state = _params(_mlp(4))
    path = tmp_path / "m.safetensors"
    path.write_bytes(_file_bytes(state, {"treadle.kind": "model", "treadle.dtype": "float32"}))
    assert _same_params(_params(tl.load(path, model=_mlp(0))), state)
    data = bytearray(path.read_bytes())
    data[-5] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="checksum mismatch"):
        tl.load(path, model=_mlp(0))


def test_corrupt_model_file_changes_nothing(tmp_path):
    path = tmp_path / "m.safetensors"
    tl.save(_mlp(0), path)
    data = path.read_bytes()
    net = _mlp(1)
    before = _params(net)
    rng = np.random.default_rng(0)
    for _ in range(50):
        bad = bytearray(data)
        bit = int(rng.integers(len(bad) * 8))
        bad[bit // 8] ^= 1 << (bit % 8)
        path.write_bytes(bytes(bad))
        with pytest.raises(ValueError):
            tl.load(path, model=net)
        with pytest.raises(ValueError):
            tl.load(path)
    assert _same_params(_params(net), before)


# -- training checkpoints --------------------------------------------------------------------------

def _data(dtype="float32", steps=20):
    rng = np.random.default_rng(7)
    return (rng.standard_normal((steps, 16, 4)).astype(dtype), rng.standard_normal((steps, 16, 3)).astype(dtype))


def _trainer(init_seed, trainer_seed, optimizer="adam", dtype="float32"):
    net = _mlp(init_seed, dtype, dropout=0.3)
    opt = {"adam": lambda: tl.optim.Adam(lr=1e-2, weight_decay=1e-3),
           "sgd": lambda: tl.optim.SGD(lr=0.05, momentum=0.9, nesterov=True),
           "rmsprop": lambda: tl.optim.RMSprop(lr=1e-3, centered=True, momentum=0.5)}[optimizer]()
    return tl.Trainer(net, tl.loss.MSE(), opt, schedule=tl.optim.StepLR(4, gamma=0.5), seed=trainer_seed)


@pytest.mark.parametrize("optimizer, dtype", [("adam", "float32"), ("sgd", "float32"), ("rmsprop", "float64"),
                                              ("adam", "float64")])
def test_resume_is_bitwise_identical(tmp_path, optimizer, dtype):
    x, y = _data(dtype)
    straight = _trainer(0, 11, optimizer, dtype)
    losses_a = [straight.step(x[i], y[i]) for i in range(20)]

    first = _trainer(0, 11, optimizer, dtype)
    losses_b = [first.step(x[i], y[i]) for i in range(10)]
    path = tmp_path / "ckpt.safetensors"
    tl.save_checkpoint(path, first, metadata={"epoch": "3"})
    del first
    resumed = _trainer(123, 456, optimizer, dtype)  # fresh objects: other weights, other dropout seed
    assert tl.load_checkpoint(path, resumed) == {"epoch": "3"}
    assert resumed.steps == 10 and resumed.context.seed == 11
    losses_b += [resumed.step(x[i], y[i]) for i in range(10, 20)]

    assert np.array_equal(np.array(losses_a), np.array(losses_b))
    assert _same_params(_params(straight.model), _params(resumed.model))
    assert straight.steps == resumed.steps == 20 and straight.lr == resumed.lr
    assert straight.context.rng_counter == resumed.context.rng_counter
    sa, sb = straight.optimizer.state(), resumed.optimizer.state()
    assert sa.keys() == sb.keys() and all(np.array_equal(sa[k], sb[k]) for k in sa)


def test_checkpoint_restores_step_lr_and_rng(tmp_path):
    x, y = _data()
    tr = _trainer(0, 11)
    for i in range(6):
        tr.step(x[i], y[i])
    path = tmp_path / "c.safetensors"
    tl.save_checkpoint(path, tr)
    meta = tl.io.read_metadata(path)
    assert meta["treadle.kind"] == "checkpoint" and meta["treadle.optimizer"] == "Adam"
    assert meta["treadle.step"] == "6" and float(meta["treadle.lr"]) == 1e-2
    fresh = _trainer(1, 2)
    fresh.optimizer.lr = 0.5
    tl.load_checkpoint(path, fresh)
    assert fresh.steps == 6 and fresh.optimizer.lr == 1e-2 and fresh.lr == tr.lr
    assert (fresh.context.seed, fresh.context.rng_counter) == (tr.context.seed, tr.context.rng_counter)
    assert _same_params(_params(tl.load(path)), _params(tr.model))  # a checkpoint is also a model file
    assert _same_params(_params(tl.load(path, model=_mlp(3, dropout=0.3))), _params(tr.model))


def _snapshot(tr):
    return (_params(tr.model), {k: v.copy() for k, v in tr.optimizer.state().items()}, tr.steps,
            tr.optimizer.lr, tr.context.seed, tr.context.rng_counter)


def _same_snapshot(a, b):
    return (_same_params(a[0], b[0]) and _same_params(a[1], b[1]) and a[2:] == b[2:])


def test_mismatched_checkpoints_change_nothing(tmp_path):
    x, y = _data()
    tr = _trainer(0, 11)
    for i in range(3):
        tr.step(x[i], y[i])
    path = tmp_path / "c.safetensors"
    tl.save_checkpoint(path, tr)

    sgd = _trainer(1, 2, "sgd")
    sgd.step(x[0], y[0])
    before = _snapshot(sgd)
    with pytest.raises(ValueError, match="holds Adam state but the trainer's optimizer is SGD"):
        tl.load_checkpoint(path, sgd)
    assert _same_snapshot(_snapshot(sgd), before)

    f64 = _trainer(1, 2, dtype="float64")
    before = _snapshot(f64)
    with pytest.raises(ValueError, match="same dtype"):
        tl.load_checkpoint(path, f64)
    assert _same_snapshot(_snapshot(f64), before)

    tl.manual_seed(0)
    other = tl.Trainer(nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)), tl.loss.MSE(), tl.optim.Adam())
    before = _snapshot(other)
    with pytest.raises(ValueError, match="architecture"):
        tl.load_checkpoint(path, other)
    assert _same_snapshot(_snapshot(other), before)

    model_file = tmp_path / "m.safetensors"
    tl.save(tr.model, model_file)
    fresh = _trainer(1, 2)
    before = _snapshot(fresh)
    with pytest.raises(ValueError, match="not a treadle training checkpoint"):
        tl.load_checkpoint(model_file, fresh)
    assert _same_snapshot(_snapshot(fresh), before)

    data = bytearray(path.read_bytes())
    for pos in (20, len(data) // 2, len(data) - 1):
        bad = bytearray(data)
        bad[pos] ^= 0x04
        path.write_bytes(bytes(bad))
        with pytest.raises(ValueError):
            tl.load_checkpoint(path, fresh)
        assert _same_snapshot(_snapshot(fresh), before)


def test_bad_checkpoint_metadata_is_rejected(tmp_path):
    tr = _trainer(0, 1)
    state = {**_params(tr.model), **{"optimizer:" + k: v for k, v in tr.optimizer.state().items()}}
    good = {"treadle.kind": "checkpoint", "treadle.dtype": "float32", "treadle.optimizer": "Adam",
            "treadle.step": "3", "treadle.lr": "0.01", "treadle.rng_seed": "1", "treadle.rng_counter": "0"}
    path = tmp_path / "c.safetensors"
    path.write_bytes(_file_bytes(state, good))
    tl.load_checkpoint(path, tr)
    assert tr.steps == 3
    for key, value, match in [("treadle.step", "-1", "not an integer"), ("treadle.step", "1e3", "not an integer"),
                              ("treadle.lr", "nan", "not a finite"), ("treadle.rng_counter", "x", "not an integer"),
                              ("treadle.optimizer", None, "no 'treadle.optimizer'")]:
        meta = dict(good)
        if value is None:
            del meta[key]
        else:
            meta[key] = value
        path.write_bytes(_file_bytes(state, meta))
        with pytest.raises(ValueError, match=match):
            tl.load_checkpoint(path, tr)
    missing = {k: v for k, v in state.items() if k != "optimizer:exp_avg"}
    path.write_bytes(_file_bytes(missing, good))
    with pytest.raises(ValueError, match="no optimizer state 'exp_avg'"):
        tl.load_checkpoint(path, tr)


# -- a C++ host, no Python involved in its files ---------------------------------------------------

_CPP_HOST = r"""
#include <treadle/serialize.hpp>
#include <treadle/treadle.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

using namespace treadle;

static std::shared_ptr<Model> make_model(bool dropout) {
  auto seq = std::make_shared<nn::Sequential>();
  seq->add(std::make_shared<nn::Linear>(4, 8)).add(std::make_shared<nn::Activation>("tanh"));
  if (dropout) seq->add(std::make_shared<nn::Dropout>(0.5));
  seq->add(std::make_shared<nn::Linear>(8, 2));
  return std::make_shared<Model>(seq);
}

static Tensor batch(int rows, int cols, float scale) {
  Tensor t({rows, cols}, DType::f32);
  for (int i = 0; i < rows * cols; ++i) t.data_as<float>()[i] = scale * static_cast<float>((i * 7) % 11 - 5);
  return t;
}

static void print(const Tensor& y) {
  for (int64_t i = 0; i < y.numel(); ++i) std::printf("%.9g\n", y.data_as<float>()[i]);
}

static bool same(const Tensor& a, const Tensor& b) { return std::memcmp(a.data(), b.data(), a.nbytes()) == 0; }

static int resume(const std::string& path) {
  Tensor x = batch(6, 4, 0.1f), y = batch(6, 2, 0.2f);
  auto train = [&](Trainer& t, int n, std::vector<double>& losses) {
    for (int i = 0; i < n; ++i) losses.push_back(t.step(x, y));
  };
  std::vector<double> a, b;
  manual_seed(1);
  Trainer straight(make_model(true), loss::mse(), optim::adam({}), {}, nullptr, 5);
  train(straight, 8, a);
  manual_seed(1);
  Trainer first(make_model(true), loss::mse(), optim::adam({}), {}, nullptr, 5);
  train(first, 4, b);
  save_checkpoint(path, first, {{"host", "c++"}});
  manual_seed(2);
  Trainer second(make_model(true), loss::mse(), optim::adam({}), {}, nullptr, 9);
  Metadata md = load_checkpoint(path, second);
  train(second, 4, b);
  bool ok = a == b && same(straight.model().flat_parameters(), second.model().flat_parameters()) &&
            md.at("host") == "c++" && second.steps() == 8;
  std::printf(ok ? "resume ok\n" : "resume MISMATCH\n");
  return ok ? 0 : 5;
}

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  const std::string mode = argv[1], path = argv[2];
  try {
    manual_seed(argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 0);
    auto model = make_model(false);
    if (mode == "save") {
      save_model(path, *model, {{"host", "c++"}});
      print(model->predict(batch(3, 4, 0.1f)));
    } else if (mode == "load") {
      load_model(path, *model);
      print(model->predict(batch(3, 4, 0.1f)));
    } else if (mode == "bad") {
      Tensor before = model->flat_parameters().clone();
      try {
        load_model(path, *model);
        return 3;
      } catch (const ValueError& e) {
        std::printf("ValueError: %s\n", e.what());
      }
      return same(before, model->flat_parameters()) ? 0 : 4;
    } else if (mode == "resume") {
      return resume(path);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def cpp_host(tmp_path_factory):
    # The C++ package: a development build (TREADLE_BUILD_DIR) or the installed wheel's treadle/lib.
    build = os.environ.get("TREADLE_BUILD_DIR")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    package = os.path.dirname(os.path.abspath(tl.__file__))
    if build and os.path.exists(os.path.join(build, "cpp", "libtreadle.so")):
        # The sources' headers, and the build's generated treadle/build_config.hpp beside them.
        lib, include = os.path.join(build, "cpp"), os.path.join(repo, "cpp", "include")
        includes = ["-I", include, "-I", os.path.join(build, "cpp", "include")]
    else:
        lib, include = os.path.join(package, "lib"), os.path.join(package, "include")
        includes = ["-I", include]
    compiler = shutil.which(os.environ.get("CXX", "c++"))
    if not compiler or not os.path.exists(os.path.join(lib, "libtreadle.so")):
        pytest.skip(f"needs a C++ compiler and the C++ package (libtreadle.so in {lib})")
    d = tmp_path_factory.mktemp("cpp_host")
    src, exe = d / "host.cpp", d / "host"
    src.write_text(_CPP_HOST)
    cmd = [compiler, "-std=c++20", "-O1", *includes, str(src), "-o", str(exe),
           "-L", lib, "-ltreadle", f"-Wl,-rpath,{lib}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return str(exe)


def _host(exe, *args):
    proc = subprocess.run([exe, *map(str, args)], capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def _python_twin(seed=0):
    tl.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def _host_batch():
    return (0.1 * ((np.arange(12) * 7) % 11 - 5)).astype(np.float32).reshape(3, 4)


def test_cpp_host_saves_python_loads(cpp_host, tmp_path):
    path = tmp_path / "cpp.safetensors"
    rc, out, err = _host(cpp_host, "save", path, 3)
    assert rc == 0, err
    expected = np.array([float(v) for v in out.split()], np.float32).reshape(3, 2)
    net = tl.load(path, model=_python_twin(9))
    assert np.array_equal(net.predict(_host_batch()), expected)
    assert tl.io.read_metadata(path)["host"] == "c++"
    with pytest.raises(ValueError, match="no architecture description"):
        tl.load(path)  # C++ modules carry no description: Python needs the model to load into


def test_python_saves_cpp_loads(cpp_host, tmp_path):
    path = tmp_path / "py.safetensors"
    net = _python_twin(4)
    tl.save(net, path)
    rc, out, err = _host(cpp_host, "load", path, 8)
    assert rc == 0, err
    got = np.array([float(v) for v in out.split()], np.float32).reshape(3, 2)
    assert np.array_equal(got, net.predict(_host_batch()))


def test_cpp_host_rejects_bad_files_unchanged(cpp_host, tmp_path):
    path = tmp_path / "py.safetensors"
    tl.save(_python_twin(4), path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    rc, out, err = _host(cpp_host, "bad", path)
    assert rc == 0 and "ValueError: load_model(" in out, out + err
    tl.save(nn.Sequential(nn.Linear(4, 3)), path)
    rc, out, err = _host(cpp_host, "bad", path)
    assert rc == 0 and "architecture" in out, out + err


def test_cpp_host_resumes_bitwise(cpp_host, tmp_path):
    rc, out, err = _host(cpp_host, "resume", tmp_path / "ckpt.safetensors")
    assert rc == 0 and "resume ok" in out, out + err


@pytest.mark.parametrize("make,shape", [
    (lambda: tl.nn.LSTM(3, 4, num_layers=2, bidirectional=True, batch_first=True), (2, 5, 3)),
    (lambda: tl.nn.GRU(3, 4, bias=False), (5, 2, 3)),
    (lambda: tl.nn.RNN(3, 4, nonlinearity="relu"), (5, 2, 3)),
    (lambda: tl.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True), (2, 5, 8)),
])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_recurrent_and_attention_layers_save_with_their_architecture(tmp_path, make, shape, dtype):
    """tl.save writes the architecture of the sequence layers too, so tl.load rebuilds them alone."""
    tl.manual_seed(0)
    net = tl.nn.Sequential(make())
    net.to(dtype)
    path = tmp_path / "seq.safetensors"
    tl.save(net, path)
    again = tl.load(path)
    assert again._modules["0"].config() == net._modules["0"].config()
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    first = lambda out: out[0] if isinstance(out, (tuple, list)) else out  # noqa: E731 (the output sequence)
    np.testing.assert_array_equal(first(again.predict(x)), first(net.predict(x)))


def test_multihead_attention_config_round_trips():
    m = tl.nn.MultiheadAttention(8, 2, dropout=0.1, bias=False, batch_first=True)
    desc = tl.io.describe(tl.nn.Sequential(m))
    rebuilt = tl.io.build(desc)._modules["0"]
    assert rebuilt.config() == m.config() == {"embed_dim": 8, "num_heads": 2, "dropout": 0.1, "bias": False,
                                              "batch_first": True}
