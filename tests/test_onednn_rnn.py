"""LSTM layers on the oneDNN backend (lstm_layer in inference plans, on vanilla_lstm).

- Predictions (output, h_n, c_n) of LSTM modules on "onednn" against Eigen float32 and the float64
  reference, on fresh random inputs (the seed is in the failure message): batch_first, reverse
  (bidirectional), stacks, no bias, given initial states, batches that split into pieces with a
  remainder; the plan must run every lstm_layer on oneDNN.
- Training plans take the forward_training/backward pair instead (tests/test_onednn_rnn_train.py);
  what stays on Eigen: run_op (returns `saved`), variable lengths, float64, one sample and small
  layers.
- GRU predictions (lbr_gru forward_inference) against the float64 reference, the same layouts.
- Bitwise the same on 1, 2, 3 and 7 workers, and from concurrent threads on one shared plan.
- Training on "onednn" follows the Eigen curve; no OpenMP worker threads; primitives created when
  plans are compiled only.

Skipped when treadle was built without oneDNN.
"""
import concurrent.futures
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import treadle as tl
from opcheck import assert_close_f32, assert_concurrent_predictions_bitwise

pytestmark = pytest.mark.skipif("onednn" not in tl.backends(),
                                reason="treadle was built without oneDNN (TREADLE_WITH_ONEDNN=OFF)")

F32 = np.float32
T, I, H = 9, 20, 32


class Net(tl.nn.Module):
    """x [, h0, c0] as model inputs -> output, h_n, c_n."""

    def __init__(self, rnn, has_state=False):
        super().__init__()
        self.rnn = rnn
        self.has_state = has_state

    def forward(self, x, *states):
        out, (h, c) = self.rnn(x, tuple(states) if self.has_state else None)
        return out, h, c


def fresh_seed():
    return int.from_bytes(os.urandom(4), "little")


def build(backend, seed, has_state=False, dtype="float32", input_size=I, hidden=H, **kw):
    tl.manual_seed(seed)
    net = Net(tl.nn.LSTM(input_size, hidden, **kw), has_state)
    if dtype != "float32":
        net.to(dtype)
    net.set_backend(backend)
    return net


def lstm_backends(net):
    """The backends that ran each lstm_layer step of the model's compiled plans."""
    found = set()
    for line in net._compiled().describe_plans().splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[1] == "lstm_layer":
            found.add(parts[2].strip("[]"))
    return found


def inputs(rng, n, batch_first, layers_dirs, has_state, dtype=F32):
    x = rng.standard_normal((n, T, I) if batch_first else (T, n, I)).astype(dtype)
    states = [(0.5 * rng.standard_normal((layers_dirs, n, H))).astype(dtype) for _ in range(2)] if has_state else []
    return [x] + states


CASES = {  # id -> (batch, LSTM keyword arguments, initial states given)
    "tnf": (5, {}, False),
    "ntf": (5, {"batch_first": True}, False),
    "pieces-remainder": (70, {}, False),
    "pieces-exact-ntf": (64, {"batch_first": True}, False),
    "bidirectional-states": (37, {"bidirectional": True}, True),
    "two-layers-ntf-bi": (9, {"num_layers": 2, "batch_first": True, "bidirectional": True}, True),
    "no-bias": (12, {"bias": False}, False),
}


