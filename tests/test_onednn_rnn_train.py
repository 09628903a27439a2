"""LSTM and GRU layers in training plans on the oneDNN backend (vanilla_lstm and lbr_gru,
forward_training + backward, sharing oneDNN's workspace through the layer's `saved` value).

- Loss, every parameter gradient and the input gradient of LSTM/GRU modules trained on "onednn" in
  float32 against the float64 Eigen reference, on fresh random inputs (the seed is in the failure
  message): time-major and batch_first, no bias, stacked bidirectional layers, given initial states,
  batches that split into pieces with a remainder. The plan must run both ops of every layer on oneDNN.
- What stays on Eigen, as a pair: variable lengths, float64, one sample, small layers, and run_op
  (the host reads `saved`); "auto" keeps forward and backward of a layer on one backend.
- Bitwise the same gradients on 1, 2, 3 and 7 workers; anomaly mode does not read oneDNN's
  workspace as numbers and still names a NaN; a training curve follows Eigen's.

Skipped when treadle was built without oneDNN.
"""
import concurrent.futures
import os

import numpy as np
import pytest

import treadle as tl
from opcheck import assert_close_f32

pytestmark = pytest.mark.skipif("onednn" not in tl.backends(),
                                reason="treadle was built without oneDNN (TREADLE_WITH_ONEDNN=OFF)")

F32 = np.float32
T, I, H = 9, 20, 128  # with AVX-512 oneDNN takes the training pair at H 128 from 64 samples (LSTM and GRU alike)


def fresh_seed():
    return int.from_bytes(os.urandom(4), "little")


class Net(tl.nn.Module):
    """x [, h0 [, c0]] -> the output sequence of one recurrent module."""

    def __init__(self, cell, has_state, hidden=H, **kw):
        super().__init__()
        self.rnn = getattr(tl.nn, cell)(I, hidden, **kw)
        self.has_state = has_state
        self.lstm = cell == "LSTM"

    def forward(self, x, *states):
        if not self.has_state:
            return self.rnn(x)[0]
        return self.rnn(x, tuple(states) if self.lstm else states[0])[0]


def build(cell, backend, seed, has_state=False, dtype="float32", **kw):
    tl.manual_seed(seed)
    net = Net(cell, has_state, **kw)
    if dtype != "float32":
        net.to(dtype)
    net.set_backend(backend)
    return net


def layer_backends(net):
    """{op: set of backends} over the recurrent layer ops of the net's plans."""
    found = {}
    for line in net._compiled().describe_plans().splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[1].endswith(("lstm_layer", "gru_layer", "_layer_backward")):
            found.setdefault(parts[1], set()).add(parts[2].strip("[]"))
    return found


def batch(rng, cell, n, batch_first=False, directions=1, layers_dirs=1, has_state=False, dtype=F32, hidden=H):
    x = rng.standard_normal((n, T, I) if batch_first else (T, n, I)).astype(dtype)
    width = hidden * directions
    dy = rng.standard_normal((n, T, width) if batch_first else (T, n, width)).astype(dtype)
    states = []
    if has_state:
        states = [rng.standard_normal((layers_dirs, n, H)).astype(dtype) for _ in range(2 if cell == "LSTM" else 1)]
    return [x] + states, dy


def gradients(net, xs, dy):
    """(every parameter gradient, the gradients of every input) for dL/d(output) = dy."""
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    trainer.zero_grad()
    trainer.forward(xs, input_grad=True)
    dxs = trainer.backward(dy, input_grad=True)
    return {k: v.copy() for k, v in net.named_gradients().items()}, [np.array(d) for d in dxs]


CASES = {
    "tnf": dict(kw={}, n=12),
    "ntf": dict(kw={"batch_first": True}, n=12),
    "no_bias": dict(kw={"bias": False}, n=12),
    "stacked_bidirectional": dict(kw={"num_layers": 2, "bidirectional": True}, n=12, directions=2, layers_dirs=4),
    "initial_states": dict(kw={}, n=12, has_state=True),
    "pieces_with_remainder": dict(kw={"batch_first": True}, n=70),  # 32 + 32 + 6 samples
}


