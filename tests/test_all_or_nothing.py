"""All or nothing: a refused call leaves model, trainer, optimizer and schedule exactly as they were.

Each case builds a trained trainer, snapshots every piece of state a later step depends on (parameters,
buffers, dtype, precision, backend, fusion; optimizer state, step count and lr; the trainer's step and
skip counters, learning rate and loss scale), makes one call that must be refused, and compares the
snapshot, bit for bit. Then it takes one more step and compares it with an untouched twin: a refusal
that left hidden state behind (a plan, a bound optimizer) shows up there."""
import concurrent.futures
import math

import numpy as np
import pytest

import treadle as tl

X = np.linspace(-1, 1, 24, dtype=np.float32).reshape(8, 3)
Y = np.cos(X[:, :1] * 2).astype(np.float32)


def _setup(loss_scale=None, dtype="float32"):
    tl.manual_seed(0)
    net = tl.nn.Sequential(tl.nn.Linear(3, 8), tl.nn.BatchNorm1d(8), tl.nn.Tanh(), tl.nn.Linear(8, 1))
    net.to(dtype)
    opt = tl.optim.Adam(lr=1e-2)
    trainer = tl.Trainer(net, tl.loss.MSE(), opt, schedule=tl.optim.StepLR(step_size=2, gamma=0.5),
                         loss_scale=loss_scale)
    for _ in range(3):
        trainer.step(X.astype(dtype), Y.astype(dtype))
    return net, opt, trainer


def _snapshot(net, opt, trainer):
    return {
        "state_dict": {k: np.array(v, copy=True) for k, v in net.state_dict().items()},
        "model": (net.dtype, net.fusion, net.deterministic, net._compiled().backend),
        "optimizer_state": opt.state(),
        "optimizer": (opt.step_count, opt.lr),
        "trainer": (trainer.steps, trainer.skipped_steps, trainer.lr, trainer.loss_scale),
    }


def _assert_same(before, after):
    assert before.keys() == after.keys()
    for part in ("state_dict", "optimizer_state"):
        assert before[part].keys() == after[part].keys(), part
        for k in before[part]:
            np.testing.assert_array_equal(after[part][k], before[part][k], err_msg=f"{part}[{k}]")
            assert after[part][k].dtype == before[part][k].dtype, f"{part}[{k}]"
    for part in ("model", "optimizer", "trainer"):
        assert after[part] == before[part], part


def _save_checkpoint_of_another_model(tmp_path):
    other = tl.nn.Sequential(tl.nn.Linear(3, 5), tl.nn.Linear(5, 1))
    path = tmp_path / "other.safetensors"
    tl.save_checkpoint(path, tl.Trainer(other, tl.loss.MSE(), tl.optim.Adam(lr=1e-2)))
    return path


def _truncated_checkpoint(tmp_path, trainer):
    path = tmp_path / "ckpt.safetensors"
    tl.save_checkpoint(path, trainer)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 7])
    return path


# (name, call(net, opt, trainer, tmp_path), the exception it must raise)
CASES = [
    ("step: wrong width", lambda n, o, t, p: t.step(np.ones((8, 4), np.float32), Y), ValueError),
    ("step: wrong dtype", lambda n, o, t, p: t.step(X.astype(np.float64), Y), TypeError),
    ("step: unpaired batch", lambda n, o, t, p: t.step(X, Y[:5]), ValueError),
    ("step: empty batch", lambda n, o, t, p: t.step(X[:0], Y[:0]), ValueError),
    ("step: None", lambda n, o, t, p: t.step(None, Y), TypeError),
    ("fit: bad validation", lambda n, o, t, p: t.fit(X, Y, epochs=1, batch_size=4,
                                                        validation=(np.ones((4, 5), np.float32), Y[:4])), ValueError),
    ("fit: zero batch size", lambda n, o, t, p: t.fit(X, Y, epochs=1, batch_size=0), ValueError),
    ("set_precision fp16 on float64", lambda n, o, t, p: (n.to("float64"), n.set_precision("fp16")), TypeError),
    ("set_precision unknown", lambda n, o, t, p: n.set_precision("fp8"), ValueError),
    ("to an unknown dtype", lambda n, o, t, p: n.to("int32"), (TypeError, ValueError)),
    ("set_backend unknown", lambda n, o, t, p: n.set_backend("tpu"), ValueError),
    ("optimizer lr NaN", lambda n, o, t, p: setattr(o, "lr", math.nan), ValueError),
    ("optimizer lr negative", lambda n, o, t, p: setattr(o, "lr", -1.0), ValueError),
    ("optimizer native lr inf", lambda n, o, t, p: setattr(o._native, "lr", math.inf), ValueError),
    ("optimizer step count negative", lambda n, o, t, p: o.load_state(o.state(), step_count=-3), ValueError),
    ("optimizer native step count negative", lambda n, o, t, p: setattr(o._native, "step_count", -1), ValueError),
    ("optimizer state of the wrong size", lambda n, o, t, p: o.load_state(
        {k: v[:-1] for k, v in o.state().items()}), ValueError),
    ("optimizer state missing a buffer", lambda n, o, t, p: o.load_state({"exp_avg": o.state()["exp_avg"]}),
     ValueError),
    ("optimizer given to a second model", lambda n, o, t, p: tl.Trainer(
        tl.nn.Sequential(tl.nn.Linear(3, 8), tl.nn.Linear(8, 1)), tl.loss.MSE(), o), ValueError),
    ("optimizer re-bound by hand", lambda n, o, t, p: o.bind([("w", (3,))], "float32"), ValueError),
    ("load_state_dict: wrong shape", lambda n, o, t, p: n.load_state_dict(
        {**n.state_dict(), "0.weight": np.ones((8, 4), np.float32)}), ValueError),
    ("load_state_dict: missing key", lambda n, o, t, p: n.load_state_dict(
        {k: v for k, v in n.state_dict().items() if k != "3.bias"}), (KeyError, ValueError)),
    ("load_checkpoint: another model", lambda n, o, t, p: tl.load_checkpoint(
        _save_checkpoint_of_another_model(p), t), ValueError),
    ("load_checkpoint: truncated", lambda n, o, t, p: tl.load_checkpoint(_truncated_checkpoint(p, t), t),
     ValueError),
    ("load_checkpoint: a model", lambda n, o, t, p: tl.load_checkpoint(_truncated_checkpoint(p, t), n), TypeError),
    ("memory_report: absurd batch", lambda n, o, t, p: t.memory_report((2 ** 62, 3), (2 ** 62, 1)), ValueError),
    ("model memory_report: absurd batch", lambda n, o, t, p: n.memory_report((2 ** 62, 3)), ValueError),
    ("model memory_report: past memory", lambda n, o, t, p: n.memory_report((2 ** 50, 3)), ValueError),
    ("clip_grad_norm NaN", lambda n, o, t, p: setattr(t._native, "clip_grad_norm", math.nan), ValueError),
]


