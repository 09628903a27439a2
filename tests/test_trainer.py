"""Trainer: evaluate, fit (history, batching, shuffling, validation, callbacks), schedules and options."""
import numpy as np
import pytest
import torch

import treadle as tl

SIZES = (4, 16, 1)


def _data(rng, n=64, dtype=np.float32):
    x = rng.uniform(-1, 1, (n, SIZES[0])).astype(dtype)
    y = (np.sin(2 * x[:, :1]) + 0.5 * x[:, 1:2] * x[:, 2:3]).astype(dtype)
    return x, y


def _trainer(mlp_pair, dtype="float32", lr=1e-2, **kw):
    net, ref = mlp_pair(SIZES, dtype=dtype)
    return net, ref, tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=lr), **kw)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_evaluate_changes_nothing_and_matches_torch(mlp_pair, rng, dtype):
    net, ref, trainer = _trainer(mlp_pair, dtype)
    x, y = _data(rng, 20, dtype)
    trainer.step(x, y)  # non-trivial optimizer state and gradients
    params, grads, steps = net.flat_parameters().copy(), net.flat_gradients().copy(), trainer.steps
    losses = [trainer.evaluate(x, y) for _ in range(3)]
    assert losses[0] == losses[1] == losses[2]
    np.testing.assert_array_equal(net.flat_parameters(), params)
    np.testing.assert_array_equal(net.flat_gradients(), grads)
    assert trainer.steps == steps
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in net.state_dict().items()})
    expect = torch.nn.functional.mse_loss(ref(torch.from_numpy(x)), torch.from_numpy(y)).item()
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(losses[0], expect, rtol=tol)


def test_evaluate_is_eval_mode_no_dropout(rng):
    tl.manual_seed(0)
    net = tl.nn.Sequential(tl.nn.Linear(4, 32), tl.nn.Dropout(0.5), tl.nn.Linear(32, 1))
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    x, y = _data(rng, 16)
    expect = np.mean((net.predict(x).astype(np.float64) - y) ** 2)
    np.testing.assert_allclose(trainer.evaluate(x, y), expect, rtol=1e-5)
    # In training mode dropout is active: the training loss differs from the eval loss.
    assert trainer.compute_gradients(x, y) != pytest.approx(expect, rel=1e-3)


def test_fit_loss_decreases(mlp_pair, rng):
    _, _, trainer = _trainer(mlp_pair, lr=1e-2)
    x, y = _data(rng, 128)
    hist = trainer.fit(x, y, epochs=30, batch_size=16, seed=0)
    assert len(hist["loss"]) == 30 and hist["val_loss"] == []
    assert all(np.isfinite(hist["loss"]))
    assert hist["loss"][-1] < 0.3 * hist["loss"][0]
    assert np.mean(hist["loss"][-5:]) < np.mean(hist["loss"][:5])
    assert trainer.steps == 30 * 8


def test_fit_batches_and_partial_last_batch_equal_manual_steps(mlp_pair, rng):
    """shuffle=False: fit is exactly steps on x[0:4], x[4:8], x[8:10] per epoch; the epoch loss is the
    sample-weighted mean of the batch losses."""
    a, _, ta = _trainer(mlp_pair, "float64")
    b, _, tb = _trainer(mlp_pair, "float64")
    x, y = _data(rng, 10, np.float64)
    hist = ta.fit(x, y, epochs=2, batch_size=4, shuffle=False)
    assert ta.steps == 6
    expect = []
    for _ in range(2):
        losses = [tb.step(x[s:s + 4], y[s:s + 4]) for s in (0, 4, 8)]
        expect.append((4 * losses[0] + 4 * losses[1] + 2 * losses[2]) / 10)
    np.testing.assert_allclose(hist["loss"], expect, rtol=1e-14)
    np.testing.assert_array_equal(a.flat_parameters(), b.flat_parameters())
    # The last, partial batch has its own plan (batch 2) next to the full batches' (batch 4).
    assert a._compiled().num_plans == 2


def test_fit_batch_larger_than_data_is_one_step(mlp_pair, rng):
    _, _, trainer = _trainer(mlp_pair)
    x, y = _data(rng, 5)
    trainer.fit(x, y, epochs=3, batch_size=100)
    assert trainer.steps == 3


def test_fit_shuffle_is_deterministic_by_seed(mlp_pair, rng):
    x, y = _data(rng, 40)
    runs = {}
    for key, kw in {"s1": dict(seed=1), "s1_again": dict(seed=1), "s2": dict(seed=2),
                    "ordered": dict(shuffle=False)}.items():
        net, _, trainer = _trainer(mlp_pair)
        hist = trainer.fit(x, y, epochs=3, batch_size=8, **kw)
        runs[key] = (hist["loss"], net.flat_parameters().copy())
    assert runs["s1"][0] == runs["s1_again"][0]
    np.testing.assert_array_equal(runs["s1"][1], runs["s1_again"][1])
    assert not np.array_equal(runs["s1"][1], runs["s2"][1])
    assert not np.array_equal(runs["s1"][1], runs["ordered"][1])