@pytest.mark.usefixtures("all_kernels")
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_gradients_match_float64_reference(cell, case):
    c = CASES[case]
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    xs, dy = batch(rng, cell, c["n"], c["kw"].get("batch_first", False), c.get("directions", 1),
                   c.get("layers_dirs", 1), c.get("has_state", False))
    fast = build(cell, "onednn", seed, c.get("has_state", False), **c["kw"])
    got_w, got_x = gradients(fast, xs, dy)
    op = cell.lower() + "_layer"
    assert layer_backends(fast) == {op: {"onednn"}, op + "_backward": {"onednn"}}
    ref = build(cell, "eigen", seed, c.get("has_state", False), dtype="float64", **c["kw"])
    want_w, want_x = gradients(ref, [x.astype(np.float64) for x in xs], dy.astype(np.float64))
    assert set(got_w) == set(want_w)
    for name in want_w:
        assert_close_f32(got_w[name], want_w[name], f"{cell} {case} d{name} (seed {seed})")
    for k, (g, w) in enumerate(zip(got_x, want_x)):
        assert_close_f32(g, w, f"{cell} {case} d(input {k}) (seed {seed})")


class WithLengths(tl.nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.rnn = getattr(tl.nn, cell)(I, H)

    def forward(self, x, lengths):
        return self.rnn(x, None, lengths)[0]


@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_what_oneDNN_does_not_take_stays_on_eigen_as_a_pair(cell):
    rng = np.random.default_rng(1)
    op = cell.lower() + "_layer"
    eigen_pair = {op: {"eigen"}, op + "_backward": {"eigen"}}
    x, dy = batch(rng, cell, 8)
    net = WithLengths(cell)
    net.set_backend("onednn")
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    trainer.forward([x[0], np.array([9, 3, 5, 9, 1, 2, 7, 8], np.int64)])
    trainer.backward(dy)
    assert layer_backends(net) == eigen_pair
    for net, xs, g in [(build(cell, "onednn", 0, dtype="float64"), [x[0].astype(np.float64)], dy.astype(np.float64)),
                       (build(cell, "onednn", 0), [np.ascontiguousarray(x[0][:, :1])],  # one sample
                        np.ascontiguousarray(dy[:, :1]))]:
        gradients(net, xs, g)
        assert layer_backends(net) == eigen_pair
    # Below the measured thresholds: LSTM from N 32 at H 64 (here 16), GRU from H 128 (here 64).
    small = build(cell, "onednn", 0, hidden=64)
    xs, g = batch(rng, cell, 16, hidden=64)
    gradients(small, xs, g)
    assert layer_backends(small) == eigen_pair


@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
@pytest.mark.parametrize("n", [32, 64])
def test_training_pair_dispatch_follows_the_instruction_set(cell, n):
    """The default dispatch: with oneDNN's AVX2 kernels, Eigen's packed step products beat the pair at
    every size measured (docs/onednn_ops.md) and the plan names that decline; with AVX-512 kernels
    oneDNN takes the pair at H 128 from two pieces of 32 samples (below, one piece would run on one
    worker while Eigen shares the batch among them)."""
    xs, dy = batch(np.random.default_rng(6), cell, n)
    net = build(cell, "onednn", 0)
    gradients(net, xs, dy)
    op = cell.lower() + "_layer"
    if tl.info()["onednn.isa"].startswith("avx512") and n >= 64:
        assert layer_backends(net) == {op: {"onednn"}, op + "_backward": {"onednn"}}
    else:
        assert layer_backends(net) == {op: {"eigen"}, op + "_backward": {"eigen"}}
    if not tl.info()["onednn.isa"].startswith("avx512") and n >= 64:
        assert "oneDNN's LSTM and GRU training pair is slower than Eigen's" in net._compiled().describe_plans()


@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_run_op_reads_saved_so_the_pair_stays_on_eigen(cell):
    rng = np.random.default_rng(0)
    n, gates = 16, 4 if cell == "LSTM" else 3
    shapes = [(T, n, I), (n, H)] + ([(n, H)] if cell == "LSTM" else []) + [
        (gates * H, I), (gates * H, H), (gates * H,), (gates * H,)]
    args = [rng.standard_normal(s).astype(F32) for s in shapes]
    op = cell.lower() + "_layer"
    grads = [rng.standard_normal((T, n, H)).astype(F32)] + [None] * (3 if cell == "LSTM" else 2)
    plan = tl._core.describe_op(op, args, {}, grads, "onednn", True)
    assert f"{op} [eigen]" in plan and f"{op}_backward [eigen]" in plan


@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_auto_dispatch_keeps_each_layer_pair_on_one_backend(cell):
    rng = np.random.default_rng(2)
    xs, dy = batch(rng, cell, 16)
    net = build(cell, "auto", 0)
    gradients(net, xs, dy)
    found = layer_backends(net)
    op = cell.lower() + "_layer"
    assert found[op] == found[op + "_backward"] and len(found[op]) == 1


@pytest.mark.usefixtures("all_kernels")
@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_gradients_do_not_depend_on_the_workers(cell):
    rng = np.random.default_rng(3)
    xs, dy = batch(rng, cell, 100, batch_first=True, directions=2)  # 4 pieces, the last one short
    net = build(cell, "onednn", 1, bidirectional=True, batch_first=True)
    serial_w, serial_x = gradients(net, xs, dy)
    for workers in (2, 3, 7):
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.0),
                                 executor=tl.PoolExecutor(pool, workers))
            trainer.zero_grad()
            trainer.forward(xs, input_grad=True)
            dx = trainer.backward(dy, input_grad=True)
            for name, g in net.named_gradients().items():
                np.testing.assert_array_equal(g, serial_w[name], err_msg=f"{name}, workers={workers}")
            np.testing.assert_array_equal(np.array(dx[0]), serial_x[0], err_msg=f"dx, workers={workers}")


