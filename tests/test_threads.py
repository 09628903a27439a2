"""treadle starts no threads, runs safely from many Python threads at once (bitwise the same results as
serial work), and releases the GIL while it computes."""
import json
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import treadle as tl


def thread_count():
    return len(os.listdir("/proc/self/task"))


def _mlp(seed, n_in=8, width=32, n_out=2):
    tl.manual_seed(seed)
    return tl.nn.Sequential(tl.nn.Linear(n_in, width), tl.nn.Tanh(), tl.nn.Linear(width, width), tl.nn.Tanh(),
                            tl.nn.Linear(width, n_out))


# Runs in a fresh interpreter that never imports torch (torch may start threads of its own).
_NO_THREADS_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import numpy as np  # numpy's BLAS may start its pool at import: count from here on

    def count():
        return len(os.listdir("/proc/self/task"))

    counts = {"start": count()}
    import treadle as tl
    counts["import"] = count()
    tl.manual_seed(0)
    net = tl.nn.Sequential(tl.nn.Linear(8, 32), tl.nn.Tanh(), tl.nn.Linear(32, 32), tl.nn.Tanh(), tl.nn.Linear(32, 1))
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=1e-3))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 8)).astype(np.float32)
    y = np.sin(x[:, :1])
    during = set()
    losses = []
    for i in range(100):
        losses.append(trainer.step(x, y))
        during.add(count())
    counts["train"] = count()
    for i in range(1000):
        net.predict(x[: 1 + i % 64])
        if i % 50 == 0:
            during.add(count())
    counts["predict"] = count()
    hist = trainer.fit(x, y, epochs=5, batch_size=16, validation=(x, y),
                       callback=lambda epoch, logs: during.add(count()) and False)
    trainer.forward(x, input_grad=True)
    trainer.backward(np.ones((64, 1), np.float32), input_grad=True)
    counts["end"] = count()
    print(json.dumps({"counts": counts, "during": sorted(during), "first": losses[0], "last": losses[-1],
                      "torch_loaded": "torch" in sys.modules}))
""")


def test_treadle_starts_no_threads_in_a_fresh_process():
    env = dict(os.environ)
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(tl.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([pkg_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    proc = subprocess.run([sys.executable, "-c", _NO_THREADS_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not result["torch_loaded"]
    counts = result["counts"]
    assert counts["import"] == counts["start"], counts
    assert counts["train"] == counts["start"], counts
    assert counts["predict"] == counts["start"], counts
    assert counts["end"] == counts["start"], counts
    assert result["during"] == [counts["start"]]
    assert result["last"] < result["first"]  # the 100 steps did train


def test_no_threads_started_in_this_process(rng):
    """Measured around treadle calls only (other libraries loaded here may own threads)."""
    net = _mlp(0)
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=1e-3))
    x = rng.standard_normal((32, 8)).astype(np.float32)
    y = rng.standard_normal((32, 2)).astype(np.float32)
    before = thread_count()
    for _ in range(100):
        trainer.step(x, y)
    for i in range(1000):
        net.predict(x[: 1 + i % 32])
    assert thread_count() == before


def _serial_predictions(net, inputs):
    return [net.predict(x) for x in inputs]


def test_shared_model_predicts_from_four_threads_bitwise_like_serial(rng):
    reference = _mlp(1)
    shared = _mlp(1)  # same weights; its plans get compiled concurrently by the threads below
    np.testing.assert_array_equal(reference.flat_parameters(), shared.flat_parameters())
    work = [[rng.standard_normal((1 + (t * 7 + i) % 24, 8)).astype(np.float32) for i in range(200)]
            for t in range(4)]
    expect = [_serial_predictions(reference, inputs) for inputs in work]
    results = [None] * 4
    errors = []
    barrier = threading.Barrier(4)

    def worker(t):
        try:
            barrier.wait()
            results[t] = _serial_predictions(shared, work[t])
        except Exception as e:  # reported below; a thread's exception would otherwise vanish
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    for t in range(4):
        for got, want in zip(results[t], expect[t]):
            np.testing.assert_array_equal(got, want)
    assert shared._compiled().num_plans == reference._compiled().num_plans == 24


def test_threads_with_their_own_contexts_and_out_arrays(rng):
    net = _mlp(2)
    x = rng.standard_normal((16, 8)).astype(np.float32)
    expect = net.predict(x)
    outs = [np.empty((16, 2), np.float32) for _ in range(3)]
    errors = []

    def worker(t):
        try:
            ctx = tl.Context(seed=t)
            for _ in range(100):
                outs[t][...] = 0
                assert net.predict(x, out=outs[t], context=ctx) is outs[t]
                np.testing.assert_array_equal(outs[t], expect)
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors


def _train(net, data, steps=100):
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=1e-2))
    return [trainer.step(*data[i % len(data)]) for i in range(steps)]


def test_two_threads_training_their_own_models_bitwise_like_serial(rng):
    data = [[(rng.standard_normal((16, 8)).astype(np.float32), rng.standard_normal((16, 2)).astype(np.float32))
             for _ in range(5)] for _ in range(2)]
    serial_nets = [_mlp(10 + t) for t in range(2)]
    serial_losses = [_train(serial_nets[t], data[t]) for t in range(2)]
    nets = [_mlp(10 + t) for t in range(2)]
    losses = [None, None]
    errors = []
    barrier = threading.Barrier(3)  # two trainers and a predicting thread on a third model
    bystander = _mlp(30)
    xb = rng.standard_normal((8, 8)).astype(np.float32)
    expect_b = bystander.predict(xb)

    def trainer_worker(t):
        try:
            barrier.wait()
            losses[t] = _train(nets[t], data[t])
        except Exception as e:
            errors.append(e)

    def predictor():
        try:
            barrier.wait()
            for _ in range(200):
                np.testing.assert_array_equal(bystander.predict(xb), expect_b)
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=trainer_worker, args=(t,)) for t in range(2)]
    threads.append(threading.Thread(target=predictor))
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    for t in range(2):
        assert losses[t] == serial_losses[t]
        np.testing.assert_array_equal(nets[t].flat_parameters(), serial_nets[t].flat_parameters())


def test_predict_while_another_thread_trains_the_same_model_stays_valid(rng):
    """Inference on weights another thread updates: no crash, every output finite and well-shaped
    (values depend on timing; only their validity is checked)."""
    net = _mlp(3)
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.SGD(lr=1e-3))
    x = rng.standard_normal((16, 8)).astype(np.float32)
    y = rng.standard_normal((16, 2)).astype(np.float32)
    outs, errors = [], []

    def predictor():
        try:
            for _ in range(200):
                outs.append(net.predict(x))
        except Exception as e:
            errors.append(e)

    th = threading.Thread(target=predictor)
    th.start()
    for _ in range(200):
        trainer.step(x, y)
    th.join()
    assert not errors, errors
    assert len(outs) == 200 and all(o.shape == (16, 2) and np.all(np.isfinite(o)) for o in outs)


class _Spinner:
    """A pure-Python loop in another thread, counting iterations; it yields the GIL every iteration."""

    def __init__(self):
        self.count = 0
        self.stop = False
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self):
        import time

        self.started.set()
        while not self.stop:
            self.count += 1
            time.sleep(0)  # releases the GIL so the main thread can take it back after a C++ call

    def __enter__(self):
        self.thread.start()
        self.started.wait()
        return self

    def __exit__(self, *exc):
        self.stop = True
        self.thread.join()


def _progress_during(call, attempts=20):
    """How far the spinner got while `call` ran. The switch interval is made huge, so the spinner can
    only run while the main thread is inside a call that released the GIL: with the GIL held the
    answer is exactly 0, whatever the machine's load. Retries cover a spinner the OS did not
    schedule during a short call."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        with _Spinner() as spinner:
            for _ in range(attempts):
                before = spinner.count
                call()
                progress = spinner.count - before
                if progress > 0:
                    return progress
            return 0
    finally:
        sys.setswitchinterval(old)