@pytest.mark.usefixtures("all_kernels")
@pytest.mark.parametrize("case", list(CASES))
def test_predictions_match_eigen_and_float64_reference(case):
    n, kw, has_state = CASES[case]
    seed = fresh_seed()
    layers_dirs = kw.get("num_layers", 1) * (2 if kw.get("bidirectional") else 1)
    xs = inputs(np.random.default_rng(seed), n, kw.get("batch_first", False), layers_dirs, has_state)
    outs = {b: build(b, 3, has_state, **kw) for b in ("onednn", "eigen")}
    ref = build("eigen", 3, has_state, dtype="float64", **kw)
    got = outs["onednn"].predict(xs)
    eig = outs["eigen"].predict(xs)
    want = ref.predict([x.astype(np.float64) for x in xs])
    for name, g, e, w in zip(("output", "h_n", "c_n"), got, eig, want):
        assert_close_f32(g, e, f"{case} {name} vs Eigen float32 (seed {seed})")
        assert_close_f32(g, w, f"{case} {name} vs float64 reference (seed {seed})")
    assert lstm_backends(outs["onednn"]) == {"onednn"}
    assert lstm_backends(outs["eigen"]) == {"eigen"}


@pytest.mark.parametrize("kw", [{}, {"batch_first": True}, {"bias": False},
                                {"num_layers": 2, "bidirectional": True}], ids=["tnf", "ntf", "no_bias", "stack"])
@pytest.mark.usefixtures("all_kernels")
def test_gru_predictions_match_float64_reference(kw):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    shape = (70, T, I) if kw.get("batch_first") else (T, 70, I)  # pieces of 32 + 32 + 6 samples
    x = rng.standard_normal(shape).astype(F32)
    nets = {}
    for backend, dtype in (("onednn", "float32"), ("eigen", "float64")):
        tl.manual_seed(seed)
        nets[backend] = tl.nn.GRU(I, 64, **kw)  # oneDNN takes GRU inference from H 64
        if dtype == "float64":
            nets[backend].to(dtype)
        nets[backend].set_backend(backend)
    got = nets["onednn"].predict(x)
    plans = nets["onednn"]._compiled().describe_plans()
    assert "gru_layer [onednn]" in plans and "gru_layer [eigen]" not in plans
    want = nets["eigen"].predict(x.astype(np.float64))
    for name, g, w in zip(("output", "h_n"), got, want):
        assert_close_f32(g, w, f"GRU {kw} {name} (seed {seed})")