@pytest.mark.usefixtures("all_kernels")
@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_anomaly_mode_skips_the_workspace_and_names_a_nan(cell):
    rng = np.random.default_rng(4)
    (x,), dy = batch(rng, cell, 16)
    y = rng.standard_normal(dy.shape).astype(F32)
    net = build(cell, "onednn", 0)
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=1e-2), detect_anomaly=True)
    for _ in range(3):
        trainer.step(x, y)
    op = cell.lower() + "_layer"
    assert layer_backends(net)[op] == {"onednn"}
    bad = x.copy()
    bad[2, 3, 4] = np.nan
    with pytest.raises(ValueError, match=f"'{op}'.*NaN"):
        trainer.step(bad, y)


@pytest.mark.usefixtures("all_kernels")
@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_training_curve_follows_eigen(cell):
    rng = np.random.default_rng(5)
    (x,), _ = batch(rng, cell, 24, batch_first=True)
    y = np.tanh(np.cumsum(x[:, :, :1], axis=1)).astype(F32)  # a running sum to learn

    class Head(tl.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = getattr(tl.nn, cell)(I, H, batch_first=True)
            self.out = tl.nn.Linear(H, 1)

        def forward(self, x):
            return self.out(self.rnn(x)[0])

    curves = {}
    for backend in ("onednn", "eigen"):
        tl.manual_seed(7)
        net = Head()
        net.set_backend(backend)
        trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=3e-3))
        curves[backend] = np.array([trainer.step(x, y) for _ in range(40)])
    assert curves["onednn"][-1] < 0.7 * curves["onednn"][0]
    np.testing.assert_allclose(curves["onednn"], curves["eigen"], rtol=1e-4)
