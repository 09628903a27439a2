"""Hardening: anomaly mode, skip-step-on-non-finite, the parameter checksum guard, memory reports
and budgets, and failure behaviour when a host executor raises mid-step (docs/hardening.md)."""
import concurrent.futures as cf

import numpy as np
import pytest

import treadle as tl


def _mlp(sizes=(4, 16, 3), dtype="float32", seed=0):
    tl.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        if i:
            layers.append(tl.nn.Tanh())
        layers.append(tl.nn.Linear(a, b))
    net = tl.nn.Sequential(*layers)
    if dtype == "float64":
        net.double()
    return net


def _data(n=8, fin=4, fout=3, dtype=np.float32, seed=0):
    r = np.random.default_rng(seed)
    return r.standard_normal((n, fin)).astype(dtype), r.standard_normal((n, fout)).astype(dtype)


# -- 1. anomaly mode --------------------------------------------------------------------------------

def test_anomaly_mode_is_off_by_default():
    net = _mlp()
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    assert trainer.detect_anomaly is False
    assert tl.Context().check_numerics is False
    x, y = _data()
    x[0, 0] = np.nan
    assert np.isnan(trainer.step(x, y))  # no check: NaN flows through silently


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_anomaly_names_the_forward_node(dtype):
    net = _mlp(dtype=dtype)
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1), detect_anomaly=True)
    w = dict(net.named_parameters())["2.weight"]  # the second Linear ("0" Linear, "1" Tanh, "2" Linear)
    w[1, 3] = np.inf
    before = net.flat_parameters().copy()
    x, y = _data(dtype=np.dtype(dtype))
    with pytest.raises(ValueError, match=r"check_numerics: node \d+ '(linear|matmul)' in module '2' \(forward pass\)"
                                         r" produced (NaN|Inf) in output 0 of shape \(8, 3\)"):
        trainer.step(x, y)
    assert trainer.steps == 0
    np.testing.assert_array_equal(net.flat_parameters(), before)  # raised before any update


def test_anomaly_names_the_backward_pass():
    # log(0) style: inputs finite, forward finite, but a huge output gradient overflows backward.
    net = _mlp((4, 3))
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1), detect_anomaly=True)
    x = np.ones((2, 4), np.float32)
    trainer.forward(x)
    g = np.full((2, 3), 3e38, np.float32)
    with pytest.raises(ValueError, match=r"\(backward pass\) produced Inf"):
        trainer.backward(g)


def test_anomaly_in_log_softmax_via_context():
    x_in = np.array([[np.inf, 1.0, 2.0]], np.float32)
    net = tl.nn.Sequential(tl.nn.LogSoftmax(dim=1))
    ctx = tl.Context(check_numerics=True)
    with pytest.raises(ValueError, match=r"'log_softmax' in module '0' \(forward pass\) produced NaN .*shape \(1, 3\)"):
        net.predict(x_in, context=ctx)
    out = net.predict(x_in)  # default pooled contexts do not check
    assert not np.isfinite(out).all()


def test_anomaly_mode_does_not_change_results():
    x, y = _data(32)
    runs = []
    for anomaly in (False, True):
        net = _mlp(seed=3)
        trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=1e-2), detect_anomaly=anomaly)
        losses = [trainer.step(x, y) for _ in range(5)]
        runs.append((losses, net.flat_parameters().copy()))
    assert runs[0][0] == runs[1][0]
    np.testing.assert_array_equal(runs[0][1], runs[1][1])


def test_anomaly_names_the_loss_pass():
    net = _mlp((4, 3))
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1), detect_anomaly=True)
    x, y = _data(fout=3)
    y[0, 0] = np.inf
    with pytest.raises(ValueError, match=r"\(loss pass\)"):
        trainer.step(x, y)


# -- 2. skip-step-on-non-finite ---------------------------------------------------------------------

def test_skip_nonfinite_leaves_parameters_and_optimizer_state():
    net = _mlp()
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=1e-2), skip_nonfinite=True)
    x, y = _data()
    trainer.step(x, y)
    params, steps = net.flat_parameters().copy(), trainer.steps
    state = {k: np.array(v) for k, v in trainer.optimizer.state().items()}
    bad = y.copy()
    bad[2, 1] = np.nan
    loss = trainer.step(x, bad)
    assert np.isnan(loss)
    assert trainer.skipped_steps == 1 and trainer.steps == steps
    np.testing.assert_array_equal(net.flat_parameters(), params)
    for k, v in trainer.optimizer.state().items():
        np.testing.assert_array_equal(v, state[k])
    # A finite batch afterwards trains exactly as if the bad one had never come.
    ref_net = _mlp()
    ref = tl.Trainer(ref_net, tl.loss.MSE(), tl.optim.Adam(lr=1e-2))
    ref.step(x, y)
    assert trainer.step(x, y) == ref.step(x, y)
    np.testing.assert_array_equal(net.flat_parameters(), ref_net.flat_parameters())
    assert trainer.skipped_steps == 1