@pytest.mark.parametrize("name,call,error", CASES, ids=[c[0] for c in CASES])
def test_a_refused_call_changes_nothing(tmp_path, name, call, error):
    net, opt, trainer = _setup()
    before = _snapshot(net, opt, trainer)
    with pytest.raises(error):
        call(net, opt, trainer, tmp_path)
    if net.dtype != "float32":  # the case itself moved the model (a call before the refused one)
        net.to("float32")
    _assert_same(before, _snapshot(net, opt, trainer))

    twin_net, twin_opt, twin = _setup()
    assert trainer.step(X, Y) == twin.step(X, Y)
    np.testing.assert_array_equal(net._compiled().flat_parameters(), twin_net._compiled().flat_parameters())


class _FuturesThenNone:
    """A pool that returns futures, or (from call `good_calls` + 1 on) runs the task and returns None."""

    def __init__(self, good_calls):
        self.calls, self.good_calls = 0, good_calls

    def submit(self, fn, *args):
        self.calls += 1
        future = concurrent.futures.Future()
        future.set_result(fn(*args))
        return future if self.calls <= self.good_calls else None


@pytest.mark.parametrize("good_calls", [0, 1])
def test_a_pool_that_returns_no_future_is_named_and_changes_nothing(good_calls):
    tl.manual_seed(1)
    net = tl.nn.Sequential(tl.nn.Linear(64, 256), tl.nn.Tanh(), tl.nn.Linear(256, 10))
    x = np.random.default_rng(1).standard_normal((2000, 64)).astype(np.float32)
    serial = net.predict(x)
    pool = _FuturesThenNone(good_calls)
    with pytest.raises(TypeError, match="pool.submit returned NoneType, not a future"):
        net.predict(x, context=tl.Context(executor=tl.PoolExecutor(pool, 3)))  # 2 submits per run
    assert pool.calls == good_calls + 1  # the first bad answer ends the submitting
    out = np.empty_like(serial)
    net.predict(x, out=out, context=tl.Context(executor=tl.PoolExecutor(_FuturesThenNone(10 ** 9), 2)))
    np.testing.assert_array_equal(out, serial)


def test_a_refused_trainer_leaves_the_optimizer_free_for_its_own_model():
    net, opt, trainer = _setup()
    other = tl.nn.Sequential(tl.nn.Linear(3, 8), tl.nn.Linear(8, 1))
    with pytest.raises(ValueError, match="another model"):
        tl.Trainer(other, tl.loss.MSE(), opt)
    # the same model may have a second trainer (a re-created one), sharing the optimizer's state
    again = tl.Trainer(net, tl.loss.MSE(), opt)
    assert again.steps == trainer.steps == 3
    del trainer, again  # once no trainer holds it, the optimizer may serve another model, afresh
    fresh = tl.Trainer(other, tl.loss.MSE(), opt)
    assert fresh.steps == 0
    assert np.isfinite(fresh.step(X, Y))


def test_loss_scaled_trainer_refusals_keep_the_scale():
    net, opt, trainer = _setup(loss_scale="dynamic")
    before = _snapshot(net, opt, trainer)
    with pytest.raises(ValueError):
        trainer.step(np.ones((8, 4), np.float32), Y)
    with pytest.raises(ValueError):
        trainer.memory_report((-1, 3), (8, 1))
    _assert_same(before, _snapshot(net, opt, trainer))