@pytest.mark.usefixtures("all_kernels")
def test_large_values_saturate_like_eigen():
    """Inputs of scale 8 drive the gates into saturation (sigmoid/tanh tails)."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    x = (8 * rng.standard_normal((T, 40, I))).astype(F32)
    got = build("onednn", 5).predict([x])
    want = build("eigen", 5, dtype="float64").predict([x.astype(np.float64)])
    for name, g, w in zip(("output", "h_n", "c_n"), got, want):
        assert_close_f32(g, w, f"{name} (seed {seed})")


@pytest.mark.usefixtures("all_kernels")
def test_training_plans_take_the_training_pair_and_inference_plans_the_inference_kernel():
    rng = np.random.default_rng(0)
    # The LSTM training pair is taken from H 128 on every CPU (from N 32 and H 32 with AVX-512 kernels).
    hidden = 128
    x, y = rng.standard_normal((32, T, I)).astype(F32), rng.standard_normal((32, hidden)).astype(F32)

    class Head(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = tl.nn.LSTM(I, hidden, batch_first=True)

        def forward(self, x):
            return self.rnn(x)[1][0][0]  # h_n of the single layer

    net = Head()
    net.set_backend("onednn")
    tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=1e-2)).step(x, y)
    plans = net._compiled().describe_plans()
    assert "lstm_layer [onednn]" in plans and "lstm_layer_backward [onednn]" in plans
    assert "[eigen]" not in plans.split("lstm_layer [onednn]")[1].split("\n")[0]
    net.predict(x)
    predict_plan = net._compiled().describe_plans()
    assert predict_plan.count("lstm_layer [onednn]") == 2 and "lstm_layer [eigen]" not in predict_plan


def test_run_op_returns_saved_so_eigen_runs_it():
    rng = np.random.default_rng(0)
    n = 8
    args = [rng.standard_normal(s).astype(F32) for s in
            [(T, n, I), (n, H), (n, H), (4 * H, I), (4 * H, H), (4 * H,), (4 * H,)]]
    plan = tl._core.describe_op("lstm_layer", args, {}, None, "onednn", False)
    assert "lstm_layer [eigen]" in plan


class WithLengths(tl.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = tl.nn.LSTM(I, H)

    def forward(self, x, lengths):
        return self.rnn(x, None, lengths)[0]


def test_variable_lengths_float64_and_small_layers_stay_on_eigen():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((T, 8, I)).astype(F32)
    net = WithLengths()
    net.set_backend("onednn")
    net.predict([x, np.array([9, 3, 5, 9, 1, 2, 7, 8], np.int64)])
    assert lstm_backends(net) == {"eigen"}
    net = build("onednn", 0, dtype="float64")
    net.predict([x.astype(np.float64)])
    assert lstm_backends(net) == {"eigen"}
    one = build("onednn", 0)  # one sample: Eigen's matrix-vector steps are faster
    one.predict([np.ascontiguousarray(x[:, :1])])
    assert lstm_backends(one) == {"eigen"}
    gru = tl.nn.GRU(I, 32)  # GRU inference is taken from H 64
    gru.set_backend("onednn")
    gru.predict(x)
    assert "gru_layer [eigen]" in gru._compiled().describe_plans()
    small = build("onednn", 0, input_size=4, hidden=4)  # below the size threshold
    small.predict([rng.standard_normal((3, 2, 4)).astype(F32)])
    assert lstm_backends(small) == {"eigen"}


def test_lstm_inference_dispatch_follows_the_instruction_set():
    """The default dispatch: with oneDNN's AVX2 kernels, Eigen's packed step products are faster below
    H 128 (docs/onednn_ops.md) and the plan names that decline; with AVX-512 kernels oneDNN takes them."""
    x = np.random.default_rng(6).standard_normal((T, 12, I)).astype(F32)
    net = build("onednn", 0)  # H 32, 12 samples
    net.predict([x])
    plans = net._compiled().describe_plans()
    if tl.info()["onednn.isa"].startswith("avx512"):
        assert lstm_backends(net) == {"onednn"}
    else:
        assert lstm_backends(net) == {"eigen"}
        assert "oneDNN's LSTM below hidden size 128 or 4 samples is slower than Eigen's" in plans


@pytest.mark.usefixtures("all_kernels")
def test_anomaly_mode_ignores_the_unwritten_saved_buffer():
    x = np.random.default_rng(2).standard_normal((T, 6, I)).astype(F32)
    net = build("onednn", 0)
    ctx = tl.Context(check_numerics=True)
    y = net.predict([x], context=ctx)
    assert lstm_backends(net) == {"onednn"}
    np.testing.assert_array_equal(y[0], net.predict([x])[0])


@pytest.mark.usefixtures("all_kernels")
@pytest.mark.parametrize("batch_first", [False, True], ids=["tnf", "ntf"])
def test_results_do_not_depend_on_the_workers(batch_first):
    rng = np.random.default_rng(3)
    xs = inputs(rng, 100, batch_first, 2, True)  # 4 pieces of samples, the last one short
    net = build("onednn", 1, True, bidirectional=True, batch_first=batch_first)
    serial = net.predict(xs)
    assert lstm_backends(net) == {"onednn"}
    for workers in (2, 3, 7):
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            ctx = tl.Context(executor=tl.PoolExecutor(pool, workers))
            for a, b in zip(serial, net.predict(xs, context=ctx)):
                np.testing.assert_array_equal(a, b, err_msg=f"workers={workers}")


@pytest.mark.usefixtures("all_kernels")
def test_concurrent_predictions_on_shared_primitives_are_bitwise_serial():
    rng = np.random.default_rng(4)

    class Last(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = tl.nn.LSTM(I, H)

        def forward(self, x):
            return self.rnn(x)[0]

    net = Last()
    net.set_backend("onednn")
    xs = [rng.standard_normal((T, 40, I)).astype(F32) for _ in range(6)]
    net.predict(xs[0])
    assert lstm_backends(net) == {"onednn"}
    assert_concurrent_predictions_bitwise(net, xs, repeats=4)


class Regressor(tl.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = tl.nn.LSTM(I, H, batch_first=True)
        self.head = tl.nn.Linear(H, 1)

    def forward(self, x):
        return self.head(self.rnn(x)[1][0][0])


@pytest.mark.usefixtures("all_kernels")
def test_training_curve_and_predictions_match_eigen():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, T, I)).astype(F32)
    y = np.tanh(x[:, :, :3].sum(axis=(1, 2)))[:, None].astype(F32)
    curves, preds = {}, {}
    for backend in ("onednn", "eigen"):
        tl.manual_seed(7)
        net = Regressor()
        net.set_backend(backend)
        trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=3e-3))
        curves[backend], preds[backend] = [], []
        for _ in range(15):
            curves[backend].append(trainer.fit(x, y, epochs=1, batch_size=16, shuffle=False)["loss"][-1])
            preds[backend].append(net.predict(x))
        assert lstm_backends(net) >= {backend}
    np.testing.assert_allclose(curves["onednn"], curves["eigen"], rtol=1e-4)
    for a, b in zip(preds["onednn"], preds["eigen"]):
        assert_close_f32(a, b, "predictions during training")
    assert curves["onednn"][-1] < 0.7 * curves["onednn"][0]


def _subprocess(script, env):
    full = dict(os.environ, **env)
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(tl.__file__)))
    full["PYTHONPATH"] = os.pathsep.join([pkg_root, full.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=full, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


PREAMBLE = """
    import os, json
    import numpy as np
    import treadle as tl
    all_kernels = tl._core.AllKernels()  # oneDNN's kernels on every CPU (the all_kernels fixture)
    all_kernels.__enter__()
    net = tl.nn.LSTM(20, 32, num_layers=2, bidirectional=True)
    net.set_backend("onednn")
    x = np.random.default_rng(0).standard_normal((9, 70, 20)).astype(np.float32)
    y = np.random.default_rng(1).standard_normal((9, 70, 256)).astype(np.float32)
    class Seq(tl.nn.Module):  # hidden 128: oneDNN takes the LSTM training pair from there on every CPU
        def __init__(self):
            super().__init__()
            self.rnn = tl.nn.LSTM(20, 128, num_layers=2, bidirectional=True)
        def forward(self, x):
            return self.rnn(x)[0]
    trained = Seq()
    trained.set_backend("onednn")
    trainer = tl.Trainer(trained, tl.loss.MSE(), tl.optim.Adam(lr=1e-3))
"""


def test_no_openmp_threads_started():
    out = _subprocess(PREAMBLE + """
    def count():
        return len(os.listdir("/proc/self/task"))
    start = count()
    for _ in range(3):
        net.predict(x)
        trainer.step(x, y)
    print(json.dumps({"start": start, "end": count(), "plans": net._compiled().describe_plans(),
                      "train": trained._compiled().describe_plans()}))
    """, {"OMP_NUM_THREADS": "4"})
    r = json.loads(out.strip().splitlines()[-1])
    assert "lstm_layer [onednn]" in r["plans"] and "lstm_layer_backward [onednn]" in r["train"]
    assert r["end"] == r["start"]


def test_primitives_are_created_at_plan_time_only():
    out = _subprocess(PREAMBLE + """
    for k in range(3):
        print("=== call", k, flush=True)
        net.predict(x)
        trainer.step(x, y)
    """, {"ONEDNN_VERBOSE": "2"})
    sections = out.split("=== call")[1:]
    creates = [s.count("onednn_verbose,create") for s in sections]
    execs = [s.count("onednn_verbose,exec") for s in sections]
    assert creates[0] > 0 and creates[1:] == [0, 0], creates
    assert execs[1] == execs[2] > 0, execs