@pytest.fixture(scope="module")
def big_model():
    tl.manual_seed(4)
    net = tl.nn.Sequential(tl.nn.Linear(512, 512), tl.nn.Tanh(), tl.nn.Linear(512, 512), tl.nn.Tanh(),
                           tl.nn.Linear(512, 8))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 512)).astype(np.float32)
    y = rng.standard_normal((256, 8)).astype(np.float32)
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=1e-4))
    trainer.step(x, y)  # compile outside the measurement
    net.predict(x)
    return net, trainer, x, y


@pytest.mark.skipif(not getattr(sys, "_is_gil_enabled", lambda: True)(), reason="free-threaded Python has no GIL")
def test_progress_measure_reads_zero_while_the_gil_is_held():
    """The control for the tests below: pure-Python work holds the GIL, and the spinner gets nowhere."""
    assert _progress_during(lambda: sum(range(300000)), attempts=3) == 0


def test_gil_is_released_during_step(big_model):
    _, trainer, x, y = big_model
    assert _progress_during(lambda: trainer.step(x, y)) > 0


def test_gil_is_released_during_predict(big_model):
    net, _, x, _ = big_model
    assert _progress_during(lambda: net.predict(x)) > 0


def test_gil_is_released_during_forward_and_backward(big_model):
    net, trainer, x, _ = big_model
    g = np.ones((256, 8), np.float32)

    def phases():
        trainer.forward(x)
        trainer.backward(g)

    assert _progress_during(phases) > 0


def test_policy_threads_read_weights_between_updates_bitwise(rng):
    """The RL-policy pattern: four host threads each with its own Context evaluate batch-1 inputs on
    one model while a fifth trains it; the host's reader/writer lock keeps reads out of updates.
    Every action must equal, bitwise, what the weights of the version it read give serially."""
    net = _mlp(5)
    trainer = tl.Trainer(net, tl.loss.MSE(), tl.optim.Adam(lr=1e-2), seed=1)
    x_train = rng.standard_normal((32, 8)).astype(np.float32)
    y_train = rng.standard_normal((32, 2)).astype(np.float32)
    states = rng.standard_normal((4, 50, 1, 8)).astype(np.float32)
    lock = threading.Condition()
    readers, version = [0], [0]
    snapshots = {0: net.flat_parameters().copy()}
    records, errors = [], []

    def policy(k):
        ctx = tl.Context()  # one context per host thread: its own activations
        try:
            for i in range(states.shape[1]):
                with lock:  # shared side: wait out an update in progress
                    readers[0] += 1
                    v = version[0]
                try:
                    action = net.predict(states[k, i], context=ctx)
                finally:
                    with lock:
                        readers[0] -= 1
                        lock.notify_all()
                records.append((v, k, i, action))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=policy, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for _ in range(40):
        trainer.compute_gradients(x_train, y_train)  # reads the weights: may overlap the readers
        with lock:  # exclusive side: the update writes the weights in place
            lock.wait_for(lambda: readers[0] == 0)
            trainer.update()
            trainer.zero_grad()
            version[0] += 1
            snapshots[version[0]] = net.flat_parameters().copy()
    for th in threads:
        th.join()
    assert not errors, errors
    assert len(records) == 200
    twin = _mlp(5)
    for v, k, i, action in records:
        twin.flat_parameters()[:] = snapshots[v]
        np.testing.assert_array_equal(action, twin.predict(states[k, i]))
