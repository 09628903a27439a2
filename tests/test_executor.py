"""A Python host lends its own thread pool: results are bitwise those of the calling thread alone."""
import concurrent.futures
import os
import threading

import numpy as np
import pytest

import treadle as tl


def wide_mlp(seed):
    tl.manual_seed(seed)
    return tl.nn.Sequential(tl.nn.Linear(64, 256), tl.nn.Tanh(), tl.nn.Linear(256, 256), tl.nn.ReLU(),
                            tl.nn.Linear(256, 10))


def train(executor, steps=5):
    net = wide_mlp(3)
    trainer = tl.Trainer(net, tl.loss.CrossEntropy(), tl.optim.Adam(lr=1e-3), executor=executor)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1000, 64)).astype(np.float32)
    y = rng.integers(0, 10, 1000)
    losses = [trainer.step(x, y) for _ in range(steps)]
    return losses, net.flat_parameters().copy(), net


def test_pool_executor_training_is_bitwise_serial():
    serial_losses, serial_params, _ = train(None)
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        losses, params, _ = train(tl.PoolExecutor(pool, 3))
    assert losses == serial_losses
    assert np.array_equal(params, serial_params)


def test_pool_executor_predict_and_threads_are_the_hosts():
    _, _, net = train(None, steps=1)
    x = np.random.default_rng(1).standard_normal((2000, 64)).astype(np.float32)
    serial = net.predict(x)
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        executor = tl.PoolExecutor(pool, 2)
        ctx = tl.Context(executor=executor)
        # A ThreadPoolExecutor starts a thread per submit only while none is idle, so after one
        # predict it may hold 1 or 2 threads, depending on timing. Two tasks that wait for each
        # other make it start both before the count.
        both = threading.Barrier(2)
        list(pool.map(lambda _: both.wait(timeout=10), range(2)))
        parallel = net.predict(x, context=ctx)
        before = len(os.listdir("/proc/self/task"))
        again = net.predict(x, context=ctx)
        assert len(os.listdir("/proc/self/task")) == before  # treadle added none: only the host pool's threads
    assert np.array_equal(parallel, serial) and np.array_equal(again, serial)


def test_pool_executor_propagates_errors_and_validates():
    with pytest.raises(ValueError, match="num_workers"):
        tl.PoolExecutor(concurrent.futures.ThreadPoolExecutor(1), 0)
    with pytest.raises(TypeError, match="submit"):
        tl.PoolExecutor(object(), 2)