def test_skip_nonfinite_on_gradient_overflow_with_finite_loss():
    # The loss is finite but a gradient overflows float32: only the norm check catches it.
    net = _mlp((4, 1))
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1), skip_nonfinite=True)
    net.flat_parameters()[:] = 0  # the prediction is 0 whatever the input
    params = net.flat_parameters().copy()
    x2 = np.full((1, 4), 1e30, np.float32)
    y2 = np.full((1, 1), 1e18, np.float32)  # residual 1e18: loss 1e36 is finite, dL/dw = 2e18 * 1e30 is not
    loss = trainer.step(x2, y2)
    assert np.isfinite(loss)
    assert trainer.skipped_steps == 1 and trainer.steps == 0
    np.testing.assert_array_equal(net.flat_parameters(), params)


def test_skip_nonfinite_off_updates_with_nan():
    net = _mlp()
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    x, y = _data()
    y[0, 0] = np.nan
    trainer.step(x, y)
    assert trainer.skipped_steps == 0 and trainer.steps == 1
    assert np.isnan(net.flat_parameters()).any()


def test_skip_nonfinite_in_host_driven_update():
    net = _mlp()
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1), skip_nonfinite=True)
    x, _ = _data()
    params = net.flat_parameters().copy()
    trainer.forward(x)
    trainer.backward(np.full((8, 3), np.inf, np.float32))
    trainer.update()
    assert trainer.skipped_steps == 1 and trainer.steps == 0
    np.testing.assert_array_equal(net.flat_parameters(), params)


# -- 3. silent data corruption guard ----------------------------------------------------------------

def _flip_bit(arr, index, bit):
    raw = arr.view(np.uint32 if arr.dtype == np.float32 else np.uint64)
    raw[index] ^= type(raw[index])(1) << type(raw[index])(bit)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_verify_parameters_detects_a_flipped_bit(dtype):
    net = _mlp(dtype=dtype)
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1), verify_parameters=True)
    x, y = _data(dtype=np.dtype(dtype))
    for _ in range(3):
        trainer.step(x, y)
    layout = {name: offset for name, _shape, offset in net._compiled().layout}
    flat = net.flat_parameters()
    _flip_bit(flat, layout["2.bias"] + 1, 7)
    with pytest.raises(RuntimeError, match=r"checksum mismatch in '2.bias' before update 4"):
        trainer.step(x, y)
    assert trainer.steps == 3
    _flip_bit(flat, layout["2.bias"] + 1, 7)  # flipping it back restores the sealed state
    trainer.step(x, y)
    assert trainer.steps == 4


def test_verify_parameters_names_every_affected_tensor_and_reseal():
    net = _mlp()
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1), verify_parameters=True)
    x, y = _data()
    trainer.step(x, y)
    named = dict(net.named_parameters())
    named["0.weight"][0, 0] += 1.0
    named["2.weight"][1, 1] += 1.0
    with pytest.raises(RuntimeError, match=r"'0.weight', '2.weight'"):
        trainer.step(x, y)
    with pytest.raises(RuntimeError, match="checksum"):
        trainer.evaluate(x, y)
    trainer.reseal_parameters()  # a deliberate edit
    trainer.step(x, y)
    assert trainer.steps == 2


def test_verify_parameters_off_by_default_and_first_step():
    net = _mlp()
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    x, y = _data()
    trainer.step(x, y)
    net.flat_parameters()[0] += 1
    trainer.step(x, y)  # no guard
    guarded = tl.Trainer(_mlp(), tl.loss.MSE(), tl.optim.SGD(lr=0.1), verify_parameters=True)
    guarded.model.flat_parameters()[0] += 1  # before the first update: nothing sealed yet
    guarded.step(x, y)


def test_verify_parameters_host_driven_phases():
    net = _mlp()
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1), verify_parameters=True)
    x, y = _data()
    for _ in range(2):
        out = trainer.forward(x)
        trainer.backward(2 * (out - y) / out.size)
        trainer.update()
    net.flat_parameters()[3] = 7.0
    with pytest.raises(RuntimeError, match="checksum mismatch in '0.weight'"):
        trainer.forward(x)