def test_fit_shuffle_visits_every_sample_once_per_epoch(mlp_pair, rng):
    """With lr=0 the weights stay put, and the sample-weighted mean of batch MSEs is the data set's MSE
    exactly when every sample is visited once per epoch, whatever the order."""
    net, _ = mlp_pair(SIZES, dtype="float64")
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    x, y = _data(rng, 23, np.float64)
    hist = trainer.fit(x, y, epochs=3, batch_size=5, seed=3)
    expect = np.mean((net.predict(x) - y) ** 2)
    np.testing.assert_allclose(hist["loss"], [expect] * 3, rtol=1e-12)
    assert trainer.steps == 15


def test_fit_validation_loss_per_epoch(mlp_pair, rng):
    net, ref, trainer = _trainer(mlp_pair, "float64")
    x, y = _data(rng, 32, np.float64)
    xv, yv = _data(rng, 16, np.float64)
    hist = trainer.fit(x, y, epochs=4, batch_size=8, validation=(xv, yv))
    assert len(hist["val_loss"]) == 4
    assert hist["val_loss"][-1] == trainer.evaluate(xv, yv)
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in net.state_dict().items()})
    expect = torch.nn.functional.mse_loss(ref(torch.from_numpy(xv)), torch.from_numpy(yv)).item()
    np.testing.assert_allclose(hist["val_loss"][-1], expect, rtol=1e-12)
    assert len(set(hist["val_loss"])) == 4  # evaluated after each epoch, not once


def test_fit_callback_stops_early_and_sees_logs(mlp_pair, rng):
    _, _, trainer = _trainer(mlp_pair)
    x, y = _data(rng, 16)
    seen = []

    def callback(epoch, logs):
        seen.append((epoch, dict(logs)))
        return epoch == 2

    hist = trainer.fit(x, y, epochs=10, batch_size=8, validation=(x, y), callback=callback)
    assert [e for e, _ in seen] == [0, 1, 2]
    assert len(hist["loss"]) == 3 and len(hist["val_loss"]) == 3
    assert trainer.steps == 6
    for (epoch, logs) in seen:
        assert logs == {"loss": hist["loss"][epoch], "val_loss": hist["val_loss"][epoch]}


def test_fit_rejects_bad_arguments(mlp_pair, rng):
    net, _, trainer = _trainer(mlp_pair)
    x, y = _data(rng, 8)
    params = net.flat_parameters().copy()
    with pytest.raises(ValueError, match="x has 8 samples but y has 7"):
        trainer.fit(x, y[:7])
    with pytest.raises(ValueError, match="batch_size must be positive"):
        trainer.fit(x, y, batch_size=0)
    with pytest.raises(ValueError, match="no samples"):
        trainer.fit(x[:0], y[:0])
    np.testing.assert_array_equal(net.flat_parameters(), params)
    assert trainer.steps == 0


def test_fit_accepts_non_contiguous_arrays(mlp_pair, rng):
    a, _, ta = _trainer(mlp_pair)
    b, _, tb = _trainer(mlp_pair)
    x, y = _data(rng, 12)
    wide = np.zeros((12, 2 * SIZES[0]), np.float32)
    wide[:, ::2] = x
    ta.fit(wide[:, ::2], y, epochs=2, batch_size=4, seed=0)
    tb.fit(x, y, epochs=2, batch_size=4, seed=0)
    np.testing.assert_array_equal(a.flat_parameters(), b.flat_parameters())


def test_step_lr_schedule_matches_torch(mlp_pair, rng):
    net, ref = mlp_pair(SIZES, dtype="float64")
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.2, momentum=0.9),
                         schedule=tl.optim.StepLR(step_size=3, gamma=0.5))
    opt = torch.optim.SGD(ref.parameters(), lr=0.2, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    for _ in range(8):
        assert trainer.lr == pytest.approx(opt.param_groups[0]["lr"], rel=1e-15)
        x, y = _data(rng, 6, np.float64)
        trainer.step(x, y)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ref(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        opt.step()
        sched.step()
    for name, p in ref.state_dict().items():
        np.testing.assert_allclose(net.state_dict()[name], p.numpy(), rtol=1e-11, atol=1e-12)


def test_trainer_options_are_validated(mlp_pair):
    net, _ = mlp_pair(SIZES)
    with pytest.raises(ValueError, match="clip_grad_norm must be positive"):
        tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1), clip_grad_norm=-1.0)


def test_a_second_trainer_on_the_same_model_shares_parameters(mlp_pair, rng):
    net, _ = mlp_pair(SIZES)
    t1 = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    t2 = tl.Trainer(net, tl.loss.L1(), tl.optim.SGD(lr=0.1))
    x, y = _data(rng, 8)
    p0 = net.flat_parameters().copy()
    t1.step(x, y)
    p1 = net.flat_parameters().copy()
    t2.step(x, y)
    assert not np.array_equal(p0, p1) and not np.array_equal(p1, net.flat_parameters())
    assert t1.steps == 1 and t2.steps == 1


def _dropout_trainer(seed):
    tl.manual_seed(0)
    net = tl.nn.Sequential(tl.nn.Linear(4, 64), tl.nn.Dropout(0.5), tl.nn.Linear(64, 1))
    return net, tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.01), seed=seed)


