"""A training step handed to the host as tasks (Trainer.begin_step / run_task / finish_step).

Any order that respects the tasks' dependencies, sequential or from several threads, must give
bitwise the parameters and loss of Trainer.step; a task's gradients must be final when it returns;
misuse raises and leaves the parameters unchanged."""
import threading
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import numpy as np
import pytest

import treadle as tl
import treadle.functional as F


class TwoHeads(tl.nn.Module):
    """Two heads on a shared trunk: their tasks are independent of each other."""

    def __init__(self):
        super().__init__()
        self.trunk = tl.nn.Linear(6, 16)
        self.head_a = tl.nn.Linear(16, 2)
        self.head_b = tl.nn.Linear(16, 3)

    def forward(self, x):
        h = F.tanh(self.trunk(x))
        return F.cat([self.head_a(h), F.sigmoid(self.head_b(h))], axis=1)


def mlp_with_dropout():
    return tl.nn.Sequential(tl.nn.Linear(6, 24), tl.nn.Tanh(), tl.nn.Dropout(0.25), tl.nn.Linear(24, 24),
                            tl.nn.ReLU(), tl.nn.Linear(24, 5))


def cnn_with_batchnorm():
    return tl.nn.Sequential(tl.nn.Conv2d(1, 4, 3, padding=1), tl.nn.BatchNorm2d(4), tl.nn.ReLU(),
                            tl.nn.MaxPool2d(2), tl.nn.Flatten(), tl.nn.Linear(4 * 4 * 4, 5))


MODELS = {
    "mlp_dropout": (mlp_with_dropout, (12, 6), 5),
    "two_heads": (TwoHeads, (12, 6), 5),
    "cnn_batchnorm": (cnn_with_batchnorm, (8, 1, 8, 8), 5),
}


def twins(name, dtype, seed=3):
    factory, x_shape, n_out = MODELS[name]
    trainers = []
    for _ in range(2):
        tl.manual_seed(7)
        net = factory()
        net.to(dtype)
        trainers.append(tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=1e-2), seed=seed))
    return trainers, x_shape, n_out


def batch(rng, x_shape, n_out, dtype):
    return (rng.standard_normal(x_shape).astype(dtype), rng.standard_normal((x_shape[0], n_out)).astype(dtype))


def run_in_random_order(trainer, tasks, rng):
    done = set()
    while len(done) < len(tasks):
        ready = [i for i, t in enumerate(tasks) if i not in done and all(d in done for d in t.deps)]
        i = int(rng.choice(ready))
        trainer.run_task(i)
        done.add(i)


def run_concurrently(trainer, tasks, pool):
    waiting = [len(t.deps) for t in tasks]
    dependents = [[j for j, t in enumerate(tasks) if i in t.deps] for i in range(len(tasks))]
    running = {pool.submit(trainer.run_task, i): i for i, n in enumerate(waiting) if n == 0}
    while running:
        done, _ = wait(running, return_when=FIRST_COMPLETED)
        for f in done:
            i = running.pop(f)
            f.result()
            for j in dependents[i]:
                waiting[j] -= 1
                if waiting[j] == 0:
                    running[pool.submit(trainer.run_task, j)] = j


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("depth", [1, 2])
def test_any_valid_order_equals_step_bitwise(name, dtype, depth):
    (reference, tasked), x_shape, n_out = twins(name, dtype)
    rng = np.random.default_rng(0)
    order_rng = np.random.default_rng(1)
    for _ in range(4):
        x, y = batch(rng, x_shape, n_out, dtype)
        expect = reference.step(x, y)
        tasks = tasked.begin_step(x, y, depth=depth)
        run_in_random_order(tasked, tasks, order_rng)
        assert tasked.finish_step() == expect
        np.testing.assert_array_equal(tasked.model.flat_parameters(), reference.model.flat_parameters())
    assert tasked.steps == reference.steps == 4


@pytest.mark.parametrize("name", sorted(MODELS))
def test_concurrent_tasks_equal_step_bitwise(name):
    (reference, tasked), x_shape, n_out = twins(name, "float32")
    rng = np.random.default_rng(2)
    with ThreadPoolExecutor(max_workers=3) as pool:
        for _ in range(5):
            x, y = batch(rng, x_shape, n_out, "float32")
            expect = reference.step(x, y)
            run_concurrently(tasked, tasked.begin_step(x, y), pool)
            assert tasked.finish_step() == expect
            np.testing.assert_array_equal(tasked.model.flat_parameters(), reference.model.flat_parameters())