# -- 4. memory report and budget --------------------------------------------------------------------

def test_model_memory_report():
    net = _mlp((8, 32, 4))
    r = net.memory_report((16, 8))
    n = net._compiled().num_parameters
    assert r["parameters"] == n * 4 and r["gradients"] == n * 4 and r["optimizer_state"] == 0
    # Activations hold at least the forward's values: (16, 32) twice and (16, 4), in float32.
    assert r["activations"] >= 16 * (32 + 32 + 4) * 4
    assert r["total"] == r["parameters"] + r["gradients"] + r["activations"]
    infer = net.memory_report((16, 8), training=False)
    assert infer["gradients"] == 0 and infer["activations"] <= r["activations"]
    assert net.memory_report((64, 8))["activations"] > r["activations"]


def test_trainer_memory_report_counts_optimizer_state():
    net = _mlp((8, 32, 4))
    n = net._compiled().num_parameters
    sgd = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1)).memory_report((16, 8), (16, 4))
    adam = tl.Trainer(_mlp((8, 32, 4)), tl.loss.MSE(), tl.optim.Adam()).memory_report((16, 8), (16, 4))
    assert sgd["optimizer_state"] == 0
    assert adam["optimizer_state"] == 2 * n * 4  # exp_avg and exp_avg_sq
    assert adam["activations"] > 0 and adam["total"] == sum(v for k, v in adam.items() if k != "total")
    ce = tl.Trainer(_mlp((8, 4)), tl.loss.CrossEntropy(), tl.optim.SGD(lr=0.1)).memory_report((16, 8), (16,))
    assert ce["activations"] > 0


def test_memory_budget_refuses_up_front():
    net = _mlp((8, 64, 4))
    probe = tl.Trainer(_mlp((8, 64, 4)), tl.loss.MSE(), tl.optim.Adam())
    need_small = probe.memory_report((4, 8), (4, 4))["total"]
    need_big = probe.memory_report((512, 8), (512, 4))["total"]
    assert need_big > need_small
    budget = (need_small + need_big) // 2
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(), memory_budget=budget)
    x, y = _data(4, 8, 4)
    trainer.step(x, y)
    params, steps = net.flat_parameters().copy(), trainer.steps
    xb, yb = _data(512, 8, 4)
    with pytest.raises(ValueError, match=rf"Trainer: input of shape \(512, 8\) needs {need_big} bytes .*"
                                         rf"over the memory_budget of {budget} bytes"):
        trainer.step(xb, yb)
    np.testing.assert_array_equal(net.flat_parameters(), params)
    assert trainer.steps == steps
    trainer.step(x, y)  # the small signature still runs
    with pytest.raises(ValueError, match="memory_budget must be a positive"):
        tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(), memory_budget=0)


def test_context_memory_budget():
    net = _mlp((8, 64, 4))
    small = net.memory_report((2, 8), training=False)["activations"]
    big = net.memory_report((256, 8), training=False)["activations"]
    ctx = tl.Context(memory_budget=small)
    assert ctx.memory_budget == small
    net.predict(np.zeros((2, 8), np.float32), context=ctx)
    with pytest.raises(ValueError, match=rf"Context: a plan needs {big} bytes .* memory_budget of {small} bytes"):
        net.predict(np.zeros((256, 8), np.float32), context=ctx)
    ctx.memory_budget = 0
    net.predict(np.zeros((256, 8), np.float32), context=ctx)


# -- 7. failure behaviour: a host executor refusing its workers -----------------------------------------

class _FlakyPool:
    """A host pool that counts submits and raises on the ones listed in `fail_on` (1-based)."""

    def __init__(self, fail_on=()):
        self.pool = cf.ThreadPoolExecutor(2)
        self.fail_on, self.count = set(fail_on), 0

    def submit(self, fn):
        self.count += 1
        if self.count in self.fail_on:
            raise RuntimeError(f"pool refused task {self.count}")
        return self.pool.submit(fn)


def _big_setup(pool, linger=0.0):
    # Wide enough that kernels split over the executor (elementwise grain: 16384 elements; the
    # optimizer's: 65536 parameters, this net has 164K). No linger by default: each run calls its
    # helper in, so a test knows which submit a run makes.
    net = _mlp((64, 512, 256), seed=5)
    ex = tl.PoolExecutor(pool, 2, linger=linger)
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=1e-3), executor=ex)
    x, y = _data(64, 64, 256, seed=1)
    return net, trainer, x, y