def test_dropout_training_is_deterministic_by_trainer_seed(rng):
    x, y = _data(rng, 16)
    runs = {}
    for key, seed in (("a", 1), ("a_again", 1), ("b", 2)):
        net, trainer = _dropout_trainer(seed)
        runs[key] = ([trainer.step(x, y) for _ in range(5)], net.flat_parameters().copy())
    assert runs["a"][0] == runs["a_again"][0]
    np.testing.assert_array_equal(runs["a"][1], runs["a_again"][1])
    assert runs["a"][0] != runs["b"][0]
    # Each step draws a fresh mask: the same batch gives different losses step to step at lr=0.
    net, trainer = _dropout_trainer(3)
    trainer.optimizer.lr = 0.0
    losses = [trainer.step(x, y) for _ in range(4)]
    assert len(set(losses)) == 4


def test_step_equals_phases_with_dropout(rng):
    """The phases draw the same dropout masks as step (one RNG stream per trainer context)."""
    x, y = _data(rng, 16)
    a, ta = _dropout_trainer(5)
    b, tb = _dropout_trainer(5)
    for _ in range(3):
        la = ta.step(x, y)
        tb.zero_grad()
        lb = tb.compute_gradients(x, y)
        tb.update()
        assert la == lb
    np.testing.assert_array_equal(a.flat_parameters(), b.flat_parameters())


def test_parameter_free_model_trains_as_a_no_op(rng):
    net = tl.nn.Sequential(tl.nn.Tanh())
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=1e-2))
    x = rng.standard_normal((6, 4)).astype(np.float32)
    y = rng.standard_normal((6, 4)).astype(np.float32)
    assert net.flat_parameters().size == 0
    expect = np.mean((np.tanh(x).astype(np.float64) - y) ** 2)
    np.testing.assert_allclose(trainer.step(x, y), expect, rtol=1e-5)
    assert trainer.steps == 1


def test_a_trainer_follows_its_model_to_another_dtype(mlp_pair, rng):
    """After net.double() the trainer goes on: the optimizer's state is converted (exactly, float32 to
    float64) with its step count, so the next step equals a float64 trainer restored to that state."""
    net, _, trainer = _trainer(mlp_pair)
    x, y = _data(rng, 8)
    trainer.step(x, y)
    trainer.step(x, y)
    state32 = trainer.optimizer.state()
    net.double()
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    with pytest.raises(TypeError, match="float64"):  # the model is float64 now: so must its inputs be
        trainer.step(x, y)
    assert trainer.steps == 2

    twin, _ = mlp_pair(SIZES, dtype="float64")
    twin.load_state_dict(net.state_dict())
    reference = tl.Trainer(twin, tl.loss.MSE(), tl.optim.Adam(lr=1e-2))
    reference.optimizer.load_state({k: v.astype(np.float64) for k, v in state32.items()}, step_count=2)
    loss = trainer.step(x64, y64)
    assert loss == reference.step(x64, y64)
    assert trainer.steps == 3
    np.testing.assert_array_equal(net.flat_parameters(), twin.flat_parameters())
    for name, value in trainer.optimizer.state().items():
        assert value.dtype == np.float64
        np.testing.assert_array_equal(value, reference.optimizer.state()[name])


def _frozen_gap_model():
    """A BatchNorm's running statistics are parameters without gradients: gaps in the gradient
    buffer between the gradients a step writes."""
    tl.manual_seed(3)
    return tl.nn.Sequential(tl.nn.Linear(6, 8), tl.nn.BatchNorm1d(8), tl.nn.Tanh(), tl.nn.Linear(8, 3))


def test_step_gradients_are_zeroed_then_accumulated_ones_bit_for_bit(rng):
    # step writes each gradient once (0 + g) and zeroes the rest of the buffer, instead of zeroing the
    # buffer and adding: the bits must be those of compute_gradients after zero_grad, and whatever the
    # buffer held before (stale values, gaps) must not show.
    x = rng.standard_normal((16, 6)).astype(np.float32)
    y = rng.standard_normal((16, 3)).astype(np.float32)
    stepped, accumulated = _frozen_gap_model(), _frozen_gap_model()
    step_trainer = tl.Trainer(stepped, tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    phase_trainer = tl.Trainer(accumulated, tl.loss.MSE(), tl.optim.SGD(lr=0.0))
    stepped.flat_gradients()[...] = np.nan  # stale: every byte must be rewritten
    layout = stepped._compiled().layout
    assert len(layout) > 4  # the running statistics are in the buffer
    loss = step_trainer.step(x, y)
    phase_trainer.zero_grad()
    assert phase_trainer.compute_gradients(x, y) == loss
    np.testing.assert_array_equal(stepped.flat_gradients(), accumulated.flat_gradients())
    assert not np.isnan(stepped.flat_gradients()).any()
    frozen = [(o, int(np.prod(s))) for n, s, o in layout if "running" in n or "num_batches" in n]
    assert frozen and all(np.all(stepped.flat_gradients()[o:o + k] == 0) for o, k in frozen)