def test_tasks_follow_modules_and_passes():
    (_, trainer), x_shape, n_out = twins("two_heads", "float32")
    x, y = batch(np.random.default_rng(0), x_shape, n_out, "float32")
    tasks = trainer.begin_step(x, y)
    names = [t.name for t in tasks]
    assert names[:3] == ["forward trunk", "forward head_a", "forward head_b"]
    assert "loss" in names and names.index("loss") < names.index("backward trunk")
    assert names[-1] == "backward trunk"
    for i, t in enumerate(tasks):
        assert all(0 <= d < i for d in t.deps)
    # every trainable parameter's gradient completes in exactly one task, with its layout range
    layout = {name: (off, off + int(np.prod(shape))) for name, shape, off in trainer.model._compiled().layout}
    owners = {}
    for t in tasks:
        assert len(t.params) == len(t.grad_ranges)
        for p, r in zip(t.params, t.grad_ranges):
            assert p not in owners
            owners[p] = t.name
            assert tuple(r) == layout[p]
    assert owners == {"trunk.weight": "backward trunk", "trunk.bias": "backward trunk",
                      "head_a.weight": "backward head_a", "head_a.bias": "backward head_a",
                      "head_b.weight": "backward head_b", "head_b.bias": "backward head_b"}


def test_task_gradients_are_final_when_it_returns():
    (reference, tasked), x_shape, n_out = twins("mlp_dropout", "float64")
    x, y = batch(np.random.default_rng(4), x_shape, n_out, "float64")
    reference.zero_grad()
    reference.compute_gradients(x, y)
    full = reference.model.flat_gradients().copy()
    tasks = tasked.begin_step(x, y)
    grads = tasked.model.flat_gradients()
    assert not grads.any()  # begin_step zeroes them
    seen = 0
    for i, t in enumerate(tasks):
        tasked.run_task(i)
        for lo, hi in t.grad_ranges:
            np.testing.assert_array_equal(grads[lo:hi], full[lo:hi])
            seen += hi - lo
    assert seen == sum(int(np.prod(shape)) for _, shape, _ in tasked.model._compiled().layout)
    tasked.finish_step()


def test_depth_two_splits_nested_modules():
    tl.manual_seed(0)
    net = tl.nn.Sequential(tl.nn.Sequential(tl.nn.Linear(4, 8), tl.nn.Tanh()), tl.nn.Linear(8, 2))
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=0.1))
    x, y = np.ones((3, 4), np.float32), np.zeros((3, 2), np.float32)
    assert [t.name for t in trainer.begin_step(x, y, depth=1)][:2] == ["forward 0", "forward 1"]
    assert [t.name for t in trainer.begin_step(x, y, depth=2)][:3] == ["forward 0.0", "forward 0.1", "forward 1"]


def test_misuse_raises_and_changes_nothing():
    (_, trainer), x_shape, n_out = twins("mlp_dropout", "float32")
    x, y = batch(np.random.default_rng(5), x_shape, n_out, "float32")
    before = trainer.model.flat_parameters().copy()
    with pytest.raises(ValueError, match="no step in progress"):
        trainer.run_task(0)
    with pytest.raises(ValueError, match="no step in progress"):
        trainer.finish_step()
    with pytest.raises(ValueError, match="depth must be >= 1"):
        trainer.begin_step(x, y, depth=0)
    with pytest.raises(ValueError, match=r"expected target|shape"):
        trainer.begin_step(x, np.ascontiguousarray(y[:, :2]))
    tasks = trainer.begin_step(x, y)
    with pytest.raises(ValueError, match="out of range"):
        trainer.run_task(len(tasks))
    with pytest.raises(ValueError, match="depends on task 0 'forward 0', which has not finished"):
        trainer.run_task(1)
    trainer.run_task(0)
    with pytest.raises(ValueError, match="already run"):
        trainer.run_task(0)
    with pytest.raises(ValueError, match="task 1 'forward 1' has not run"):
        trainer.finish_step()
    trainer.evaluate(x, y)  # reuses the context's memory: the tasked step is void
    with pytest.raises(ValueError, match="no step in progress"):
        trainer.run_task(1)
    np.testing.assert_array_equal(trainer.model.flat_parameters(), before)
    assert trainer.steps == 0