def _submits(call):
    pool = _FlakyPool()
    net, trainer, x, y = _big_setup(pool)
    trainer.step(x, y)  # first step compiles and warms up
    start = pool.count
    call(net, trainer, x, y)
    return pool.count - start


def test_the_pool_is_called_in_once_per_run_not_once_per_kernel():
    # Every kernel of this step splits over the executor (dozens of parallel_for calls); the host's
    # pool is asked for its one other worker once per step, once per predict, once per host phase.
    assert _submits(lambda n, t, x, y: t.step(x, y)) == 1
    assert _submits(lambda n, t, x, y: [t.step(x, y) for _ in range(3)]) == 3
    assert _submits(lambda n, t, x, y: t.compute_gradients(x, y)) == 1
    big = lambda x: np.tile(x, (32, 1))  # noqa: E731  (a forward whose kernels split too)
    assert _submits(lambda n, t, x, y: n.predict(big(x), context=tl.Context(executor=t.executor))) == 1


def test_lingering_helpers_serve_the_next_steps():
    pool = _FlakyPool()
    net, trainer, x, y = _big_setup(pool, linger=0.5)
    ref_net, ref, _, _ = _big_setup(_FlakyPool())
    start = pool.count
    losses = [trainer.step(x, y) for _ in range(20)]
    # At most one call-in per step, usually one in all: the helper waits half a second for the next.
    assert 1 <= pool.count - start < 20
    assert losses == [ref.step(x, y) for _ in range(20)]
    np.testing.assert_array_equal(net.flat_parameters(), ref_net.flat_parameters())
    with pytest.raises(ValueError, match="linger"):
        tl.PoolExecutor(pool, 2, linger=-1)


def test_a_pool_refusing_the_step_leaves_the_model_unchanged():
    pool = _FlakyPool()
    net, trainer, x, y = _big_setup(pool)
    trainer.step(x, y)
    params, steps = net.flat_parameters().copy(), trainer.steps
    pool.fail_on = {pool.count + 1}  # the call-in of the next step's worker
    with pytest.raises(RuntimeError, match="pool refused task"):
        trainer.step(x, y)
    np.testing.assert_array_equal(net.flat_parameters(), params)
    assert trainer.steps == steps
    # The trainer is usable afterwards and continues exactly like one that never failed.
    ref_pool = _FlakyPool()
    ref_net, ref, _, _ = _big_setup(ref_pool)
    ref.step(x, y)
    assert trainer.step(x, y) == ref.step(x, y)
    np.testing.assert_array_equal(net.flat_parameters(), ref_net.flat_parameters())


def test_a_pool_refusing_the_update_applies_it_whole():
    pool = _FlakyPool()
    net, trainer, x, y = _big_setup(pool)
    trainer.step(x, y)
    trainer.zero_grad()
    trainer.compute_gradients(x, y)
    pool.fail_on = {pool.count + 1}  # the update's call-in: its first parallel kernel
    with pytest.raises(RuntimeError, match="pool refused task"):
        trainer.update()
    # The calling thread ran every chunk before the pool's error propagated: the update is whole,
    # not half. (Optimizer.step rolls its step count back when update() raises; docs/hardening.md.)
    ref_pool = _FlakyPool()
    ref_net, ref, _, _ = _big_setup(ref_pool)
    ref.step(x, y)
    ref.step(x, y)
    np.testing.assert_array_equal(net.flat_parameters(), ref_net.flat_parameters())


# -- determinism ------------------------------------------------------------------------------------

def _run(executor=None, seed=7):
    tl.manual_seed(seed)
    net = tl.nn.Sequential(tl.nn.Linear(64, 512), tl.nn.ReLU(), tl.nn.Dropout(0.2), tl.nn.Linear(512, 32))
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=1e-3), seed=seed, executor=executor)
    x, y = _data(64, 64, 32, seed=1)
    losses = [trainer.step(x, y) for _ in range(4)]
    return losses, net.flat_parameters().copy()


def test_same_seed_gives_bitwise_identical_runs_serial_or_pooled():
    a, b = _run(), _run()
    assert a[0] == b[0]
    np.testing.assert_array_equal(a[1], b[1])
    with cf.ThreadPoolExecutor(3) as pool:
        c = _run(tl.PoolExecutor(pool, 3))
    assert a[0] == c[0]  # fixed chunk boundaries: the worker count does not change a bit
    np.testing.assert_array_equal(a[1], c[1])
    d = _run(seed=8)
    assert d[0] != a[0]