def test_failing_task_abandons_the_step():
    (_, trainer), x_shape, n_out = twins("mlp_dropout", "float32")
    trainer.detect_anomaly = True
    x, y = batch(np.random.default_rng(6), x_shape, n_out, "float32")
    before = trainer.model.flat_parameters().copy()
    trainer.model.flat_parameters()[0] = np.nan  # makes the first layer produce NaN
    tasks = trainer.begin_step(x, y)
    with pytest.raises(ValueError, match="check_numerics: node .* in module '0'"):
        trainer.run_task(0)
    with pytest.raises(ValueError, match="a task of this step raised"):
        trainer.finish_step()
    trainer.model.flat_parameters()[0] = before[0]
    np.testing.assert_array_equal(trainer.model.flat_parameters(), before)
    assert trainer.steps == 0
    # the next step runs normally
    run_in_random_order(trainer, trainer.begin_step(x, y), np.random.default_rng(0))
    assert np.isfinite(trainer.finish_step())
    assert trainer.steps == 1
    assert len(tasks) > 0


class LastHidden(tl.nn.Module):
    """An LSTM over variable-length sequences (a second model input), then a linear head."""

    def __init__(self):
        super().__init__()
        self.lstm = tl.nn.LSTM(3, 8, batch_first=True)
        self.head = tl.nn.Linear(8, 2)

    def forward(self, x, lengths):
        _, (h, _) = self.lstm(x, lengths=lengths)
        return self.head(h[0])


def test_two_input_lstm_tasks_equal_step():
    trainers = []
    for _ in range(2):
        tl.manual_seed(11)
        trainers.append(LastHidden())
    rng = np.random.default_rng(8)
    x = rng.standard_normal((4, 5, 3)).astype(np.float32)
    lengths = np.array([5, 3, 2, 5], dtype=np.int64)
    y = rng.standard_normal((4, 2)).astype(np.float32)
    ref = tl.Trainer(trainers[0], tl.loss.MSE(), tl.optim.Adam(lr=1e-2))
    tasked = tl.Trainer(trainers[1], tl.loss.MSE(), tl.optim.Adam(lr=1e-2))
    for _ in range(3):
        expect = ref.step([x, lengths], y)
        run_in_random_order(tasked, tasked.begin_step([x, lengths], y), rng)
        assert tasked.finish_step() == expect
    np.testing.assert_array_equal(trainers[0].flat_parameters(), trainers[1].flat_parameters())


def test_tasks_start_no_threads():
    (_, trainer), x_shape, n_out = twins("two_heads", "float32")
    x, y = batch(np.random.default_rng(9), x_shape, n_out, "float32")
    before = threading.active_count()
    for _ in range(3):
        tasks = trainer.begin_step(x, y)
        for i in range(len(tasks)):
            trainer.run_task(i)
        trainer.finish_step()
    assert threading.active_count() == before


class GatedPool:
    """A host pool whose submit() waits for a gate, then runs the chunk: holds a task mid-kernel."""

    def __init__(self):
        self.gate, self.entered = threading.Event(), threading.Event()

    def submit(self, fn):
        from concurrent.futures import Future
        self.entered.set()
        self.gate.wait()
        future = Future()
        future.set_result(fn())
        return future


def test_new_calls_refuse_while_a_task_runs():
    pool = GatedPool()
    tl.manual_seed(7)
    trainer = tl.Trainer(mlp_with_dropout(), tl.loss.MSE(), tl.optim.Adam(lr=1e-2),
                         executor=tl.PoolExecutor(pool, 2))
    rng = np.random.default_rng(10)
    x, y = batch(rng, (4096, 6), 5, "float32")  # the first linear splits into several chunks
    trainer.begin_step(x, y)
    thread_errors = []

    def run_first():
        try:
            trainer.run_task(0)
        except Exception as e:  # pragma: no cover - reported below
            thread_errors.append(e)

    th = threading.Thread(target=run_first)
    th.start()
    assert pool.entered.wait(30)  # task 0 is inside its first kernel, waiting on the gate
    with pytest.raises(ValueError, match="task 0 'forward 0' of the step in progress is still running"):
        trainer.begin_step(x, y)
    with pytest.raises(ValueError, match="task 0 'forward 0' of the step in progress is still running"):
        trainer.evaluate(x, y)
    pool.gate.set()
    th.join()
    assert not thread_errors, thread_errors
    tasks = trainer.begin_step(x, y)  # the task has finished: a new step may start
    for i in range(len(tasks)):
        trainer.run_task(i)
    assert np.isfinite(trainer.finish_step())
